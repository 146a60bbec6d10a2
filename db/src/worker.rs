//! The worker functions of the SQL contract: registry, claim, finish, leases and rescue.

use chrono::{DateTime, Utc};
use sked_types::{TaskKind, TaskState, Worker};
use sqlx::postgres::PgRow;
use sqlx::postgres::types::PgInterval;
use sqlx::{FromRow, PgPool, Row};
use std::time::Duration;
use uuid::Uuid;

use crate::Result;
use crate::task::interval_secs;
use crate::text::Text;

/// What a worker tells the registry about itself.
#[derive(Debug, Clone)]
pub struct Registration {
    pub id: Uuid,
    pub name: String,
    pub host: String,
    pub pid: i32,
    pub version: String,
    pub queues: Vec<String>,
    pub labels: Vec<String>,
    pub concurrency: i32,
    pub lease: Duration,
    /// The CPU millicores and memory MB it offers to tasks' requests (`None`: not advertised).
    pub cpu_millis: Option<i32>,
    pub memory_mb: Option<i32>,
}

pub fn pg_interval(d: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: d.as_micros().min(i64::MAX as u128) as i64,
    }
}

pub async fn register(pool: &PgPool, r: &Registration) -> Result<()> {
    sqlx::query("select sked.worker_register($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
        .bind(r.id)
        .bind(&r.name)
        .bind(&r.host)
        .bind(r.pid)
        .bind(&r.version)
        .bind(&r.queues)
        .bind(&r.labels)
        .bind(r.concurrency)
        .bind(pg_interval(r.lease))
        .bind(r.cpu_millis)
        .bind(r.memory_mb)
        .execute(crate::on(pool))
        .await?;
    Ok(())
}

pub async fn deregister(pool: &PgPool, id: Uuid) -> Result<()> {
    sqlx::query("select sked.worker_deregister($1)")
        .bind(id)
        .execute(crate::on(pool))
        .await?;
    Ok(())
}

/// Marks the worker as stopping (it claims nothing more).
pub async fn mark_stopping(pool: &PgPool, id: Uuid) -> Result<()> {
    sqlx::query("select sked.worker_stopping($1)")
        .bind(id)
        .execute(crate::on(pool))
        .await?;
    Ok(())
}

/// Refreshes the worker's heartbeat; false when its row is gone.
pub async fn touch(pool: &PgPool, id: Uuid) -> Result<bool> {
    Ok(sqlx::query_scalar("select sked.worker_touch($1)")
        .bind(id)
        .fetch_one(crate::on(pool))
        .await?)
}

/// What a worker needs of a claimed task to run it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Claimed {
    pub id: Uuid,
    pub attempt: i32,
    pub queue: String,
    #[sqlx(try_from = "Text<TaskKind>")]
    pub kind: TaskKind,
    pub command: Option<Vec<String>>,
    pub args: Vec<String>,
    pub artifact_url: Option<String>,
    pub artifact_sha256: Option<String>,
    pub input: Option<serde_json::Value>,
    pub env: serde_json::Value,
    pub timeout: Option<PgInterval>,
    pub output_path: Option<String>,
    /// The outputs of the task's parents, `{"<parent name>": <output>, ...}`; fetched only
    /// for commands that have parents (`sked.task_parent_outputs`).
    #[sqlx(default)]
    pub parent_outputs: Option<serde_json::Value>,
    /// The parameters of its workflow, for commands of a workflow that has them
    /// (`sked.workflow_params`; `SKED_PARAMS`).
    #[sqlx(default)]
    pub params: Option<serde_json::Value>,
    /// A shard's position and the number of shards of its task (see `docs/shards.md`).
    pub shard_index: Option<i32>,
    pub shard_total: Option<i32>,
    /// An instance of a map: its input is its element (`SKED_MAP_ITEM`, `SKED_MAP_INDEX`;
    /// see "Map" in `docs/workflows.md`).
    #[sqlx(default)]
    pub map_instance: bool,
    /// Requested CPU (millicores) and memory (MB), also the task's limits; the cap on its
    /// stdout and stderr bytes; the user it runs as (see `docs/runtime.md`).
    pub cpu_millis: Option<i32>,
    pub memory_mb: Option<i32>,
    pub max_output_bytes: Option<i64>,
    pub run_as: Option<String>,
    /// The task's priority, and whether it may be stopped to make room for a copy of a
    /// service (see "Services first" in `docs/runtime.md`).
    pub priority: i32,
    pub preemptible: bool,
    /// When the task was due: its `next_run_at` before the claim (where the claim answers it).
    #[sqlx(default)]
    pub next_run_at: Option<DateTime<Utc>>,
}

