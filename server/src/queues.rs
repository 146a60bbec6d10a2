//! `/api/v1/queues/{name}`: pause, resume, limit a queue and set its retention (admin tokens
//! only); `/api/v1/retention`: the cluster's retention (read by any token, changed by admin
//! tokens).
//!
//! The controls hold across every worker because the claim enforces them in the database
//! (`sql/queues.sql`, `docs/runtime.md`); retention is applied by every server's background
//! upkeep from the same rows (`sql/retention.sql`). `GET /api/v1/queues` (in `system`) shows
//! them.

use axum::extract::State;
use sked_db::token::Principal;
use sked_types::{
    ApiError, MAX_RETENTION_SECS, MIN_RETENTION_SECS, QueueControls, QueueLimits, Retention,
    RetentionChange,
};

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
            "only an admin token may pause, resume or limit a queue, or change a retention: they act on every owner's tasks"
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
    for (field, value) in [
        ("retention_secs", limits.retention_secs),
        ("keep_failed_secs", limits.keep_failed_secs),
    ] {
        if let Some(Some(secs)) = value {
            retention_in_range(field, secs, " (null: the cluster's retention)")?;
        }
    }
    Ok(())
}

/// Refuses a retention of `secs` outside an hour to 36500 days (the rule of
/// `sked.retention_check`), naming `field`.
fn retention_in_range(field: &str, secs: f64, null_means: &str) -> Result<()> {
    if secs.is_finite() && (MIN_RETENTION_SECS..=MAX_RETENTION_SECS).contains(&secs) {
        return Ok(());
    }
    Err(Error::InvalidRequest(format!(
        "{field} must be between {MIN_RETENTION_SECS} (an hour) and {MAX_RETENTION_SECS} (36500 days) seconds{null_means}, got {secs}"
    )))
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

/// Set or remove a queue's limits and retention.
///
/// `max_running`: tasks of the queue running at once over all workers. `rate_per_sec`: tasks
/// started per second (fractions allowed), in bursts of up to `burst` (default: the rate
/// rounded up). `retention_secs`: how long its finished tasks are kept, `keep_failed_secs`
/// its failed ones (at least as long as its retention); null: the cluster's
/// (`GET /api/v1/retention`). A field that is absent stays as it is; `null` removes the
/// limit or the queue's own retention. The limits hold however many workers claim
/// (`docs/runtime.md`). A bad value changes nothing.
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

/// The cluster's retention.
///
/// How long finished tasks are kept where their queue sets nothing (`retention_secs`, default
/// 7 days), failed ones (`keep_failed_secs`, default 30 days), whether retention is on at all
/// (`enabled`), and how long a stored artifact nothing refers to is kept. Every server
/// applies it once a minute.
#[utoipa::path(
    get, path = "/api/v1/retention", operation_id = "get_retention", tag = "queues",
    responses(
        (status = 200, description = "The cluster's retention", body = Retention),
    ),
    security(("bearer" = [])),
)]
pub async fn retention(
    State(state): State<AppState>,
    Auth(_): Auth,
) -> Result<axum::Json<Retention>> {
    Ok(axum::Json(sked_db::retention::get(&state.pool).await?))
}

/// Change the cluster's retention.
///
/// `enabled: false` turns retention off entirely (nothing is deleted, whatever the queues
/// set), `true` on again. `retention_secs`, `keep_failed_secs` and `keep_keys_secs` (how long
/// an idempotency key outlives its task): 3600 (an hour) to 3153600000 (36500 days). A field that is absent stays as it is. A bad value changes
/// nothing.
#[utoipa::path(
    patch, path = "/api/v1/retention", operation_id = "update_retention", tag = "queues",
    request_body = RetentionChange,
    responses(
        (status = 200, description = "The cluster's retention after the call", body = Retention),
        AdminOnly,
    ),
    security(("bearer" = [])),
)]
pub async fn update_retention(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Json(change): Json<RetentionChange>,
) -> Result<axum::Json<Retention>> {
    admin_only(&principal)?;
    for (field, value) in [
        ("retention_secs", change.retention_secs),
        ("keep_failed_secs", change.keep_failed_secs),
        ("keep_keys_secs", change.keep_keys_secs),
    ] {
        if let Some(secs) = value {
            retention_in_range(field, secs, "")?;
        }
    }
    Ok(axum::Json(
        sked_db::retention::set(&state.pool, &change).await?,
    ))
}
