//! Wire types of the sked REST API, shared by the server, the CLI and the dashboard.
//!
//! This crate compiles to `wasm32-unknown-unknown`: it depends only on serde, chrono (without
//! the clock), uuid (without random generation) and yaml_serde (pure Rust, for the workflow
//! file format). Keep clocks, random ids, sqlx and tokio out.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

mod alert;
pub mod bulk;
pub mod duration;
pub mod events;
mod history;
mod overview;
mod queue;
mod schedule;
pub mod secrets;
pub mod service;
pub mod shell;
pub mod strict;
pub mod time_zones;
pub mod units;
pub mod workflow_spec;
pub use alert::{AlertTarget, QueueNotify, SetAlertTarget};
pub use history::{History, HistoryPoint, HistoryRange, Percentiles};
pub use overview::{FinalCounts, MinuteFinishes, Overview, QueueOverview, WorkerCounts};
#[cfg(feature = "openapi")]
pub use queue::QueueName;
pub use queue::{
    MAX_RETENTION_SECS, MIN_RETENTION_SECS, QUEUE_NAME_PATTERN, QueueControls, QueueLimits,
    Retention, RetentionChange, WaitingReason,
};
pub use schedule::{
    Backfill, BackfillOrder, BackfillPage, CreateSchedule, CronPreview, RunNow, Schedule,
    ScheduleDetail, SchedulePage, ScheduleRun, StartBackfill, UpdateSchedule,
};

/// The state of a task; see `docs/state_machine.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Waiting for its DAG parents to finish.
    Blocked,
    /// Claimable once `next_run_at` has passed.
    Waiting,
    /// Claimed by a worker that holds its lease.
    Running,
    /// Failed with attempts left; claimable again at `next_run_at`.
    Retry,
    Succeeded,
    Failed,
    Cancelled,
    /// Never ran: a task it depends on failed or was cancelled.
    UpstreamFailed,
    /// Never ran: its trigger rule can no longer be met (see `docs/workflows.md`).
    Skipped,
}

impl TaskState {
    pub const ALL: [TaskState; 9] = [
        TaskState::Blocked,
        TaskState::Waiting,
        TaskState::Running,
        TaskState::Retry,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Cancelled,
        TaskState::UpstreamFailed,
        TaskState::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Blocked => "blocked",
            TaskState::Waiting => "waiting",
            TaskState::Running => "running",
            TaskState::Retry => "retry",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
            TaskState::UpstreamFailed => "upstream_failed",
            TaskState::Skipped => "skipped",
        }
    }

    /// Final states never change again, except by an explicit retry.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            TaskState::Succeeded
                | TaskState::Failed
                | TaskState::Cancelled
                | TaskState::UpstreamFailed
                | TaskState::Skipped
        )
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing an unknown state name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownState(pub String);

impl fmt::Display for UnknownState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown task state {:?} (expected one of {})",
            self.0,
            listed(TaskState::ALL.map(TaskState::as_str))
        )
    }
}

impl std::error::Error for UnknownState {}

impl FromStr for TaskState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// What a task runs; the schema's `tasks_kind_is_known` admits exactly these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// Runs `command` (or the program at `artifact_url`) with `args`.
    #[default]
    Command,
    /// Built-in: succeeds at once.
    Noop,
    /// Built-in: sleeps for `input` `{"seconds": N}`, or `args[0]` seconds.
    Sleep,
    /// A long-running service: copies of its command kept running (see `docs/services.md`).
    Service,
    /// The delivery of an alert to a webhook (`docs/operations.md`): inserted by sked itself
    /// when a task's `notify` names an alert target, never submitted.
    Webhook,
    /// A sub-workflow task of a workflow (`docs/workflows.md`, "Sub-workflows"): runs the
    /// workflow in its `subworkflow` and ends in its state; never run by a worker. Given by a
    /// workflow task's `workflow` key, not by `kind`.
    Workflow,
}

impl TaskKind {
    pub const ALL: [TaskKind; 6] = [
        TaskKind::Command,
        TaskKind::Noop,
        TaskKind::Sleep,
        TaskKind::Service,
        TaskKind::Webhook,
        TaskKind::Workflow,
    ];

