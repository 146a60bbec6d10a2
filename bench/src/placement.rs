//! W10, the price of placement and queue controls: claim throughput with placement
//! constraints on (tasks with CPU and memory requests, a worker advertising capacity) against
//! off, measured two ways.
//!
//! - **SQL**: in one database, `--w10-tasks` tasks are queued by COPY and claimed 1,000 at a
//!   time by `sked_db::worker::claim_within` (the worker's own call) over one connection, each
//!   claim's results written by `sked_db::worker::finish` before the next; only the claim
//!   statements are timed. Variants, alternated round by round (`--w10-rounds`):
//!   `off` (no requests, no capacity given), `advertised` (no requests, a worker that
//!   advertises capacity: every worker now), `on` (every task requests 100 millicores and
//!   64 MB, the capacity holds a whole batch), `on, binding` (the capacity holds half a
//!   batch, so claims take 500), and `queue controls` (no requests, the queue has a
//!   concurrency and a rate limit that never bind: the claim locks the queue's row, counts its
//!   running tasks and charges its bucket), and `copy waiting` (no requests, and a copy of a
//!   service waits in the queue for a label the worker lacks: every claim runs the
//!   services-first pass, which finds nothing to take).
//! - **Worker**: one real `sked-worker` drains `--w10-drain-tasks` noop tasks without
//!   requests (`off`) and then the same number requesting 1 millicore and 1 MB each (`on`,
//!   with `--cpu-millis` and `--memory-mb` large enough for every slot).

use std::time::Duration;

use anyhow::{Result, bail};
use sked_db::worker::{Finished, Free, Outcome};
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::Config;
use crate::pg::{self, BenchDb};
use crate::process::WorkerProcess;
use crate::report::{Sample, Target, median};

const W: &str = "W10";
/// Tasks per claim, as a busy worker asks.
const BATCH: usize = 1000;

/// One way of claiming in the SQL part.
struct Variant {
    name: &'static str,
    /// The requests of every task: (millicores, MB).
    requests: Option<(i32, i32)>,
    /// The free capacity each claim gives.
    free: Free,
    /// The queue has limits that never bind.
    controls: bool,
    /// A copy of a service waits in the queue for a worker with a label this one lacks, so
    /// every claim runs the services-first pass and finds nothing it may take.
    copy_waiting: bool,
}

fn variants() -> Vec<Variant> {
    let whole = Free {
        cpu_millis: Some(100 * BATCH as i32),
        memory_mb: Some(64 * BATCH as i32),
    };
    vec![
        Variant {
            name: "off",
            requests: None,
            free: Free::default(),
            controls: false,
            copy_waiting: false,
        },
        Variant {
            name: "advertised",
            requests: None,
            free: whole,
            controls: false,
            copy_waiting: false,
        },
        Variant {
            name: "on",
            requests: Some((100, 64)),
            free: whole,
            controls: false,
            copy_waiting: false,
        },
        Variant {
            name: "on, binding",
            requests: Some((100, 64)),
            free: Free {
                cpu_millis: Some(100 * BATCH as i32 / 2),
                memory_mb: Some(64 * BATCH as i32),
            },
            controls: false,
            copy_waiting: false,
        },
        Variant {
            name: "queue controls",
            requests: None,
            free: whole,
            controls: true,
            copy_waiting: false,
        },
        Variant {
            name: "copy waiting",
            requests: None,
            free: whole,
            controls: false,
            copy_waiting: true,
        },
    ]
}

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    let mut out = sql(cfg).await?;
    out.extend(drains(cfg).await?);
    Ok(out)
}

async fn sql(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w10", async |db| {
        let conn = db.pool("sked-bench-w10", 1).await?;
        let worker = Uuid::new_v4();
        sqlx::query(
            "select sked.worker_register($1, 'bench', 'bench', 1, 'bench', '{default}', '{}',
                                         $2, '30 seconds', $3, $4)",
        )
        .bind(worker)
        .bind(BATCH as i32)
        .bind(100 * BATCH as i32)
        .bind(64 * BATCH as i32)
        .execute(&db.pool)
        .await?;
        let variants = variants();
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        for round in 0..cfg.w10_rounds {
            // Alternate the order so that no variant always runs right after another.
            let order: Vec<usize> = if round % 2 == 0 {
                (0..variants.len()).collect()
            } else {
                (0..variants.len()).rev().collect()
            };
            for i in order {
                let secs = claim_all(db, &conn, worker, &variants[i], cfg.w10_tasks).await?;
                rates[i].push(cfg.w10_tasks as f64 / secs);
            }
        }
        conn.close().await;
        let off = median(&rates[0]);
        let mut out = Vec::new();
        for (v, r) in variants.iter().zip(&rates) {
            let m = median(r);
            out.push(Sample::new(
                W,
                format!(
                    "SQL claims of {} tasks, {BATCH} per claim: {}",
                    cfg.w10_tasks, v.name
                ),
                "tasks/s",
                m,
                None,
            ));
            if v.name != "off" && v.name != "on, binding" {
                out.push(Sample::new(
                    W,
                    format!("SQL claims: {} against off (slower by)", v.name),
                    "%",
                    (1.0 - m / off) * 100.0,
                    Target::at_most(20.0),
                ));
            }
        }
        Ok(out)
    })
    .await
}

