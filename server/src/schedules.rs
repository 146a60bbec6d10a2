//! `/api/v1/schedules` and `/api/v1/cron/preview`: create, list, read, change, pause, resume,
//! run now and delete cron schedules, and preview the fire times of an expression.
//!
//! Visibility follows the tasks' rules: a `user` token sees and acts on its owner's schedules
//! only, an `admin` on all. A schedule the caller may not see answers 404 exactly like one
//! that does not exist.
//!
//! The rules on a schedule are the schema's (`sql/schedules.sql`): its trigger parses the
//! expression, checks the time zone and holds the template to the rules of a submitted task.
//! Their messages are written for people and name the schedule, the field and the value, so
//! they reach the caller as they are; the rules of plain `CHECK` constraints are described
//! from the constraint's name, and a rule of the task table that a template broke is
//! described as `POST /api/v1/tasks` describes it.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use sked_db::DbError;
use sked_db::token::Principal;
use sked_types::{
    ApiError, Backfill, BackfillPage, CreateSchedule, CronPreview, RunNow, Schedule,
    ScheduleDetail, SchedulePage, StartBackfill, SubmitTask, SubmitWorkflow, UpdateSchedule,
    time_zones,
};
use utoipa::IntoParams;
use uuid::Uuid;

use crate::AppState;
use crate::error::{Error, Result, describe_rule};
use crate::extract::{Auth, Json, Path, Query, listing_owner, may_act_for};
use crate::openapi::{
    BackfillId, NoSuchBackfill, NoSuchSchedule, OwnerForbidden, QuotaExceeded, ScheduleId,
};
use crate::quotas::{rows_of_template, rows_of_workflow_template};
use crate::shown::Shown;
use crate::tasks::MAX_SECS;

/// Fire times a schedule's detail shows.
pub const DETAIL_FIRE_TIMES: i32 = 5;
/// Runs a schedule's detail shows, newest first.
pub const DETAIL_RUNS: i64 = 50;
/// Backfills a schedule's detail shows, newest first.
pub const DETAIL_BACKFILLS: i64 = 10;
/// Backfills `GET /api/v1/schedules/{id}/backfills` answers at most, newest first.
pub const LISTED_BACKFILLS: i64 = 1000;
/// Fire times a preview shows when `n` is absent, and its upper bound.
pub const DEFAULT_PREVIEW: i32 = 5;
pub const MAX_PREVIEW: i32 = 100;

