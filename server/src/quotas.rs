//! Limits on the task rows callers create, so that no caller can fill the database:
//!
//! - per request: a submission (a task, a batch, a workflow, a schedule's task or workflow
//!   per tick) over `--max-rows-per-request` is refused with 413 `too_large`, naming the
//!   limit, before anything is written;
//! - per owner: a user token's requests that create task rows (submissions, workflows,
//!   resubmissions, a schedule's run now, a service scaled up or rolled over) take them from
//!   its owner's bucket of `--max-rows-per-owner-per-minute`, in the database so that it
//!   holds across servers (`sql/quotas.sql`). A request the bucket cannot cover now is
//!   refused with 429 `quota_exceeded` and `Retry-After`; one larger than the whole bucket
//!   with 413 `too_large`. The rows are taken in the transaction that inserts them, so a
//!   refused or failed request takes nothing. Admin tokens are exempt.

use sked_db::task::TaskRow;
use sked_db::token::Principal;
use sked_types::{SubmitTask, TaskKind, WorkflowTask};
use sqlx::PgConnection;

use crate::error::Error;

/// The task rows one request may create, by default: a shard and a copy of a service are a
/// row each, next to the task that holds them.
pub const DEFAULT_MAX_ROWS_PER_REQUEST: u64 = 20_000;

/// The task rows one owner may create through the API per minute, by default.
pub const DEFAULT_MAX_ROWS_PER_OWNER_PER_MINUTE: u64 = 100_000;

/// The largest `--max-rows-per-owner-per-minute` (a billion rows a minute is far beyond what
/// one database inserts; the bucket's arithmetic stays exact in floating point below it).
pub const MAX_ROWS_PER_OWNER_PER_MINUTE: u64 = 1_000_000_000;

/// The server's quotas (`sked server --max-rows-per-request`,
/// `--max-rows-per-owner-per-minute`), the longest it holds a long poll (`--max-wait`), and
/// where it sends the reads that tolerate staleness (`--read-database-url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quotas {
    pub max_rows_per_request: u64,
    /// The task rows a user token's owner may create per minute, over every server: a token
    /// bucket of this many rows, refilled at this many per minute. 0: no limit.
    pub max_rows_per_owner_per_minute: u64,
    /// The longest a read that waits for a final state (`?wait=`) is held before the server
    /// answers (`--max-wait`).
    pub max_wait: std::time::Duration,
    /// The most queues `/metrics` names (`--metrics-max-queues`); the others are added up.
    pub metrics_max_queues: usize,
    /// The read replica (`--read-database-url`, `--read-max-staleness`); none by default.
    pub reads: crate::ReadReplica,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            max_rows_per_request: DEFAULT_MAX_ROWS_PER_REQUEST,
            max_rows_per_owner_per_minute: DEFAULT_MAX_ROWS_PER_OWNER_PER_MINUTE,
            max_wait: crate::awaits::DEFAULT_MAX_WAIT,
            metrics_max_queues: sked_db::metrics::DEFAULT_MAX_QUEUES,
            reads: crate::ReadReplica::default(),
        }
    }
}

/// The task rows a submission of `task` creates: the task, plus one per shard or per copy
/// of a service. A broadcast task counts as one: its shards are bounded by the live workers.
pub fn rows_of(task: &SubmitTask) -> u64 {
    rows_with(
        task.kind.unwrap_or_default(),
        task.shards.map(i64::from),
        task.replicas.map(i64::from),
    )
}

/// [`rows_of`] for a task template as `sked.tasks_submit` takes it (a schedule's).
pub fn rows_of_template(task: &serde_json::Value) -> u64 {
    let kind = task
        .get("kind")
        .and_then(|k| k.as_str()?.parse::<TaskKind>().ok());
    rows_with(
        kind.unwrap_or_default(),
        task.get("shards").and_then(|s| s.as_i64()),
        task.get("replicas").and_then(|r| r.as_i64()),
    )
}

/// [`rows_of`] for a workflow template as `sked.workflow_submit` takes it (a schedule's):
/// its tasks' rows, and those of the inline sub-workflows of its sub-workflow tasks.
pub fn rows_of_workflow_template(workflow: &serde_json::Value) -> u64 {
    workflow
        .get("tasks")
        .and_then(|t| t.as_array())
        .map(|tasks| {
            tasks
                .iter()
                .map(|task| match task.get("workflow") {
                    Some(sub) if sub.is_object() => 1 + rows_of_workflow_template(sub),
                    _ => rows_of_template(task),
                })
                .sum()
        })
        .unwrap_or(0)
}

