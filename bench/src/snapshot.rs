//! W12, a held snapshot, the classic failure of queues in PostgreSQL: one session left idle
//! in a transaction keeps every row version made dead after its snapshot, so vacuum can
//! remove none of what the drains leave. W2's drain on a fresh table; then drain after drain
//! while one connection holds a `REPEATABLE READ` snapshot for `--w12-hold-secs`; then a
//! drain at once after the release and one `--w12-recover-secs` later. With
//! `--w12-every-secs` the drains while held start that far apart, a steady flow of `--tasks`
//! per period, instead of back to back. Each drain's rate is
//! reported against the first, with the dead row versions and the indexes' size. Targets:
//! every drain while held at least 50 % of the first, the drain after the recovery time at
//! least 90 %.

use anyhow::{Context, Result};
use sqlx::{Connection, Executor, PgConnection};
use tokio::time::Instant;

use crate::config::Config;
use crate::drain::{self, Drain};
use crate::pg::{self, BenchDb};
use crate::report::{Sample, Target};

const W: &str = "W12";

/// Dead row versions of sked.tasks (as the statistics last reported them) and the size of
/// its indexes in MB.
async fn bloat(db: &BenchDb) -> Result<(i64, f64)> {
    Ok(sqlx::query_as(
        "select pg_stat_get_dead_tuples('sked.tasks'::regclass),
                pg_indexes_size('sked.tasks') / 1048576.0::float8",
    )
    .fetch_one(&db.pool)
    .await?)
}

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w12", async |db| {
        let d = Drain::noops(W, cfg);
        let n = cfg.tasks;
        let first = drain::drain_in(cfg, db, &d).await?.rate;
        let (_, indexes_before) = bloat(db).await?;

        let mut holder = PgConnection::connect(&db.url)
            .await
            .context("connecting the session that holds a snapshot")?;
        holder
            .execute("begin isolation level repeatable read")
            .await?;
        holder.execute("select count(*) from sked.tasks").await?;
        let held = Instant::now();
        let mut rates = Vec::new();
        while held.elapsed() < cfg.w12_hold {
            let started = Instant::now();
            rates.push(drain::drain_in(cfg, db, &d).await?.rate);
            let next = started + cfg.w12_every;
            if next < held + cfg.w12_hold {
                tokio::time::sleep_until(next).await;
            }
        }
        let flow = (rates.len() * n) as f64 / held.elapsed().as_secs_f64();
        let (dead, indexes_held) = bloat(db).await?;
        holder.execute("rollback").await?;
        holder.close().await?;

        let released = drain::drain_in(cfg, db, &d).await?.rate;
        tokio::time::sleep(cfg.w12_recover).await;
        let recovered = drain::drain_in(cfg, db, &d).await?.rate;

        let pct = |rate: f64| rate / first * 100.0;
        let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let last = rates.last().copied().unwrap_or(f64::NAN);
        let hold = cfg.w12_hold.as_secs();
        Ok(vec![
            Sample::new(
                W,
                format!("drain {n} noop tasks, no snapshot held"),
                "tasks/s",
                first,
                None,
            ),
            Sample::new(
                W,
                format!("drains while a snapshot is held for {hold} s"),
                "drains",
                rates.len() as f64,
                None,
            ),
            Sample::new(
                W,
                "held: tasks that flowed, per second of the hold",
                "tasks/s",
                flow,
                None,
            ),
            Sample::new(
                W,
                "held: slowest drain against the first",
                "%",
                pct(slowest),
                Target::at_least(50.0),
            ),
            Sample::new(
                W,
                "held: last drain against the first",
                "%",
                pct(last),
                Target::at_least(50.0),
            ),
            Sample::new(
                W,
                "held: dead row versions at the release",
                "rows",
                dead as f64,
                None,
            ),
            Sample::new(
                W,
                "indexes' size before the hold",
                "MB",
                indexes_before,
                None,
            ),
            Sample::new(W, "indexes' size at the release", "MB", indexes_held, None),
            Sample::new(
                W,
                "drain at once after the release, against the first",
                "%",
                pct(released),
                None,
            ),
            Sample::new(
                W,
                format!(
                    "drain {} s after the release, against the first",
                    cfg.w12_recover.as_secs()
                ),
                "%",
                pct(recovered),
                Target::at_least(90.0),
            ),
        ])
    })
    .await
}
