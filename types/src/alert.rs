//! Alert targets and a queue's notify (`docs/operations.md`, "Alerts").

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A webhook notifications are delivered to, as listed: everything but its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AlertTarget {
    /// 1 to 64 of `A-Z a-z 0-9 _ . : -`, starting with a letter or a digit.
    pub name: String,
    /// Where deliveries are POSTed (`http://` or `https://`).
    pub url: String,
    /// The queue of its deliveries: a worker must serve it.
    pub queue: String,
    /// Attempts of each delivery (retried with backoff until a 2xx answer).
    pub max_attempts: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Creates or replaces an alert target (`PUT /api/v1/alert-targets/{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetAlertTarget {
    /// Where deliveries are POSTed: `http://` or `https://`, at most 2,048 characters.
    pub url: String,
    /// The key of each delivery's signature (`X-Sked-Signature`, HMAC-SHA256), 16 to 512
    /// characters. Never shown again.
    pub secret: String,
    /// The queue of its deliveries (default `default`): a worker must serve it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Attempts of each delivery, 1 to 100 (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub max_attempts: Option<i32>,
}

/// A queue's notify (`PUT /api/v1/queues/{name}/notify`): the notify of its tasks that have
/// none of their own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QueueNotify {
    /// `{"on_success" | "on_failure" | "on_retry": [TARGET, …]}` as a task's `notify`; null:
    /// none.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub notify: Option<serde_json::Value>,
}