/// The rows of a workflow's tasks: each task's ([`rows_of`]), and for a sub-workflow task
/// itself and the tasks of its inline sub-workflow (a stored definition's are inserted when
/// it starts).
pub fn rows_of_workflow(tasks: &[WorkflowTask]) -> u64 {
    tasks
        .iter()
        .map(|t| match &t.workflow {
            Some(sub) => 1 + rows_of_workflow(sub.tasks.as_deref().unwrap_or_default()),
            None => rows_of(&t.task),
        })
        .sum()
}

/// [`rows_of`] for a task that exists: the rows a resubmission of it creates.
pub fn rows_of_row(row: &TaskRow) -> u64 {
    let shards = if row.broadcast {
        None
    } else {
        row.shard_total.map(i64::from)
    };
    rows_with(row.kind, shards, row.replicas.map(i64::from))
}

fn rows_with(kind: TaskKind, shards: Option<i64>, replicas: Option<i64>) -> u64 {
    let extra = if kind == TaskKind::Service {
        replicas.unwrap_or(1)
    } else {
        shards.unwrap_or(0)
    };
    1 + u64::try_from(extra).unwrap_or(0)
}

impl Quotas {
    /// Refuses a request whose tasks would create more rows than allowed per request; `what`
    /// names the request (`"this batch"`, `"this workflow"`, …). Answers the rows.
    pub fn check<'a>(
        &self,
        tasks: impl IntoIterator<Item = &'a SubmitTask>,
        what: &str,
    ) -> Result<u64, Error> {
        self.check_rows(tasks.into_iter().map(rows_of).sum(), what)
    }

    /// [`Quotas::check`] of a request of `rows` rows.
    pub fn check_rows(&self, rows: u64, what: &str) -> Result<u64, Error> {
        if rows > self.max_rows_per_request {
            return Err(Error::TooLarge(format!(
                "{what} would create {rows} task rows (tasks, shards and copies of services); \
                 this server allows at most {} per request (--max-rows-per-request)",
                self.max_rows_per_request
            )));
        }
        Ok(rows)
    }

    /// Takes `rows` task rows from the bucket of the principal's owner, in the transaction
    /// open on `conn`, which must be the one that creates them (before it creates them, so
    /// that its lock on the bucket is held for as short a time as possible, and a refusal
    /// writes nothing). Admin tokens, a request that creates no row and a server without a
    /// per-owner limit take nothing. `what` names the request (`"this batch"`, …).
    ///
    /// Refuses with 413 `too_large` a request larger than the whole bucket (it can never be
    /// accepted as it is), and with 429 `quota_exceeded` one the bucket cannot cover now,
    /// saying when it will.
    pub(crate) async fn take(
        &self,
        conn: &mut PgConnection,
        principal: &Principal,
        rows: u64,
        what: &str,
    ) -> Result<(), Error> {
        let per_minute = self.max_rows_per_owner_per_minute;
        if principal.is_admin() || per_minute == 0 || rows == 0 {
            return Ok(());
        }
        let owner = &principal.owner;
        if rows > per_minute {
            return Err(Error::TooLarge(format!(
                "{what} would create {rows} task rows (tasks, shards and copies of services); \
                 owner {owner} may create at most {per_minute} per minute \
                 (--max-rows-per-owner-per-minute), so it can never be accepted: send at most \
                 {per_minute} rows per request"
            )));
        }
        let wait = sked_db::quota::take(conn, owner, rows, per_minute).await?;
        if wait <= 0.0 {
            return Ok(());
        }
        // Whole seconds, rounded up: a client that waits that long finds the rows there.
        let retry_after_secs = if wait.is_finite() {
            (wait.ceil() as u64).max(1)
        } else {
            60
        };
        Err(Error::QuotaExceeded {
            message: format!(
                "owner {owner} may create at most {per_minute} task rows per minute \
                 (--max-rows-per-owner-per-minute); {what} would create {rows}; try again in \
                 {retry_after_secs} s"
            ),
            retry_after_secs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates_and_rows_count_as_submissions_do() {
        assert_eq!(rows_of_template(&json!({"command": ["true"]})), 1);
        assert_eq!(
            rows_of_template(&json!({"command": ["true"], "shards": 5})),
            6
        );
        assert_eq!(
            rows_of_template(&json!({"kind": "service", "command": ["x"], "replicas": 3})),
            4
        );
        assert_eq!(
            rows_of_template(&json!({"kind": "service", "command": ["x"]})),
            2
        );
        assert_eq!(
            rows_of_workflow_template(&json!({"tasks": [
                {"name": "a", "command": ["true"], "shards": 2},
                {"name": "b", "command": ["true"]},
            ]})),
            4
        );
    }
}
