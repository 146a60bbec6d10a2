//! Bulk retry and bulk cancel of what a task listing selects.
//!
//! The selection is a listing's filter ([`ListFilter`]), walked with [`listing::list`] page
//! by page (following the cursor past short pages that stopped at the scan limit), restricted
//! to the tasks the action applies to. The action then calls the SQL contract's function of
//! one task (`sked.task_retry`, `sked.task_cancel`) for each, in batches: each batch is one
//! statement in its own transaction, so every transition stays defined (and fenced) once and
//! a large selection never holds one long transaction.

use sked_types::{Task, TaskState};
use sqlx::PgPool;
use uuid::Uuid;

use crate::Result;
use crate::listing::{self, ListFilter};

/// Tasks per batch: one statement, one transaction.
pub const BATCH: usize = 500;
/// Rows per page of the walk (the listing's largest page).
const PAGE: i64 = 500;

/// What a bulk request does to each task it selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// `sked.task_retry`: run a finished task again.
    Retry,
    /// `sked.task_cancel`: end a task that has not started, ask a running one to stop.
    Cancel,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Cancel => "cancel",
        }
    }

    /// The states the action applies to: those `sked.task_retry` runs again (finished; a
    /// sharded task also when it ended `upstream_failed` or `skipped`), or the unfinished
    /// ones `sked.task_cancel` ends or stops.
    pub fn states(self) -> &'static [TaskState] {
        match self {
            Action::Retry => &[
                TaskState::Succeeded,
                TaskState::Failed,
                TaskState::Cancelled,
                TaskState::UpstreamFailed,
                TaskState::Skipped,
            ],
            Action::Cancel => &[
                TaskState::Blocked,
                TaskState::Waiting,
                TaskState::Retry,
                TaskState::Running,
            ],
        }
    }

    /// Whether the action changes this task: [`Action::states`], where `upstream_failed` and
    /// `skipped` are retried only for a sharded task, and a running task is asked to stop
    /// only once.
    pub fn applies(self, task: &Task) -> bool {
        match (self, task.state) {
            (Action::Retry, TaskState::UpstreamFailed | TaskState::Skipped) => {
                task.trigger_rule == "shards"
            }
            (Action::Cancel, TaskState::Running) => task.cancel_requested_at.is_none(),
            (action, state) => action.states().contains(&state),
        }
    }

    /// [`Action::applies`] in SQL, on the row `t`, tested again when a batch runs.
    fn applies_sql(self) -> &'static str {
        match self {
            Action::Retry => {
                "(t.state in ('succeeded', 'failed', 'cancelled') \
                 or (t.trigger_rule = 'shards' and t.state in ('upstream_failed', 'skipped')))"
            }
            Action::Cancel => {
                "(t.state in ('blocked', 'waiting', 'retry') \
                 or (t.state = 'running' and t.cancel_requested_at is null))"
            }
        }
    }

    fn call(self) -> &'static str {
        match self {
            Action::Retry => "sked.task_retry(t.id)",
            Action::Cancel => "sked.task_cancel(t.id)",
        }
    }
}

/// The tasks a bulk request selects, newest first.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub ids: Vec<Uuid>,
    /// How many of `ids` are in each state, in the order of [`TaskState::ALL`].
    pub by_state: Vec<(TaskState, u64)>,
    /// More tasks than `ids` are selected (the walk stopped at its `max`).
    pub more: bool,
}

/// The tasks of `filter` (its `after` and `limit` are ignored) that `action` applies to, at
/// most `max`, newest first. The filter's states are intersected with the action's.
pub async fn select(
    pool: &PgPool,
    filter: &ListFilter,
    action: Action,
    max: usize,
) -> Result<Selection> {
    let mut selection = Selection::default();
    let states: Vec<TaskState> = if filter.states.is_empty() {
        action.states().to_vec()
    } else {
        filter
            .states
            .iter()
            .copied()
            .filter(|s| action.states().contains(s))
            .collect()
    };
    if states.is_empty() || max == 0 {
        return Ok(selection);
    }
    let mut page_filter = ListFilter {
        states,
        after: None,
        limit: PAGE,
        ..filter.clone()
    };
    loop {
        let page = listing::list(pool, &page_filter).await?;
        for row in &page.rows {
            if !action.applies(row) {
                continue;
            }
            if selection.ids.len() == max {
                selection.more = true;
                selection
                    .by_state
                    .sort_by_key(|(s, _)| TaskState::ALL.iter().position(|a| a == s));
                return Ok(selection);
            }
            selection.ids.push(row.id);
            match selection.by_state.iter_mut().find(|(s, _)| *s == row.state) {
                Some((_, n)) => *n += 1,
                None => selection.by_state.push((row.state, 1)),
            }
        }
        match page.next_cursor {
            Some(cursor) => page_filter.after = Some(cursor),
            None => {
                selection
                    .by_state
                    .sort_by_key(|(s, _)| TaskState::ALL.iter().position(|a| a == s));
                return Ok(selection);
            }
        }
    }
}

/// What acting on a batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Acted {
    /// Tasks the action changed, `cancel_requested` included.
    pub changed: u64,
    /// Running tasks asked to stop (cancel).
    pub cancel_requested: u64,
}

/// Calls the action's function of the SQL contract on each of `ids` (at most [`BATCH`]) the
/// action still applies to, in id order, in one statement in a transaction of its own. A task whose
/// state changed since it was selected is left as it is and not counted.
pub async fn act(pool: &PgPool, action: Action, ids: &[Uuid]) -> Result<Acted> {
    let sql = format!(
        "select {call} from sked.tasks t where t.id = any($1) and {applies} order by t.id",
        call = action.call(),
        applies = action.applies_sql(),
    );
    let mut tx = crate::begin(pool).await?;
    let results: Vec<Option<String>> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(ids)
        .fetch_all(&mut *tx)
        .await?;
    tx.commit().await?;
    let mut acted = Acted::default();
    for result in results.iter().flatten() {
        match (action, result.as_str()) {
            // A task with parents may wait for them, or end at once by its trigger rule.
            (Action::Retry, "waiting" | "blocked" | "upstream_failed" | "skipped") => {
                acted.changed += 1
            }
            (Action::Cancel, "cancelled") => acted.changed += 1,
            (Action::Cancel, "running") => {
                acted.changed += 1;
                acted.cancel_requested += 1;
            }
            // It finished (or was retried) between the statement's snapshot and the call.
            _ => {}
        }
    }
    Ok(acted)
}

/// [`act`] on every id, [`BATCH`] at a time, each batch its own transaction.
pub async fn act_all(pool: &PgPool, action: Action, ids: &[Uuid]) -> Result<Acted> {
    let mut total = Acted::default();
    for batch in ids.chunks(BATCH) {
        let acted = act(pool, action, batch).await?;
        total.changed += acted.changed;
        total.cancel_requested += acted.cancel_requested;
    }
    Ok(total)
}