    /// The kinds a submission may name: every kind but `webhook`, which sked inserts itself.
    pub const SUBMITTED: [TaskKind; 4] = [
        TaskKind::Command,
        TaskKind::Noop,
        TaskKind::Sleep,
        TaskKind::Service,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Command => "command",
            TaskKind::Noop => "noop",
            TaskKind::Sleep => "sleep",
            TaskKind::Service => "service",
            TaskKind::Webhook => "webhook",
            TaskKind::Workflow => "workflow",
        }
    }

    /// A built-in (`noop`, `sleep`): runs in the worker, takes `args` and no command.
    pub fn is_builtin(self) -> bool {
        matches!(self, TaskKind::Noop | TaskKind::Sleep)
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error of parsing an unknown kind name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKind(pub String);

impl fmt::Display for UnknownKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown task kind {:?} (expected one of {})",
            self.0,
            listed(TaskKind::SUBMITTED.map(TaskKind::as_str))
        )
    }
}

impl std::error::Error for UnknownKind {}

impl FromStr for TaskKind {
    type Err = UnknownKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| UnknownKind(s.to_owned()))
    }
}

/// Names as messages list them: `a, b, c`.
pub fn listed<const N: usize>(names: [&str; N]) -> String {
    names.join(", ")
}

/// A task as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Task {
    pub id: Uuid,
    pub owner: String,
    pub queue: String,
    pub priority: i32,
    pub kind: TaskKind,
    pub command: Option<Vec<String>>,
    pub args: Vec<String>,
    pub artifact_url: Option<String>,
    pub artifact_sha256: Option<String>,
    pub input: Option<serde_json::Value>,
    /// Environment variables given to the process. API answers mask secret values (see
    /// [`secrets`]); the worker gets the real ones.
    pub env: BTreeMap<String, String>,
    pub labels: Vec<String>,
    pub output_path: Option<String>,
    /// Timeout of one attempt, in seconds.
    pub timeout_secs: Option<f64>,
    pub max_attempts: i32,
    pub backoff_base_secs: f64,
    pub backoff_max_secs: f64,
    pub idempotency_key: Option<String>,
    pub state: TaskState,
    /// Attempts started so far.
    pub attempt: i32,
    pub next_run_at: DateTime<Utc>,
    pub worker_id: Option<Uuid>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub cancel_requested_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub stdout_tail: Option<String>,
    pub stderr_tail: Option<String>,
    pub output_sha256: Option<String>,
    /// The workflow the task belongs to; left out when it belongs to none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub workflow_id: Option<Uuid>,
    /// The task's name in its workflow.
    #[serde(default)]
    pub name: Option<String>,
    /// When the task runs after its parents: `all_success`, `all_done`, `one_failed` or
    /// `none_failed`.
    #[serde(default = "default_trigger_rule")]
    pub trigger_rule: String,
    /// A branch: its output (`{"next": [names]}`) chooses which of the tasks that depend on
    /// it run; the others end `skipped` (see `docs/workflows.md`, "Branches").
    #[serde(default)]
    pub branch: bool,
    /// Parents not finished yet (while `blocked`).
    #[serde(default)]
    pub parents_pending: i32,
    /// The JSON output of the last successful attempt (see `docs/workflows.md`); for the
    /// parent of shards, the array of its shards' outputs by index.
    #[serde(default)]
    pub output: Option<serde_json::Value>,
    /// How many shards a sharded task has, on the parent and on each shard (see
    /// `docs/shards.md`).
    #[serde(default)]
    pub shard_total: Option<i32>,
    /// A shard's position, 0 to `shard_total - 1` (`SKED_SHARD_INDEX`).
    #[serde(default)]
    pub shard_index: Option<i32>,
    /// The parent of a shard.
    #[serde(default)]
    pub shard_of: Option<Uuid>,
    /// A map of a workflow (its shards are its instances, one per element): what it maps over,
    /// `<parent>.<path>` (see `docs/workflows.md`, "Map"). Left out for other tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub map_over: Option<String>,
    /// A sub-workflow task (kind `workflow`): the workflow it runs, as submitted (see
    /// `docs/workflows.md`, "Sub-workflows"). Left out for other tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>, nullable = false))]
    pub subworkflow: Option<serde_json::Value>,
    /// A broadcast: one shard per live worker.
    #[serde(default)]
    pub broadcast: bool,
    /// The only worker that may run this broadcast shard.
    #[serde(default)]
    pub pinned_worker: Option<Uuid>,
    /// CPU requested, in millicores (1000 = one core); also the task's CPU limit where the
    /// worker enforces limits (see `docs/runtime.md`).
    #[serde(default)]
    pub cpu_millis: Option<i32>,
    /// Memory requested, in MB; also the task's memory limit where the worker enforces limits.
    #[serde(default)]
    pub memory_mb: Option<i32>,
    /// The most bytes stdout and stderr may write together; the worker's default when null.
    #[serde(default)]
    pub max_output_bytes: Option<i64>,
    /// The user the task runs as (a name or a uid); the worker's default when null.
    #[serde(default)]
    pub run_as: Option<String>,
    /// On a service (kind `service`): how many copies it keeps running (see
    /// `docs/services.md`).
    #[serde(default)]
    pub replicas: Option<i32>,
    /// On a service and its copies: `always` or `on_failure`.
    #[serde(default)]
    pub restart_policy: Option<String>,
    /// On a service and its copies: the health check, as submitted.
    #[serde(default)]
    pub health_check: Option<serde_json::Value>,
    /// On a service: the version of its definition; on a copy: the version it runs.
    #[serde(default)]
    pub generation: Option<i32>,
    /// May be stopped while it runs to make room for a copy of a service; the attempt then
    /// ends `interrupted` (not charged) and the task waits again (see `docs/runtime.md`).
    #[serde(default)]
    pub preemptible: bool,
    /// Who is told when it succeeds, fails or is retried, as submitted (null: its queue's).
    #[serde(default)]
    pub notify: Option<serde_json::Value>,
}

