//! W1, enqueue throughput: the same noop tasks enqueued through each way in, one after the
//! other on an emptied table: sked_db::task::submit and the SQL function sked.tasks_submit in
//! batches over one connection, the REST batch endpoint, single-row INSERTs and single REST
//! submissions over a few concurrent connections, and one COPY.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use sked_types::{SubmitBatch, SubmitTask, Submitted};
use sqlx::{Executor, PgPool};
use tokio::time::Instant;

use crate::api::InProcessApi;
use crate::config::Config;
use crate::pg::{self, BenchDb};
use crate::report::{Sample, Target};

const W: &str = "W1";
/// The bulk target in tasks per second.
const BULK_TARGET: f64 = 100_000.0;

fn noop() -> SubmitTask {
    SubmitTask {
        kind: Some(sked_types::TaskKind::Noop),
        ..SubmitTask::default()
    }
}

fn rate(n: usize, started: Instant) -> f64 {
    n as f64 / started.elapsed().as_secs_f64()
}

/// Fails unless the table holds exactly `n` tasks, then empties it for the next method.
async fn check_and_truncate(pool: &PgPool, n: usize, method: &str) -> Result<()> {
    let count: i64 = sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(pool)
        .await?;
    if count != n as i64 {
        bail!("{method}: expected {n} tasks in the table, found {count}");
    }
    pool.execute("truncate sked.tasks").await?;
    Ok(())
}

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w1", async |db| {
        let mut out = Vec::new();
        let n = cfg.tasks;
        let single = cfg.single_tasks;

        let r = sql_bulk(db, n, cfg.batch).await?;
        check_and_truncate(&db.pool, n, "library bulk").await?;
        out.push(Sample::new(
            W,
            format!(
                "enqueue: sked_db::task::submit (COPY), {} per call, 1 conn",
                cfg.batch
            ),
            "tasks/s",
            r,
            Target::at_least(BULK_TARGET),
        ));

        let r = sql_function_bulk(db, n, cfg.batch).await?;
        check_and_truncate(&db.pool, n, "sql function bulk").await?;
        out.push(Sample::new(
            W,
            format!(
                "enqueue: SQL sked.tasks_submit(jsonb), {} per call, 1 conn",
                cfg.batch
            ),
            "tasks/s",
            r,
            Target::at_least(BULK_TARGET),
        ));

        let api = Api::start(db).await?;
        let result = async {
            let r = api.bulk(n, cfg.batch).await?;
            check_and_truncate(&db.pool, n, "REST bulk").await?;
            out.push(Sample::new(
                W,
                format!("enqueue: POST /tasks/batch, {} per request", cfg.batch),
                "tasks/s",
                r,
                Target::at_least(BULK_TARGET),
            ));
            let r = api.single(single, cfg.single_conns).await?;
            check_and_truncate(&db.pool, single, "REST single").await?;
            out.push(Sample::new(
                W,
                format!(
                    "enqueue: POST /tasks one by one, {} conns",
                    cfg.single_conns
                ),
                "tasks/s",
                r,
                None,
            ));
            Ok::<_, anyhow::Error>(())
        }
        .await;
        api.stop().await;
        result?;

        let r = single_inserts(db, single, cfg.single_conns).await?;
        check_and_truncate(&db.pool, single, "single INSERTs").await?;
        out.push(Sample::new(
            W,
            format!("enqueue: single-row INSERT, {} conns", cfg.single_conns),
            "tasks/s",
            r,
            None,
        ));

        let data = pg::copy_data("noop\n", n);
        let started = Instant::now();
        pg::copy_in(&db.pool, "copy sked.tasks (kind) from stdin", &data).await?;
        let r = rate(n, started);
        check_and_truncate(&db.pool, n, "COPY").await?;
        out.push(Sample::new(
            W,
            "enqueue: COPY into sked.tasks",
            "tasks/s",
            r,
            Target::at_least(BULK_TARGET),
        ));
        Ok(out)
    })
    .await
}

/// The SQL function applications call, `sked.tasks_submit(jsonb)`, one call per batch over a
/// one-connection pool.
async fn sql_function_bulk(db: &BenchDb, n: usize, batch: usize) -> Result<f64> {
    let pool = db.pool("sked-bench", 1).await?;
    let body = serde_json::Value::Array(vec![serde_json::json!({"kind": "noop"}); batch]);
    let started = Instant::now();
    let mut left = n;
    while left > 0 {
        let k = left.min(batch);
        let part = match &body {
            serde_json::Value::Array(all) => serde_json::Value::Array(all[..k].to_vec()),
            _ => unreachable!(),
        };
        let got: i64 = sqlx::query_scalar("select count(*) from sked.tasks_submit($1, 'bench')")
            .bind(part)
            .fetch_one(&pool)
            .await?;
        if got != k as i64 {
            bail!("sked.tasks_submit returned {got} ids for {k} tasks");
        }
        left -= k;
    }
    let r = rate(n, started);
    pool.close().await;
    Ok(r)
}

