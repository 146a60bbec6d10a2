//! The service calls of the REST API client: `/api/v1/services`.

use sked_types::service::{Service, ServiceList, ServiceUpdated};
use uuid::Uuid;

use super::{Client, ClientError};

impl Client {
    /// `GET /api/v1/services`: the services that run.
    pub async fn services(&self, owner: Option<&str>) -> Result<ServiceList, ClientError> {
        let url = self.url("/services");
        let query: Vec<(&str, &str)> = owner.map(|o| ("owner", o)).into_iter().collect();
        self.send(self.http.get(&url).query(&query), url).await
    }

    /// `GET /api/v1/services/{id}`: the service with its copies.
    pub async fn service(&self, id: Uuid) -> Result<Service, ClientError> {
        self.get(&format!("/services/{id}")).await
    }

    /// `GET /api/v1/services/{id}`, as the raw JSON the server sent.
    pub async fn service_json(&self, id: Uuid) -> Result<serde_json::Value, ClientError> {
        self.get(&format!("/services/{id}")).await
    }

    /// `PATCH /api/v1/services/{id}` with the keys to change.
    pub async fn update_service(
        &self,
        id: Uuid,
        changes: &serde_json::Value,
    ) -> Result<ServiceUpdated, ClientError> {
        let url = self.url(&format!("/services/{id}"));
        self.send(self.http.patch(&url).json(changes), url).await
    }
}
