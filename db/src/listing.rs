//! Task listings: filters, keyset pages newest first, counts, and a bound on the rows one
//! request reads.
//!
//! Ids are time-ordered, so "newest first" is a backward walk of an index in id order. A
//! listing picks its walk, the *driver*, from its filters, so that each filter alone finds
//! its first page on an index:
//!
//! - a worker's running tasks, a parent's shards, a workflow's tasks or a schedule's
//!   occurrences: small sets from selective indexes (`tasks_running`, `tasks_shards`,
//!   `tasks_workflow`, `schedule_runs`), where every filter applies and the rows are sorted;
//! - a queue's tasks: one walk of `tasks_by_queue` (queue, state, id) per state asked for
//!   (every state when none is), and of `tasks_running` for `running`, merged in id order;
//! - tasks in some states: one walk of `tasks_by_state` (state, id) per state (of
//!   `tasks_running` for `running`); for `waiting` and `succeeded`, which most tasks pass
//!   through and `tasks_by_state` leaves out, one walk of `tasks_by_queue` per queue that
//!   holds tasks (found by a loose index scan; past [`MAX_QUEUE_WALKS`] queues, the states
//!   are tested on the primary key's walk instead); all merged in id order;
//! - an owner's tasks: its finished tasks (`tasks_finished_by_owner`), its blocked, waiting
//!   and retry tasks (`tasks_pending_by_owner`) and its running tasks (`tasks_running`),
//!   merged in id order;
//! - a text search alone: the primary key, and then the trigram index `tasks_text` (below);
//! - otherwise all tasks (the primary key).
//!
//! Every walk is bounded by the keyset cursor and the submission-time range (`created_after`,
//! `created_before`), which are ranges of ids. Every row the driver yields matches the
//! driver's own filter. The other filters (owner, queue, text, due and finish times, when
//! the driver does not apply them) are *residual*: they are tested on the rows the driver
//! yields, and the driver reads at most [`ListFilter::scan_limit`] rows per request. When
//! that many rows gave fewer matches than the page holds, the page ends early with
//! [`ListPage::scan_limit_reached`] and a cursor at the last row read, from which the next
//! request continues. A request's cost is thus bounded whatever the filters.
//!
//! With its trigram index (`tasks_text`, which an operator makes: it doubles the cost of an
//! insert, see [`text_index_enable`]), the text filter finds its first page even when the
//! text is rare: when its walk reads
//! [`TEXT_FIRST_SCAN`] rows without filling the page, and the planner expects at most
//! [`TEXT_INDEX_MATCHES`] tasks to hold the text (from the statistics of the trigram
//! index's expression), the matches are taken from the trigram index `tasks_text` (a bitmap,
//! with every other filter applied, sorted by id). A text more common than that (which a
//! walk finds soon), with more matches than expected, or without three letters or digits in
//! a row for trigrams, goes back to the walk and its scan limit.

use chrono::{DateTime, Utc};
use sked_types::TaskState;
use sqlx::{FromRow, PgPool, Postgres, QueryBuilder, Row};
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
/// Rows the text filter's walk reads before the trigram index is asked instead.
pub const TEXT_FIRST_SCAN: i64 = 1_000;
/// Matches the trigram index may give a text search at most; a text with more is common
/// enough for the walk to find it.
pub const TEXT_INDEX_MATCHES: i64 = 20_000;
/// A count above this is answered as "more than" it.
pub const COUNT_LIMIT: i64 = sked_types::TaskCount::LIMIT;
/// Index entries (or rows) a count with residual filters reads at most.
pub const COUNT_SCAN_LIMIT: i64 = 100_000;

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
    /// Only tasks that finished before this instant.
    pub finished_before: Option<DateTime<Utc>>,
    /// Only tasks submitted at or after this instant, by the time in their id.
    pub created_after: Option<DateTime<Utc>>,
    /// Only tasks submitted before this instant, by the time in their id.
    pub created_before: Option<DateTime<Utc>>,
    /// Only the tasks of this workflow.
    pub workflow: Option<Uuid>,
    /// Only the occurrences of this schedule that its history keeps (`schedule_runs`): the
    /// tasks it fired and the tasks of the workflows it fired.
    pub schedule: Option<Uuid>,
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
            finished_before: None,
            created_after: None,
            created_before: None,
            workflow: None,
            schedule: None,
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
    /// A worker's running tasks, a parent's shards, a workflow's tasks or a schedule's
    /// occurrences: every filter applies within the set.
    Small,
    /// The queue's tasks in the filter's states (every state when none is given), each state
    /// walked on its own.
    Queue,
    /// The filter's states, each walked on its own index.
    States,
    /// The owner's tasks: finished, pending and running, each walked on its own index.
    Owner,
    /// All tasks, on the primary key.
    All,
}

