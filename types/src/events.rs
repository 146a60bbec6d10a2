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
//!    other than pings are ignored). A client that reads too slowly is sent
//!    [`ServerEvent::Resync`] and closed with [`CLOSE_TOO_SLOW`].

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
/// Close code sent to a client that read too slowly: its socket accepted nothing for the
/// server's send timeout, or it answered no ping. It was sent [`ServerEvent::Resync`] just
/// before when its socket took it.
pub const CLOSE_TOO_SLOW: u16 = 4408;

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

/// The most bytes of a command line that a [`TaskSummary`] carries (a task list shows one
/// line of it): a longer one is cut, and the task's own page has it whole.
pub const ARGV_PREVIEW_BYTES: usize = 512;

/// `argv` cut to at most [`ARGV_PREVIEW_BYTES`] bytes together: whole arguments while they
/// fit, then the start of the next one (at a character boundary); with whether it was cut and
/// the bytes of the whole command line (the arguments and a space between each).
pub fn argv_preview(argv: Vec<String>) -> (Vec<String>, bool, u64) {
    let bytes: usize = argv.iter().map(String::len).sum();
    let line = (bytes + argv.len().saturating_sub(1)) as u64;
    if bytes <= ARGV_PREVIEW_BYTES {
        return (argv, false, line);
    }
    let mut left = ARGV_PREVIEW_BYTES;
    let mut preview = Vec::new();
    for arg in argv {
        if arg.len() <= left {
            left -= arg.len();
            preview.push(arg);
            continue;
        }
        let mut end = left;
        while !arg.is_char_boundary(end) {
            end -= 1;
        }
        if end > 0 {
            preview.push(arg[..end].to_owned());
        }
        break;
    }
    (preview, true, line)
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
    /// The command and its arguments, or the artifact's URL followed by the arguments: all of
    /// them while they take at most [`ARGV_PREVIEW_BYTES`] (512) bytes together, else their
    /// first 512 bytes (`argv_cut`); the task (`GET /api/v1/tasks/{id}`) has them whole.
    pub argv: Vec<String>,
    /// Whether `argv` was cut to its first [`ARGV_PREVIEW_BYTES`] bytes.
    pub argv_cut: bool,
    /// The bytes of the whole command line: its arguments and a space between each.
    pub argv_bytes: u64,
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
        let (argv, argv_cut, argv_bytes) = argv_preview(t.argv());
        TaskSummary {
            id: t.id,
            owner: t.owner.clone(),
            queue: t.queue.clone(),
            priority: t.priority,
            kind: t.kind,
            argv,
            argv_cut,
            argv_bytes,
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
    fn a_long_command_line_is_cut_to_its_preview() {
        let short = vec!["echo".to_owned(), "hi".to_owned()];
        assert_eq!(argv_preview(short.clone()), (short, false, 7));
        let long = vec!["echo".to_owned(), "é".repeat(1000), "tail".to_owned()];
        let (preview, cut, bytes) = argv_preview(long);
        assert!(cut);
        assert_eq!(bytes, 4 + 2000 + 4 + 2, "the whole line's bytes");
        assert_eq!(preview.len(), 2, "the arguments past the cut are left out");
        assert_eq!(preview[0], "echo");
        let taken: usize = preview.iter().map(String::len).sum();
        assert_eq!(
            taken, ARGV_PREVIEW_BYTES,
            "cut at a character boundary within the bytes"
        );
    }

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
