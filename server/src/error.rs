//! The one error type of the API and the one place it becomes an HTTP response.
//!
//! Every failure a handler or extractor can meet is an [`Error`]; [`IntoResponse`] renders it
//! as a status code and a JSON [`sked_types::ApiError`] body whose `code` is stable. Database
//! text never reaches a response: schema rejections are described from the constraint's name,
//! and anything unexpected is logged by its message (never PostgreSQL's DETAIL, which can
//! hold a refused row's values) and answered with a generic message.

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sked_db::DbError;
use sked_types::{TaskKind, TaskState, listed};

/// An API failure. The variant decides the status code and the stable `code` of the body.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No token, a malformed `Authorization` header, or an unknown, revoked or expired token
    /// (401).
    #[error("{0}")]
    Unauthorized(std::borrow::Cow<'static, str>),
    /// The token is valid but may not do this (403).
    #[error("{0}")]
    Forbidden(String),
    /// No such resource, or one the caller may not see (404).
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed: bad JSON, unknown fields, bad query or path values (400).
    #[error("{0}")]
    InvalidRequest(String),
    /// The request body or batch is larger than the server accepts (413).
    #[error("{0}")]
    TooLarge(String),
    /// The owner's quota of task rows per minute cannot cover the request now (429, with
    /// `Retry-After`).
    #[error("{message}")]
    QuotaExceeded {
        message: String,
        /// Whole seconds until the quota covers the request.
        retry_after_secs: u64,
    },
    /// The schema rejected a row; the message is derived from the constraint's name (422).
    #[error("{0}")]
    Rejected(String),
    /// The request is well formed but what exists now refuses it: a unique rule holds another
    /// row (an idempotency key), the task is a shard, no live worker can take a broadcast
    /// (409).
    #[error("{0}")]
    Conflict(String),
    /// Cancel of a task that is already in a final state (409).
    #[error("the task is already finished")]
    AlreadyFinished,
    /// Retry of a task that is not in a final state (409).
    #[error("only a finished task (succeeded, failed or cancelled) can be retried")]
    NotFinished,
    /// The path exists but not with this method (405).
    #[error("this endpoint does not accept this method")]
    MethodNotAllowed,
    /// The database cannot be reached (503); only the health check reports this.
    #[error("the database is unavailable")]
    Unavailable(#[source] DbError),
    /// Anything else (500). The source is logged, never sent.
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn not_found_task() -> Error {
        Error::NotFound("no such task".to_owned())
    }

    pub fn not_found_workflow() -> Error {
        Error::NotFound("no such workflow".to_owned())
    }

    /// The status code and stable code of this error.
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Error::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Error::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Error::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            Error::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Error::QuotaExceeded { .. } => (StatusCode::TOO_MANY_REQUESTS, "quota_exceeded"),
            Error::Rejected(_) => (StatusCode::UNPROCESSABLE_ENTITY, "rejected"),
            Error::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Error::AlreadyFinished => (StatusCode::CONFLICT, "already_finished"),
            Error::NotFinished => (StatusCode::CONFLICT, "not_finished"),
            Error::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        match &self {
            Error::Internal(source) => tracing::error!(error = %source, "request failed"),
            Error::Unavailable(source) => tracing::warn!(error = %source, "database unavailable"),
            _ => {}
        }
        let body = sked_types::ApiError {
            code: code.to_owned(),
            message: self.to_string(),
        };
        let mut response = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Error::QuotaExceeded {
            retry_after_secs, ..
        } = self
        {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        }
        response
    }
}

