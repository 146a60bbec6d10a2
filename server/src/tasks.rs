//! `/api/v1/tasks`: submit, list, read, follow logs, cancel and retry.
//!
//! Visibility: a `user` token sees and acts on its owner's tasks only, an `admin` on all. A
//! task the caller may not see answers 404 exactly like a task that does not exist, so ids of
//! other owners' tasks leak nothing.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use sked_db::task::{ListFilter, TaskRow};
use sked_db::token::Principal;
use sked_types::{
    ApiError, LogChunk, StateChange, SubmitBatch, SubmitTask, Submitted, TaskDetail, TaskPage,
    TaskState,
};
use utoipa::IntoParams;
use uuid::Uuid;

use crate::AppState;
use crate::error::{Error, Result};
use crate::extract::{Auth, Json, Path, Query, listing_owner, may_act_for};

/// The most tasks one batch may hold.
pub const MAX_BATCH: usize = 10_000;
/// The largest body `POST /api/v1/tasks/batch` reads (a full batch of ordinary tasks fits).
pub const MAX_BATCH_BODY: usize = 32 * 1024 * 1024;
/// Page size of a task listing when `limit` is absent, and its upper bound.
pub const DEFAULT_PAGE: i64 = 50;
pub const MAX_PAGE: i64 = 500;
/// Log chunks per request when `limit` is absent, and its upper bound.
pub const DEFAULT_LOG_CHUNKS: i64 = 1_000;
pub const MAX_LOG_CHUNKS: i64 = 10_000;
/// The longest duration a submission may give, in seconds (100 years).
const MAX_SECS: f64 = 100.0 * 365.25 * 86_400.0;

