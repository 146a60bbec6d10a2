//! `POST /api/v1/tasks/retry` and `POST /api/v1/tasks/cancel`: retry or cancel every task a
//! listing's filters select.
//!
//! The selection is the query string of `GET /api/v1/tasks` ([`TaskParams`], read by
//! [`TaskParams::filter`], so a user token acts on its owner's tasks only), without the
//! page's parameters (`after`, `limit`, `view`), restricted to the tasks the action applies
//! to. `{"dry_run": true}` counts them; `{"max": N}` acts on at most N of them, in batches of
//! [`sked_db::bulk::BATCH`], each one statement calling `sked.task_retry` or
//! `sked.task_cancel` per task in its own transaction (`sked_db::bulk`).

use axum::extract::State;
use sked_db::bulk::{self, Action};
use sked_db::token::Principal;
use sked_types::ApiError;
use sked_types::bulk::{BulkAction, BulkOutcome, MAX_BULK, StateCount};

use crate::AppState;
use crate::error::{Error, Result};
use crate::extract::{Auth, Json, Query};
use crate::openapi::OwnerForbidden;
use crate::tasks::{SelectionParams, TaskParams};

/// Retry every finished task the filters select.
///
/// The query string is that of `GET /api/v1/tasks` without `after`, `limit` and `view`; the
/// selection is restricted to the tasks a retry runs again: succeeded, failed and cancelled
/// ones, and sharded tasks that ended `upstream_failed` or `skipped` (with `state`, those of
/// its states). `{"dry_run": true}` answers how many tasks a retry would change and changes
/// nothing; `{"max": N}` retries at most N of them (newest first), the count the preview
/// showed, and answers how many changed and how many of the N were skipped because their
/// state changed meanwhile. At most 100,000 tasks a request (see `docs/api.md`).
#[utoipa::path(
    post, path = "/api/v1/tasks/retry", operation_id = "retry_tasks", tag = "tasks",
    params(SelectionParams),
    request_body = BulkAction,
    responses(
        (status = 200, description = "What the retry did, or with `dry_run` would do", body = BulkOutcome),
        (status = 400, description = "A malformed parameter or body; `after`, `limit` or `view` given; `max` missing (without `dry_run`), or outside 1 to 100,000", body = ApiError),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn retry(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<TaskParams>,
    Json(body): Json<BulkAction>,
) -> Result<axum::Json<BulkOutcome>> {
    run(&state, &principal, params, body, Action::Retry).await
}

/// Cancel every unfinished task the filters select.
///
/// The query string is that of `GET /api/v1/tasks` without `after`, `limit` and `view`; the
/// selection is restricted to the tasks a cancel changes: blocked, waiting and retry tasks,
/// which end `cancelled` at once, and running tasks not yet asked to stop, whose workers stop
/// them (with `state`, those of its states). `{"dry_run": true}` answers how many tasks a
/// cancel would change and changes nothing; `{"max": N}` cancels at most N of them (newest
/// first), the count the preview showed, and answers how many changed and how many of the N
/// were skipped because their state changed meanwhile. At most 100,000 tasks a request (see
/// `docs/api.md`).
#[utoipa::path(
    post, path = "/api/v1/tasks/cancel", operation_id = "cancel_tasks", tag = "tasks",
    params(SelectionParams),
    request_body = BulkAction,
    responses(
        (status = 200, description = "What the cancel did, or with `dry_run` would do", body = BulkOutcome),
        (status = 400, description = "A malformed parameter or body; `after`, `limit` or `view` given; `max` missing (without `dry_run`), or outside 1 to 100,000", body = ApiError),
        OwnerForbidden,
    ),
    security(("bearer" = [])),
)]
pub async fn cancel(
    State(state): State<AppState>,
    Auth(principal): Auth,
    Query(params): Query<TaskParams>,
    Json(body): Json<BulkAction>,
) -> Result<axum::Json<BulkOutcome>> {
    run(&state, &principal, params, body, Action::Cancel).await
}

async fn run(
    state: &AppState,
    principal: &Principal,
    params: TaskParams,
    body: BulkAction,
    action: Action,
) -> Result<axum::Json<BulkOutcome>> {
    let given = params.page_params_given();
    if !given.is_empty() {
        return Err(Error::InvalidRequest(format!(
            "{} select a page of a listing; a bulk {} takes every task the filters select \
             (leave out after, limit and view)",
            given.join(", "),
            action.as_str()
        )));
    }
    match body.max {
        Some(max) if !(1..=MAX_BULK).contains(&max) => {
            return Err(Error::InvalidRequest(format!(
                "max must be between 1 and {MAX_BULK} (the most tasks one request may {}), \
                 got {max}",
                action.as_str()
            )));
        }
        None if !body.dry_run => {
            return Err(Error::InvalidRequest(format!(
                "max is required: the number of tasks to {} at most, as a dry run \
                 (\"dry_run\": true) counted them",
                action.as_str()
            )));
        }
        _ => {}
    }
    let filter = params.filter(principal)?;
    let max = body.max.unwrap_or(MAX_BULK);
    let selection = bulk::select(&state.pool, &filter, action, max as usize).await?;
    let matched = selection.ids.len() as u64;
    let by_state = selection
        .by_state
        .iter()
        .map(|(state, count)| StateCount {
            state: *state,
            count: *count,
        })
        .collect();
    let mut outcome = BulkOutcome {
        action: action.as_str().to_owned(),
        dry_run: body.dry_run,
        matched,
        by_state,
        more: selection.more,
        changed: 0,
        cancel_requested: 0,
        skipped: 0,
    };
    if body.dry_run {
        return Ok(axum::Json(outcome));
    }
    let acted = bulk::act_all(&state.pool, action, &selection.ids).await?;
    outcome.changed = acted.changed;
    outcome.cancel_requested = acted.cancel_requested;
    outcome.skipped = max.saturating_sub(acted.changed);
    tracing::info!(
        owner = %principal.owner,
        action = action.as_str(),
        matched,
        changed = acted.changed,
        skipped = outcome.skipped,
        "bulk {}",
        action.as_str()
    );
    Ok(axum::Json(outcome))
}

/// The rules of `BulkAction` a derived schema cannot state: `max` is an integer from 1 to
/// 100,000, never null, and required unless `dry_run` is true.
pub(crate) fn schema_rules(schemas: &mut serde_json::Value) {
    use serde_json::json;
    let action = &mut schemas["BulkAction"];
    action["properties"]["max"] = json!({
        "type": "integer", "minimum": 1, "maximum": MAX_BULK,
        "description": "Act on at most this many tasks: the count the preview showed and the user confirmed. Required unless `dry_run`.",
    });
    action["properties"]["dry_run"] = json!({
        "type": "boolean", "default": false,
        "description": "True: only count the tasks the action would change, changing nothing.",
    });
    action["additionalProperties"] = json!(false);
    action["anyOf"] = json!([
        {"required": ["dry_run"], "properties": {"dry_run": {"const": true}}},
        {"required": ["max"]},
    ]);
}