impl Claimed {
    /// The environment as a map (the schema guarantees an object of strings).
    pub fn env_map(&self) -> std::collections::BTreeMap<String, String> {
        crate::task::env_map(&self.env)
    }

    /// The timeout of one attempt.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
            .as_ref()
            .map(|t| Duration::from_secs_f64(interval_secs(t).max(0.0)))
    }
}

/// The free capacity a claim may fill: CPU millicores and memory MB not held by the
/// worker's running attempts; `None` in a dimension the worker does not advertise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Free {
    pub cpu_millis: Option<i32>,
    pub memory_mb: Option<i32>,
}

/// Claims up to `limit` due tasks (see `sked.tasks_claim`), as a worker that advertises no
/// capacity: by slots and labels only. Only the columns a worker needs travel back, and the
/// parents' outputs only for commands that have parents.
pub async fn claim(
    pool: &PgPool,
    worker: Uuid,
    queues: &[String],
    labels: &[String],
    limit: i32,
    lease: Duration,
) -> Result<Vec<Claimed>> {
    Ok(
        claim_within(pool, worker, queues, labels, limit, lease, Free::default())
            .await?
            .tasks,
    )
}

/// What one claim took, and the database time it took it at (its `now`, also when it found
/// nothing): the tasks due by then that it did not take are not this worker's to take now.
#[derive(Debug, Clone)]
pub struct Claim {
    pub at: DateTime<Utc>,
    pub tasks: Vec<Claimed>,
    /// The position in claim order of the last task it took (see [`Position`]).
    pub last: Option<Position>,
}

/// A place in claim order (`priority` descending, then `next_run_at`, then `id`), where a
/// worker of one queue may start its next claim: see "Positions" at `sked.tasks_claim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub priority: i32,
    pub next_run_at: DateTime<Utc>,
    pub id: Uuid,
}

impl Position {
    /// Whether `self` comes after `other` in claim order.
    pub fn after(&self, other: &Position) -> bool {
        match self.priority.cmp(&other.priority) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Greater => false,
            std::cmp::Ordering::Equal => {
                (self.next_run_at, self.id) > (other.next_run_at, other.id)
            }
        }
    }
}

/// Claims up to `limit` due tasks whose CPU and memory requests fit `free`, the capacity the
/// worker's running attempts leave (see `docs/runtime.md`), also answering the claim's time.
pub async fn claim_within(
    pool: &PgPool,
    worker: Uuid,
    queues: &[String],
    labels: &[String],
    limit: i32,
    lease: Duration,
    free: Free,
) -> Result<Claim> {
    claim_after(pool, worker, queues, labels, limit, lease, free, None).await
}

/// [`claim_within`], starting after `after` in claim order when given (a worker of one queue:
/// see "Positions" at `sked.tasks_claim`). The claim runs once in a CTE; the outer join
/// yields one row of nulls with the time when it took nothing.
#[allow(clippy::too_many_arguments)]
pub async fn claim_after(
    pool: &PgPool,
    worker: Uuid,
    queues: &[String],
    labels: &[String],
    limit: i32,
    lease: Duration,
    free: Free,
    after: Option<Position>,
) -> Result<Claim> {
    let rows = sqlx::query(
        "with c as (select * from sked.tasks_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10))
         select now() as claimed_at, c.id, c.attempt, c.queue, c.kind, c.command, c.args,
                c.artifact_url, c.artifact_sha256, c.input, c.env, c.timeout, c.output_path,
                c.shard_index, c.shard_total, c.cpu_millis, c.memory_mb, c.max_output_bytes,
                c.run_as, c.priority, c.preemptible, c.next_run_at,
                c.map_over is not null and c.shard_of is not null as map_instance,
                case when c.parents > 0 and c.kind = 'command'
                     then sked.task_parent_outputs(c.id) end as parent_outputs,
                case when c.workflow_id is not null and c.kind = 'command'
                     then sked.workflow_params(c.workflow_id) end as params
           from (values (0)) as one(x) left join c on true",
    )
    .bind(worker)
    .bind(queues)
    .bind(labels)
    .bind(limit)
    .bind(pg_interval(lease))
    .bind(free.cpu_millis)
    .bind(free.memory_mb)
    .bind(after.map(|p| p.priority))
    .bind(after.map(|p| p.next_run_at))
    .bind(after.map(|p| p.id))
    .fetch_all(crate::on(pool))
    .await?;
    let mut at = None;
    let mut last: Option<Position> = None;
    let mut tasks = Vec::with_capacity(rows.len());
    let mut unreadable = Vec::new();
    for row in &rows {
        at = Some(row.try_get("claimed_at")?);
        if let Some(id) = row.try_get::<Option<Uuid>, _>("id")? {
            let here = Position {
                priority: row.try_get("priority")?,
                next_run_at: row.try_get("next_run_at")?,
                id,
            };
            if last.is_none_or(|l| here.after(&l)) {
                last = Some(here);
            }
            match read_claimed(row)? {
                Ok(task) => tasks.push(task),
                Err(failed) => unreadable.push(failed),
            }
        }
    }
    fail_unreadable(pool, &unreadable).await?;
    let at = at.ok_or(sqlx::Error::RowNotFound)?;
    Ok(Claim { at, tasks, last })
}

