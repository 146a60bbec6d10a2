//! A small client of the sked REST API (`/api/v1`), used by the `sked` CLI.
//!
//! Every call returns the typed answer of the API or a [`ClientError`]; an error answer of the
//! API (a JSON [`ApiError`]) becomes [`ClientError::Api`], shown as `<message> (<code>)`.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sked_types::{
    ApiError, Health, LogChunk, StateChange, SubmitTask, SubmitWorkflow, Submitted, TaskDetail,
    TaskPage, TaskState, WorkflowChange, WorkflowDetail, WorkflowPage, WorkflowSubmitted,
};
use uuid::Uuid;

mod alerts;
mod bulk;
mod queues;
mod schedules;
mod services;
mod spawn;
pub use schedules::ScheduleQuery;
pub use spawn::Spawned;

/// The longest wait one request asks for: below the client's timeout of a request (60 s),
/// and the server's bound (300 s). Longer waits are several requests.
pub const MAX_WAIT: Duration = Duration::from_secs(50);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API answered with an error.
    #[error("{message} ({code})")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("cannot reach the sked API at {url}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer is not what the API promises (wrong URL, a proxy, a version mismatch).
    #[error("unexpected answer from {url} (HTTP {status}): {body}")]
    Unexpected {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{0}")]
    Config(String),
}

/// Filters of `GET /api/v1/tasks`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ListQuery {
    /// Tasks in any of these states (sent comma-separated).
    #[serde(
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "comma_separated"
    )]
    pub state: Vec<TaskState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Text in the command line or the name, ignoring case.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    /// Only the tasks this worker runs now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<Uuid>,
    /// Only the shards of this sharded task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_of: Option<Uuid>,
    /// Only the tasks of this workflow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<Uuid>,
    /// Only the occurrences of this schedule that its history keeps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_after: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_before: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_after: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_before: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

fn comma_separated<S: serde::Serializer>(states: &[TaskState], s: S) -> Result<S::Ok, S::Error> {
    let names: Vec<&str> = states.iter().map(|state| state.as_str()).collect();
    s.serialize_str(&names.join(","))
}