impl From<DbError> for Error {
    fn from(err: DbError) -> Self {
        match err {
            // A task token whose attempt no longer runs (ended, lease expired, a newer one
            // runs): the token may not act (sked.task_spawn's message says which).
            DbError::Rejected {
                constraint,
                message,
            } if constraint == SPAWN_NEEDS_ITS_RUNNING_ATTEMPT => {
                Error::Forbidden(rule_message(message, &constraint))
            }
            // The workflow, service and spawn rules' messages are written by
            // sked.workflow_submit, sql/services.sql and sked.task_spawn for people (they name
            // the task or field at fault), not database text.
            DbError::Rejected {
                constraint,
                message,
            } if constraint.starts_with("workflows_")
                || constraint.starts_with("services_")
                || constraint.starts_with("tasks_spawn_") =>
            {
                Error::Rejected(rule_message(message, &constraint))
            }
            // The alert rules' messages (sql/alerts.sql) are written for people and name
            // only the request's own values (the target it names).
            DbError::Rejected {
                constraint,
                message,
            } if constraint.starts_with("tasks_notify_")
                || constraint == "tasks_webhook_kind_is_for_alerts_only" =>
            {
                Error::Rejected(
                    message
                        .strip_prefix("sked.tasks: ")
                        .map(str::to_owned)
                        .unwrap_or_else(|| describe_rule(&constraint)),
                )
            }
            // Not a rule about the request: the workers alive now decide.
            DbError::Rejected { constraint, .. }
                if constraint == "tasks_broadcast_needs_a_live_worker" =>
            {
                Error::Conflict(describe_rule(&constraint))
            }
            DbError::Rejected { constraint, .. } => Error::Rejected(describe_rule(&constraint)),
            DbError::Conflict { constraint } => Error::Conflict(describe_conflict(&constraint)),
            DbError::InvalidInput(detail) => {
                // Postgres' own wording (and the value it quotes) stays in the log.
                tracing::debug!(%detail, "database rejected a value as malformed");
                Error::InvalidRequest(
                    "a value is malformed or out of range for its field".to_owned(),
                )
            }
            other => Error::Internal(Box::new(other)),
        }
    }
}

/// The constraint `sked.task_spawn` names when the token's attempt is not the task's running
/// one (403).
pub const SPAWN_NEEDS_ITS_RUNNING_ATTEMPT: &str = "tasks_spawn_needs_its_running_attempt";

/// The message of a rule whose function writes it for people, without the prefix naming its
/// subject (`workflow: `, `service: `, `spawn: `); the rule read from the constraint's name
/// when there is none.
fn rule_message(message: String, constraint: &str) -> String {
    ["workflow: ", "service: ", "spawn: "]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .map(str::to_owned)
        .unwrap_or_else(|| describe_rule(constraint))
}

impl From<sqlx::Error> for Error {
    fn from(err: sqlx::Error) -> Self {
        DbError::from(err).into()
    }
}

/// The largest body `POST /api/v1/tasks/batch` and `POST /api/v1/workflows` read (a full
/// batch of ordinary tasks fits).
pub const MAX_BATCH_BODY: usize = 32 * 1024 * 1024;
/// The largest body of any other request: axum's default limit, which those routes keep
/// (`tests/it/api.rs` holds both limits to what the server does).
pub const MAX_BODY: usize = 2 * 1024 * 1024;

impl From<JsonRejection> for Error {
    fn from(rejection: JsonRejection) -> Self {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return Error::TooLarge(format!(
                "the request body is larger than the API reads: {} MiB for POST \
                 /api/v1/tasks/batch and /api/v1/workflows, {} MiB for any other request",
                MAX_BATCH_BODY / (1024 * 1024),
                MAX_BODY / (1024 * 1024)
            ));
        }
        Error::InvalidRequest(rejection.body_text())
    }
}

impl From<QueryRejection> for Error {
    fn from(rejection: QueryRejection) -> Self {
        Error::InvalidRequest(rejection.body_text())
    }
}

impl From<PathRejection> for Error {
    fn from(rejection: PathRejection) -> Self {
        Error::InvalidRequest(rejection.body_text())
    }
}

