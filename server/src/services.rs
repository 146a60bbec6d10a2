//! `/api/v1/services`: long-running services (see docs/services.md). A service is submitted
//! as a task of kind `service` (`POST /api/v1/tasks`) and stopped by cancelling it
//! (`POST /api/v1/tasks/{id}/cancel`); here it is listed, read with its copies, and changed
//! (a rolling update, or scaling). A user token sees its owner's services only, an admin's
//! all; another owner's service reads as absent. Secret environment values are masked.

use axum::extract::State;
use serde::Deserialize;
use sked_db::token::Principal;
use sked_types::service::{Service, ServiceList, ServiceUpdated, UpdateService};
use sked_types::{ApiError, TaskKind};
use utoipa::IntoParams;
use uuid::Uuid;

use crate::AppState;
use crate::error::{Error, Result};
use crate::extract::{Auth, Json, Path, Query, listing_owner};
use crate::openapi::{NoSuchService, OwnerForbidden, QuotaExceeded, ServiceId};
use crate::shown::Shown;

/// Most services one listing returns.
pub const MAX_SERVICES: i64 = 1000;

/// Parameters of `GET /api/v1/services`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ServiceParams {
    /// Only services of this owner. A user token may name only its own owner.
    owner: Option<String>,
}

/// List the services that run (an ended service is read as a task, `GET
/// /api/v1/tasks/{id}`), oldest first, at most 1000, with the copies wanted and up; without
/// their copies.
#[utoipa::path(
    get, path = "/api/v1/services", operation_id = "list_services", tag = "services",
    params(ServiceParams),
    responses(
        (status = 200, description = "The services that run", body = ServiceList),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<ServiceParams>,
) -> Result<Shown<ServiceList>> {
    let owner = listing_owner(&principal, params.owner, "services")?;
    let rows = sked_db::service::running(&state.pool, owner.as_deref(), MAX_SERVICES).await?;
    let services = sked_db::service::summaries(&state.pool, rows).await?;
    Ok(Shown(ServiceList { services }))
}

/// Read a service with its copies: per copy its index, generation, state, worker (id, host,
/// name; for a user token no host, and the name the workers' list gives it), start of the
/// attempt and of the process (uptime), restarts, the time it starts
/// again while it backs off, and its last exits. Copies retired by a scale-down or a rolling
/// update show with `retired` until they have stopped. The logs of a copy are its task's
/// (`GET /api/v1/tasks/{copy id}/logs`).
#[utoipa::path(
    get, path = "/api/v1/services/{id}", operation_id = "get_service", tag = "services",
    params(ServiceId),
    responses(
        (status = 200, description = "The service and its copies", body = Service),
        NoSuchService,
    ),
    security(("bearer" = [])),
)]
pub async fn detail(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
) -> Result<Shown<Service>> {
    let row = visible_service(&state, &principal, id).await?;
    let mut service = sked_db::service::detail(&state.pool, row).await?;
    if !principal.is_admin() {
        // Where workers run is for admins only, as in `GET /api/v1/workers`.
        for copy in &mut service.copies {
            let host = copy.worker_host.take().unwrap_or_default();
            if let (Some(id), Some(name)) = (copy.worker_id, copy.worker_name.as_mut()) {
                *name = crate::system::name_for_users(id, name, &host);
            }
        }
    }
    Ok(Shown(service))
}

/// Change a service that runs: its definition (`command`, `args`, `env`, `input`,
/// `artifact_url`, `artifact_sha256`, `labels`, `cpu_millis`, `memory_mb`,
/// `max_output_bytes`, `run_as`, `restart_policy`, `health_check`) and/or `replicas`. Keys
/// left out keep their values; `null` removes an optional value. A changed definition bumps
/// the generation and the copies roll over one at a time: a new copy starts next to an old
/// one, and the old one is stopped once the new one has run for 2 s (and passed its health
/// check when it has one). `replicas` adds copies, or stops those of the highest indexes.
/// Bad input changes nothing.
#[utoipa::path(
    patch, path = "/api/v1/services/{id}", operation_id = "update_service", tag = "services",
    params(ServiceId),
    request_body = UpdateService,
    responses(
        (status = 200, description = "The generation and replicas after the change", body = ServiceUpdated),
        (status = 400, description = "A malformed body, an unknown key, or an env value that holds the mask", body = ApiError),
        NoSuchService,
        (status = 409, description = "`already_finished`: the service has ended; `conflict`: the change would leave the service with neither a command nor an artifact, with both, or with an artifact without its SHA-256 (the keys it sends and the ones it keeps decide)", body = ApiError),
        (status = 413, description = "`too_large`: the copies the change makes are more task rows than the owner may create per minute (`--max-rows-per-owner-per-minute`)", body = ApiError),
        (status = 422, description = "A value breaks a rule (named in the message)", body = ApiError),
        (status = 429, response = QuotaExceeded),
    ),
    security(("bearer" = [])),
)]
pub async fn update(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(id): Path<Uuid>,
    Json(changes): Json<serde_json::Value>,
) -> Result<axum::Json<ServiceUpdated>> {
    let changes = check_changes(&changes)?;
    let row = visible_service(&state, &principal, id).await?;
    if row.state.is_final() {
        return Err(Error::AlreadyFinished);
    }
    let mut tx = sked_db::begin(&state.pool).await?;
    let generation = sked_db::service::update(&mut *tx, id, &changes)
        .await
        .map_err(change_error)?
        .ok_or_else(not_found)?;
    let replicas = changes
        .get("replicas")
        .and_then(|r| r.as_i64())
        .map(|r| r as i32)
        .or(row.replicas)
        .unwrap_or(1);
    // The copies this change makes: the added ones, or, when the definition changed, a new
    // copy at every index (the rolling update replaces each).
    let before = row.replicas.unwrap_or(1);
    let rows = if row.generation.is_some_and(|g| g != generation) {
        replicas
    } else {
        (replicas - before).max(0)
    };
    state
        .quotas
        .take(
            &mut tx,
            &principal,
            u64::try_from(rows).unwrap_or(0),
            "this change of the service",
        )
        .await?;
    tx.commit().await?;
    Ok(axum::Json(ServiceUpdated {
        id,
        generation,
        replicas,
    }))
}