/// Create a schedule.
///
/// The owner defaults to the token's owner; only an admin may name another owner. The
/// schedule is armed at its first tick after now (unless created `paused`).
#[utoipa::path(
    post, path = "/api/v1/schedules", operation_id = "create_schedule", tag = "schedules",
    request_body = CreateSchedule,
    responses(
        (status = 201, description = "The schedule was created", body = Schedule),
        OwnerForbidden,
        (status = 409, description = "`conflict`: the owner already has a schedule of this name, or the template is a broadcast that no live worker serves", body = ApiError),
        (status = 413, description = "`too_large`: the template's task, at every tick, would create more task rows (tasks, shards and copies of services) than the server allows per request (`--max-rows-per-request`)", body = ApiError),
        (status = 422, description = "`rejected`: the expression or the template breaks a rule (the message names it); a template is held to the rules of a submission", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn create(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Json(request): Json<CreateSchedule>,
) -> Result<(StatusCode, Shown<Schedule>)> {
    may_act_for(&principal, request.owner.as_deref(), "create schedules")?;
    if request.task.is_some() == request.workflow.is_some() {
        return Err(Error::InvalidRequest(
            "a schedule runs either a task or a workflow: give exactly one of task and workflow"
                .to_owned(),
        ));
    }
    validate(
        request.time_zone.as_deref(),
        request.task.as_ref(),
        request.workflow.as_ref(),
        request.misfire_grace_secs,
        request.jitter_secs,
    )?;
    state
        .quotas
        .check(request.task.iter(), "this schedule's task, at every tick,")?;
    let id = sked_db::schedule::create(&state.pool, &request, &principal.owner)
        .await
        .map_err(schedule_error)?;
    let schedule = sked_db::schedule::get(&state.pool, id)
        .await?
        .ok_or_else(not_found)?;
    Ok((StatusCode::CREATED, Shown(schedule)))
}

/// The checks the schema cannot make, or cannot word well: the time zone (the document lists
/// the names; the database reads more), a template's fields that the schedule sets, and
/// durations that fit an interval.
fn validate(
    time_zone: Option<&str>,
    task: Option<&SubmitTask>,
    workflow: Option<&SubmitWorkflow>,
    misfire_grace_secs: Option<f64>,
    jitter_secs: Option<f64>,
) -> Result<()> {
    if let Some(time_zone) = time_zone {
        check_time_zone(time_zone)?;
    }
    // Answers show templates with secret values masked; a template read and sent back as it
    // was shown would store the mask instead of the secret.
    let workflow_tasks = workflow.into_iter().flat_map(|w| &w.tasks);
    let envs = task
        .into_iter()
        .chain(workflow_tasks.map(|t| &t.task))
        .flat_map(|t| &t.env);
    for (name, value) in envs {
        if value.contains(sked_types::secrets::MASK) {
            return Err(Error::InvalidRequest(format!(
                "env {name}: the value holds the mask '{}' that answers show in place of a \
                 secret; send the real value",
                sked_types::secrets::MASK
            )));
        }
    }
    if workflow.is_some_and(|w| w.owner.is_some()) {
        return Err(Error::InvalidRequest(
            "workflow.owner: a schedule's workflow template takes no owner; the schedule's \
             owner owns each occurrence"
                .to_owned(),
        ));
    }
    if let Some(task) = task {
        let set_by_schedule = [
            ("owner", task.owner.is_some()),
            ("run_at", task.run_at.is_some()),
            ("delay_secs", task.delay_secs.is_some()),
        ];
        for (field, given) in set_by_schedule {
            if given {
                return Err(Error::InvalidRequest(format!(
                    "task.{field}: a schedule's task template takes no {field}; the schedule \
                     sets it for each occurrence"
                )));
            }
        }
        crate::tasks::check_durations(task, "task.")?;
    }
    for (i, t) in workflow.into_iter().flat_map(|w| &w.tasks).enumerate() {
        crate::tasks::check_durations(&t.task, &format!("workflow.tasks[{i}]."))?;
    }
    for (field, value) in [
        ("misfire_grace_secs", misfire_grace_secs),
        ("jitter_secs", jitter_secs),
    ] {
        if let Some(value) = value
            && !(value.is_finite() && (0.0..=MAX_SECS).contains(&value))
        {
            return Err(Error::InvalidRequest(format!(
                "{field} must be a number of seconds from 0 to 100 years, got {value}"
            )));
        }
    }
    Ok(())
}

/// A time zone the API takes (`sked_types::time_zones`, the names the document lists), or
/// 400 naming the value.
fn check_time_zone(time_zone: &str) -> Result<()> {
    if time_zones::is_known(time_zone) {
        return Ok(());
    }
    Err(Error::InvalidRequest(format!(
        "time zone '{time_zone}' is not known (use an IANA name such as UTC, Europe/Berlin, \
         America/New_York; the OpenAPI document lists them)"
    )))
}

/// Filters of `GET /api/v1/schedules`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ScheduleParams {
    /// Only schedules of this owner. A user token may name only its own owner.
    owner: Option<String>,
    /// Only the schedule(s) of this name (one per owner).
    name: Option<String>,
}

/// List schedules, by owner and name.
///
/// A user token lists its owner's schedules; an admin token lists all, or one owner's.
#[utoipa::path(
    get, path = "/api/v1/schedules", operation_id = "list_schedules", tag = "schedules",
    params(ScheduleParams),
    responses(
        (status = 200, description = "The schedules", body = SchedulePage),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<ScheduleParams>,
) -> Result<Shown<SchedulePage>> {
    let owner = listing_owner(&principal, params.owner, "schedules")?;
    let name = params.name.filter(|n| !n.is_empty());
    let (owner, name) = (owner.as_deref(), name.as_deref());
    let schedules = state
        .read(|pool| async move { Ok(sked_db::schedule::list(&pool, owner, name).await?) })
        .await?;
    Ok(Shown(SchedulePage { schedules }))
}

fn not_found() -> Error {
    Error::NotFound("no such schedule".to_owned())
}

/// The schedule `id` if it exists and the principal may see it.
async fn visible(state: &AppState, principal: &Principal, id: Uuid) -> Result<Schedule> {
    sked_db::schedule::get(&state.pool, id)
        .await?
        .filter(|s| principal.may_access(&s.owner))
        .ok_or_else(not_found)
}

/// Read a schedule with its next fire times and its latest runs.
///
/// `next_fire_times` holds the next 5 ticks from `next_run_at` on (empty while paused: a
/// resumed schedule starts at its next tick after the resume). `runs` holds the latest 50
/// ticks, newest first, with what happened to each (`fired`, `queued`, `skipped`, `missed`,
/// `manual`) and why; `backfills` the latest 10 backfills, newest first.
#[utoipa::path(
    get, path = "/api/v1/schedules/{id}", operation_id = "get_schedule", tag = "schedules",
    params(ScheduleId),
    responses(
        (status = 200, description = "The schedule, its next fire times and its latest runs", body = ScheduleDetail),
        NoSuchSchedule,
    ),
    security(("bearer" = [])),
)]
pub async fn detail(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<Shown<ScheduleDetail>> {
    let schedule = visible(&state, &principal, id).await?;
    let next_fire_times = if schedule.paused_at.is_some() {
        vec![]
    } else {
        sked_db::schedule::upcoming(&state.pool, &schedule, DETAIL_FIRE_TIMES).await?
    };
    let runs = sked_db::schedule::runs(&state.pool, id, DETAIL_RUNS).await?;
    let backfills = sked_db::schedule::backfills(&state.pool, id, DETAIL_BACKFILLS).await?;
    Ok(Shown(ScheduleDetail {
        schedule,
        next_fire_times,
        runs,
        backfills,
    }))
}

/// Change a schedule.
///
/// Absent fields keep their values. A new expression or time zone re-arms the schedule at its
/// next tick from now; a new template (task or workflow, replacing the other) applies from
/// the next occurrence on. The change is checked exactly like a new schedule.
#[utoipa::path(
    patch, path = "/api/v1/schedules/{id}", operation_id = "update_schedule", tag = "schedules",
    params(ScheduleId),
    request_body = UpdateSchedule,
    responses(
        (status = 200, description = "The schedule after the change", body = Schedule),
        NoSuchSchedule,
        (status = 409, description = "`conflict`: the owner already has a schedule of the new name, or the new template is a broadcast that no live worker serves", body = ApiError),
        (status = 422, description = "`rejected`: the change breaks a rule (the message names it); a template is held to the rules of a submission", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn update(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
    Json(change): Json<UpdateSchedule>,
) -> Result<Shown<Schedule>> {
    if change.task.is_some() && change.workflow.is_some() {
        return Err(Error::InvalidRequest(
            "a schedule runs either a task or a workflow: give at most one of task and workflow"
                .to_owned(),
        ));
    }
    validate(
        change.time_zone.as_deref(),
        change.task.as_ref(),
        change.workflow.as_ref(),
        change.misfire_grace_secs,
        change.jitter_secs,
    )?;
    visible(&state, &principal, id).await?;
    let schedule = sked_db::schedule::update(&state.pool, id, &change)
        .await
        .map_err(schedule_error)?
        .ok_or_else(not_found)?;
    Ok(Shown(schedule))
}

/// Pause a schedule: no tick fires until it is resumed. Pausing a paused schedule changes
/// nothing.
#[utoipa::path(
    post, path = "/api/v1/schedules/{id}/pause", operation_id = "pause_schedule", tag = "schedules",
    params(ScheduleId),
    responses(
        (status = 200, description = "The schedule after the call", body = Schedule),
        NoSuchSchedule,
    ),
    security(("bearer" = [])),
)]
pub async fn pause(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<Shown<Schedule>> {
    set_paused(&state, &principal, id, true).await
}

/// Resume a paused schedule at its next tick from now: ticks that passed while it was paused
/// do not fire and are not missed ticks. Resuming an active schedule changes nothing.
#[utoipa::path(
    post, path = "/api/v1/schedules/{id}/resume", operation_id = "resume_schedule", tag = "schedules",
    params(ScheduleId),
    responses(
        (status = 200, description = "The schedule after the call", body = Schedule),
        NoSuchSchedule,
    ),
    security(("bearer" = [])),
)]
pub async fn resume(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<Shown<Schedule>> {
    set_paused(&state, &principal, id, false).await
}

/// Pauses (`paused`) or resumes the schedule `id` if the principal may see it, and answers
/// the schedule as it is then.
async fn set_paused(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
    paused: bool,
) -> Result<Shown<Schedule>> {
    visible(state, principal, id).await?;
    let found = if paused {
        sked_db::schedule::pause(&state.pool, id).await?
    } else {
        sked_db::schedule::resume(&state.pool, id).await?
    };
    if !found {
        return Err(not_found());
    }
    let schedule = sked_db::schedule::get(&state.pool, id)
        .await?
        .ok_or_else(not_found)?;
    Ok(Shown(schedule))
}

/// Run a schedule's template now, outside its ticks.
///
/// Submits one occurrence whatever the overlap policy and whether or not the schedule is
/// paused, records it as a `manual` run, and answers its id.
#[utoipa::path(
    post, path = "/api/v1/schedules/{id}/run", operation_id = "run_schedule", tag = "schedules",
    params(ScheduleId),
    responses(
        (status = 201, description = "The occurrence was submitted: a task or a workflow", body = RunNow),
        NoSuchSchedule,
        (status = 409, description = "`conflict`: the template is a broadcast that no live worker serves", body = ApiError),
        (status = 413, description = "`too_large`: the occurrence is more task rows than its owner may create per minute (`--max-rows-per-owner-per-minute`)", body = ApiError),
        (status = 422, description = "The template no longer passes the rules of a submission", body = ApiError),
        (status = 429, response = QuotaExceeded),
    ),
    security(("bearer" = [])),
)]
pub async fn run(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<(StatusCode, axum::Json<RunNow>)> {
    let schedule = visible(&state, &principal, id).await?;
    let rows = match (&schedule.task, &schedule.workflow) {
        (Some(task), _) => rows_of_template(task),
        (None, Some(workflow)) => rows_of_workflow_template(workflow),
        (None, None) => 0,
    };
    let mut tx = sked_db::begin(&state.pool).await?;
    state
        .quotas
        .take(&mut tx, &principal, rows, "this run of the schedule")
        .await?;
    let occurrence = sked_db::schedule::run_now(&mut *tx, id)
        .await?
        .ok_or_else(not_found)?;
    // The template decides the kind; the row tells, whatever a concurrent change did.
    let is_task = sked_db::task::get(&mut *tx, occurrence).await?.is_some();
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(RunNow {
            schedule_id: id,
            task_id: is_task.then_some(occurrence),
            workflow_id: (!is_task).then_some(occurrence),
        }),
    ))
}

