//! `sked`: the command-line tool. Administers the database (`migrate`, `token create`), talks
//! to the REST API (`submit`, `list`, `show`, `logs`, `cancel`, `retry`, `resubmit`,
//! `tasks retry|cancel`), runs the server or a worker, and starts everything in one process
//! with `sked dev`.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sked::app::{self, DatabaseArgs, DevCommand, ServerCommand, WorkerCommand};

use cli::args::ShowArgs;
use cli::commands::{ListArgs, LogsArgs, ResubmitArgs, SubmitArgs, TaskIdArgs, TokenCommand};
use cli::schedules::{CronCommand, ScheduleCommand};
use cli::{commands, queues, schedules, services, wait, workflows};

/// sked: a task scheduler that uses PostgreSQL as its only moving part.
#[derive(Debug, Parser)]
#[command(name = "sked", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: sked::logging::LogArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or upgrade the sked schema, then print its version.
    Migrate(DatabaseArgs),
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Submit a task: `sked submit [flags] -- COMMAND [ARGS...]`, or a workflow:
    /// `sked submit -f workflow.yaml`.
    Submit(SubmitArgs),
    /// List tasks, newest first.
    List(ListArgs),
    /// Show a task and its attempts.
    Show(ShowArgs),
    /// Print a task's output (stdout and stderr); --follow until the task is finished.
    Logs(LogsArgs),
    /// Wait until tasks or workflows are finished; the exit status says how they ended.
    Wait(wait::WaitArgs),
    /// Cancel a task (a running one is stopped by its worker).
    Cancel(TaskIdArgs),
    /// Run a finished task again.
    Retry(TaskIdArgs),
    /// Submit a new task with the definition of a task (its environment too); prints its id.
    Resubmit(ResubmitArgs),
    /// Retry or cancel every task the filters of `sked list` select, after showing how many:
    /// `sked tasks retry --state failed --queue mail` (`--yes` for scripts).
    #[command(subcommand)]
    Tasks(cli::bulk::TasksCommand),
    /// List, show, cancel or re-run workflows (submit them with `sked submit -f FILE`).
    #[command(subcommand)]
    Workflow(workflows::WorkflowCommand),
    /// From inside a running task: add a workflow (a file, or a stored definition's run) to
    /// the task's own workflow, with the token its worker gave it; prints the new task's id.
    Spawn(cli::spawn::SpawnArgs),
    /// List the long-running services that run (submit one with `sked submit --service`).
    Services(services::ListArgs),
    /// Show or change a service (stop it with `sked cancel ID`).
    #[command(subcommand)]
    Service(services::ServiceCommand),
    /// Queues: list them, pause and resume them, limit how many of their tasks run at once
    /// and start per second, set how long their finished tasks are kept.
    #[command(subcommand)]
    Queue(queues::QueueCommand),
    /// How long finished tasks are kept where their queue sets nothing: show it, change it,
    /// turn it off or on.
    #[command(subcommand)]
    Retention(queues::RetentionCommand),
    /// Alerts: the webhooks (targets) that tasks' notify names (admin tokens).
    #[command(subcommand)]
    Alert(cli::alerts::AlertCommand),
    /// Cron schedules: create, list, show, pause, resume, run now, delete.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
    /// Cron expressions: `sked cron next EXPR` prints the next fire times.
    #[command(subcommand)]
    Cron(CronCommand),
    /// The text search's trigram index: make it, drop it, or say whether it is there (with
    /// the account that migrates).
    #[command(subcommand)]
    SearchIndex(cli::search_index::SearchIndexCommand),
    /// Run the REST API server.
    Server(ServerCommand),
    /// Run a worker.
    Worker(WorkerCommand),
    /// Start everything in one process: a private PostgreSQL (unless DATABASE_URL is set), the
    /// API server and a worker.
    Dev(DevCommand),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let service = match cli.command {
        Command::Server(_) => "sked-server",
        Command::Worker(_) => "sked-worker",
        _ => "sked",
    };
    let telemetry = match sked::logging::init(&cli.log, service) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = run(cli.command).await;
    // The spans of a server's or worker's graceful shutdown are ended: the last batch is sent.
    telemetry.shutdown().await;
    result
}

async fn run(command: Command) -> ExitCode {
    let result: anyhow::Result<()> = match command {
        Command::Migrate(args) => commands::migrate(args).await,
        Command::Token(cmd) => commands::token(cmd).await,
        Command::Submit(args) => commands::submit(args).await,
        Command::List(args) => commands::list(args).await,
        Command::Show(args) => commands::show(args).await,
        Command::Logs(args) => commands::logs(args).await,
        Command::Wait(args) => {
            return wait::wait(args).await.unwrap_or_else(|err| {
                eprintln!("error: {err:#}");
                ExitCode::FAILURE
            });
        }
        Command::Cancel(args) => commands::cancel(args).await,
        Command::Retry(args) => commands::retry(args).await,
        Command::Services(args) => services::list(args).await,
        Command::Service(cmd) => services::run(cmd).await,
        Command::Resubmit(args) => commands::resubmit(args).await,
        Command::Tasks(cmd) => cli::bulk::run(cmd).await,
        Command::Workflow(cmd) => workflows::run(cmd).await,
        Command::Spawn(args) => cli::spawn::spawn(args).await,
        Command::Queue(cmd) => queues::run(cmd).await,
        Command::Retention(cmd) => queues::retention(cmd).await,
        Command::Schedule(cmd) => schedules::schedule(cmd).await,
        Command::Alert(cmd) => cli::alerts::run(cmd).await,
        Command::Cron(cmd) => schedules::cron(cmd).await,
        Command::SearchIndex(cmd) => cli::search_index::run(cmd).await,
        Command::Server(cmd) => app::run_server(cmd).await.map_err(Into::into),
        Command::Worker(cmd) => app::run_worker(cmd).await.map_err(Into::into),
        Command::Dev(cmd) => app::run_dev(cmd, std::env::var_os("PATH"))
            .await
            .map_err(Into::into),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_valid() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
