//! `sked queue …` (list, pause, resume, limit): the queue controls, which talk to the REST
//! API. Pausing and limiting need an admin token. Flags are validated here, before any
//! request.

use anyhow::bail;
use sked_types::{QueueControls, QueueCounts, QueueLimits, TaskState};

use super::args::ApiArgs;
use super::format::time;

#[derive(Debug, clap::Subcommand)]
pub enum QueueCommand {
    /// List queues with their task counts and controls.
    List(ListArgs),
    /// Pause a queue: no worker claims its tasks until it is resumed (running tasks go on).
    Pause(NameArgs),
    /// Resume a paused queue.
    Resume(NameArgs),
    /// Set or remove a queue's limits, over all workers: `sked queue limit NAME
    /// [--max-running N] [--rate PER_SEC] [--burst N]` (`none` removes a limit; a flag left
    /// out keeps it).
    Limit(LimitArgs),
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(Debug, clap::Args)]
pub struct NameArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The queue.
    name: String,
}

#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The queue.
    name: String,
    /// Most of its tasks running at once over all workers (1 to 1000000), or `none`.
    #[arg(long, value_name = "N|none", allow_hyphen_values = true,
          value_parser = |s: &str| parse_count(s, "--max-running"))]
    max_running: Option<Limit<i32>>,
    /// Most of its tasks started per second, on average (more than 0, at most 1000000;
    /// 0.5 is one every two seconds), or `none`.
    #[arg(long, value_name = "PER_SEC|none", allow_hyphen_values = true,
          value_parser = parse_rate)]
    rate: Option<Limit<f64>>,
    /// Most starts at once under the rate limit (1 to 1000000), or `none` for the rate
    /// rounded up.
    #[arg(long, value_name = "N|none", allow_hyphen_values = true,
          value_parser = |s: &str| parse_count(s, "--burst"))]
    burst: Option<Limit<i32>>,
}

/// A limit's new value: a number, or `none` to remove it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit<T>(Option<T>);

fn parse_count(s: &str, flag: &str) -> Result<Limit<i32>, String> {
    if s.trim() == "none" {
        return Ok(Limit(None));
    }
    match s.trim().parse::<i64>() {
        Ok(n) if (1..=1_000_000).contains(&n) => Ok(Limit(Some(n as i32))),
        _ => Err(format!(
            "{flag} must be a whole number from 1 to 1000000, or none; got {s:?}"
        )),
    }
}

fn parse_rate(s: &str) -> Result<Limit<f64>, String> {
    if s.trim() == "none" {
        return Ok(Limit(None));
    }
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 && r <= 1_000_000.0 => Ok(Limit(Some(r))),
        _ => Err(format!(
            "--rate must be a number of tasks per second, more than 0 and at most 1000000, or none; got {s:?}"
        )),
    }
}

pub async fn run(cmd: QueueCommand) -> anyhow::Result<()> {
    match cmd {
        QueueCommand::List(args) => {
            let queues = args.api.client()?.queues().await?;
            print!("{}", table(&queues));
        }
        QueueCommand::Pause(args) => {
            let c = args.api.client()?.pause_queue(&args.name).await?;
            println!("{}", describe(&c));
        }
        QueueCommand::Resume(args) => {
            let c = args.api.client()?.resume_queue(&args.name).await?;
            println!("{}", describe(&c));
        }
        QueueCommand::Limit(args) => {
            if args.max_running.is_none() && args.rate.is_none() && args.burst.is_none() {
                bail!(
                    "give at least one of --max-running, --rate and --burst (none removes a limit)"
                );
            }
            let limits = QueueLimits {
                max_running: args.max_running.map(|l| l.0),
                rate_per_sec: args.rate.map(|l| l.0),
                burst: args.burst.map(|l| l.0),
            };
            let c = args.api.client()?.limit_queue(&args.name, &limits).await?;
            println!("{}", describe(&c));
        }
    }
    Ok(())
}

/// One line: the queue and its controls.
fn describe(c: &QueueControls) -> String {
    let controls = controls(c.paused_at, c.max_running, c.rate_per_sec, c.burst);
    format!("{}: {}", c.queue, controls)
}

fn controls(
    paused_at: Option<chrono::DateTime<chrono::Utc>>,
    max_running: Option<i32>,
    rate_per_sec: Option<f64>,
    burst: Option<i32>,
) -> String {
    let mut parts = Vec::new();
    match paused_at {
        Some(at) => parts.push(format!("paused since {}", time(Some(at)))),
        None => parts.push("active".to_owned()),
    }
    if let Some(n) = max_running {
        parts.push(format!("max {n} running"));
    }
    if let Some(r) = rate_per_sec {
        parts.push(format!("{r}/s (burst {})", burst.unwrap_or(1)));
    }
    if max_running.is_none() && rate_per_sec.is_none() {
        parts.push("no limits".to_owned());
    }
    parts.join(", ")
}

fn table(queues: &[QueueCounts]) -> String {
    let mut out = format!(
        "{:<24} {:>8} {:>8} {:>8}  CONTROLS\n",
        "QUEUE", "WAITING", "RUNNING", "RETRY"
    );
    for q in queues {
        let n = |state: TaskState| q.counts.get(state.as_str()).copied().unwrap_or(0);
        out.push_str(&format!(
            "{:<24} {:>8} {:>8} {:>8}  {}\n",
            q.queue,
            n(TaskState::Waiting),
            n(TaskState::Running),
            n(TaskState::Retry),
            controls(q.paused_at, q.max_running, q.rate_per_sec, q.burst)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_numbers_and_none_and_refuse_the_rest() {
        assert_eq!(parse_count("3", "--max-running"), Ok(Limit(Some(3))));
        assert_eq!(parse_count("none", "--max-running"), Ok(Limit(None)));
        for bad in ["0", "-1", "x", "1.5", "1000001"] {
            assert!(parse_count(bad, "--max-running").is_err(), "{bad}");
        }
        assert_eq!(parse_rate("0.5"), Ok(Limit(Some(0.5))));
        for bad in ["0", "-2", "nan", "inf", "fast"] {
            assert!(parse_rate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn controls_read_as_a_line() {
        let c = QueueControls {
            queue: "mail".into(),
            paused_at: None,
            max_running: Some(3),
            rate_per_sec: Some(10.0),
            burst: Some(10),
        };
        assert_eq!(describe(&c), "mail: active, max 3 running, 10/s (burst 10)");
    }
}
