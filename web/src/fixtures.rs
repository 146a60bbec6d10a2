//! Values the unit tests build their cases from.

use sked_types::events::TaskSummary;
use sked_types::{TaskKind, TaskState};
use uuid::Uuid;

/// Alice's task `true` in the queue `default`, numbered `id`, created at one fixed instant and
/// not started; a test sets the fields it looks at.
pub fn task_summary(id: u128, state: TaskState) -> TaskSummary {
    let at = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("a valid instant");
    TaskSummary {
        id: Uuid::from_u128(id),
        owner: "alice".into(),
        queue: "default".into(),
        priority: 0,
        kind: TaskKind::Command,
        argv: vec!["true".into()],
        argv_cut: false,
        argv_bytes: 4,
        state,
        attempt: 0,
        max_attempts: 3,
        next_run_at: at,
        created_at: at,
        started_at: None,
        finished_at: None,
        exit_code: None,
        worker_id: None,
        cancel_requested: false,
        workflow_id: None,
        name: None,
        shard_of: None,
    }
}
