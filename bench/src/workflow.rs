//! W6, a DAG end to end: one workflow of a root, `--w6-children` noop children of the root
//! and one sink that depends on every child (fan-out, then fan-in), run by one real
//! `sked-worker`. Timed from the submission to the sink's finish; the database's own times
//! show where it went (submission, release of the children, the drain, the fan-in).
//!
//! With `--w6-map` the children are a map's instances instead: the root (a shell command)
//! writes an array of `--w6-children` numbers to `$SKED_OUTPUT`, a noop task maps over it,
//! and the sink depends on the map; timed from the root's finish (the expansion is part of
//! it) to the sink's.

use std::time::Duration;

use anyhow::{Result, bail};
use serde_json::json;
use tokio::time::Instant;

use crate::config::Config;
use crate::pg::{self, BenchDb};
use crate::process::WorkerProcess;
use crate::report::{Sample, Target};

const W: &str = "W6";
/// Submission to the sink's finish, in seconds.
const TARGET_SECS: f64 = 5.0;

/// The workflow: `root` → `c1` … `cN` → `sink`.
fn spec(children: usize) -> serde_json::Value {
    let names: Vec<String> = (1..=children).map(|i| format!("c{i}")).collect();
    let mut tasks = Vec::with_capacity(children + 2);
    tasks.push(json!({"name": "root", "kind": "noop"}));
    for name in &names {
        tasks.push(json!({"name": name, "kind": "noop", "depends_on": ["root"]}));
    }
    tasks.push(json!({"name": "sink", "kind": "noop", "depends_on": names}));
    json!({"name": "w6-fan-out-fan-in", "tasks": tasks})
}

/// The map workflow: `root` (writes `[0, …, N-1]`) → `m` (a noop map over it) → `sink`.
fn map_spec(children: usize) -> serde_json::Value {
    let script = format!(
        "{{ printf '['; seq -s, 0 {} | tr -d '\\n'; printf ']'; }} > \"$SKED_OUTPUT\"",
        children - 1
    );
    json!({"name": "w6-map", "tasks": [
        {"name": "root", "command": ["sh", "-c", script]},
        {"name": "m", "kind": "noop", "depends_on": ["root"], "map_over": "root",
         "map_max": children},
        {"name": "sink", "kind": "noop", "depends_on": ["m"]},
    ]})
}

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w6", async |db| {
        let mut worker = WorkerProcess::spawn(&cfg.worker_bin, &db.url, cfg.w6_concurrency)?;
        let measured = measure(cfg, db, &mut worker).await;
        let stopped = worker.stop().await;
        let mut out = measured?;
        out.extend(stopped?.samples(W));
        Ok(out)
    })
    .await
}

