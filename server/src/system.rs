//! `/api/v1/overview`, `/api/v1/workers`, `/api/v1/queues`, `/api/v1/me` and
//! `/api/v1/health`.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use sked_types::{
    Health, History, HistoryRange, Me, Overview, QueueControls, QueueCounts, TaskState, Worker,
};
use utoipa::IntoParams;
use uuid::Uuid;

use crate::AppState;
use crate::error::{Error, Result};
use crate::extract::{Auth, Query, listing_owner};
use crate::openapi::{AdminOnly, OwnerForbidden};

/// Parameters of `GET /api/v1/overview`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OverviewParams {
    /// Count only this owner's tasks. A user token counts its own tasks and may name only its
    /// own owner; an admin token counts every owner's tasks unless it names one.
    owner: Option<String>,
}

/// The dashboard's overview: per queue, the unfinished tasks by state and the tasks finished
/// in the last hour; the finishes of each minute of the last hour; the workers.
///
/// Every count is exact and taken in one snapshot at `at` (the database clock). The last
/// hour is the current minute and the 59 before it, from `since`; the 60 points of `series`
/// add up to the queues' `finished` counts. The cost follows the unfinished tasks and the
/// last hour's finishes, not the number of tasks kept (see `docs/api.md`).
#[utoipa::path(
    get, path = "/api/v1/overview", operation_id = "get_overview", tag = "system",
    params(OverviewParams),
    responses(
        (status = 200, description = "Counts per queue, the per-minute series and the workers", body = Overview),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn overview(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<OverviewParams>,
) -> Result<axum::Json<Overview>> {
    let owner = listing_owner(&principal, params.owner, "tasks")?;
    // Identical overviews asked at once share one read (`coalesce.rs`).
    let key = format!("{owner:?}");
    let owner = owner.as_deref();
    Ok(axum::Json(
        state
            .overviews
            .run(key, || {
                state.read(|pool| async move {
                    Ok(sked_db::overview::overview(&pool, owner, None).await?)
                })
            })
            .await?,
    ))
}

/// Parameters of `GET /api/v1/history`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// `24h` (the default: steps of 5 minutes) or `7d` (steps of an hour).
    range: Option<HistoryRange>,
    /// Count only this queue's tasks (every queue's when absent).
    queue: Option<String>,
    /// Count only this owner's tasks. A user token counts its own tasks and may name only its
    /// own owner; an admin token counts every owner's tasks unless it names one.
    owner: Option<String>,
}

