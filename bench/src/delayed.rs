//! W5, on-time starts of delayed tasks: one idle worker and thousands of noop tasks whose
//! `next_run_at` lies up to a minute ahead. A task's lateness is `started_at − next_run_at`,
//! both on the database clock (`started_at` is the start of the claim's transaction). Two
//! phases run one after the other against the same worker:
//!
//! - **queued**: all tasks go in by one INSERT, due uniformly over the spread starting one
//!   second later (so none is due before the INSERT has committed);
//! - **live**: tasks go in by batches during the spread while the worker sleeps toward a task
//!   that is due later. Half of each batch (`early`) is due before anything already queued,
//!   so only the insert's notification can wake the worker in time; the other half (`late`)
//!   is due after the next batch, which gives that batch a later task to undercut.

use std::time::Duration;

use anyhow::{Result, bail};
use sqlx::PgPool;
use tokio::time::Instant;

use crate::config::Config;
use crate::pg;
use crate::process::WorkerProcess;
use crate::report::{Sample, Target};

const W: &str = "W5";
/// The target for the 99th percentile of lateness, in milliseconds.
const P99_TARGET_MS: f64 = 50.0;
/// Seconds between the INSERT of the queued phase and the first due time.
const LEAD_SECS: f64 = 1.0;
/// How long the tasks may take to finish after the last is due.
const SETTLE: Duration = Duration::from_secs(60);

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w5", async |db| {
        let mut worker = WorkerProcess::spawn(&cfg.worker_bin, &db.url, cfg.w5_concurrency)?;
        let measured = async {
            worker
                .wait_registered(&db.pool, Duration::from_secs(30))
                .await?;
            queued(cfg, &db.pool, &mut worker).await?;
            live(cfg, &db.pool, &mut worker).await
        }
        .await;
        let stopped = worker.stop().await;
        let ahead = measured?;
        let log = stopped?;
        pg::outcome(&db.pool)
            .await?
            .check(2 * cfg.w5_tasks, false)?;

        let n = cfg.w5_tasks;
        let spread = cfg.w5_spread.as_secs_f64();
        let c = cfg.w5_concurrency;
        let mut out = Vec::new();
        let queued = Lateness::of(&db.pool, &["queued"]).await?;
        out.extend(queued.samples(&format!(
            "queued: lateness {{}} ({n} tasks due over {spread} s, c={c})"
        )));
        let live = Lateness::of(&db.pool, &["early", "late"]).await?;
        out.extend(live.samples(&format!(
            "live: lateness {{}} ({n} tasks in {} batches during {spread} s)",
            cfg.w5_batches
        )));
        let early = Lateness::of(&db.pool, &["early"]).await?;
        for (q, v) in [("p99", early.p99), ("max", early.max)] {
            out.push(Sample::new(
                W,
                format!("live, due before the queued head (woken by NOTIFY): lateness {q}"),
                "ms",
                v,
                None,
            ));
        }
        out.push(Sample::new(
            W,
            "live: batches whose early half was due before the queued head",
            "batches",
            ahead as f64,
            None,
        ));
        out.extend(log.samples(W));
        Ok(out)
    })
    .await
}

/// Inserts `w5_tasks` tasks due over the spread by one statement and waits until all ran.
async fn queued(cfg: &Config, pool: &PgPool, worker: &mut WorkerProcess) -> Result<()> {
    let spread = cfg.w5_spread.as_secs_f64();
    let inserted = sqlx::query(
        "insert into sked.tasks (kind, args, next_run_at)
         select 'noop', '{queued}', now() + make_interval(secs => $2 + random() * $3)
           from generate_series(1, $1)",
    )
    .bind(cfg.w5_tasks as i32)
    .bind(LEAD_SECS)
    .bind(spread)
    .execute(pool)
    .await?
    .rows_affected();
    if inserted != cfg.w5_tasks as u64 {
        bail!("W5: inserted {inserted} tasks instead of {}", cfg.w5_tasks);
    }
    let until = Instant::now() + Duration::from_secs_f64(LEAD_SECS + spread) + SETTLE;
    wait_all_finished(pool, worker, until).await
}

