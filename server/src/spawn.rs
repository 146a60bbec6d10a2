//! `POST /api/v1/tasks/{id}/spawn`: a running task adds work to its own workflow, with the
//! token its worker gave it (`SKED_TOKEN`, [`sked_db::task_token`]): a task of kind `workflow`
//! that runs the workflow of the body (its tasks, or a stored definition), depending on the
//! spawning task, which its own children wait for unless `wait` is false
//! (`docs/workflows.md`, "Sub-workflows").
//!
//! The token's MAC says which attempt it was minted for; `sked.task_spawn` decides, in the
//! transaction that inserts, that this attempt is the task's current one, running, with its
//! lease not expired (else 403 and nothing inserted). The rows are taken from the quota of the
//! task's owner, as a submission of that owner's would take them.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use sked_db::token::{Principal, Role};
use sked_types::{ApiError, SubWorkflow};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::AppState;
use crate::error::{Error, Result};
use crate::extract::{Json, Path, TaskAuth};
use crate::openapi::{QuotaExceeded, TaskId};
use crate::quotas::{rows_of_workflow, rows_of_workflow_template};

/// What a running task spawns: a sub-workflow (as a workflow task's `workflow`: its tasks, or
/// a stored definition of the task's owner), its `name` naming the new task too, and `wait`.
/// Its OpenAPI schema is the sub-workflow's with `wait` (`openapi.rs`, `other_rules`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SpawnWorkflow {
    /// Whether the spawning task's children wait for the new task too (default true): they
    /// run after it has finished, and by its outcome. With false, the new task runs beside
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
    #[serde(flatten)]
    pub workflow: SubWorkflow,
}

impl<'de> Deserialize<'de> for SpawnWorkflow {
    /// `wait` is taken out, and the rest must be a valid [`SubWorkflow`] (whose unknown keys
    /// are refused, which `#[serde(flatten)]` would not do).
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut map = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
        let wait = match map.remove("wait") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Bool(wait)) => Some(wait),
            Some(_) => return Err(D::Error::custom("`wait` must be true or false")),
        };
        let workflow = sked_types::strict::from_value(serde_json::Value::Object(map))
            .map_err(D::Error::custom)?;
        Ok(SpawnWorkflow { wait, workflow })
    }
}

impl utoipa::PartialSchema for SpawnWorkflow {
    /// Replaced by the sub-workflow's schema with `wait` when the document is made.
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new().into()
    }
}

impl ToSchema for SpawnWorkflow {}

/// The answer to a spawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Spawned {
    /// The id of the new task (of kind `workflow`) in the spawning task's workflow.
    pub id: Uuid,
}

/// Spawn a workflow from a running task.
///
/// Only a task token may call it (the `SKED_TOKEN` a worker started with `--api-url` gives a
/// running task), and only for its own task. The new task, of kind `workflow`, joins the
/// spawning task's workflow and depends on it; with `wait` (the default) the spawning task's
/// children also wait for it.
#[utoipa::path(
    post, path = "/api/v1/tasks/{id}/spawn", operation_id = "spawn_task", tag = "tasks",
    params(TaskId),
    request_body = SpawnWorkflow,
    responses(
        (status = 201, description = "The new task's id", body = Spawned),
        (status = 403, description = "`forbidden`: not a task token, the token of another task, or its attempt is no longer the task's running attempt (it ended, its lease expired, or another attempt runs); nothing was inserted", body = ApiError),
        (status = 409, description = "`conflict`: a task is a broadcast that no live worker serves; nothing was inserted", body = ApiError),
        (status = 413, description = "`too_large`: the workflow is more task rows than allowed per request (`--max-rows-per-request`) or than its owner may create per minute (`--max-rows-per-owner-per-minute`)", body = ApiError),
        (status = 422, description = "`rejected`: the task is in no workflow or is a shard, the workflow names a task the workflow has already, or the workflow breaks a rule (the message names it; a definition that is not the owner's, say); nothing was inserted", body = ApiError),
        (status = 429, response = QuotaExceeded),
    ),
    security(("bearer" = [])),
)]
pub async fn spawn(
    State(state): State<AppState>,
    TaskAuth(token): TaskAuth,
    Path(id): Path<Uuid>,
    Json(body): Json<SpawnWorkflow>,
) -> Result<(StatusCode, axum::Json<Spawned>)> {
    if token.task != id {
        return Err(Error::Forbidden(format!(
            "this task token is task {}'s: a task may spawn into its own workflow only",
            token.task
        )));
    }
    let spec = spec_of(&body)?;
    let mut tx = sked_db::begin(&state.pool).await?;
    let owner: Option<String> = sqlx::query_scalar("select owner from sked.tasks where id = $1")
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(owner) = owner else {
        return Err(Error::Forbidden(format!(
            "task {id} no longer exists: its token spawns nothing"
        )));
    };
    let sub = &body.workflow;
    let rows = 1 + match &sub.definition {
        Some(name) => definition_rows(&state, &owner, name, sub.version).await?,
        None => rows_of_workflow(sub.tasks.as_deref().unwrap_or_default()),
    };
    if rows > state.quotas.max_rows_per_request {
        return Err(Error::TooLarge(format!(
            "this spawn would create {rows} task rows (the new task, the workflow's tasks, \
             shards and copies); this server allows at most {} per request \
             (--max-rows-per-request)",
            state.quotas.max_rows_per_request
        )));
    }
    let principal = Principal {
        owner,
        role: Role::User,
    };
    state
        .quotas
        .take(&mut tx, &principal, rows, "this spawn")
        .await?;
    let new_id: Uuid = sqlx::query_scalar("select sked.task_spawn($1, $2, $3)")
        .bind(id)
        .bind(token.attempt)
        .bind(spec)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, axum::Json(Spawned { id: new_id })))
}