/// Constraints whose names do not read as a rule on their own, or name a column differently
/// from the API field that sets it.
const RULES: &[(&str, &str)] = &[
    (
        "tasks_command_or_artifact_is_required",
        "command (or artifact_url) is required",
    ),
    (
        "tasks_command_and_artifact_are_exclusive",
        "command and artifact_url are exclusive: give one of them",
    ),
    (
        "tasks_queue_name_must_be_1_to_64_word_characters",
        "queue must be 1 to 64 letters, digits or `_.:-`, starting with a letter or digit",
    ),
    (
        "tasks_env_must_be_an_object_of_strings",
        "env names must be non-empty and must not contain `=`",
    ),
    (
        "tasks_argument_and_env_strings_must_be_at_most_131072_bytes",
        "each argument of command and args and each env NAME=value must be at most 131,072 bytes \
         with its terminating NUL (Linux's MAX_ARG_STRLEN): exec would refuse it (\"Argument list \
         too long\"); pass large data as input (stdin) or in a file instead",
    ),
    (
        "tasks_command_and_env_must_total_at_most_1048576_bytes",
        "command, args and env together must be at most 1,048,576 bytes, each string counted \
         with its NUL and an 8-byte pointer (half of the usual 2 MB ARG_MAX, the rest left for \
         the environment the worker adds); pass large data as input (stdin) or in a file instead",
    ),
    (
        "tasks_output_path_must_be_relative_beneath_the_task_directory",
        "output_path must be a relative path beneath the task's working directory (no leading / and no .. component)",
    ),
    (
        "tasks_timeout_must_be_positive",
        "timeout_secs must be positive",
    ),
    (
        "tasks_max_attempts_must_be_at_least_1",
        "max_attempts must be at least 1",
    ),
    (
        "tasks_backoff_must_be_positive",
        "backoff_base_secs must be positive and backoff_max_secs at least backoff_base_secs",
    ),
    (
        "tasks_trigger_rule_is_known",
        "trigger_rule must be one of all_success, all_done, one_failed (alias on_failure), none_failed",
    ),
    (
        "tasks_shard_total_must_be_1_to_10000",
        "shards must be between 1 and 10000",
    ),
    (
        "tasks_shards_and_broadcast_are_exclusive",
        "shards and broadcast are exclusive: give one of them",
    ),
    (
        "tasks_cpu_millis_must_be_1_to_1000000",
        "cpu_millis must be between 1 and 1000000 (millicores; 1000 is one core)",
    ),
    (
        "tasks_memory_mb_must_be_1_to_16777216",
        "memory_mb must be between 1 and 16777216 (MB)",
    ),
    (
        "tasks_max_output_bytes_must_be_positive",
        "max_output_bytes must be positive",
    ),
    (
        "tasks_run_as_must_be_a_user_name_or_uid",
        "run_as must be a user name (a letter or _ then up to 31 letters, digits, _ . -) or a numeric uid",
    ),
    (
        "tasks_replicas_must_be_1_to_1000",
        "replicas must be between 1 and 1000",
    ),
    (
        "tasks_replicas_are_only_for_services",
        "replicas is only for tasks of kind service",
    ),
    (
        "tasks_restart_policy_must_be_always_or_on_failure",
        "restart_policy must be always or on_failure",
    ),
    (
        "tasks_restart_policy_is_only_for_services",
        "restart_policy is only for tasks of kind service",
    ),
    (
        "tasks_health_check_is_only_for_services",
        "health_check is only for tasks of kind service",
    ),
    (
        "tasks_services_are_not_preemptible",
        "a service cannot be preemptible: its copies are what preemption makes room for",
    ),
    (
        "tasks_broadcast_needs_a_live_worker",
        "broadcast needs a live worker that serves the task's queue and has its labels; none does",
    ),
    (
        "queues_name_must_be_1_to_64_word_characters",
        "a queue name must be 1 to 64 letters, digits or `_.:-`, starting with a letter or digit",
    ),
    (
        "queues_max_running_must_be_1_to_1000000",
        "max_running must be between 1 and 1000000 (null: no limit)",
    ),
    (
        "queues_rate_per_sec_must_be_positive_and_at_most_1000000",
        "rate_per_sec must be more than 0 and at most 1000000 (null: no limit)",
    ),
    (
        "queues_burst_must_be_1_to_1000000",
        "burst must be between 1 and 1000000",
    ),
    (
        "queues_burst_needs_a_rate",
        "burst needs rate_per_sec: it is the size of the rate limit's bucket",
    ),
    (
        "queues_retention_must_be_1_hour_to_36500_days",
        "retention_secs must be between 3600 (an hour) and 3153600000 (36500 days)",
    ),
    (
        "queues_keep_failed_must_be_1_hour_to_36500_days",
        "keep_failed_secs must be between 3600 (an hour) and 3153600000 (36500 days)",
    ),
    (
        "retention_settings_retention_must_be_1_hour_to_36500_days",
        "retention_secs must be between 3600 (an hour) and 3153600000 (36500 days)",
    ),
    (
        "retention_settings_keep_failed_must_be_1_hour_to_36500_days",
        "keep_failed_secs must be between 3600 (an hour) and 3153600000 (36500 days)",
    ),
    (
        "retention_settings_keep_keys_must_be_1_hour_to_36500_days",
        "keep_keys_secs must be between 3600 (an hour) and 3153600000 (36500 days)",
    ),
];

