//! The benchmark's databases and the SQL it runs outside the sked contract: a fresh migrated
//! database per workload run, COPY, the "all done" probe and the correctness check.

use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolCopyExt, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor};

/// A fresh, migrated database that lives for one run of one workload.
pub struct BenchDb {
    pub name: String,
    /// The URL of this database, for the worker process and extra pools.
    pub url: String,
    pub pool: PgPool,
    admin: PgConnectOptions,
}

fn admin_options(admin_url: &str) -> Result<PgConnectOptions> {
    PgConnectOptions::from_str(admin_url).context("parsing the database URL")
}

async fn admin_execute(admin: &PgConnectOptions, sql: String) -> Result<()> {
    let mut conn = admin
        .connect()
        .await
        .context("connecting to PostgreSQL (is it running? see --database-url)")?;
    conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql)))
        .await?;
    conn.close().await.ok();
    Ok(())
}

/// The server's version string, which also checks that it is reachable.
pub async fn server_version(admin_url: &str) -> Result<String> {
    let mut conn = admin_options(admin_url)?
        .connect()
        .await
        .context("connecting to PostgreSQL (is it running? see --database-url)")?;
    let v: String = sqlx::query_scalar("select version()")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await.ok();
    Ok(v)
}

impl BenchDb {
    /// Drops a leftover database of the same name, creates it afresh and migrates it.
    pub async fn create(admin_url: &str, name: &str) -> Result<BenchDb> {
        Self::create_with(admin_url, name, true).await
    }

    /// [`BenchDb::create`], migrated with sked's schema only when `migrate` (a database for
    /// another queue has none of sked's tables).
    async fn create_with(admin_url: &str, name: &str, migrate: bool) -> Result<BenchDb> {
        let admin = admin_options(admin_url)?;
        admin_execute(
            &admin,
            format!("drop database if exists {name} with (force)"),
        )
        .await?;
        admin_execute(&admin, format!("create database {name}"))
            .await
            .with_context(|| format!("creating database {name}"))?;
        let options = admin.clone().database(name).application_name("sked-bench");
        let url = options.to_url_lossy().to_string();
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
            .with_context(|| format!("connecting to {name}"))?;
        let db = BenchDb {
            name: name.to_owned(),
            url,
            pool,
            admin,
        };
        if !migrate {
            return Ok(db);
        }
        if let Err(e) = sked_db::migrate(&db.pool).await {
            db.drop().await.ok();
            return Err(e).context("migrating the benchmark database");
        }
        Ok(db)
    }

    /// Closes the pool and drops the database (with FORCE, so stray connections go too).
    pub async fn drop(self) -> Result<()> {
        self.pool.close().await;
        admin_execute(
            &self.admin,
            format!("drop database if exists {} with (force)", self.name),
        )
        .await
        .with_context(|| format!("dropping database {}", self.name))
    }

    /// A separate pool of `size` connections to this database.
    pub async fn pool(&self, app: &str, size: u32) -> Result<PgPool> {
        Ok(sked_db::connect(&self.url, app, size).await?)
    }
}

/// Runs `f` in a fresh database `sked_bench_<suffix>` and drops the database afterwards,
/// whether `f` succeeded or not.
pub async fn with_db<T>(
    admin_url: &str,
    suffix: &str,
    f: impl AsyncFnOnce(&BenchDb) -> Result<T>,
) -> Result<T> {
    let db = BenchDb::create(admin_url, &format!("sked_bench_{suffix}")).await?;
    let result = f(&db).await;
    let dropped = db.drop().await;
    let value = result?;
    dropped?;
    Ok(value)
}

/// [`with_db`] for a database without sked's schema (`sked_bench_<suffix>`, empty).
pub async fn with_empty_db<T>(
    admin_url: &str,
    suffix: &str,
    f: impl AsyncFnOnce(&BenchDb) -> Result<T>,
) -> Result<T> {
    let db = BenchDb::create_with(admin_url, &format!("sked_bench_{suffix}"), false).await?;
    let result = f(&db).await;
    let dropped = db.drop().await;
    let value = result?;
    dropped?;
    Ok(value)
}

/// `n` copies of `line` (which ends in a newline), as COPY text data.
pub fn copy_data(line: &str, n: usize) -> Vec<u8> {
    line.repeat(n).into_bytes()
}

/// Runs one `COPY … FROM STDIN` with `data`; returns the rows copied.
pub async fn copy_in(pool: &PgPool, statement: &str, data: &[u8]) -> Result<u64> {
    let mut copy = pool.copy_in_raw(statement).await?;
    copy.send(data).await?;
    Ok(copy.finish().await?)
}