/// What the schema cannot word well: the body's shape, unknown keys, and an env value that
/// holds the mask answers show (sending back a read service's env would store the mask).
/// Answers the changes as the typed form reads them, each key sent with its value (`null`
/// kept): an integer sent as `9975.0`, which JSON Schema counts as an integer, reaches the
/// database as `9975`.
fn check_changes(changes: &serde_json::Value) -> Result<serde_json::Value> {
    let Some(map) = changes.as_object() else {
        return Err(Error::InvalidRequest(
            "the body must be a JSON object of the keys to change".to_owned(),
        ));
    };
    const KEYS: &[&str] = &[
        "command",
        "args",
        "env",
        "input",
        "artifact_url",
        "artifact_sha256",
        "labels",
        "cpu_millis",
        "memory_mb",
        "max_output_bytes",
        "run_as",
        "restart_policy",
        "health_check",
        "replicas",
    ];
    let unknown: Vec<&str> = map
        .keys()
        .map(String::as_str)
        .filter(|k| !KEYS.contains(k))
        .collect();
    if !unknown.is_empty() {
        return Err(Error::InvalidRequest(format!(
            "unknown or unchangeable keys: {} (changeable: {})",
            unknown.join(", "),
            KEYS.join(", ")
        )));
    }
    if map.is_empty() {
        return Err(Error::InvalidRequest("nothing to change".to_owned()));
    }
    // The typed form catches wrong types with a message naming the field.
    let typed = sked_types::strict::from_value::<UpdateService>(changes.clone())
        .map_err(|e| Error::InvalidRequest(format!("invalid changes: {e}")))?;
    let typed = serde_json::to_value(typed).map_err(|e| Error::Internal(Box::new(e)))?;
    if let Some(env) = map.get("env").and_then(|e| e.as_object()) {
        for (name, value) in env {
            if value
                .as_str()
                .is_some_and(|v| v.contains(sked_types::secrets::MASK))
            {
                return Err(Error::InvalidRequest(format!(
                    "env {name}: the value holds the mask '{}' that answers show in place of a \
                     secret; send the real value",
                    sked_types::secrets::MASK
                )));
            }
        }
    }
    Ok(serde_json::Value::Object(
        map.keys()
            .map(|key| (key.clone(), typed[key].clone()))
            .collect(),
    ))
}

/// The rules on what a service runs that its definition after a change breaks, and what the
/// caller is told. Whether a change breaks them depends on the definition it changes as much
/// as on the request (`{"command": null}` is right for a service that runs an artifact, and
/// leaves one that runs a command with nothing to run), so they are refused with 409
/// `conflict`, not as a bad request.
const LEFT_BY_THE_CHANGE: &[(&str, &str)] = &[
    (
        "tasks_command_or_artifact_is_required",
        "this change leaves the service with neither a command nor an artifact_url: give the \
         one that replaces what it removes in the same change",
    ),
    (
        "tasks_command_and_artifact_are_exclusive",
        "this change leaves the service with both a command and an artifact_url: remove the \
         other one (null) in the same change",
    ),
    (
        "tasks_artifact_requires_sha256",
        "this change leaves the service's artifact_url without an artifact_sha256: give the \
         artifact's SHA-256 in the same change",
    ),
];

/// A database refusal of a change, as the caller reads it (see [`LEFT_BY_THE_CHANGE`]).
fn change_error(err: sked_db::DbError) -> Error {
    if let sked_db::DbError::Rejected { constraint, .. } = &err
        && let Some((_, says)) = LEFT_BY_THE_CHANGE
            .iter()
            .find(|(rule, _)| rule == constraint)
    {
        return Error::Conflict((*says).to_owned());
    }
    err.into()
}

fn not_found() -> Error {
    Error::NotFound("no such service".to_owned())
}

/// The service `id` if it exists, is a service, and the principal may see it.
async fn visible_service(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
) -> Result<sked_db::task::TaskRow> {
    sked_db::task::get(sked_db::on(&state.pool), id)
        .await?
        .filter(|row| {
            row.kind == TaskKind::Service
                && row.shard_of.is_none()
                && principal.may_access(&row.owner)
        })
        .ok_or_else(not_found)
}
