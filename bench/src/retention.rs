//! W13, retention beside the hot path: `--w13-history` finished tasks past their retention
//! (8 to 38 days old, in a queue of their own, made by one `INSERT … SELECT`), then W2's drain
//! of noop tasks twice: alone, and while the servers' prune deletes the history batch by
//! batch (`sked_db::upkeep::prune_tasks_batch`, with the pause the upkeep makes between
//! batches). Reports both drains,
//! their ratio, how much the prune deleted meanwhile and how long its batches took: each is a
//! transaction that holds its rows' locks and the prune's advisory lock, so its longest is
//! the longest the prune can hold anything up. Targets: the drain beside the prune within
//! 20 % of the drain alone, and no batch longer than 500 ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use sqlx::Executor;
use tokio::time::Instant;

use crate::config::Config;
use crate::drain::{self, Drain};
use crate::pg::{self, HISTORY_QUEUE};
use crate::report::{Sample, Target};

const W: &str = "W13";

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w13", async |db| {
        let made: u64 = sqlx::query(
            "insert into sked.tasks (kind, queue, state, attempt, next_run_at, created_at,
                                     started_at, finished_at)
             select 'noop', $2, 'succeeded', 1, t, t, t, t + interval '2 ms'
               from (select now() - interval '8 days' - interval '30 days' * (1 - g::float8 / $1)
                            as t
                       from generate_series(1, $1) g) s",
        )
        .bind(cfg.w13_history as i64)
        .bind(HISTORY_QUEUE)
        .execute(&db.pool)
        .await?
        .rows_affected();
        db.pool.execute("vacuum analyze sked.tasks").await?;

        let d = Drain::noops(W, cfg);
        let alone = drain::drain_in(cfg, db, &d).await?.rate;

        // The prune, batch after batch as the upkeep runs them (each followed by its pause),
        // until the drain ends.
        let stop = Arc::new(AtomicBool::new(false));
        let prune = tokio::spawn({
            let (pool, stop) = (db.pool.clone(), stop.clone());
            async move {
                let mut after = None;
                let mut batches: Vec<f64> = Vec::new();
                let mut deleted = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let (n, next) = sked_db::upkeep::prune_tasks_batch(
                        &pool,
                        after,
                        sked_db::upkeep::PRUNE_TASKS_BATCH,
                        None,
                    )
                    .await?;
                    let took = started.elapsed();
                    batches.push(took.as_secs_f64() * 1000.0);
                    deleted += i64::from(n);
                    match next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                    tokio::time::sleep(sked_db::upkeep::pause_after(took)).await;
                }
                anyhow::Ok((batches, deleted))
            }
        });
        let started = Instant::now();
        let beside = drain::drain_in(cfg, db, &d).await?.rate;
        let drained_for = started.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let (mut batches, deleted) = prune.await??;
        batches.sort_by(f64::total_cmp);
        let at = |q: f64| {
            batches
                .get(((batches.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        let n = cfg.tasks;
        Ok(vec![
            Sample::new(
                W,
                format!("drain {n} noop tasks beside {made} finished ones"),
                "tasks/s",
                alone,
                None,
            ),
            Sample::new(
                W,
                format!("drain {n} noop tasks while the prune deletes"),
                "tasks/s",
                beside,
                None,
            ),
            Sample::new(
                W,
                "drain beside the prune against alone",
                "%",
                beside / alone * 100.0,
                Target::at_least(80.0),
            ),
            Sample::new(
                W,
                "prune: finished tasks deleted during the drain",
                "tasks/s",
                deleted as f64 / drained_for,
                None,
            ),
            Sample::new(W, "prune: batch p50", "ms", at(0.5), None),
            Sample::new(W, "prune: batch p99", "ms", at(0.99), None),
            Sample::new(
                W,
                "prune: longest batch",
                "ms",
                batches.last().copied().unwrap_or(0.0),
                Target::at_most(500.0),
            ),
        ])
    })
    .await
}