impl Task {
    /// What the worker runs: the command and its arguments, or the artifact's URL followed by
    /// the arguments.
    pub fn argv(&self) -> Vec<String> {
        let mut argv: Vec<String> = match (&self.command, &self.artifact_url) {
            (Some(command), _) => command.clone(),
            (None, Some(url)) => vec![url.clone()],
            (None, None) => vec![],
        };
        argv.extend(self.args.iter().cloned());
        argv
    }
}

fn default_trigger_rule() -> String {
    "all_success".to_owned()
}

/// One attempt of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Attempt {
    pub attempt: i32,
    pub worker_id: Option<Uuid>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// `running`, `succeeded`, `failed`, `timed_out`, `cancelled`, `worker_lost` or `interrupted`.
    pub outcome: String,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub stdout_tail: Option<String>,
    pub stderr_tail: Option<String>,
}

/// A task with the history of its attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskDetail {
    #[serde(flatten)]
    pub task: Task,
    pub attempts: Vec<Attempt>,
    /// Why the task has not started, for a task that is `blocked`, `waiting` or `retry`: the
    /// most decisive reason (see `docs/runtime.md`); absent for other states.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_reason: Option<WaitingReason>,
}

/// A request to submit one task. Only `command` (or `artifact_url` with `artifact_sha256`, or
/// a built-in `kind`) is required.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SubmitTask {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// `command` (default), the built-ins `noop` and `sleep`, or `service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<TaskKind>,
    /// The queue, `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<QueueName>))]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Start no earlier than this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at: Option<DateTime<Utc>>,
    /// Start no earlier than this many seconds from now (added to `run_at` when both are given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 3155760000.0))]
    pub delay_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_attempts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 0.000001, maximum = 3155760000.0)
    )]
    pub timeout_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 0.000001, maximum = 3155760000.0)
    )]
    pub backoff_base_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 0.000001, maximum = 3155760000.0)
    )]
    pub backoff_max_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub idempotency_key: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The program to fetch and run instead of `command`: `file:///…` (beneath the worker's
    /// `--artifact-dir`), `http(s)://…`, or `pg:<artifact_sha256>` (stored in the database;
    /// the pattern leaves it out, as it cannot name the hash).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^(file:///|https?://)[^\\x00]*$")
    )]
    pub artifact_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-f]{64}$"))]
    pub artifact_sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub output_path: Option<String>,
    /// Admins may submit on behalf of another owner; for users it must be absent or their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub owner: Option<String>,
    /// Run as this many shard tasks (1 to 10000), which see `SKED_SHARD_INDEX` and
    /// `SKED_SHARD_TOTAL`; the submitted task succeeds when all of them have (see
    /// `docs/shards.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10000))]
    pub shards: Option<i32>,
    /// Run once on every live worker that serves the queue and has the labels.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub broadcast: bool,
    /// CPU to reserve, in millicores (1000 = one core; 1 to 1,000,000): only a worker with
    /// that much free claims the task, and runs it with that limit where it enforces limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000000))]
    pub cpu_millis: Option<i32>,
    /// Memory to reserve, in MB (1 to 16,777,216); also the task's memory limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 16777216))]
    pub memory_mb: Option<i32>,
    /// The most bytes stdout and stderr may write together; beyond it the attempt is
    /// stopped and fails. The worker's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_output_bytes: Option<i64>,
    /// The user to run as (a name or a numeric uid); the worker's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^([A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})$")
    )]
    pub run_as: Option<String>,
    /// For kind `service`: how many copies to keep running, 1 to 1000 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub replicas: Option<i32>,
    /// For kind `service`: restart a copy that exits `always` (default) or only
    /// `on_failure` (an exit with code 0 then ends the copy as succeeded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<RestartPolicy>))]
    pub restart_policy: Option<String>,
    /// For kind `service`: `{"command": [...]}` or `{"http": "http://host:port/path"}`, with
    /// optional `interval_secs` (10), `timeout_secs` (5) and `failures` (3): a copy that
    /// fails its check that many times in a row is restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub health_check: Option<serde_json::Value>,
    /// May be stopped while it runs to make room for a copy of a service (services first):
    /// the attempt ends `interrupted` with an error starting "preempted:", is not charged, and
    /// the task waits again to be claimed. For short batch tasks that can start over; a
    /// service cannot be preemptible.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preemptible: bool,
    /// Who is told when the task succeeds, fails for good or fails an attempt that will be
    /// retried: `{"on_success" | "on_failure" | "on_retry": [TARGET, …]}`, each TARGET the
    /// name of an alert target (a webhook an admin defined) or `{"task": {…}}`, a follow-up
    /// task submitted with the event as its input. Default: its queue's. See
    /// `docs/operations.md`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub notify: Option<serde_json::Value>,
}

