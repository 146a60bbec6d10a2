//! Writes finished attempts in batches: one `sked.tasks_finish` statement for every batch of
//! results that arrived while the previous one was being written. An attempt the database
//! does not accept lost its lease (its task was rescued or cancelled); that is logged and
//! its result discarded, never retried. Every written (or given-up) result frees its slot
//! and the capacity its task requested.

use std::sync::Arc;
use std::time::Duration;

use sked_db::worker::Finished;
use sqlx::PgPool;
use tokio::sync::mpsc;

/// Most results written by one statement.
const MAX_BATCH: usize = 2000;

pub fn start(
    pool: PgPool,
    slots: Arc<crate::Slots>,
) -> (mpsc::UnboundedSender<Finished>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, tokio::spawn(run(pool, rx, slots)))
}

/// Runs until every sender is dropped and everything received is written.
async fn run(pool: PgPool, mut rx: mpsc::UnboundedReceiver<Finished>, slots: Arc<crate::Slots>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        write(&pool, &batch).await;
        slots.release(batch.iter().map(|f| (f.id, f.attempt)));
        batch.clear();
    }
}

/// Writes one batch, retrying while the database is unreachable: a result is only lost if
/// the worker dies, and then the lease brings the task back.
async fn write(pool: &PgPool, batch: &[Finished]) {
    let mut delay = Duration::from_millis(100);
    loop {
        match sked_db::worker::finish(pool, batch).await {
            Ok(states) => {
                for (f, state) in batch.iter().zip(states) {
                    match state {
                        Some(state) => {
                            tracing::debug!(id = %f.id, attempt = f.attempt, outcome = f.outcome.as_str(), %state, "attempt finished")
                        }
                        None => {
                            tracing::warn!(id = %f.id, attempt = f.attempt, outcome = f.outcome.as_str(),
                            "lost the lease: the task was taken over or cancelled, this result is discarded")
                        }
                    }
                }
                return;
            }
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, results = batch.len(), "writing results failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                tracing::error!(error = %e, results = batch.len(), "results rejected by the database; the tasks will be rescued when their leases expire");
                return;
            }
        }
    }
}
