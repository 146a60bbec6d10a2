//! Queue controls (`sql/queues.sql`): pause, resume, limits, a queue's retention
//! (`sql/retention.sql`), and why a task waits.

use chrono::{DateTime, Utc};
use sked_types::{QueueControls, QueueLimits, WaitingReason};
use sqlx::PgPool;
use uuid::Uuid;

use crate::Result;

/// The columns of a `sked.queues` row an answer shows, with the burst in effect.
const CONTROLS: &str = "name, paused_at, max_running, rate_per_sec,
                        case when rate_per_sec is not null
                             then sked.queue_burst(rate_per_sec, burst) end as burst,
                        extract(epoch from retention)::float8 as retention_secs,
                        extract(epoch from keep_failed)::float8 as keep_failed_secs";

type Row = (
    String,
    Option<DateTime<Utc>>,
    Option<i32>,
    Option<f64>,
    Option<i32>,
    Option<f64>,
    Option<f64>,
);

fn controls(row: Row) -> QueueControls {
    let (queue, paused_at, max_running, rate_per_sec, burst, retention_secs, keep_failed_secs) =
        row;
    QueueControls {
        queue,
        paused_at,
        max_running,
        rate_per_sec,
        burst,
        retention_secs,
        keep_failed_secs,
    }
}

/// Pauses `queue` (see `sked.queue_pause`).
pub async fn pause(pool: &PgPool, queue: &str) -> Result<QueueControls> {
    let sql = format!("select {CONTROLS} from sked.queue_pause($1)");
    let row: Row = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(queue)
        .fetch_one(crate::on(pool))
        .await?;
    Ok(controls(row))
}

/// Resumes `queue` (see `sked.queue_resume`).
pub async fn resume(pool: &PgPool, queue: &str) -> Result<QueueControls> {
    let sql = format!("select {CONTROLS} from sked.queue_resume($1)");
    let row: Row = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(queue)
        .fetch_one(crate::on(pool))
        .await?;
    Ok(controls(row))
}

/// Changes the limits and retentions given in `limits` (absent: unchanged, null: removed), in
/// one transaction that locks the queue's row, so concurrent changes of different fields both
/// hold. Removing the rate limit removes its burst.
pub async fn set_limits(pool: &PgPool, queue: &str, limits: &QueueLimits) -> Result<QueueControls> {
    let mut tx = crate::begin(pool).await?;
    type Current = (
        Option<i32>,
        Option<f64>,
        Option<i32>,
        Option<f64>,
        Option<f64>,
    );
    let current: Option<Current> = sqlx::query_as(
        "select max_running, rate_per_sec, burst, extract(epoch from retention)::float8,
                extract(epoch from keep_failed)::float8
           from sked.queues where name = $1 for update",
    )
    .bind(queue)
    .fetch_optional(&mut *tx)
    .await?;
    let (max_running, rate_per_sec, burst, retention, keep_failed) = current.unwrap_or_default();
    let retains = limits.retention_secs.is_some() || limits.keep_failed_secs.is_some();
    let limits_given =
        limits.max_running.is_some() || limits.rate_per_sec.is_some() || limits.burst.is_some();
    if retains {
        let sql = format!(
            "select {CONTROLS} from sked.queue_set_retention($1, $2 * interval '1 second',
                                                             $3 * interval '1 second')"
        );
        let row: Row = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(queue)
            .bind(limits.retention_secs.unwrap_or(retention))
            .bind(limits.keep_failed_secs.unwrap_or(keep_failed))
            .fetch_one(&mut *tx)
            .await?;
        if !limits_given {
            tx.commit().await?;
            return Ok(controls(row));
        }
    }
    let max_running = limits.max_running.unwrap_or(max_running);
    let rate_per_sec = limits.rate_per_sec.unwrap_or(rate_per_sec);
    let burst = match (rate_per_sec, limits.burst) {
        (_, Some(given)) => given,
        (None, None) => None,
        (Some(_), None) => burst,
    };
    let sql = format!("select {CONTROLS} from sked.queue_set_limits($1, $2, $3, $4)");
    let row: Row = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(queue)
        .bind(max_running)
        .bind(rate_per_sec)
        .bind(burst)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(controls(row))
}

/// Every queue that has a control, by name.
pub async fn list(pool: &PgPool) -> Result<Vec<QueueControls>> {
    let sql = format!("select {CONTROLS} from sked.queues order by name");
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_all(crate::on(pool))
        .await?;
    Ok(rows.into_iter().map(controls).collect())
}

/// Why task `id` waits, every reason that applies, most decisive first (see
/// `sked.task_waiting_reasons`); empty for a task that runs or has finished.
pub async fn waiting_reasons(pool: &PgPool, id: Uuid) -> Result<Vec<WaitingReason>> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("select code, message from sked.task_waiting_reasons($1)")
            .bind(id)
            .fetch_all(crate::on(pool))
            .await?;
    Ok(rows
        .into_iter()
        .map(|(code, message)| WaitingReason { code, message })
        .collect())
}
