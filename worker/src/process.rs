//! Running one command as a child process in its own session and process group: the
//! environment it is given and nothing else, stdin from the task's input, stdout/stderr
//! captured (a tail kept, the whole stream sent to the log shipper) up to a cap on their
//! bytes, and stopping the whole group — grandchildren included — with SIGTERM, a grace
//! period, then SIGKILL. When the process has ended, every process it started that is still
//! alive (one that left the group with `setsid`, or was orphaned, included) is killed: the
//! [`Reaper`] tracks them from the spawn on.
//!
//! The child is started by [`crate::spawn`] (sharing the worker's memory until its exec), or
//! forked where the kernel cannot. Before exec it starts its session (so that nothing
//! descending from a task is ever in the worker's session), joins its cgroup and sets its
//! rlimits ([`ChildLimits`]), then drops to the task's user (supplementary groups cleared,
//! then gid, then uid), then asks to be killed when the worker dies: in that order, because
//! joining a cgroup and setting limits may need the worker's privileges, and a change of user
//! clears the parent-death signal.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::isolation::limits::ChildLimits;
use crate::isolation::memwatch::MemWatch;
use crate::isolation::reaper::Reaper;
use crate::logs::{LogSink, Stream};

/// What to run and how.
pub struct Spec<'a> {
    pub argv: &'a [String],
    /// The whole environment of the process.
    pub env: &'a BTreeMap<String, String>,
    pub dir: &'a Path,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    pub tail_bytes: usize,
    /// The uid and gid to switch to (supplementary groups cleared); `None`: stay.
    pub user: Option<(u32, u32)>,
    /// The cgroup to join and the rlimits to set before exec.
    pub limits: ChildLimits,
    /// The memory watchdog and the limit in bytes of the process group's resident memory.
    pub memory_watch: Option<(&'a MemWatch, u64)>,
    /// The most bytes stdout and stderr may write together; past it the group is stopped.
    pub max_output: Option<u64>,
    /// The worker's tracker of its tasks' processes.
    pub reaper: &'a Reaper,
}

/// How the process ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited (or was killed by a signal) on its own.
    Exited(ExitStatus),
    /// It ran past its timeout and was stopped.
    TimedOut,
    /// `stop` was cancelled and the process was stopped.
    Stopped,
    /// Its stdout and stderr wrote more than `limit_bytes` together; it was stopped.
    OverOutput { limit_bytes: u64 },
    /// It used more memory than `limit_bytes` and was killed: by the memory watchdog (with
    /// the largest resident memory it sampled) or, in the cgroup mode, by the kernel (the
    /// executor tells that from an `Exited` by the cgroup's events).
    OverMemory {
        limit_bytes: u64,
        resident_bytes: Option<u64>,
    },
}

#[derive(Debug)]
pub struct Report {
    pub ended: Ended,
    pub stdout_tail: String,
    pub stderr_tail: String,
}

