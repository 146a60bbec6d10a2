//! Wire types of cron schedules (see docs/schedules.md).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{SubmitTask, SubmitWorkflow};

/// A cron schedule as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Schedule {
    pub id: Uuid,
    pub owner: String,
    pub name: String,
    /// The cron expression as given (5 fields, 6 with seconds first, or a macro).
    pub cron: String,
    /// IANA time zone the expression is read in.
    pub time_zone: String,
    /// The task template, with the keys of `sked.tasks_submit` (intervals as Postgres text).
    pub task: Option<serde_json::Value>,
    /// The workflow template, a spec for `sked.workflow_submit`.
    pub workflow: Option<serde_json::Value>,
    /// `skip`, `run_once` or `catch_up`.
    pub misfire_policy: String,
    /// A tick later than this when seen is a missed tick.
    pub misfire_grace_secs: f64,
    pub catch_up_limit: i32,
    /// `allow`, `skip`, `queue_one` or `replace`.
    pub overlap_policy: String,
    /// Each occurrence starts up to this many seconds after its tick (random).
    pub jitter_secs: f64,
    /// Runs kept per schedule.
    pub history_limit: i32,
    pub paused_at: Option<DateTime<Utc>>,
    pub next_run_at: DateTime<Utc>,
    pub last_fire_at: Option<DateTime<Utc>>,
    pub last_task_id: Option<Uuid>,
    pub last_workflow_id: Option<Uuid>,
    /// A tick waiting for the previous occurrence to finish (overlap policy `queue_one`).
    pub queued_fire_at: Option<DateTime<Utc>>,
    /// Who is told of missed ticks and failing occurrences (see `CreateSchedule::notify`).
    #[serde(default)]
    pub notify: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// What happened at the latest tick: `fired`, `queued`, `skipped` or `missed`, with its
    /// occurrence and detail; null before the first tick. "Run now" is not a tick: its
    /// `manual` runs are left out here (they are in the detail's `runs`).
    #[serde(default)]
    pub last_tick: Option<ScheduleRun>,
}

/// What happened to one tick of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleRun {
    /// The tick (for `manual` runs, when it was asked for).
    pub fire_at: DateTime<Utc>,
    /// `fired`, `queued`, `skipped`, `missed` or `manual`.
    pub outcome: String,
    /// The task the tick submitted; left out when it submitted none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub task_id: Option<Uuid>,
    /// The workflow the tick submitted; left out when it submitted none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub workflow_id: Option<Uuid>,
    /// Ticks this row stands for beyond its own (missed ticks).
    pub missed_ticks: i32,
    pub detail: Option<String>,
    pub recorded_at: DateTime<Utc>,
    /// The backfill that fired this tick; left out for the schedule's own ticks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub backfill_id: Option<Uuid>,
}

/// A schedule with its next fire times and its latest runs (newest first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleDetail {
    #[serde(flatten)]
    pub schedule: Schedule,
    pub next_fire_times: Vec<DateTime<Utc>>,
    pub runs: Vec<ScheduleRun>,
    /// The latest backfills of the schedule (at most 10), newest first.
    #[serde(default)]
    pub backfills: Vec<Backfill>,
}

/// In which order a backfill runs its ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum BackfillOrder {
    /// The oldest tick first.
    #[default]
    OldestFirst,
    /// The newest tick first.
    NewestFirst,
}

/// A backfill to start (`POST /api/v1/schedules/{id}/backfills`): an occurrence of the
/// schedule for every tick from `from` to `to` (both included), at most `max_active` running
/// at once. A tick that has run already (fired by the schedule or by another backfill) is not
/// run again; one the schedule missed or skipped is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StartBackfill {
    /// The first moment of the range.
    pub from: DateTime<Utc>,
    /// The last moment of the range; not in the future.
    pub to: DateTime<Utc>,
    /// Occurrences running at once, 1 to 1000 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub max_active: Option<i32>,
    /// `oldest_first` (default) or `newest_first`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<BackfillOrder>,
}

/// A backfill of a schedule and how far it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Backfill {
    pub id: Uuid,
    pub schedule_id: Uuid,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub order: BackfillOrder,
    pub max_active: i32,
    /// `running`, then `succeeded` (every occurrence it started succeeded), `failed` (one did
    /// not, or one could not be submitted: see `error`) or `cancelled`.
    pub state: String,
    /// Ticks in the range.
    pub ticks: i32,
    /// Ticks it fired.
    pub fired: i32,
    /// Ticks that had run already, not run again.
    pub already: i32,
    /// Occurrences running now.
    pub active: i32,
    /// Occurrences that succeeded, and that ended otherwise (failed, cancelled).
    pub succeeded: i32,
    pub failed: i32,
    /// The tick it fires next; null once every tick was handled.
    pub next_tick: Option<DateTime<Utc>>,
    /// Why it failed, when an occurrence could not be submitted.
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The backfills of a schedule, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BackfillPage {
    pub backfills: Vec<Backfill>,
}