/// A client of one sked server, authenticated by a bearer token.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    /// A client of the server at `base_url` (such as `http://127.0.0.1:8080`).
    pub fn new(base_url: &str, token: Option<String>) -> Result<Client, ClientError> {
        let base = base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::Config(format!(
                "the API URL must start with http:// or https://, got {base_url:?}"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("sked-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Config(format!("building the HTTP client: {e}")))?;
        Ok(Client {
            http,
            base,
            token: token.filter(|t| !t.is_empty()),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/api/v1{path}", self.base)
    }

    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        url: String,
    ) -> Result<T, ClientError> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let unreachable = |source| ClientError::Unreachable {
            url: url.clone(),
            source,
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let body = response.bytes().await.map_err(unreachable)?;
        if status.is_success() {
            return serde_json::from_slice(&body).map_err(|e| ClientError::Unexpected {
                url: url.clone(),
                status: status.as_u16(),
                body: format!("{e}: {}", snippet(&body)),
            });
        }
        match serde_json::from_slice::<ApiError>(&body) {
            Ok(err) => Err(ClientError::Api {
                status: status.as_u16(),
                code: err.code,
                message: err.message,
            }),
            Err(_) => Err(ClientError::Unexpected {
                url,
                status: status.as_u16(),
                body: snippet(&body),
            }),
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = self.url(path);
        self.send(self.http.get(&url), url).await
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, ClientError> {
        let url = self.url(path);
        self.send(self.http.post(&url).json(body), url).await
    }

    /// `GET /api/v1/health`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.get("/health").await
    }

    /// `POST /api/v1/tasks`: the ids of the submitted tasks.
    pub async fn submit(&self, task: &SubmitTask) -> Result<Submitted, ClientError> {
        self.post("/tasks", task).await
    }

    /// `GET /api/v1/tasks`, as the raw JSON the server sent.
    pub async fn list_json(&self, query: &ListQuery) -> Result<serde_json::Value, ClientError> {
        let url = self.url("/tasks");
        self.send(self.http.get(&url).query(query), url).await
    }

    /// `GET /api/v1/tasks`.
    pub async fn list(&self, query: &ListQuery) -> Result<TaskPage, ClientError> {
        let url = self.url("/tasks");
        self.send(self.http.get(&url).query(query), url).await
    }

    /// `GET /api/v1/tasks/count` of a listing's filters (its `after` and `limit` left out):
    /// the count and whether it is exact.
    pub async fn count(&self, query: &ListQuery) -> Result<sked_types::TaskCount, ClientError> {
        let query = ListQuery {
            after: None,
            limit: None,
            ..query.clone()
        };
        let url = self.url("/tasks/count");
        self.send(self.http.get(&url).query(&query), url).await
    }

    /// `GET /api/v1/tasks/{id}`, as the raw JSON the server sent.
    pub async fn task_json(&self, id: Uuid) -> Result<serde_json::Value, ClientError> {
        self.get(&format!("/tasks/{id}")).await
    }

    /// `GET /api/v1/tasks/{id}`.
    pub async fn task(&self, id: Uuid) -> Result<TaskDetail, ClientError> {
        self.get(&format!("/tasks/{id}")).await
    }

    /// `GET /api/v1/tasks/{id}?wait=`: the task once it is in a final state, or as it is
    /// when `wait` (at most [`MAX_WAIT`]) is over.
    pub async fn task_waiting(&self, id: Uuid, wait: Duration) -> Result<TaskDetail, ClientError> {
        self.get(&format!(
            "/tasks/{id}?wait={}ms",
            wait.min(MAX_WAIT).as_millis()
        ))
        .await
    }

    /// `GET /api/v1/tasks/{id}/logs?after=&limit=`: chunks after chunk id `after`, oldest first.
    pub async fn logs(
        &self,
        id: Uuid,
        after: i64,
        limit: u32,
    ) -> Result<Vec<LogChunk>, ClientError> {
        let url = self.url(&format!("/tasks/{id}/logs"));
        let request = self
            .http
            .get(&url)
            .query(&[("after", after.to_string()), ("limit", limit.to_string())]);
        self.send(request, url).await
    }

    /// `POST /api/v1/tasks/{id}/cancel`.
    pub async fn cancel(&self, id: Uuid) -> Result<StateChange, ClientError> {
        self.post(&format!("/tasks/{id}/cancel"), &serde_json::json!({}))
            .await
    }

    /// `POST /api/v1/tasks/{id}/retry`.
    pub async fn retry(&self, id: Uuid) -> Result<StateChange, ClientError> {
        self.post(&format!("/tasks/{id}/retry"), &serde_json::json!({}))
            .await
    }

    /// `POST /api/v1/tasks/{id}/resubmit`: the id of the new task.
    pub async fn resubmit(&self, id: Uuid) -> Result<Submitted, ClientError> {
        self.post(&format!("/tasks/{id}/resubmit"), &serde_json::json!({}))
            .await
    }

    /// `POST /api/v1/workflows`: the id of the submitted workflow.
    pub async fn submit_workflow(
        &self,
        workflow: &SubmitWorkflow,
    ) -> Result<WorkflowSubmitted, ClientError> {
        self.post("/workflows", workflow).await
    }

    /// `POST /api/v1/workflow-definitions`: the version kept (a new one, or the latest when
    /// the spec is the latest's).
    pub async fn define_workflow(
        &self,
        definition: &sked_types::DefineWorkflow,
    ) -> Result<sked_types::WorkflowDefinition, ClientError> {
        self.post("/workflow-definitions", definition).await
    }

    /// `GET /api/v1/workflow-definitions`: the latest version of each definition.
    pub async fn workflow_definitions(
        &self,
    ) -> Result<sked_types::WorkflowDefinitionPage, ClientError> {
        self.get("/workflow-definitions").await
    }

    /// `GET /api/v1/workflow-definitions/{name}`: its versions, newest first.
    pub async fn workflow_definition(
        &self,
        name: &str,
    ) -> Result<sked_types::WorkflowDefinitionPage, ClientError> {
        self.get(&format!("/workflow-definitions/{}", path_segment(name)))
            .await
    }

    /// `POST /api/v1/workflow-definitions/{name}/runs`: the id of the workflow it submitted.
    pub async fn run_workflow_definition(
        &self,
        name: &str,
        run: &sked_types::RunWorkflowDefinition,
    ) -> Result<WorkflowSubmitted, ClientError> {
        self.post(
            &format!("/workflow-definitions/{}/runs", path_segment(name)),
            run,
        )
        .await
    }

    /// `GET /api/v1/workflows?after=&limit=`.
    pub async fn workflows(
        &self,
        after: Option<Uuid>,
        limit: u32,
    ) -> Result<WorkflowPage, ClientError> {
        let url = self.url("/workflows");
        let mut query = vec![("limit", limit.to_string())];
        if let Some(after) = after {
            query.push(("after", after.to_string()));
        }
        self.send(self.http.get(&url).query(&query), url).await
    }

    /// `GET /api/v1/workflows/{id}`, as the raw JSON the server sent.
    pub async fn workflow_json(&self, id: Uuid) -> Result<serde_json::Value, ClientError> {
        self.get(&format!("/workflows/{id}")).await
    }

    /// `GET /api/v1/workflows/{id}`.
    pub async fn workflow(&self, id: Uuid) -> Result<WorkflowDetail, ClientError> {
        self.get(&format!("/workflows/{id}")).await
    }

    /// `GET /api/v1/workflows/{id}?wait=`: the workflow once it is in a final state, or as
    /// it is when `wait` (at most [`MAX_WAIT`]) is over.
    pub async fn workflow_waiting(
        &self,
        id: Uuid,
        wait: Duration,
    ) -> Result<WorkflowDetail, ClientError> {
        self.get(&format!(
            "/workflows/{id}?wait={}ms",
            wait.min(MAX_WAIT).as_millis()
        ))
        .await
    }

    /// `POST /api/v1/workflows/{id}/cancel`.
    pub async fn cancel_workflow(&self, id: Uuid) -> Result<WorkflowChange, ClientError> {
        self.post(&format!("/workflows/{id}/cancel"), &serde_json::json!({}))
            .await
    }

    /// `POST /api/v1/workflows/{id}/retry`.
    pub async fn retry_workflow(&self, id: Uuid) -> Result<WorkflowChange, ClientError> {
        self.post(&format!("/workflows/{id}/retry"), &serde_json::json!({}))
            .await
    }
}

/// The start of a body, for error messages.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".to_owned();
    }
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// `text` as one segment of a URL's path: every byte but the unreserved characters of
/// RFC 3986 percent-encoded.
fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
