//! Queue controls (pause, concurrency limit, rate limit) and the reason a task waits; see
//! `docs/runtime.md`.

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