/// Inserts `w5_tasks` tasks in `w5_batches` batches, one every spread/batches seconds (the
/// interval I). Of each batch, half is due I/60 to I/6 after its insert and the other half
/// 7I/6 to 3I/2 after it, which is after the next batch has gone in. Returns the number of
/// batches whose early half was all due before the earliest task queued when it went in.
async fn live(cfg: &Config, pool: &PgPool, worker: &mut WorkerProcess) -> Result<usize> {
    let batches = cfg.w5_batches;
    let interval = cfg.w5_spread / batches as u32;
    let sixth = interval.as_secs_f64() / 6.0;
    let started = Instant::now();
    let mut ahead = 0;
    for k in 0..batches {
        tokio::time::sleep_until(started + interval * k as u32).await;
        worker.check_alive()?;
        let size = cfg.w5_tasks / batches + usize::from(k < cfg.w5_tasks % batches);
        let early = size.div_ceil(2);
        // `head` reads the snapshot before the insert: the earliest task already queued.
        let before_head: bool = sqlx::query_scalar(
            "with head as (
               select min(next_run_at) as at from sked.tasks where state in ('waiting', 'retry')
             ), batch as (
               insert into sked.tasks (kind, args, next_run_at)
               select 'noop', array[case when g <= $2 then 'early' else 'late' end],
                      now() + make_interval(secs => case when g <= $2
                                                         then $3 * (0.1 + 0.9 * random())
                                                         else $3 * (7.0 + 2.0 * random()) end)
                 from generate_series(1, $1) g
               returning next_run_at, args[1] as tag
             )
             select coalesce((select max(next_run_at) from batch where tag = 'early')
                               < (select at from head), true)",
        )
        .bind(size as i32)
        .bind(early as i32)
        .bind(sixth)
        .fetch_one(pool)
        .await?;
        ahead += usize::from(before_head);
    }
    let until = Instant::now() + Duration::from_secs_f64(9.0 * sixth) + SETTLE;
    wait_all_finished(pool, worker, until).await?;
    Ok(ahead)
}

async fn wait_all_finished(
    pool: &PgPool,
    worker: &mut WorkerProcess,
    until: Instant,
) -> Result<()> {
    while !pg::all_finished(pool).await? {
        worker.check_alive()?;
        if Instant::now() > until {
            bail!("W5: tasks still unfinished {SETTLE:?} after the last was due");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Lateness percentiles of the tasks whose `args[1]` is one of the tags, in milliseconds.
struct Lateness {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

impl Lateness {
    async fn of(pool: &PgPool, tags: &[&str]) -> Result<Lateness> {
        let (count, p, max, min): (i64, Option<Vec<f64>>, Option<f64>, Option<f64>) =
            sqlx::query_as(
                "select count(*), percentile_cont(array[0.5, 0.9, 0.99]) within group (order by ms),
                        max(ms), min(ms)
                   from (select extract(epoch from started_at - next_run_at)::float8 * 1000 as ms
                           from sked.tasks where args[1] = any($1)) l",
            )
            .bind(tags)
            .fetch_one(pool)
            .await?;
        let (Some(p), Some(max), Some(min)) = (p, max, min) else {
            bail!("W5: no tasks tagged {tags:?}");
        };
        if min < 0.0 {
            bail!(
                "W5: a task tagged {tags:?} started {:.3} ms before it was due (of {count})",
                -min
            );
        }
        Ok(Lateness {
            p50: p[0],
            p90: p[1],
            p99: p[2],
            max,
        })
    }

    /// One sample per percentile; `label` has a `{}` where the percentile's name goes.
    fn samples(&self, label: &str) -> Vec<Sample> {
        [
            ("p50", self.p50, None),
            ("p90", self.p90, None),
            ("p99", self.p99, Target::at_most(P99_TARGET_MS)),
            ("max", self.max, None),
        ]
        .into_iter()
        .map(|(q, v, target)| Sample::new(W, label.replacen("{}", q, 1), "ms", v, target))
        .collect()
    }
}
