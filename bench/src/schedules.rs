//! W7, cron schedules without drift: `--w7-schedules` schedules (default 1,000) fire every
//! second (`* * * * * *`, a noop task each) for `--w7-secs`, fired by the background upkeep of
//! one real worker process, which also runs the occurrences. An occurrence's lateness is
//! `started_at − next_run_at`, where next_run_at is its tick (the schedules have no jitter):
//! the time from the tick to the start of the claim that ran it, on the database clock. Drift
//! shows as ticks that did not fire on time: any `skipped` or `missed` run, and any gap in a
//! schedule's sequence of fired ticks.

use std::time::Duration;

use anyhow::{Result, bail};
use sqlx::PgPool;

use crate::config::Config;
use crate::pg;
use crate::process::WorkerProcess;
use crate::report::{Sample, Target};

const W: &str = "W7";
/// The target for the 99th percentile of lateness, in milliseconds.
const P99_TARGET_MS: f64 = 100.0;
/// Ticks of the first seconds are left out of the percentiles (the worker starts up).
const WARM_UP_SECS: f64 = 2.0;

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w7", async |db| {
        let n = cfg.w7_schedules;
        sqlx::query(
            "insert into sked.schedules (name, cron, task, overlap_policy)
             select 'every second ' || g, '* * * * * *', '{\"kind\": \"noop\"}', 'skip'
               from generate_series(1, $1) g",
        )
        .bind(n as i32)
        .execute(&db.pool)
        .await?;
        let mut worker = WorkerProcess::spawn(&cfg.worker_bin, &db.url, cfg.w7_concurrency)?;
        let measured = async {
            worker
                .wait_registered(&db.pool, Duration::from_secs(30))
                .await?;
            let start: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select now()")
                .fetch_one(&db.pool)
                .await?;
            tokio::time::sleep(cfg.w7_duration).await;
            worker.check_alive()?;
            let stop: chrono::DateTime<chrono::Utc> =
                sqlx::query_scalar("update sked.schedules set paused_at = now() returning now()")
                    .fetch_one(&db.pool)
                    .await?;
            wait_all_finished(&db.pool, &mut worker).await?;
            Ok::<_, anyhow::Error>((start, stop))
        }
        .await;
        let stopped = worker.stop().await;
        let (start, stop) = measured?;
        let log = stopped?;

        let from = start + chrono::Duration::milliseconds((WARM_UP_SECS * 1000.0) as i64);
        let (count, p, max, min): (i64, Option<Vec<f64>>, Option<f64>, Option<f64>) =
            sqlx::query_as(
                "select count(*), percentile_cont(array[0.5, 0.9, 0.99]) within group (order by ms),
                        max(ms), min(ms)
                   from (select extract(epoch from t.started_at - t.next_run_at)::float8 * 1000 as ms
                           from sked.schedule_runs r join sked.tasks t on t.id = r.task_id
                          where r.fire_at >= $1 and r.fire_at <= $2) l",
            )
            .bind(from)
            .bind(stop)
            .fetch_one(&db.pool)
            .await?;
        let (Some(p), Some(max), Some(min)) = (p, max, min) else {
            bail!("W7: no occurrence fired between {from} and {stop}");
        };
        if min < 0.0 {
            bail!("W7: an occurrence started {:.3} ms before its tick", -min);
        }
        // Ticks that should have fired in the window, against what did.
        let (expected, fired, skipped, missed, gaps, lead_p50): (i64, i64, i64, i64, i64, Option<f64>) =
            sqlx::query_as(
                "with ticks as (
                   select count(*) as n from generate_series(date_trunc('second', $1::timestamptz)
                                                              + interval '1 second', $2::timestamptz,
                                                              interval '1 second')
                 ), fired as (
                   select r.schedule_id, r.fire_at,
                          r.fire_at - lag(r.fire_at) over (partition by r.schedule_id order by r.fire_at) as step
                     from sked.schedule_runs r where r.outcome = 'fired'
                 )
                 select (select n from ticks) * (select count(*) from sked.schedules),
                        (select count(*) from sked.schedule_runs
                          where outcome = 'fired' and fire_at > $1 and fire_at <= $2),
                        (select count(*) from sked.schedule_runs where outcome = 'skipped'),
                        (select coalesce(sum(missed_ticks), 0) from sked.schedule_runs where outcome = 'missed'),
                        (select count(*) from fired where step > interval '1 second'),
                        (select percentile_cont(0.5) within group (order by
                                  extract(epoch from t.next_run_at - t.created_at)::float8 * 1000)
                           from sked.schedule_runs r join sked.tasks t on t.id = r.task_id
                          where r.fire_at >= $1 and r.fire_at <= $2)",
            )
            .bind(start)
            .bind(stop)
            .fetch_one(&db.pool)
            .await?;

        let secs = cfg.w7_duration.as_secs_f64();
        let label = format!("{n} schedules every second for {secs} s");
        let mut out = vec![
            Sample::new(W, format!("lateness p50 ({label})"), "ms", p[0], None),
            Sample::new(W, format!("lateness p90 ({label})"), "ms", p[1], None),
            Sample::new(
                W,
                format!("lateness p99 ({label})"),
                "ms",
                p[2],
                Target::at_most(P99_TARGET_MS),
            ),
            Sample::new(W, format!("lateness max ({label})"), "ms", max, None),
            Sample::new(W, "occurrences measured", "tasks", count as f64, None),
            Sample::new(W, "ticks due in the window", "ticks", expected as f64, None),
            Sample::new(W, "ticks fired in the window", "ticks", fired as f64, None),
            Sample::new(W, "ticks skipped (overlap)", "ticks", skipped as f64, Target::at_most(0.0)),
            Sample::new(W, "ticks missed (misfire)", "ticks", missed as f64, Target::at_most(0.0)),
            Sample::new(W, "gaps in a schedule's fired ticks", "gaps", gaps as f64, Target::at_most(0.0)),
        ];
        if let Some(lead) = lead_p50 {
            out.push(Sample::new(W, "occurrence queued before its tick, p50", "ms", lead, None));
        }
        out.extend(log.samples(W));
        Ok(out)
    })
    .await
}

async fn wait_all_finished(pool: &PgPool, worker: &mut WorkerProcess) -> Result<()> {
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    while !pg::all_finished(pool).await? {
        worker.check_alive()?;
        if tokio::time::Instant::now() > until {
            bail!("W7: occurrences still unfinished a minute after the schedules were paused");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
