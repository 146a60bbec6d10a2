//! The workflow commands of the `sked` binary: `sked submit -f FILE` reads a workflow from a
//! YAML or JSON file, and `sked workflow list|show|cancel|retry` act on workflows through the
//! REST API. A module of the `sked` binary.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use sked_types::workflow_spec::{SpecFormat, parse_spec};
use sked_types::{SubmitWorkflow, WorkflowChange, WorkflowDetail};
use uuid::Uuid;

use super::args::{ApiArgs, ShowArgs, print_answer, read_text};
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
    }
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
            truncate(&what(t), 40)
        ));
    }
    out
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
