//! `/api/v1/tasks`: submit, list, read, follow logs, cancel, retry and resubmit.
//!
//! Visibility: a `user` token sees and acts on its owner's tasks only, an `admin` on all. A
//! task the caller may not see answers 404 exactly like a task that does not exist, so ids of
//! other owners' tasks leak nothing. Answers mask secret environment values
//! (`sked_types::secrets`).

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde::Serialize;
use sked_db::awaits::Awaited;
use sked_db::listing::{ListFilter, ListPage};
use sked_db::task::TaskRow;
use sked_db::token::Principal;
use sked_types::events::TaskSummary;
use sked_types::{
    ApiError, LogChunk, StateChange, SubmitBatch, SubmitTask, Submitted, TaskCount, TaskDetail,
    TaskPage, TaskState, TaskSummaryPage,
};
use utoipa::openapi::path::{Parameter, ParameterIn};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use crate::AppState;
use crate::awaits::WaitParams;
use crate::error::{Error, Result};
use crate::extract::{Auth, Json, Path, Query, listing_owner, may_act_for};
use crate::openapi::{NoSuchTask, OwnerForbidden, QuotaExceeded, TaskId};
use crate::quotas::rows_of_row;
use crate::shown::{Masked, Shown};

/// The most tasks one batch may hold.
pub const MAX_BATCH: usize = 10_000;
/// Page size of a task listing when `limit` is absent, and its upper bound.
pub const DEFAULT_PAGE: i64 = 50;
pub const MAX_PAGE: i64 = 500;
/// Log chunks per request when `limit` is absent, and its upper bound.
pub const DEFAULT_LOG_CHUNKS: i64 = 1_000;
pub const MAX_LOG_CHUNKS: i64 = 10_000;
/// The longest duration a submission or a schedule may give, in seconds (100 years).
pub(crate) use sked_types::duration::MAX_SECS;

/// Submit one task.
///
/// The owner defaults to the token's owner; only an admin may name another owner.
#[utoipa::path(
    post, path = "/api/v1/tasks", operation_id = "submit_task", tag = "tasks",
    request_body = SubmitTask,
    responses(
        (status = 201, description = "The task was created", body = Submitted),
        (status = 200, description = "The idempotency key names a task of the same definition already: the answer is that task (`created` false), nothing was inserted", body = Submitted),
        OwnerForbidden,
        (status = 409, description = "`conflict`: the idempotency key names a task with another definition, or the task is a broadcast that no live worker serves", body = ApiError),
        (status = 413, description = "`too_large`: the task and its shards or copies are more task rows than allowed per request (`--max-rows-per-request`) or per owner per minute (`--max-rows-per-owner-per-minute`)", body = ApiError),
        (status = 422, description = "The schema rejected the task; the message names the rule", body = ApiError),
        (status = 429, response = QuotaExceeded),
    ),
    security(("bearer" = [])),
)]
pub async fn submit(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Json(task): Json<SubmitTask>,
) -> Result<(StatusCode, axum::Json<Submitted>)> {
    submit_tasks(&state, &principal, &[task]).await
}

/// Submit many tasks, all or nothing.
///
/// One rejected task rejects the whole batch and nothing is inserted. The ids answer in
/// request order.
#[utoipa::path(
    post, path = "/api/v1/tasks/batch", operation_id = "submit_task_batch", tag = "tasks",
    request_body = SubmitBatch,
    responses(
        (status = 201, description = "A task was created; `created` says which (false: the idempotency key named that task already)", body = Submitted),
        (status = 200, description = "Every task's idempotency key named a task of the same definition already: nothing was inserted", body = Submitted),
        OwnerForbidden,
        (status = 409, description = "`conflict`: an idempotency key names a task with another definition, or a task is a broadcast that no live worker serves; nothing was inserted", body = ApiError),
        (status = 413, description = "A body over 32 MiB, or more task rows than allowed per request (`--max-rows-per-request`) or per owner per minute (`--max-rows-per-owner-per-minute`)", body = ApiError),
        (status = 422, description = "The schema rejected a task; nothing was inserted", body = ApiError),
        (status = 429, response = QuotaExceeded),
    ),
    security(("bearer" = [])),
)]
pub async fn submit_batch(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Json(batch): Json<SubmitBatch>,
) -> Result<(StatusCode, axum::Json<Submitted>)> {
    if batch.tasks.len() > MAX_BATCH {
        return Err(Error::InvalidRequest(format!(
            "a batch holds at most {MAX_BATCH} tasks, this one has {}",
            batch.tasks.len()
        )));
    }
    submit_tasks(&state, &principal, &batch.tasks).await
}

