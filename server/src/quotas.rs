//! Limits on what one request may create, so that one caller cannot fill the database: a
//! submission (a task, a batch, a workflow, a schedule's task or workflow per tick) is refused
//! with 413 `too_large`, naming the limit, before anything is written.

use sked_types::SubmitTask;

use crate::error::Error;

/// The task rows one request may create, by default: a shard and a copy of a service are a
/// row each, next to the task that holds them.
pub const DEFAULT_MAX_ROWS_PER_REQUEST: u64 = 20_000;

/// The server's quotas (`sked server --max-rows-per-request`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    pub max_rows_per_request: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            max_rows_per_request: DEFAULT_MAX_ROWS_PER_REQUEST,
        }
    }
}

/// The task rows a submission of `task` creates: the task, plus one per shard or per copy
/// of a service. A broadcast task counts as one: its shards are bounded by the live workers.
pub fn rows_of(task: &SubmitTask) -> u64 {
    let extra = if task.kind.as_deref() == Some("service") {
        task.replicas.unwrap_or(1)
    } else {
        task.shards.unwrap_or(0)
    };
    1 + u64::try_from(extra).unwrap_or(0)
}

impl Quotas {
    /// Refuses a request whose tasks would create more rows than allowed; `what` names the
    /// request (`"this batch"`, `"this workflow"`, …).
    pub fn check<'a>(
        &self,
        tasks: impl IntoIterator<Item = &'a SubmitTask>,
        what: &str,
    ) -> Result<(), Error> {
        let rows: u64 = tasks.into_iter().map(rows_of).sum();
        if rows > self.max_rows_per_request {
            return Err(Error::TooLarge(format!(
                "{what} would create {rows} task rows (tasks, shards and copies of services); \
                 this server allows at most {} per request (--max-rows-per-request)",
                self.max_rows_per_request
            )));
        }
        Ok(())
    }
}
