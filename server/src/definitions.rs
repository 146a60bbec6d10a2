//! `/api/v1/workflow-definitions`: stored workflow definitions. Define a version, list the
//! latest of each name, read every version of one, and run one (docs/workflows.md, "Stored
//! definitions"). A definition belongs to an owner; a `user` token defines, reads and runs
//! its owner's only, and another owner's reads as one that does not exist.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use sked_db::DbError;
use sked_types::{
    ApiError, DefineWorkflow, RunWorkflowDefinition, WorkflowDefinition, WorkflowDefinitionPage,
    WorkflowSubmitted,
};
use utoipa::IntoParams;

use crate::AppState;
use crate::error::{Error, Result};
use crate::extract::{Auth, Json, Path, Query, listing_owner, may_act_for};
use crate::openapi::{DefinitionName, NoSuchDefinition, OwnerForbidden, QuotaExceeded};
use crate::quotas::rows_of_workflow_template;
use crate::shown::Shown;
use crate::workflows::MAX_WORKFLOW_TASKS;

/// A definition's own rules, as the caller reads them (`sql/definitions.sql` words them for
/// people); the workflow rules its spec broke are the workflows' (`From<DbError>`).
fn definition_error(err: DbError) -> Error {
    match err {
        DbError::Rejected {
            constraint,
            message,
        } if constraint.starts_with("workflow_definitions_") => {
            let says = message
                .strip_prefix("workflow definition: ")
                .unwrap_or(&message)
                .to_owned();
            if constraint == "workflow_definitions_must_exist" {
                Error::NotFound(says)
            } else {
                Error::Rejected(says)
            }
        }
        other => other.into(),
    }
}

/// Keep a workflow spec under a name: a new version unless it is the latest version's spec.
///
/// The spec is checked as a submission of it would be (a trial submission, rolled back), so
/// a definition that is kept can be run. Versions never change; a spec that differs from
/// the latest version's becomes the next version (201), the same spec answers the latest
/// version (200).
#[utoipa::path(
    post, path = "/api/v1/workflow-definitions", operation_id = "define_workflow", tag = "workflows",
    request_body = DefineWorkflow,
    responses(
        (status = 200, description = "The spec is the latest version's: that version", body = WorkflowDefinition),
        (status = 201, description = "A new version was kept", body = WorkflowDefinition),
        OwnerForbidden,
        (status = 409, description = "`conflict`: a task is a broadcast that no live worker serves", body = ApiError),
        (status = 413, description = "More than 50000 tasks", body = ApiError),
        (status = 422, description = "`rejected`: the name is not a name, the spec names an owner, or the spec breaks a rule of workflows or tasks (the message names it); nothing was kept", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn define(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Json(body): Json<DefineWorkflow>,
) -> Result<(StatusCode, Shown<WorkflowDefinition>)> {
    if body.spec.tasks.len() > MAX_WORKFLOW_TASKS {
        return Err(Error::TooLarge(format!(
            "a workflow holds at most {MAX_WORKFLOW_TASKS} tasks, this one has {}",
            body.spec.tasks.len()
        )));
    }
    may_act_for(&principal, body.owner.as_deref(), "define workflows")?;
    if body.spec.owner.is_some() {
        return Err(Error::Rejected(
            "spec.owner: a definition's spec takes no owner; the definition's owner owns \
             each run (give `owner` beside `spec`)"
                .to_owned(),
        ));
    }
    for (i, t) in body.spec.tasks.iter().enumerate() {
        crate::tasks::check_durations(&t.task, &format!("spec.tasks[{i}]."))?;
    }
    let owner = body.owner.as_deref().unwrap_or(&principal.owner);
    let mut tx = sked_db::begin(&state.pool).await?;
    let (definition, created) = sked_db::definition::define(&mut tx, &body, owner)
        .await
        .map_err(definition_error)?;
    tx.commit().await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Shown(definition)))
}

/// Filters of the definition listings.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DefinitionParams {
    /// Only definitions of this owner. A user token may name only its own owner.
    owner: Option<String>,
}