/// A claimed row as the worker runs it, or, when a column of it cannot be read (a JSON value
/// this program cannot hold, in a row older than the rule that refuses them), the failure of
/// its attempt: one row that cannot be read fails its own task, never the claim that took it
/// with others.
fn read_claimed(row: &PgRow) -> sqlx::Result<std::result::Result<Claimed, Finished>> {
    Ok(match Claimed::from_row(row) {
        Ok(task) => Ok(task),
        Err(e) => Err(Finished::unreadable(
            row.try_get("id")?,
            row.try_get("attempt")?,
            &e,
        )),
    })
}

/// Writes the failures of claimed rows that could not be read (see [`read_claimed`]).
async fn fail_unreadable(pool: &PgPool, failed: &[Finished]) -> Result<()> {
    if failed.is_empty() {
        return Ok(());
    }
    for f in failed {
        tracing::warn!(task = %f.id, attempt = f.attempt, error = f.error.as_deref().unwrap_or(""),
            "a claimed task's row cannot be read: its attempt fails");
    }
    finish(pool, failed).await?;
    Ok(())
}

/// Claims the copy of a service that has waited longest for room, when it fits `reclaimable`:
/// the worker's free capacity plus what its running preemptible attempts hold (see
/// `sked.copies_claim_preempting`). The worker makes room by stopping some of them.
pub async fn claim_copy_preempting(
    pool: &PgPool,
    worker: Uuid,
    queues: &[String],
    labels: &[String],
    lease: Duration,
    reclaimable: Free,
) -> Result<Option<Claimed>> {
    let row = sqlx::query(
        "select c.id, c.attempt, c.queue, c.kind, c.command, c.args, c.artifact_url,
                c.artifact_sha256, c.input, c.env, c.timeout, c.output_path, c.shard_index,
                c.shard_total, c.cpu_millis, c.memory_mb, c.max_output_bytes, c.run_as,
                c.priority, c.preemptible, null::jsonb as parent_outputs
           from sked.copies_claim_preempting($1, $2, $3, $4, $5, $6) c",
    )
    .bind(worker)
    .bind(queues)
    .bind(labels)
    .bind(pg_interval(lease))
    .bind(reclaimable.cpu_millis)
    .bind(reclaimable.memory_mb)
    .fetch_optional(crate::on(pool))
    .await?;
    match row.as_ref().map(read_claimed).transpose()? {
        Some(Ok(copy)) => Ok(Some(copy)),
        Some(Err(failed)) => {
            fail_unreadable(pool, &[failed]).await?;
            Ok(None)
        }
        None => Ok(None),
    }
}

/// Seconds from now (the database's) until the earliest claimable task of these queues due at
/// or after `from` (see `sked.tasks_due_from`): zero or less when one became due meanwhile,
/// infinite for a task due at `infinity`, `None` when there is none.
pub async fn next_due_from(
    pool: &PgPool,
    queues: &[String],
    from: DateTime<Utc>,
) -> Result<Option<f64>> {
    Ok(sqlx::query_scalar(
        "select (extract(epoch from sked.tasks_due_from($1, $2)) - extract(epoch from now()))::float8",
    )
    .bind(queues)
    .bind(from)
    .fetch_one(crate::on(pool))
    .await?)
}

