//! `sked queue …` (list, pause, resume, limit, retention) and `sked retention …` (show, set):
//! the queue controls and the cluster's retention, which talk to the REST API. Changing them
//! needs an admin token. Flags are validated here, before any request.

use anyhow::bail;
use sked_types::{
    MAX_RETENTION_SECS, MIN_RETENTION_SECS, QueueControls, QueueCounts, QueueLimits, Retention,
    RetentionChange, TaskState,
};

use super::args::ApiArgs;
use super::format::time;
use super::when::parse_duration;

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
    /// Set or remove how long a queue's finished tasks are kept: `sked queue retention NAME
    /// [--keep 7d] [--keep-failed 30d]` (`default` goes back to the cluster's retention; a
    /// flag left out keeps the queue's setting).
    Retention(QueueRetentionArgs),
    /// Set or remove who is told when the queue's tasks without a notify of their own
    /// succeed, fail or are retried: `sked queue notify NAME --on-failure ops` (`--clear`
    /// removes it; docs/operations.md, "Alerts").
    Notify(QueueNotifyArgs),
}

#[derive(Debug, clap::Args)]
pub struct QueueNotifyArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The queue.
    name: String,
    /// An alert target told when a task fails for good; repeat for more.
    #[arg(long = "on-failure", value_name = "TARGET")]
    on_failure: Vec<String>,
    /// An alert target told when a task succeeds; repeat for more.
    #[arg(long = "on-success", value_name = "TARGET")]
    on_success: Vec<String>,
    /// An alert target told when a task's attempt fails and it will be retried.
    #[arg(long = "on-retry", value_name = "TARGET")]
    on_retry: Vec<String>,
    /// Remove the queue's notify.
    #[arg(long, conflicts_with_all = ["on_failure", "on_success", "on_retry"])]
    clear: bool,
}

#[derive(Debug, clap::Args)]
pub struct QueueRetentionArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The queue.
    name: String,
    /// How long its finished tasks are kept after they finish (an hour to 36500 days: 12h,
    /// 7d, 2w), or `default` for the cluster's retention.
    #[arg(long, value_name = "DURATION|default", allow_hyphen_values = true,
          value_parser = |s: &str| parse_override(s, "--keep"))]
    keep: Option<Limit<f64>>,
    /// How long its failed tasks are kept (at least as long as --keep), or `default`.
    #[arg(long, value_name = "DURATION|default", allow_hyphen_values = true,
          value_parser = |s: &str| parse_override(s, "--keep-failed"))]
    keep_failed: Option<Limit<f64>>,
}

/// `sked retention …`: how long finished tasks are kept where their queue sets nothing.
#[derive(Debug, clap::Subcommand)]
pub enum RetentionCommand {
    /// Show the cluster's retention.
    Show(ListArgs),
    /// Change the cluster's retention: `sked retention set [--keep 7d] [--keep-failed 30d]
    /// [--keep-keys 1d] [--off|--on]` (a flag left out keeps the setting).
    Set(RetentionSetArgs),
}

#[derive(Debug, clap::Args)]
pub struct RetentionSetArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// How long finished tasks are kept after they finish (an hour to 36500 days: 12h, 7d).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true,
          value_parser = |s: &str| parse_retention(s, "--keep"))]
    keep: Option<f64>,
    /// How long failed tasks are kept (at least as long as --keep).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true,
          value_parser = |s: &str| parse_retention(s, "--keep-failed"))]
    keep_failed: Option<f64>,
    /// How long an idempotency key outlives the task it names (an hour to 36500 days).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true,
          value_parser = |s: &str| parse_retention(s, "--keep-keys"))]
    keep_keys: Option<f64>,
    /// Turn retention off: no finished task and no artifact is deleted, whatever the queues
    /// set.
    #[arg(long, conflicts_with = "on")]
    off: bool,
    /// Turn retention on again.
    #[arg(long)]
    on: bool,
}

/// A retention of an hour to 36500 days, as a duration (`7d`, `12h`, seconds).
fn parse_retention(s: &str, flag: &str) -> Result<f64, String> {
    let secs = parse_duration(s, flag, 0.0)?;
    if (MIN_RETENTION_SECS..=MAX_RETENTION_SECS).contains(&secs) {
        Ok(secs)
    } else {
        Err(format!(
            "{flag} must be between an hour and 36500 days (like 12h, 7d or 2w), got {s:?}"
        ))
    }
}

/// A queue's retention, or `default` for the cluster's.
fn parse_override(s: &str, flag: &str) -> Result<Limit<f64>, String> {
    if s.trim() == "default" {
        return Ok(Limit(None));
    }
    parse_retention(s, flag).map(|secs| Limit(Some(secs)))
}

/// A retention in seconds as people say it: whole days, else hours, else seconds.
fn kept(secs: f64) -> String {
    if secs >= 86_400.0 && secs % 86_400.0 == 0.0 {
        format!("{}d", secs / 86_400.0)
    } else if secs % 3_600.0 == 0.0 {
        format!("{}h", secs / 3_600.0)
    } else {
        format!("{secs}s")
    }
}