/// Runs the process to its end. Cancelling `stop` stops the process group (SIGTERM, then
/// SIGKILL after `kill_grace`). Fails only when the process cannot be started.
pub async fn run(
    spec: Spec<'_>,
    logs: LogSink,
    stop: CancellationToken,
) -> std::io::Result<Report> {
    // SAFETY: geteuid has no preconditions.
    let uid = spec
        .user
        .map_or_else(|| unsafe { libc::geteuid() }, |(uid, _)| uid);
    let (mut child, tracked) = spec.reaper.spawn(
        uid,
        || match crate::spawn::spawn(
            spec.argv,
            spec.env,
            spec.dir,
            spec.stdin.is_some(),
            &spec.limits,
            spec.user,
        )? {
            Some(child) => Ok(Leader::Cloned(child)),
            // A kernel without CLONE_PIDFD, or a seccomp filter refusing the clone.
            None => forked(&spec).map(Leader::Forked),
        },
        Leader::id,
    )?;
    let pgid = child.id().map(|pid| pid as i32);
    let watched = spec
        .memory_watch
        .and_then(|(watch, limit)| pgid.map(|pgid| watch.watch(pgid, limit)));
    let budget = Arc::new(Budget::new(spec.max_output));

    if let (Some(mut pipe), Some(bytes)) = (child.take_stdin(), spec.stdin) {
        // A process that never reads its stdin must not block us: write in the background.
        tokio::spawn(async move {
            let _ = pipe.write_all(&bytes).await;
            let _ = pipe.shutdown().await;
        });
    }
    let out = tokio::spawn(capture(
        child.take_stdout(),
        Stream::Stdout,
        logs.clone(),
        spec.tail_bytes,
        budget.clone(),
    ));
    let err = tokio::spawn(capture(
        child.take_stderr(),
        Stream::Stderr,
        logs,
        spec.tail_bytes,
        budget.clone(),
    ));

    let timeout = async {
        match spec.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let over_memory = async {
        match &watched {
            Some(w) => w.over_limit().await,
            None => std::future::pending().await,
        }
    };
    let mut ended = tokio::select! {
        status = child.wait() => Ended::Exited(status?),
        _ = timeout => { terminate(&mut child, pgid, spec.kill_grace).await; Ended::TimedOut }
        _ = stop.cancelled() => { terminate(&mut child, pgid, spec.kill_grace).await; Ended::Stopped }
        _ = budget.over.cancelled() => {
            terminate(&mut child, pgid, spec.kill_grace).await;
            Ended::OverOutput { limit_bytes: spec.max_output.unwrap_or_default() }
        }
        // Over its memory there is no grace: the group is killed at once, as the kernel would.
        _ = over_memory => {
            if let Some(pgid) = pgid {
                signal_group(pgid, libc::SIGKILL);
            }
            let _ = child.wait().await;
            Ended::OverMemory {
                limit_bytes: spec.memory_watch.map_or(0, |(_, limit)| limit),
                resident_bytes: watched.as_ref().map(|w| w.peak_bytes()),
            }
        }
    };
    drop(watched);
    // The leader is gone; whatever it left behind in its group goes too, and every other
    // process it started, so the pipes close.
    if let Some(pgid) = pgid {
        signal_group(pgid, libc::SIGKILL);
    }
    let killed = tracked.kill_all().await;
    if killed > 0 {
        tracing::debug!(
            killed,
            "killed processes the task left outside its process group"
        );
    }
    // A process that escaped tracking may still hold the pipes: don't wait forever.
    let tail = |h: tokio::task::JoinHandle<String>| async move {
        tokio::time::timeout(Duration::from_secs(2), h)
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or_default()
    };
    let stdout_tail = tail(out).await;
    let stderr_tail = tail(err).await;
    // Output read after the leader exited counts too.
    if matches!(ended, Ended::Exited(_)) && budget.over.is_cancelled() {
        ended = Ended::OverOutput {
            limit_bytes: spec.max_output.unwrap_or_default(),
        };
    }
    Ok(Report {
        ended,
        stdout_tail,
        stderr_tail,
    })
}

/// An attempt's leader: started by `clone` sharing the worker's memory until its `execve`
/// (crate::spawn), or by `fork` where the kernel cannot.
enum Leader {
    Cloned(crate::spawn::Child),
    Forked(tokio::process::Child),
}

type Writer = Box<dyn AsyncWrite + Unpin + Send>;
type Reader = Box<dyn AsyncRead + Unpin + Send>;

impl Leader {
    fn id(&self) -> Option<u32> {
        match self {
            Leader::Cloned(c) => c.id(),
            Leader::Forked(c) => c.id(),
        }
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Leader::Cloned(c) => c.wait().await,
            Leader::Forked(c) => c.wait().await,
        }
    }

    fn take_stdin(&mut self) -> Option<Writer> {
        match self {
            Leader::Cloned(c) => c.stdin.take().map(|p| Box::new(p) as Writer),
            Leader::Forked(c) => c.stdin.take().map(|p| Box::new(p) as Writer),
        }
    }

    fn take_stdout(&mut self) -> Option<Reader> {
        match self {
            Leader::Cloned(c) => c.stdout.take().map(|p| Box::new(p) as Reader),
            Leader::Forked(c) => c.stdout.take().map(|p| Box::new(p) as Reader),
        }
    }

    fn take_stderr(&mut self) -> Option<Reader> {
        match self {
            Leader::Cloned(c) => c.stderr.take().map(|p| Box::new(p) as Reader),
            Leader::Forked(c) => c.stderr.take().map(|p| Box::new(p) as Reader),
        }
    }
}