/// Declares a body of `POST /api/v1/schedules` or `PATCH /api/v1/schedules/{id}`: its own
/// fields, then the ones both take, each optional, left out when absent, and declared with
/// the type and range the document gives it: the time zone, the template (a task or a
/// workflow) and the settings. Each body says what its task template is; a creation says the
/// `defaults` that stand for the settings it leaves out (a change keeps their values).
macro_rules! schedule_body {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($own:tt)*
        }
        task: $task:literal,
        $(defaults {
            time_zone: $time_zone:literal,
            misfire_policy: $misfire_policy:literal,
            misfire_grace_secs: $misfire_grace_secs:literal,
            catch_up_limit: $catch_up_limit:literal,
            overlap_policy: $overlap_policy:literal,
            jitter_secs: $jitter_secs:literal,
            history_limit: $history_limit:literal,
        })?
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($own)*
            $(#[doc = $time_zone])?
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub time_zone: Option<String>,
            #[doc = $task]
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub task: Option<SubmitTask>,
            /// Or a workflow spec, as `POST /api/v1/workflows` takes it (without `owner`: the
            /// schedule's owner owns each occurrence); a new one replaces a task template.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub workflow: Option<SubmitWorkflow>,
            $(#[doc = $misfire_policy])?
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[cfg_attr(feature = "openapi", schema(value_type = Option<MisfirePolicy>))]
            pub misfire_policy: Option<String>,
            $(#[doc = $misfire_grace_secs])?
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 3155760000.0))]
            pub misfire_grace_secs: Option<f64>,
            $(#[doc = $catch_up_limit])?
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10000))]
            pub catch_up_limit: Option<i32>,
            $(#[doc = $overlap_policy])?
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[cfg_attr(feature = "openapi", schema(value_type = Option<OverlapPolicy>))]
            pub overlap_policy: Option<String>,
            $(#[doc = $jitter_secs])?
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 3155760000.0))]
            pub jitter_secs: Option<f64>,
            $(#[doc = $history_limit])?
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[cfg_attr(feature = "openapi", schema(minimum = 1))]
            pub history_limit: Option<i32>,
            /// Who is told when ticks are missed and when occurrences fail in a row:
            /// `{"on_missed": [TARGET, …], "on_failure": [TARGET, …], "failures_in_a_row": N}`
            /// (N: 1 to 1000, default 1; `{}`: no one). See `docs/schedules.md`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
            pub notify: Option<serde_json::Value>,
        }
    };
}

schedule_body! {
    /// A request to create a schedule: a name, a cron expression and a task (or workflow).
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(deny_unknown_fields)]
    pub struct CreateSchedule {
        #[cfg_attr(feature = "openapi", schema(min_length = 1))]
        pub name: String,
        pub cron: String,
        /// Create it paused.
        #[serde(default)]
        pub paused: bool,
        /// Admins may create schedules for another owner.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "openapi", schema(min_length = 1))]
        pub owner: Option<String>,
    }
    task: "What each tick submits (`run_at`, `delay_secs` and `owner` are set by the schedule).",
    defaults {
        time_zone: "Default `UTC`.",
        misfire_policy: "`skip`, `run_once` (default) or `catch_up`.",
        misfire_grace_secs: "Default 60.",
        catch_up_limit: "Default 100.",
        overlap_policy: "`allow`, `skip` (default), `queue_one` or `replace`.",
        jitter_secs: "Default 0.",
        history_limit: "Default 1000.",
    }
}

/// A page of schedules, by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SchedulePage {
    pub schedules: Vec<Schedule>,
}

/// The next fire times of an expression (a preview, nothing is stored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CronPreview {
    pub cron: String,
    pub time_zone: String,
    pub next_fire_times: Vec<DateTime<Utc>>,
}

schedule_body! {
    /// Changes to a schedule (`PATCH /api/v1/schedules/{id}`); absent fields keep their values.
    /// A new expression or time zone re-arms the schedule at its next tick from now; a new
    /// template applies from the next occurrence on.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(deny_unknown_fields)]
    pub struct UpdateSchedule {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "openapi", schema(min_length = 1))]
        pub name: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub cron: Option<String>,
    }
    task: "A new task template; replaces a workflow template.",
}

/// The occurrence a "run now" created: a task or a workflow, by the schedule's template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunNow {
    pub schedule_id: Uuid,
    /// The task submitted, when the template is a task (left out otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub task_id: Option<Uuid>,
    /// The workflow submitted, when the template is a workflow (left out otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub workflow_id: Option<Uuid>,
}

/// What a schedule does with missed ticks (`misfire_policy`), for the OpenAPI document.
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum MisfirePolicy {
    Skip,
    RunOnce,
    CatchUp,
}

/// What a tick does while the previous occurrence runs (`overlap_policy`), for the OpenAPI
/// document.
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum OverlapPolicy {
    Allow,
    Skip,
    QueueOne,
    Replace,
}
