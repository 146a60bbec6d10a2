//! Log shipping: the stdout/stderr chunks of every running task go through one channel to
//! one writer, which appends them to `sked.task_logs` in batches at least every flush
//! interval (250 ms by default), so the dashboard and `sked logs --follow` can tail them.
//!
//! One task's output never costs another its log lines: every chunk is made storable when it
//! arrives (a NUL is written as `\0`, see [`crate::sanitize`]), and a batch the database still
//! refuses for good is narrowed to the chunks that cause it ([`crate::narrow`]). Each refused
//! chunk is replaced by one line saying how many bytes of which stream were lost and why.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;
use uuid::Uuid;

use crate::narrow::{self, Retry};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

enum Msg {
    Chunk {
        task: Uuid,
        attempt: i32,
        stream: Stream,
        data: String,
    },
    /// Answered once everything sent before it is written (or given up on).
    Flush(oneshot::Sender<()>),
}

/// The sending side, bound to one attempt. Sending waits when the writer is behind, which
/// slows the reading of the pipe and, in turn, a process that writes faster than the
/// database takes its output.
#[derive(Clone)]
pub struct LogSink {
    tx: mpsc::Sender<Msg>,
    task: Uuid,
    attempt: i32,
}

impl LogSink {
    /// A sink that keeps nothing: for processes whose output is not a task's log (a
    /// service's health check).
    pub fn discard() -> LogSink {
        let (tx, _) = mpsc::channel(1);
        LogSink {
            tx,
            task: Uuid::nil(),
            attempt: 0,
        }
    }

    pub async fn send(&self, stream: Stream, data: String) {
        let _ = self
            .tx
            .send(Msg::Chunk {
                task: self.task,
                attempt: self.attempt,
                stream,
                data,
            })
            .await;
    }

    /// Waits until every chunk sent so far is in the database (or the writer gave up on it).
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Msg::Flush(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// The writer's handle: makes sinks for attempts.
#[derive(Clone)]
pub struct Logs {
    tx: mpsc::Sender<Msg>,
}

impl Logs {
    pub fn sink(&self, task: Uuid, attempt: i32) -> LogSink {
        LogSink {
            tx: self.tx.clone(),
            task,
            attempt,
        }
    }
}

/// Starts the writer; it ends when every `Logs` and `LogSink` is dropped, after writing what
/// it holds.
pub fn start(pool: PgPool, flush_every: Duration) -> (Logs, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(4096);
    let handle = tokio::spawn(write_loop(pool, rx, flush_every).in_current_span());
    (Logs { tx }, handle)
}

/// A chunk waiting to be written: consecutive chunks of one stream are merged.
type Pending = Vec<(Uuid, i32, &'static str, String)>;

const MAX_BUFFERED: usize = 512 * 1024;

async fn write_loop(pool: PgPool, mut rx: mpsc::Receiver<Msg>, flush_every: Duration) {
    let mut pending: Pending = Vec::new();
    let mut buffered = 0usize;
    let mut waiters: Vec<oneshot::Sender<()>> = Vec::new();
    let mut tick = tokio::time::interval(flush_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let flush_now = tokio::select! {
            msg = rx.recv() => match msg {
                None => { write(&pool, &mut pending).await; break; }
                Some(Msg::Chunk { task, attempt, stream, mut data }) => {
                    crate::sanitize::text_in_place(&mut data);
                    buffered += data.len();
                    match pending.last_mut() {
                        Some(last) if last.0 == task && last.1 == attempt && last.2 == stream.as_str() => last.3.push_str(&data),
                        _ => pending.push((task, attempt, stream.as_str(), data)),
                    }
                    buffered >= MAX_BUFFERED
                }
                Some(Msg::Flush(done)) => { waiters.push(done); true }
            },
            _ = tick.tick() => true,
        };
        if flush_now {
            write(&pool, &mut pending).await;
            buffered = 0;
            for w in waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }
    for w in waiters.drain(..) {
        let _ = w.send(());
    }
}

/// Transient errors are retried a few times: logs never hold a task's result back for long.
const RETRY: Retry = Retry {
    tries: Some(5),
    first_delay: Duration::from_millis(100),
    max_delay: Duration::from_secs(2),
};

/// Writes the pending chunks; a chunk the database refuses is replaced by a line saying so,
/// and chunks that still cannot be written are dropped with an error event (logs never block
/// a task's result).
async fn write(pool: &PgPool, pending: &mut Pending) {
    if pending.is_empty() {
        return;
    }
    let notices: Pending = append(pool, pending)
        .await
        .into_iter()
        .map(|((task, attempt, stream, data), e)| {
            tracing::error!(id = %task, attempt, stream, error = %e, bytes = data.len(),
                "the database refused a chunk of this task's log; writing a line saying so instead");
            let notice = format!(
                "[sked: {} bytes of {stream} could not be stored: {e}]\n",
                data.len()
            );
            (*task, *attempt, *stream, crate::sanitize::text(&notice).into_owned())
        })
        .collect();
    pending.clear();
    for ((task, attempt, stream, _), e) in append(pool, &notices).await {
        tracing::error!(id = %task, attempt, stream, error = %e,
            "the database refused the line saying a chunk of this task's log was lost");
    }
}

/// Appends chunks, narrowing a refused batch; returns the chunks refused for good, each with
/// its error, and drops with an error event those whose transient errors outlasted the
/// retries.
async fn append<'a>(
    pool: &PgPool,
    chunks: &'a Pending,
) -> Vec<(&'a (Uuid, i32, &'static str, String), sked_db::DbError)> {
    if chunks.is_empty() {
        return Vec::new();
    }
    let written = narrow::write(chunks.as_slice(), RETRY, |rows| async move {
        sked_db::worker::append_logs(pool, rows)
            .await
            .map(|()| vec![(); rows.len()])
    })
    .await;
    for (rows, e) in &written.given_up {
        tracing::error!(error = %e, chunks = rows.len(), "dropping task log chunks that could not be written");
    }
    written
        .refused
        .into_iter()
        .map(|(row, e)| (&chunks[row], e))
        .collect()
}