/// Starts the leader with `fork`, the set-up made between fork and exec.
fn forked(spec: &Spec<'_>) -> std::io::Result<tokio::process::Child> {
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(spec.env)
        .current_dir(spec.dir)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let (limits, user) = (spec.limits.clone(), spec.user);
    // SAFETY: the closure only makes async-signal-safe system calls (setsid, cgroup join,
    // setrlimit, setgroups/setgid/setuid, prctl) and touches no memory of the parent but its
    // captures.
    unsafe {
        cmd.pre_exec(move || {
            // Its own session, and so its own process group (pgid = pid).
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            limits.apply_in_child()?;
            if let Some((uid, gid)) = user
                && (libc::setgroups(0, std::ptr::null()) == -1
                    || libc::setgid(gid) == -1
                    || libc::setuid(uid) == -1)
            {
                return Err(std::io::Error::last_os_error());
            }
            // If the worker dies (kill -9), its children die with it instead of running on
            // unsupervised while another worker starts the task again.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// SIGTERM to the group, then SIGKILL after the grace period unless the leader exited.
async fn terminate(child: &mut Leader, pgid: Option<i32>, grace: Duration) {
    let Some(pgid) = pgid else { return };
    signal_group(pgid, libc::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        signal_group(pgid, libc::SIGKILL);
        let _ = child.wait().await;
    }
}

fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: killpg has no memory-safety preconditions; ESRCH (no such group) is expected
    // once every member has exited and is ignored.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

/// The bytes stdout and stderr may still write together.
struct Budget {
    left: AtomicU64,
    /// Cancelled when a write went past the cap.
    over: CancellationToken,
}

impl Budget {
    fn new(cap: Option<u64>) -> Budget {
        Budget {
            left: AtomicU64::new(cap.unwrap_or(u64::MAX)),
            over: CancellationToken::new(),
        }
    }

    /// Takes `n` bytes from the budget; answers how many of them fit.
    fn take(&self, n: usize) -> usize {
        let n64 = n as u64;
        let before = self
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                Some(left.saturating_sub(n64))
            })
            .unwrap_or(0);
        if before < n64 {
            self.over.cancel();
            before as usize
        } else {
            n
        }
    }
}

/// Reads a pipe to its end, sending every chunk to the log sink up to the output budget
/// (the rest is read and dropped, so the process never blocks on a full pipe while it is
/// being stopped); returns the tail of what was kept.
async fn capture(
    pipe: Option<impl AsyncRead + Unpin>,
    stream: Stream,
    logs: LogSink,
    tail_bytes: usize,
    budget: Arc<Budget>,
) -> String {
    let Some(mut pipe) = pipe else {
        return String::new();
    };
    let mut tail: Vec<u8> = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let kept = budget.take(n);
        if kept == 0 {
            continue;
        }
        let bytes = &buf[..kept];
        tail.extend_from_slice(bytes);
        if tail.len() > tail_bytes * 2 {
            tail.drain(..tail.len() - tail_bytes);
        }
        pending.extend_from_slice(bytes);
        let text = take_utf8(&mut pending);
        if !text.is_empty() {
            logs.send(stream, text).await;
        }
    }
    if !pending.is_empty() {
        logs.send(stream, String::from_utf8_lossy(&pending).into_owned())
            .await;
    }
    if tail.len() > tail_bytes {
        tail.drain(..tail.len() - tail_bytes);
    }
    // The cut may fall inside a character: drop the partial character at the start.
    let start = tail
        .iter()
        .position(|b| (*b as i8) >= -0x40)
        .unwrap_or(tail.len());
    String::from_utf8_lossy(&tail[start..]).into_owned()
}

/// Takes the longest prefix of `pending` that is complete text, leaving an unfinished
/// multi-byte character for the next read. Invalid bytes become U+FFFD.
fn take_utf8(pending: &mut Vec<u8>) -> String {
    let keep_from = match std::str::from_utf8(pending) {
        Ok(_) => pending.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => pending.len(),
    };
    let rest = pending.split_off(keep_from);
    let text = String::from_utf8_lossy(pending).into_owned();
    *pending = rest;
    text
}

#[cfg(test)]
mod tests {
    use super::{Budget, take_utf8};

    #[test]
    fn the_output_budget_cuts_the_write_that_passes_the_cap() {
        let budget = Budget::new(Some(10));
        assert_eq!(budget.take(4), 4);
        assert_eq!(budget.take(6), 6, "exactly the cap is allowed");
        assert!(!budget.over.is_cancelled());
        assert_eq!(budget.take(1), 0);
        assert!(budget.over.is_cancelled(), "one byte past the cap is over");

        let budget = Budget::new(Some(10));
        assert_eq!(budget.take(7), 7);
        assert_eq!(budget.take(7), 3, "the part that fits is kept");
        assert!(budget.over.is_cancelled());

        let unlimited = Budget::new(None);
        assert_eq!(unlimited.take(usize::MAX / 2), usize::MAX / 2);
        assert!(!unlimited.over.is_cancelled());
    }

    #[test]
    fn split_characters_wait_for_their_remaining_bytes() {
        let euro = "€".as_bytes();
        let mut pending = vec![b'a', euro[0], euro[1]];
        assert_eq!(take_utf8(&mut pending), "a");
        pending.push(euro[2]);
        assert_eq!(take_utf8(&mut pending), "€");
        assert!(pending.is_empty());
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut pending = vec![b'x', 0xff, b'y'];
        assert_eq!(take_utf8(&mut pending), "x\u{fffd}y");
    }
}
