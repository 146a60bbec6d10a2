//! The worker's configuration, parsed once at the edge (flags with environment fallbacks)
//! into a validated [`WorkerConfig`]. Nothing below `main` reads the environment.

use std::path::PathBuf;
use std::time::Duration;

/// Command-line flags of `sked-worker` (and of the worker inside `sked dev`).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Queues to take tasks from, comma-separated.
    #[arg(
        long,
        env = "SKED_QUEUES",
        default_value = "default",
        value_delimiter = ','
    )]
    pub queues: Vec<String>,
    /// Tasks run at once.
    #[arg(long, env = "SKED_CONCURRENCY", default_value_t = 8)]
    pub concurrency: usize,
    /// Labels this worker offers, comma-separated; a task runs only on a worker that has all
    /// of the task's labels.
    #[arg(long, env = "SKED_LABELS", value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Lease of a running task in seconds: another worker takes a task over when its worker
    /// has not renewed the lease for this long. Renewed every third of it; an attempt whose
    /// lease could not be renewed is killed before it ends (`docs/runtime.md`).
    #[arg(
        long,
        env = "SKED_LEASE_SECS",
        allow_negative_numbers = true,
        default_value_t = 30.0
    )]
    pub lease_secs: f64,
    /// Poll interval in seconds (notifications usually wake the worker sooner).
    #[arg(
        long,
        env = "SKED_POLL_SECS",
        allow_negative_numbers = true,
        default_value_t = 1.0
    )]
    pub poll_secs: f64,
    /// On SIGTERM/SIGINT, how long running tasks may take to finish before they are killed
    /// and handed back, in seconds.
    #[arg(
        long,
        env = "SKED_SHUTDOWN_GRACE_SECS",
        allow_negative_numbers = true,
        default_value_t = 30.0
    )]
    pub shutdown_grace_secs: f64,
    /// After SIGTERM to a task's process group (timeout, cancel, shutdown, lost lease),
    /// seconds before SIGKILL (default: 5, or less when the lease is short: at most half the
    /// lease minus the lease margin).
    #[arg(long, env = "SKED_KILL_GRACE_SECS", allow_negative_numbers = true)]
    pub kill_grace_secs: Option<f64>,
    /// Worker name shown in the registry (default: host:pid).
    #[arg(long, env = "SKED_WORKER_NAME")]
    pub name: Option<String>,
    /// Directory for task working directories and the artifact cache, private to the
    /// worker's user (default: `sked-worker-<uid>` in the system temp directory; `sked dev`:
    /// `.sked/work` in the current directory). Refused when it is a symbolic link, belongs to
    /// another user or others may write in it.
    #[arg(long, env = "SKED_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    /// Also fire due cron ticks (any number of workers and servers may; each tick fires once).
    #[arg(long, env = "SKED_FIRE_SCHEDULES", default_value_t = true, action = clap::ArgAction::Set)]
    pub fire_schedules: bool,
    /// Limits and isolation of tasks (`docs/runtime.md`).
    #[command(flatten)]
    pub isolation: crate::isolation::IsolationArgs,
    /// Where artifacts may come from and how much of them is kept.
    #[command(flatten)]
    pub artifacts: crate::artifact::ArtifactArgs,
    /// CPU this worker offers to tasks' requests, in millicores (1000 = one core); default:
    /// detected (the processors it may use, or its cgroup's CPU quota when lower).
    #[arg(long, env = "SKED_CPU_MILLIS", allow_hyphen_values = true)]
    pub cpu_millis: Option<String>,
    /// Memory this worker offers to tasks' requests, in MB; default: detected (MemTotal, or
    /// its cgroup's memory limit when lower).
    #[arg(long, env = "SKED_MEMORY_MB", allow_hyphen_values = true)]
    pub memory_mb: Option<String>,
    /// URL of the sked API that tasks reach to spawn work into their workflow (`sked spawn`):
    /// each task's process gets it as `SKED_URL` and its attempt's task token as
    /// `SKED_TOKEN`. Unset: tasks get neither.
    #[arg(long, env = "SKED_API_URL", value_name = "URL")]
    pub api_url: Option<String>,
}

