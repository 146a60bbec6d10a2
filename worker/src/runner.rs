//! Runs a command of an attempt (a task's command, or one run of a service's process) as a
//! child process in a fresh working directory that is removed afterwards, under the task's
//! limits, as its user, with a clean environment, optionally through the sandbox wrapper
//! (see [`crate::isolation`]), and reads the output it names. Also what every attempt needs:
//! the worker's [`Context`] and the [`Stopper`] that stops it.
//!
//! [`crate::executor`] (tasks) and [`crate::service`] (copies of services) both run commands
//! here; neither imports the other's runner.
//!
//! Outputs (see `docs/workflows.md`): a command names its JSON output by writing it to the
//! file `$SKED_OUTPUT`, or else by printing it as its last line on stdout. A task with
//! parents finds their outputs, `{"<parent name>": <output>, ...}`, in the file
//! `$SKED_PARENT_OUTPUTS`, and on stdin when it has no input of its own.

use std::sync::OnceLock;
use std::time::Duration;

use sked_db::worker::{Claimed, Finished};
use sked_types::TaskKind;
use tokio_util::sync::CancellationToken;

use crate::artifact::{ArtifactError, Artifacts};
use crate::confined::{self, Refused};
use crate::isolation::Runtime;
use crate::logs::Logs;
use crate::process::{self, Ended, Spec};

/// Why a running attempt is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// A user cancelled the task.
    Cancel,
    /// The worker shuts down and hands the task back.
    Shutdown,
    /// The worker no longer holds the lease (another worker may run the task now).
    LeaseLost,
    /// The task is preemptible and the worker makes room for this copy of a service.
    Preempted(uuid::Uuid),
}

/// The handle to stop one running attempt; the first reason given wins.
#[derive(Debug, Default)]
pub struct Stopper {
    token: CancellationToken,
    reason: OnceLock<StopReason>,
}

