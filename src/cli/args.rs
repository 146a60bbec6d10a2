//! What the subcommands share: where the API is and who calls it ([`ApiArgs`]), and the
//! parsers of flags that several subcommands take.

use sked::client::Client;

/// Where the API is and who is calling.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// URL of the sked server.
    #[arg(long, env = "SKED_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// API token (`sked token create`, or the one `sked dev` printed).
    #[arg(long, env = "SKED_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl ApiArgs {
    pub(crate) fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::new(&self.url, self.token.clone())?)
    }
}

pub(crate) fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

pub(crate) fn parse_json(s: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not valid JSON: {e}"))
}

pub(crate) fn parse_secs(s: &str, flag: &str, min: f64) -> Result<f64, String> {
    let value: f64 = s
        .parse()
        .map_err(|_| format!("expected a number of seconds, got {s:?}"))?;
    if !value.is_finite() || value < min {
        let bound = if min > 0.0 {
            "positive"
        } else {
            "zero or more"
        };
        return Err(format!("{flag} must be {bound} seconds, got {s}"));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_needs_an_equals_sign() {
        assert_eq!(parse_env("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(parse_env("A").is_err());
        assert!(parse_env("=b").is_err());
    }

    #[test]
    fn seconds_are_checked() {
        assert_eq!(parse_secs("1.5", "--delay", 0.0), Ok(1.5));
        assert_eq!(parse_secs("0", "--delay", 0.0), Ok(0.0));
        assert!(parse_secs("-1", "--delay", 0.0).is_err());
        assert!(parse_secs("0", "--timeout", f64::MIN_POSITIVE).is_err());
        assert!(parse_secs("NaN", "--delay", 0.0).is_err());
    }
}
