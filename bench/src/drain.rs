//! W2 and W4, drain throughput: queue tasks first, then start real `sked-worker` processes
//! (one, or W2's `--w2-processes`, sharing the slots) and time them from their start until no
//! task is left unfinished. W2 drains noop tasks (the overhead of sked itself) and reads the
//! workers' peak RSS; W4 drains real processes. Each drain reports how many tasks each worker
//! process ran.

use std::time::Duration;

use anyhow::{Result, bail};
use chrono::{DateTime, Utc};
use tokio::time::Instant;

use crate::config::Config;
use crate::pg::{self, BenchDb};
use crate::process::{CpuUse, CpuWatch, WorkerProcess};
use crate::report::{Sample, Target};

/// What one drain queues and how the worker runs it.
pub struct Drain {
    workload: &'static str,
    what: &'static str,
    tasks: usize,
    /// Slots in all.
    pub concurrency: usize,
    /// Worker processes that share the `concurrency` slots (as evenly as they divide).
    pub workers: usize,
    /// The workers' DATABASE_URL instead of the database's own (a pooler's), and more
    /// environment variables for them.
    pub worker_url: Option<String>,
    pub worker_env: Vec<(String, String)>,
    /// COPY statement and one line of its data per task.
    copy: (&'static str, &'static str),
    /// Tasks run as processes, which must exit with 0.
    processes: bool,
    target: f64,
}

impl Drain {
    /// W2's drain of `--tasks` noop tasks, reported as `workload`.
    pub fn noops(workload: &'static str, cfg: &Config) -> Drain {
        Drain {
            workload,
            what: "noop tasks",
            tasks: cfg.tasks,
            concurrency: cfg.w2_concurrency,
            workers: 1,
            worker_url: None,
            worker_env: Vec::new(),
            copy: ("copy sked.tasks (kind) from stdin", "noop\n"),
            processes: false,
            target: 50_000.0,
        }
    }
}

pub async fn w2(cfg: &Config) -> Result<Vec<Sample>> {
    let mut d = Drain::noops("W2", cfg);
    d.workers = cfg.w2_processes;
    run(cfg, d).await
}

/// W4: the drain of `true` processes, beside the machine's bare rate of spawning them: as
/// many `true` run by `xargs` with as many at once as the worker's slots, once before and
/// once after the drain (their mean, so that a drift of the machine falls on both).
pub async fn w4(cfg: &Config) -> Result<Vec<Sample>> {
    let d = Drain {
        workload: "W4",
        what: "`true` processes",
        tasks: cfg.w4_tasks,
        concurrency: cfg.w4_concurrency,
        workers: 1,
        worker_url: None,
        worker_env: Vec::new(),
        copy: ("copy sked.tasks (command) from stdin", "{true}\n"),
        processes: true,
        target: 500.0,
    };
    pg::with_db(&cfg.database_url, "w4", async |db| {
        let before = bare_spawns(d.tasks, d.concurrency).await?;
        let drained = drain_in(cfg, db, &d).await?;
        let after = bare_spawns(d.tasks, d.concurrency).await?;
        let bare = (before + after) / 2.0;
        let mut samples = drained.samples;
        samples.push(Sample::new(
            d.workload,
            format!(
                "bare fork/exec: seq {} | xargs -P {} -n 1 true (mean of before and after)",
                d.tasks, d.concurrency
            ),
            "tasks/s",
            bare,
            None,
        ));
        samples.push(Sample::new(
            d.workload,
            "drain against bare fork/exec",
            "%",
            100.0 * drained.rate / bare,
            Target::at_least(80.0),
        ));
        Ok(samples)
    })
    .await
}