async fn measure(cfg: &Config, db: &BenchDb, worker: &mut WorkerProcess) -> Result<Vec<Sample>> {
    worker
        .wait_registered(&db.pool, Duration::from_secs(30))
        .await?;
    let n = cfg.w6_children;
    let spec = if cfg.w6_map { map_spec(n) } else { spec(n) };
    // The worker is idle and waiting: the clock runs from the submission.
    let started = Instant::now();
    let id: uuid::Uuid = sqlx::query_scalar("select sked.workflow_submit($1)")
        .bind(&spec)
        .fetch_one(&db.pool)
        .await?;
    let submitted = started.elapsed().as_secs_f64();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        worker.check_alive()?;
        let state: String = sqlx::query_scalar("select state from sked.workflows where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await?;
        if state != "running" {
            if state != "succeeded" {
                bail!("{W}: the workflow ended {state}");
            }
            break;
        }
        if started.elapsed() > cfg.timeout {
            bail!(
                "{W}: the workflow is unfinished after {:?} (see --timeout-secs)",
                cfg.timeout
            );
        }
    }
    let wall = started.elapsed().as_secs_f64();
    if cfg.w6_map {
        return map_samples(cfg, db, id, wall).await;
    }

    // Times from the database clock: created_at is the submitting transaction's start.
    let (tasks, succeeded, attempts, span, released, drained, fan_in): (
        i64,
        i64,
        i64,
        f64,
        f64,
        f64,
        f64,
    ) = sqlx::query_as(
        "with t as (select * from sked.tasks where workflow_id = $1),
              w as (select * from sked.workflows where id = $1),
              root as (select * from t where name = 'root'),
              sink as (select * from t where name = 'sink'),
              kids as (select * from t where name not in ('root', 'sink'))
         select (select count(*) from t),
                (select count(*) from t where state = 'succeeded'),
                (select coalesce(sum(attempt), 0) from t)::bigint,
                extract(epoch from (select finished_at - created_at from w))::float8,
                extract(epoch from (select min(started_at) from kids)
                                   - (select finished_at from root))::float8,
                extract(epoch from (select max(finished_at) - min(started_at) from kids))::float8,
                extract(epoch from (select started_at from sink)
                                   - (select max(finished_at) from kids))::float8",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await?;
    if tasks != n as i64 + 2 || succeeded != tasks || attempts != tasks {
        bail!(
            "{W}: expected {} tasks succeeded on their first attempt, found {succeeded} of {tasks} \
             succeeded with {attempts} attempts",
            n + 2
        );
    }
    Ok(vec![
        Sample::new(
            W,
            format!(
                "fan-out/fan-in of {n} noop children, c={}: submit → sink finished (wall)",
                cfg.w6_concurrency
            ),
            "s",
            wall,
            Target::at_most(TARGET_SECS),
        ),
        Sample::new(
            W,
            "workflow: DB span (workflows.finished_at − created_at)",
            "s",
            span,
            Target::at_most(TARGET_SECS),
        ),
        Sample::new(
            W,
            format!("submit: sked.workflow_submit of {} tasks", n + 2),
            "ms",
            submitted * 1000.0,
            None,
        ),
        Sample::new(
            W,
            "fan-out: root finished → first child started",
            "ms",
            released * 1000.0,
            None,
        ),
        Sample::new(
            W,
            "children: first started → last finished",
            "ms",
            drained * 1000.0,
            None,
        ),
        Sample::new(
            W,
            "fan-in: last child finished → sink started",
            "ms",
            fan_in * 1000.0,
            None,
        ),
    ])
}

/// The figures of the map variant: every task succeeded on its first attempt (the map itself
/// runs nothing), and the times from the root's finish.
async fn map_samples(cfg: &Config, db: &BenchDb, id: uuid::Uuid, wall: f64) -> Result<Vec<Sample>> {
    let n = cfg.w6_children;
    let (tasks, succeeded, attempts, root_to_sink, expanded, drained, fan_in): (
        i64,
        i64,
        i64,
        f64,
        f64,
        f64,
        f64,
    ) = sqlx::query_as(
        "with t as (select * from sked.tasks where workflow_id = $1),
              root as (select * from t where name = 'root'),
              sink as (select * from t where name = 'sink'),
              kids as (select * from t where shard_of is not null)
         select (select count(*) from t),
                (select count(*) from t where state = 'succeeded'),
                (select coalesce(sum(attempt), 0) from t)::bigint,
                extract(epoch from (select finished_at from sink)
                                   - (select finished_at from root))::float8,
                extract(epoch from (select min(started_at) from kids)
                                   - (select finished_at from root))::float8,
                extract(epoch from (select max(finished_at) - min(started_at) from kids))::float8,
                extract(epoch from (select started_at from sink)
                                   - (select max(finished_at) from kids))::float8",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await?;
    if tasks != n as i64 + 3 || succeeded != tasks || attempts != tasks - 1 {
        bail!(
            "{W}: expected {} tasks succeeded, all but the map on their first attempt, found \
             {succeeded} of {tasks} succeeded with {attempts} attempts",
            n + 3
        );
    }
    Ok(vec![
        Sample::new(
            W,
            format!(
                "map of {n} noop instances, c={}: root finished → sink finished",
                cfg.w6_concurrency
            ),
            "s",
            root_to_sink,
            Target::at_most(TARGET_SECS),
        ),
        Sample::new(
            W,
            "map: submit → sink finished (wall, the root's command included)",
            "s",
            wall,
            None,
        ),
        Sample::new(
            W,
            "map: root finished → first instance started (the expansion)",
            "ms",
            expanded * 1000.0,
            None,
        ),
        Sample::new(
            W,
            "map: instances, first started → last finished",
            "ms",
            drained * 1000.0,
            None,
        ),
        Sample::new(
            W,
            "map: last instance finished → sink started",
            "ms",
            fan_in * 1000.0,
            None,
        ),
    ])
}
