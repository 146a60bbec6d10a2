//! The spawn call of the REST API client: `POST /api/v1/tasks/{id}/spawn`, made by a running
//! task with its task token (`sked spawn`).

use serde::Deserialize;
use uuid::Uuid;

use super::{Client, ClientError};

/// The answer to a spawn: the new task of kind `workflow` in the spawning task's workflow.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Spawned {
    pub id: Uuid,
}

impl Client {
    /// `POST /api/v1/tasks/{task}/spawn`: `body` is a workflow's tasks or a stored definition's
    /// name, as the API takes them; the client's token must be `task`'s task token.
    pub async fn spawn(
        &self,
        task: Uuid,
        body: &serde_json::Value,
    ) -> Result<Spawned, ClientError> {
        self.post(&format!("/tasks/{task}/spawn"), body).await
    }
}
