//! `sked-worker`: claims tasks from PostgreSQL and runs them until SIGTERM/SIGINT, then shuts
//! down gracefully. Needs a migrated database (`sked migrate`).

use std::process::ExitCode;

use clap::Parser;
use sked::app::{self, WorkerCommand};
use sked::logging::LogArgs;

/// The sked worker.
#[derive(Debug, Parser)]
#[command(name = "sked-worker", version)]
struct Cli {
    #[command(flatten)]
    command: WorkerCommand,
    #[command(flatten)]
    log: LogArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    sked::logging::init(cli.log.log_format);
    match app::run_worker(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {:#}", anyhow::Error::from(err));
            ExitCode::FAILURE
        }
    }
}
