//! The history of finishes (`GET /api/v1/history`): per step of the last day (5 minutes) or
//! week (an hour), the tasks finished in each final state and percentiles of their attempts'
//! durations and lateness, read from the rollups that sked keeps as tasks finish
//! (`sql/finishes.sql`, `docs/api.md`, "History").

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::FinalCounts;

/// How far back the history goes, and its step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum HistoryRange {
    /// The last 24 hours, in steps of 5 minutes (288 points).
    #[default]
    #[serde(rename = "24h")]
    Day,
    /// The last 7 days, in steps of an hour (168 points).
    #[serde(rename = "7d")]
    Week,
}

impl HistoryRange {
    /// The name of the range in URLs and in SQL (`24h`, `7d`).
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryRange::Day => "24h",
            HistoryRange::Week => "7d",
        }
    }

    /// The length of a step, in seconds.
    pub fn step_secs(self) -> i64 {
        match self {
            HistoryRange::Day => 300,
            HistoryRange::Week => 3600,
        }
    }

    /// The number of steps.
    pub fn steps(self) -> usize {
        match self {
            HistoryRange::Day => 288,
            HistoryRange::Week => 168,
        }
    }
}

/// `GET /api/v1/history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct History {
    /// When the numbers were taken, on the database clock.
    pub at: DateTime<Utc>,
    pub range: HistoryRange,
    /// Seconds per step.
    pub step_secs: i64,
    /// The owner whose tasks are counted; null when an admin counts every owner's.
    pub owner: Option<String>,
    /// The queue counted; null for every queue.
    pub queue: Option<String>,
    /// Queues with finishes in the range (of the owner counted), by name: the queue filter's
    /// choices.
    pub queues: Vec<String>,
    /// One point per step, oldest first; the last one holds `at` (and is partial).
    pub points: Vec<HistoryPoint>,
}

/// The finishes of one step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HistoryPoint {
    /// Start of the step.
    pub start: DateTime<Utc>,
    /// Tasks that finished in the step, by final state.
    pub finished: FinalCounts,
    /// Seconds from the start of the last attempt to the finish, of the tasks that finished
    /// in the step having started.
    pub duration: Percentiles,
    /// Seconds from the due time (`next_run_at`) to the start of the last attempt, of the same
    /// tasks.
    pub lateness: Percentiles,
}

/// Percentiles in seconds, estimated from a histogram with two buckets per doubling (off by
/// less than a factor of √2); null when nothing was counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}