/// Processes per second that `seq n | xargs -P c -n 1 true` spawns.
async fn bare_spawns(n: usize, c: usize) -> Result<f64> {
    let started = Instant::now();
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("seq {n} | xargs -P {c} -n 1 true"))
        .status()
        .await?;
    if !status.success() {
        bail!("seq {n} | xargs -P {c} -n 1 true: {status}");
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

async fn run(cfg: &Config, d: Drain) -> Result<Vec<Sample>> {
    let suffix = d.workload.to_lowercase();
    pg::with_db(&cfg.database_url, &suffix, async |db| {
        Ok(drain_in(cfg, db, &d).await?.samples)
    })
    .await
}

/// What one drain measured.
pub struct Drained {
    pub samples: Vec<Sample>,
    /// Tasks per second of wall time, from the workers' start until all were done.
    pub rate: f64,
    /// CPU used meanwhile by the (first) worker and by PostgreSQL.
    pub cpu: CpuUse,
    /// Tasks each worker process ran, most first.
    pub per_worker: Vec<i64>,
}

/// The slots of each of `workers` processes sharing `total`: as even as they divide, the
/// first ones taking the remainder.
pub fn shares(total: usize, workers: usize) -> Vec<usize> {
    let workers = workers.clamp(1, total.max(1));
    (0..workers)
        .map(|i| total / workers + usize::from(i < total % workers))
        .collect()
}

/// Queues the drain's tasks in `db`, drains them with new worker processes and checks that
/// each succeeded on its first attempt.
pub async fn drain_in(cfg: &Config, db: &BenchDb, d: &Drain) -> Result<Drained> {
    {
        let since: DateTime<Utc> = sqlx::query_scalar("select now()")
            .fetch_one(&db.pool)
            .await?;
        queue(db, d).await?;
        let last = pg::last_in_claim_order(&db.pool).await?;
        let before = pg::counters(&db.pool).await?;
        let started = Instant::now();
        let mut workers = Vec::new();
        for slots in shares(d.concurrency, d.workers) {
            let url = d.worker_url.as_deref().unwrap_or(&db.url);
            workers.push(WorkerProcess::spawn_env(
                &cfg.worker_bin,
                url,
                slots,
                &[],
                &d.worker_env,
            )?);
        }
        let cpu_before: Vec<f64> = workers
            .iter()
            .map(|w| crate::process::cpu_secs(w.pid()).unwrap_or(0.0))
            .collect();
        let measured = measure(cfg, db, d, &mut workers, started, last).await;
        let cpu_all: f64 = workers
            .iter()
            .zip(&cpu_before)
            .map(|(w, b)| crate::process::cpu_secs(w.pid()).unwrap_or(*b) - b)
            .sum();
        let mut stopped = Vec::new();
        for w in workers {
            stopped.push(w.stop().await);
        }
        let (wall, cpu, peak_rss, probes) = measured?;
        let mut logs = Vec::new();
        for s in stopped {
            logs.push(s?);
        }
        let after = pg::counters(&db.pool).await?;

        let outcome = pg::outcome_since(&db.pool, Some(since)).await?;
        outcome.check(d.tasks, d.processes)?;
        let per_worker = per_worker(db, since).await?;
        let n = d.tasks as f64;
        let w = d.workload;
        let c = d.concurrency;
        let k = d.workers;
        let drained = if k == 1 {
            format!("drain {} {}, c={c}", d.tasks, d.what)
        } else {
            format!(
                "drain {} {}, c={c} over {k} worker processes",
                d.tasks, d.what
            )
        };
        let mut out = vec![
            Sample::new(
                w,
                format!("{drained}: wall (worker start → all done)"),
                "tasks/s",
                n / wall,
                Target::at_least(d.target),
            ),
            Sample::new(
                w,
                "drain: DB span (max finished_at − min started_at)",
                "tasks/s",
                n / outcome.db_span_secs,
                Target::at_least(d.target),
            ),
            Sample::new(w, "drain: wall time", "s", wall, None),
            Sample::new(
                w,
                if k == 1 {
                    "CPU: worker process".to_owned()
                } else {
                    format!("CPU: the {k} worker processes")
                },
                "s",
                cpu_all,
                None,
            ),
            Sample::new(
                w,
                "CPU: postgres backends of the bench db",
                "s",
                cpu.postgres_db_secs,
                None,
            ),
            Sample::new(
                w,
                "CPU: all postgres processes",
                "s",
                cpu.postgres_all_secs,
                None,
            ),
            Sample::new(
                w,
                "CPU: machine busy (average)",
                "cores",
                cpu.machine_busy_cores,
                None,
            ),
            Sample::new(
                w,
                "DB: commits per task (approx.)",
                "per task",
                (after.commits - before.commits) as f64 / n,
                None,
            ),
            Sample::new(
                w,
                "DB: claims per task (tasks_claimable scans less probes, approx.)",
                "per task",
                (after.claimable_scans - before.claimable_scans - probes) as f64 / n,
                None,
            ),
        ];
        if k > 1 {
            let even = n / k as f64;
            let most = per_worker.first().copied().unwrap_or(0) as f64;
            let least = if per_worker.len() < k {
                0.0
            } else {
                per_worker.last().copied().unwrap_or(0) as f64
            };
            eprintln!("  {w}: tasks run by each of the {k} worker processes: {per_worker:?}");
            out.push(Sample::new(
                w,
                "workers: tasks of the busiest, against an even share",
                "%",
                100.0 * most / even,
                None,
            ));
            out.push(Sample::new(
                w,
                "workers: tasks of the least busy, against an even share",
                "%",
                100.0 * least / even,
                None,
            ));
        }
        if let Some(hwm) = peak_rss {
            out.push(Sample::new(w, "worker peak RSS (VmHWM)", "MB", hwm, None));
        }
        let mut summary = crate::process::LogSummary::default();
        for log in logs {
            summary.warnings += log.warnings;
            summary.errors += log.errors;
            summary.path = summary.path.or(log.path);
            summary.first = summary.first.or(log.first);
        }
        out.extend(summary.samples(w));
        Ok(Drained {
            samples: out,
            rate: n / wall,
            cpu,
            per_worker,
        })
    }
}

/// Tasks created at or after `since` that each worker ran (its last attempt's worker), most
/// first.
async fn per_worker(db: &BenchDb, since: DateTime<Utc>) -> Result<Vec<i64>> {
    Ok(sqlx::query_scalar(
        "select count(*) from sked.tasks where created_at >= $1 and worker_id is not null
          group by worker_id order by count(*) desc",
    )
    .bind(since)
    .fetch_all(&db.pool)
    .await?)
}

async fn queue(db: &BenchDb, d: &Drain) -> Result<()> {
    if d.processes {
        let (stmt, line) = d.copy;
        pg::copy_in(&db.pool, stmt, &pg::copy_data(line, d.tasks)).await?;
        sqlx::query("vacuum analyze sked.tasks")
            .execute(&db.pool)
            .await?;
        Ok(())
    } else {
        pg::queue_noops(&db.pool, d.tasks).await
    }
}

/// Polls every 50 ms until every task is finished; returns the wall time since `started`,
/// the CPU used meanwhile, (for W2) the largest peak RSS of the workers in MB, and the number of probes of
/// the claim index. Until the task queued last in claim order (`last`) has finished, a probe
/// reads only its row: a probe of the claim index walks the entries of every task claimed
/// since the oldest open snapshot began, which W12 keeps open.
async fn measure(
    cfg: &Config,
    db: &BenchDb,
    d: &Drain,
    workers: &mut [WorkerProcess],
    started: Instant,
    last: Option<uuid::Uuid>,
) -> Result<(f64, CpuUse, Option<f64>, i64)> {
    let mut cpu = CpuWatch::start(workers[0].pid(), &db.name);
    let mut probes = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for worker in workers.iter_mut() {
            worker.check_alive()?;
        }
        cpu.sight();
        let last_finished = match last {
            Some(id) => pg::finished(&db.pool, id).await?,
            None => true,
        };
        if last_finished {
            probes += 1;
            if pg::all_finished(&db.pool).await? {
                break;
            }
        }
        if started.elapsed() > cfg.timeout {
            bail!(
                "{}: tasks still unfinished after {:?} (see --timeout-secs)",
                d.workload,
                cfg.timeout
            );
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu.finish();
    let peak = if d.processes {
        None
    } else {
        let mut most: f64 = 0.0;
        for worker in workers.iter() {
            most = most.max(worker.memory_mb("VmHWM")?);
        }
        Some(most)
    };
    Ok((wall, cpu, peak, probes))
}