/// Queues `n` noop tasks with COPY and refreshes the table's statistics and visibility map,
/// so a drain starts from the state autovacuum would leave.
pub async fn queue_noops(pool: &PgPool, n: usize) -> Result<()> {
    let copied = copy_in(
        pool,
        "copy sked.tasks (kind) from stdin",
        &copy_data("noop\n", n),
    )
    .await?;
    if copied != n as u64 {
        bail!("COPY inserted {copied} rows instead of {n}");
    }
    pool.execute("vacuum analyze sked.tasks").await?;
    Ok(())
}

/// True when no task is waiting, due for retry or running. Each `exists` stops at the first
/// live row of a partial index (tasks_claimable, tasks_running), so the probe stays
/// cheap while the worker drains the table.
pub async fn all_finished(pool: &PgPool) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "select not exists (select 1 from sked.tasks where state in ('waiting', 'retry'))
            and not exists (select 1 from sked.tasks where state = 'running')",
    )
    .fetch_one(pool)
    .await?)
}

/// The waiting task that comes last in claim order, if any.
pub async fn last_in_claim_order(pool: &PgPool) -> Result<Option<uuid::Uuid>> {
    Ok(sqlx::query_scalar(
        "select id from sked.tasks where state in ('waiting', 'retry')
          order by queue desc, priority, next_run_at desc, id desc limit 1",
    )
    .fetch_optional(pool)
    .await?)
}

/// Whether task `id` has finished (or is gone).
pub async fn finished(pool: &PgPool, id: uuid::Uuid) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "select coalesce((select finished_at is not null from sked.tasks where id = $1), true)",
    )
    .bind(id)
    .fetch_one(pool)
    .await?)
}

/// Counts that a drain checks: every task succeeded on its first attempt.
#[derive(Debug)]
pub struct Outcome {
    pub total: i64,
    pub succeeded: i64,
    pub first_attempt: i64,
    pub exit_zero: i64,
    /// max(finished_at) - min(started_at), on the database clock.
    pub db_span_secs: f64,
}

/// The queue of the finished tasks W11 puts in the table as history.
pub const HISTORY_QUEUE: &str = "bench_history";

/// The outcome of every task in the table.
pub async fn outcome(pool: &PgPool) -> Result<Outcome> {
    outcome_since(pool, None).await
}

/// The outcome of the tasks created at or after `since` (every task when `None`): those of
/// one drain, beside the finished tasks of W11's history or of W12's earlier drains.
pub async fn outcome_since(pool: &PgPool, since: Option<DateTime<Utc>>) -> Result<Outcome> {
    let (total, succeeded, first_attempt, exit_zero, span): (i64, i64, i64, i64, Option<f64>) =
        sqlx::query_as(
            "select count(*), count(*) filter (where state = 'succeeded'),
                    count(*) filter (where attempt = 1), count(*) filter (where exit_code = 0),
                    extract(epoch from max(finished_at) - min(started_at))::float8
               from sked.tasks where $1::timestamptz is null or created_at >= $1",
        )
        .bind(since)
        .fetch_one(pool)
        .await?;
    Ok(Outcome {
        total,
        succeeded,
        first_attempt,
        exit_zero,
        db_span_secs: span.unwrap_or(f64::NAN),
    })
}

impl Outcome {
    /// Fails unless all `expected` tasks succeeded with attempt 1 (and exit code 0 when
    /// `processes`).
    pub fn check(&self, expected: usize, processes: bool) -> Result<()> {
        let n = expected as i64;
        if self.total != n
            || self.succeeded != n
            || self.first_attempt != n
            || (processes && self.exit_zero != n)
        {
            bail!(
                "correctness check failed: expected {n} tasks all succeeded with attempt 1{}, \
                 found {} tasks, {} succeeded, {} with attempt 1, {} with exit code 0",
                if processes { " and exit code 0" } else { "" },
                self.total,
                self.succeeded,
                self.first_attempt,
                self.exit_zero
            );
        }
        Ok(())
    }
}

/// Cumulative statistics counters of the current database, for "work per task" figures.
/// Backends report them when their transaction ends (at most once a second) and when they
/// exit, so read them after the worker has stopped.
#[derive(Debug, Clone, Copy)]
pub struct Counters {
    pub commits: i64,
    /// Index scans of tasks_claimable: one per claim (and one per probe of [`all_finished`]).
    pub claimable_scans: i64,
}

pub async fn counters(pool: &PgPool) -> Result<Counters> {
    // Make this backend's own pending counts visible, then read a fresh snapshot.
    pool.execute("select pg_stat_clear_snapshot()").await?;
    let (commits, claimable_scans): (i64, i64) = sqlx::query_as(
        "select (select xact_commit from pg_stat_database where datname = current_database()),
                coalesce((select idx_scan from pg_stat_user_indexes
                           where schemaname = 'sked' and indexrelname = 'tasks_claimable'), 0)",
    )
    .fetch_one(pool)
    .await?;
    Ok(Counters {
        commits,
        claimable_scans,
    })
}
