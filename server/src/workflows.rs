//! `/api/v1/workflows`: submit, list, read (tasks and edges), cancel and re-run DAG workflows.
//!
//! Visibility as for tasks: a `user` token sees and acts on its owner's workflows only, an
//! `admin` on all; another owner's workflow answers 404 like one that does not exist.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use sked_db::awaits::Awaited;
use sked_db::task::TaskRow;
use sked_db::token::Principal;
use sked_db::workflow::{ListFilter, WorkflowRow};
use sked_types::{
    ApiError, SubmitWorkflow, WorkflowChange, WorkflowDetail, WorkflowPage, WorkflowState,
    WorkflowSubmitted,
};
use utoipa::IntoParams;
use uuid::Uuid;

use crate::AppState;
use crate::awaits::WaitParams;
use crate::error::{Error, Result};
use crate::extract::{Auth, Json, Path, Query, listing_owner, may_act_for};
use crate::openapi::{NoSuchWorkflow, OwnerForbidden, QuotaExceeded, WorkflowId};
use crate::quotas::rows_of_workflow;
use crate::shown::Shown;
use crate::tasks::{DEFAULT_PAGE, MAX_PAGE, page_size, validate};

/// The most tasks one workflow may hold.
pub const MAX_WORKFLOW_TASKS: usize = 50_000;

/// Submit a workflow: tasks and the edges between them, all or nothing.
///
/// Each task has the fields of a task submission plus `name` (unique in the workflow),
/// `depends_on` (names) and `trigger_rule` (`all_success`, `all_done`, `one_failed` or its
/// alias `on_failure`). Cycles, self-dependencies, unknown names and repeated names are
/// rejected with 422 and nothing is inserted. The workflow and its tasks belong to the
/// token's owner; only an admin may name another owner.
#[utoipa::path(
    post, path = "/api/v1/workflows", operation_id = "submit_workflow", tag = "workflows",
    request_body = SubmitWorkflow,
    responses(
        (status = 201, description = "The workflow was created", body = WorkflowSubmitted),
        OwnerForbidden,
        (status = 409, description = "`conflict`: a task is a broadcast that no live worker serves; nothing was inserted", body = ApiError),
        (status = 413, description = "More than 50000 tasks, a body over 32 MiB, or more task rows than allowed per request (`--max-rows-per-request`) or per owner per minute (`--max-rows-per-owner-per-minute`)", body = ApiError),
        (status = 422, description = "A rule of workflows or tasks was broken (the message names it); nothing was inserted", body = ApiError),
        (status = 429, response = QuotaExceeded),
    ),
    security(("bearer" = [])),
)]
pub async fn submit(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Json(workflow): Json<SubmitWorkflow>,
) -> Result<(StatusCode, axum::Json<WorkflowSubmitted>)> {
    if workflow.tasks.len() > MAX_WORKFLOW_TASKS {
        return Err(Error::TooLarge(format!(
            "a workflow holds at most {MAX_WORKFLOW_TASKS} tasks, this one has {}",
            workflow.tasks.len()
        )));
    }
    may_act_for(&principal, workflow.owner.as_deref(), "submit workflows")?;
    for task in &workflow.tasks {
        validate(&principal, &task.task).map_err(|err| in_task(err, &task.name))?;
    }
    let rows = state
        .quotas
        .check_rows(rows_of_workflow(&workflow.tasks), "this workflow")?;
    let mut tx = sked_db::begin(&state.pool).await?;
    state
        .quotas
        .take(&mut tx, &principal, rows, "this workflow")
        .await?;
    let id = sked_db::workflow::submit(&mut *tx, &workflow, &principal.owner).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, axum::Json(WorkflowSubmitted { id })))
}

/// Prefixes the message of a task's error with its name.
fn in_task(err: Error, name: &str) -> Error {
    match err {
        Error::Forbidden(m) => Error::Forbidden(format!("task {name:?}: {m}")),
        Error::InvalidRequest(m) => Error::InvalidRequest(format!("task {name:?}: {m}")),
        other => other,
    }
}

/// Filters of `GET /api/v1/workflows`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WorkflowParams {
    /// Only workflows in this state (`running`, `succeeded`, `failed` or `cancelled`).
    state: Option<WorkflowState>,
    /// Only workflows of this owner. A user token may name only its own owner.
    owner: Option<String>,
    /// The `next_cursor` of the previous page: only workflows older than this id.
    after: Option<Uuid>,
    /// Page size, 1 to 500 (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
}