async fn submit_tasks(
    state: &AppState,
    principal: &Principal,
    tasks: &[SubmitTask],
) -> Result<(StatusCode, axum::Json<Submitted>)> {
    for (index, task) in tasks.iter().enumerate() {
        validate(principal, task).map_err(|err| in_batch(err, index, tasks.len()))?;
    }
    let what = if tasks.len() == 1 {
        "this task"
    } else {
        "this batch"
    };
    let rows = state.quotas.check(tasks, what)?;
    let mut tx = sked_db::begin(&state.pool).await?;
    state.quotas.take(&mut tx, principal, rows, what).await?;
    let submitted = sked_db::task::submit_in(&mut tx, tasks, &principal.owner).await?;
    tx.commit().await?;
    // 201 when the request created a task, 200 when every idempotency key named a task
    // already (the answer names those).
    let status = if submitted.created.iter().any(|c| *c) {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(submitted)))
}

/// Prefixes the message of a batch element's error with its position.
fn in_batch(err: Error, index: usize, len: usize) -> Error {
    if len <= 1 {
        return err;
    }
    match err {
        Error::Forbidden(m) => Error::Forbidden(format!("tasks[{index}]: {m}")),
        Error::InvalidRequest(m) => Error::InvalidRequest(format!("tasks[{index}]: {m}")),
        other => other,
    }
}

/// The checks the schema cannot make, or cannot word well: ownership, and durations that fit
/// an interval.
pub(crate) fn validate(principal: &Principal, task: &SubmitTask) -> Result<()> {
    may_act_for(principal, task.owner.as_deref(), "submit tasks")?;
    check_durations(task, "")
}

/// A task's durations fit an interval (at most 100 years), and its delay is not negative;
/// `prefix` names where the task is in the request (`task.`, `workflow.tasks[2].`).
pub(crate) fn check_durations(task: &SubmitTask, prefix: &str) -> Result<()> {
    let durations = [
        ("delay_secs", task.delay_secs),
        ("timeout_secs", task.timeout_secs),
        ("backoff_base_secs", task.backoff_base_secs),
        ("backoff_max_secs", task.backoff_max_secs),
    ];
    for (field, value) in durations {
        if let Some(value) = value
            && !(value.is_finite() && value.abs() <= MAX_SECS)
        {
            return Err(Error::InvalidRequest(format!(
                "{prefix}{field} must be a number of seconds of at most 100 years"
            )));
        }
    }
    if task.delay_secs.is_some_and(|d| d < 0.0) {
        return Err(Error::InvalidRequest(format!(
            "{prefix}delay_secs must be zero or more seconds"
        )));
    }
    Ok(())
}

