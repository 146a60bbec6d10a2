//! Writes finished attempts in batches: one `sked.tasks_finish` statement for every batch of
//! results that arrived while the previous one was being written. An attempt the database
//! does not accept lost its lease (its task was rescued or cancelled); that is logged and
//! its result discarded, never retried. Every written (or given-up) result frees its slot
//! and the capacity its task requested.
//!
//! One result never costs another its write: each is made storable first
//! ([`crate::sanitize`]), and a batch the database still refuses for good is narrowed to the
//! results that cause it ([`crate::narrow`]). Such an attempt is written again without its
//! output and tails, as failed (an attempt that did not succeed keeps its outcome), with an
//! error saying its result could not be stored and why.

use std::sync::Arc;
use std::time::Duration;

use sked_db::DbError;
use sked_db::worker::{Finished, Outcome};
use sked_types::TaskState;
use sqlx::PgPool;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::narrow::{self, Retry};

/// Most results written by one statement.
const MAX_BATCH: usize = 2000;

/// Results are retried while the database is unreachable: a result is only lost if the worker
/// dies, and then the lease brings the task back.
const RETRY: Retry = Retry {
    tries: None,
    first_delay: Duration::from_millis(100),
    max_delay: Duration::from_secs(5),
};

pub fn start(
    pool: PgPool,
    slots: Arc<crate::Slots>,
) -> (mpsc::UnboundedSender<Finished>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, tokio::spawn(run(pool, rx, slots).in_current_span()))
}

/// Runs until every sender is dropped and everything received is written.
async fn run(pool: PgPool, mut rx: mpsc::UnboundedReceiver<Finished>, slots: Arc<crate::Slots>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // In the order of the task ids, the order in which the heartbeat's renewal locks the
        // same rows: two statements of this worker that lock rows in opposite orders wait
        // for each other until PostgreSQL's deadlock check (a second) aborts one of them.
        batch.sort_unstable_by_key(|f| (f.id, f.attempt));
        write(&pool, &mut batch).await;
        slots.release(batch.iter().map(|f| (f.id, f.attempt)));
        batch.clear();
    }
}

/// Writes one batch of results, made storable first; a result the database refuses is
/// replaced by its attempt's failure (see the module's documentation).
async fn write(pool: &PgPool, batch: &mut [Finished]) {
    for f in batch.iter_mut() {
        crate::sanitize::finished(f);
    }
    let written = narrow::write(&*batch, RETRY, |rows| sked_db::worker::finish(pool, rows)).await;
    report(batch, &written.answers);
    if written.refused.is_empty() {
        return;
    }
    let failures: Vec<Finished> = written
        .refused
        .iter()
        .map(|(row, e)| unstorable(&batch[*row], e))
        .collect();
    for f in &failures {
        tracing::error!(id = %f.id, attempt = f.attempt, error = f.error.as_deref().unwrap_or_default(),
            "the database refused this attempt's result; writing its failure instead");
    }
    let written = narrow::write(failures.as_slice(), RETRY, |rows| {
        sked_db::worker::finish(pool, rows)
    })
    .await;
    report(&failures, &written.answers);
    for (row, e) in &written.refused {
        let f = &failures[*row];
        tracing::error!(id = %f.id, attempt = f.attempt, error = %e,
            "the database refused even this attempt's failure; its task will be rescued when its lease expires");
    }
}

/// Logs what became of each written result.
fn report(batch: &[Finished], answers: &[Option<Option<TaskState>>]) {
    for (f, answer) in batch.iter().zip(answers) {
        match answer {
            Some(Some(state)) => {
                tracing::debug!(id = %f.id, attempt = f.attempt, outcome = f.outcome.as_str(), %state, "attempt finished")
            }
            Some(None) => {
                tracing::warn!(id = %f.id, attempt = f.attempt, outcome = f.outcome.as_str(),
                "lost the lease: the task was taken over or cancelled, this result is discarded")
            }
            None => {}
        }
    }
}

/// The attempt's failure to write instead of a result the database refused: its exit code
/// and an error saying why, nothing the task wrote.
fn unstorable(f: &Finished, error: &DbError) -> Finished {
    let error = format!("the attempt's result could not be stored: {error}");
    Finished {
        id: f.id,
        attempt: f.attempt,
        outcome: match f.outcome {
            Outcome::Succeeded => Outcome::Failed,
            ended => ended,
        },
        exit_code: f.exit_code,
        error: Some(crate::sanitize::text(&error).into_owned()),
        stdout_tail: None,
        stderr_tail: None,
        output_sha256: None,
        output: None,
    }
}
