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
    let telemetry = match sked::logging::init(&cli.log, "sked-worker") {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = app::run_worker(cli.command).await;
    // The spans of the graceful shutdown are ended: the last batch is sent.
    telemetry.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {:#}", anyhow::Error::from(err));
            ExitCode::FAILURE
        }
    }
}