/// How an attempt ended, as `sked.tasks_finish` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    TimedOut,
    Cancelled,
    /// The worker shut down and hands the task back.
    Interrupted,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::Cancelled => "cancelled",
            Outcome::Interrupted => "interrupted",
        }
    }
}

/// The end of one attempt, to be written by [`finish`].
#[derive(Debug, Clone)]
pub struct Finished {
    pub id: Uuid,
    pub attempt: i32,
    pub outcome: Outcome,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub stdout_tail: Option<String>,
    pub stderr_tail: Option<String>,
    pub output_sha256: Option<String>,
    /// The JSON output of a successful attempt (see `docs/workflows.md`).
    pub output: Option<serde_json::Value>,
}

impl Finished {
    /// A claimed attempt whose row the worker could not read, failed without running.
    pub fn unreadable(id: Uuid, attempt: i32, why: &dyn std::fmt::Display) -> Finished {
        Finished {
            id,
            attempt,
            outcome: Outcome::Failed,
            exit_code: None,
            error: Some(format!("the worker could not read the task: {why}")),
            stdout_tail: None,
            stderr_tail: None,
            output_sha256: None,
            output: None,
        }
    }

    /// An attempt the worker hands back without having run it: `interrupted`, so the task
    /// waits again uncharged, with `why` as its error.
    pub fn handed_back(id: Uuid, attempt: i32, why: String) -> Finished {
        Finished {
            id,
            attempt,
            outcome: Outcome::Interrupted,
            exit_code: None,
            error: Some(format!("handed back: {why}")),
            stdout_tail: None,
            stderr_tail: None,
            output_sha256: None,
            output: None,
        }
    }
}

