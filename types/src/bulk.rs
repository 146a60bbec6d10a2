//! Bulk retry and bulk cancel of what a task listing's filter selects
//! (`POST /api/v1/tasks/retry`, `POST /api/v1/tasks/cancel`): the request's body and the
//! answer.

use serde::{Deserialize, Deserializer, Serialize};

use crate::TaskState;

/// The most tasks one bulk request may act on (and a preview counts).
pub const MAX_BULK: u64 = 100_000;

/// What a bulk request does with the tasks its query string selects: count them
/// (`dry_run`), or act on at most `max` of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BulkAction {
    /// True: only count the tasks the action would change, changing nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Act on at most this many tasks: the count the preview showed and the user confirmed.
    /// Required unless `dry_run`; 1 to 100,000.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100000))]
    pub max: Option<u64>,
}

/// A field that may be absent but never `null`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// How many of the selected tasks are in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StateCount {
    pub state: TaskState,
    pub count: u64,
}

/// The answer of a bulk request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BulkOutcome {
    /// `retry` or `cancel`.
    pub action: String,
    /// True: nothing was changed, `matched` is what the action would change.
    pub dry_run: bool,
    /// The selected tasks the action applies to (at most `max`, and at most 100,000).
    pub matched: u64,
    /// `matched` by state.
    pub by_state: Vec<StateCount>,
    /// More tasks than `matched` are selected (beyond `max`, or beyond 100,000).
    pub more: bool,
    /// Tasks the action changed (0 in a dry run). For cancel, running tasks asked to stop
    /// count here too.
    pub changed: u64,
    /// Of those, running tasks that were asked to stop (cancel only): their workers stop
    /// them and record `cancelled`.
    pub cancel_requested: u64,
    /// Of the `max` tasks confirmed, those not changed: their state changed since the
    /// preview (they are no longer selected) or between the selection and their batch
    /// (0 in a dry run).
    pub skipped: u64,
}

/// `1234567` as `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The selection a bulk request acts on, in words: `1,234 failed tasks in queue mail`, or
/// `9 tasks (7 failed, 2 succeeded)`; `queue`, `owner` and `text` are the request's filters.
pub fn describe(
    outcome: &BulkOutcome,
    queue: Option<&str>,
    owner: Option<&str>,
    text: Option<&str>,
) -> String {
    let count = thousands(outcome.matched);
    let tasks = if outcome.matched == 1 {
        "task"
    } else {
        "tasks"
    };
    let mut words = match outcome.by_state.as_slice() {
        [one] => format!("{count} {} {tasks}", one.state.as_str()),
        [] => format!("{count} {tasks}"),
        several => format!(
            "{count} {tasks} ({})",
            several
                .iter()
                .map(|s| format!("{} {}", thousands(s.count), s.state.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if let Some(queue) = queue.filter(|q| !q.is_empty()) {
        words.push_str(&format!(" in queue {queue}"));
    }
    if let Some(owner) = owner.filter(|o| !o.is_empty()) {
        words.push_str(&format!(" of {owner}"));
    }
    if let Some(text) = text.filter(|t| !t.is_empty()) {
        words.push_str(&format!(" matching \"{text}\""));
    }
    words
}

/// What a run did, in words: `retried 1,230 tasks; 4 skipped (their state changed since the
/// count)`.
pub fn result_text(outcome: &BulkOutcome) -> String {
    let verb = if outcome.action == "retry" {
        "retried"
    } else {
        "cancelled"
    };
    let tasks = if outcome.changed == 1 {
        "task"
    } else {
        "tasks"
    };
    let mut words = format!("{verb} {} {tasks}", thousands(outcome.changed));
    if outcome.cancel_requested > 0 {
        words.push_str(&format!(
            " ({} running: their workers stop them)",
            thousands(outcome.cancel_requested)
        ));
    }
    if outcome.skipped > 0 {
        words.push_str(&format!(
            "; {} skipped (their state changed since the count)",
            thousands(outcome.skipped)
        ));
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_with_thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234), "1,234");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn a_selection_reads_as_its_states_and_filters() {
        let mut outcome = BulkOutcome {
            action: "retry".into(),
            dry_run: true,
            matched: 1_234,
            by_state: vec![StateCount {
                state: TaskState::Failed,
                count: 1_234,
            }],
            more: false,
            changed: 0,
            cancel_requested: 0,
            skipped: 0,
        };
        assert_eq!(
            describe(&outcome, Some("mail"), None, None),
            "1,234 failed tasks in queue mail"
        );
        outcome.matched = 9;
        outcome.by_state = vec![
            StateCount {
                state: TaskState::Succeeded,
                count: 2,
            },
            StateCount {
                state: TaskState::Failed,
                count: 7,
            },
        ];
        assert_eq!(
            describe(&outcome, None, Some("alice"), Some("pg_dump")),
            "9 tasks (2 succeeded, 7 failed) of alice matching \"pg_dump\""
        );
        outcome.changed = 5;
        outcome.skipped = 4;
        assert_eq!(
            result_text(&outcome),
            "retried 5 tasks; 4 skipped (their state changed since the count)"
        );
    }
}
