//! `/api/v1/workers`, `/api/v1/queues`, `/api/v1/me` and `/api/v1/health`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use sked_types::{ApiError, Health, Me, QueueCounts, Worker};

use crate::AppState;
use crate::error::{Error, Result};
use crate::extract::Auth;

/// List the worker registry with liveness and running counts.
#[utoipa::path(
    get, path = "/api/v1/workers", operation_id = "list_workers", tag = "system",
    responses(
        (status = 200, description = "Registered workers, oldest first", body = Vec<Worker>),
        (status = 401, description = "No valid token", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn workers(
    State(state): State<AppState>,
    Auth(_): Auth,
) -> Result<axum::Json<Vec<Worker>>> {
    Ok(axum::Json(sked_db::worker::list(&state.pool).await?))
}

/// Task counts per queue and state.
///
/// An admin token counts all tasks, a user token its owner's tasks only.
#[utoipa::path(
    get, path = "/api/v1/queues", operation_id = "list_queues", tag = "system",
    responses(
        (status = 200, description = "Counts by state of every queue that holds visible tasks", body = Vec<QueueCounts>),
        (status = 401, description = "No valid token", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn queues(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> Result<axum::Json<Vec<QueueCounts>>> {
    let rows = if principal.is_admin() {
        sked_db::task::queue_counts(&state.pool).await?
    } else {
        owner_queue_counts(&state.pool, &principal.owner).await?
    };
    let mut queues: BTreeMap<String, BTreeMap<String, i64>> = BTreeMap::new();
    for (queue, task_state, count) in rows {
        queues.entry(queue).or_default().insert(task_state, count);
    }
    Ok(axum::Json(
        queues
            .into_iter()
            .map(|(queue, counts)| QueueCounts { queue, counts })
            .collect(),
    ))
}

/// Task counts by queue and state of one owner's tasks (`sked.queue_counts` counts all).
async fn owner_queue_counts(
    pool: &sqlx::PgPool,
    owner: &str,
) -> sked_db::Result<Vec<(String, String, i64)>> {
    Ok(sqlx::query_as(
        "select queue, state, count(*) from sked.tasks where owner = $1
          group by queue, state order by queue, state",
    )
    .bind(owner)
    .fetch_all(pool)
    .await?)
}

/// Who the token belongs to.
#[utoipa::path(
    get, path = "/api/v1/me", operation_id = "get_me", tag = "system",
    responses(
        (status = 200, description = "The token's owner and role", body = Me),
        (status = 401, description = "No valid token", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn me(Auth(principal): Auth) -> axum::Json<Me> {
    axum::Json(Me {
        role: principal.role.as_str().to_owned(),
        owner: principal.owner,
    })
}

/// Liveness and schema check; needs no token.
///
/// Answers 200 with status `ok` when the database answers and has the schema this server was
/// built for, 503 with status `schema_mismatch` when its schema differs, and 503 with an
/// `unavailable` error when the database does not answer.
#[utoipa::path(
    get, path = "/api/v1/health", operation_id = "get_health", tag = "system",
    responses(
        (status = 200, description = "The server and its database are usable", body = Health),
        (status = 503, description = "The database has another schema version (body: Health) or does not answer (body: ApiError)", body = Health),
    ),
)]
pub async fn health(State(state): State<AppState>) -> Result<(StatusCode, axum::Json<Health>)> {
    let schema_version = sked_db::schema_version(&state.pool)
        .await
        .map_err(Error::Unavailable)?;
    let (status, text) = if schema_version == sked_db::expected_schema_version() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "schema_mismatch")
    };
    Ok((
        status,
        axum::Json(Health {
            status: text.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            schema_version,
        }),
    ))
}
