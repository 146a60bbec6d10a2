//! The bulk calls of the REST API client: `POST /api/v1/tasks/retry` and
//! `POST /api/v1/tasks/cancel`.

use std::time::Duration;

use sked_types::bulk::{BulkAction, BulkOutcome};

use super::{Client, ClientError, ListQuery};

/// How long a bulk request may take: the server changes up to 100,000 tasks in one request
/// (about 1.3 ms a retry, 0.3 ms a cancel), longer than the client's usual 60 s.
const BULK_TIMEOUT: Duration = Duration::from_secs(900);

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
        let request = self
            .http
            .post(&url)
            .query(selection)
            .json(body)
            .timeout(BULK_TIMEOUT);
        self.send(request, url).await
    }
}