impl ListFilter {
    fn driver(&self) -> Driver {
        if self.worker.is_some()
            || self.shard_of.is_some()
            || self.workflow.is_some()
            || self.schedule.is_some()
        {
            Driver::Small
        } else if self.queue.is_some() {
            Driver::Queue
        } else if !self.states.is_empty() && self.states.iter().all(|s| has_own_index(*s)) {
            Driver::States
        } else if self.owner.is_some() {
            // An owner's walks hold its waiting and succeeded tasks, which the states'
            // walks find only per queue among every owner's.
            Driver::Owner
        } else if !self.states.is_empty() {
            Driver::States
        } else {
            Driver::All
        }
    }

    /// True when some filter is not applied by the driver itself.
    fn has_residual(&self, driver: Driver) -> bool {
        let others = self.text.is_some()
            || self.due.is_some()
            || self.finished_after.is_some()
            || self.finished_before.is_some();
        match driver {
            Driver::Small => false,
            Driver::Queue | Driver::States => self.owner.is_some() || others,
            Driver::Owner => !self.states.is_empty() || others,
            Driver::All => !self.states.is_empty() || self.owner.is_some() || others,
        }
    }

    /// True when no state filter is given or one of `states` is in it.
    fn wants_any(&self, states: &[TaskState]) -> bool {
        self.states.is_empty() || self.states.iter().any(|s| states.contains(s))
    }

    /// The states a merged walk covers: the filter's, or all of them, sorted and without
    /// repeats.
    fn walked_states(&self) -> Vec<TaskState> {
        let mut states = if self.states.is_empty() {
            TaskState::ALL.to_vec()
        } else {
            self.states.clone()
        };
        states.sort_by_key(|s| s.as_str());
        states.dedup();
        states
    }

