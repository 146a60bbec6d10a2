//! `/api/v1/queues/{name}`: pause, resume and limit a queue (admin tokens only).
//!
//! The controls hold across every worker because the claim enforces them in the database
//! (`sql/queues.sql`, `docs/runtime.md`). `GET /api/v1/queues` (in `system`) shows them.

use axum::extract::State;
use sked_db::token::Principal;
use sked_types::{ApiError, QueueControls, QueueLimits};

use crate::AppState;
use crate::error::{Error, Result};
use crate::extract::{Auth, Json, Path};
use crate::openapi::{AdminOnly, QueueNamed, QueueRefusals};

/// Refuses a user token: queue controls act on every owner's tasks.
fn admin_only(principal: &Principal) -> Result<()> {
    if principal.is_admin() {
        Ok(())
    } else {
        Err(Error::Forbidden(
            "only an admin token may pause, resume or limit a queue: its controls act on every owner's tasks"
                .to_owned(),
        ))
    }
}

/// The smallest rate limit: the smallest normal double (PostgreSQL refuses subnormal ones).
const MIN_RATE: f64 = f64::MIN_POSITIVE;

/// The checks the schema words less well: values that fit the columns, said with the field's
/// name.
fn validate(limits: &QueueLimits) -> Result<()> {
    if let Some(Some(n)) = limits.max_running
        && !(1..=1_000_000).contains(&n)
    {
        return Err(Error::InvalidRequest(format!(
            "max_running must be between 1 and 1000000 (null: no limit), got {n}"
        )));
    }
    if let Some(Some(rate)) = limits.rate_per_sec
        && !(rate.is_finite() && (MIN_RATE..=1_000_000.0).contains(&rate))
    {
        return Err(Error::InvalidRequest(format!(
            "rate_per_sec must be more than 0 (at least {MIN_RATE:e}) and at most 1000000 tasks per second (null: no limit), got {rate}"
        )));
    }
    if let Some(Some(n)) = limits.burst
        && !(1..=1_000_000).contains(&n)
    {
        return Err(Error::InvalidRequest(format!(
            "burst must be between 1 and 1000000 starts, got {n}"
        )));
    }
    Ok(())
}

/// Pause a queue.
///
/// From now on no worker claims the queue's tasks; tasks already running go on. Pausing a
/// paused queue changes nothing (it keeps its `paused_at`).
#[utoipa::path(
    post, path = "/api/v1/queues/{name}/pause", operation_id = "pause_queue", tag = "queues",
    params(QueueNamed),
    responses(
        (status = 200, description = "The queue's controls after the call", body = QueueControls),
        QueueRefusals,
    ),
    security(("bearer" = [])),
)]
pub async fn pause(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(name): Path<String>,
) -> Result<axum::Json<QueueControls>> {
    admin_only(&principal)?;
    Ok(axum::Json(sked_db::queue::pause(&state.pool, &name).await?))
}

/// Resume a paused queue.
///
/// Its workers are woken and claim its due tasks at once. Resuming a queue that is not
/// paused changes nothing.
#[utoipa::path(
    post, path = "/api/v1/queues/{name}/resume", operation_id = "resume_queue", tag = "queues",
    params(QueueNamed),
    responses(
        (status = 200, description = "The queue's controls after the call", body = QueueControls),
        QueueRefusals,
    ),
    security(("bearer" = [])),
)]
pub async fn resume(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(name): Path<String>,
) -> Result<axum::Json<QueueControls>> {
    admin_only(&principal)?;
    Ok(axum::Json(
        sked_db::queue::resume(&state.pool, &name).await?,
    ))
}

/// Set or remove a queue's limits.
///
/// `max_running`: tasks of the queue running at once over all workers. `rate_per_sec`: tasks
/// started per second (fractions allowed), in bursts of up to `burst` (default: the rate
/// rounded up). A field that is absent stays as it is; `null` removes the limit. The limits
/// hold however many workers claim (`docs/runtime.md`). A bad value changes nothing.
#[utoipa::path(
    patch, path = "/api/v1/queues/{name}", operation_id = "update_queue", tag = "queues",
    params(QueueNamed),
    request_body = QueueLimits,
    responses(
        (status = 200, description = "The queue's controls after the call", body = QueueControls),
        AdminOnly,
        (status = 422, description = "Not a valid queue name, or a burst without a rate", body = ApiError),
    ),
    security(("bearer" = [])),
)]
pub async fn update(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Path(name): Path<String>,
    Json(limits): Json<QueueLimits>,
) -> Result<axum::Json<QueueControls>> {
    admin_only(&principal)?;
    validate(&limits)?;
    Ok(axum::Json(
        sked_db::queue::set_limits(&state.pool, &name, &limits).await?,
    ))
}