/// When a service's copy is restarted (`SubmitTask::restart_policy`), for the OpenAPI
/// document.
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum RestartPolicy {
    Always,
    OnFailure,
}

/// The answer to a submission: the ids in request order, and whether each was created:
/// false when its idempotency key named a task already, whose id it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Submitted {
    pub ids: Vec<Uuid>,
    pub created: Vec<bool>,
}

/// Many submissions in one request; all or nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SubmitBatch {
    #[cfg_attr(feature = "openapi", schema(max_items = 10000))]
    pub tasks: Vec<SubmitTask>,
}

/// How many tasks a listing's filters select (`GET /api/v1/tasks/count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskCount {
    /// The tasks counted: exact when `exact`, else a lower bound ("more than", or "at
    /// least").
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 10000))]
    pub count: i64,
    /// False when there may be more than `count`: past 10,000, or when 100,000 tasks were
    /// read before the filters no index applies were settled.
    pub exact: bool,
}

impl TaskCount {
    /// A count above this is answered as "more than" it.
    pub const LIMIT: i64 = 10_000;

    /// What to say before the number: nothing when it is exact, else "more than " (past
    /// [`TaskCount::LIMIT`]) or "at least ".
    pub fn qualifier(&self) -> &'static str {
        match (self.exact, self.count >= Self::LIMIT) {
            (true, _) => "",
            (false, true) => "more than ",
            (false, false) => "at least ",
        }
    }
}

/// A page of tasks, newest first. Pass `next_cursor` as `after` to get the next page, until
/// it is null.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    pub next_cursor: Option<Uuid>,
    /// True when the server stopped at its scan limit before the page was full: the page may
    /// be short, even empty, and `next_cursor` continues the scan (see `docs/api.md`).
    #[serde(default)]
    pub scan_limit_reached: bool,
}

/// A page of task summaries (`GET /api/v1/tasks?view=summary`), paged like [`TaskPage`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskSummaryPage {
    pub tasks: Vec<events::TaskSummary>,
    pub next_cursor: Option<Uuid>,
    #[serde(default)]
    pub scan_limit_reached: bool,
}

/// A chunk of a task's stdout or stderr.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LogChunk {
    /// Increasing; pass the last one seen as `after` to follow the log.
    pub id: i64,
    pub attempt: i32,
    /// `stdout` or `stderr`.
    pub stream: String,
    pub at: DateTime<Utc>,
    pub data: String,
}

/// A worker in the registry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Worker {
    pub id: Uuid,
    pub name: String,
    pub host: String,
    pub pid: Option<i32>,
    pub version: String,
    pub queues: Vec<String>,
    pub labels: Vec<String>,
    pub concurrency: i32,
    pub lease_secs: f64,
    pub started_at: DateTime<Utc>,
    pub heartbeat_at: DateTime<Utc>,
    pub stopping_at: Option<DateTime<Utc>>,
    /// The heartbeat is younger than the lease.
    pub alive: bool,
    /// Tasks it runs now.
    pub running: i64,
    /// CPU it offers to tasks' requests, in millicores; null when it does not advertise any
    /// (it then claims by slots and labels only).
    #[serde(default)]
    pub cpu_millis: Option<i32>,
    /// Memory it offers to tasks' requests, in MB; null when it does not advertise any.
    #[serde(default)]
    pub memory_mb: Option<i32>,
    /// CPU millicores and memory MB requested by the tasks it runs now.
    #[serde(default)]
    pub running_cpu_millis: i64,
    #[serde(default)]
    pub running_memory_mb: i64,
}

