//! `sked spawn -f FILE|-`: what a running task runs to add a workflow to its own. It reads
//! the API's address, the task's token and the task's id from the environment its worker
//! gave it (`SKED_URL`, `SKED_TOKEN`, `SKED_TASK_ID`: a worker started with `--api-url`), and
//! prints the new task's id.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use sked::client::Client;
use sked_types::workflow_spec::{SpecFormat, parse_spec};
use uuid::Uuid;

use super::args::read_text;

/// `sked spawn`.
#[derive(Debug, clap::Args)]
pub struct SpawnArgs {
    /// The workflow to spawn: a workflow file (YAML, or JSON when the name ends in `.json`,
    /// as `sked submit -f` reads it), or a stored definition's run (`{definition: NAME,
    /// version: N, params: {...}}`); `-` reads it from stdin.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// The new task's name in the workflow (default: the file's `name`, else one is made).
    #[arg(long)]
    pub name: Option<String>,
    /// Do not make the spawning task's children wait for the new task: it runs beside them.
    #[arg(long)]
    pub no_wait: bool,
    /// Print the raw JSON answer.
    #[arg(long)]
    pub json: bool,
    /// URL of the sked API, as the worker gives it to the task.
    #[arg(long, env = "SKED_URL", hide = true)]
    pub url: Option<String>,
    /// The task's token, as the worker gives it to the task.
    #[arg(long, env = "SKED_TOKEN", hide = true, hide_env_values = true)]
    pub token: Option<String>,
    /// The spawning task, as the worker names it to the task.
    #[arg(long = "task", env = "SKED_TASK_ID", hide = true)]
    pub task: Option<Uuid>,
}

/// A stored definition's run, as a spawn file names it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefinitionRun {
    definition: String,
    #[serde(default)]
    version: Option<i32>,
    #[serde(default)]
    params: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    name: Option<String>,
}

/// Runs `sked spawn`: prints the new task's id.
pub async fn spawn(args: SpawnArgs) -> anyhow::Result<()> {
    let not_in_a_task = |var: &str| {
        anyhow::anyhow!(
            "{var} is not set: `sked spawn` runs inside a task, whose worker was started with \
             --api-url (SKED_API_URL) and gives it SKED_URL, SKED_TOKEN and SKED_TASK_ID"
        )
    };
    let url = args.url.clone().ok_or_else(|| not_in_a_task("SKED_URL"))?;
    let token = args
        .token
        .clone()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| not_in_a_task("SKED_TOKEN"))?;
    let task = args.task.ok_or_else(|| not_in_a_task("SKED_TASK_ID"))?;
    let mut body = read_body(&args.file)?;
    if let Some(name) = args.name {
        body["name"] = json!(name);
    }
    if args.no_wait {
        body["wait"] = json!(false);
    }
    let spawned = Client::new(&url, Some(token))?.spawn(task, &body).await?;
    if args.json {
        outln!("{}", json!({ "id": spawned.id }));
    } else {
        outln!("{}", spawned.id);
    }
    Ok(())
}

/// The spawn's body from a file: a stored definition's run when it names a `definition`, else
/// a workflow (the workflow file format, [`sked_types::workflow_spec`]).
fn read_body(path: &Path) -> anyhow::Result<Value> {
    let text = read_text(path, "the workflow file")?;
    let format = SpecFormat::of_file_name(&path.to_string_lossy());
    body_of(&text, format).with_context(|| format!("{} cannot be spawned", path.display()))
}

fn body_of(text: &str, format: SpecFormat) -> anyhow::Result<Value> {
    let value: Option<Value> = match format {
        SpecFormat::Json => serde_json::from_str(text).ok(),
        SpecFormat::Yaml => yaml_serde::from_str(text).ok(),
    };
    if value
        .as_ref()
        .is_some_and(|v| v.get("definition").is_some())
    {
        let run: DefinitionRun = serde_json::from_value(value.unwrap_or_default())
            .context("a definition's run is {definition: NAME, version: N, params: {...}}")?;
        let mut body = json!({ "definition": run.definition });
        if let Some(version) = run.version {
            body["version"] = json!(version);
        }
        if let Some(params) = run.params {
            body["params"] = Value::Object(params);
        }
        if let Some(name) = run.name {
            body["name"] = json!(name);
        }
        return Ok(body);
    }
    let spec = parse_spec(text, format).context("not a valid workflow")?;
    if spec.owner.is_some() {
        bail!("a spawned workflow belongs to the spawning task's owner: leave `owner` out");
    }
    let mut body = json!({ "tasks": spec.tasks });
    if let Some(name) = spec.name {
        body["name"] = json!(name);
    }
    if let Some(params) = spec.params {
        body["params"] = Value::Object(params);
    }
    if let Some(notify) = spec.notify {
        body["notify"] = notify;
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workflow_file_is_spawned_as_its_tasks() {
        let body = body_of(
            "name: more\nparams: {n: 2}\ntasks:\n  - name: a\n    command: [echo, hi]\n    \
             timeout_secs: 60\n  - name: b\n    command: ['true']\n    depends_on: [a]\n",
            SpecFormat::Yaml,
        )
        .unwrap();
        assert_eq!(body["name"], "more");
        assert_eq!(body["params"], json!({"n": 2}));
        assert_eq!(body["tasks"][0]["command"], json!(["echo", "hi"]));
        assert_eq!(body["tasks"][0]["timeout_secs"], json!(60.0));
        assert_eq!(body["tasks"][1]["depends_on"], json!(["a"]));
    }

    #[test]
    fn a_definition_file_is_spawned_as_its_run() {
        let body = body_of(
            "definition: etl\nversion: 3\nparams: {day: monday}\n",
            SpecFormat::Yaml,
        )
        .unwrap();
        assert_eq!(
            body,
            json!({"definition": "etl", "version": 3, "params": {"day": "monday"}})
        );
        let body = body_of(r#"{"definition": "etl"}"#, SpecFormat::Json).unwrap();
        assert_eq!(body, json!({"definition": "etl"}));
    }

    #[test]
    fn bad_files_are_refused() {
        for (text, format) in [
            ("definition: etl\nowner: bob\n", SpecFormat::Yaml),
            ("definition: etl\ntasks: []\n", SpecFormat::Yaml),
            ("tasks: []\n", SpecFormat::Yaml),
            (
                "owner: bob\ntasks:\n  - name: a\n    command: [x]\n",
                SpecFormat::Yaml,
            ),
            ("{", SpecFormat::Json),
        ] {
            assert!(body_of(text, format).is_err(), "{text}");
        }
    }
}
