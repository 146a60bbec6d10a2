//! The live event stream of `GET /api/v1/events` (a websocket), which feeds the dashboard.
//!
//! The server reads what the database recorded (statement triggers, see `docs/events.md`)
//! in batches (one per [`BATCH_WINDOW_MS`]) and sends each client only what its token may
//! see. Events are hints that something changed: a client that misses some (it
//! reconnected, or it was too slow and got [`ServerEvent::Resync`]) refetches what it shows.
//!
//! Protocol (JSON text frames):
//! 1. The client authenticates, either with an `Authorization: Bearer` header on the upgrade
//!    request or, from a browser, by sending [`ClientMessage::Auth`] as its first frame within
//!    [`AUTH_TIMEOUT_SECS`] seconds.
//! 2. The server answers [`ServerEvent::Hello`], or closes with code 4401 and a reason.
//! 3. From then on the server sends batches of events; the client sends nothing else (frames
//!    other than pings are ignored).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{Task, TaskKind, TaskState};

/// Events are coalesced over this window before being sent.
pub const BATCH_WINDOW_MS: u64 = 150;
/// Seconds a websocket client has to send [`ClientMessage::Auth`].
pub const AUTH_TIMEOUT_SECS: u64 = 5;
/// Close code sent when authentication fails or times out.
pub const CLOSE_UNAUTHORIZED: u16 = 4401;

/// A frame from the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMessage {
    /// The first frame when the upgrade request carried no `Authorization` header.
    Auth { token: String },
}

/// A frame from the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerEvent {
    /// Authentication succeeded: who the token belongs to.
    Hello { owner: String, role: String },
    /// Tasks that were inserted or changed state, as they are after the change.
    Tasks { tasks: Vec<TaskSummary> },
    /// Tasks that have new log chunks (fetch them with `GET /api/v1/tasks/{id}/logs?after=`).
    Logs { tasks: Vec<Uuid> },
    /// Workflows whose state changed.
    Workflows { ids: Vec<Uuid> },
    /// Schedules that were created, changed, fired or deleted.
    Schedules { ids: Vec<Uuid> },
    /// A worker registered, stopped or deregistered.
    Workers,
    /// Some events were lost (too many at once, a slow client, or changes the server could
    /// not read in time): refetch everything shown.
    Resync { reason: String },
}

/// What a task list shows of a task; sent in [`ServerEvent::Tasks`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskSummary {
    pub id: Uuid,
    pub owner: String,
    pub queue: String,
    pub priority: i32,
    pub kind: TaskKind,
    /// The command and its arguments, or the artifact's URL followed by the arguments.
    pub argv: Vec<String>,
    pub state: TaskState,
    pub attempt: i32,
    pub max_attempts: i32,
    pub next_run_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub exit_code: Option<i32>,
    pub worker_id: Option<Uuid>,
    pub cancel_requested: bool,
    /// Left out when the task belongs to no workflow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub workflow_id: Option<Uuid>,
    pub name: Option<String>,
    pub shard_of: Option<Uuid>,
}

impl From<&Task> for TaskSummary {
    fn from(t: &Task) -> Self {
        let mut argv: Vec<String> = match (&t.command, &t.artifact_url) {
            (Some(command), _) => command.clone(),
            (None, Some(url)) => vec![url.clone()],
            (None, None) => vec![],
        };
        argv.extend(t.args.iter().cloned());
        TaskSummary {
            id: t.id,
            owner: t.owner.clone(),
            queue: t.queue.clone(),
            priority: t.priority,
            kind: t.kind,
            argv,
            state: t.state,
            attempt: t.attempt,
            max_attempts: t.max_attempts,
            next_run_at: t.next_run_at,
            created_at: t.created_at,
            started_at: t.started_at,
            finished_at: t.finished_at,
            exit_code: t.exit_code,
            worker_id: t.worker_id,
            cancel_requested: t.cancel_requested_at.is_some(),
            workflow_id: t.workflow_id,
            name: t.name.clone(),
            shard_of: t.shard_of,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_by_type() {
        let e = ServerEvent::Resync {
            reason: "lagged".into(),
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"type": "resync", "reason": "lagged"})
        );
        assert_eq!(
            serde_json::to_value(ServerEvent::Workers).unwrap(),
            serde_json::json!({"type": "workers"})
        );
        let m: ClientMessage = serde_json::from_str(r#"{"type":"auth","token":"sked_x"}"#).unwrap();
        assert_eq!(
            m,
            ClientMessage::Auth {
                token: "sked_x".into()
            }
        );
    }
}
