//! The firing loop: fires due cron ticks (`sked.schedules_fire`). Every server and worker may
//! run one; ticks fire once however many run, because firing locks each due schedule with
//! SKIP LOCKED and advances it in the same transaction.
//!
//! The loop sleeps until the next tick is due (on the database clock), wakes early when a
//! schedule changes (`sked_schedules` notifications), and fires a short horizon ahead so that
//! occurrences are queued before their tick with `next_run_at` = the tick, and workers start
//! them on time. It polls at least every `max_sleep` in case a notification was lost.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use crate::schedule;

/// How the firing loop runs.
#[derive(Debug, Clone)]
pub struct FiringConfig {
    /// Fire ticks due within this much from now.
    pub horizon: Duration,
    /// Sleep at most this long between looks.
    pub max_sleep: Duration,
    /// Schedules handled per statement.
    pub batch: i32,
}

impl Default for FiringConfig {
    fn default() -> Self {
        FiringConfig {
            horizon: Duration::from_millis(100),
            max_sleep: Duration::from_secs(1),
            batch: 1000,
        }
    }
}

/// Runs the firing loop until `stop` is cancelled. Database errors are logged and retried
/// after a pause; they never end the loop.
pub async fn run(pool: PgPool, config: FiringConfig, stop: CancellationToken) {
    let mut listener: Option<PgListener> = None;
    let mut last_prune = tokio::time::Instant::now();
    loop {
        if stop.is_cancelled() {
            return;
        }
        if listener.is_none() {
            match PgListener::connect_with(&pool).await {
                Ok(mut l) => match l.listen("sked_schedules").await {
                    Ok(()) => listener = Some(l),
                    Err(e) => tracing::warn!(error = %e, "firing loop: cannot listen"),
                },
                Err(e) => tracing::warn!(error = %e, "firing loop: cannot connect to listen"),
            }
        }
        let sleep = match fire_due(&pool, &config).await {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(error = %e, "firing loop: firing failed; retrying");
                config.max_sleep
            }
        };
        if last_prune.elapsed() > Duration::from_secs(60) {
            last_prune = tokio::time::Instant::now();
            if let Err(e) = schedule::prune_runs(&pool).await {
                tracing::warn!(error = %e, "firing loop: pruning runs failed");
            }
        }
        if sleep.is_zero() {
            continue;
        }
        match listener.as_mut() {
            Some(l) => tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(sleep) => {}
                got = l.recv() => if let Err(e) = got {
                    tracing::warn!(error = %e, "firing loop: lost the listen connection");
                    listener = None;
                },
            },
            None => tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(sleep) => {}
            },
        }
    }
}

/// Fires what is due; returns how long to sleep before looking again.
async fn fire_due(pool: &PgPool, config: &FiringConfig) -> crate::Result<Duration> {
    let handled = schedule::fire(pool, config.horizon, config.batch).await?;
    if handled >= config.batch {
        return Ok(Duration::ZERO);
    }
    let due = schedule::next_due(pool).await?;
    Ok(match due {
        None => config.max_sleep,
        Some(secs) => {
            // Wake when the next tick enters the horizon.
            let secs = secs - config.horizon.as_secs_f64();
            if secs <= 0.0 {
                // Due but locked by another firing loop, or queued behind a running
                // occurrence: look again shortly rather than spin.
                Duration::from_millis(if handled > 0 { 0 } else { 20 })
            } else {
                Duration::try_from_secs_f64(secs)
                    .unwrap_or(config.max_sleep)
                    .min(config.max_sleep)
            }
        }
    })
}