/// List workflows, newest first.
///
/// Pages by keyset on the time-ordered id: pass `next_cursor` as `after` until it is null.
#[utoipa::path(
    get, path = "/api/v1/workflows", operation_id = "list_workflows", tag = "workflows",
    params(WorkflowParams),
    responses(
        (status = 200, description = "One page of workflows", body = WorkflowPage),
        (status = 400, description = "An unknown state or a malformed parameter", body = ApiError),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<WorkflowParams>,
) -> Result<axum::Json<WorkflowPage>> {
    let limit = page_size(params.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let owner = listing_owner(&principal, params.owner, "workflows")?;
    let filter = ListFilter {
        owner,
        state: params.state,
        after: params.after,
        // One row more than the page tells whether another page follows.
        limit: limit + 1,
    };
    let filter = &filter;
    let mut rows = state
        .read(|pool| async move { Ok(sked_db::workflow::list(&pool, filter).await?) })
        .await?;
    let next_cursor = if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        rows.last().map(|row| row.id)
    } else {
        None
    };
    Ok(axum::Json(WorkflowPage {
        workflows: rows.into_iter().map(WorkflowRow::into_workflow).collect(),
        next_cursor,
    }))
}

/// The workflow `id` if it exists and the principal may see it.
async fn visible(state: &AppState, principal: &Principal, id: Uuid) -> Result<WorkflowRow> {
    sked_db::workflow::get(&state.pool, id)
        .await?
        .filter(|row| principal.may_access(&row.owner))
        .ok_or_else(Error::not_found_workflow)
}

/// Read a workflow with its tasks (in submission order, with their states) and edges.
///
/// With `wait` (`?wait=30s`) the answer waits until the workflow is in a final state
/// (`succeeded`, `failed` or `cancelled`), at most that long, without polling: a long poll
/// (`docs/api.md`, "Awaiting a result").
#[utoipa::path(
    get, path = "/api/v1/workflows/{id}", operation_id = "get_workflow", tag = "workflows",
    params(WorkflowId, WaitParams),
    responses(
        (status = 200, description = "The workflow, its tasks and its edges (with `wait`: once final, or its state when the wait ended)", body = WorkflowDetail),
        NoSuchWorkflow,
    ),
    security(("bearer" = [])),
)]
pub async fn detail(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
    Query(wait): Query<WaitParams>,
) -> Result<Shown<WorkflowDetail>> {
    let wait = wait.duration()?;
    let mut row = visible(&state, &principal, id).await?;
    if let Some(wait) = wait
        && row.state == WorkflowState::Running
        && state.awaits.wait(Awaited::Workflow(id), wait).await?
    {
        row = visible(&state, &principal, id).await?;
    }
    let tasks = sked_db::workflow::tasks(&state.pool, id).await?;
    let edges = sked_db::workflow::edges(&state.pool, id).await?;
    let subworkflows = sked_db::workflow::subworkflows(&state.pool, id).await?;
    Ok(Shown(WorkflowDetail {
        workflow: row.into_workflow(),
        tasks: tasks.into_iter().map(TaskRow::into_task).collect(),
        edges,
        subworkflows,
    }))
}

/// Cancel a workflow.
///
/// Its tasks that have not started end `cancelled` at once; running ones get a cancel
/// request and their workers stop them. The workflow is `cancelled` once none runs.
#[utoipa::path(
    post, path = "/api/v1/workflows/{id}/cancel", operation_id = "cancel_workflow", tag = "workflows",
    params(WorkflowId),
    responses(
        (status = 200, description = "The workflow's state after the call", body = WorkflowChange),
        NoSuchWorkflow,
        (status = 409, description = "`already_finished`: the workflow is finished", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn cancel(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<WorkflowChange>> {
    let row = visible(&state, &principal, id).await?;
    if row.state != WorkflowState::Running {
        return Err(Error::AlreadyFinished);
    }
    let after = sked_db::workflow::cancel(&state.pool, id)
        .await?
        .ok_or_else(Error::not_found_workflow)?;
    Ok(axum::Json(WorkflowChange {
        id,
        state: after,
        tasks_rerun: 0,
    }))
}

/// Re-run a workflow from where it failed.
///
/// Its failed and cancelled tasks run again, and the tasks after them that ended
/// `upstream_failed` or `skipped` wait for them again; succeeded tasks are not run again.
#[utoipa::path(
    post, path = "/api/v1/workflows/{id}/retry", operation_id = "retry_workflow", tag = "workflows",
    params(WorkflowId),
    responses(
        (status = 200, description = "The workflow runs again", body = WorkflowChange),
        NoSuchWorkflow,
        (status = 409, description = "`conflict`: no task of the workflow failed or was cancelled", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn retry(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<axum::Json<WorkflowChange>> {
    visible(&state, &principal, id).await?;
    let rerun = sked_db::workflow::retry(&state.pool, id)
        .await?
        .ok_or_else(Error::not_found_workflow)?;
    if rerun == 0 {
        return Err(Error::Conflict(
            "no task of the workflow failed or was cancelled: nothing to re-run".to_owned(),
        ));
    }
    let row = visible(&state, &principal, id).await?;
    Ok(axum::Json(WorkflowChange {
        id,
        state: row.state,
        tasks_rerun: rerun,
    }))
}