/// Submit one task.
///
/// The owner defaults to the token's owner; only an admin may name another owner.
#[utoipa::path(
    post, path = "/api/v1/tasks", operation_id = "submit_task", tag = "tasks",
    request_body = SubmitTask,
    responses(
        (status = 201, description = "The task was created (or an unfinished task with the same idempotency key exists)", body = Submitted),
        (status = 400, description = "Malformed JSON or an unknown field", body = ApiError),
        (status = 401, description = "No valid token", body = ApiError),
        (status = 403, description = "A user token named another owner", body = ApiError),
        (status = 409, description = "The idempotency key is taken", body = ApiError),
        (status = 422, description = "The schema rejected the task; the message names the rule", body = ApiError),
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
        (status = 201, description = "Every task was created", body = Submitted),
        (status = 400, description = "Malformed JSON or an unknown field", body = ApiError),
        (status = 401, description = "No valid token", body = ApiError),
        (status = 403, description = "A user token named another owner", body = ApiError),
        (status = 409, description = "An idempotency key is taken", body = ApiError),
        (status = 413, description = "More than 10000 tasks, or a body over 32 MiB", body = ApiError),
        (status = 422, description = "The schema rejected a task; nothing was inserted", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn submit_batch(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Json(batch): Json<SubmitBatch>,
) -> Result<(StatusCode, axum::Json<Submitted>)> {
    if batch.tasks.len() > MAX_BATCH {
        return Err(Error::TooLarge(format!(
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
    let ids = sked_db::task::submit(&state.pool, tasks, &principal.owner).await?;
    Ok((StatusCode::CREATED, axum::Json(Submitted { ids })))
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

/// The checks the schema cannot make, or cannot word well: ownership, durations that fit an
/// interval, and strings Postgres cannot store.
pub(crate) fn validate(principal: &Principal, task: &SubmitTask) -> Result<()> {
    may_act_for(principal, task.owner.as_deref(), "submit tasks")?;
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
                "{field} must be a number of seconds of at most 100 years"
            )));
        }
    }
    if task.delay_secs.is_some_and(|d| d < 0.0) {
        return Err(Error::InvalidRequest(
            "delay_secs must be zero or more seconds".to_owned(),
        ));
    }
    // Postgres text and jsonb cannot hold U+0000; serde_json writes it as this escape.
    let json = serde_json::to_string(task).map_err(|e| Error::Internal(Box::new(e)))?;
    if json.contains("\\u0000") {
        return Err(Error::InvalidRequest(
            "strings must not contain the NUL character (U+0000)".to_owned(),
        ));
    }
    Ok(())
}

/// Filters of `GET /api/v1/tasks`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only tasks in this state (`blocked`, `waiting`, `running`, `retry`, `succeeded`,
    /// `failed`, `cancelled`, `upstream_failed` or `skipped`).
    #[param(value_type = Option<TaskState>)]
    state: Option<String>,
    /// Only tasks of this queue.
    queue: Option<String>,
    /// Only tasks of this owner. A user token may name only its own owner.
    owner: Option<String>,
    /// Only the shards of this sharded task (see `docs/shards.md`).
    shard_of: Option<Uuid>,
    /// The `next_cursor` of the previous page: only tasks older than this id.
    after: Option<Uuid>,
    /// Page size, 1 to 500 (default 50; larger values are capped at 500).
    limit: Option<i64>,
}

/// An empty query value (`?queue=`) means "no filter".
fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// List tasks, newest first.
///
/// Pages by keyset on the time-ordered id: pass `next_cursor` as `after` until it is null.
/// A user token lists its owner's tasks only.
#[utoipa::path(
    get, path = "/api/v1/tasks", operation_id = "list_tasks", tag = "tasks",
    params(ListParams),
    responses(
        (status = 200, description = "One page of tasks", body = TaskPage),
        (status = 400, description = "An unknown state or a malformed parameter", body = ApiError),
        (status = 401, description = "No valid token", body = ApiError),
        (status = 403, description = "A user token named another owner", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<TaskPage>> {
    let task_state = non_empty(params.state)
        .map(|s| s.parse::<TaskState>())
        .transpose()
        .map_err(|e| Error::InvalidRequest(e.to_string()))?;
    let limit = params.limit.unwrap_or(DEFAULT_PAGE);
    if limit < 1 {
        return Err(Error::InvalidRequest(format!(
            "limit must be between 1 and {MAX_PAGE}"
        )));
    }
    let limit = limit.min(MAX_PAGE);
    let owner = listing_owner(&principal, params.owner, "tasks")?;
    let filter = ListFilter {
        owner,
        state: task_state,
        queue: non_empty(params.queue),
        shard_of: params.shard_of,
        after: params.after,
        // One row more than the page tells whether another page follows.
        limit: limit + 1,
    };
    let mut rows = sked_db::task::list(&state.pool, &filter).await?;
    let next_cursor = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|row| row.id)
    } else {
        None
    };
    Ok(axum::Json(TaskPage {
        tasks: rows.into_iter().map(TaskRow::into_task).collect(),
        next_cursor,
    }))
}

/// The task `id` if it exists and the principal may see it.
async fn visible_task(state: &AppState, principal: &Principal, id: Uuid) -> Result<TaskRow> {
    sked_db::task::get(&state.pool, id)
        .await?
        .filter(|row| principal.may_access(&row.owner))
        .ok_or_else(Error::not_found_task)
}

/// Read a task with the history of its attempts.
#[utoipa::path(
    get, path = "/api/v1/tasks/{id}", operation_id = "get_task", tag = "tasks",
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The task and its attempts, oldest first", body = TaskDetail),
        (status = 400, description = "The id is not a UUID", body = ApiError),
        (status = 401, description = "No valid token", body = ApiError),
        (status = 404, description = "No such task, or not the caller's", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn detail(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<TaskDetail>> {
    let row = visible_task(&state, &principal, id).await?;
    let attempts = sked_db::task::attempts(&state.pool, id).await?;
    Ok(axum::Json(TaskDetail {
        task: row.into_task(),
        attempts,
    }))
}

/// Parameters of `GET /api/v1/tasks/{id}/logs`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct LogParams {
    /// Only chunks with a larger id (the last `id` seen); default 0, from the start.
    after: Option<i64>,
    /// Chunks per response, 1 to 10000 (default 1000; larger values are capped).
    limit: Option<i64>,
}

/// Read a task's stdout and stderr chunks, oldest first.
#[utoipa::path(
    get, path = "/api/v1/tasks/{id}/logs", operation_id = "get_task_logs", tag = "tasks",
    params(("id" = Uuid, Path, description = "Task id"), LogParams),
    responses(
        (status = 200, description = "Log chunks after `after`, oldest first", body = Vec<LogChunk>),
        (status = 400, description = "A malformed parameter", body = ApiError),
        (status = 401, description = "No valid token", body = ApiError),
        (status = 404, description = "No such task, or not the caller's", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn logs(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
    Query(params): Query<LogParams>,
) -> Result<axum::Json<Vec<LogChunk>>> {
    visible_task(&state, &principal, id).await?;
    let limit = params.limit.unwrap_or(DEFAULT_LOG_CHUNKS);
    if limit < 1 {
        return Err(Error::InvalidRequest(format!(
            "limit must be between 1 and {MAX_LOG_CHUNKS}"
        )));
    }
    let chunks = sked_db::task::logs(
        &state.pool,
        id,
        params.after.unwrap_or(0),
        limit.min(MAX_LOG_CHUNKS),
    )
    .await?;
    Ok(axum::Json(chunks))
}

/// Cancel a task.
///
/// A task that has not started ends `cancelled` at once. A running task stays `running` with
/// `cancel_requested` true until its worker stops the process and records `cancelled`.
#[utoipa::path(
    post, path = "/api/v1/tasks/{id}/cancel", operation_id = "cancel_task", tag = "tasks",
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The state after the call", body = StateChange),
        (status = 401, description = "No valid token", body = ApiError),
        (status = 404, description = "No such task, or not the caller's", body = ApiError),
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
    if row.state().is_final() {
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
    params(("id" = Uuid, Path, description = "Task id")),
    responses(
        (status = 200, description = "The state after the call (`waiting`, or `blocked` for a task whose parents are unfinished)", body = StateChange),
        (status = 401, description = "No valid token", body = ApiError),
        (status = 404, description = "No such task, or not the caller's", body = ApiError),
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
    if !row.state().is_final() {
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
