//! The queue calls of the REST API client: `/api/v1/queues` and `/api/v1/retention`.

use sked_types::{QueueControls, QueueCounts, QueueLimits, Retention, RetentionChange};

use super::{Client, ClientError};

/// A queue name as one path segment (names are `A-Za-z0-9_.:-`; anything else is escaped so
/// the server can refuse it by name).
pub(super) fn segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b':' | b'-' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Client {
    /// `GET /api/v1/queues`: counts and controls of each queue.
    pub async fn queues(&self) -> Result<Vec<QueueCounts>, ClientError> {
        self.get("/queues").await
    }

    /// `POST /api/v1/queues/{name}/pause`.
    pub async fn pause_queue(&self, name: &str) -> Result<QueueControls, ClientError> {
        self.post(
            &format!("/queues/{}/pause", segment(name)),
            &serde_json::json!({}),
        )
        .await
    }

    /// `POST /api/v1/queues/{name}/resume`.
    pub async fn resume_queue(&self, name: &str) -> Result<QueueControls, ClientError> {
        self.post(
            &format!("/queues/{}/resume", segment(name)),
            &serde_json::json!({}),
        )
        .await
    }

    /// `PATCH /api/v1/queues/{name}`: the controls after the change.
    pub async fn limit_queue(
        &self,
        name: &str,
        limits: &QueueLimits,
    ) -> Result<QueueControls, ClientError> {
        let url = self.url(&format!("/queues/{}", segment(name)));
        self.send(self.http.patch(&url).json(limits), url).await
    }

    /// `GET /api/v1/retention`: the cluster's retention.
    pub async fn retention(&self) -> Result<Retention, ClientError> {
        self.get("/retention").await
    }

    /// `PATCH /api/v1/retention`: the cluster's retention after the change.
    pub async fn set_retention(&self, change: &RetentionChange) -> Result<Retention, ClientError> {
        let url = self.url("/retention");
        self.send(self.http.patch(&url).json(change), url).await
    }
}
