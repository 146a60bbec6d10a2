//! W17, many worker processes: W2's drain with the same total slots shared by 1, 2, 4, 8 and
//! 16 `sked-worker` processes (`--w17-processes`), each drain's rate and how evenly the
//! processes shared the tasks; then what idle workers cost the database: `--w17-idle-workers`
//! processes with nothing due, and the transactions PostgreSQL counted for the database over
//! `--w17-idle-secs`, per worker and second. With `--w17-pooler` the drains' workers go
//! through a PgBouncer in transaction mode (W18's), as processes whose connections do not
//! fit the server's `max_connections` must.
//!
//! A control follows the counts: one process with the slots of one of the most processes
//! (2,000 / 8 = 250 by default). Against the first count it says how much of a drop is the
//! slots each process has (its claims and finishes are that many times smaller, and each
//! statement costs the database a fixed part whatever its rows) rather than the number of
//! processes.

use std::time::Duration;

use anyhow::Result;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::config::Config;
use crate::drain::{self, Drain};
use crate::pg;
use crate::process::WorkerProcess;
use crate::report::{Sample, Target};

const W: &str = "W17";

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    let bouncer = match cfg.w17_pooler {
        true => Some(crate::pooler::PgBouncer::start(cfg).await?),
        false => None,
    };
    let result = measure(cfg, bouncer.as_ref()).await;
    if let Some(bouncer) = bouncer {
        bouncer.stop().await;
    }
    result
}

async fn measure(cfg: &Config, bouncer: Option<&crate::pooler::PgBouncer>) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    let mut single = None;
    let mut failed = Vec::new();
    let most = cfg.w17_processes.iter().copied().max().unwrap_or(1);
    // Each count, then the control: one process with a share of the slots (see above).
    let mut drains: Vec<(usize, usize)> = cfg
        .w17_processes
        .iter()
        .map(|&n| (n, cfg.w2_concurrency))
        .collect();
    if most > 1 {
        drains.push((1, drain::shares(cfg.w2_concurrency, most)[0]));
    }
    for (n, slots) in drains {
        let control = slots < cfg.w2_concurrency;
        let drained = match pg::with_db(&cfg.database_url, "w17", async |db| {
            let mut d = Drain::noops(W, cfg);
            d.workers = n;
            d.concurrency = slots;
            if let Some(bouncer) = bouncer {
                bouncer.route(&mut d, &db.url)?;
            }
            drain::drain_in(cfg, db, &d).await
        })
        .await
        {
            Ok(drained) => drained,
            Err(e) => {
                // The other counts still run (too many processes for the server's
                // max_connections, say); the error is reported.
                eprintln!("  W17: {n} processes, {slots} slots: the drain failed: {e:#}");
                failed.push(format!("{n} processes, {slots} slots: {e:#}"));
                continue;
            }
        };
        if control {
            eprintln!(
                "  W17: 1 process with the {slots} slots of one of {most}: {:.0} tasks/s",
                drained.rate
            );
            let label = format!("1 process, {slots} slots (one of {most}'s share)");
            push_cpu(&mut samples, &label, &drained);
            samples.push(Sample::new(
                W,
                format!("{label}: drain {} noop tasks (wall)", cfg.tasks),
                "tasks/s",
                drained.rate,
                None,
            ));
            if let Some(first) = single {
                samples.push(Sample::new(
                    W,
                    format!("{label}: rate against the first count's"),
                    "%",
                    100.0 * drained.rate / first,
                    None,
                ));
            }
            continue;
        }
        let even = cfg.tasks as f64 / n as f64;
        let least = if drained.per_worker.len() < n {
            0
        } else {
            drained.per_worker.last().copied().unwrap_or(0)
        };
        let most = drained.per_worker.first().copied().unwrap_or(0);
        eprintln!(
            "  W17: {n} processes: {:.0} tasks/s; tasks per worker {:?}",
            drained.rate, drained.per_worker
        );
        push_cpu(&mut samples, &format!("{n:>2} processes"), &drained);
        let single_rate = *single.get_or_insert(drained.rate);
        samples.push(Sample::new(
            W,
            format!(
                "{n:>2} processes, {} slots in all: drain {} noop tasks (wall)",
                cfg.w2_concurrency, cfg.tasks
            ),
            "tasks/s",
            drained.rate,
            None,
        ));
        if n > 1 {
            samples.push(Sample::new(
                W,
                format!("{n:>2} processes: rate against the first count's"),
                "%",
                100.0 * drained.rate / single_rate,
                Target::at_least(100.0),
            ));
            samples.push(Sample::new(
                W,
                format!("{n:>2} processes: tasks of the least busy, against an even share"),
                "%",
                100.0 * least as f64 / even,
                None,
            ));
            samples.push(Sample::new(
                W,
                format!("{n:>2} processes: tasks of the busiest, against an even share"),
                "%",
                100.0 * most as f64 / even,
                None,
            ));
        }
    }
    for &n in &cfg.w17_idle_workers {
        let per_worker = pg::with_db(&cfg.database_url, "w17", async |db| {
            idle_cost(cfg, bouncer, &db.url, &db.pool, n).await
        })
        .await?;
        eprintln!("  W17: {n} idle workers: {per_worker:.3} transactions/s each");
        samples.push(Sample::new(
            W,
            format!(
                "{n:>2} idle workers: transactions per worker and second ({} s)",
                cfg.w17_idle.as_secs()
            ),
            "per s",
            per_worker,
            Target::at_most(1.0),
        ));
    }
    if !failed.is_empty() {
        for s in &samples {
            eprintln!(
                "  {:<60} {}",
                s.metric,
                crate::report::format_value(s.value, s.unit)
            );
        }
        anyhow::bail!("drains failed: {}", failed.join("; "));
    }
    Ok(samples)
}