/// List stored workflow definitions: the latest version of each, by owner and name.
#[utoipa::path(
    get, path = "/api/v1/workflow-definitions", operation_id = "list_workflow_definitions", tag = "workflows",
    params(DefinitionParams),
    responses(
        (status = 200, description = "The latest version of each definition", body = WorkflowDefinitionPage),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<DefinitionParams>,
) -> Result<Shown<WorkflowDefinitionPage>> {
    let owner = listing_owner(&principal, params.owner, "workflow definitions")?;
    let definitions = sked_db::definition::latest(&state.pool, owner.as_deref()).await?;
    Ok(Shown(WorkflowDefinitionPage { definitions }))
}

/// Read every version of a stored workflow definition, newest first.
#[utoipa::path(
    get, path = "/api/v1/workflow-definitions/{name}", operation_id = "get_workflow_definition", tag = "workflows",
    params(DefinitionName, DefinitionParams),
    responses(
        (status = 200, description = "Its versions, newest first", body = WorkflowDefinitionPage),
        OwnerForbidden,
        NoSuchDefinition,
    ),
    security(("bearer" = [])),
)]
pub async fn versions(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(name): Path<String>,
    Query(params): Query<DefinitionParams>,
) -> Result<Shown<WorkflowDefinitionPage>> {
    may_act_for(
        &principal,
        params.owner.as_deref(),
        "read workflow definitions",
    )?;
    let owner = params.owner.as_deref().unwrap_or(&principal.owner);
    let definitions = sked_db::definition::versions(&state.pool, owner, &name).await?;
    if definitions.is_empty() {
        return Err(Error::NotFound(format!(
            "{owner} has no workflow definition {name:?}"
        )));
    }
    Ok(Shown(WorkflowDefinitionPage { definitions }))
}

/// Run a stored workflow definition: its latest version, or the one named, with parameters
/// over its own. The workflow names the definition and version it was run from.
#[utoipa::path(
    post, path = "/api/v1/workflow-definitions/{name}/runs", operation_id = "run_workflow_definition", tag = "workflows",
    params(DefinitionName),
    request_body = RunWorkflowDefinition,
    responses(
        (status = 201, description = "The workflow was submitted", body = WorkflowSubmitted),
        OwnerForbidden,
        NoSuchDefinition,
        (status = 409, description = "`conflict`: a task is a broadcast that no live worker serves; nothing was inserted", body = ApiError),
        (status = 413, description = "`too_large`: the workflow is more task rows than its owner may create per minute (`--max-rows-per-owner-per-minute`)", body = ApiError),
        (status = 422, description = "`rejected`: the parameters break a rule of workflows (the message names it); nothing was inserted", body = ApiError),
        (status = 429, response = QuotaExceeded),
    ),
    security(("bearer" = [])),
)]
pub async fn run(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(name): Path<String>,
    Json(body): Json<RunWorkflowDefinition>,
) -> Result<(StatusCode, axum::Json<WorkflowSubmitted>)> {
    may_act_for(&principal, body.owner.as_deref(), "run workflows")?;
    let owner = body.owner.as_deref().unwrap_or(&principal.owner);
    let definitions = sked_db::definition::versions(&state.pool, owner, &name).await?;
    let definition = definitions
        .iter()
        .find(|d| body.version.is_none_or(|v| v == d.version))
        .ok_or_else(|| {
            Error::NotFound(match body.version {
                Some(v) => format!("{owner} has no workflow definition {name:?} of version {v}"),
                None => format!("{owner} has no workflow definition {name:?}"),
            })
        })?;
    let rows = rows_of_workflow_template(&definition.spec);
    let mut tx = sked_db::begin(&state.pool).await?;
    state
        .quotas
        .take(&mut tx, &principal, rows, "this workflow")
        .await?;
    let id = sked_db::definition::run(
        &mut *tx,
        owner,
        &name,
        Some(definition.version),
        body.params.as_ref(),
    )
    .await
    .map_err(definition_error)?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, axum::Json(WorkflowSubmitted { id })))
}
