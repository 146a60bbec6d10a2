//! Task listings: filters, keyset pages newest first, and a bound on the rows one request
//! reads.
//!
//! Ids are time-ordered, so "newest first" is a backward walk of an index in id order. A
//! listing picks its walk, the *driver*, from its filters:
//!
//! - a worker's running tasks, or a parent's shards: small sets from selective indexes
//!   (`tasks_running`, `tasks_shards`), where every filter applies and the rows are sorted;
//! - tasks in states other than `waiting` and `succeeded`: one walk of `tasks_by_state` per
//!   state (of `tasks_running` for `running`), merged in id order; most tasks never enter these
//!   states, so they are found without walking past the succeeded ones;
//! - an owner's tasks: its finished tasks (`tasks_finished_by_owner`), its blocked, waiting
//!   and retry tasks (`tasks_pending_by_owner`) and its running tasks (`tasks_running`),
//!   merged in id order;
//! - otherwise all tasks (the primary key).
//!
//! Every row the driver yields matches the driver's own filter. The other filters (queue,
//! text, and owner or state when the driver does not apply them) are *residual*: they are
//! tested on the rows the driver yields, and the driver reads at most
//! [`ListFilter::scan_limit`] rows per request. When that many rows gave fewer matches than
//! the page holds, the page ends early with [`ListPage::scan_limit_reached`] and a cursor
//! at the last row read, from which the next request continues. A request's cost is thus
//! bounded whatever the filters, at the price of short (even empty) pages for rare matches.

use chrono::{DateTime, Utc};
use sked_types::TaskState;
use sqlx::{PgPool, Postgres, QueryBuilder};
use uuid::Uuid;

use crate::Result;
use crate::task::TaskRow;

/// Rows (or index entries) a listing reads at most per request when it has residual filters.
/// The text filter costs about 3 µs per row on the primary key, which reads the table in
/// order; owner, queue and state are tested on index entries (`bench/README.md`, W8).
pub const SCAN_LIMIT: i64 = 10_000;
/// The limit when the text filter reads the rows of a walk other than the primary key's,
/// which lie across the whole table (about 8 µs per row).
pub const SCAN_LIMIT_SCATTERED: i64 = 4_000;

/// Filters of a task listing; `None` (or no states) means any.
#[derive(Debug, Clone)]
pub struct ListFilter {
    pub owner: Option<String>,
    /// Tasks in any of these states.
    pub states: Vec<TaskState>,
    pub queue: Option<String>,
    /// Only the shards of this sharded task.
    pub shard_of: Option<Uuid>,
    /// Only the tasks this worker runs now.
    pub worker: Option<Uuid>,
    /// Only tasks due now (`Some(true)`: `next_run_at` at or before the statement's time) or
    /// only those due later (`Some(false)`: delayed, or a retry in its backoff).
    pub due: Option<bool>,
    /// Only tasks that finished at or after this instant.
    pub finished_after: Option<DateTime<Utc>>,
    /// A case-insensitive substring of the command line (the command, or the artifact URL,
    /// followed by the arguments, joined by spaces) or of the name.
    pub text: Option<String>,
    /// Keyset cursor: only tasks with a smaller (older) id.
    pub after: Option<Uuid>,
    /// Page size.
    pub limit: i64,
    /// Rows the driver reads at most when there are residual filters (at most
    /// [`SCAN_LIMIT_SCATTERED`] for the text filter on a walk other than the primary key's).
    pub scan_limit: i64,
}

impl Default for ListFilter {
    fn default() -> Self {
        ListFilter {
            owner: None,
            states: Vec::new(),
            queue: None,
            shard_of: None,
            worker: None,
            due: None,
            finished_after: None,
            text: None,
            after: None,
            limit: 50,
            scan_limit: SCAN_LIMIT,
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub rows: Vec<TaskRow>,
    /// Where the next page starts (pass it as `after`); `None` after the last page.
    pub next_cursor: Option<Uuid>,
    /// The driver read [`ListFilter::scan_limit`] rows before the page was full.
    pub scan_limit_reached: bool,
}

/// The index walk a listing is driven by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// A worker's running tasks or a parent's shards: every filter applies within the set.
    Small,
    /// The filter's states, each walked on its own index.
    States,
    /// The owner's tasks: finished, pending and running, each walked on its own index.
    Owner,
    /// All tasks, on the primary key.
    All,
}

/// States whose tasks a listing finds on an index of their own (`tasks_by_state`, and
/// `tasks_running` for `running`) instead of walking past the succeeded ones.
fn has_own_index(state: TaskState) -> bool {
    !matches!(state, TaskState::Waiting | TaskState::Succeeded)
}

impl ListFilter {
    fn driver(&self) -> Driver {
        if self.worker.is_some() || self.shard_of.is_some() {
            Driver::Small
        } else if !self.states.is_empty() && self.states.iter().all(|s| has_own_index(*s)) {
            Driver::States
        } else if self.owner.is_some() {
            Driver::Owner
        } else {
            Driver::All
        }
    }