/// Delete a schedule and its runs. Occurrences it submitted stay (they are ordinary tasks
/// and workflows).
#[utoipa::path(
    delete, path = "/api/v1/schedules/{id}", operation_id = "delete_schedule", tag = "schedules",
    params(ScheduleId),
    responses(
        (status = 200, description = "The schedule as it was before it was deleted", body = Schedule),
        NoSuchSchedule,
    ),
    security(("bearer" = [])),
)]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<Shown<Schedule>> {
    let schedule = visible(&state, &principal, id).await?;
    if !sked_db::schedule::delete(&state.pool, id).await? {
        return Err(not_found());
    }
    Ok(Shown(schedule))
}

/// Start a backfill: run the schedule for every tick of a past range.
///
/// Every tick from `from` to `to` (both included, in the schedule's expression and time zone)
/// gets an occurrence, at most `max_active` running at once, the oldest tick first or the
/// newest; each is recorded as a run of its tick. A tick that has a run already (fired or
/// queued by the schedule, or fired by another backfill) is not run again, so starting the
/// same backfill twice runs nothing twice; a tick the schedule missed or skipped is run. The
/// firing duty starts the ticks, whether or not the schedule is paused; its overlap and
/// misfire policies and its jitter do not apply.
#[utoipa::path(
    post, path = "/api/v1/schedules/{id}/backfills", operation_id = "start_backfill", tag = "schedules",
    params(ScheduleId),
    request_body = StartBackfill,
    responses(
        (status = 201, description = "The backfill was started", body = Backfill),
        NoSuchSchedule,
        (status = 422, description = "`rejected`: the range breaks a rule (the message names it): `from` after `to`, `to` in the future, no tick in the range or more than 10,000, `max_active` not 1 to 1000", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn start_backfill(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
    Json(body): Json<StartBackfill>,
) -> Result<(StatusCode, axum::Json<Backfill>)> {
    visible(&state, &principal, id).await?;
    let backfill = sked_db::schedule::backfill(&state.pool, id, &body)
        .await
        .map_err(|err| match err {
            DbError::Rejected { message, .. } => Error::Rejected(
                message
                    .replacen("sked.schedule_backfills: ", "", 1)
                    .to_owned(),
            ),
            other => other.into(),
        })?
        .ok_or_else(not_found)?;
    Ok((StatusCode::CREATED, axum::Json(backfill)))
}

/// List a schedule's backfills, newest first (at most 1,000).
#[utoipa::path(
    get, path = "/api/v1/schedules/{id}/backfills", operation_id = "list_backfills", tag = "schedules",
    params(ScheduleId),
    responses(
        (status = 200, description = "The schedule's backfills, newest first", body = BackfillPage),
        NoSuchSchedule,
    ),
    security(("bearer" = [])),
)]
pub async fn backfills(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<BackfillPage>> {
    visible(&state, &principal, id).await?;
    let backfills = sked_db::schedule::backfills(&state.pool, id, LISTED_BACKFILLS).await?;
    Ok(axum::Json(BackfillPage { backfills }))
}

/// The backfill `id` if it exists and the principal may see its schedule.
async fn visible_backfill(state: &AppState, principal: &Principal, id: Uuid) -> Result<Backfill> {
    let no_such = || Error::NotFound("no such backfill".to_owned());
    let backfill = sked_db::schedule::get_backfill(&state.pool, id)
        .await?
        .ok_or_else(no_such)?;
    visible(state, principal, backfill.schedule_id)
        .await
        .map_err(|_| no_such())?;
    Ok(backfill)
}

/// Read a backfill and how far it got.
#[utoipa::path(
    get, path = "/api/v1/backfills/{id}", operation_id = "get_backfill", tag = "schedules",
    params(BackfillId),
    responses(
        (status = 200, description = "The backfill", body = Backfill),
        NoSuchBackfill,
    ),
    security(("bearer" = [])),
)]
pub async fn backfill(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<Backfill>> {
    Ok(axum::Json(visible_backfill(&state, &principal, id).await?))
}

/// Cancel a running backfill: it starts no more ticks. The occurrences it started run on
/// (cancel them as tasks or workflows).
#[utoipa::path(
    post, path = "/api/v1/backfills/{id}/cancel", operation_id = "cancel_backfill", tag = "schedules",
    params(BackfillId),
    responses(
        (status = 200, description = "The backfill after the cancel", body = Backfill),
        NoSuchBackfill,
        (status = 409, description = "`conflict`: the backfill is not running (it ended or was cancelled)", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn cancel_backfill(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<Backfill>> {
    let before = visible_backfill(&state, &principal, id).await?;
    if !sked_db::schedule::cancel_backfill(&state.pool, id).await? {
        return Err(Error::Conflict(format!(
            "the backfill is not running: it is {}",
            before.state
        )));
    }
    Ok(axum::Json(visible_backfill(&state, &principal, id).await?))
}

/// Parameters of `GET /api/v1/cron/preview`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PreviewParams {
    /// The cron expression: 5 fields, 6 with seconds first, or a macro such as `@daily`.
    cron: String,
    /// The IANA time zone the expression is read in (default `UTC`).
    time_zone: Option<String>,
    /// How many fire times, 1 to 100 (default 5).
    #[param(minimum = 1, maximum = 100)]
    n: Option<i32>,
}

/// The next fire times of a cron expression after now; nothing is stored.
///
/// A malformed expression or an unknown time zone answers 400 with a message naming it.
#[utoipa::path(
    get, path = "/api/v1/cron/preview", operation_id = "preview_cron", tag = "schedules",
    params(PreviewParams),
    responses(
        (status = 200, description = "The next fire times (fewer when the expression stops firing within eight years)", body = CronPreview),
        (status = 400, description = "The expression or the time zone is not valid, or `n` is out of range", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn preview(
    State(state): State<AppState>,
    Auth(_): Auth,
    Query(params): Query<PreviewParams>,
) -> Result<axum::Json<CronPreview>> {
    let n = params.n.unwrap_or(DEFAULT_PREVIEW);
    if !(1..=MAX_PREVIEW).contains(&n) {
        return Err(Error::InvalidRequest(format!(
            "n must be between 1 and {MAX_PREVIEW}, got {n}"
        )));
    }
    let time_zone = params
        .time_zone
        .unwrap_or_else(|| time_zones::DEFAULT_TIME_ZONE.to_owned());
    check_time_zone(&time_zone)?;
    let next_fire_times = sked_db::schedule::next_times(&state.pool, &params.cron, &time_zone, n)
        .await
        .map_err(|err| match err {
            // The parser's and the time-zone check's own messages (sql/schedules.sql).
            DbError::InvalidInput(message)
                if message.starts_with("cron expression") || message.starts_with("time zone") =>
            {
                Error::InvalidRequest(message)
            }
            other => other.into(),
        })?;
    Ok(axum::Json(CronPreview {
        cron: params.cron,
        time_zone,
        next_fire_times,
    }))
}

/// A database error of a schedule's create or change, as the caller reads it.
fn schedule_error(err: DbError) -> Error {
    match err {
        // The workers alive now refuse the template's trial submission, not a rule of it.
        DbError::Rejected {
            constraint,
            message,
        } if constraint == "tasks_broadcast_needs_a_live_worker" => {
            Error::Conflict(message.replacen("sked.tasks: ", "", 1))
        }
        DbError::Rejected {
            constraint,
            message,
        } => Error::Rejected(describe_schedule_rule(&constraint, &message)),
        DbError::Conflict { constraint } if constraint == "schedules_name_is_unique_per_owner" => {
            Error::Conflict("the owner already has a schedule of this name".to_owned())
        }
        other => other.into(),
    }
}

/// Constraints of `sked.schedules` whose names do not read as a rule on their own, or name a
/// column differently from the API field that sets it.
const RULES: &[(&str, &str)] = &[
    (
        "schedules_misfire_policy_is_skip_run_once_or_catch_up",
        "misfire_policy must be one of skip, run_once, catch_up",
    ),
    (
        "schedules_overlap_policy_is_allow_skip_queue_one_or_replace",
        "overlap_policy must be one of allow, skip, queue_one, replace",
    ),
    (
        "schedules_misfire_grace_must_not_be_negative",
        "misfire_grace_secs must not be negative",
    ),
    (
        "schedules_jitter_must_not_be_negative",
        "jitter_secs must not be negative",
    ),
    (
        "schedules_catch_up_limit_must_be_1_to_10000",
        "catch_up_limit must be 1 to 10000",
    ),
    (
        "schedules_history_limit_must_be_at_least_1",
        "history_limit must be at least 1",
    ),
    (
        "schedules_run_a_task_or_a_workflow",
        "a schedule runs either a task or a workflow: give exactly one of task and workflow",
    ),
];

/// Words that only database text contains; a message holding one is not shown.
const DATABASE_WORDING: &[&str] = &["violates", "relation", "sked.", "SQLSTATE", "constraint \""];

/// A schedule rule as people read it. The expression, time-zone and template rules come with
/// a message that `sql/schedules.sql` wrote for people; it is shown, except for the part a
/// template's submission raised, which is described like a rejected task.
fn describe_schedule_rule(constraint: &str, message: &str) -> String {
    if let Some((_, rule)) = RULES.iter().find(|(name, _)| *name == constraint) {
        return (*rule).to_owned();
    }
    match constraint {
        "schedules_cron_must_be_valid"
        | "schedules_task_template_must_be_valid"
        | "schedules_workflow_template_must_be_valid" => {
            const INVALID: &str = " template is not valid: ";
            let (head, inner) = match message.find(INVALID) {
                Some(at) => message.split_at(at + INVALID.len()),
                None => ("", message),
            };
            // The workflow rules' messages start by naming the workflow, as the head does.
            let inner = inner.strip_prefix("workflow: ").unwrap_or(inner);
            let inner = if DATABASE_WORDING.iter().any(|w| inner.contains(w)) {
                match inner_rule(inner) {
                    Some(rule) => describe_rule(rule),
                    None => "a value is malformed or out of range for its field".to_owned(),
                }
            } else {
                inner.to_owned()
            };
            format!("{head}{inner}")
        }
        _ => describe_rule(constraint.strip_prefix("schedules_").unwrap_or(constraint)),
    }
}

/// The constraint a task's submission broke, from its message: `… (tasks_rule)` as the task
/// table's trigger words it, or `… violates check constraint "tasks_rule"`.
fn inner_rule(message: &str) -> Option<&str> {
    let name = if let Some(at) = message.find("constraint \"") {
        let rest = &message[at + "constraint \"".len()..];
        &rest[..rest.find('"')?]
    } else {
        let open = message.rfind(" (")?;
        message[open + 2..].strip_suffix(')')?
    };
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    plain.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_rules_read_like_task_rules() {
        assert_eq!(
            describe_schedule_rule(
                "schedules_task_template_must_be_valid",
                "schedule 'a': the task template is not valid: sked.tasks: command must be a \
                 non-empty array (tasks_command_must_not_be_empty)"
            ),
            "schedule 'a': the task template is not valid: command must not be empty"
        );
        assert_eq!(
            describe_schedule_rule(
                "schedules_task_template_must_be_valid",
                "schedule 'a': the task template is not valid: new row for relation \"tasks\" \
                 violates check constraint \"tasks_timeout_must_be_positive\""
            ),
            "schedule 'a': the task template is not valid: timeout_secs must be positive"
        );
        assert_eq!(
            describe_schedule_rule(
                "schedules_task_template_must_be_valid",
                "schedule 'a': the task template has unknown or unsettable keys: bogus"
            ),
            "schedule 'a': the task template has unknown or unsettable keys: bogus"
        );
        assert_eq!(
            describe_schedule_rule(
                "schedules_workflow_template_must_be_valid",
                "schedule 'a': the workflow template is not valid: workflow: task 'x' depends on \
                 itself"
            ),
            "schedule 'a': the workflow template is not valid: task 'x' depends on itself"
        );
        assert_eq!(
            describe_schedule_rule(
                "schedules_workflow_template_must_be_valid",
                "schedule 'a': the workflow template is not valid: sked.workflows: \"x\" (y z)"
            ),
            "schedule 'a': the workflow template is not valid: a value is malformed or out of \
             range for its field"
        );
    }

    #[test]
    fn schedule_constraints_read_as_rules() {
        assert_eq!(
            describe_schedule_rule("schedules_name_must_not_be_empty", ""),
            "name must not be empty"
        );
        assert_eq!(
            describe_schedule_rule(
                "schedules_overlap_policy_is_allow_skip_queue_one_or_replace",
                ""
            ),
            "overlap_policy must be one of allow, skip, queue_one, replace"
        );
        let cron =
            "schedule 'a': cron expression '61 * * * *': minute field: 61 is out of range 0-59";
        assert_eq!(
            describe_schedule_rule("schedules_cron_must_be_valid", cron),
            cron
        );
    }
}
