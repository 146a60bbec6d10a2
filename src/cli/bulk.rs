//! `sked tasks retry` and `sked tasks cancel`: retry or cancel every task that the filters of
//! `sked list` select. The command counts them first (a dry run), shows the count, asks for
//! confirmation on a terminal (`--yes` for scripts), then acts on at most that many.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::bail;
use sked_types::bulk::{BulkAction, describe, result_text, thousands};

use super::args::{ApiArgs, TaskFilterArgs};

#[derive(Debug, clap::Subcommand)]
pub enum TasksCommand {
    /// Retry every finished task the filters select (succeeded, failed, cancelled; with
    /// --state, those of its states): `sked tasks retry --state failed --queue mail`.
    Retry(BulkArgs),
    /// Cancel every unfinished task the filters select (blocked, waiting, retry; running
    /// ones are stopped by their workers): `sked tasks cancel --state waiting --queue mail`.
    Cancel(BulkArgs),
}

/// The filters of `sked list`, and how to confirm.
#[derive(Debug, clap::Args)]
pub struct BulkArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(flatten)]
    filters: TaskFilterArgs,
    /// Act without asking (for scripts): on at most as many tasks as the count found.
    #[arg(long, short = 'y')]
    yes: bool,
    /// Only count the tasks, changing nothing.
    #[arg(long, conflicts_with = "yes")]
    dry_run: bool,
}

pub async fn run(cmd: TasksCommand) -> anyhow::Result<()> {
    let (action, args) = match cmd {
        TasksCommand::Retry(args) => ("retry", args),
        TasksCommand::Cancel(args) => ("cancel", args),
    };
    let client = args.api.client()?;
    let selection = args.filters.query();
    let preview = client
        .bulk(
            action,
            &selection,
            &BulkAction {
                dry_run: true,
                max: None,
            },
        )
        .await?;
    let what = describe(
        &preview,
        selection.queue.as_deref(),
        selection.owner.as_deref(),
        selection.q.as_deref(),
    );
    let verb = if action == "retry" { "Retry" } else { "Cancel" };
    if preview.matched == 0 {
        outln!("no tasks to {action}");
        return Ok(());
    }
    if preview.more {
        eprintln!(
            "more tasks match than one request acts on: this acts on the newest {}; run it \
             again for the rest",
            thousands(preview.matched)
        );
    }
    if args.dry_run {
        outln!("would {action} {what}");
        return Ok(());
    }
    outln!("{verb} {what}?");
    if !args.yes {
        if !std::io::stdin().is_terminal() {
            bail!("not asking without a terminal: pass --yes to {action} them");
        }
        eprint!("[y/N] ");
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            bail!("nothing changed");
        }
    }
    let outcome = client
        .bulk(
            action,
            &selection,
            &BulkAction {
                dry_run: false,
                max: Some(preview.matched),
            },
        )
        .await?;
    outln!("{}", result_text(&outcome));
    Ok(())
}