    /// The exclusive upper bound of the ids: the cursor or the end of the submission-time
    /// range, whichever is lower.
    fn id_below(&self) -> Option<Uuid> {
        let end = self.created_before.map(id_at);
        match (self.after, end) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The smallest time-ordered id (UUIDv7) of the millisecond of `at`: ids at or above it
/// were made at or after `at`.
fn id_at(at: DateTime<Utc>) -> Uuid {
    let ms = at.timestamp_millis().clamp(0, (1 << 48) - 1) as u64;
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
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

/// The `ILIKE` pattern that finds `text` anywhere: its `%`, `_` and `\` taken literally.
fn contains_pattern(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 2);
    pattern.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// True when the trigram index can narrow a search for `text`: it holds three letters or
/// digits in a row (trigrams come from runs of them; a pattern without any would read the
/// whole index).
fn has_trigram(text: &str) -> bool {
    let mut run = 0;
    for c in text.chars() {
        run = if c.is_alphanumeric() { run + 1 } else { 0 };
        if run >= 3 {
            return true;
        }
    }
    false
}

fn push_text(q: &mut QueryBuilder<Postgres>, alias: &str, text: &str) {
    q.push(format_args!(
        " and sked.task_search_text({alias}.artifact_url, {alias}.command, {alias}.args, \
         {alias}.name) ilike "
    ))
    .push_bind(contains_pattern(text));
}

/// Pushes the filters on times that no walk applies: ` and <alias>.next_run_at <= now()`
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
    if let Some(until) = f.finished_before {
        q.push(format_args!(" and {alias}.finished_at < "))
            .push_bind(until);
    }
}

/// Pushes the bounds of the ids (the cursor and the submission-time range), which every
/// walk applies.
fn push_id_bounds(q: &mut QueryBuilder<Postgres>, f: &ListFilter, alias: &str) {
    if let Some(below) = f.id_below() {
        q.push(format_args!(" and {alias}.id < ")).push_bind(below);
    }
    if let Some(from) = f.created_after {
        q.push(format_args!(" and {alias}.id >= "))
            .push_bind(id_at(from));
    }
}

/// Pushes the filters `driver` does not apply, on rows named `alias`; with no driver, every
/// filter (the id bounds and the small sets' included).
fn push_filters(
    q: &mut QueryBuilder<Postgres>,
    f: &ListFilter,
    driver: Option<Driver>,
    alias: &str,
) {
    if driver.is_none() {
        if let Some(worker) = f.worker {
            q.push(format_args!(
                " and {alias}.state = 'running' and {alias}.worker_id = "
            ))
            .push_bind(worker);
        }
        if let Some(parent) = f.shard_of {
            q.push(format_args!(" and {alias}.shard_of = "))
                .push_bind(parent);
        }
        if let Some(workflow) = f.workflow {
            q.push(format_args!(" and {alias}.workflow_id = "))
                .push_bind(workflow);
        }
        if let Some(schedule) = f.schedule {
            // A schedule fires a task (task_id) or a workflow (workflow_id); both are found
            // on indexes (the primary key, tasks_workflow).
            q.push(format_args!(
                " and ({alias}.id in (select r.task_id from sked.schedule_runs r \
                 where r.task_id is not null and r.schedule_id = "
            ))
            .push_bind(schedule)
            .push(format_args!(
                ") or {alias}.workflow_id in (select r.workflow_id from sked.schedule_runs r \
                 where r.workflow_id is not null and r.schedule_id = "
            ))
            .push_bind(schedule)
            .push("))");
        }
        push_id_bounds(q, f, alias);
    }
    if driver != Some(Driver::Owner)
        && let Some(owner) = &f.owner
    {
        q.push(format_args!(" and {alias}.owner = "))
            .push_bind(owner.clone());
    }
    if !matches!(driver, Some(Driver::Queue | Driver::States)) && !f.states.is_empty() {
        push_states_in(q, alias, &f.states);
    }
    if driver != Some(Driver::Queue)
        && let Some(queue) = &f.queue
    {
        q.push(format_args!(" and {alias}.queue = "))
            .push_bind(queue.clone());
    }
    if let Some(text) = &f.text {
        push_text(q, alias, text);
    }
    push_times(q, f, alias);
}

/// States with no index of their own, where most tasks are (`tasks_by_state` leaves them
/// out, so that a task that succeeds at its first attempt gets no entry there): a listing by
/// one of them walks `tasks_by_queue` once per queue.
fn has_own_index(state: TaskState) -> bool {
    !matches!(state, TaskState::Waiting | TaskState::Succeeded)
}

/// Queues a listing by state walks one by one at most; with more, the states are tested on
/// a walk of the primary key (or of the owner's tasks), within the scan limit.
pub const MAX_QUEUE_WALKS: usize = 100;

/// How a listing reads: its driver and, for states found per queue, the queues.
struct Plan {
    driver: Driver,
    queues: Vec<String>,
}

/// The plan of `f`'s listing: the queues that hold tasks, when its states are found per
/// queue.
async fn plan(db: &mut sqlx::PgConnection, f: &ListFilter) -> Result<Plan> {
    let driver = f.driver();
    if driver != Driver::States || f.states.iter().all(|s| has_own_index(*s)) {
        return Ok(Plan {
            driver,
            queues: Vec::new(),
        });
    }
    // The distinct queues of tasks_by_queue, one index probe each (a loose index scan).
    let queues: Vec<String> = sqlx::query_scalar(
        "with recursive q(queue) as (
           (select t.queue from sked.tasks t where t.state <> 'running'
             order by t.queue limit 1)
           union all
           select (select t.queue from sked.tasks t
                    where t.state <> 'running' and t.queue > q.queue
                    order by t.queue limit 1)
             from q where q.queue is not null)
         select q.queue from q where q.queue is not null limit $1",
    )
    .bind(MAX_QUEUE_WALKS as i64 + 1)
    .fetch_all(db)
    .await?;
    if queues.len() > MAX_QUEUE_WALKS {
        let driver = if f.owner.is_some() {
            Driver::Owner
        } else {
            Driver::All
        };
        return Ok(Plan {
            driver,
            queues: Vec::new(),
        });
    }
    Ok(Plan { driver, queues })
}

/// Pushes the driver as a subquery of rows `t.<columns>`, newest first, at most `n` of them.
fn push_driver(q: &mut QueryBuilder<Postgres>, f: &ListFilter, plan: &Plan, columns: &str, n: i64) {
    match plan.driver {
        Driver::Small => {
            // The set is found first (OFFSET 0 keeps the planner from flattening it) and
            // then sorted: its estimate is often one row (statistics taken while nothing
            // ran), and a backward walk of the primary key looking for that one row would
            // read the whole table.
            q.push(format_args!(
                "select {columns} from (select t.* from sked.tasks t where true"
            ));
            push_filters(q, f, None, "t");
            q.push(format_args!(" offset 0) t order by t.id desc limit {n}"));
        }
        Driver::Queue => {
            let walks: Vec<Walk> = f.walked_states().into_iter().map(Walk::State).collect();
            push_merged(q, f, &walks, None, f.queue.as_deref(), &[], columns, n);
        }
        Driver::States => {
            // A state of its own index, or one walk per queue for the others.
            let mut walks = Vec::new();
            for state in f.walked_states() {
                if has_own_index(state) {
                    walks.push(Walk::State(state));
                } else {
                    walks.extend((0..plan.queues.len()).map(|i| Walk::InQueue(state, i)));
                }
            }
            push_merged(q, f, &walks, None, None, &plan.queues, columns, n);
        }
        Driver::Owner => {
            // Only finished tasks have finished since a time.
            let finished_only = f.finished_after.is_some() || f.finished_before.is_some();
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
            push_merged(q, f, &walks, f.owner.as_deref(), None, &[], columns, n);
        }
        Driver::All => {
            q.push(format_args!(
                "select {columns} from sked.tasks t where true"
            ));
            push_id_bounds(q, f, "t");
            q.push(format_args!(" order by t.id desc limit {n}"));
        }
    }
}

/// One ordered walk of a merged driver.
#[derive(Debug, Clone, Copy)]
enum Walk {
    /// The tasks in a state (`tasks_by_state`, or `tasks_by_queue` within a queue, or
    /// `tasks_running` for `running`).
    State(TaskState),
    /// The tasks in a state in the plan's queue of this index (`tasks_by_queue`).
    InQueue(TaskState, usize),
    /// Finished tasks (`tasks_finished_by_owner` with an owner).
    Finished,
    /// Blocked, waiting and retry tasks (`tasks_pending_by_owner` with an owner).
    Pending,
}

/// Pushes walks merged in id order (a Merge Append of ordered index scans), at most `n`
/// rows, each walk limited to the owner and to the queue when they are given; `queues`
/// are those that [`Walk::InQueue`] names.
#[allow(clippy::too_many_arguments)]
fn push_merged(
    q: &mut QueryBuilder<Postgres>,
    f: &ListFilter,
    walks: &[Walk],
    owner: Option<&str>,
    queue: Option<&str>,
    queues: &[String],
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
            Walk::InQueue(state, i) => {
                push_state(q, "t", *state);
                q.push(" and t.queue = ").push_bind(queues[*i].clone());
            }
            Walk::Finished => {
                q.push("t.finished_at is not null");
            }
            Walk::Pending => push_state_list(q, "t", &PENDING),
        }
        if let Some(owner) = owner {
            q.push(" and t.owner = ").push_bind(owner.to_owned());
        }
        if let Some(queue) = queue {
            q.push(" and t.queue = ").push_bind(queue.to_owned());
        }
        push_id_bounds(q, f, "t");
        if running {
            q.push(" offset 0) t");
        }
        q.push(format_args!(" order by t.id desc limit {n})"));
    }
    q.push(format_args!(") t order by t.id desc limit {n}"));
}