impl Stopper {
    pub fn stop(&self, reason: StopReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    pub fn reason(&self) -> Option<StopReason> {
        self.reason.get().copied()
    }

    /// A stopper for one run inside this attempt (a service's process): stopped with this
    /// one, or on its own.
    pub(crate) fn child(&self) -> Stopper {
        Stopper {
            token: self.token.child_token(),
            reason: OnceLock::new(),
        }
    }

    /// Cancelled when the attempt is stopped.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Waits until the attempt is stopped.
    pub(crate) async fn stopped(&self) {
        self.token.cancelled().await
    }
}

/// What every attempt needs from the worker.
pub struct Context {
    pub pool: sqlx::PgPool,
    pub logs: Logs,
    pub artifacts: Artifacts,
    /// Limits, users, task directories, environment and sandbox, set up at start.
    pub runtime: Runtime,
    pub kill_grace: Duration,
    pub tail_bytes: usize,
    /// The API tasks may spawn through (`--api-url`), and the key of their tokens.
    pub spawn: Option<SpawnApi>,
}

/// What a task's process is told to reach the API with (`SKED_URL`, `SKED_TOKEN`).
pub struct SpawnApi {
    pub url: String,
    /// The cluster's key of task tokens, loaded at start: each attempt's token is minted in
    /// memory ([`sked_db::task_token`]).
    pub key: sked_db::task_token::TokenKey,
}

/// The error of an attempt stopped by its memory or output limit.
pub(crate) fn limit_error(ended: &Ended) -> Option<String> {
    match ended {
        Ended::OverMemory {
            limit_bytes,
            resident_bytes,
        } => {
            let mut error = format!(
                "killed: exceeded its memory limit of {} MB",
                limit_bytes >> 20
            );
            if let Some(resident) = resident_bytes.filter(|r| *r > 0) {
                error.push_str(&format!(
                    " (resident {} MB at the last sample)",
                    resident.div_ceil(1 << 20)
                ));
            }
            Some(error)
        }
        Ended::OverOutput { limit_bytes } => Some(format!(
            "stopped: its stdout and stderr wrote more than its output limit of {limit_bytes} \
             bytes (the logs keep the first {limit_bytes})"
        )),
        _ => None,
    }
}

pub(crate) async fn run_command(
    ctx: &Context,
    task: &Claimed,
    timeout: Option<Duration>,
    stopper: &Stopper,
    finished: &mut Finished,
) -> Result<Ended, String> {
    let runtime = &ctx.runtime;
    let user = runtime.settings.users.for_task(task.run_as.as_deref())?;

    // Removed when dropped: on every way out of this function.
    let dir = runtime
        .dirs
        .create(task.id, task.attempt, user.as_ref())
        .map_err(|e| format!("creating the working directory: {e}"))?;
    let mut argv: Vec<String> = match (&task.command, &task.artifact_url, &task.artifact_sha256) {
        (Some(command), _, _) => command.clone(),
        (None, Some(url), Some(sha)) => {
            // The task runs its own copy, in its directory and owned by its user.
            let owner = user.as_ref().map(|u| (u.uid, u.gid));
            match ctx
                .artifacts
                .install(url, sha, dir.path(), owner, &stopper.token)
                .await
            {
                Ok(path) => vec![path.to_string_lossy().into_owned()],
                Err(ArtifactError::Stopped) => return Ok(Ended::Stopped),
                Err(e) => return Err(e.to_string()),
            }
        }
        _ => return Err("the task has neither a command nor an artifact".to_owned()),
    };
    argv.extend(task.args.iter().cloned());
    let mut env = runtime.base_env(dir.path());
    env.extend(task.env_map());
    env.insert("SKED_TASK_ID".into(), task.id.to_string());
    env.insert("SKED_ATTEMPT".into(), task.attempt.to_string());
    env.insert("SKED_QUEUE".into(), task.queue.clone());
    // After the task's own env: a task cannot name another API or token.
    if let Some(spawn) = &ctx.spawn {
        env.insert("SKED_URL".into(), spawn.url.clone());
        env.insert("SKED_TOKEN".into(), spawn.key.mint(task.id, task.attempt));
    }
    if let Some(params) = &task.params {
        env.insert("SKED_PARAMS".into(), params.to_string());
    }
    if let (Some(index), Some(total)) = (task.shard_index, task.shard_total) {
        env.insert("SKED_SHARD_INDEX".into(), index.to_string());
        env.insert("SKED_SHARD_TOTAL".into(), total.to_string());
        if task.map_instance {
            let item = task.input.as_ref().unwrap_or(&serde_json::Value::Null);
            env.insert("SKED_MAP_ITEM".into(), item.to_string());
            env.insert("SKED_MAP_INDEX".into(), index.to_string());
        }
    }
    env.insert(
        "SKED_OUTPUT".into(),
        dir.path().join(OUTPUT_FILE).to_string_lossy().into_owned(),
    );
    if let Some(outputs) = &task.parent_outputs {
        let bytes = serde_json::to_vec(outputs).unwrap_or_default();
        let path = dir
            .write(PARENT_OUTPUTS_FILE, &bytes, user.as_ref())
            .map_err(|e| format!("writing the parents' outputs: {e}"))?;
        env.insert(
            "SKED_PARENT_OUTPUTS".into(),
            path.to_string_lossy().into_owned(),
        );
    }
    // The task's own input, else its parents' outputs.
    let stdin = task
        .input
        .as_ref()
        .or(task.parent_outputs.as_ref())
        .map(|v| {
            let mut bytes = serde_json::to_vec(v).unwrap_or_default();
            bytes.push(b'\n');
            bytes
        });
    if let Some(sandbox) = &runtime.settings.sandbox {
        argv = sandbox.wrap(dir.path(), argv);
    }
    let limits = runtime.limits_of(task.memory_mb, task.cpu_millis);
    let applied = runtime
        .limiter
        .prepare(&format!("{}-{}", task.id, task.attempt), limits)
        .map_err(|e| {
            format!(
                "setting up the task's limits ({}): {e}",
                runtime.limiter.mode()
            )
        })?;
    // An attempt stopped while it was being prepared (its lease lost while an artifact was
    // fetched, say) never starts its process.
    if stopper.token.is_cancelled() {
        applied.finish().await;
        return Ok(Ended::Stopped);
    }
    let sink = ctx.logs.sink(task.id, task.attempt);
    let mut tries = 0;
    let started = loop {
        let spec = Spec {
            argv: &argv,
            env: &env,
            dir: dir.path(),
            stdin: stdin.clone(),
            timeout,
            kill_grace: ctx.kill_grace,
            tail_bytes: ctx.tail_bytes,
            user: user.as_ref().map(|u| (u.uid, u.gid)),
            limits: applied.child(),
            memory_watch: applied.watchdog(),
            max_output: runtime
                .max_output_of(task.max_output_bytes, task.kind == TaskKind::Service),
            reaper: &runtime.reaper,
        };
        match process::run(spec, sink.clone(), stopper.token.clone()).await {
            Ok(report) => break Ok(report),
            // A freshly written executable can be briefly busy while another thread forks.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 5 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20 * tries)).await;
            }
            Err(e) => break Err(format!("cannot start {:?}: {e}", argv[0])),
        }
    };
    // Removes the task's cgroup, killing whatever of it still runs, and says whether the
    // kernel killed it for memory.
    let oom_killed = applied.finish().await;
    let report = started?;
    // The logs are written before the result, so a finished task's log is complete; when
    // the database is slow or away the result does not wait for them past a bound.
    if tokio::time::timeout(Duration::from_secs(2), sink.flush())
        .await
        .is_err()
    {
        tracing::warn!("the task's last output is not written yet; writing its result anyway");
    }
    let mut ended = report.ended;
    if oom_killed
        && let Ended::Exited(status) = &ended
        && !status.success()
    {
        ended = Ended::OverMemory {
            limit_bytes: u64::from(limits.memory_mb.unwrap_or_default()) << 20,
            resident_bytes: None,
        };
    }
    finished.stdout_tail = Some(report.stdout_tail);
    finished.stderr_tail = Some(report.stderr_tail);
    if let Ended::Exited(status) = &ended
        && status.success()
    {
        let stdout = finished.stdout_tail.as_deref().unwrap_or_default();
        finished.output = read_output(dir.path(), stdout)?;
        if finished.output.is_none()
            && let Some(hint) = output_hint(stdout, ctx.tail_bytes)
        {
            // Said where the task's owner looks: its log and the tail of its stderr.
            sink.send(crate::logs::Stream::Stderr, hint.clone()).await;
            let _ = tokio::time::timeout(Duration::from_secs(2), sink.flush()).await;
            finished
                .stderr_tail
                .get_or_insert_with(String::new)
                .push_str(&hint);
        }
        if let Some(output) = &task.output_path {
            finished.output_sha256 = Some(upload_output(ctx, dir.path(), output).await?);
        }
    }
    Ok(ended)
}

