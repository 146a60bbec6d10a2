//! Queue controls (pause, concurrency limit, rate limit, retention), the cluster's retention,
//! and the reason a task waits; see `docs/runtime.md` and README.md, "Retention".

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a queue's name may be: 1 to 64 of `A-Z a-z 0-9 _ . : -`, starting with a letter or a
/// digit (the rule of `sked.queue_name_check` and of the tasks' `queue`).
pub const QUEUE_NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$";

/// The OpenAPI schema of a queue's name: a string of [`QUEUE_NAME_PATTERN`].
#[cfg(feature = "openapi")]
pub struct QueueName;

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for QueueName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some(QUEUE_NAME_PATTERN))
            .description(Some(
                "A queue's name: 1 to 64 of `A-Z a-z 0-9 _ . : -`, starting with a letter or \
                 a digit",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for QueueName {}

/// A queue's controls: `POST /api/v1/queues/{name}/pause`, `/resume` and
/// `PATCH /api/v1/queues/{name}` answer with them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueControls {
    pub queue: String,
    /// Paused since then: no worker claims its tasks (running tasks go on); null when not
    /// paused.
    pub paused_at: Option<DateTime<Utc>>,
    /// The most of its tasks that run at once over all workers; null: no limit.
    pub max_running: Option<i32>,
    /// The most of its tasks that start per second, on average; null: no limit.
    pub rate_per_sec: Option<f64>,
    /// The most starts at once under the rate limit (its bucket's size): as set, else the
    /// rate rounded up; null without a rate limit.
    pub burst: Option<i32>,
    /// Seconds its finished tasks are kept; null: the cluster's retention
    /// (`GET /api/v1/retention`).
    #[serde(default)]
    pub retention_secs: Option<f64>,
    /// Seconds its failed tasks (`failed`, `upstream_failed`) are kept, at least as long as
    /// its retention; null: the cluster's.
    #[serde(default)]
    pub keep_failed_secs: Option<f64>,
}

/// `PATCH /api/v1/queues/{name}`: a field that is absent stays as it is, `null` removes the
/// limit, a number sets it. Removing the rate limit removes its burst.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QueueLimits {
    /// Tasks running at once over all workers, 1 to 1,000,000; null: no limit.
    #[serde(default, with = "change", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<i32>, minimum = 1, maximum = 1000000)
    )]
    pub max_running: Option<Option<i32>>,
    /// Tasks started per second, more than 0 (a normal double) and at most 1,000,000 (0.5: one
    /// every two seconds); null: no limit.
    #[serde(default, with = "change", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<f64>, minimum = 2.2250738585072014e-308, maximum = 1000000)
    )]
    pub rate_per_sec: Option<Option<f64>>,
    /// Starts at once under the rate limit, 1 to 1,000,000; null: the rate rounded up.
    #[serde(default, with = "change", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<i32>, minimum = 1, maximum = 1000000)
    )]
    pub burst: Option<Option<i32>>,
    /// Seconds its finished tasks are kept, 3600 (an hour) to 3153600000 (36500 days); null:
    /// the cluster's retention.
    #[serde(default, with = "change", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<f64>, minimum = 3600, maximum = 3153600000.0)
    )]
    pub retention_secs: Option<Option<f64>>,
    /// Seconds its failed tasks are kept, 3600 to 3153600000; null: the cluster's.
    #[serde(default, with = "change", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<f64>, minimum = 3600, maximum = 3153600000.0)
    )]
    pub keep_failed_secs: Option<Option<f64>>,
}

/// The shortest retention, in seconds: an hour.
pub const MIN_RETENTION_SECS: f64 = 3600.0;
/// The longest retention, in seconds: 36500 days.
pub const MAX_RETENTION_SECS: f64 = 36_500.0 * 86_400.0;