/// The columns a walk yields for the residual filters: those of the indexes' entries
/// (`tasks_by_state`, `tasks_by_queue`, `tasks_finished_by_owner` and
/// `tasks_pending_by_owner` carry owner, queue and state, and most of them `next_run_at`),
/// so that testing owner, queue, state or a due time reads no table row there; the finish
/// time and the text filter are read from the rows.
fn window_columns(f: &ListFilter) -> String {
    if f.text.is_some() {
        return "t.*".to_owned();
    }
    let mut columns = "t.id, t.owner, t.queue, t.state".to_owned();
    if f.due.is_some() {
        columns.push_str(", t.next_run_at");
    }
    if f.finished_after.is_some() || f.finished_before.is_some() {
        columns.push_str(", t.finished_at");
    }
    columns
}

/// The text filter's trigram index, `tasks_text`: made by an operator
/// ([`text_index_enable`], `sked search-index enable`), since it doubles the cost of an
/// insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextIndex {
    /// No such index: the text filter walks, at most the scan limit's rows per request.
    Missing,
    /// Being built, or left invalid by a build that failed: not used.
    NotReady,
    /// Used by the text filter; its size on disk.
    Ready { bytes: i64 },
}

/// The state of the text filter's trigram index.
pub async fn text_index(db: impl sqlx::PgExecutor<'_>) -> Result<TextIndex> {
    let row: Option<(bool, i64)> = sqlx::query_as(
        "select i.indisvalid and i.indisready, pg_relation_size(i.indexrelid)
           from pg_index i where i.indexrelid = to_regclass('sked.tasks_text')",
    )
    .fetch_optional(db)
    .await?;
    Ok(match row {
        None => TextIndex::Missing,
        Some((false, _)) => TextIndex::NotReady,
        Some((true, bytes)) => TextIndex::Ready { bytes },
    })
}

