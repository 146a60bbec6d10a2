//! The bulk calls of the REST API client: `POST /api/v1/tasks/retry` and
//! `POST /api/v1/tasks/cancel`.

use sked_types::bulk::{BulkAction, BulkOutcome};

use super::{Client, ClientError, ListQuery};

impl Client {
    /// `POST /api/v1/tasks/{action}?<selection>` (`retry` or `cancel`): the selection is a
    /// listing's filters (its `after` and `limit` must be `None`).
    pub async fn bulk(
        &self,
        action: &str,
        selection: &ListQuery,
        body: &BulkAction,
    ) -> Result<BulkOutcome, ClientError> {
        let url = self.url(&format!("/tasks/{action}"));
        self.send(self.http.post(&url).query(selection).json(body), url)
            .await
    }
}
