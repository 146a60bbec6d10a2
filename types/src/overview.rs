//! The dashboard's overview (`GET /api/v1/overview`): per queue, the unfinished tasks by state
//! and the tasks finished in the last hour; a per-minute series of finishes; the workers.
//!
//! Every count is exact, taken in one snapshot at [`Overview::at`] on the database clock.
//! "The last hour" is the current minute and the 59 before it, from [`Overview::since`], so
//! the 60 points of [`Overview::series`] add up to the finished counts of the queues.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::TaskState;

/// `GET /api/v1/overview`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Overview {
    /// When the numbers were taken, on the database clock.
    pub at: DateTime<Utc>,
    /// Start of the last hour: the start of the minute 59 minutes before `at`'s minute.
    pub since: DateTime<Utc>,
    /// The owner whose tasks are counted; null when an admin counts every owner's.
    pub owner: Option<String>,
    /// Queues with unfinished tasks or tasks finished in the last hour, by name.
    pub queues: Vec<QueueOverview>,
    /// Finishes per minute over the last hour, oldest first: 60 points, the last one the
    /// current (partial) minute.
    pub series: Vec<MinuteFinishes>,
    pub workers: WorkerCounts,
}

/// One queue in the overview.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueueOverview {
    pub queue: String,
    /// Waiting for DAG parents or shards.
    pub blocked: i64,
    /// `waiting` with `next_run_at` at or before `at`: claimable now.
    pub waiting_due: i64,
    /// `waiting` with `next_run_at` after `at`: delayed tasks and schedule occurrences.
    pub waiting_delayed: i64,
    pub running: i64,
    /// Failed attempts waiting for their backoff (or due again).
    pub retry: i64,
    /// Seconds the oldest due task (`waiting` or `retry` whose `next_run_at` has passed) has
    /// been due; null when no task of the queue is due.
    pub oldest_due_secs: Option<f64>,
    /// Tasks that finished in the last hour, by final state.
    pub finished: FinalCounts,
}

/// Counts by final state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FinalCounts {
    pub succeeded: i64,
    pub failed: i64,
    pub cancelled: i64,
    pub upstream_failed: i64,
    pub skipped: i64,
}

impl FinalCounts {
    /// Adds `n` to the count of `state`; false (and nothing added) when `state` is not final.
    pub fn add(&mut self, state: TaskState, n: i64) -> bool {
        let slot = match state {
            TaskState::Succeeded => &mut self.succeeded,
            TaskState::Failed => &mut self.failed,
            TaskState::Cancelled => &mut self.cancelled,
            TaskState::UpstreamFailed => &mut self.upstream_failed,
            TaskState::Skipped => &mut self.skipped,
            TaskState::Blocked | TaskState::Waiting | TaskState::Running | TaskState::Retry => {
                return false;
            }
        };
        *slot += n;
        true
    }

    pub fn total(&self) -> i64 {
        self.succeeded + self.failed + self.cancelled + self.upstream_failed + self.skipped
    }
}

/// Tasks that finished in one minute.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MinuteFinishes {
    /// Start of the minute.
    pub minute: DateTime<Utc>,
    pub finished: FinalCounts,
}

/// Workers in the registry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerCounts {
    /// Heartbeat younger than its lease.
    pub alive: i64,
    /// Registered, alive or not (a worker that died is removed a day after its last
    /// heartbeat).
    pub total: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_counts_take_final_states_only() {
        let mut c = FinalCounts::default();
        assert!(c.add(TaskState::Failed, 2));
        assert!(c.add(TaskState::Skipped, 1));
        assert!(
            !c.add(TaskState::Running, 5),
            "running is not a final state"
        );
        assert_eq!(c.failed, 2);
        assert_eq!(c.total(), 3);
    }
}
