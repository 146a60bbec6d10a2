//! W14, await latency: from the end of an attempt to the moment an application that awaits
//! its task knows the final state and output, without polling. Each round queues one task,
//! claims it as a worker would (`sked_db::worker`), has the waiter register (`sked.task_await`,
//! committed with its LISTEN, or a long poll `GET /api/v1/tasks/{id}?wait=30s` of the
//! in-process API server), then sends the attempt's finish (`sked.tasks_finish`, autocommit)
//! and times it: from just before the finish is sent until the waiter has read the task's
//! state and output (SQL), or has the API's answer (REST). The span holds the finish
//! statement and its commit, the notification and the read. Target: p99 ≤ 10 ms.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use sked_db::worker::{Finished, Outcome, Registration};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::time::Instant;
use uuid::Uuid;

use crate::api::InProcessApi;
use crate::config::Config;
use crate::pg;
use crate::report::{Sample, Target};

const W: &str = "W14";
const QUEUE: &str = "w14";

/// A worker of this process's own: registered, claiming one task at a time.
struct Finisher {
    pool: PgPool,
    id: Uuid,
}

impl Finisher {
    async fn new(pool: PgPool) -> Result<Finisher> {
        let id = Uuid::new_v4();
        sked_db::worker::register(
            &pool,
            &Registration {
                id,
                name: "w14".into(),
                host: "bench".into(),
                pid: std::process::id() as i32,
                version: env!("CARGO_PKG_VERSION").into(),
                queues: vec![QUEUE.into()],
                labels: vec![],
                concurrency: 1,
                lease: Duration::from_secs(60),
                cpu_millis: None,
                memory_mb: None,
            },
        )
        .await?;
        Ok(Finisher { pool, id })
    }

    /// Queues a task and claims it: its id and attempt.
    async fn running(&self) -> Result<(Uuid, i32)> {
        sqlx::query("insert into sked.tasks (kind, queue) values ('noop', $1)")
            .bind(QUEUE)
            .execute(&self.pool)
            .await?;
        let claimed = sked_db::worker::claim(
            &self.pool,
            self.id,
            &[QUEUE.into()],
            &[],
            1,
            Duration::from_secs(60),
        )
        .await?;
        let [task] = claimed.as_slice() else {
            bail!("W14: claimed {} tasks instead of 1", claimed.len());
        };
        Ok((task.id, task.attempt))
    }

    /// Writes the attempt's success, as a worker does.
    async fn finish(&self, id: Uuid, attempt: i32) -> Result<()> {
        let done = Finished {
            id,
            attempt,
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            error: None,
            stdout_tail: Some(String::new()),
            stderr_tail: Some(String::new()),
            output_sha256: None,
            output: Some(serde_json::json!({"rows": 42})),
        };
        let states = sked_db::worker::finish(&self.pool, &[done]).await?;
        if states.first().and_then(|s| *s) != Some(sked_types::TaskState::Succeeded) {
            bail!("W14: the finish of {id} gave {states:?}");
        }
        Ok(())
    }
}

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w14", async |db| {
        let finisher = Finisher::new(db.pool("w14-worker", 2).await?).await?;
        let rounds = cfg.w14_rounds;

        // SQL: the application's own session LISTENs through sked.task_await.
        let mut waiter = PgListener::connect(&db.url).await?;
        let mut sql = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let (id, attempt) = finisher.running().await?;
            let (_, finished): (String, bool) = sqlx::query_as("select * from sked.task_await($1)")
                .bind(id)
                .fetch_one(&mut waiter)
                .await?;
            if finished {
                bail!("W14: task {id} was final before its finish");
            }
            let started = Instant::now();
            let finish = finisher.finish(id, attempt);
            let heard = async {
                let n = tokio::time::timeout(Duration::from_secs(10), waiter.recv())
                    .await
                    .context("W14: no notification within 10 s")??;
                let (state, output): (String, Option<serde_json::Value>) =
                    sqlx::query_as("select state, output from sked.tasks where id = $1")
                        .bind(id)
                        .fetch_one(&mut waiter)
                        .await?;
                if state != "succeeded" || output.is_none() || !n.payload().contains("succeeded") {
                    bail!("W14: heard {} and read {state}", n.payload());
                }
                Ok::<_, anyhow::Error>(started.elapsed())
            };
            let (finished, heard) = tokio::join!(finish, heard);
            finished?;
            sql.push(heard?.as_secs_f64() * 1000.0);
            waiter.unlisten(&sked_db::awaits::task_channel(id)).await?;
        }

        // REST: a long poll of the in-process server, registered before the finish is sent.
        let api = InProcessApi::start(db, Duration::from_secs(60)).await?;
        let rest = async {
            let token =
                sked_db::token::create(&db.pool, "w14", sked_db::token::Role::Admin, "w14").await?;
            let mut rest = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let (id, attempt) = finisher.running().await?;
                let poll = api
                    .client
                    .get(format!("{}/tasks/{id}?wait=30s", api.base))
                    .bearer_auth(&token)
                    .send();
                let poll = tokio::spawn(poll);
                // The poll has registered once the task's registration row exists.
                let deadline = Instant::now() + Duration::from_secs(10);
                while !registered(&db.pool, id).await? {
                    if Instant::now() > deadline {
                        bail!("W14: the long poll of {id} did not register within 10 s");
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let started = Instant::now();
                finisher.finish(id, attempt).await?;
                let answer = poll.await??;
                let took = started.elapsed();
                let body: serde_json::Value = answer.json().await?;
                if body["state"] != "succeeded" {
                    bail!("W14: the long poll of {id} answered {body}");
                }
                rest.push(took.as_secs_f64() * 1000.0);
            }
            Ok::<_, anyhow::Error>(rest)
        }
        .await;
        api.stop().await;
        let rest = rest?;

        let mut out = Vec::new();
        for (how, mut ms) in [
            ("SQL (sked.task_await, LISTEN)", sql),
            ("REST long poll (?wait=30s)", rest),
        ] {
            ms.sort_by(f64::total_cmp);
            let q = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
            let label = |p: &str| format!("finish → the waiter knows, {how}, {p} of {rounds}");
            out.push(Sample::new(W, label("p50"), "ms", q(0.5), None));
            out.push(Sample::new(
                W,
                label("p99"),
                "ms",
                q(0.99),
                Target::at_most(10.0),
            ));
            out.push(Sample::new(W, label("max"), "ms", q(1.0), None));
        }
        Ok(out)
    })
    .await
}

async fn registered(pool: &PgPool, id: Uuid) -> Result<bool> {
    Ok(
        sqlx::query_scalar("select exists (select 1 from sked.awaits where id = $1)")
            .bind(id)
            .fetch_one(pool)
            .await?,
    )
}
