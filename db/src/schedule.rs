//! Cron schedules: create, read, pause, resume, run now, delete, and firing (see
//! `sql/schedules.sql` and docs/schedules.md).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sked_types::{
    Backfill, BackfillOrder, CreateSchedule, Schedule, ScheduleRun, StartBackfill, UpdateSchedule,
};
use sqlx::postgres::PgRow;
use sqlx::postgres::types::PgInterval;
use sqlx::{PgExecutor, PgPool, Row};
use uuid::Uuid;

use crate::task::{interval_secs, seconds_text, submit_json};
use crate::workflow::spec_json;
use crate::{DbError, Result};

/// A row of `sked.schedules` (the parsed spec is left out).
#[derive(Debug, Clone, sqlx::FromRow)]
struct ScheduleRow {
    id: Uuid,
    owner: String,
    name: String,
    cron: String,
    time_zone: String,
    task: Option<Value>,
    workflow: Option<Value>,
    misfire_policy: String,
    misfire_grace: PgInterval,
    catch_up_limit: i32,
    overlap_policy: String,
    jitter: PgInterval,
    history_limit: i32,
    paused_at: Option<DateTime<Utc>>,
    next_run_at: DateTime<Utc>,
    last_fire_at: Option<DateTime<Utc>>,
    last_task_id: Option<Uuid>,
    last_workflow_id: Option<Uuid>,
    queued_fire_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    notify: Option<Value>,
}

/// A schedule with its templates' real environments, which its ticks submit: answers mask
/// secret values on their way out of the server.
impl From<ScheduleRow> for Schedule {
    fn from(r: ScheduleRow) -> Self {
        Schedule {
            id: r.id,
            owner: r.owner,
            name: r.name,
            cron: r.cron,
            time_zone: r.time_zone,
            task: r.task,
            workflow: r.workflow,
            notify: r.notify,
            misfire_policy: r.misfire_policy,
            misfire_grace_secs: interval_secs(&r.misfire_grace),
            catch_up_limit: r.catch_up_limit,
            overlap_policy: r.overlap_policy,
            jitter_secs: interval_secs(&r.jitter),
            history_limit: r.history_limit,
            paused_at: r.paused_at,
            next_run_at: r.next_run_at,
            last_fire_at: r.last_fire_at,
            last_task_id: r.last_task_id,
            last_workflow_id: r.last_workflow_id,
            queued_fire_at: r.queued_fire_at,
            created_at: r.created_at,
            updated_at: r.updated_at,
            last_tick: None,
        }
    }
}

/// Seconds as a Postgres interval literal, or an error naming the field.
fn secs(v: Option<f64>, field: &str) -> Result<Option<String>> {
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(seconds_text(s))),
        Some(s) => Err(DbError::InvalidInput(format!(
            "{field} must be a number of seconds, 0 or more (got {s})"
        ))),
    }
}

/// Creates a schedule; returns its id. `owner` applies when the request names none.
pub async fn create(pool: &PgPool, s: &CreateSchedule, owner: &str) -> Result<Uuid> {
    if s.task.is_some() == s.workflow.is_some() {
        return Err(DbError::InvalidInput(
            "a schedule runs either a task or a workflow: give exactly one of task and workflow"
                .into(),
        ));
    }
    if let Some(t) = &s.task {
        if t.run_at.is_some() || t.delay_secs.is_some() {
            return Err(DbError::InvalidInput(
                "a schedule's task template takes no run_at or delay_secs: the schedule sets them"
                    .into(),
            ));
        }
        if t.owner.is_some() {
            return Err(DbError::InvalidInput(
                "a schedule's task template takes no owner: give the schedule's owner instead"
                    .into(),
            ));
        }
    }
    let task = s.task.as_ref().map(submit_json).transpose()?;
    let workflow = s.workflow.as_ref().map(spec_json).transpose()?;
    let id = sqlx::query_scalar(
        "select sked.schedule_create(
           name => $1, cron => $2, task => $3, workflow => $4,
           time_zone => coalesce($5, 'UTC'),
           misfire_policy => coalesce($6, 'run_once'),
           misfire_grace => coalesce($7::interval, '1 minute'),
           catch_up_limit => coalesce($8, 100),
           overlap_policy => coalesce($9, 'skip'),
           jitter => coalesce($10::interval, '0'),
           history_limit => coalesce($11, 1000),
           paused => $12, owner => $13, notify => $14)",
    )
    .bind(&s.name)
    .bind(&s.cron)
    .bind(task)
    .bind(workflow)
    .bind(&s.time_zone)
    .bind(&s.misfire_policy)
    .bind(secs(s.misfire_grace_secs, "misfire_grace_secs")?)
    .bind(s.catch_up_limit)
    .bind(&s.overlap_policy)
    .bind(secs(s.jitter_secs, "jitter_secs")?)
    .bind(s.history_limit)
    .bind(s.paused)
    .bind(s.owner.as_deref().unwrap_or(owner))
    .bind(
        s.notify
            .as_ref()
            .filter(|n| n.as_object().is_none_or(|o| !o.is_empty())),
    )
    .fetch_one(crate::on(pool))
    .await?;
    Ok(id)
}

