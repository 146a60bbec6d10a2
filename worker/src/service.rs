//! Supervises one copy of a long-running service (see `docs/services.md`) for as long as
//! this worker holds its attempt: starts its process, restarts it in place when it exits
//! (restart policy `always`, or `on_failure` for a non-zero exit) after an exponential
//! backoff with jitter, probes its health check and restarts it after too many failures in a
//! row. The copy's row stays `running` with its lease renewed by the heartbeat as for any
//! attempt; each start and exit is recorded on it (fenced by its attempt), so the crash loop
//! shows in the API. The attempt ends only when it is stopped (cancel, shutdown, lost
//! lease) or, under `on_failure`, when the process exits with code 0.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rand::Rng;
use sked_db::worker::{Claimed, Finished, Outcome};
use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::logs::LogSink;
use crate::process::{self, Ended, Spec};
use crate::runner::{self, Context, StopReason, Stopper};

/// The first restart waits this long; each one after a short run waits twice the last.
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The longest wait before a restart.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// The most bytes a health check's command may print; past it the probe is stopped and fails.
const PROBE_MAX_OUTPUT: u64 = 1 << 20;
/// A process that ran this long was healthy: the next restart waits `BACKOFF_BASE` again.
pub const STABLE_AFTER: Duration = Duration::from_secs(60);

/// The restart delays of one copy: 1 s, 2 s, 4 s … up to 5 min, each stretched by up to 20%
/// of random jitter (so that copies that crashed together do not restart together), and
/// back to 1 s after a run of at least [`STABLE_AFTER`].
#[derive(Debug, Default)]
pub struct Backoff {
    /// Restarts since the last stable run.
    short_runs: u32,
}

impl Backoff {
    /// The wait before the next start, after a run that lasted `ran_for`; `jitter` in [0, 1).
    pub fn next(&mut self, ran_for: Duration, jitter: f64) -> Duration {
        if ran_for >= STABLE_AFTER {
            self.short_runs = 0;
        }
        let doubled = BACKOFF_BASE.saturating_mul(1u32 << self.short_runs.min(20));
        self.short_runs = self.short_runs.saturating_add(1);
        doubled
            .min(BACKOFF_MAX)
            .mul_f64(1.0 + 0.2 * jitter.clamp(0.0, 1.0))
    }
}

/// A service's health check, from its JSON (checked by the schema).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    pub probe: Probe,
    pub interval: Duration,
    pub timeout: Duration,
    pub failures: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Probe {
    /// A command run in the copy's working directory; exit code 0 is healthy.
    Command(Vec<String>),
    /// A URL fetched with GET; a 2xx answer is healthy.
    Http(String),
}

impl HealthCheck {
    /// Reads `{"command": [...]}` or `{"http": "…"}` with `interval_secs` (default 10),
    /// `timeout_secs` (5) and `failures` (3). `None` for a value that is none of these.
    pub fn from_json(v: &serde_json::Value) -> Option<HealthCheck> {
        let probe = if let Some(cmd) = v.get("command").and_then(|c| c.as_array()) {
            let argv: Vec<String> = cmd
                .iter()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect();
            if argv.is_empty() || argv.len() != cmd.len() {
                return None;
            }
            Probe::Command(argv)
        } else {
            Probe::Http(v.get("http")?.as_str()?.to_owned())
        };
        let secs = |key: &str, default: f64| {
            let s = v.get(key).and_then(|s| s.as_f64()).unwrap_or(default);
            Duration::from_secs_f64(s.clamp(0.1, 3600.0))
        };
        Some(HealthCheck {
            probe,
            interval: secs("interval_secs", 10.0),
            timeout: secs("timeout_secs", 5.0),
            failures: v
                .get("failures")
                .and_then(|f| f.as_u64())
                .unwrap_or(3)
                .clamp(1, 100) as u32,
        })
    }
}

/// How one run of the copy's process ended, for the record.
struct RunEnd {
    exit_code: Option<i32>,
    signal: Option<i32>,
    error: String,
    /// The process exited with code 0 by itself.
    success: bool,
}

