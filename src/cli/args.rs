//! What the subcommands share: where the API is and who calls it ([`ApiArgs`]), the
//! arguments of every `show` ([`ShowArgs`]) and of the listings by owner ([`OwnerListArgs`]),
//! the flags of a task that `submit` and `schedule create` both take ([`TaskFlags`]), reading
//! a file argument, printing an answer, and the parsers of flags that several subcommands
//! take.

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use sked::client::Client;
use sked_types::SubmitTask;
use uuid::Uuid;

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

/// `sked … show ID [--json]`.
#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    pub id: Uuid,
    /// Print the raw JSON answer.
    #[arg(long)]
    pub json: bool,
}

/// `sked … list [--owner OWNER] [--json]`: the listings a user token sees its own owner's
/// part of.
#[derive(Debug, clap::Args)]
pub struct OwnerListArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    /// List only this owner's (admin tokens; a user token lists its own).
    #[arg(long)]
    pub owner: Option<String>,
    /// Print the raw JSON answer.
    #[arg(long)]
    pub json: bool,
}

/// The flags of a task that `sked submit` and `sked schedule create` both take: where it
/// queues, its environment, its attempts and the labels its worker must offer.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TaskFlags {
    /// Queue of the task (default: `default`).
    #[arg(long)]
    pub queue: Option<String>,
    /// Higher runs first.
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// An environment variable of the process; repeat for more.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Attempts before the task fails for good.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub max_attempts: Option<i32>,
    /// A label the worker must offer; repeat for more.
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// An alert target told when the task fails for good; repeat for more
    /// (docs/operations.md, "Alerts").
    #[arg(long = "on-failure", value_name = "TARGET")]
    pub on_failure: Vec<String>,
    /// An alert target told when the task succeeds; repeat for more.
    #[arg(long = "on-success", value_name = "TARGET")]
    pub on_success: Vec<String>,
    /// An alert target told when an attempt fails and the task will be retried.
    #[arg(long = "on-retry", value_name = "TARGET")]
    pub on_retry: Vec<String>,
    /// The whole notify as JSON, follow-up tasks included:
    /// '{"on_failure": ["ops", {"task": {"command": ["./cleanup"]}}]}'.
    #[arg(long, value_name = "JSON", value_parser = parse_json_object,
          conflicts_with_all = ["on_failure", "on_success", "on_retry"])]
    pub notify: Option<serde_json::Value>,
}

/// The notify that `--on-failure`, `--on-success` and `--on-retry` name (of a task, or of a
/// queue's tasks); `None` when they name no target.
pub(crate) fn notify_of(
    on_failure: &[String],
    on_success: &[String],
    on_retry: &[String],
) -> Option<serde_json::Value> {
    let mut notify = serde_json::Map::new();
    for (hook, targets) in [
        ("on_failure", on_failure),
        ("on_success", on_success),
        ("on_retry", on_retry),
    ] {
        if !targets.is_empty() {
            notify.insert(hook.to_owned(), serde_json::json!(targets));
        }
    }
    (!notify.is_empty()).then_some(serde_json::Value::Object(notify))
}

/// A JSON object given to a flag.
fn parse_json_object(s: &str) -> Result<serde_json::Value, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err("must be a JSON object".to_owned()),
        Err(e) => Err(format!("is not JSON: {e}")),
    }
}

impl TaskFlags {
    /// Sets the task's queue, priority, environment, attempts, labels and notify from the
    /// flags.
    pub fn apply(&self, task: &mut SubmitTask) {
        task.queue = self.queue.clone();
        task.priority = self.priority;
        task.env = self.env.iter().cloned().collect();
        task.max_attempts = self.max_attempts;
        task.labels = self.labels.clone();
        task.notify = self
            .notify
            .clone()
            .or_else(|| notify_of(&self.on_failure, &self.on_success, &self.on_retry));
    }
}

/// Prints an answer of the API: the raw JSON with `--json`, else the text `describe` makes
/// of it.
pub(crate) fn print_answer<T: DeserializeOwned>(
    json: bool,
    answer: serde_json::Value,
    describe: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(&answer)?);
    } else {
        let answer: T = serde_json::from_value(answer)
            .context("the server's answer is not what it should be")?;
        out!("{}", describe(&answer));
    }
    Ok(())
}

/// The text of the file a flag names (`what`, e.g. "--input-file"), or of stdin for `-`.
pub(crate) fn read_text(path: &Path, what: &str) -> anyhow::Result<String> {
    let mut text = String::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .with_context(|| format!("reading {what} from stdin"))?;
    } else {
        text = std::fs::read_to_string(path)
            .with_context(|| format!("reading {what} {}", path.display()))?;
    }
    Ok(text)
}

