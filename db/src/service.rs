//! Long-running services (`docs/services.md`): what a worker records while it supervises a
//! copy, the reconciler, changes to a service, and the reads of the API.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sked_types::TaskState;
use sked_types::service::{Service, ServiceCopy, ServiceExit};
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use crate::Result;
use crate::task::TaskRow;
use crate::text::Text;

/// How a copy is supervised: its restart policy and its health check, read when its worker
/// starts it.
#[derive(Debug, Clone, Default)]
pub struct CopySpec {
    /// `always` or `on_failure`.
    pub restart_policy: String,
    pub health_check: Option<Value>,
}

/// The restart policy and health check of copy `id`.
pub async fn copy_spec(pool: &PgPool, id: Uuid) -> Result<CopySpec> {
    let (policy, check): (Option<String>, Option<Value>) =
        sqlx::query_as("select restart_policy, health_check from sked.service_copy_spec($1)")
            .bind(id)
            .fetch_one(crate::on(pool))
            .await?;
    Ok(CopySpec {
        restart_policy: policy.unwrap_or_else(|| "always".to_owned()),
        health_check: check,
    })
}

/// `sked.service_copy_started`: the copy's process started now. False when the attempt is
/// no longer this worker's.
pub async fn copy_started(pool: &PgPool, id: Uuid, attempt: i32) -> Result<bool> {
    Ok(
        sqlx::query_scalar("select sked.service_copy_started($1, $2)")
            .bind(id)
            .bind(attempt)
            .fetch_one(crate::on(pool))
            .await?,
    )
}

/// `sked.service_copy_healthy`: the copy's process passed its health check.
pub async fn copy_healthy(pool: &PgPool, id: Uuid, attempt: i32) -> Result<bool> {
    Ok(
        sqlx::query_scalar("select sked.service_copy_healthy($1, $2)")
            .bind(id)
            .bind(attempt)
            .fetch_one(crate::on(pool))
            .await?,
    )
}

/// How a copy's process ended, as recorded in `sked.service_exits`.
#[derive(Debug, Clone)]
pub struct Exit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: String,
    /// Seconds from now (the database's clock) to the next start; `None`: not restarted.
    pub restart_in_secs: Option<f64>,
}

/// `sked.service_copy_exited`: records the exit and, when it is restarted, the restart and
/// the time of the next start. Returns that time, or `None` when the attempt is no longer
/// this worker's (or it is not restarted).
pub async fn copy_exited(
    pool: &PgPool,
    id: Uuid,
    attempt: i32,
    exit: &Exit,
) -> Result<(bool, Option<DateTime<Utc>>)> {
    Ok(sqlx::query_as(
        "select sked.service_copy_exited($1, $2, now(), $3, $4, $5,
                                         now() + make_interval(secs => $6)),
                now() + make_interval(secs => $6)",
    )
    .bind(id)
    .bind(attempt)
    .bind(exit.exit_code)
    .bind(exit.signal)
    .bind(&exit.error)
    .bind(exit.restart_in_secs)
    .fetch_one(crate::on(pool))
    .await?)
}

/// One step of the reconciler (`sked.services_reconcile`) over every running service:
/// (service, action, copy) for what it did.
pub async fn reconcile(pool: &PgPool) -> Result<Vec<(Uuid, String, Uuid)>> {
    Ok(
        sqlx::query_as("select service_id, action, copy_id from sked.services_reconcile()")
            .fetch_all(crate::on(pool))
            .await?,
    )
}

/// `sked.service_update`: the generation after the change, or `None` when there is no such
/// task.
pub async fn update(db: impl PgExecutor<'_>, id: Uuid, changes: &Value) -> Result<Option<i32>> {
    Ok(sqlx::query_scalar("select sked.service_update($1, $2)")
        .bind(id)
        .bind(changes)
        .fetch_one(db)
        .await?)
}