/// The file in the task's working directory that `$SKED_OUTPUT` names.
const OUTPUT_FILE: &str = "sked_output.json";
/// The file in the task's working directory that `$SKED_PARENT_OUTPUTS` names.
const PARENT_OUTPUTS_FILE: &str = "sked_parent_outputs.json";
/// The largest output a task may leave, as JSON text.
pub const MAX_OUTPUT_BYTES: u64 = 64 * 1024;

/// A successful attempt's output: the JSON document in the `$SKED_OUTPUT` file when the task
/// wrote one, else the last line of stdout when it is a JSON document, else none. The file is
/// read confined to the task's directory ([`crate::confined`]): a symlink, FIFO, device or
/// another user's file there, a file past [`MAX_OUTPUT_BYTES`] or one that is not JSON fails
/// the attempt.
fn read_output(
    dir: &std::path::Path,
    stdout_tail: &str,
) -> Result<Option<serde_json::Value>, String> {
    // At most 64 KiB of a regular file opened without blocking: read in place, as a thread
    // of the blocking pool per attempt would cost every later fork of the worker more.
    match confined::read_beneath(dir, std::path::Path::new(OUTPUT_FILE), MAX_OUTPUT_BYTES) {
        Ok(bytes) => {
            let value = serde_json::from_slice(&bytes)
                .map_err(|e| format!("the task's output ($SKED_OUTPUT) is not JSON: {e}"))?;
            return Ok(Some(value));
        }
        Err(Refused::Missing) => {}
        Err(refused) => return Err(format!("the task's output ($SKED_OUTPUT) {refused}")),
    }
    Ok(serde_json::from_str(last_line(stdout_tail)).ok())
}