/// The parser of a flag that takes one of `values` by its name: `--help` and clap's error
/// list the names, and the flag holds the value itself.
pub(crate) fn one_of<T: Copy + Send + Sync + 'static>(
    values: &'static [T],
    name: fn(T) -> &'static str,
) -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(values.iter().map(|v| name(*v))).map(move |chosen| {
        *values
            .iter()
            .find(|v| name(**v) == chosen)
            .expect("clap accepts only the possible values")
    })
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
    fn one_of_takes_the_names_of_its_values() {
        use clap::builder::TypedValueParser;
        use sked_types::TaskKind;
        let command = clap::Command::new("t");
        let parser = one_of(&TaskKind::ALL, TaskKind::as_str);
        for kind in TaskKind::ALL {
            let value = parser.parse_ref(&command, None, kind.as_str().as_ref());
            assert_eq!(value.unwrap(), kind);
        }
        let refused = parser
            .parse_ref(&command, None, "teleport".as_ref())
            .unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("command, noop, sleep, service"),
            "{refused}"
        );
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

/// The filters of `sked list`, which `sked tasks retry|cancel` select by too: the parameters
/// of `GET /api/v1/tasks`.
#[derive(Debug, clap::Args)]
pub struct TaskFilterArgs {
    /// Only tasks in this state; repeat for several (`--state failed --state cancelled`).
    #[arg(long, value_parser = one_of(&sked_types::TaskState::ALL, sked_types::TaskState::as_str))]
    pub state: Vec<sked_types::TaskState>,
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this owner's tasks (a user token sees its own only).
    #[arg(long)]
    pub owner: Option<String>,
    /// Only tasks whose command line or name contains this text, ignoring case.
    #[arg(long, value_name = "TEXT")]
    pub search: Option<String>,
    /// Only the tasks this worker runs now.
    #[arg(long, value_name = "ID")]
    pub worker: Option<Uuid>,
    /// Only the shards of this sharded task.
    #[arg(long, value_name = "ID")]
    pub shard_of: Option<Uuid>,
    /// Only the tasks of this workflow.
    #[arg(long, value_name = "ID")]
    pub workflow: Option<Uuid>,
    /// Only the occurrences of this schedule that its history keeps.
    #[arg(long, value_name = "ID")]
    pub schedule: Option<Uuid>,
    /// Only tasks submitted at or after this time: RFC 3339, or a duration ago (`2h`).
    #[arg(long, value_name = "TIME", value_parser = time_or_ago("--created-after"))]
    pub created_after: Option<DateTime<Utc>>,
    /// Only tasks submitted before this time: RFC 3339, or a duration ago (`2h`).
    #[arg(long, value_name = "TIME", value_parser = time_or_ago("--created-before"))]
    pub created_before: Option<DateTime<Utc>>,
    /// Only tasks that finished at or after this time: RFC 3339, or a duration ago (`1h`).
    #[arg(long, value_name = "TIME", value_parser = time_or_ago("--finished-after"))]
    pub finished_after: Option<DateTime<Utc>>,
    /// Only tasks that finished before this time: RFC 3339, or a duration ago (`1h`).
    #[arg(long, value_name = "TIME", value_parser = time_or_ago("--finished-before"))]
    pub finished_before: Option<DateTime<Utc>>,
}

impl TaskFilterArgs {
    /// The listing's query of these filters (its first page, of the server's size).
    pub fn query(self) -> sked::client::ListQuery {
        sked::client::ListQuery {
            state: self.state,
            queue: self.queue,
            owner: self.owner,
            q: self.search,
            worker: self.worker,
            shard_of: self.shard_of,
            workflow: self.workflow,
            schedule: self.schedule,
            created_after: self.created_after,
            created_before: self.created_before,
            finished_after: self.finished_after,
            finished_before: self.finished_before,
            after: None,
            limit: None,
        }
    }
}

/// A flag's time: RFC 3339, or a duration before now (`90m`, `2h`, `1d`).
pub fn time_or_ago(
    flag: &'static str,
) -> impl Fn(&str) -> Result<DateTime<Utc>, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        if let Ok(t) = super::when::parse_time(s, flag) {
            return Ok(t);
        }
        let secs = super::when::parse_duration(s, flag, 0.0).map_err(|_| {
            format!(
                "{flag} must be an RFC 3339 time like 2030-01-02T03:04:05Z or a duration ago \
                 like 90m, 2h or 1d, got {s:?}"
            )
        })?;
        let ago = chrono::Duration::milliseconds((secs * 1000.0).round() as i64);
        Ok(Utc::now() - ago)
    }
}
