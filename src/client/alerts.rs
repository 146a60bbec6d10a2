//! The alert calls of the REST API client: `/api/v1/alert-targets` and a queue's notify.

use sked_types::{AlertTarget, QueueNotify, SetAlertTarget};

use super::queues::segment;
use super::{Client, ClientError};

impl Client {
    /// `GET /api/v1/alert-targets`.
    pub async fn alert_targets(&self) -> Result<Vec<AlertTarget>, ClientError> {
        self.get("/alert-targets").await
    }

    /// `PUT /api/v1/alert-targets/{name}`: the target as it is now.
    pub async fn set_alert_target(
        &self,
        name: &str,
        target: &SetAlertTarget,
    ) -> Result<AlertTarget, ClientError> {
        let url = self.url(&format!("/alert-targets/{}", segment(name)));
        self.send(self.http.put(&url).json(target), url).await
    }

    /// `DELETE /api/v1/alert-targets/{name}`: the target as it was.
    pub async fn delete_alert_target(&self, name: &str) -> Result<AlertTarget, ClientError> {
        let url = self.url(&format!("/alert-targets/{}", segment(name)));
        self.send(self.http.delete(&url), url).await
    }

    /// `PUT /api/v1/queues/{name}/notify`.
    pub async fn set_queue_notify(
        &self,
        name: &str,
        notify: &QueueNotify,
    ) -> Result<QueueNotify, ClientError> {
        let url = self.url(&format!("/queues/{}/notify", segment(name)));
        self.send(self.http.put(&url).json(notify), url).await
    }
}