/// Makes the text filter's trigram index (`CREATE INDEX CONCURRENTLY`: inserts and updates
/// go on while it is built), after the pg_trgm extension when it is missing; a build left
/// invalid by an earlier failure is dropped and made again. Needs the rights of the account
/// that migrates (the extension, the CREATE privilege on the database).
pub async fn text_index_enable(pool: &PgPool) -> Result<TextIndex> {
    let mut conn = pool.acquire().await?;
    sqlx::raw_sql("create extension if not exists pg_trgm")
        .execute(&mut *conn)
        .await?;
    if text_index(&mut *conn).await? == TextIndex::NotReady {
        sqlx::raw_sql("drop index concurrently if exists sked.tasks_text")
            .execute(&mut *conn)
            .await?;
    }
    let schema: String = sqlx::query_scalar(
        "select n.nspname::text from pg_extension e
           join pg_namespace n on n.oid = e.extnamespace where e.extname = 'pg_trgm'",
    )
    .fetch_one(&mut *conn)
    .await?;
    let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "create index concurrently if not exists tasks_text on sked.tasks using gin \
         (sked.task_search_text(artifact_url, command, args, name) {quoted}.gin_trgm_ops)"
    )))
    .execute(&mut *conn)
    .await?;
    sqlx::raw_sql("analyze sked.tasks")
        .execute(&mut *conn)
        .await?;
    text_index(&mut *conn).await
}

/// Drops the text filter's trigram index (concurrently); the filter walks again.
pub async fn text_index_disable(pool: &PgPool) -> Result<()> {
    sqlx::raw_sql("drop index concurrently if exists sked.tasks_text")
        .execute(crate::on(pool))
        .await?;
    Ok(())
}

/// True when the trigram index can find the filter's text: the index is ready (see
/// [`TextIndex`]), the text has
/// trigrams, and the planner expects at most [`TEXT_INDEX_MATCHES`] tasks to hold it (from
/// the statistics of the index's expression, `sked.task_search_estimate`). A more common text is found sooner by a walk,
/// and its bitmap alone would cost more than the walk's whole scan limit.
async fn text_index_finds(db: &mut sqlx::PgConnection, f: &ListFilter) -> Result<bool> {
    let Some(text) = f.text.as_deref().filter(|t| has_trigram(t)) else {
        return Ok(false);
    };
    if !matches!(text_index(&mut *db).await?, TextIndex::Ready { .. }) {
        return Ok(false);
    }
    let rows: Option<f64> = sqlx::query_scalar("select sked.task_search_estimate($1)")
        .bind(contains_pattern(text))
        .fetch_one(db)
        .await?;
    let rows = rows.unwrap_or(f64::INFINITY);
    Ok(rows <= TEXT_INDEX_MATCHES as f64)
}

/// Makes the planner of this transaction read through bitmaps (the trigram index, and
/// the others with it), never by walking an index or the table in order.
async fn bitmaps_only(db: &mut sqlx::PgConnection) -> Result<()> {
    sqlx::raw_sql(
        "set local enable_seqscan = off; set local enable_indexscan = off; \
         set local enable_indexonlyscan = off",
    )
    .execute(db)
    .await?;
    Ok(())
}