/// Filters of `GET /api/v1/tasks`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TaskParams {
    /// Only tasks in these states, comma-separated (`blocked`, `waiting`, `running`, `retry`,
    /// `succeeded`, `failed`, `cancelled`, `upstream_failed`, `skipped`), e.g.
    /// `failed,cancelled`.
    #[param(
        example = "failed,cancelled",
        pattern = "^ *(blocked|waiting|running|retry|succeeded|failed|cancelled|upstream_failed|skipped)? *(, *(blocked|waiting|running|retry|succeeded|failed|cancelled|upstream_failed|skipped)? *)*$"
    )]
    state: Option<String>,
    /// Only tasks of this queue.
    queue: Option<String>,
    /// Only tasks of this owner. A user token may name only its own owner.
    owner: Option<String>,
    /// Only tasks whose command line (the command, or the artifact URL, then the arguments,
    /// joined by spaces) or name contains this text, ignoring case.
    q: Option<String>,
    /// Only the tasks this worker runs now (state `running`).
    worker: Option<Uuid>,
    /// Only the shards of this sharded task (see `docs/shards.md`).
    shard_of: Option<Uuid>,
    /// `now`: only tasks whose `next_run_at` has come (at the request's time), such as the
    /// waiting tasks the overview counts as due; `later`: only those whose `next_run_at` is
    /// ahead, such as delayed tasks and retries in their backoff.
    due: Option<Due>,
    /// Only tasks that finished at or after this instant (RFC 3339), such as the overview's
    /// last hour (its `since`).
    finished_after: Option<chrono::DateTime<chrono::Utc>>,
    /// Only tasks that finished before this instant (RFC 3339).
    finished_before: Option<chrono::DateTime<chrono::Utc>>,
    /// Only tasks submitted at or after this instant (RFC 3339), by the time in their id
    /// (the UUIDv7 sked gives every task that is not inserted with an id of its own).
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    /// Only tasks submitted before this instant (RFC 3339), by the time in their id.
    created_before: Option<chrono::DateTime<chrono::Utc>>,
    /// Only the tasks of this workflow.
    workflow: Option<Uuid>,
    /// Only the occurrences of this schedule that its history keeps: the tasks it fired and
    /// the tasks of the workflows it fired.
    schedule: Option<Uuid>,
    /// The `next_cursor` of the previous page: only tasks older than this id.
    after: Option<Uuid>,
    /// Page size, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
    /// `full` (default): whole tasks; `summary`: the fields a task list shows
    /// (`TaskSummary`), without the environment, input and output.
    view: Option<ListView>,
}

impl TaskParams {
    /// The listing these parameters select, as `principal` may see it: a user token's own
    /// tasks only. Also the selection of the bulk actions, so that they act on exactly what
    /// the listing shows.
    pub(crate) fn filter(self, principal: &Principal) -> Result<ListFilter> {
        Ok(ListFilter {
            owner: listing_owner(principal, self.owner, "tasks")?,
            states: parse_states(self.state)?,
            queue: non_empty(self.queue),
            shard_of: self.shard_of,
            worker: self.worker,
            due: self.due.map(|d| d == Due::Now),
            finished_after: self.finished_after,
            finished_before: self.finished_before,
            created_after: self.created_after,
            created_before: self.created_before,
            workflow: self.workflow,
            schedule: self.schedule,
            text: non_empty(self.q),
            after: self.after,
            limit: page_size(self.limit, DEFAULT_PAGE, MAX_PAGE)?,
            ..ListFilter::default()
        })
    }

    /// The parameters given that select a page rather than tasks (`after`, `limit`, `view`).
    pub(crate) fn page_params_given(&self) -> Vec<&'static str> {
        [
            ("after", self.after.is_some()),
            ("limit", self.limit.is_some()),
            ("view", self.view.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }
}

/// The parameters of a listing that select a page rather than tasks: a bulk action and a count
/// refuse them.
const PAGE_PARAMS: [&str; 3] = ["after", "limit", "view"];

/// The query string of a request on every task a listing's filters select (a bulk action,
/// `GET /api/v1/tasks/count`): the filters of `GET /api/v1/tasks` ([`TaskParams`],
/// documented once there), without `after`, `limit` and `view`, which those refuse.
pub struct SelectionParams;

impl IntoParams for SelectionParams {
    fn into_params(parameter_in_provider: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        TaskParams::into_params(parameter_in_provider)
            .into_iter()
            .filter(|p| !PAGE_PARAMS.contains(&p.name.as_str()))
            .collect()
    }
}

/// Whether a listing takes the tasks due now or those due later (`due`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Due {
    Now,
    Later,
}

/// What a listing answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ListView {
    Full,
    Summary,
}

/// The answer of `GET /api/v1/tasks`: a page of tasks, or of summaries with `view=summary`;
/// `view` says which.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "view", rename_all = "snake_case")]
pub enum Listing {
    Full(TaskPage),
    Summary(TaskSummaryPage),
}

impl Masked for Listing {
    fn mask(&mut self) {
        match self {
            Listing::Full(page) => page.mask(),
            // Summaries carry no environment.
            Listing::Summary(_) => {}
        }
    }
}

/// The `limit` of a listing: `default` when absent, refused outside 1 to `max`.
pub(crate) fn page_size(limit: Option<i64>, default: i64, max: i64) -> Result<i64> {
    match limit {
        None => Ok(default),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(n) => Err(Error::InvalidRequest(format!(
            "limit must be between 1 and {max}, got {n}"
        ))),
    }
}