    /// True when some filter is not applied by the driver itself.
    fn has_residual(&self, driver: Driver) -> bool {
        let times = self.due.is_some() || self.finished_after.is_some();
        match driver {
            Driver::Small => false,
            Driver::States => {
                self.owner.is_some() || self.queue.is_some() || self.text.is_some() || times
            }
            Driver::Owner | Driver::All => {
                !self.states.is_empty() || self.queue.is_some() || self.text.is_some() || times
            }
        }
    }

    /// True when no state filter is given or one of `states` is in it.
    fn wants_any(&self, states: &[TaskState]) -> bool {
        self.states.is_empty() || self.states.iter().any(|s| states.contains(s))
    }
}

/// The states of `tasks_pending_by_owner`.
const PENDING: [TaskState; 3] = [TaskState::Blocked, TaskState::Waiting, TaskState::Retry];
/// The final states (`finished_at` is set), those of `tasks_finished_by_owner`.
const FINAL: [TaskState; 5] = [
    TaskState::Succeeded,
    TaskState::Failed,
    TaskState::Cancelled,
    TaskState::UpstreamFailed,
    TaskState::Skipped,
];

/// The condition that selects a state's tasks on its own index. Names come from a fixed set
/// (never user text) and are written as literals, so that a cached generic plan still
/// matches the partial indexes whose predicates name states.
fn push_state(q: &mut QueryBuilder<Postgres>, alias: &str, state: TaskState) {
    q.push(format_args!("{alias}.state = '{}'", state.as_str()));
}

/// ` and <alias>.state in (...)`.
fn push_states_in(q: &mut QueryBuilder<Postgres>, alias: &str, states: &[TaskState]) {
    q.push(" and ");
    push_state_list(q, alias, states);
}

fn push_state_list(q: &mut QueryBuilder<Postgres>, alias: &str, states: &[TaskState]) {
    q.push(format_args!("{alias}.state in ("));
    for (i, state) in states.iter().enumerate() {
        if i > 0 {
            q.push(", ");
        }
        q.push(format_args!("'{}'", state.as_str()));
    }
    q.push(")");
}

fn push_text(q: &mut QueryBuilder<Postgres>, alias: &str, text: &str) {
    q.push(format_args!(
        " and (strpos(lower(concat_ws(' ', {alias}.artifact_url, array_to_string({alias}.command, ' '), \
         array_to_string({alias}.args, ' '))), lower("
    ))
    .push_bind(text.to_owned())
    .push(format_args!(
        ")) > 0 or strpos(lower(coalesce({alias}.name, '')), lower("
    ))
    .push_bind(text.to_owned())
    .push(")) > 0)");
}

/// Pushes the filters on times, which no driver applies: ` and <alias>.next_run_at <= now()`
/// and the like.
fn push_times(q: &mut QueryBuilder<Postgres>, f: &ListFilter, alias: &str) {
    match f.due {
        Some(true) => {
            q.push(format_args!(" and {alias}.next_run_at <= now()"));
        }
        Some(false) => {
            q.push(format_args!(" and {alias}.next_run_at > now()"));
        }
        None => {}
    }
    if let Some(since) = f.finished_after {
        q.push(format_args!(" and {alias}.finished_at >= "))
            .push_bind(since);
    }
}

/// Pushes the filters the driver does not apply, on rows named `alias`.
fn push_residual(q: &mut QueryBuilder<Postgres>, f: &ListFilter, driver: Driver, alias: &str) {
    if driver == Driver::States
        && let Some(owner) = &f.owner
    {
        q.push(format_args!(" and {alias}.owner = "))
            .push_bind(owner.clone());
    }
    if matches!(driver, Driver::Owner | Driver::All) && !f.states.is_empty() {
        push_states_in(q, alias, &f.states);
    }
    if let Some(queue) = &f.queue {
        q.push(format_args!(" and {alias}.queue = "))
            .push_bind(queue.clone());
    }
    if let Some(text) = &f.text {
        push_text(q, alias, text);
    }
    push_times(q, f, alias);
}

/// Pushes the driver as a subquery of rows `t.<columns>`, newest first, at most `n` of them.
fn push_driver(
    q: &mut QueryBuilder<Postgres>,
    f: &ListFilter,
    driver: Driver,
    columns: &str,
    n: i64,
) {
    match driver {
        Driver::Small => {
            // The set is found first (OFFSET 0 keeps the planner from flattening it) and
            // then sorted: its estimate is often one row (statistics taken while nothing
            // ran), and a backward walk of the primary key looking for that one row would
            // read the whole table.
            q.push(format_args!(
                "select {columns} from (select t.* from sked.tasks t where true"
            ));
            if let Some(worker) = f.worker {
                q.push(" and t.state = 'running' and t.worker_id = ")
                    .push_bind(worker);
            }
            if let Some(parent) = f.shard_of {
                q.push(" and t.shard_of = ").push_bind(parent);
            }
            if let Some(owner) = &f.owner {
                q.push(" and t.owner = ").push_bind(owner.clone());
            }
            if !f.states.is_empty() {
                push_states_in(q, "t", &f.states);
            }
            if let Some(queue) = &f.queue {
                q.push(" and t.queue = ").push_bind(queue.clone());
            }
            if let Some(text) = &f.text {
                push_text(q, "t", text);
            }
            push_times(q, f, "t");
            if let Some(after) = f.after {
                q.push(" and t.id < ").push_bind(after);
            }
            q.push(format_args!(" offset 0) t order by t.id desc limit {n}"));
        }
        Driver::States => {
            let mut states = f.states.clone();
            states.sort_by_key(|s| s.as_str());
            states.dedup();
            let walks: Vec<Walk> = states.into_iter().map(Walk::State).collect();
            push_merged(q, f, &walks, None, columns, n);
        }
        Driver::Owner => {
            // Only finished tasks have finished since a time.
            let finished_only = f.finished_after.is_some();
            let mut walks = Vec::new();
            if f.wants_any(&FINAL) {
                walks.push(Walk::Finished);
            }
            if f.wants_any(&PENDING) && !finished_only {
                walks.push(Walk::Pending);
            }
            if f.wants_any(&[TaskState::Running]) && !finished_only {
                walks.push(Walk::State(TaskState::Running));
            }
            push_merged(q, f, &walks, f.owner.as_deref(), columns, n);
        }
        Driver::All => {
            q.push(format_args!(
                "select {columns} from sked.tasks t where true"
            ));
            if let Some(after) = f.after {
                q.push(" and t.id < ").push_bind(after);
            }
            q.push(format_args!(" order by t.id desc limit {n}"));
        }
    }
}

/// One ordered walk of a merged driver.
#[derive(Debug, Clone, Copy)]
enum Walk {
    /// The tasks in a state (`tasks_by_state`, or `tasks_running` for `running`).
    State(TaskState),
    /// Finished tasks (`tasks_finished_by_owner` with an owner).
    Finished,
    /// Blocked, waiting and retry tasks (`tasks_pending_by_owner` with an owner).
    Pending,
}

/// Pushes walks merged in id order (a Merge Append of ordered index scans), at most `n`
/// rows, each walk limited to the owner when one is given.
fn push_merged(
    q: &mut QueryBuilder<Postgres>,
    f: &ListFilter,
    walks: &[Walk],
    owner: Option<&str>,
    columns: &str,
    n: i64,
) {
    q.push(format_args!("select {columns} from ("));
    if walks.is_empty() {
        q.push(format_args!(
            "select {columns} from sked.tasks t where false"
        ));
    }
    for (i, walk) in walks.iter().enumerate() {
        if i > 0 {
            q.push(" union all ");
        }
        // Running tasks are a small set found on tasks_running and sorted, fenced like the
        // small sets of `Driver::Small`; the other walks follow their index in id order.
        let running = matches!(walk, Walk::State(TaskState::Running));
        if running {
            q.push(format_args!(
                "(select {columns} from (select t.* from sked.tasks t where "
            ));
        } else {
            q.push(format_args!("(select {columns} from sked.tasks t where "));
        }
        match walk {
            Walk::State(state) => push_state(q, "t", *state),
            Walk::Finished => {
                q.push("t.finished_at is not null");
            }
            Walk::Pending => push_state_list(q, "t", &PENDING),
        }
        if let Some(owner) = owner {
            q.push(" and t.owner = ").push_bind(owner.to_owned());
        }
        if let Some(after) = f.after {
            q.push(" and t.id < ").push_bind(after);
        }
        if running {
            q.push(" offset 0) t");
        }
        q.push(format_args!(" order by t.id desc limit {n})"));
    }
    q.push(format_args!(") t order by t.id desc limit {n}"));
}

/// The columns a walk yields for the residual filters: those of the indexes' entries
/// (`tasks_by_state`, `tasks_finished_by_owner` and `tasks_pending_by_owner` carry owner,
/// queue and state, and the first and last `next_run_at`), so that testing owner, queue,
/// state or a due time reads no table row there; the finish time and the text filter are
/// read from the rows.
fn window_columns(f: &ListFilter) -> String {
    if f.text.is_some() {
        return "t.*".to_owned();
    }
    let mut columns = "t.id, t.owner, t.queue, t.state".to_owned();
    if f.due.is_some() {
        columns.push_str(", t.next_run_at");
    }
    if f.finished_after.is_some() {
        columns.push_str(", t.finished_at");
    }
    columns
}

/// One page of tasks, newest first, by keyset on the id (see the module documentation).
///
/// The statements are not kept prepared: each is planned for its parameters' values. A
/// cached generic plan would estimate every owner at the average share, and for a small
/// owner walk the primary key past all other owners' tasks (458 ms instead of 67 ms for a
/// text search by an owner of 1 % of a million tasks, in W8).
pub async fn list(pool: &PgPool, f: &ListFilter) -> Result<ListPage> {
    let limit = f.limit.max(1);
    let driver = f.driver();
    // The text filter reads whole rows; a walk other than the primary key's finds them
    // across the whole table, each row costing about three times as much.
    let scan_limit = if f.text.is_some() && driver != Driver::All {
        f.scan_limit.min(SCAN_LIMIT_SCATTERED)
    } else {
        f.scan_limit
    }
    .max(limit + 1);
    // One row more than the page tells whether another page follows.
    let fetch = limit + 1;
    if !f.has_residual(driver) {
        let mut q = QueryBuilder::new("");
        push_driver(&mut q, f, driver, "t.*", fetch);
        let rows: Vec<TaskRow> = q.build_query_as().persistent(false).fetch_all(pool).await?;
        return Ok(page(rows, limit, None));
    }
    // The page and the end of the scan window are read in one snapshot, so that a cursor at
    // the window's end continues exactly where this page's scan stopped.
    let mut tx = pool
        .begin_with("begin isolation level repeatable read, read only")
        .await?;
    // The window's matches first, from the walk's own columns where they suffice; then their
    // rows.
    let mut q = QueryBuilder::new("select t.* from sked.tasks t join (select w.id from (");
    push_driver(&mut q, f, driver, &window_columns(f), scan_limit);
    q.push(") w where true");
    push_residual(&mut q, f, driver, "w");
    q.push(format_args!(
        " order by w.id desc limit {fetch}) m on m.id = t.id order by t.id desc"
    ));
    let rows: Vec<TaskRow> = q
        .build_query_as()
        .persistent(false)
        .fetch_all(&mut *tx)
        .await?;
    if rows.len() as i64 > limit {
        tx.commit().await?;
        return Ok(page(rows, limit, None));
    }
    // A short page: did the driver stop at the scan limit? Then its last row is the cursor.
    let mut q = QueryBuilder::new("select d.id from (");
    push_driver(&mut q, f, driver, "t.id", scan_limit);
    q.push(format_args!(
        ") d order by d.id desc offset {} limit 1",
        scan_limit - 1
    ));
    let last_read: Option<Uuid> = q
        .build_query_scalar()
        .persistent(false)
        .fetch_optional(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(page(rows, limit, last_read))
}

fn page(mut rows: Vec<TaskRow>, limit: i64, last_read: Option<Uuid>) -> ListPage {
    if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        let next_cursor = rows.last().map(|row| row.id);
        return ListPage {
            rows,
            next_cursor,
            scan_limit_reached: false,
        };
    }
    ListPage {
        rows,
        next_cursor: last_read,
        scan_limit_reached: last_read.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(states: &[TaskState]) -> ListFilter {
        ListFilter {
            states: states.to_vec(),
            ..ListFilter::default()
        }
    }

    #[test]
    fn drivers_follow_the_filters() {
        assert_eq!(ListFilter::default().driver(), Driver::All);
        let owned = ListFilter {
            owner: Some("alice".into()),
            ..filter(&[TaskState::Waiting])
        };
        assert_eq!(owned.driver(), Driver::Owner);
        assert_eq!(filter(&[TaskState::Failed]).driver(), Driver::States);
        assert_eq!(
            filter(&[TaskState::Failed, TaskState::Running]).driver(),
            Driver::States
        );
        assert_eq!(
            filter(&[TaskState::Failed, TaskState::Succeeded]).driver(),
            Driver::All,
            "succeeded tasks have no index of their own"
        );
        let worker = ListFilter {
            worker: Some(Uuid::nil()),
            ..filter(&[TaskState::Waiting])
        };
        assert_eq!(worker.driver(), Driver::Small);
        assert!(!worker.has_residual(Driver::Small));
    }

    #[test]
    fn residual_filters_are_those_the_driver_does_not_apply() {
        let owned = ListFilter {
            owner: Some("alice".into()),
            ..ListFilter::default()
        };
        assert!(
            !owned.has_residual(Driver::Owner),
            "the owner index applies the owner"
        );
        let failed_of_alice = ListFilter {
            owner: Some("alice".into()),
            ..filter(&[TaskState::Failed])
        };
        assert!(failed_of_alice.has_residual(Driver::States));
        let text = ListFilter {
            text: Some("x".into()),
            ..ListFilter::default()
        };
        assert!(text.has_residual(Driver::All));
    }
}