/// One page of tasks, newest first, by keyset on the id (see the module documentation).
///
/// The statements are not kept prepared: each is planned for its parameters' values. A
/// cached generic plan would estimate every owner at the average share, and for a small
/// owner walk the primary key past all other owners' tasks (458 ms instead of 67 ms for a
/// text search by an owner of 1 % of a million tasks, in W8).
pub async fn list(pool: &PgPool, f: &ListFilter) -> Result<ListPage> {
    let limit = f.limit.max(1);
    // The page and the end of the scan window are read in one snapshot, so that a cursor at
    // the window's end continues exactly where this page's scan stopped.
    let mut tx = crate::pooler::begin_snapshot(pool).await?;
    let plan = plan(&mut tx, f).await?;
    let driver = plan.driver;
    let text_index = driver != Driver::Small && text_index_finds(&mut tx, f).await?;
    // The text filter reads whole rows; a walk other than the primary key's finds them
    // across the whole table, each row costing about three times as much.
    let scan_limit = if f.text.is_some() && driver != Driver::All {
        f.scan_limit.min(SCAN_LIMIT_SCATTERED)
    } else {
        f.scan_limit
    };
    if text_index {
        let page = walk(&mut tx, f, &plan, limit, TEXT_FIRST_SCAN.min(scan_limit)).await?;
        if !page.scan_limit_reached {
            tx.commit().await?;
            return Ok(page);
        }
        if let Some(page) = text_from_index(&mut tx, f, limit).await? {
            tx.commit().await?;
            return Ok(page);
        }
    }
    let page = walk(&mut tx, f, &plan, limit, scan_limit).await?;
    tx.commit().await?;
    Ok(page)
}

/// A page from the driver's walk, reading at most `scan_limit` rows when some filter is
/// residual.
async fn walk(
    db: &mut sqlx::PgConnection,
    f: &ListFilter,
    plan: &Plan,
    limit: i64,
    scan_limit: i64,
) -> Result<ListPage> {
    let driver = plan.driver;
    let scan_limit = scan_limit.max(limit + 1);
    // One row more than the page tells whether another page follows.
    let fetch = limit + 1;
    if !f.has_residual(driver) {
        let mut q = QueryBuilder::new("");
        push_driver(&mut q, f, plan, "t.*", fetch);
        let rows: Vec<TaskRow> = q.build_query_as().persistent(false).fetch_all(db).await?;
        return Ok(page(rows, limit, None));
    }
    // The window's matches first, from the walk's own columns where they suffice; then their
    // rows.
    let mut q = QueryBuilder::new("select t.* from sked.tasks t join (select w.id from (");
    push_driver(&mut q, f, plan, &window_columns(f), scan_limit);
    q.push(") w where true");
    push_filters(&mut q, f, Some(driver), "w");
    q.push(format_args!(
        " order by w.id desc limit {fetch}) m on m.id = t.id order by t.id desc"
    ));
    let rows: Vec<TaskRow> = q
        .build_query_as()
        .persistent(false)
        .fetch_all(&mut *db)
        .await?;
    if rows.len() as i64 > limit {
        return Ok(page(rows, limit, None));
    }
    // A short page: did the driver stop at the scan limit? Then its last row is the cursor.
    let mut q = QueryBuilder::new("select d.id from (");
    push_driver(&mut q, f, plan, "t.id", scan_limit);
    q.push(format_args!(
        ") d order by d.id desc offset {} limit 1",
        scan_limit - 1
    ));
    let last_read: Option<Uuid> = q
        .build_query_scalar()
        .persistent(false)
        .fetch_optional(db)
        .await?;
    Ok(page(rows, limit, last_read))
}