/// The last line of a stdout tail, trimmed.
fn last_line(stdout_tail: &str) -> &str {
    stdout_tail
        .trim_end()
        .rsplit('\n')
        .next()
        .unwrap_or("")
        .trim()
}

/// A line for the log of a successful attempt that left no output although the last line
/// of its stdout looks like a JSON object or array (it begins or ends like one): a document
/// with an error, or one longer than the `tail_bytes` kept of stdout, whose start was cut.
fn output_hint(stdout_tail: &str, tail_bytes: usize) -> Option<String> {
    let last = last_line(stdout_tail);
    let looks = last.starts_with(['{', '[']) || last.ends_with(['}', ']']);
    let error = serde_json::from_str::<serde_json::Value>(last).err()?;
    looks.then(|| {
        format!(
            "[sked: the last line of stdout looks like JSON but is not ({error}), so the task's \
             output is null; a document longer than the {tail_bytes} bytes kept of stdout is \
             cut: write it to the file $SKED_OUTPUT instead]\n"
        )
    })
}

/// Stores the file the task promised to write as its output artifact, read confined to the
/// task's directory as its output is, up to the worker's largest artifact
/// (`--artifact-max-mb`). The schema refuses an
/// absolute or escaping `output_path`; a row written before that rule is refused here.
async fn upload_output(
    ctx: &Context,
    dir: &std::path::Path,
    output: &str,
) -> Result<String, String> {
    let bytes = read_confined(dir, output, ctx.artifacts.max_bytes())
        .await
        .map_err(|refused| {
            format!("the task succeeded but its output_path {output:?} {refused}")
        })?;
    sked_db::worker::put_artifact(&ctx.pool, &bytes)
        .await
        .map_err(|e| format!("storing the output artifact: {e}"))
}

/// [`confined::read_beneath`] on a blocking thread: a large file never holds up the runtime.
async fn read_confined(dir: &std::path::Path, path: &str, cap: u64) -> Result<Vec<u8>, Refused> {
    let (dir, path) = (dir.to_owned(), std::path::PathBuf::from(path));
    tokio::task::spawn_blocking(move || confined::read_beneath(&dir, &path, cap))
        .await
        .map_err(|e| Refused::Io(std::io::Error::other(e)))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_line_that_looks_like_json_but_is_not_is_pointed_out() {
        for broken in [
            "{\"rows\": 3",
            "[1, 2",
            "rows\": 3}",
            "{'rows': 3}",
            "log line\n{\"cut\": ",
        ] {
            let hint = output_hint(broken, 4096).unwrap_or_else(|| panic!("{broken:?}"));
            assert!(
                hint.starts_with("[sked: the last line of stdout looks like JSON"),
                "{hint}"
            );
            assert!(
                hint.contains("4096 bytes") && hint.ends_with("]\n"),
                "{hint}"
            );
        }
        for fine in [
            "",
            "done",
            "{\"rows\": 3}",
            "42",
            "copied 3 files\n[1, 2]",
            "a {b} c",
        ] {
            assert_eq!(output_hint(fine, 4096), None, "{fine:?}");
        }
    }
}