/// One schedule, if it exists.
pub async fn get(pool: &PgPool, id: Uuid) -> Result<Option<Schedule>> {
    let row: Option<ScheduleRow> = sqlx::query_as("select * from sked.schedules where id = $1")
        .bind(id)
        .fetch_optional(crate::on(pool))
        .await?;
    one_with_last_tick(pool, row).await
}

/// Schedules of one owner (all when `None`), of one name if given, by owner and name.
pub async fn list(pool: &PgPool, owner: Option<&str>, name: Option<&str>) -> Result<Vec<Schedule>> {
    let rows: Vec<ScheduleRow> = sqlx::query_as(
        "select * from sked.schedules
          where ($1::text is null or owner = $1) and ($2::text is null or name = $2)
          order by owner, name",
    )
    .bind(owner)
    .bind(name)
    .fetch_all(crate::on(pool))
    .await?;
    with_last_ticks(pool, rows.into_iter().map(Schedule::from).collect()).await
}

async fn one_with_last_tick(pool: &PgPool, row: Option<ScheduleRow>) -> Result<Option<Schedule>> {
    let schedules = row.into_iter().map(Schedule::from).collect();
    Ok(with_last_ticks(pool, schedules).await?.pop())
}

/// Reads a row of `sked.schedule_runs` by its columns' names.
fn run_of(row: &PgRow) -> sqlx::Result<ScheduleRun> {
    Ok(ScheduleRun {
        fire_at: row.try_get("fire_at")?,
        outcome: row.try_get("outcome")?,
        task_id: row.try_get("task_id")?,
        workflow_id: row.try_get("workflow_id")?,
        missed_ticks: row.try_get("missed_ticks")?,
        detail: row.try_get("detail")?,
        recorded_at: row.try_get("recorded_at")?,
        backfill_id: row.try_get("backfill_id")?,
    })
}

/// Fills in each schedule's `last_tick` with one query: per schedule, the newest run that is
/// not `manual`, read backwards from the index `schedule_runs_tick` (which holds exactly
/// those runs).
async fn with_last_ticks(pool: &PgPool, mut schedules: Vec<Schedule>) -> Result<Vec<Schedule>> {
    if schedules.is_empty() {
        return Ok(schedules);
    }
    let ids: Vec<Uuid> = schedules.iter().map(|s| s.id).collect();
    let rows = sqlx::query(
        "select r.*
           from unnest($1::uuid[]) as s(id)
          cross join lateral (
                select * from sked.schedule_runs r
                 where r.schedule_id = s.id and r.outcome <> 'manual'
                 order by r.fire_at desc
                 limit 1) r",
    )
    .bind(&ids)
    .fetch_all(crate::on(pool))
    .await?;
    let mut last = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        last.insert(row.try_get::<Uuid, _>("schedule_id")?, run_of(row)?);
    }
    for s in &mut schedules {
        s.last_tick = last.remove(&s.id);
    }
    Ok(schedules)
}

/// The latest runs of a schedule, newest first.
pub async fn runs(pool: &PgPool, id: Uuid, limit: i64) -> Result<Vec<ScheduleRun>> {
    let rows = sqlx::query(
        "select * from sked.schedule_runs where schedule_id = $1
          order by fire_at desc, id desc limit $2",
    )
    .bind(id)
    .bind(limit)
    .fetch_all(crate::on(pool))
    .await?;
    Ok(rows.iter().map(run_of).collect::<sqlx::Result<_>>()?)
}

/// The next `n` fire times of an expression in a time zone after now.
pub async fn next_times(pool: &PgPool, cron: &str, tz: &str, n: i32) -> Result<Vec<DateTime<Utc>>> {
    Ok(
        sqlx::query_scalar("select t from sked.cron_next_times($1, $2, now(), $3) t")
            .bind(cron)
            .bind(tz)
            .bind(n)
            .fetch_all(crate::on(pool))
            .await?,
    )
}