/// A validated worker configuration.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub queues: Vec<String>,
    pub concurrency: usize,
    pub labels: Vec<String>,
    pub lease: Duration,
    pub poll_interval: Duration,
    pub shutdown_grace: Duration,
    pub kill_grace: Duration,
    pub name: Option<String>,
    pub work_dir: PathBuf,
    /// Flush interval of log chunks while tasks run.
    pub log_flush: Duration,
    /// Bytes of stdout/stderr kept as the attempt's tail.
    pub tail_bytes: usize,
    /// Fire cron ticks and trim schedules' runs in the worker's upkeep (`sked_db::upkeep`).
    pub fire_schedules: bool,
    /// Limits, users, environment and sandbox of tasks.
    pub isolation: crate::isolation::Isolation,
    /// Allowed directories, cache size and download limits of artifacts.
    pub artifacts: crate::artifact::ArtifactSettings,
    /// The CPU and memory offered to tasks' requests (`docs/runtime.md`).
    pub capacity: crate::capacity::Capacity,
    /// The API that tasks' processes are told of (`SKED_URL`, with their attempt's token in
    /// `SKED_TOKEN`), without a trailing `/`; none: they are told of none.
    pub api_url: Option<String>,
}

fn seconds(value: f64, flag: &str, min: f64) -> Result<Duration, String> {
    if !value.is_finite() || value < min {
        return Err(format!(
            "--{flag} must be a number of seconds of at least {min}, got {value}"
        ));
    }
    Ok(Duration::from_secs_f64(value))
}

impl WorkerArgs {
    pub fn into_config(self) -> Result<WorkerConfig, String> {
        let queues: Vec<String> = self
            .queues
            .into_iter()
            .map(|q| q.trim().to_owned())
            .filter(|q| !q.is_empty())
            .collect();
        if queues.is_empty() {
            return Err("--queues must name at least one queue".into());
        }
        if self.concurrency == 0 || self.concurrency > 10_000 {
            return Err(format!(
                "--concurrency must be between 1 and 10000, got {}",
                self.concurrency
            ));
        }
        let lease = seconds(self.lease_secs, "lease-secs", 1.0)?;
        let kill_grace = match self.kill_grace_secs {
            Some(secs) => seconds(secs, "kill-grace-secs", 0.0)?,
            None => DEFAULT_KILL_GRACE.min((lease / 2).saturating_sub(lease_margin(lease))),
        };
        let capacity = capacity(self.cpu_millis.as_deref(), self.memory_mb.as_deref())?;
        WorkerConfig {
            queues,
            concurrency: self.concurrency,
            labels: self
                .labels
                .into_iter()
                .map(|l| l.trim().to_owned())
                .filter(|l| !l.is_empty())
                .collect(),
            lease,
            poll_interval: seconds(self.poll_secs, "poll-secs", 0.01)?,
            shutdown_grace: seconds(self.shutdown_grace_secs, "shutdown-grace-secs", 0.0)?,
            kill_grace,
            name: self.name,
            work_dir: self.work_dir.unwrap_or_else(default_work_dir),
            log_flush: Duration::from_millis(250),
            tail_bytes: 4096,
            fire_schedules: self.fire_schedules,
            isolation: self.isolation.into_config()?,
            artifacts: self.artifacts.into_settings()?,
            capacity,
            api_url: self.api_url.map(|url| api_url(&url)).transpose()?,
        }
        .checked()
    }
}

/// Reads `--api-url`: an http(s) URL, kept without its trailing `/`.
fn api_url(url: &str) -> Result<String, String> {
    let url = url.trim().trim_end_matches('/');
    let host = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    match host {
        Some(host) if !host.is_empty() && !url.chars().any(char::is_whitespace) => {
            Ok(url.to_owned())
        }
        _ => Err(format!(
            "--api-url must be an http:// or https:// URL of the sked API, got {url:?}"
        )),
    }
}

