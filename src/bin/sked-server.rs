//! `sked-server`: the REST API server. Needs a migrated database (`sked migrate`).

use std::process::ExitCode;

use clap::Parser;
use sked::app::{self, ServerCommand};
use sked::logging::LogArgs;

/// The sked REST API server.
#[derive(Debug, Parser)]
#[command(name = "sked-server", version)]
struct Cli {
    #[command(flatten)]
    command: ServerCommand,
    #[command(flatten)]
    log: LogArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let telemetry = match sked::logging::init(&cli.log, "sked-server") {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = app::run_server(cli.command).await;
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