/// Pauses a schedule; false when there is none.
pub async fn pause(pool: &PgPool, id: Uuid) -> Result<bool> {
    Ok(sqlx::query_scalar("select sked.schedule_pause($1)")
        .bind(id)
        .fetch_one(crate::on(pool))
        .await?)
}

/// Resumes a schedule at its next future tick; false when there is none.
pub async fn resume(pool: &PgPool, id: Uuid) -> Result<bool> {
    Ok(sqlx::query_scalar("select sked.schedule_resume($1)")
        .bind(id)
        .fetch_one(crate::on(pool))
        .await?)
}

/// "Run now": the id of the task (or workflow) it submitted; `None` when there is no schedule.
pub async fn run_now(db: impl PgExecutor<'_>, id: Uuid) -> Result<Option<Uuid>> {
    Ok(sqlx::query_scalar("select sked.schedule_run_now($1)")
        .bind(id)
        .fetch_one(db)
        .await?)
}

/// Deletes a schedule and its runs (its occurrences stay); false when there is none.
pub async fn delete(pool: &PgPool, id: Uuid) -> Result<bool> {
    let done = sqlx::query("delete from sked.schedules where id = $1")
        .bind(id)
        .execute(crate::on(pool))
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Fires every tick due within `horizon` from now; returns the schedules handled.
pub async fn fire(pool: &PgPool, horizon: std::time::Duration, limit: i32) -> Result<i32> {
    Ok(
        sqlx::query_scalar("select sked.schedules_fire($1, $2, now())")
            .bind(crate::worker::pg_interval(horizon))
            .bind(limit)
            .fetch_one(crate::on(pool))
            .await?,
    )
}

/// Seconds until the next tick is due (database clock); `None` when no schedule is active.
pub async fn next_due(pool: &PgPool) -> Result<Option<f64>> {
    Ok(sqlx::query_scalar("select sked.schedules_next_due()")
        .fetch_one(crate::on(pool))
        .await?)
}

/// Trims every schedule's runs to its history limit; returns the rows deleted.
pub async fn prune_runs(pool: &PgPool) -> Result<i32> {
    Ok(sqlx::query_scalar("select sked.schedule_runs_prune()")
        .fetch_one(crate::on(pool))
        .await?)
}

/// The next `n` fire times of a schedule from its armed tick on (`next_run_at` first), as the
/// firing duty of the background upkeep will see them (before jitter).
pub async fn upcoming(pool: &PgPool, s: &Schedule, n: i32) -> Result<Vec<DateTime<Utc>>> {
    if n < 1 {
        return Ok(vec![]);
    }
    let mut times = vec![s.next_run_at];
    times.extend(
        sqlx::query_scalar::<_, DateTime<Utc>>(
            "select t from sked.cron_next_times($1, $2, $3, $4) t",
        )
        .bind(&s.cron)
        .bind(&s.time_zone)
        .bind(s.next_run_at)
        .bind(n - 1)
        .fetch_all(crate::on(pool))
        .await?,
    );
    Ok(times)
}

/// Changes a schedule with one `UPDATE` (absent fields keep their values); `None` when there
/// is no such schedule. The schedule's trigger checks the result as it checks an insert, and
/// re-arms `next_run_at` when the expression or the time zone changes. A task template
/// replaces a workflow template and the other way round.
pub async fn update(pool: &PgPool, id: Uuid, u: &UpdateSchedule) -> Result<Option<Schedule>> {
    if u.task.is_some() && u.workflow.is_some() {
        return Err(DbError::InvalidInput(
            "a schedule runs either a task or a workflow: give at most one of task and workflow"
                .into(),
        ));
    }
    let task = u.task.as_ref().map(submit_json).transpose()?;
    let workflow = u.workflow.as_ref().map(spec_json).transpose()?;
    let row: Option<ScheduleRow> = sqlx::query_as(
        "update sked.schedules set
           name = coalesce($2, name),
           cron = coalesce($3, cron),
           time_zone = coalesce($4, time_zone),
           task = case when $5::jsonb is not null then $5
                       when $6::jsonb is not null then null else task end,
           workflow = case when $6::jsonb is not null then $6
                           when $5::jsonb is not null then null else workflow end,
           misfire_policy = coalesce($7, misfire_policy),
           misfire_grace = coalesce($8::interval, misfire_grace),
           catch_up_limit = coalesce($9, catch_up_limit),
           overlap_policy = coalesce($10, overlap_policy),
           jitter = coalesce($11::interval, jitter),
           history_limit = coalesce($12, history_limit),
           notify = case when $13::jsonb is null then notify
                         when $13::jsonb = '{}' then null else $13 end
         where id = $1
         returning *",
    )
    .bind(id)
    .bind(&u.name)
    .bind(&u.cron)
    .bind(&u.time_zone)
    .bind(task)
    .bind(workflow)
    .bind(&u.misfire_policy)
    .bind(secs(u.misfire_grace_secs, "misfire_grace_secs")?)
    .bind(u.catch_up_limit)
    .bind(&u.overlap_policy)
    .bind(secs(u.jitter_secs, "jitter_secs")?)
    .bind(u.history_limit)
    .bind(&u.notify)
    .fetch_optional(crate::on(pool))
    .await?;
    one_with_last_tick(pool, row).await
}

/// A query of backfills: their columns as [`backfill_of`] reads them, then `$rest`.
macro_rules! select_backfills {
    ($rest:literal) => {
        concat!(
            "select id, schedule_id, from_at, to_at, newest_first, max_active, state,
                    cardinality(ticks) as ticks, fired, already, cardinality(active) as active,
                    succeeded, failed, ticks[next_tick] as next_at, error, created_at,
                    finished_at
               from sked.schedule_backfills ",
            $rest
        )
    };
}

/// Reads a row of `sked.schedule_backfills` selected with `select_backfills!`.
fn backfill_of(row: &PgRow) -> sqlx::Result<Backfill> {
    Ok(Backfill {
        id: row.try_get("id")?,
        schedule_id: row.try_get("schedule_id")?,
        from: row.try_get("from_at")?,
        to: row.try_get("to_at")?,
        order: if row.try_get("newest_first")? {
            BackfillOrder::NewestFirst
        } else {
            BackfillOrder::OldestFirst
        },
        max_active: row.try_get("max_active")?,
        state: row.try_get("state")?,
        ticks: row.try_get("ticks")?,
        fired: row.try_get("fired")?,
        already: row.try_get("already")?,
        active: row.try_get("active")?,
        succeeded: row.try_get("succeeded")?,
        failed: row.try_get("failed")?,
        // A backfill that stopped fires nothing more.
        next_tick: match row.try_get::<String, _>("state")?.as_str() {
            "running" => row.try_get("next_at")?,
            _ => None,
        },
        error: row.try_get("error")?,
        created_at: row.try_get("created_at")?,
        finished_at: row.try_get("finished_at")?,
    })
}

/// Starts a backfill of schedule `id` (`sked.schedule_backfill`); `None` when there is no
/// such schedule. A range the rules refuse is an error naming the rule.
pub async fn backfill(pool: &PgPool, id: Uuid, b: &StartBackfill) -> Result<Option<Backfill>> {
    let backfill: Option<Uuid> =
        sqlx::query_scalar("select sked.schedule_backfill($1, $2, $3, $4, $5)")
            .bind(id)
            .bind(b.from)
            .bind(b.to)
            .bind(b.max_active.unwrap_or(1))
            .bind(b.order == Some(BackfillOrder::NewestFirst))
            .fetch_one(crate::on(pool))
            .await?;
    match backfill {
        Some(backfill) => get_backfill(pool, backfill).await,
        None => Ok(None),
    }
}

/// One backfill, if it exists.
pub async fn get_backfill(pool: &PgPool, id: Uuid) -> Result<Option<Backfill>> {
    let row = sqlx::query(select_backfills!("where id = $1"))
        .bind(id)
        .fetch_optional(crate::on(pool))
        .await?;
    Ok(row.as_ref().map(backfill_of).transpose()?)
}

/// The latest `limit` backfills of schedule `id`, newest first.
pub async fn backfills(pool: &PgPool, id: Uuid, limit: i64) -> Result<Vec<Backfill>> {
    let rows = sqlx::query(select_backfills!(
        "where schedule_id = $1 order by created_at desc, id desc limit $2"
    ))
    .bind(id)
    .bind(limit)
    .fetch_all(crate::on(pool))
    .await?;
    Ok(rows.iter().map(backfill_of).collect::<sqlx::Result<_>>()?)
}

/// Stops a running backfill (`sked.schedule_backfill_cancel`): false when it is not running.
pub async fn cancel_backfill(pool: &PgPool, id: Uuid) -> Result<bool> {
    Ok(
        sqlx::query_scalar("select sked.schedule_backfill_cancel($1)")
            .bind(id)
            .fetch_one(crate::on(pool))
            .await?,
    )
}
