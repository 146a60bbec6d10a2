//! W2 and W4, drain throughput: queue tasks first, then start one real `sked-worker` and
//! time it from its start until no task is left unfinished. W2 drains noop tasks (the
//! overhead of sked itself) and reads the worker's peak RSS; W4 drains real processes.

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
    concurrency: usize,
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
            copy: ("copy sked.tasks (kind) from stdin", "noop\n"),
            processes: false,
            target: 50_000.0,
        }
    }
}

pub async fn w2(cfg: &Config) -> Result<Vec<Sample>> {
    run(cfg, Drain::noops("W2", cfg)).await
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
    /// Tasks per second of wall time, from the worker's start until all were done.
    pub rate: f64,
    /// CPU used meanwhile by the worker and by PostgreSQL.
    pub cpu: CpuUse,
}

/// Queues the drain's tasks in `db`, drains them with a new worker process and checks that
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
        let mut worker = WorkerProcess::spawn(&cfg.worker_bin, &db.url, d.concurrency)?;
        let measured = measure(cfg, db, d, &mut worker, started, last).await;
        let stopped = worker.stop().await;
        let (wall, cpu, peak_rss, probes) = measured?;
        let log = stopped?;
        let after = pg::counters(&db.pool).await?;

        let outcome = pg::outcome_since(&db.pool, Some(since)).await?;
        outcome.check(d.tasks, d.processes)?;
        let n = d.tasks as f64;
        let w = d.workload;
        let c = d.concurrency;
        let mut out = vec![
            Sample::new(
                w,
                format!(
                    "drain {} {}, c={c}: wall (worker start → all done)",
                    d.tasks, d.what
                ),
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
            Sample::new(w, "CPU: worker process", "s", cpu.worker_secs, None),
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
        if let Some(hwm) = peak_rss {
            out.push(Sample::new(w, "worker peak RSS (VmHWM)", "MB", hwm, None));
        }
        out.extend(log.samples(w));
        Ok(Drained {
            samples: out,
            rate: n / wall,
            cpu,
        })
    }
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
/// the CPU used meanwhile, (for W2) the worker's peak RSS in MB, and the number of probes of
/// the claim index. Until the task queued last in claim order (`last`) has finished, a probe
/// reads only its row: a probe of the claim index walks the entries of every task claimed
/// since the oldest open snapshot began, which W12 keeps open.
async fn measure(
    cfg: &Config,
    db: &BenchDb,
    d: &Drain,
    worker: &mut WorkerProcess,
    started: Instant,
    last: Option<uuid::Uuid>,
) -> Result<(f64, CpuUse, Option<f64>, i64)> {
    let mut cpu = CpuWatch::start(worker.pid(), &db.name);
    let mut probes = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        worker.check_alive()?;
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
        Some(worker.memory_mb("VmHWM")?)
    };
    Ok((wall, cpu, peak, probes))
}
