//! Wire types of long-running services (see docs/services.md).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::TaskState;

/// A service as the API shows it: its definition (secret environment values masked), the
/// copies it wants and runs, and, in `GET /api/v1/services/{id}`, each copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Service {
    pub id: Uuid,
    pub owner: String,
    pub name: Option<String>,
    pub queue: String,
    /// `blocked` while it runs (it waits on its copies), else how it ended.
    pub state: TaskState,
    pub command: Option<Vec<String>>,
    pub args: Vec<String>,
    pub artifact_url: Option<String>,
    pub artifact_sha256: Option<String>,
    pub input: Option<serde_json::Value>,
    pub env: BTreeMap<String, String>,
    pub labels: Vec<String>,
    pub cpu_millis: Option<i32>,
    pub memory_mb: Option<i32>,
    pub max_output_bytes: Option<i64>,
    pub run_as: Option<String>,
    /// `always` or `on_failure`.
    pub restart_policy: String,
    pub health_check: Option<serde_json::Value>,
    /// Copies wanted.
    pub replicas: i32,
    /// Copies whose process is up now (retired copies still stopping included).
    pub running: i32,
    /// Copies up whose process has passed its health check; null for a service without one.
    #[serde(default)]
    pub healthy: Option<i32>,
    /// Copies that wait for a worker (they go before other tasks: docs/runtime.md).
    #[serde(default)]
    pub waiting: i32,
    /// How often the worker restarted the copies that count for the service, summed.
    #[serde(default)]
    pub restarts: i64,
    /// The version of the definition; copies of older ones are being rolled over.
    pub generation: i32,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// The copies: those that count for the service by index, then retired copies that are
    /// still stopping. Empty in listings.
    #[serde(default)]
    pub copies: Vec<ServiceCopy>,
}

/// One copy of a service (a task of kind `service`, shard of the service).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServiceCopy {
    /// The copy's task id: its logs are `GET /api/v1/tasks/{id}/logs`.
    pub id: Uuid,
    /// 0 to replicas − 1 (`SKED_SHARD_INDEX`).
    pub index: i32,
    /// The generation of the definition it runs.
    pub generation: i32,
    pub state: TaskState,
    /// True for a copy that no longer counts for the service (scaled down, or replaced by a
    /// rolling update) and is being stopped.
    pub retired: bool,
    pub attempt: i32,
    pub worker_id: Option<Uuid>,
    pub worker_host: Option<String>,
    pub worker_name: Option<String>,
    /// When the current attempt was claimed.
    pub started_at: Option<DateTime<Utc>>,
    /// When its process started; null while it backs off.
    pub up_since: Option<DateTime<Utc>>,
    pub uptime_secs: Option<f64>,
    /// When the current process first passed its health check.
    pub healthy_at: Option<DateTime<Utc>>,
    /// How often its worker restarted it.
    pub restarts: i32,
    /// While it backs off after an exit: when it starts again.
    pub backing_off_until: Option<DateTime<Utc>>,
    pub cancel_requested: bool,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
    /// Its last exits, newest first (at most 20).
    pub last_exits: Vec<ServiceExit>,
}

/// One exit of a copy's process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServiceExit {
    pub attempt: i32,
    pub exited_at: DateTime<Utc>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// How it ended, as people read it (`exited with code 1`, `health check failed …`).
    pub error: String,
    /// When its worker planned to start it again; null when it was not restarted.
    pub restart_at: Option<DateTime<Utc>>,
}

/// The attempts a copy of a service has (`sked.service_copy_max_attempts()`): it never runs
/// out of them, as workers restart it in place and a lost lease retries it at once.
pub const COPY_MAX_ATTEMPTS: i32 = 1_000_000_000;

/// A task's attempt out of its maximum as people read it, `2/3`; a copy of a service never
/// runs out of attempts, so its maximum shows as `∞`.
pub fn attempts_text(attempt: i32, max_attempts: i32) -> String {
    if max_attempts >= COPY_MAX_ATTEMPTS {
        format!("{attempt}/∞")
    } else {
        format!("{attempt}/{max_attempts}")
    }
}

/// The answer of `GET /api/v1/services`: the services that run, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServiceList {
    pub services: Vec<Service>,
}

/// The body of `PATCH /api/v1/services/{id}`: the keys to change, the others keep their
/// values. A change to the definition rolls the copies over to a new generation one at a
/// time; `replicas` scales. `null` removes an optional value (`input`, `health_check`,
/// `cpu_millis`, …).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(min_properties = 1))]
#[serde(deny_unknown_fields)]
pub struct UpdateService {
    #[cfg_attr(feature = "openapi", schema(min_items = 1))]
    pub command: Option<Vec<String>>,
    pub args: Option<Vec<String>>,
    pub env: Option<BTreeMap<String, String>>,
    pub input: Option<serde_json::Value>,
    /// The program to fetch and run instead of `command`: `file:///…` (beneath the worker's
    /// `--artifact-dir`), `http(s)://…`, or `pg:<artifact_sha256>` (stored in the database;
    /// the pattern leaves it out, as it cannot name the hash).
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^(file:///|https?://)[^\\x00]*$")
    )]
    pub artifact_url: Option<String>,
    #[cfg_attr(feature = "openapi", schema(pattern = "^[0-9a-f]{64}$"))]
    pub artifact_sha256: Option<String>,
    pub labels: Option<Vec<String>>,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000000))]
    pub cpu_millis: Option<i32>,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 16777216))]
    pub memory_mb: Option<i32>,
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_output_bytes: Option<i64>,
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = "^([A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10})$")
    )]
    pub run_as: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::RestartPolicy>))]
    pub restart_policy: Option<String>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub health_check: Option<serde_json::Value>,
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub replicas: Option<i32>,
}

/// The answer of `PATCH /api/v1/services/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ServiceUpdated {
    pub id: Uuid,
    /// The generation after the change (unchanged when only `replicas` changed).
    pub generation: i32,
    pub replicas: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copys_endless_attempts_show_as_infinity() {
        assert_eq!(attempts_text(2, 3), "2/3");
        assert_eq!(attempts_text(1, COPY_MAX_ATTEMPTS), "1/∞");
        // Interrupted attempts raise the maximum by one each.
        assert_eq!(attempts_text(4, COPY_MAX_ATTEMPTS + 3), "4/∞");
    }
}