/// The body as `sked.task_spawn` takes it: the sub-workflow as a workflow task's `workflow`
/// is sent ([`sked_db::workflow::subworkflow_json`]: tasks as `sked.workflow_submit` reads
/// them, durations as intervals), with `name` and `wait`. What a sub-workflow may be is the
/// SQL's rule (`workflows_subworkflow_must_be_valid`, 422).
fn spec_of(body: &SpawnWorkflow) -> Result<serde_json::Value> {
    let mut spec = sked_db::workflow::subworkflow_json(&body.workflow)?;
    if let Some(wait) = body.wait {
        spec["wait"] = serde_json::json!(wait);
    }
    Ok(spec)
}

/// The rows of a stored definition's run; none when it is not there (`sked.task_spawn` says
/// so).
async fn definition_rows(
    state: &AppState,
    owner: &str,
    name: &str,
    version: Option<i32>,
) -> Result<u64> {
    let versions = sked_db::definition::versions(&state.pool, owner, name).await?;
    Ok(versions
        .iter()
        .find(|d| version.is_none_or(|v| v == d.version))
        .map(|d| rows_of_workflow_template(&d.spec))
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(value: serde_json::Value) -> SpawnWorkflow {
        sked_types::strict::from_value(value).unwrap()
    }

    #[test]
    fn a_spawn_of_tasks_is_sent_as_a_workflow_spec() {
        let spec = spec_of(&body(json!({
            "name": "more", "wait": false, "params": {"n": 2},
            "tasks": [{"name": "a", "command": ["true"], "timeout_secs": 90},
                      {"name": "b", "command": ["true"], "depends_on": ["a"]}],
        })))
        .unwrap();
        assert_eq!(spec["name"], "more");
        assert_eq!(spec["wait"], false);
        assert_eq!(spec["params"], json!({"n": 2}));
        assert_eq!(spec["tasks"][0]["name"], "a");
        assert!(spec["tasks"][0].get("timeout_secs").is_none(), "{spec}");
        assert!(spec["tasks"][0].get("timeout").is_some(), "{spec}");
        assert_eq!(spec["tasks"][1]["depends_on"], json!(["a"]));
        assert!(spec.get("definition").is_none());
    }

    #[test]
    fn a_spawn_of_a_definition_names_it() {
        let spec = spec_of(&body(json!({"definition": "etl", "version": 2,
                                         "params": {"day": "monday"}})))
        .unwrap();
        assert_eq!(
            spec,
            json!({"definition": "etl", "version": 2, "params": {"day": "monday"}})
        );
    }

    #[test]
    fn a_spawn_is_a_sub_workflow_with_wait_and_its_rules_are_the_sql_s() {
        // Both, or neither: sent as they are, for `workflows_subworkflow_must_be_valid`.
        let both = json!({"definition": "etl", "tasks": [{"name": "a", "command": ["true"]}]});
        assert_eq!(spec_of(&body(both)).unwrap()["definition"], "etl");
        assert_eq!(spec_of(&body(json!({}))).unwrap(), json!({"tasks": []}));
        for bad in [
            json!({"tasks": [], "x": 1}),
            json!({"wait": "yes"}),
            json!({"tasks": null, "definition": 3}),
        ] {
            assert!(
                sked_types::strict::from_value::<SpawnWorkflow>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
