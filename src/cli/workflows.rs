//! The workflow commands of the `sked` binary: `sked submit -f FILE` reads a workflow from a
//! YAML or JSON file, `sked workflow list|show|cancel|retry` act on workflows through the
//! REST API, and `sked workflow define|definitions|run` keep workflow definitions by name and
//! version and run them. A module of the `sked` binary.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use sked_types::workflow_spec::{SpecFormat, parse_spec};
use sked_types::{
    DefineWorkflow, RunWorkflowDefinition, SubmitWorkflow, WorkflowChange, WorkflowDefinition,
    WorkflowDetail,
};
use uuid::Uuid;

use super::args::{ApiArgs, ShowArgs, parse_env, parse_json, print_answer, read_text};
use super::format::{time, truncate, what};

#[derive(Debug, clap::Subcommand)]
pub enum WorkflowCommand {
    /// List workflows, newest first.
    List(ListArgs),
    /// Show a workflow: its state and every task with its state and dependencies.
    Show(ShowArgs),
    /// Cancel a workflow: unstarted tasks end cancelled, running ones are stopped.
    Cancel(IdArgs),
    /// Re-run a workflow from its failed or cancelled tasks.
    Retry(IdArgs),
    /// Keep a workflow file (YAML or JSON, as `sked submit -f` reads it) under a name: a new
    /// version unless it is the latest version's spec; prints the version.
    Define(DefineArgs),
    /// List stored workflow definitions (the latest version of each), or every version of one.
    Definitions(DefinitionsArgs),
    /// Run a stored workflow definition (its latest version, or --version); prints the new
    /// workflow's id.
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
pub struct DefineArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The definition's name: a letter or digit, then letters, digits, `_`, `.` and `-`.
    name: String,
    /// The workflow file (`-`: stdin).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    file: std::path::PathBuf,
    /// Keep it for this owner (admin tokens only).
    #[arg(long)]
    owner: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct DefinitionsArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// Every version of this definition, newest first.
    name: Option<String>,
    /// Print the raw JSON answer.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
#[command(disable_version_flag = true)]
pub struct RunArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The definition's name.
    name: String,
    /// The version to run (default: the latest).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    version: Option<i32>,
    /// A parameter over the definition's own, its value as JSON when it reads as JSON
    /// (`--param day=2026-03-01`, `--param n=3`); repeat for more.
    #[arg(long = "param", value_name = "NAME=VALUE", value_parser = parse_env)]
    params: Vec<(String, String)>,
    /// Parameters as one JSON object (the --param flags go over it).
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    params_json: Option<serde_json::Value>,
    /// Run the definition of this owner (admin tokens only).
    #[arg(long)]
    owner: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// Workflows per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=sked_server::MAX_PAGE))]
    limit: u32,
    /// Only workflows older than this one (the cursor printed below a full page).
    #[arg(long)]
    after: Option<Uuid>,
}

#[derive(Debug, clap::Args)]
pub struct IdArgs {
    #[command(flatten)]
    api: ApiArgs,
    id: Uuid,
}

pub async fn run(cmd: WorkflowCommand) -> anyhow::Result<()> {
    match cmd {
        WorkflowCommand::List(args) => list(args).await,
        WorkflowCommand::Show(args) => show(args).await,
        WorkflowCommand::Cancel(args) => {
            let change = args.api.client()?.cancel_workflow(args.id).await?;
            print_change(&change);
            Ok(())
        }
        WorkflowCommand::Retry(args) => {
            let change = args.api.client()?.retry_workflow(args.id).await?;
            print_change(&change);
            Ok(())
        }
        WorkflowCommand::Define(args) => {
            let spec = read_spec(&args.file)?;
            let request = DefineWorkflow {
                name: args.name,
                spec,
                owner: args.owner,
            };
            let d = args.api.client()?.define_workflow(&request).await?;
            outln!("{} version {}", d.name, d.version);
            Ok(())
        }
        WorkflowCommand::Definitions(args) => {
            let client = args.api.client()?;
            let page = match &args.name {
                Some(name) => client.workflow_definition(name).await?,
                None => client.workflow_definitions().await?,
            };
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&page)?);
            } else if page.definitions.is_empty() {
                eprintln!("no workflow definitions");
            } else {
                outln!("{}", definitions_table(&page.definitions));
            }
            Ok(())
        }
        WorkflowCommand::Run(args) => {
            let params = run_params(args.params_json, &args.params)?;
            let run = RunWorkflowDefinition {
                version: args.version,
                params,
                owner: args.owner,
            };
            let submitted = args
                .api
                .client()?
                .run_workflow_definition(&args.name, &run)
                .await?;
            outln!("{}", submitted.id);
            Ok(())
        }
    }
}