/// `sked_db::task::submit` (what the REST API uses: one COPY per batch of plain tasks) over a
/// one-connection pool.
async fn sql_bulk(db: &BenchDb, n: usize, batch: usize) -> Result<f64> {
    let pool = db.pool("sked-bench", 1).await?;
    let tasks = vec![noop(); batch];
    let started = Instant::now();
    let mut left = n;
    while left > 0 {
        let k = left.min(batch);
        let ids = sked_db::task::submit(&pool, &tasks[..k], "bench")
            .await?
            .ids;
        if ids.len() != k {
            bail!(
                "sked_db::task::submit returned {} ids for {k} tasks",
                ids.len()
            );
        }
        left -= k;
    }
    let r = rate(n, started);
    pool.close().await;
    Ok(r)
}

/// Single-row INSERTs, each its own transaction, from `conns` connections at once.
async fn single_inserts(db: &BenchDb, n: usize, conns: usize) -> Result<f64> {
    let pool = db.pool("sked-bench", conns as u32).await?;
    let mut handles = Vec::new();
    let started = Instant::now();
    for i in 0..conns {
        let share = n / conns + usize::from(i < n % conns);
        let pool = pool.clone();
        handles.push(tokio::spawn(async move {
            let mut conn = pool.acquire().await?;
            for _ in 0..share {
                sqlx::query("insert into sked.tasks (kind) values ('noop')")
                    .execute(&mut *conn)
                    .await?;
            }
            Ok::<_, sqlx::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    let r = rate(n, started);
    pool.close().await;
    Ok(r)
}

/// The REST API served in this process on an ephemeral port, with a user token.
struct Api {
    api: InProcessApi,
    token: String,
}

impl Api {
    async fn start(db: &BenchDb) -> Result<Api> {
        let token =
            sked_db::token::create(&db.pool, "bench", sked_db::token::Role::User, "bench").await?;
        let api = InProcessApi::start(db, Duration::from_secs(120)).await?;
        Ok(Api { api, token })
    }

    async fn stop(self) {
        self.api.stop().await;
    }

    async fn post(&self, path: &str, body: Vec<u8>) -> Result<usize> {
        let resp = self
            .api
            .client
            .post(format!("{}{path}", self.api.base))
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await?;
        let status = resp.status();
        if status != reqwest::StatusCode::CREATED {
            let text = resp.text().await.unwrap_or_default();
            bail!("POST {path} answered {status}: {text}");
        }
        let submitted: Submitted = resp.json().await.context("reading the answer")?;
        Ok(submitted.ids.len())
    }

    /// POST /api/v1/tasks/batch, one request at a time. The body is serialized once.
    async fn bulk(&self, n: usize, batch: usize) -> Result<f64> {
        let full = serde_json::to_vec(&SubmitBatch {
            tasks: vec![noop(); batch],
        })?;
        let started = Instant::now();
        let mut left = n;
        while left > 0 {
            let k = left.min(batch);
            let body = if k == batch {
                full.clone()
            } else {
                serde_json::to_vec(&SubmitBatch {
                    tasks: vec![noop(); k],
                })?
            };
            let got = self.post("/tasks/batch", body).await?;
            if got != k {
                bail!("POST /tasks/batch returned {got} ids for {k} tasks");
            }
            left -= k;
        }
        Ok(rate(n, started))
    }

    /// POST /api/v1/tasks, one task per request, from `conns` clients at once.
    async fn single(&self, n: usize, conns: usize) -> Result<f64> {
        let body = serde_json::to_vec(&noop())?;
        let started = Instant::now();
        let mut jobs = Vec::new();
        for i in 0..conns {
            let share = n / conns + usize::from(i < n % conns);
            let body = body.clone();
            jobs.push(async move {
                for _ in 0..share {
                    self.post("/tasks", body.clone()).await?;
                }
                Ok::<_, anyhow::Error>(())
            });
        }
        for r in futures::future::join_all(jobs).await {
            r?;
        }
        Ok(rate(n, started))
    }
}