/// Runs the copy until it is stopped, or under `on_failure` until its process exits with
/// code 0; fills `finished` with how the attempt ended.
pub async fn supervise(ctx: &Context, task: &Claimed, stopper: &Stopper, finished: &mut Finished) {
    let spec = match sked_db::service::copy_spec(&ctx.pool, task.id).await {
        Ok(spec) => spec,
        Err(e) => {
            tracing::warn!(error = %e, "reading the copy's restart policy failed; restarting it always");
            sked_db::service::CopySpec::default()
        }
    };
    let on_failure = spec.restart_policy == "on_failure";
    let health = spec.health_check.as_ref().and_then(HealthCheck::from_json);
    let mut backoff = Backoff::default();
    loop {
        if stopper.reason().is_some() {
            return stopped(stopper, finished);
        }
        match sked_db::service::copy_started(&ctx.pool, task.id, task.attempt).await {
            Ok(true) => {}
            Ok(false) => return lease_lost(finished),
            // The database is away: the process runs all the same; the heartbeat notices a
            // lost lease and stops it.
            Err(e) => tracing::warn!(error = %e, "recording the copy's start failed"),
        }
        tracing::info!(restarts = ?backoff.short_runs, "starting the service's process");
        let started = Instant::now();
        let end = run_once(ctx, task, stopper, finished, health.as_ref()).await;
        if stopper.reason().is_some() {
            return stopped(stopper, finished);
        }
        let ran_for = started.elapsed();
        finished.exit_code = end.exit_code;
        if on_failure && end.success {
            let exit = sked_db::service::Exit {
                exit_code: end.exit_code,
                signal: None,
                error: end.error,
                restart_in_secs: None,
            };
            if let Err(e) =
                sked_db::service::copy_exited(&ctx.pool, task.id, task.attempt, &exit).await
            {
                tracing::warn!(error = %e, "recording the copy's exit failed");
            }
            finished.outcome = Outcome::Succeeded;
            finished.error = None;
            return;
        }
        let delay = backoff.next(ran_for, rand::rng().random_range(0.0..1.0));
        tracing::warn!(error = %end.error, ran_secs = ran_for.as_secs_f64(),
            restart_in_secs = delay.as_secs_f64(), "the service's process ended; restarting it");
        let exit = sked_db::service::Exit {
            exit_code: end.exit_code,
            signal: end.signal,
            error: end.error,
            restart_in_secs: Some(delay.as_secs_f64()),
        };
        match sked_db::service::copy_exited(&ctx.pool, task.id, task.attempt, &exit).await {
            Ok((true, _)) => {}
            Ok((false, _)) => return lease_lost(finished),
            Err(e) => tracing::warn!(error = %e, "recording the copy's exit failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stopper.stopped() => return stopped(stopper, finished),
        }
    }
}

/// One run of the process, with its health check probed alongside.
async fn run_once(
    ctx: &Context,
    task: &Claimed,
    stopper: &Stopper,
    finished: &mut Finished,
    health: Option<&HealthCheck>,
) -> RunEnd {
    let run = stopper.child();
    let process = runner::run_command(ctx, task, None, &run, finished);
    tokio::pin!(process);
    let mut unhealthy: Option<String> = None;
    let result = match health {
        None => process.await,
        Some(check) => {
            let dir = work_dir(ctx, task);
            tokio::select! {
                r = &mut process => r,
                why = watch(ctx, task, check, &dir) => {
                    tracing::warn!(reason = %why, "the copy is unhealthy: stopping its process");
                    unhealthy = Some(why);
                    run.stop(StopReason::Cancel);
                    process.await
                }
            }
        }
    };
    match (result, unhealthy) {
        (_, Some(why)) => RunEnd {
            exit_code: None,
            signal: None,
            error: why,
            success: false,
        },
        (Ok(Ended::Exited(status)), None) => {
            use std::os::unix::process::ExitStatusExt;
            let (code, signal) = (status.code(), status.signal());
            RunEnd {
                exit_code: code,
                signal,
                error: match (code, signal) {
                    (Some(code), _) => format!("exited with code {code}"),
                    (None, Some(sig)) => format!("killed by signal {sig}"),
                    _ => "exited abnormally".to_owned(),
                },
                success: status.success(),
            }
        }
        (Ok(Ended::TimedOut), None) => RunEnd {
            exit_code: None,
            signal: None,
            error: "timed out".to_owned(),
            success: false,
        },
        (Ok(Ended::Stopped), None) => RunEnd {
            exit_code: None,
            signal: None,
            error: "stopped".to_owned(),
            success: false,
        },
        (Ok(ended @ (Ended::OverMemory { .. } | Ended::OverOutput { .. })), None) => RunEnd {
            exit_code: None,
            signal: None,
            error: runner::limit_error(&ended).unwrap_or_default(),
            success: false,
        },
        (Err(error), None) => RunEnd {
            exit_code: None,
            signal: None,
            error,
            success: false,
        },
    }
}

/// The working directory the executor gives the copy's process.
fn work_dir(ctx: &Context, task: &Claimed) -> PathBuf {
    ctx.runtime.dirs.path_of(task.id, task.attempt)
}

/// Probes the health check every interval while the process runs; records the first pass
/// of this run; returns the reason once `failures` probes in a row failed.
async fn watch(ctx: &Context, task: &Claimed, check: &HealthCheck, dir: &Path) -> String {
    let mut failed = 0;
    let mut recorded = false;
    loop {
        tokio::time::sleep(check.interval).await;
        match probe(ctx, &check.probe, check.timeout, dir, task).await {
            Ok(()) => {
                failed = 0;
                if !recorded {
                    match sked_db::service::copy_healthy(&ctx.pool, task.id, task.attempt).await {
                        Ok(_) => recorded = true,
                        Err(e) => tracing::warn!(error = %e, "recording the copy's health failed"),
                    }
                }
            }
            Err(why) => {
                failed += 1;
                tracing::info!(failed, reason = %why, "health check failed");
                if failed >= check.failures {
                    return format!("health check failed {failed} times in a row: {why}");
                }
            }
        }
    }
}

/// One probe: `Ok` when healthy, else why not.
async fn probe(
    ctx: &Context,
    probe: &Probe,
    timeout: Duration,
    dir: &Path,
    task: &Claimed,
) -> Result<(), String> {
    match probe {
        Probe::Http(url) => {
            let client = reqwest::Client::builder()
                .timeout(timeout)
                .build()
                .map_err(|e| format!("HTTP client: {e}"))?;
            let answer = client
                .get(url)
                .send()
                .await
                .map_err(|e| format!("GET {url}: {e}"))?;
            if answer.status().is_success() {
                Ok(())
            } else {
                Err(format!("GET {url} answered {}", answer.status()))
            }
        }
        Probe::Command(argv) => {
            let runtime = &ctx.runtime;
            let user = runtime.settings.users.for_task(task.run_as.as_deref())?;
            let cwd = if dir.is_dir() { dir } else { Path::new("/") };
            let mut env = runtime.base_env(cwd);
            env.extend(task.env_map());
            env.insert("SKED_TASK_ID".into(), task.id.to_string());
            let argv = match &runtime.settings.sandbox {
                Some(sandbox) => sandbox.wrap(cwd, argv.clone()),
                None => argv.clone(),
            };
            // The copy's own limits, in a cgroup (or watchdog entry) of the probe's own.
            let applied = runtime
                .limiter
                .prepare(
                    &format!("{}-{}-health", task.id, task.attempt),
                    runtime.limits_of(task.memory_mb, task.cpu_millis),
                )
                .map_err(|e| format!("setting up the health check's limits: {e}"))?;
            // The same spawn as the task's process: its user, sandbox, limits, session, parent-death
            // signal and the tracking of every process it starts; its output is not kept.
            let spec = Spec {
                argv: &argv,
                env: &env,
                dir: cwd,
                stdin: None,
                timeout: Some(timeout),
                kill_grace: Duration::ZERO,
                tail_bytes: 0,
                user: user.as_ref().map(|u| (u.uid, u.gid)),
                limits: applied.child(),
                memory_watch: applied.watchdog(),
                max_output: Some(PROBE_MAX_OUTPUT),
                reaper: &runtime.reaper,
            };
            let ran = process::run(spec, LogSink::discard(), CancellationToken::new()).await;
            applied.finish().await;
            let name = &argv[0];
            match ran.map(|report| report.ended) {
                Ok(Ended::Exited(status)) if status.success() => Ok(()),
                Ok(Ended::Exited(status)) => Err(format!("{name:?} ended with {status}")),
                Ok(Ended::TimedOut) => Err(format!(
                    "{name:?} did not answer within {:.1} s",
                    timeout.as_secs_f64()
                )),
                Ok(ended) => Err(format!(
                    "{name:?} was stopped: {}",
                    runner::limit_error(&ended).unwrap_or_else(|| "stopped".to_owned())
                )),
                Err(e) => Err(format!("cannot start {name:?}: {e}")),
            }
        }
    }
}

/// The attempt was stopped: cancelled, handed back on shutdown, or its lease lost.
fn stopped(stopper: &Stopper, finished: &mut Finished) {
    match stopper.reason() {
        Some(StopReason::Shutdown) => {
            finished.outcome = Outcome::Interrupted;
            finished.error = Some("interrupted: the worker shut down".to_owned());
        }
        Some(StopReason::LeaseLost) => lease_lost(finished),
        _ => {
            finished.outcome = Outcome::Cancelled;
            finished.error = Some("cancelled".to_owned());
        }
    }
}

fn lease_lost(finished: &mut Finished) {
    finished.outcome = Outcome::Failed;
    finished.error = Some("stopped: the worker lost the lease".to_owned());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets_after_a_stable_run() {
        let mut b = Backoff::default();
        let short = Duration::from_millis(100);
        let waits: Vec<u64> = (0..11).map(|_| b.next(short, 0.0).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(
            b.next(STABLE_AFTER, 0.0),
            BACKOFF_BASE,
            "a stable run resets it"
        );
        assert_eq!(b.next(short, 0.0), 2 * BACKOFF_BASE);
        let jittered = Backoff::default().next(short, 0.99);
        assert!(
            jittered > BACKOFF_BASE && jittered < BACKOFF_BASE.mul_f64(1.2),
            "jitter stretches by less than 20%: {jittered:?}"
        );
    }

    #[test]
    fn health_checks_read_their_defaults() {
        let c = HealthCheck::from_json(&serde_json::json!({"command": ["true"]})).unwrap();
        assert_eq!(c.probe, Probe::Command(vec!["true".into()]));
        assert_eq!(
            (c.interval, c.timeout, c.failures),
            (Duration::from_secs(10), Duration::from_secs(5), 3)
        );
        let h = HealthCheck::from_json(&serde_json::json!(
            {"http": "http://127.0.0.1:9/h", "interval_secs": 0.5, "failures": 2}))
        .unwrap();
        assert_eq!(h.probe, Probe::Http("http://127.0.0.1:9/h".into()));
        assert_eq!((h.interval, h.failures), (Duration::from_millis(500), 2));
        assert!(HealthCheck::from_json(&serde_json::json!({"command": []})).is_none());
    }
}