/// A page of a text search from the trigram index: the matches of every filter (at most
/// [`TEXT_INDEX_MATCHES`]), newest first; `None` when there are more.
async fn text_from_index(
    db: &mut sqlx::PgConnection,
    f: &ListFilter,
    limit: i64,
) -> Result<Option<ListPage>> {
    bitmaps_only(db).await?;
    let mut q =
        QueryBuilder::new("with hits as materialized (select t.id from sked.tasks t where true");
    push_filters(&mut q, f, None, "t");
    q.push(format_args!(
        " limit {}) select t.*, (select count(*) from hits) as hits from sked.tasks t \
         where t.id in (select h.id from hits h order by h.id desc limit {}) \
         order by t.id desc",
        TEXT_INDEX_MATCHES + 1,
        limit + 1
    ));
    let rows: Vec<(i64, TaskRow)> = q
        .build()
        .persistent(false)
        .fetch_all(&mut *db)
        .await?
        .iter()
        .map(|row| Ok((row.try_get("hits")?, TaskRow::from_row(row)?)))
        .collect::<std::result::Result<_, sqlx::Error>>()?;
    sqlx::raw_sql("reset enable_seqscan; reset enable_indexscan; reset enable_indexonlyscan")
        .execute(db)
        .await?;
    if rows
        .first()
        .is_some_and(|(hits, _)| *hits > TEXT_INDEX_MATCHES)
    {
        return Ok(None);
    }
    Ok(Some(page(
        rows.into_iter().map(|(_, row)| row).collect(),
        limit,
        None,
    )))
}

/// How many tasks a listing's filters select, counted up to [`COUNT_LIMIT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count {
    /// The tasks counted.
    pub count: i64,
    /// False when there may be more: `count` is then a lower bound (above [`COUNT_LIMIT`],
    /// or [`COUNT_SCAN_LIMIT`] entries read before the residual filters were settled).
    pub exact: bool,
}

/// Counts the tasks of a listing's filters (its cursor and page size aside), reading a
/// bounded number of index entries or rows: exact up to [`COUNT_LIMIT`] where the filters'
/// indexes settle it, else a lower bound.
pub async fn count(pool: &PgPool, f: &ListFilter) -> Result<Count> {
    let f = &ListFilter {
        after: None,
        ..f.clone()
    };
    let mut tx = crate::pooler::begin_snapshot(pool).await?;
    let plan = plan(&mut tx, f).await?;
    let driver = plan.driver;
    let capped = |n: i64| Count {
        count: n.min(COUNT_LIMIT),
        exact: n <= COUNT_LIMIT,
    };
    // A small set, or a rare text the trigram index finds: every filter on the set or the
    // index's bitmap, stopping after the limit.
    let text_index = driver != Driver::Small && text_index_finds(&mut tx, f).await?;
    if driver == Driver::Small || text_index {
        if text_index {
            bitmaps_only(&mut tx).await?;
        }
        let mut q =
            QueryBuilder::new("select count(*) from (select 1 from sked.tasks t where true");
        push_filters(&mut q, f, None, "t");
        q.push(format_args!(" limit {}) c", COUNT_LIMIT + 1));
        let n: i64 = q
            .build_query_scalar()
            .persistent(false)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        return Ok(capped(n));
    }
    // A walk with residual filters reads at most COUNT_SCAN_LIMIT index entries, or the
    // scan limit's rows when a common text is tested on them.
    let residual = f.has_residual(driver);
    let walked = if !residual {
        COUNT_LIMIT + 1
    } else if f.text.is_some() {
        SCAN_LIMIT
    } else {
        COUNT_SCAN_LIMIT
    };
    let mut q = QueryBuilder::new("select count(*) from (select 1 from (");
    push_driver(&mut q, f, &plan, &window_columns(f), walked);
    q.push(") w where true");
    push_filters(&mut q, f, Some(driver), "w");
    q.push(format_args!(" limit {}) c", COUNT_LIMIT + 1));
    let n: i64 = q
        .build_query_scalar()
        .persistent(false)
        .fetch_one(&mut *tx)
        .await?;
    let mut counted = capped(n);
    if residual && counted.exact {
        // Fewer matches than the limit: exact if the walk ended before its bound.
        let mut q = QueryBuilder::new("select count(*) from (");
        push_driver(&mut q, f, &plan, "t.id", walked);
        q.push(") w");
        let read: i64 = q
            .build_query_scalar()
            .persistent(false)
            .fetch_one(&mut *tx)
            .await?;
        counted.exact = read < walked;
    }
    tx.commit().await?;
    Ok(counted)
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
            Driver::States,
            "succeeded tasks are walked per queue"
        );
        let owned_succeeded = ListFilter {
            owner: Some("alice".into()),
            ..filter(&[TaskState::Succeeded])
        };
        assert_eq!(owned_succeeded.driver(), Driver::Owner);
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