/// Task counts of one queue by state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueCounts {
    pub queue: String,
    /// Unfinished tasks by state (`blocked`, `waiting`, `running`, `retry`), and tasks that
    /// finished in the last hour by final state; states without tasks are left out.
    pub counts: BTreeMap<String, i64>,
    /// Seconds the oldest due task (`waiting` or `retry` whose `next_run_at` has passed) has
    /// been due; null when none is.
    #[serde(default)]
    pub oldest_due_secs: Option<f64>,
    /// The queue is paused since then (no worker claims its tasks); null when not.
    #[serde(default)]
    pub paused_at: Option<DateTime<Utc>>,
    /// Its concurrency limit over all workers; null: none.
    #[serde(default)]
    pub max_running: Option<i32>,
    /// Its rate limit in tasks started per second, and the burst; null: none.
    #[serde(default)]
    pub rate_per_sec: Option<f64>,
    #[serde(default)]
    pub burst: Option<i32>,
    /// Seconds its finished tasks are kept, and its failed tasks; null: the cluster's
    /// (`GET /api/v1/retention`).
    #[serde(default)]
    pub retention_secs: Option<f64>,
    #[serde(default)]
    pub keep_failed_secs: Option<f64>,
}

/// `GET /api/v1/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    pub status: String,
    pub version: String,
    pub schema_version: i64,
    /// Where the server sends reads that tolerate staleness; absent when it has no read
    /// replica (`--read-database-url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reads: Option<ReadRouting>,
}

/// Where a server with a read replica (`--read-database-url`) sends the reads that tolerate
/// staleness now: listings, counts, the overview, the history, log chunks and the workers
/// (`docs/operations.md`, "Read replica").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReadRouting {
    /// True while the replica serves them, false while the primary does (the replica is
    /// further behind than `max_staleness_secs`, does not answer, or is not a replica).
    pub on_replica: bool,
    /// How far behind the primary the replica was at its last check (0: it had replayed all
    /// it received), in seconds; null when the check failed.
    pub replica_lag_secs: Option<f64>,
    /// `--read-max-staleness`, in seconds.
    pub max_staleness_secs: f64,
}

/// Who a token belongs to (`GET /api/v1/me`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Me {
    pub owner: String,
    pub role: String,
}

/// Every API error has this body; `code` is stable, `message` is for people.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiError {
    pub code: String,
    pub message: String,
}

/// The answer to cancel and retry: the state the task has after the call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StateChange {
    pub id: Uuid,
    pub state: TaskState,
    /// True when a running task's cancel was requested and its worker will stop it.
    #[serde(default)]
    pub cancel_requested: bool,
}

mod workflow;
pub use workflow::{
    DefineWorkflow, DefinitionVersion, MapTriggerRule, ParentTask, RunWorkflowDefinition,
    SubWorkflow, SubWorkflowRun, SubmitWorkflow, TriggerRule, Workflow, WorkflowChange,
    WorkflowDefinition, WorkflowDefinitionPage, WorkflowDetail, WorkflowEdge, WorkflowPage,
    WorkflowState, WorkflowSubmitted, WorkflowTask,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_round_trip() {
        for state in TaskState::ALL {
            assert_eq!(state.as_str().parse::<TaskState>(), Ok(state));
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                serde_json::Value::String(state.as_str().into())
            );
        }
        assert!("bogus".parse::<TaskState>().is_err());
        assert_eq!(
            "bogus".parse::<TaskState>().unwrap_err().to_string(),
            "unknown task state \"bogus\" (expected one of blocked, waiting, running, retry, \
             succeeded, failed, cancelled, upstream_failed, skipped)"
        );
    }

    #[test]
    fn kind_names_round_trip() {
        for kind in TaskKind::ALL {
            assert_eq!(kind.as_str().parse::<TaskKind>(), Ok(kind));
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::String(kind.as_str().into())
            );
        }
        assert_eq!(TaskKind::default(), TaskKind::Command);
        assert_eq!(
            "teleport".parse::<TaskKind>().unwrap_err().to_string(),
            "unknown task kind \"teleport\" (expected one of command, noop, sleep, service)"
        );
    }

    #[test]
    fn submit_rejects_unknown_fields() {
        let err = serde_json::from_str::<SubmitTask>(r#"{"comand":["x"]}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}
