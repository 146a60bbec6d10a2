//! W11, drain throughput as data ages: W2's drain of noop tasks on an empty table, then, in
//! the same database, with `--w11-history` finished tasks in the table, the rows a long use
//! leaves behind (succeeded over the last 30 days, in a queue of their own), made by one
//! `INSERT … SELECT`. Target: the drain with history within 10 % of the drain without.

use anyhow::Result;
use sqlx::Executor;
use tokio::time::Instant;

use crate::config::Config;
use crate::drain::{self, Drain};
use crate::pg::{self, HISTORY_QUEUE};
use crate::report::{Sample, Target};

const W: &str = "W11";

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w11", async |db| {
        let d = Drain::noops(W, cfg);
        let empty = drain::drain_in(cfg, db, &d).await?.rate;
        db.pool.execute("truncate sked.tasks cascade").await?;

        let started = Instant::now();
        let made: u64 = sqlx::query(
            "insert into sked.tasks (kind, queue, state, attempt, next_run_at, created_at,
                                     started_at, finished_at)
             select 'noop', $2, 'succeeded', 1, t, t, t, t + interval '2 ms'
               from (select now() - interval '30 days' * (1 - g::float8 / $1) as t
                       from generate_series(1, $1) g) s",
        )
        .bind(cfg.w11_history as i64)
        .bind(HISTORY_QUEUE)
        .execute(&db.pool)
        .await?
        .rows_affected();
        db.pool.execute("vacuum analyze sked.tasks").await?;
        let making = started.elapsed().as_secs_f64();
        let (table_mb, indexes_mb): (f64, f64) = sqlx::query_as(
            "select pg_table_size('sked.tasks') / 1048576.0::float8,
                    pg_indexes_size('sked.tasks') / 1048576.0::float8",
        )
        .fetch_one(&db.pool)
        .await?;

        let aged = drain::drain_in(cfg, db, &d).await?.rate;
        let n = cfg.tasks;
        Ok(vec![
            Sample::new(
                W,
                format!("drain {n} noop tasks, empty table"),
                "tasks/s",
                empty,
                None,
            ),
            Sample::new(
                W,
                format!("drain {n} noop tasks beside {made} finished ones"),
                "tasks/s",
                aged,
                None,
            ),
            Sample::new(
                W,
                "drain with history against without",
                "%",
                aged / empty * 100.0,
                Target::at_least(90.0),
            ),
            Sample::new(W, "history: time to make it", "s", making, None),
            Sample::new(W, "history: table size", "MB", table_mb, None),
            Sample::new(W, "history: indexes' size", "MB", indexes_mb, None),
        ])
    })
    .await
}