/// The parameters of `sked workflow run`: `--params-json`, then each `--param` over it, its
/// value as JSON when it reads as JSON, else as text.
fn run_params(
    json: Option<serde_json::Value>,
    params: &[(String, String)],
) -> anyhow::Result<Option<serde_json::Map<String, serde_json::Value>>> {
    let mut out = match json {
        None => None,
        Some(serde_json::Value::Object(map)) => Some(map),
        Some(other) => anyhow::bail!("--params-json must be a JSON object, not {other}"),
    };
    for (name, value) in params {
        let value = serde_json::from_str(value)
            .unwrap_or_else(|_| serde_json::Value::String(value.clone()));
        out.get_or_insert_with(Default::default)
            .insert(name.clone(), value);
    }
    Ok(out)
}

/// Definitions as a table, one version per line.
fn definitions_table(definitions: &[WorkflowDefinition]) -> String {
    let mut out = format!(
        "{:<30}  {:>7}  {:<12}  {:<19}  TASKS",
        "NAME", "VERSION", "OWNER", "CREATED"
    );
    for d in definitions {
        let tasks = d
            .spec
            .get("tasks")
            .and_then(|t| t.as_array())
            .map_or(0, Vec::len);
        out.push_str(&format!(
            "\n{:<30}  {:>7}  {:<12}  {:<19}  {}",
            truncate(&d.name, 30),
            d.version,
            truncate(&d.owner, 12),
            time(Some(d.created_at)),
            tasks
        ));
    }
    out
}

/// Reads a workflow file: JSON when its name ends in `.json`, else YAML (`-`: YAML or JSON
/// from stdin), by the format's one definition ([`sked_types::workflow_spec`], which the
/// dashboard's workflow form reads too). Unknown keys are errors.
pub fn read_spec(path: &Path) -> anyhow::Result<SubmitWorkflow> {
    let text = read_text(path, "the workflow file")?;
    let format = SpecFormat::of_file_name(&path.to_string_lossy());
    parse_spec(&text, format).with_context(|| format!("{} is not a valid workflow", path.display()))
}

/// `sked submit -f FILE`: prints the new workflow's id.
pub async fn submit_file(
    api: &ApiArgs,
    path: &Path,
    owner: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let mut spec = read_spec(path)?;
    if owner.is_some() {
        spec.owner = owner;
    }
    let submitted = api.client()?.submit_workflow(&spec).await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&submitted)?);
    } else {
        outln!("{}", submitted.id);
    }
    Ok(())
}

async fn list(args: ListArgs) -> anyhow::Result<()> {
    let page = args.api.client()?.workflows(args.after, args.limit).await?;
    if page.workflows.is_empty() {
        eprintln!("no workflows");
        return Ok(());
    }
    outln!(
        "{:<36}  {:<9}  {:<19}  {:<19}  NAME",
        "ID",
        "STATE",
        "CREATED",
        "FINISHED"
    );
    for w in &page.workflows {
        outln!(
            "{:<36}  {:<9}  {:<19}  {:<19}  {}",
            w.id,
            w.state.as_str(),
            time(Some(w.created_at)),
            time(w.finished_at),
            truncate(&w.name, 40)
        );
    }
    if let Some(cursor) = page.next_cursor {
        eprintln!("more: sked workflow list --after {cursor}");
    }
    Ok(())
}

