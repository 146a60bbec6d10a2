//! The dashboard's overview: per queue, the unfinished tasks by state and the tasks finished
//! in the last hour, a per-minute series of finishes and the workers, all counted exactly in
//! one snapshot by the functions of `sql/overview.sql`.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, Utc};
use sked_types::{FinalCounts, MinuteFinishes, Overview, QueueOverview, TaskState, WorkerCounts};
use sqlx::PgPool;

use crate::Result;
use crate::text::Text;

/// Minutes in the series (the last hour).
pub const SERIES_MINUTES: i64 = 60;

/// The overview of `owner`'s tasks (every owner's when `None`) at `now` (the database clock
/// when `None`).
pub async fn overview(
    pool: &PgPool,
    owner: Option<&str>,
    now: Option<DateTime<Utc>>,
) -> Result<Overview> {
    // Every count comes from one snapshot.
    let mut tx = crate::pooler::begin_snapshot(pool).await?;
    let (at, since): (DateTime<Utc>, DateTime<Utc>) =
        sqlx::query_as("select n, sked.overview_since(n) from (select coalesce($1, now()) as n) x")
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;

    type Unfinished = (String, i64, i64, i64, i64, i64, Option<DateTime<Utc>>);
    // Statements that are not kept prepared are planned for their parameters' values, so an
    // absent owner folds away and each scan reads its partial index alone.
    let unfinished: Vec<Unfinished> = sqlx::query_as(
        "select queue, blocked, waiting_due, waiting_delayed, running, retry, oldest_due_at
           from sked.queues_unfinished($1, $2)",
    )
    .persistent(false)
    .bind(owner)
    .bind(at)
    .fetch_all(&mut *tx)
    .await?;
    let finished: Vec<(String, DateTime<Utc>, Text<TaskState>, i64)> = sqlx::query_as(
        "select queue, minute, state, tasks from sked.tasks_finished_by_minute($1, $2)",
    )
    .persistent(false)
    .bind(owner)
    .bind(at)
    .fetch_all(&mut *tx)
    .await?;
    let (alive, total): (i64, i64) = sqlx::query_as(
        "select count(*) filter (where heartbeat_at + lease > $1), count(*) from sked.workers",
    )
    .bind(at)
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;

    let mut queues: BTreeMap<String, QueueOverview> = BTreeMap::new();
    for (queue, blocked, waiting_due, waiting_delayed, running, retry, oldest_due_at) in unfinished
    {
        let oldest_due_secs = oldest_due_at
            .map(|due| ((at - due).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6).max(0.0));
        queues.insert(
            queue.clone(),
            QueueOverview {
                queue,
                blocked,
                waiting_due,
                waiting_delayed,
                running,
                retry,
                oldest_due_secs,
                finished: FinalCounts::default(),
            },
        );
    }
    let mut series: Vec<MinuteFinishes> = (0..SERIES_MINUTES)
        .map(|i| MinuteFinishes {
            minute: since + Duration::minutes(i),
            finished: FinalCounts::default(),
        })
        .collect();
    for (queue, minute, Text(state), tasks) in finished {
        queues
            .entry(queue.clone())
            .or_insert_with(|| QueueOverview {
                queue,
                ..QueueOverview::default()
            })
            .finished
            .add(state, tasks);
        let index = (minute - since).num_minutes();
        if let Some(point) = usize::try_from(index).ok().and_then(|i| series.get_mut(i)) {
            point.finished.add(state, tasks);
        }
    }
    Ok(Overview {
        at,
        since,
        owner: owner.map(str::to_owned),
        queues: queues.into_values().collect(),
        series,
        workers: WorkerCounts { alive, total },
    })
}