/// How long finished tasks are kept, for every queue that does not set its own
/// (`GET /api/v1/retention`; the database's `sked.retention_settings`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Retention {
    /// False: retention is off, no finished task and no artifact is deleted, whatever the
    /// queues set.
    pub enabled: bool,
    /// Seconds a finished task is kept after it finished (default 7 days).
    pub retention_secs: f64,
    /// Seconds a failed task (`failed`, `upstream_failed`) is kept, at least as long as the
    /// retention (default 30 days).
    pub keep_failed_secs: f64,
    /// Seconds a stored artifact that no task or schedule refers to is kept after it was
    /// stored.
    pub artifact_grace_secs: f64,
    /// Seconds an idempotency key outlives the task it names (default a day).
    pub keep_keys_secs: f64,
    pub updated_at: DateTime<Utc>,
}

/// `PATCH /api/v1/retention`: a field that is absent stays as it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RetentionChange {
    /// False turns retention off entirely, true on again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Seconds a finished task is kept, 3600 (an hour) to 3153600000 (36500 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 3600, maximum = 3153600000.0))]
    pub retention_secs: Option<f64>,
    /// Seconds a failed task is kept, 3600 to 3153600000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 3600, maximum = 3153600000.0))]
    pub keep_failed_secs: Option<f64>,
    /// Seconds an idempotency key outlives the task it names, 3600 to 3153600000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 3600, maximum = 3153600000.0))]
    pub keep_keys_secs: Option<f64>,
}

/// A field of a change: absent keeps the value (`None`, by `default`), `null` removes it
/// (`Some(None)`), a value sets it (`Some(Some(_))`).
mod change {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S, T>(value: &Option<Option<T>>, serializer: S) -> Result<S::Ok, S::Error>
    where
        S: Serializer,
        T: Serialize,
    {
        value.serialize(serializer)
    }

    pub fn deserialize<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
    where
        D: Deserializer<'de>,
        T: Deserialize<'de>,
    {
        Option::<T>::deserialize(deserializer).map(Some)
    }
}

/// Why a task that has not started waits (`GET /api/v1/tasks/{id}`). `code` is stable:
/// `parents_pending`, `due_later`, `queue_paused`, `no_worker`, `missing_labels`, `too_big`,
/// `queue_at_limit`, `rate_limited`, `workers_busy` or `ready`; `message` says it for people,
/// with the numbers (e.g. "needs 4096 MB of memory and the largest live worker of queue
/// default has 2048 MB").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WaitingReason {
    pub code: String,
    pub message: String,
}

impl WaitingReason {
    /// What lets the task start, for people, when something can be done about `code`;
    /// `None` for a task that only has to wait (`due_later`, `ready`) or a code this version
    /// does not know.
    pub fn hint(&self, queue: &str) -> Option<String> {
        Some(match self.code.as_str() {
            "parents_pending" => "It starts once they have finished.".to_owned(),
            "no_attempt_left" => "Retry it, or raise its max_attempts.".to_owned(),
            "queue_paused" => format!(
                "It starts once the queue is resumed (Queues page, or `sked queue resume {queue}`)."
            ),
            "no_worker" => format!(
                "Start a worker that serves the queue: `sked-worker --queues {queue}`."
            ),
            "missing_labels" => {
                "Start a worker with those labels (`sked-worker --labels …`).".to_owned()
            }
            "too_big" => {
                "Start a worker with more capacity, or submit it with smaller requests."
                    .to_owned()
            }
            "queue_at_limit" => {
                "It starts when a running task of the queue ends, or once its max running is raised."
                    .to_owned()
            }
            "rate_limited" => "It starts when the queue's rate limit allows.".to_owned(),
            "workers_busy" => {
                "It starts when a slot frees up; more workers of the queue would start it sooner."
                    .to_owned()
            }
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_tell_absent_from_null() {
        let l: QueueLimits =
            serde_json::from_str(r#"{"max_running": null, "rate_per_sec": 2.5}"#).unwrap();
        assert_eq!(l.max_running, Some(None), "null removes the limit");
        assert_eq!(l.rate_per_sec, Some(Some(2.5)));
        assert_eq!(l.burst, None, "absent keeps it");
        assert!(serde_json::from_str::<QueueLimits>(r#"{"max_runing": 1}"#).is_err());
    }
}
