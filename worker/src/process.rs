//! Running one command as a child process in its own process group: clean environment,
//! stdin from the task's input, stdout/stderr captured (a tail kept, the whole stream sent to
//! the log shipper), and stopping the whole group — grandchildren included — with SIGTERM,
//! a grace period, then SIGKILL.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::logs::{LogSink, Stream};

/// The PATH a task gets when its own env does not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What to run and how.
pub struct Spec<'a> {
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub dir: &'a Path,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    pub tail_bytes: usize,
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
    let (program, args) = spec
        .argv
        .split_first()
        .ok_or_else(|| std::io::Error::other("empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .env("HOME", spec.dir)
        .envs(spec.env)
        .current_dir(spec.dir)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // If the worker dies (kill -9), its children die with it instead of running on
    // unsupervised while another worker starts the task again.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let pgid = child.id().map(|pid| pid as i32);

    if let (Some(mut pipe), Some(bytes)) = (child.stdin.take(), spec.stdin) {
        // A process that never reads its stdin must not block us: write in the background.
        tokio::spawn(async move {
            let _ = pipe.write_all(&bytes).await;
            let _ = pipe.shutdown().await;
        });
    }
    let out = tokio::spawn(capture(
        child.stdout.take(),
        Stream::Stdout,
        logs.clone(),
        spec.tail_bytes,
    ));
    let err = tokio::spawn(capture(
        child.stderr.take(),
        Stream::Stderr,
        logs,
        spec.tail_bytes,
    ));

    let timeout = async {
        match spec.timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let ended = tokio::select! {
        status = child.wait() => Ended::Exited(status?),
        _ = timeout => { terminate(&mut child, pgid, spec.kill_grace).await; Ended::TimedOut }
        _ = stop.cancelled() => { terminate(&mut child, pgid, spec.kill_grace).await; Ended::Stopped }
    };
    // The leader is gone; whatever it left behind in its group goes too, so the pipes close.
    if let Some(pgid) = pgid {
        signal_group(pgid, libc::SIGKILL);
    }
    // A process that left the group (setsid) may still hold the pipes: don't wait forever.
    let tail = |h: tokio::task::JoinHandle<String>| async move {
        tokio::time::timeout(Duration::from_secs(2), h)
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or_default()
    };
    let stdout_tail = tail(out).await;
    let stderr_tail = tail(err).await;
    Ok(Report {
        ended,
        stdout_tail,
        stderr_tail,
    })
}

/// SIGTERM to the group, then SIGKILL after the grace period unless the leader exited.
async fn terminate(child: &mut tokio::process::Child, pgid: Option<i32>, grace: Duration) {
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

/// Reads a pipe to its end, sending every chunk to the log sink; returns the tail.
async fn capture(
    pipe: Option<impl AsyncRead + Unpin>,
    stream: Stream,
    logs: LogSink,
    tail_bytes: usize,
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
        let bytes = &buf[..n];
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
    use super::take_utf8;

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