/// The history of finishes: per step of the last 24 hours (5 minutes) or 7 days (an hour),
/// the tasks finished in each final state and the 50th, 90th and 99th percentiles of their
/// last attempts' durations and lateness (due time to start), in seconds.
///
/// Read from the rollups that sked keeps as tasks finish, never from the task table, so the
/// cost follows the steps shown (see `docs/api.md`, "History"). Counts are exact; percentiles
/// are estimated from histograms with two buckets per doubling.
#[utoipa::path(
    get, path = "/api/v1/history", operation_id = "get_history", tag = "system",
    params(HistoryParams),
    responses(
        (status = 200, description = "One point per step, oldest first", body = History),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn history(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<HistoryParams>,
) -> Result<axum::Json<History>> {
    let owner = listing_owner(&principal, params.owner, "tasks")?;
    let queue = params.queue.filter(|q| !q.is_empty());
    let range = params.range.unwrap_or_default();
    // Identical histories asked at once share one read (`coalesce.rs`).
    let key = format!("{owner:?} {queue:?} {range:?}");
    let (owner, queue) = (owner.as_deref(), queue.as_deref());
    Ok(axum::Json(
        state
            .histories
            .run(key, || {
                state.read(|pool| async move {
                    Ok(sked_db::history::history(&pool, owner, queue, range, None).await?)
                })
            })
            .await?,
    ))
}

/// List the worker registry with liveness and running counts.
///
/// Where workers run is for admins only: a user token gets `host` empty, `pid` null, and a
/// worker whose name is its default (`host:pid`) named `worker-` and the start of its id.
#[utoipa::path(
    get, path = "/api/v1/workers", operation_id = "list_workers", tag = "system",
    responses(
        (status = 200, description = "Registered workers, oldest first", body = Vec<Worker>),
    ),
    security(("bearer" = [])),
)]
pub async fn workers(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> Result<axum::Json<Vec<Worker>>> {
    let mut workers = state
        .read(|pool| async move { Ok(sked_db::worker::list(&pool).await?) })
        .await?;
    if !principal.is_admin() {
        workers.iter_mut().for_each(hide_location);
    }
    Ok(axum::Json(workers))
}

/// Removes from a worker what says where it runs: its host and pid, and its name when that
/// is the default `host:pid`.
fn hide_location(worker: &mut Worker) {
    worker.name = name_for_users(worker.id, &worker.name, &worker.host);
    worker.host.clear();
    worker.pid = None;
}

/// A worker's name as a user token sees it: `worker-` and the start of its id when the name
/// says where it runs (the default `host:pid`, or any name holding its host), else the name.
pub(crate) fn name_for_users(id: Uuid, name: &str, host: &str) -> String {
    if name.contains(host) {
        let id = id.simple().to_string();
        format!("worker-{}", &id[..8])
    } else {
        name.to_owned()
    }
}

/// Task counts per queue and state, with each queue's controls.
///
/// Unfinished tasks (`blocked`, `waiting`, `running`, `retry`) are counted whenever they were
/// submitted, finished tasks only when they finished in the last hour (as in
/// `GET /api/v1/overview`), so the answer takes the same time with millions of finished
/// tasks kept. An admin token counts all tasks, a user token its owner's tasks only. Queues
/// that are paused, limited or have their own retention are listed also without tasks, with
/// `paused_at`, `max_running`, `rate_per_sec`, `burst`, `retention_secs` and
/// `keep_failed_secs` (see `docs/runtime.md`; null retentions: the cluster's,
/// `GET /api/v1/retention`).
#[utoipa::path(
    get, path = "/api/v1/queues", operation_id = "list_queues", tag = "system",
    responses(
        (status = 200, description = "Counts by state and controls of every queue with unfinished tasks, tasks finished in the last hour or a control, by name", body = Vec<QueueCounts>),
    ),
    security(("bearer" = [])),
)]
pub async fn queues(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> Result<axum::Json<Vec<QueueCounts>>> {
    let owner = (!principal.is_admin()).then_some(principal.owner.as_str());
    let overview = sked_db::overview::overview(&state.pool, owner, None).await?;
    let mut controls: BTreeMap<String, QueueControls> = sked_db::queue::list(&state.pool)
        .await?
        .into_iter()
        .map(|c| (c.queue.clone(), c))
        .collect();
    let mut queues: Vec<QueueCounts> = overview
        .queues
        .into_iter()
        .map(|q| {
            let f = q.finished;
            let counts: BTreeMap<String, i64> = [
                (TaskState::Blocked, q.blocked),
                (TaskState::Waiting, q.waiting_due + q.waiting_delayed),
                (TaskState::Running, q.running),
                (TaskState::Retry, q.retry),
                (TaskState::Succeeded, f.succeeded),
                (TaskState::Failed, f.failed),
                (TaskState::Cancelled, f.cancelled),
                (TaskState::UpstreamFailed, f.upstream_failed),
                (TaskState::Skipped, f.skipped),
            ]
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(state, n)| (state.as_str().to_owned(), n))
            .collect();
            let c = controls.remove(&q.queue).unwrap_or_default();
            QueueCounts {
                queue: q.queue,
                counts,
                oldest_due_secs: q.oldest_due_secs,
                paused_at: c.paused_at,
                max_running: c.max_running,
                rate_per_sec: c.rate_per_sec,
                burst: c.burst,
                retention_secs: c.retention_secs,
                keep_failed_secs: c.keep_failed_secs,
            }
        })
        .collect();
    queues.extend(controls.into_values().map(|c| QueueCounts {
        queue: c.queue,
        counts: BTreeMap::new(),
        oldest_due_secs: None,
        paused_at: c.paused_at,
        max_running: c.max_running,
        rate_per_sec: c.rate_per_sec,
        burst: c.burst,
        retention_secs: c.retention_secs,
        keep_failed_secs: c.keep_failed_secs,
    }));
    queues.sort_by(|a, b| a.queue.cmp(&b.queue));
    Ok(axum::Json(queues))
}

/// Prometheus metrics, in the Prometheus text format 0.0.4 (admin tokens only).
///
/// The database's: unfinished tasks per queue and state, the backlog and the age of the
/// oldest due task per queue, workers, schedule ticks per outcome, read in one snapshot whose
/// cost follows the unfinished tasks, never the finished history; at most
/// `--metrics-max-queues` queues are named, the others added up as `queue="_other"`. And this
/// process's own (a worker's, in `sked dev`). See `docs/operations.md`.
#[utoipa::path(
    get, path = "/metrics", operation_id = "get_metrics", tag = "system",
    responses(
        (status = 200, description = "The metrics", body = String,
         content_type = "text/plain; version=0.0.4; charset=utf-8"),
        AdminOnly,
    ),
    security(("bearer" = [])),
)]
pub async fn metrics(
    State(state): State<AppState>,
    Auth(principal): Auth,
) -> Result<impl axum::response::IntoResponse> {
    if !principal.is_admin() {
        return Err(Error::Forbidden(
            "only an admin token may read the metrics: they count every owner's tasks".to_owned(),
        ));
    }
    let scrape =
        sked_db::metrics::Scrape::read(&state.pool, state.quotas.metrics_max_queues).await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            sked_db::metrics::CONTENT_TYPE,
        )],
        sked_db::metrics::encode(Some(&scrape)),
    ))
}

/// Who the token belongs to.
#[utoipa::path(
    get, path = "/api/v1/me", operation_id = "get_me", tag = "system",
    responses(
        (status = 200, description = "The token's owner and role", body = Me),
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
            reads: state.reads.status(),
        }),
    ))
}
