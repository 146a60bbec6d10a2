//! `/api/v1/alert-targets`: the webhooks notifications are delivered to (admin tokens only),
//! and `/api/v1/queues/{name}/notify`, a queue's notify (see `docs/operations.md`, "Alerts").

use axum::extract::State;
use sked_db::token::Principal;
use sked_types::{AlertTarget, QueueNotify, SetAlertTarget};
use utoipa::IntoParams;
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::{Required, schema};

use crate::AppState;
use crate::error::{Error, Result};
use crate::extract::{Auth, Json, Path};
use crate::openapi::{AdminOnly, QueueNamed};

/// `{name}` of an alert target.
pub(crate) struct TargetNamed;

impl IntoParams for TargetNamed {
    fn into_params(_: impl Fn() -> Option<ParameterIn>) -> Vec<Parameter> {
        vec![
            ParameterBuilder::new()
                .name("name")
                .parameter_in(ParameterIn::Path)
                .required(Required::True)
                .description(Some("The alert target's name"))
                .schema(Some(
                    schema::ObjectBuilder::new()
                        .schema_type(schema::Type::String)
                        .pattern(Some(sked_types::QUEUE_NAME_PATTERN)),
                ))
                .build(),
        ]
    }
}

/// Refuses a user token: targets hold secrets, and a queue's notify covers every owner's
/// tasks.
fn admin_only(principal: &Principal) -> Result<()> {
    if principal.is_admin() {
        Ok(())
    } else {
        Err(Error::Forbidden(
            "only an admin token may read or change alert targets and a queue's notify".to_owned(),
        ))
    }
}

/// List the alert targets, without their secrets.
#[utoipa::path(
    get, path = "/api/v1/alert-targets", operation_id = "list_alert_targets", tag = "alerts",
    responses(
        (status = 200, description = "Every alert target, by name", body = Vec<AlertTarget>),
        AdminOnly,
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> Result<axum::Json<Vec<AlertTarget>>> {
    admin_only(&principal)?;
    Ok(axum::Json(sked_db::alert::list(&state.pool).await?))
}

/// Create or replace an alert target.
///
/// Deliveries to it are tasks of kind `webhook` in its `queue`, POSTed with the event as JSON
/// and signed with its secret (`docs/operations.md`). Tasks name it in their `notify`.
#[utoipa::path(
    put, path = "/api/v1/alert-targets/{name}", operation_id = "set_alert_target", tag = "alerts",
    params(TargetNamed),
    request_body = SetAlertTarget,
    responses(
        (status = 200, description = "The target as it is now", body = AlertTarget),
        AdminOnly,
        (status = 422, description = "A value the target's rules refuse (the name, the URL, the secret's length, the queue's name, max_attempts)", body = sked_types::ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn set(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(name): Path<String>,
    Json(body): Json<SetAlertTarget>,
) -> Result<axum::Json<AlertTarget>> {
    admin_only(&principal)?;
    sked_db::alert::set(
        &state.pool,
        &name,
        &body.url,
        &body.secret,
        body.queue.as_deref().unwrap_or("default"),
        body.max_attempts.unwrap_or(10),
    )
    .await?;
    Ok(axum::Json(named(&state, &name).await?))
}

/// Delete an alert target.
///
/// Tasks that name it keep their `notify`; their deliveries to it fail, saying so.
#[utoipa::path(
    delete, path = "/api/v1/alert-targets/{name}", operation_id = "delete_alert_target", tag = "alerts",
    params(TargetNamed),
    responses(
        (status = 200, description = "The target as it was before it was deleted", body = AlertTarget),
        AdminOnly,
        (status = 404, description = "No such alert target", body = sked_types::ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn delete(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(name): Path<String>,
) -> Result<axum::Json<AlertTarget>> {
    admin_only(&principal)?;
    let target = named(&state, &name).await?;
    if !sked_db::alert::delete(&state.pool, &name).await? {
        return Err(no_such_target(&name));
    }
    Ok(axum::Json(target))
}

fn no_such_target(name: &str) -> Error {
    Error::NotFound(format!("no such alert target: {name}"))
}

/// The target `name`, or 404.
async fn named(state: &AppState, name: &str) -> Result<AlertTarget> {
    sked_db::alert::list(&state.pool)
        .await?
        .into_iter()
        .find(|t| t.name == name)
        .ok_or_else(|| no_such_target(name))
}

/// Set or remove a queue's notify.
///
/// The notify of the queue's tasks that have none of their own (a task's `notify`, even `{}`,
/// wins): who is told when they succeed, fail or are retried.
#[utoipa::path(
    put, path = "/api/v1/queues/{name}/notify", operation_id = "set_queue_notify", tag = "queues",
    params(QueueNamed),
    request_body = QueueNotify,
    responses(
        (status = 200, description = "The queue's notify as it is now", body = QueueNotify),
        AdminOnly,
        (status = 422, description = "A notify that is not valid, or names an alert target that does not exist", body = sked_types::ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn set_queue_notify(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(name): Path<String>,
    Json(body): Json<QueueNotify>,
) -> Result<axum::Json<QueueNotify>> {
    admin_only(&principal)?;
    sked_db::alert::set_queue_notify(&state.pool, &name, body.notify.as_ref()).await?;
    Ok(axum::Json(body))
}
