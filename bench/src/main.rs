//! `sked-bench`: enqueue, drain, latency and memory benchmarks of sked against a local
//! PostgreSQL, run on demand (never by the test suite). Prints a table and a JSON document,
//! and writes the JSON to `bench/results/<timestamp>.json`. See `bench/README.md`.

mod api;
mod awaits;
mod config;
mod dashboard;
mod delayed;
mod drain;
mod history;
mod latency;
mod live;
mod mix;
mod peer;
mod pg;
mod placement;
mod pooler;
mod process;
mod reads;
mod report;
mod retention;
mod schedules;
mod snapshot;
mod w1;
mod workers;
mod workflow;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;

use config::{Cli, Config, Workload};
use report::Sample;

#[tokio::main]
async fn main() -> ExitCode {
    let config = match Cli::parse().into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match run(config).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the chosen workloads `repeat` times each; returns false when one of them failed.
async fn run(cfg: Config) -> Result<bool> {
    let pg_version = pg::server_version(&cfg.database_url).await?;
    if cfg.needs_worker() {
        process::check_worker_bin(&cfg.worker_bin)?;
    }
    let started_at = chrono::Utc::now();
    let mut samples: Vec<Sample> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    for &workload in &cfg.workloads {
        let runs = cfg.runs(workload);
        for run in 1..=runs {
            eprintln!("sked-bench: {} run {run}/{runs} ...", workload.name());
            let result = match workload {
                Workload::W1 => w1::run(&cfg).await,
                Workload::W2 => drain::w2(&cfg).await,
                Workload::W3 => latency::run(&cfg).await,
                Workload::W4 => drain::w4(&cfg).await,
                Workload::W5 => delayed::run(&cfg).await,
                Workload::W6 => workflow::run(&cfg).await,
                Workload::W7 => schedules::run(&cfg).await,
                Workload::W8 => reads::run(&cfg).await,
                Workload::W9 => dashboard::run(&cfg).await,
                Workload::W10 => placement::run(&cfg).await,
                Workload::W11 => history::run(&cfg).await,
                Workload::W12 => snapshot::run(&cfg).await,
                Workload::W13 => retention::run(&cfg).await,
                Workload::W14 => awaits::run(&cfg).await,
                Workload::W15 => live::run(&cfg).await,
                Workload::W16 => mix::run(&cfg).await,
                Workload::W17 => workers::run(&cfg).await,
                Workload::W18 => pooler::run(&cfg).await,
                Workload::Peer => peer::run(&cfg).await,
            };
            match result {
                Ok(s) => {
                    for x in &s {
                        eprintln!(
                            "  {:<60} {}",
                            x.metric,
                            report::format_value(x.value, x.unit)
                        );
                    }
                    samples.extend(s);
                }
                Err(e) => {
                    let msg = format!("{} run {run}: {e:#}", workload.name());
                    eprintln!("  {msg}");
                    errors.push(msg);
                }
            }
        }
    }
    let finished_at = chrono::Utc::now();

    let rows = report::aggregate(&samples);
    let document = json!({
        "benchmark": "sked-bench",
        "version": env!("CARGO_PKG_VERSION"),
        "started_at": started_at,
        "finished_at": finished_at,
        "environment": {
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "postgres": pg_version,
        },
        "workloads": cfg.workloads.iter().map(|w| w.name()).collect::<Vec<_>>(),
        "config": &cfg,
        "results": rows,
        "errors": errors,
    });
    println!();
    print!("{}", report::render_table(&rows, &errors, cfg.most_runs()));
    println!();
    let text = serde_json::to_string_pretty(&document)?;
    println!("{text}");

    std::fs::create_dir_all(&cfg.results_dir)
        .with_context(|| format!("creating {}", cfg.results_dir.display()))?;
    let path = cfg
        .results_dir
        .join(format!("{}.json", started_at.format("%Y-%m-%dT%H-%M-%SZ")));
    std::fs::write(&path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    eprintln!("sked-bench: results written to {}", path.display());
    Ok(errors.is_empty())
}
