//! W3, pickup latency: an idle worker (whose resident memory is read first), then one noop
//! task INSERTed every interval; each task's latency is `started_at - created_at`, both set
//! by the database clock (the INSERT's and the claim's transaction start).

use std::time::Duration;

use anyhow::{Result, bail};
use tokio::time::{Instant, MissedTickBehavior};

use crate::config::Config;
use crate::pg;
use crate::process::WorkerProcess;
use crate::report::{Sample, Target};

const W: &str = "W3";
/// How long the worker sits idle before its RSS is read.
const IDLE: Duration = Duration::from_secs(3);

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w3", async |db| {
        let mut worker = WorkerProcess::spawn(&cfg.worker_bin, &db.url, cfg.w3_concurrency)?;
        let measured = async {
            worker
                .wait_registered(&db.pool, Duration::from_secs(30))
                .await?;
            tokio::time::sleep(IDLE).await;
            worker.check_alive()?;
            let idle_rss = worker.memory_mb("VmRSS")?;
            let sent = trickle(cfg, &db.pool).await?;
            let deadline = Instant::now() + Duration::from_secs(60);
            while !pg::all_finished(&db.pool).await? {
                worker.check_alive()?;
                if Instant::now() > deadline {
                    bail!("W3: tasks still unfinished 60 s after the last enqueue");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<_, anyhow::Error>((idle_rss, sent))
        }
        .await;
        let stopped = worker.stop().await;
        let (idle_rss, sent) = measured?;
        let log = stopped?;
        pg::outcome(&db.pool).await?.check(sent, false)?;

        let (p, max): (Vec<f64>, f64) = sqlx::query_as(
            "select percentile_cont(array[0.5, 0.95, 0.99]) within group (order by ms), max(ms)
               from (select extract(epoch from started_at - created_at)::float8 * 1000 as ms
                       from sked.tasks) l",
        )
        .fetch_one(&db.pool)
        .await?;
        let label = |q: &str| {
            format!(
                "latency {q} (1 task / {} ms, c={})",
                cfg.w3_interval.as_millis(),
                cfg.w3_concurrency
            )
        };
        let mut out = vec![
            Sample::new(
                W,
                format!(
                    "worker idle RSS (VmRSS after {} s idle, c={})",
                    IDLE.as_secs(),
                    cfg.w3_concurrency
                ),
                "MB",
                idle_rss,
                Target::at_most(30.0),
            ),
            Sample::new(W, label("p50"), "ms", p[0], Target::at_most(2.0)),
            Sample::new(W, label("p95"), "ms", p[1], None),
            Sample::new(W, label("p99"), "ms", p[2], Target::at_most(6.0)),
            Sample::new(W, label("max"), "ms", max, None),
            Sample::new(W, "tasks enqueued", "tasks", sent as f64, None),
        ];
        out.extend(log.samples(W));
        Ok(out)
    })
    .await
}

/// One INSERT per interval over one connection for the configured duration; returns the
/// number of tasks sent.
async fn trickle(cfg: &Config, pool: &sqlx::PgPool) -> Result<usize> {
    let mut conn = pool.acquire().await?;
    let mut tick = tokio::time::interval(cfg.w3_interval);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < cfg.w3_duration {
        tick.tick().await;
        sqlx::query("insert into sked.tasks (kind) values ('noop')")
            .execute(&mut *conn)
            .await?;
        sent += 1;
    }
    Ok(sent)
}