/// The service rows that run (`state = 'blocked'`), of `owner` or of everyone, oldest
/// first, at most `limit`.
pub async fn running(pool: &PgPool, owner: Option<&str>, limit: i64) -> Result<Vec<TaskRow>> {
    Ok(sqlx::query_as(
        "select t.* from sked.tasks t
          where t.kind = 'service' and t.shard_of is null and t.state = 'blocked'
            and ($1::text is null or t.owner = $1)
          order by t.id limit $2",
    )
    .bind(owner)
    .bind(limit)
    .fetch_all(crate::on(pool))
    .await?)
}

#[derive(sqlx::FromRow)]
struct CopyRow {
    id: Uuid,
    shard_index: i32,
    generation: Option<i32>,
    #[sqlx(try_from = "Text<TaskState>")]
    state: TaskState,
    attached: bool,
    attempt: i32,
    worker_id: Option<Uuid>,
    worker_host: Option<String>,
    worker_name: Option<String>,
    started_at: Option<DateTime<Utc>>,
    up_since: Option<DateTime<Utc>>,
    uptime_secs: Option<f64>,
    healthy_at: Option<DateTime<Utc>>,
    restarts: Option<i32>,
    backoff_until: Option<DateTime<Utc>>,
    cancel_requested: bool,
    finished_at: Option<DateTime<Utc>>,
    error: Option<String>,
}

/// A service as the API shows it, with its copies (those that count for it first, by
/// index; then retired copies that have not ended yet) and their last exits. With
/// `all_copies`, ended copies too (newest first after the live ones), at most 100.
pub async fn detail(pool: &PgPool, row: TaskRow) -> Result<Service> {
    let copies: Vec<CopyRow> = sqlx::query_as(
        "select c.id, c.shard_index, c.generation, c.state,
                exists (select 1 from sked.task_edges e where e.task_id = $1 and e.depends_on = c.id)
                  as attached,
                c.attempt, c.worker_id, w.host as worker_host, w.name as worker_name,
                c.started_at,
                case when sked.service_copy_up(c.state, c.up_since, c.started_at)
                     then c.up_since end as up_since,
                case when sked.service_copy_up(c.state, c.up_since, c.started_at)
                     then extract(epoch from now() - c.up_since)::float8 end as uptime_secs,
                c.healthy_at, c.restarts,
                case when c.state = 'running' then c.backoff_until end as backoff_until,
                c.cancel_requested_at is not null as cancel_requested, c.finished_at, c.error
           from sked.tasks c
           left join sked.workers w on w.id = c.worker_id and c.state = 'running'
          where c.shard_of = $1
            and (c.state in ('blocked', 'waiting', 'running', 'retry')
                 or exists (select 1 from sked.task_edges e
                             where e.task_id = $1 and e.depends_on = c.id))
          order by c.shard_index, c.id
          limit 2000",
    )
    .bind(row.id)
    .fetch_all(crate::on(pool))
    .await?;
    let ids: Vec<Uuid> = copies.iter().map(|c| c.id).collect();
    let exits: Vec<ExitRow> = sqlx::query_as(
        "select x.task_id, x.attempt, x.exited_at, x.exit_code, x.signal, x.error, x.restart_at
               from sked.service_exits x
              where x.task_id = any($1)
              order by x.task_id, x.id desc",
    )
    .bind(&ids)
    .fetch_all(crate::on(pool))
    .await?;
    let mut copies: Vec<ServiceCopy> = copies
        .into_iter()
        .map(|c| ServiceCopy {
            last_exits: exits
                .iter()
                .filter(|x| x.0 == c.id)
                .take(LAST_EXITS)
                .map(|x| ServiceExit {
                    attempt: x.1,
                    exited_at: x.2,
                    exit_code: x.3,
                    signal: x.4,
                    error: x.5.clone(),
                    restart_at: x.6,
                })
                .collect(),
            id: c.id,
            index: c.shard_index,
            generation: c.generation.unwrap_or(1),
            state: c.state,
            retired: !c.attached,
            attempt: c.attempt,
            worker_id: c.worker_id,
            worker_host: c.worker_host,
            worker_name: c.worker_name,
            started_at: c.started_at,
            up_since: c.up_since,
            uptime_secs: c.uptime_secs,
            healthy_at: c.healthy_at,
            restarts: c.restarts.unwrap_or(0),
            backing_off_until: c.backoff_until,
            cancel_requested: c.cancel_requested,
            finished_at: c.finished_at,
            error: c.error,
        })
        .collect();
    copies.sort_by_key(|c| (c.retired, c.index, c.generation));
    let mut service = summary(row);
    service.running = copies
        .iter()
        .filter(|c| c.state == TaskState::Running && c.up_since.is_some())
        .count() as i32;
    service.healthy = service.health_check.is_some().then(|| {
        copies
            .iter()
            .filter(|c| c.up_since.is_some() && c.healthy_at.is_some())
            .count() as i32
    });
    service.waiting = copies
        .iter()
        .filter(|c| matches!(c.state, TaskState::Waiting | TaskState::Retry))
        .count() as i32;
    service.restarts = copies
        .iter()
        .filter(|c| !c.retired)
        .map(|c| i64::from(c.restarts))
        .sum();
    service.copies = copies;
    Ok(service)
}

