//! Values the unit tests build their cases from.

use sked_types::events::TaskSummary;
use sked_types::{Task, TaskKind, TaskState};
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

/// Alice's task numbered `id` of `kind` in `state`, as `GET /api/v1/tasks/{id}` answers it
/// (read from JSON, so that it holds what the API leaves out as the API would); a test sets
/// the fields it looks at.
pub fn task(id: u128, kind: TaskKind, state: TaskState) -> Task {
    serde_json::from_value(serde_json::json!({
        "id": Uuid::from_u128(id),
        "owner": "alice",
        "queue": "default",
        "priority": 0,
        "kind": kind,
        "command": (kind == TaskKind::Command).then_some(["true"]),
        "args": [],
        "env": {},
        "labels": [],
        "max_attempts": 3,
        "backoff_base_secs": 1.0,
        "backoff_max_secs": 60.0,
        "state": state,
        "attempt": 0,
        "next_run_at": "2027-01-15T08:00:00Z",
        "created_at": "2027-01-15T08:00:00Z",
    }))
    .expect("a task as the API shows it")
}
