//! The history of finishes and the rollups it reads (`sql/finishes.sql`): reading the
//! history, folding the deltas that finishing statements write into the rollups, and pruning
//! the rollups. The fold and the prune are a duty of the background upkeep
//! ([`crate::upkeep::Duty::FoldFinishes`]).

use chrono::{DateTime, Utc};
use sked_types::{FinalCounts, History, HistoryPoint, HistoryRange, Percentiles};
use sqlx::PgPool;

use crate::Result;

/// Deltas one fold (one transaction) takes at most.
pub const FOLD_BATCH: i32 = 10_000;

/// The history of `owner`'s tasks (every owner's when `None`) in `queue` (every queue when
/// `None`) over `range`, at `now` (the database clock when `None`).
pub async fn history(
    pool: &PgPool,
    owner: Option<&str>,
    queue: Option<&str>,
    range: HistoryRange,
    now: Option<DateTime<Utc>>,
) -> Result<History> {
    // The points and the queues come from one snapshot.
    let mut tx = crate::pooler::begin_snapshot(pool).await?;
    let at: DateTime<Utc> = sqlx::query_scalar("select coalesce($1, now())")
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
    type Row = (
        DateTime<Utc>,
        i64,
        i64,
        i64,
        i64,
        i64,
        Option<f64>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
    );
    // Not kept prepared: planned for its values, so absent filters fold away.
    let rows: Vec<Row> = sqlx::query_as(
        "select start, succeeded, failed, cancelled, upstream_failed, skipped,
                duration_p50, duration_p90, duration_p99,
                lateness_p50, lateness_p90, lateness_p99
           from sked.finishes_history($1, $2, $3, $4)",
    )
    .persistent(false)
    .bind(owner)
    .bind(queue)
    .bind(range.as_str())
    .bind(at)
    .fetch_all(&mut *tx)
    .await?;
    let from = rows.first().map_or(at, |r| r.0);
    let queues: Vec<String> = sqlx::query_scalar("select sked.finishes_queues($1, $2)")
        .persistent(false)
        .bind(owner)
        .bind(from)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let points = rows
        .into_iter()
        .map(
            |(
                start,
                succeeded,
                failed,
                cancelled,
                upstream_failed,
                skipped,
                d50,
                d90,
                d99,
                l50,
                l90,
                l99,
            )| {
                HistoryPoint {
                    start,
                    finished: FinalCounts {
                        succeeded,
                        failed,
                        cancelled,
                        upstream_failed,
                        skipped,
                    },
                    duration: Percentiles {
                        p50: d50,
                        p90: d90,
                        p99: d99,
                    },
                    lateness: Percentiles {
                        p50: l50,
                        p90: l90,
                        p99: l99,
                    },
                }
            },
        )
        .collect();
    Ok(History {
        at,
        range,
        step_secs: range.step_secs(),
        owner: owner.map(str::to_owned),
        queue: queue.map(str::to_owned),
        queues,
        points,
    })
}

/// One fold (`sked.finishes_fold`): moves up to `limit` of the oldest deltas into the
/// rollups. Returns how many it folded (0 also when another process is folding).
pub async fn fold(pool: &PgPool, limit: i32) -> Result<i32> {
    Ok(sqlx::query_scalar("select sked.finishes_fold($1)")
        .bind(limit)
        .fetch_one(crate::on(pool))
        .await?)
}

/// Deletes the rollup rows past their keeping at `now` (the database clock when `None`;
/// `sked.finish_rollups_prune`); returns how many.
pub async fn prune(pool: &PgPool, now: Option<DateTime<Utc>>) -> Result<i32> {
    Ok(
        sqlx::query_scalar("select sked.finish_rollups_prune(coalesce($1, now()))")
            .bind(now)
            .fetch_one(crate::on(pool))
            .await?,
    )
}