/// One line: the cluster's retention.
fn describe_retention(r: &Retention) -> String {
    if r.enabled {
        format!(
            "retention on: finished tasks kept {}, failed ones {}; artifacts nothing refers to kept {}; \
             idempotency keys kept {} after their task",
            kept(r.retention_secs),
            kept(r.keep_failed_secs.max(r.retention_secs)),
            kept(r.artifact_grace_secs),
            kept(r.keep_keys_secs)
        )
    } else {
        format!(
            "retention off: nothing is deleted (when on: finished tasks kept {}, failed ones {})",
            kept(r.retention_secs),
            kept(r.keep_failed_secs.max(r.retention_secs))
        )
    }
}

pub async fn retention(cmd: RetentionCommand) -> anyhow::Result<()> {
    match cmd {
        RetentionCommand::Show(args) => {
            let r = args.api.client()?.retention().await?;
            outln!("{}", describe_retention(&r));
        }
        RetentionCommand::Set(args) => {
            let enabled = match (args.on, args.off) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            };
            if enabled.is_none()
                && args.keep.is_none()
                && args.keep_failed.is_none()
                && args.keep_keys.is_none()
            {
                bail!(
                    "give at least one of --keep, --keep-failed, --keep-keys, --off \
                     and --on"
                );
            }
            let change = RetentionChange {
                enabled,
                retention_secs: args.keep,
                keep_failed_secs: args.keep_failed,
                keep_keys_secs: args.keep_keys,
            };
            let r = args.api.client()?.set_retention(&change).await?;
            outln!("{}", describe_retention(&r));
        }
    }
    Ok(())
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
            out!("{}", table(&queues));
        }
        QueueCommand::Pause(args) => {
            let c = args.api.client()?.pause_queue(&args.name).await?;
            outln!("{}", describe(&c));
        }
        QueueCommand::Resume(args) => {
            let c = args.api.client()?.resume_queue(&args.name).await?;
            outln!("{}", describe(&c));
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
                ..QueueLimits::default()
            };
            let c = args.api.client()?.limit_queue(&args.name, &limits).await?;
            outln!("{}", describe(&c));
        }
        QueueCommand::Notify(args) => {
            let notify = super::args::notify_of(&args.on_failure, &args.on_success, &args.on_retry);
            if notify.is_none() && !args.clear {
                bail!("give at least one of --on-failure, --on-success and --on-retry, or --clear");
            }
            let body = sked_types::QueueNotify {
                notify: notify.filter(|_| !args.clear),
            };
            let set = args
                .api
                .client()?
                .set_queue_notify(&args.name, &body)
                .await?;
            match set.notify {
                Some(n) => outln!("{}: notify {n}", args.name),
                None => outln!("{}: no notify", args.name),
            }
        }
        QueueCommand::Retention(args) => {
            if args.keep.is_none() && args.keep_failed.is_none() {
                bail!("give at least one of --keep and --keep-failed (default: the cluster's)");
            }
            let limits = QueueLimits {
                retention_secs: args.keep.map(|l| l.0),
                keep_failed_secs: args.keep_failed.map(|l| l.0),
                ..QueueLimits::default()
            };
            let c = args.api.client()?.limit_queue(&args.name, &limits).await?;
            outln!("{}", describe(&c));
        }
    }
    Ok(())
}

/// One line: the queue and its controls.
fn describe(c: &QueueControls) -> String {
    let controls = controls(c.paused_at, c.max_running, c.rate_per_sec, c.burst);
    if c.retention_secs.is_none() && c.keep_failed_secs.is_none() {
        return format!("{}: {}", c.queue, controls);
    }
    format!(
        "{}: {}, {}",
        c.queue,
        controls,
        retained(c.retention_secs, c.keep_failed_secs)
    )
}

/// A queue's retention: its own, or the cluster's.
fn retained(retention_secs: Option<f64>, keep_failed_secs: Option<f64>) -> String {
    match (retention_secs, keep_failed_secs) {
        (None, None) => "default retention".to_owned(),
        (keep, failed) => format!(
            "keeps finished tasks {}, failed ones {}",
            keep.map_or("as the default".to_owned(), kept),
            failed.map_or("as the default".to_owned(), kept)
        ),
    }
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
        "{:<24} {:>8} {:>8} {:>8}  CONTROLS; RETENTION\n",
        "QUEUE", "WAITING", "RUNNING", "RETRY"
    );
    for q in queues {
        let n = |state: TaskState| q.counts.get(state.as_str()).copied().unwrap_or(0);
        out.push_str(&format!(
            "{:<24} {:>8} {:>8} {:>8}  {}; {}\n",
            q.queue,
            n(TaskState::Waiting),
            n(TaskState::Running),
            n(TaskState::Retry),
            controls(q.paused_at, q.max_running, q.rate_per_sec, q.burst),
            retained(q.retention_secs, q.keep_failed_secs)
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
            retention_secs: None,
            keep_failed_secs: Some(30.0 * 86_400.0),
        };
        assert_eq!(
            describe(&c),
            "mail: active, max 3 running, 10/s (burst 10), keeps finished tasks as the default, failed ones 30d"
        );
    }

    #[test]
    fn retentions_are_durations_of_an_hour_to_36500_days_or_default() {
        assert_eq!(parse_override("7d", "--keep"), Ok(Limit(Some(604_800.0))));
        assert_eq!(parse_override("default", "--keep"), Ok(Limit(None)));
        for bad in ["0", "-1d", "59m", "36501d", "forever", "nan"] {
            assert!(parse_override(bad, "--keep").is_err(), "{bad}");
        }
        assert_eq!(kept(604_800.0), "7d");
        assert_eq!(kept(7_200.0), "2h");
    }
}