/// One row of `sked.service_exits`: copy, attempt, time, exit code, signal, error, planned
/// restart.
type ExitRow = (
    Uuid,
    i32,
    DateTime<Utc>,
    Option<i32>,
    Option<i32>,
    String,
    Option<DateTime<Utc>>,
);

/// The most exits shown per copy.
const LAST_EXITS: usize = 20;

/// A service without its copies; `running` counts the copies whose process is up.
pub async fn summaries(pool: &PgPool, rows: Vec<TaskRow>) -> Result<Vec<Service>> {
    let ids: Vec<Uuid> = rows.iter().map(|r| r.id).collect();
    // Per service: copies up, of them healthy, copies waiting, restarts of attached copies.
    let counts: Vec<(Uuid, i64, i64, i64, i64)> = sqlx::query_as(
        "select c.shard_of,
                count(*) filter (where sked.service_copy_up(c.state, c.up_since, c.started_at)),
                count(*) filter (where sked.service_copy_up(c.state, c.up_since, c.started_at)
                                   and c.healthy_at is not null),
                count(*) filter (where sked.state_is_claimable(c.state)),
                coalesce(sum(c.restarts) filter (
                  where exists (select 1 from sked.task_edges e
                                 where e.task_id = c.shard_of and e.depends_on = c.id)), 0)::int8
           from sked.tasks c
          where c.shard_of = any($1) and c.state in ('waiting', 'running', 'retry')
          group by c.shard_of",
    )
    .bind(&ids)
    .fetch_all(crate::on(pool))
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let (running, healthy, waiting, restarts) = counts
                .iter()
                .find(|c| c.0 == r.id)
                .map(|c| (c.1 as i32, c.2 as i32, c.3 as i32, c.4))
                .unwrap_or_default();
            let mut s = summary(r);
            s.running = running;
            s.healthy = s.health_check.is_some().then_some(healthy);
            s.waiting = waiting;
            s.restarts = restarts;
            s
        })
        .collect())
}

fn summary(row: TaskRow) -> Service {
    let replicas = row.replicas.unwrap_or(1);
    let restart_policy = row
        .restart_policy
        .clone()
        .unwrap_or_else(|| "always".to_owned());
    let health_check = row.health_check.clone();
    let generation = row.generation.unwrap_or(1);
    let task = row.into_task();
    Service {
        id: task.id,
        owner: task.owner,
        name: task.name,
        queue: task.queue,
        state: task.state,
        command: task.command,
        args: task.args,
        artifact_url: task.artifact_url,
        artifact_sha256: task.artifact_sha256,
        input: task.input,
        env: task.env,
        labels: task.labels,
        cpu_millis: task.cpu_millis,
        memory_mb: task.memory_mb,
        max_output_bytes: task.max_output_bytes,
        run_as: task.run_as,
        restart_policy,
        health_check,
        replicas,
        running: 0,
        healthy: None,
        waiting: 0,
        restarts: 0,
        generation,
        created_at: task.created_at,
        finished_at: task.finished_at,
        copies: Vec::new(),
    }
}