async fn show(args: ShowArgs) -> anyhow::Result<()> {
    let answer = args.api.client()?.workflow_json(args.id).await?;
    print_answer(args.json, answer, describe)
}

/// The text `sked workflow show` prints.
pub fn describe(detail: &WorkflowDetail) -> String {
    let w = &detail.workflow;
    let mut out = String::new();
    out.push_str(&format!("{:<10} {}\n", "id:", w.id));
    if !w.name.is_empty() {
        out.push_str(&format!("{:<10} {}\n", "name:", w.name));
    }
    out.push_str(&format!("{:<10} {}\n", "state:", w.state));
    out.push_str(&format!("{:<10} {}\n", "owner:", w.owner));
    if let Some(d) = &w.definition {
        out.push_str(&format!(
            "{:<10} {} version {}\n",
            "defined:", d.name, d.version
        ));
    }
    if let Some(p) = &w.parent {
        out.push_str(&format!(
            "{:<10} sub-workflow of task {} in workflow {}\n",
            "parent:", p.task, p.workflow
        ));
    }
    out.push_str(&format!(
        "{:<10} {}\n",
        "created:",
        time(Some(w.created_at))
    ));
    out.push_str(&format!("{:<10} {}\n", "finished:", time(w.finished_at)));
    let names: HashMap<Uuid, String> = detail
        .tasks
        .iter()
        .map(|t| (t.id, t.name.clone().unwrap_or_else(|| t.id.to_string())))
        .collect();
    let mut parents: HashMap<Uuid, Vec<&str>> = HashMap::new();
    for e in &detail.edges {
        parents
            .entry(e.task)
            .or_default()
            .push(names.get(&e.depends_on).map_or("?", String::as_str));
    }
    out.push_str(&format!(
        "tasks:\n  {:<20}  {:<15}  {:>7}  {:<36}  {:<24}  RUN\n",
        "NAME", "STATE", "ATTEMPT", "ID", "DEPENDS ON"
    ));
    for t in &detail.tasks {
        let after = parents.get(&t.id).map(|p| p.join(", ")).unwrap_or_default();
        let rule = if t.trigger_rule == "all_success" || after.is_empty() {
            String::new()
        } else {
            format!(" ({})", t.trigger_rule)
        };
        out.push_str(&format!(
            "  {:<20}  {:<15}  {:>7}  {:<36}  {:<24}  {}\n",
            truncate(names.get(&t.id).map_or("", String::as_str), 20),
            t.state.as_str(),
            sked_types::service::attempts_text(t.attempt, t.max_attempts),
            t.id,
            truncate(&format!("{after}{rule}"), 24),
            // A sub-workflow's id whole, to be shown in turn.
            if t.kind == sked_types::TaskKind::Workflow {
                runs(t, &detail.subworkflows)
            } else {
                truncate(&runs(t, &detail.subworkflows), 40)
            }
        ));
    }
    out
}

/// What a workflow's task runs: its command, or for a sub-workflow task its latest
/// sub-workflow (`sked workflow show ID` shows it) or else what it will run.
fn runs(t: &sked_types::Task, subworkflows: &[sked_types::SubWorkflowRun]) -> String {
    if let Some(run) = subworkflows.iter().find(|s| s.task == t.id) {
        return format!("sub-workflow {} {}", run.workflow, run.state);
    }
    match t.subworkflow.as_ref() {
        Some(body) => match body.get("definition").and_then(|d| d.as_str()) {
            Some(name) => format!("sub-workflow of definition {name}"),
            None => "sub-workflow (inline)".to_owned(),
        },
        None => what(t),
    }
}

fn print_change(change: &WorkflowChange) {
    if change.tasks_rerun > 0 {
        outln!(
            "{}: {} ({} failed or cancelled tasks run again)",
            change.id,
            change.state,
            change.tasks_rerun
        );
    } else {
        outln!("{}: {}", change.id, change.state);
    }
}