/// An empty query value (`?queue=`) means "no filter".
fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// The states of a comma-separated list (spaces around names and empty elements ignored),
/// in the order given.
fn parse_states(text: Option<String>) -> Result<Vec<TaskState>> {
    let mut states = Vec::new();
    for name in text
        .iter()
        .flat_map(|t| t.split(','))
        .map(|name| name.trim_matches(' '))
    {
        if name.is_empty() {
            continue;
        }
        let state = name
            .parse::<TaskState>()
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        if !states.contains(&state) {
            states.push(state);
        }
    }
    Ok(states)
}

/// List tasks, newest first.
///
/// Pages by keyset on the time-ordered id: pass `next_cursor` as `after` until it is null.
/// A user token lists its owner's tasks only. Filters combine with AND; each alone finds
/// its page on an index. A filter beside another that the walked index does not apply (an
/// owner beside a queue or a state, `q`, `due`, the finish times) is tested on at most
/// 10,000 tasks per request: when those give fewer matches than `limit`, the page is short
/// (even empty), `scan_limit_reached` is true and `next_cursor` continues the scan (see
/// `docs/api.md`, which also says when `q` uses the trigram index).
#[utoipa::path(
    get, path = "/api/v1/tasks", operation_id = "list_tasks", tag = "tasks",
    params(TaskParams),
    responses(
        (status = 200, description = "One page of tasks (`TaskPage`), or of task summaries with `view=summary` (`TaskSummaryPage`)", body = Listing),
        (status = 400, description = "An unknown state or view, or a malformed parameter", body = ApiError),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<TaskParams>,
) -> Result<Shown<Listing>> {
    let view = params.view.unwrap_or(ListView::Full);
    let filter = &params.filter(&principal)?;
    let ListPage {
        rows,
        next_cursor,
        scan_limit_reached,
    } = state
        .read(|pool| async move { Ok(sked_db::listing::list(&pool, filter).await?) })
        .await?;
    let tasks = rows.into_iter().map(TaskRow::into_task);
    Ok(Shown(match view {
        ListView::Full => Listing::Full(TaskPage {
            tasks: tasks.collect(),
            next_cursor,
            scan_limit_reached,
        }),
        ListView::Summary => Listing::Summary(TaskSummaryPage {
            tasks: tasks.map(|t| TaskSummary::from(&t)).collect(),
            next_cursor,
            scan_limit_reached,
        }),
    }))
}