/// Writes a batch of finished attempts with one statement, fenced by (id, running, attempt).
/// Returns, in input order, the new state of each attempt's task, or `None` for an attempt
/// whose lease was lost (its task was rescued or cancelled by someone else): that result is
/// discarded.
pub async fn finish(pool: &PgPool, batch: &[Finished]) -> Result<Vec<Option<TaskState>>> {
    let rows: Vec<(Uuid, Text<TaskState>)> = sqlx::query_as(
        "select id, state from sked.tasks_finish($1, $2, $3, $4, $5, $6, $7, $8, $9)",
    )
    .bind(batch.iter().map(|f| f.id).collect::<Vec<_>>())
    .bind(batch.iter().map(|f| f.attempt).collect::<Vec<_>>())
    .bind(batch.iter().map(|f| f.outcome.as_str()).collect::<Vec<_>>())
    .bind(batch.iter().map(|f| f.exit_code).collect::<Vec<_>>())
    .bind(batch.iter().map(|f| f.error.clone()).collect::<Vec<_>>())
    .bind(
        batch
            .iter()
            .map(|f| f.stdout_tail.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        batch
            .iter()
            .map(|f| f.stderr_tail.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        batch
            .iter()
            .map(|f| f.output_sha256.clone())
            .collect::<Vec<_>>(),
    )
    .bind(batch.iter().map(|f| f.output.clone()).collect::<Vec<_>>())
    .fetch_all(crate::on(pool))
    .await?;
    let by_id: std::collections::HashMap<Uuid, TaskState> = rows
        .into_iter()
        .map(|(id, Text(state))| (id, state))
        .collect();
    Ok(batch.iter().map(|f| by_id.get(&f.id).copied()).collect())
}

/// Renews the leases of the given attempts in one statement. Returns the attempts still
/// held, each with whether its cancel was requested.
pub async fn renew_leases(
    pool: &PgPool,
    worker: Uuid,
    held: &[(Uuid, i32)],
    lease: Duration,
) -> Result<Vec<(Uuid, i32, bool)>> {
    Ok(sqlx::query_as(
        "select id, attempt, cancel_requested from sked.tasks_renew_leases($1, $2, $3, $4)",
    )
    .bind(worker)
    .bind(held.iter().map(|h| h.0).collect::<Vec<_>>())
    .bind(held.iter().map(|h| h.1).collect::<Vec<_>>())
    .bind(pg_interval(lease))
    .fetch_all(crate::on(pool))
    .await?)
}

/// The attempts the database counts as `worker`'s: its running tasks, as (task, attempt).
pub async fn attempts_of(pool: &PgPool, worker: Uuid) -> Result<Vec<(Uuid, i32)>> {
    Ok(
        sqlx::query_as("select id, attempt from sked.worker_attempts($1)")
            .bind(worker)
            .fetch_all(crate::on(pool))
            .await?,
    )
}

/// The attempts among those given whose cancel was requested.
pub async fn cancel_requested(pool: &PgPool, held: &[(Uuid, i32)]) -> Result<Vec<(Uuid, i32)>> {
    Ok(
        sqlx::query_as("select id, attempt from sked.tasks_cancel_requested($1, $2)")
            .bind(held.iter().map(|h| h.0).collect::<Vec<_>>())
            .bind(held.iter().map(|h| h.1).collect::<Vec<_>>())
            .fetch_all(crate::on(pool))
            .await?,
    )
}

/// Takes back running tasks whose lease expired; returns (id, new state) for each.
pub async fn rescue(pool: &PgPool) -> Result<Vec<(Uuid, TaskState)>> {
    let rows: Vec<(Uuid, Text<TaskState>)> =
        sqlx::query_as("select id, state from sked.tasks_rescue()")
            .fetch_all(crate::on(pool))
            .await?;
    Ok(rows
        .into_iter()
        .map(|(id, Text(state))| (id, state))
        .collect())
}

/// Appends log chunks: (task, attempt, stream, data) each.
pub async fn append_logs(
    pool: &PgPool,
    chunks: &[(Uuid, i32, &'static str, String)],
) -> Result<()> {
    if chunks.is_empty() {
        return Ok(());
    }
    sqlx::query("select sked.task_logs_append($1, $2, $3, $4)")
        .bind(chunks.iter().map(|c| c.0).collect::<Vec<_>>())
        .bind(chunks.iter().map(|c| c.1).collect::<Vec<_>>())
        .bind(chunks.iter().map(|c| c.2).collect::<Vec<_>>())
        .bind(chunks.iter().map(|c| c.3.clone()).collect::<Vec<_>>())
        .execute(crate::on(pool))
        .await?;
    Ok(())
}

/// The content of an artifact stored in Postgres, if present.
pub async fn artifact(pool: &PgPool, sha256: &str) -> Result<Option<Vec<u8>>> {
    Ok(sqlx::query_scalar("select sked.artifact_get($1)")
        .bind(sha256)
        .fetch_one(crate::on(pool))
        .await?)
}

/// Stores bytes as an artifact; returns its SHA-256 (hex).
pub async fn put_artifact(pool: &PgPool, content: &[u8]) -> Result<String> {
    use sha2::Digest;
    let sha = hex::encode(sha2::Sha256::digest(content));
    sqlx::query("select sked.artifact_put($1, $2)")
        .bind(&sha)
        .bind(content)
        .execute(crate::on(pool))
        .await?;
    Ok(sha)
}

/// The worker registry with liveness and running counts.
pub async fn list(pool: &PgPool) -> Result<Vec<Worker>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        id: Uuid,
        name: String,
        host: String,
        pid: Option<i32>,
        version: String,
        queues: Vec<String>,
        labels: Vec<String>,
        concurrency: i32,
        lease: PgInterval,
        started_at: DateTime<Utc>,
        heartbeat_at: DateTime<Utc>,
        stopping_at: Option<DateTime<Utc>>,
        cpu_millis: Option<i32>,
        memory_mb: Option<i32>,
        alive: bool,
        running: i64,
        running_cpu_millis: i64,
        running_memory_mb: i64,
    }
    let rows: Vec<Row> = sqlx::query_as("select * from sked.worker_status order by started_at")
        .fetch_all(crate::on(pool))
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| Worker {
            lease_secs: interval_secs(&r.lease),
            id: r.id,
            name: r.name,
            host: r.host,
            pid: r.pid,
            version: r.version,
            queues: r.queues,
            labels: r.labels,
            concurrency: r.concurrency,
            started_at: r.started_at,
            heartbeat_at: r.heartbeat_at,
            stopping_at: r.stopping_at,
            alive: r.alive,
            running: r.running,
            cpu_millis: r.cpu_millis,
            memory_mb: r.memory_mb,
            running_cpu_millis: r.running_cpu_millis,
            running_memory_mb: r.running_memory_mb,
        })
        .collect())
}
