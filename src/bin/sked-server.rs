//! `sked-server`: the REST API server. Needs a migrated database (`sked migrate`).

use std::process::ExitCode;

use clap::Parser;
use sked::app::{self, ServerCommand};

/// The sked REST API server.
#[derive(Debug, Parser)]
#[command(name = "sked-server", version)]
struct Cli {
    #[command(flatten)]
    command: ServerCommand,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    app::init_tracing();
    match app::run_server(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {:#}", anyhow::Error::from(err));
            ExitCode::FAILURE
        }
    }
}