/// Where the time of a drain went, as `label: …` samples: on a machine whose cores the
/// workers share with PostgreSQL, the workers' CPU and the statements per task decide how the
/// rate scales.
fn push_cpu(samples: &mut Vec<Sample>, label: &str, drained: &drain::Drained) {
    for s in &drained.samples {
        if s.metric.starts_with("CPU: ") || s.metric.starts_with("DB: commits") {
            samples.push(Sample::new(
                W,
                format!("{label}: {}", s.metric),
                s.unit,
                s.value,
                None,
            ));
        }
    }
}

/// Transactions (commits and rollbacks) the database counted, from a fresh snapshot of the
/// statistics.
pub async fn transactions(pool: &PgPool) -> Result<i64> {
    let mut conn = pool.acquire().await?;
    sqlx::query("select pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await?;
    Ok(sqlx::query_scalar(
        "select xact_commit + xact_rollback from pg_stat_database
          where datname = current_database()",
    )
    .fetch_one(&mut *conn)
    .await?)
}

/// Starts `n` workers on an empty database, lets them settle, and returns the transactions
/// per worker and second the database counted over `--w17-idle-secs`. A backend reports its
/// counts at the end of a transaction at most once a second, and within 10 s once idle, so
/// the window's ends are each off by up to 10 s of the workers' traffic (most of it cancels
/// out), and the benchmark's own statements (two per reading) are taken off.
async fn idle_cost(
    cfg: &Config,
    bouncer: Option<&crate::pooler::PgBouncer>,
    url: &str,
    pool: &PgPool,
    n: usize,
) -> Result<f64> {
    let (worker_url, env) = match bouncer {
        Some(bouncer) => bouncer.worker_route(url)?,
        None => (url.to_owned(), Vec::new()),
    };
    let own = PgPoolOptions::new().max_connections(1).connect(url).await?;
    let mut workers = Vec::new();
    let result = async {
        for slots in drain::shares(cfg.w2_concurrency, n) {
            workers.push(WorkerProcess::spawn_env(
                &cfg.worker_bin,
                &worker_url,
                slots,
                &[],
                &env,
            )?);
        }
        for w in workers.iter_mut() {
            w.wait_registered(pool, Duration::from_secs(30)).await?;
        }
        // Past the start-up (schema check, registration, the first run of every duty) and
        // the 10 s within which an idle backend reports its counts.
        tokio::time::sleep(Duration::from_secs(12)).await;
        let before = transactions(&own).await?;
        tokio::time::sleep(cfg.w17_idle).await;
        for w in workers.iter_mut() {
            w.check_alive()?;
        }
        let after = transactions(&own).await?;
        let secs = cfg.w17_idle.as_secs_f64();
        Ok(((after - before - 2).max(0) as f64) / secs / n as f64)
    }
    .await;
    for w in workers {
        w.stop().await?;
    }
    own.close().await;
    result
}
