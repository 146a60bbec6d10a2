//! Which environment values the API shows masked, and how.
//!
//! A task's `env` often carries credentials. API answers (and so the CLI and the dashboard)
//! show a value as [`MASK`] when its name looks secret, and hide the password of a URL with
//! credentials in any other value. The database keeps the real values: the worker reads them
//! from there, and `POST /api/v1/tasks/{id}/resubmit` copies them in SQL.
//!
//! The rule, case-insensitive:
//! - a name containing one of [`SECRET_NAME_PARTS`] (`SECRET`, `TOKEN`, `PASS`, `KEY`, `AUTH`,
//!   `CREDENTIAL`, `PRIVATE`, `DSN`, `CERT`, `SESSION`, `COOKIE`, `SIGNATURE`, `SALT`) has its
//!   whole value masked: `API_TOKEN`, `PGPASSWORD`, `AWS_SECRET_ACCESS_KEY`, `SENTRY_DSN`;
//! - in any other value, the password of a URL written `scheme://user:password@host` is
//!   masked: `postgres://app:••••••@db/shop`.
//!
//! The rule errs on the side of masking: `KEYBOARD` is masked too.

use std::collections::BTreeMap;

/// What a masked value (or a URL's masked password) reads as.
pub const MASK: &str = "••••••";

/// Parts of a name (compared in upper case) that make its value secret.
pub const SECRET_NAME_PARTS: &[&str] = &[
    "SECRET",
    "TOKEN",
    "PASS",
    "KEY",
    "AUTH",
    "CREDENTIAL",
    "PRIVATE",
    "DSN",
    "CERT",
    "SESSION",
    "COOKIE",
    "SIGNATURE",
    "SALT",
];

/// True when the value of the variable `name` is masked whole.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_NAME_PARTS.iter().any(|part| upper.contains(part))
}

/// The value as the API shows it for the variable `name`.
pub fn mask_value(name: &str, value: &str) -> String {
    if is_secret_name(name) {
        return MASK.to_owned();
    }
    mask_url_passwords(value)
}

/// Masks every value of an environment by [`mask_value`].
pub fn mask_env(env: &mut BTreeMap<String, String>) {
    for (name, value) in env.iter_mut() {
        *value = mask_value(name, value);
    }
}

/// Masks the environments of a schedule's template as the API shows it: the `env` of a task
/// template (`{"env": {...}}`), and of every task of a workflow template
/// (`{"tasks": [{"env": {...}}, ...]}`), also within the inline sub-workflows of its tasks
/// (`{"tasks": [{"workflow": {"tasks": [...]}}]}`, a sub-workflow task's `subworkflow`).
/// Values that are not strings are left as they are.
pub fn mask_template_env(template: &mut serde_json::Value) {
    fn mask_object_env(task: &mut serde_json::Value) {
        if let Some(serde_json::Value::Object(env)) = task.get_mut("env") {
            for (name, value) in env.iter_mut() {
                if let serde_json::Value::String(text) = value {
                    *text = mask_value(name, text);
                }
            }
        }
        if let Some(sub) = task.get_mut("workflow") {
            mask_template_env(sub);
        }
    }
    mask_object_env(template);
    if let Some(serde_json::Value::Array(tasks)) = template.get_mut("tasks") {
        tasks.iter_mut().for_each(mask_object_env);
    }
}

/// `value` with the password of each `scheme://user:password@host` replaced by [`MASK`].
fn mask_url_passwords(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority ends at the first '/', '?', '#' or whitespace; its userinfo at the
        // last '@' within it.
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@').and_then(|at| {
            let userinfo = &authority[..at];
            userinfo.find(':').map(|colon| (colon, at))
        }) {
            Some((colon, at)) => {
                out.push_str(&authority[..=colon]);
                out.push_str(MASK);
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_masked_whole() {
        for name in [
            "API_TOKEN",
            "PGPASSWORD",
            "db_passwd",
            "AWS_SECRET_ACCESS_KEY",
            "SENTRY_DSN",
            "Authorization",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "TLS_CERT",
            "private_key",
        ] {
            assert_eq!(mask_value(name, "s3cr3t"), MASK, "{name} names a secret");
        }
        for name in ["PATH", "LOG_LEVEL", "HOME", "REGION"] {
            assert_eq!(mask_value(name, "plain"), "plain", "{name} is not secret");
        }
    }

    #[test]
    fn templates_have_their_task_envs_masked() {
        let mut task = serde_json::json!({
            "command": ["backup"],
            "env": {"PGPASSWORD": "hunter2", "URL": "postgres://a:b@db/x", "MODE": "full"},
        });
        mask_template_env(&mut task);
        assert_eq!(
            task["env"],
            serde_json::json!({"PGPASSWORD": MASK, "URL": format!("postgres://a:{MASK}@db/x"), "MODE": "full"})
        );
        assert_eq!(task["command"], serde_json::json!(["backup"]));

        let mut workflow = serde_json::json!({"name": "w", "tasks": [
            {"name": "a", "command": ["x"], "env": {"API_TOKEN": "t0k"}},
            {"name": "b", "command": ["y"]},
        ]});
        mask_template_env(&mut workflow);
        assert_eq!(workflow["tasks"][0]["env"]["API_TOKEN"], MASK);
        assert!(workflow["tasks"][1].get("env").is_none());
    }

    #[test]
    fn url_passwords_are_masked_in_other_values() {
        assert_eq!(
            mask_value(
                "DATABASE_URL",
                "postgres://app:hunter2@db:5432/shop?sslmode=require"
            ),
            format!("postgres://app:{MASK}@db:5432/shop?sslmode=require")
        );
        assert_eq!(
            mask_value(
                "MIRRORS",
                "https://a:b@x.org/p https://y.org/q ftp://u:p:q@z"
            ),
            format!("https://a:{MASK}@x.org/p https://y.org/q ftp://u:{MASK}@z")
        );
        assert_eq!(
            mask_value("URL", "https://user@host/path"),
            "https://user@host/path",
            "a URL without a password keeps its user"
        );
        assert_eq!(mask_value("URL", "not a url: a@b"), "not a url: a@b");
        assert_eq!(mask_value("URL", "http://"), "http://");
    }

    #[test]
    fn mask_env_changes_only_what_the_rule_names() {
        let mut env = BTreeMap::from([
            ("TOKEN".to_owned(), "t".to_owned()),
            ("LEVEL".to_owned(), "info".to_owned()),
        ]);
        mask_env(&mut env);
        assert_eq!(env["TOKEN"], MASK);
        assert_eq!(env["LEVEL"], "info");
    }
}