/// The work directory of a worker not given one: `sked-worker-<uid>` in the system temp
/// directory, one per user of the host, so that users never share (or plant) each other's.
pub fn default_work_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    std::env::temp_dir().join(format!("sked-worker-{uid}"))
}

/// The capacity given by the flags, each dimension detected when not given.
fn capacity(
    cpu_millis: Option<&str>,
    memory_mb: Option<&str>,
) -> Result<crate::capacity::Capacity, String> {
    use crate::capacity::{detect, parse_amount};
    let cpu_millis = cpu_millis
        .map(|v| parse_amount(v, "cpu-millis", "millicores"))
        .transpose()?;
    let memory_mb = memory_mb
        .map(|v| parse_amount(v, "memory-mb", "MB"))
        .transpose()?;
    let detected = if cpu_millis.is_none() || memory_mb.is_none() {
        detect()
    } else {
        crate::capacity::Capacity::default()
    };
    Ok(crate::capacity::Capacity {
        cpu_millis: cpu_millis.or(detected.cpu_millis),
        memory_mb: memory_mb.or(detected.memory_mb),
    })
}

/// The kill grace period when none is given and the lease leaves room for it.
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);

/// The time left between the SIGKILL of an attempt whose lease could not be renewed and the
/// end of that lease, for the process group to be gone: a tenth of the lease, at most 1 s.
pub fn lease_margin(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_secs(1))
}

impl WorkerConfig {
    /// How long before the end of its lease (as last renewed) an attempt is stopped when its
    /// lease could not be renewed: the kill grace plus the lease margin, so that its process
    /// group is gone before the lease ends and another worker may take the task over.
    pub fn stop_before_lease_end(&self) -> Duration {
        self.kill_grace + lease_margin(self.lease)
    }

    /// The configuration, or why it cannot hold its leases: an attempt is stopped the kill
    /// grace and the margin before its lease ends, and that must leave at least half the
    /// lease, in which a renewal (every third of the lease) has had its chance.
    pub fn checked(self) -> Result<WorkerConfig, String> {
        let stop_before = self.stop_before_lease_end();
        if stop_before > self.lease / 2 {
            let margin = lease_margin(self.lease);
            return Err(format!(
                "the lease of {:.3} s is too short for a kill grace of {:.3} s: an attempt whose \
                 lease cannot be renewed is stopped the kill grace plus a margin of {:.3} s \
                 before its lease ends, which must leave at least half the lease; give \
                 --kill-grace-secs {:.3} or less, or a longer --lease-secs",
                self.lease.as_secs_f64(),
                self.kill_grace.as_secs_f64(),
                margin.as_secs_f64(),
                (self.lease / 2).saturating_sub(margin).as_secs_f64(),
            ));
        }
        Ok(self)
    }

    /// A configuration with the defaults, for tests and embedding.
    pub fn for_queues(queues: &[&str]) -> WorkerConfig {
        WorkerArgs {
            queues: queues.iter().map(|q| q.to_string()).collect(),
            concurrency: 8,
            labels: vec![],
            lease_secs: 30.0,
            poll_secs: 1.0,
            shutdown_grace_secs: 30.0,
            kill_grace_secs: None,
            name: None,
            work_dir: None,
            fire_schedules: true,
            isolation: Default::default(),
            artifacts: Default::default(),
            cpu_millis: None,
            memory_mb: None,
            api_url: None,
        }
        .into_config()
        .expect("default worker configuration is valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_url_is_an_http_url_kept_without_its_trailing_slash() {
        assert_eq!(
            api_url("http://127.0.0.1:8080/").as_deref(),
            Ok("http://127.0.0.1:8080")
        );
        assert_eq!(
            api_url("https://sked.example/base").as_deref(),
            Ok("https://sked.example/base")
        );
        for bad in ["127.0.0.1:8080", "http://", "ftp://x", "http://a b", ""] {
            assert!(api_url(bad).is_err(), "{bad:?}");
        }
    }
}