/// Count the tasks a listing's filters select.
///
/// Takes the filters of `GET /api/v1/tasks` (not its `after`, `limit` or `view`) and counts
/// their tasks as that listing would show them, reading a bounded number of index entries:
/// exactly up to 10,000 where the filters' indexes settle it, else a lower bound with
/// `exact` false (see `docs/api.md`).
#[utoipa::path(
    get, path = "/api/v1/tasks/count", operation_id = "count_tasks", tag = "tasks",
    params(SelectionParams),
    responses(
        (status = 200, description = "The count", body = TaskCount),
        (status = 400, description = "An unknown state, a malformed parameter, or `after`, `limit` or `view`, which a count does not take", body = ApiError),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn count(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<TaskParams>,
) -> Result<axum::Json<TaskCount>> {
    if let Some(name) = params.page_params_given().first() {
        return Err(Error::InvalidRequest(format!(
            "{name} selects a listing's page, which a count does not take"
        )));
    }
    let filter = &params.filter(&principal)?;
    let counted = state
        .read(|pool| async move { Ok(sked_db::listing::count(&pool, filter).await?) })
        .await?;
    Ok(axum::Json(TaskCount {
        count: counted.count,
        exact: counted.exact,
    }))
}

/// The task `id` if it exists and the principal may see it.
async fn visible_task(state: &AppState, principal: &Principal, id: Uuid) -> Result<TaskRow> {
    sked_db::task::get(sked_db::on(&state.pool), id)
        .await?
        .filter(|row| principal.may_access(&row.owner))
        .ok_or_else(Error::not_found_task)
}

/// Read a task with the history of its attempts.
///
/// A task that has not started (`blocked`, `waiting`, `retry`) also says why it waits
/// (`waiting_reason`): due later, its queue paused, at its concurrency limit or rate limited,
/// no live worker serving its queue or having its labels, more CPU or memory than the largest
/// such worker offers, or workers busy (see `docs/runtime.md`).
///
/// Secret environment values are masked: the value of a variable whose name contains
/// `SECRET`, `TOKEN`, `PASS`, `KEY`, `AUTH`, `CREDENTIAL`, `PRIVATE`, `DSN`, `CERT`, `SESSION`,
/// `COOKIE`, `SIGNATURE` or `SALT` (ignoring case) reads `••••••`, and so does the password of
/// a `scheme://user:password@host` URL in any other value. The worker gets the real values.
///
/// With `wait` (`?wait=30s`) the answer waits until the task is in a final state
/// (`succeeded`, `failed`, `cancelled`, `upstream_failed` or `skipped`), at most that long,
/// without polling: a long poll (`docs/api.md`, "Awaiting a result").
#[utoipa::path(
    get, path = "/api/v1/tasks/{id}", operation_id = "get_task", tag = "tasks",
    params(TaskId, WaitParams),
    responses(
        (status = 200, description = "The task and its attempts, oldest first (with `wait`: once final, or its state when the wait ended)", body = TaskDetail),
        NoSuchTask,
    ),
    security(("bearer" = [])),
)]
pub async fn detail(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
    Query(wait): Query<WaitParams>,
) -> Result<Shown<TaskDetail>> {
    let wait = wait.duration()?;
    let mut row = visible_task(&state, &principal, id).await?;
    if let Some(wait) = wait
        && !row.state.is_final()
        && state.awaits.wait(Awaited::Task(id), wait).await?
    {
        row = visible_task(&state, &principal, id).await?;
    }
    let attempts = sked_db::task::attempts(&state.pool, id).await?;
    let waiting_reason = match row.state {
        TaskState::Blocked | TaskState::Waiting | TaskState::Retry => {
            sked_db::queue::waiting_reasons(&state.pool, id)
                .await?
                .into_iter()
                .next()
        }
        _ => None,
    };
    Ok(Shown(TaskDetail {
        task: row.into_task(),
        attempts,
        waiting_reason,
    }))
}

/// Parameters of `GET /api/v1/tasks/{id}/logs`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogParams {
    /// Only chunks with a larger id (the last `id` seen); default 0, from the start.
    after: Option<i64>,
    /// Chunks per response, 1 to 10000 (default 1000).
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<i64>,
}

/// Read a task's stdout and stderr chunks, oldest first.
#[utoipa::path(
    get, path = "/api/v1/tasks/{id}/logs", operation_id = "get_task_logs", tag = "tasks",
    params(TaskId, LogParams),
    responses(
        (status = 200, description = "Log chunks after `after`, oldest first", body = Vec<LogChunk>),
        NoSuchTask,
    ),
    security(("bearer" = [])),
)]
pub async fn logs(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
    Query(params): Query<LogParams>,
) -> Result<axum::Json<Vec<LogChunk>>> {
    // Whether the task exists and is the caller's, on the primary: a task just submitted
    // has its logs followed at once. Its chunks may come from the read replica, up to
    // `--read-max-staleness` behind: a follower asks again after the last chunk it has.
    visible_task(&state, &principal, id).await?;
    let limit = page_size(params.limit, DEFAULT_LOG_CHUNKS, MAX_LOG_CHUNKS)?;
    let after = params.after.unwrap_or(0);
    let chunks = state
        .read(|pool| async move { Ok(sked_db::task::logs(&pool, id, after, limit).await?) })
        .await?;
    Ok(axum::Json(chunks))
}