/// Prefixes of constraint names: the table the rule belongs to.
const TABLE_PREFIXES: &[&str] = &[
    "task_attempts_",
    "task_edges_",
    "workflows_",
    "task_logs_",
    "api_tokens_",
    "artifacts_",
    "workers_",
    "queues_",
    "retention_settings_",
    "tasks_",
];

/// A rule as people read it, from a constraint name:
/// `tasks_command_must_not_be_empty` becomes `command must not be empty`.
pub fn describe_rule(constraint: &str) -> String {
    // The names these two admit are the enums' (a test reads the constraints).
    match constraint {
        "tasks_kind_is_known" => {
            return format!(
                "kind must be one of {}",
                listed(TaskKind::SUBMITTED.map(TaskKind::as_str))
            );
        }
        "tasks_state_is_known" => {
            return format!(
                "state must be one of {}",
                listed(TaskState::ALL.map(TaskState::as_str))
            );
        }
        _ => {}
    }
    if let Some((_, rule)) = RULES.iter().find(|(name, _)| *name == constraint) {
        return (*rule).to_owned();
    }
    if constraint.is_empty() {
        // A not-null violation names a column, not a constraint.
        return "a required value is missing".to_owned();
    }
    let rule = TABLE_PREFIXES
        .iter()
        .find_map(|prefix| constraint.strip_prefix(prefix))
        .unwrap_or(constraint);
    rule.replace('_', " ")
}

fn describe_conflict(constraint: &str) -> String {
    match constraint {
        "tasks_idempotency_key_names_another_definition" => {
            "this owner's idempotency key names a task with another definition (submit the same \
             fields again to be answered with that task, or use another key)"
                .to_owned()
        }
        "tasks_idempotency_key_names_another_task" => {
            "this owner's idempotency key names another task".to_owned()
        }
        _ => "conflicts with an existing row".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraint_names_read_as_rules() {
        assert_eq!(
            describe_rule("tasks_command_must_not_be_empty"),
            "command must not be empty"
        );
        assert_eq!(
            describe_rule("tasks_artifact_sha256_must_be_64_lowercase_hex"),
            "artifact sha256 must be 64 lowercase hex"
        );
        assert_eq!(
            describe_rule("workers_concurrency_must_be_at_least_1"),
            "concurrency must be at least 1"
        );
        assert_eq!(
            describe_rule("tasks_max_attempts_must_be_at_least_1"),
            "max_attempts must be at least 1"
        );
        assert_eq!(
            describe_rule("tasks_kind_is_known"),
            "kind must be one of command, noop, sleep, service"
        );
        assert_eq!(
            describe_rule("tasks_state_is_known"),
            "state must be one of blocked, waiting, running, retry, succeeded, failed, \
             cancelled, upstream_failed, skipped"
        );
        assert_eq!(describe_rule(""), "a required value is missing");
    }
}