/// Queues `n` tasks for `v`, claims them all; the seconds spent in claim statements.
async fn claim_all(
    db: &BenchDb,
    conn: &sqlx::PgPool,
    worker: Uuid,
    v: &Variant,
    n: usize,
) -> Result<f64> {
    sqlx::raw_sql("truncate sked.tasks, sked.task_attempts; delete from sked.queues")
        .execute(&db.pool)
        .await?;
    match v.requests {
        None => {
            pg::copy_in(
                &db.pool,
                "copy sked.tasks (kind) from stdin",
                &pg::copy_data("noop\n", n),
            )
            .await?
        }
        Some((cpu, mem)) => {
            pg::copy_in(
                &db.pool,
                "copy sked.tasks (kind, cpu_millis, memory_mb) from stdin",
                &pg::copy_data(&format!("noop\t{cpu}\t{mem}\n"), n),
            )
            .await?
        }
    };
    if v.copy_waiting {
        sqlx::query(
            "select sked.task_submit(kind => 'service', command => array['sleep', '1'],
                                     labels => array['elsewhere'])",
        )
        .execute(&db.pool)
        .await?;
    }
    if v.controls {
        sqlx::query("select sked.queue_set_limits('default', 1000000, 1000000, 1000000)")
            .execute(&db.pool)
            .await?;
    }
    sqlx::query("vacuum analyze sked.tasks")
        .execute(&db.pool)
        .await?;
    let queues = vec!["default".to_owned()];
    let mut claimed = 0;
    let mut spent = Duration::ZERO;
    while claimed < n {
        let started = Instant::now();
        let claim = sked_db::worker::claim_within(
            conn,
            worker,
            &queues,
            &[],
            BATCH as i32,
            Duration::from_secs(30),
            v.free,
        )
        .await?;
        spent += started.elapsed();
        if claim.tasks.is_empty() {
            bail!(
                "{}: a claim took nothing with {} of {n} tasks claimed",
                v.name,
                claimed
            );
        }
        claimed += claim.tasks.len();
        let done: Vec<Finished> = claim
            .tasks
            .iter()
            .map(|t| Finished {
                id: t.id,
                attempt: t.attempt,
                outcome: Outcome::Succeeded,
                exit_code: Some(0),
                error: None,
                stdout_tail: None,
                stderr_tail: None,
                output_sha256: None,
                output: None,
            })
            .collect();
        let states = sked_db::worker::finish(conn, &done).await?;
        if states.iter().any(Option::is_none) {
            bail!("{}: a finish lost its lease", v.name);
        }
    }
    Ok(spent.as_secs_f64())
}

/// The worker part: one drain without requests, one with; returns their rates and the
/// difference.
async fn drains(cfg: &Config) -> Result<Vec<Sample>> {
    let n = cfg.w10_drain_tasks;
    let mut rates = Vec::new();
    for (name, line, args) in [
        ("off", "noop\t\\N\t\\N\n", vec![]),
        (
            "on",
            "noop\t1\t1\n",
            vec!["--cpu-millis", "1000000", "--memory-mb", "1000000"],
        ),
    ] {
        let rate = pg::with_db(&cfg.database_url, "w10_drain", async |db| {
            pg::copy_in(
                &db.pool,
                "copy sked.tasks (kind, cpu_millis, memory_mb) from stdin",
                &pg::copy_data(line, n),
            )
            .await?;
            sqlx::query("vacuum analyze sked.tasks")
                .execute(&db.pool)
                .await?;
            let started = Instant::now();
            let mut worker =
                WorkerProcess::spawn_with(&cfg.worker_bin, &db.url, cfg.w2_concurrency, &args)?;
            let result = async {
                loop {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    worker.check_alive()?;
                    if pg::all_finished(&db.pool).await? {
                        return Ok(started.elapsed().as_secs_f64());
                    }
                    if started.elapsed() > cfg.timeout {
                        bail!("W10 drain {name}: unfinished after {:?}", cfg.timeout);
                    }
                }
            }
            .await;
            let stopped = worker.stop().await;
            let wall = result?;
            stopped?;
            pg::outcome(&db.pool).await?.check(n, false)?;
            Ok(n as f64 / wall)
        })
        .await?;
        rates.push(rate);
    }
    Ok(vec![
        Sample::new(
            W,
            format!(
                "worker drain of {n} noop tasks, c={}: off",
                cfg.w2_concurrency
            ),
            "tasks/s",
            rates[0],
            None,
        ),
        Sample::new(
            W,
            "worker drain: on (1 millicore and 1 MB each)",
            "tasks/s",
            rates[1],
            None,
        ),
        Sample::new(
            W,
            "worker drain: on against off (slower by)",
            "%",
            (1.0 - rates[1] / rates[0]) * 100.0,
            Target::at_most(20.0),
        ),
    ])
}