/// Cancel a task.
///
/// A task that has not started ends `cancelled` at once. A running task stays `running` with
/// `cancel_requested` true until its worker stops the process and records `cancelled`.
#[utoipa::path(
    post, path = "/api/v1/tasks/{id}/cancel", operation_id = "cancel_task", tag = "tasks",
    params(TaskId),
    responses(
        (status = 200, description = "The state after the call", body = StateChange),
        NoSuchTask,
        (status = 409, description = "`already_finished`: the task is in a final state", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn cancel(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<StateChange>> {
    let row = visible_task(&state, &principal, id).await?;
    if row.state.is_final() {
        return Err(Error::AlreadyFinished);
    }
    let after = sked_db::task::cancel(&state.pool, id)
        .await?
        .ok_or_else(Error::not_found_task)?;
    // The task may have finished on its own between the read and the cancel.
    if after.is_final() && after != TaskState::Cancelled {
        return Err(Error::AlreadyFinished);
    }
    Ok(axum::Json(StateChange {
        id,
        state: after,
        cancel_requested: after == TaskState::Running,
    }))
}

/// Run a finished task again.
///
/// A succeeded, failed or cancelled task becomes `waiting` now and gets at least one more
/// attempt; attempt numbers keep growing. A task with parents becomes what its trigger rule
/// gives with its parents as they are (`blocked` while some are unfinished), and its
/// descendants that ended `upstream_failed` or `skipped` wait for it again.
#[utoipa::path(
    post, path = "/api/v1/tasks/{id}/retry", operation_id = "retry_task", tag = "tasks",
    params(TaskId),
    responses(
        (status = 200, description = "The state after the call (`waiting`, or `blocked` for a task whose parents are unfinished)", body = StateChange),
        NoSuchTask,
        (status = 409, description = "`not_finished`: the task is not in a final state", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn retry(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<StateChange>> {
    let row = visible_task(&state, &principal, id).await?;
    if !row.state.is_final() {
        return Err(Error::NotFinished);
    }
    let after = sked_db::task::retry(&state.pool, id)
        .await?
        .ok_or_else(Error::not_found_task)?;
    // A task with parents may wait for them (`blocked`) or end at once by its trigger rule;
    // anything else means the task was no longer finished when the retry ran.
    if !matches!(
        after,
        TaskState::Waiting | TaskState::Blocked | TaskState::UpstreamFailed | TaskState::Skipped
    ) {
        return Err(Error::NotFinished);
    }
    Ok(axum::Json(StateChange {
        id,
        state: after,
        cancel_requested: false,
    }))
}

/// Submit a new task with the definition of this one ("run again").
///
/// The new task runs what this one runs (command or artifact, arguments, kind) with the same
/// input, environment (the real values, copied in the database), queue, priority, labels,
/// output path, timeout, attempts, backoff and shards. It belongs to the caller, waits from
/// now and has no idempotency key. The task itself is left as it is; to run the same task
/// again, retry it. Tasks of a workflow and shards cannot be resubmitted alone (409: what
/// the task is decides, not the request).
#[utoipa::path(
    post, path = "/api/v1/tasks/{id}/resubmit", operation_id = "resubmit_task", tag = "tasks",
    params(("id" = Uuid, Path, description = "Id of the task whose definition to submit again")),
    responses(
        (status = 201, description = "The new task's id", body = Submitted),
        NoSuchTask,
        (status = 413, description = "`too_large`: the task and its shards or copies are more task rows than its owner may create per minute (`--max-rows-per-owner-per-minute`)", body = ApiError),
        (status = 409, description = "`conflict`: the task belongs to a workflow, or is a shard; it runs as part of that", body = ApiError),
        (status = 429, response = QuotaExceeded),
    ),
    security(("bearer" = [])),
)]
pub async fn resubmit(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<(StatusCode, axum::Json<Submitted>)> {
    let row = visible_task(&state, &principal, id).await?;
    if let Some(workflow) = row.workflow_id {
        return Err(Error::Conflict(format!(
            "task {id} belongs to workflow {workflow} and runs with it: retry the task, or \
             submit the workflow again"
        )));
    }
    if let Some(parent) = row.shard_of {
        return Err(Error::Conflict(format!(
            "task {id} is a shard of task {parent} and runs as part of it: resubmit {parent}"
        )));
    }
    let mut tx = sked_db::begin(&state.pool).await?;
    state
        .quotas
        .take(&mut tx, &principal, rows_of_row(&row), "this resubmission")
        .await?;
    let new_id = sked_db::task::resubmit(&mut *tx, id, &principal.owner)
        .await?
        .ok_or_else(Error::not_found_task)?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(Submitted {
            ids: vec![new_id],
            created: vec![true],
        }),
    ))
}
