//! Tests of the REST API: the router over a fresh database, driven with `oneshot`.

use std::collections::HashSet;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sked_db::token::Role;
use tower::ServiceExt;
use uuid::Uuid;

/// A fresh database, its router, and tokens for `alice` and `bob` (users) and an admin.
pub(crate) struct Api {
    pub(crate) db: TestDb,
    router: Router,
    pub(crate) alice: String,
    pub(crate) bob: String,
    pub(crate) admin: String,
}

impl Api {
    pub(crate) async fn new() -> Api {
        Api::with_quotas(sked_server::Quotas::default()).await
    }

    /// [`Api::new`] with a server whose quotas are `quotas`.
    pub(crate) async fn with_quotas(quotas: sked_server::Quotas) -> Api {
        let db = TestDb::new().await;
        let router = sked_server::router_with(db.pool.clone(), None, quotas);
        let alice = sked_db::token::create(&db.pool, "alice", Role::User, "test")
            .await
            .unwrap();
        let bob = sked_db::token::create(&db.pool, "bob", Role::User, "test")
            .await
            .unwrap();
        let admin = sked_db::token::create(&db.pool, "root", Role::Admin, "test")
            .await
            .unwrap();
        Api {
            db,
            router,
            alice,
            bob,
            admin,
        }
    }

    /// Sends a request with an optional token and raw body; returns the status, the
    /// `WWW-Authenticate` header and the body parsed as JSON (every response must be JSON).
    pub(crate) async fn raw(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<String>,
    ) -> (StatusCode, Option<String>, Value) {
        let (status, headers, json) = self.send(method, uri, token, body).await;
        let challenge = headers
            .get(header::WWW_AUTHENTICATE)
            .map(|v| v.to_str().unwrap().to_owned());
        (status, challenge, json)
    }

    /// [`Api::raw`] answering all the response's headers.
    pub(crate) async fn send(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<String>,
    ) -> (StatusCode, HeaderMap, Value) {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = match body {
            Some(body) => request
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body)),
            None => request.body(Body::empty()),
        }
        .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let json = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "every response body is JSON, got {status} {:?}: {e}",
                String::from_utf8_lossy(&bytes)
            )
        });
        (status, headers, json)
    }

    pub(crate) async fn call(
        &self,
        method: Method,
        uri: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (status, _, json) = self
            .raw(method, uri, Some(token), body.map(|b| b.to_string()))
            .await;
        (status, json)
    }

    pub(crate) async fn get(&self, uri: &str, token: &str) -> (StatusCode, Value) {
        self.call(Method::GET, uri, token, None).await
    }

    pub(crate) async fn post(&self, uri: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, uri, token, Some(body)).await
    }

    /// Submits one task and returns its id.
    async fn submit(&self, token: &str, body: Value) -> Uuid {
        let (status, json) = self.post("/api/v1/tasks", token, body).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "a valid task is accepted: {json}"
        );
        json["ids"][0].as_str().unwrap().parse().unwrap()
    }

    async fn task_count(&self) -> i64 {
        sqlx::query_scalar("select count(*) from sked.tasks")
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    async fn state_of(&self, id: Uuid) -> String {
        sqlx::query_scalar("select state from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }
}

fn echo() -> Value {
    json!({"command": ["echo", "hi"]})
}

/// Asserts an error body with the given code and no database wording in its message.
pub(crate) fn assert_error(json: &Value, code: &str) {
    assert_eq!(json["code"], code, "the error code is {code:?}: {json}");
    let message = json["message"].as_str().expect("an error has a message");
    assert!(!message.is_empty(), "an error message is not empty");
    for leak in ["violates", "relation", "sked.", "SQLSTATE", "constraint \""] {
        assert!(
            !message.contains(leak),
            "error messages never show database text ({leak:?}): {message}"
        );
    }
}

#[tokio::test]
async fn no_token_is_401_json() {
    let api = Api::new().await;
    for uri in [
        "/api/v1/tasks",
        "/api/v1/me",
        "/api/v1/workers",
        "/api/v1/queues",
    ] {
        let (status, challenge, json) = api.raw(Method::GET, uri, None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri} needs a token");
        assert_eq!(
            challenge.as_deref(),
            Some("Bearer"),
            "a 401 names the Bearer scheme"
        );
        assert_error(&json, "unauthorized");
    }
    let (status, _, json) = api
        .raw(
            Method::POST,
            "/api/v1/tasks",
            None,
            Some(echo().to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "submitting needs a token");
    assert_error(&json, "unauthorized");
    assert_eq!(
        api.task_count().await,
        0,
        "an unauthenticated submit inserts nothing"
    );
}

#[tokio::test]
async fn bad_token_is_401() {
    let api = Api::new().await;
    let (status, _, json) = api
        .raw(
            Method::GET,
            "/api/v1/me",
            Some("sked_not_a_real_token"),
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "an unknown token is refused"
    );
    assert_error(&json, "unauthorized");

    let request = Request::get("/api/v1/me")
        .header(header::AUTHORIZATION, format!("Basic {}", api.alice))
        .body(Body::empty())
        .unwrap();
    let response = api.router.clone().oneshot(request).await.unwrap();
    assert_eq!(
        response.status(),
        StatusCode::UNAUTHORIZED,
        "only the Bearer scheme is accepted"
    );

    sqlx::query("update sked.api_tokens set revoked_at = now() where owner = 'alice'")
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (status, json) = api.get("/api/v1/me", &api.alice).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a revoked token is refused"
    );
    assert_error(&json, "unauthorized");
}

#[tokio::test]
async fn user_submits_and_sees_own_task() {
    let api = Api::new().await;
    let (status, me) = api.get("/api/v1/me", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        me,
        json!({"owner": "alice", "role": "user"}),
        "me names the token's owner and role"
    );

    let id = api
        .submit(
            &api.alice,
            json!({"command": ["echo", "hi"], "queue": "q1", "max_attempts": 2}),
        )
        .await;
    let (status, task) = api.get(&format!("/api/v1/tasks/{id}"), &api.alice).await;
    assert_eq!(status, StatusCode::OK, "a user reads its own task: {task}");
    assert_eq!(task["id"], id.to_string());
    assert_eq!(
        task["owner"], "alice",
        "the owner defaults to the token's owner"
    );
    assert_eq!(task["state"], "waiting", "a submitted task waits");
    assert_eq!(task["queue"], "q1");
    assert_eq!(task["max_attempts"], 2);
    assert_eq!(task["command"], json!(["echo", "hi"]));
    assert_eq!(
        task["attempts"],
        json!([]),
        "a task that never ran has no attempts"
    );

    let (status, page) = api.get("/api/v1/tasks", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.to_string()], "a user's listing holds its task");
    assert_eq!(page["next_cursor"], Value::Null, "one page only");

    let (status, page) = api
        .get("/api/v1/tasks?state=waiting&queue=q1", &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        page["tasks"].as_array().unwrap().len(),
        1,
        "filters match the task"
    );
    let (status, page) = api.get("/api/v1/tasks?state=running", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        page["tasks"],
        json!([]),
        "the state filter excludes other states"
    );
}

#[tokio::test]
async fn user_cannot_see_or_act_on_another_owners_task() {
    let api = Api::new().await;
    let bobs = api.submit(&api.bob, echo()).await;
    let alices = api.submit(&api.alice, echo()).await;

    let (status, json) = api.get(&format!("/api/v1/tasks/{bobs}"), &api.alice).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another owner's task looks absent"
    );
    assert_error(&json, "not_found");
    let (status, absent) = api
        .get(&format!("/api/v1/tasks/{}", Uuid::nil()), &api.alice)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        json, absent,
        "a hidden task answers exactly like an absent one"
    );

    let (status, json) = api
        .get(&format!("/api/v1/tasks/{bobs}/logs"), &api.alice)
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another owner's logs are hidden"
    );
    assert_error(&json, "not_found");

    let (status, json) = api
        .post(
            &format!("/api/v1/tasks/{bobs}/cancel"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a user cannot cancel another owner's task"
    );
    assert_error(&json, "not_found");
    assert_eq!(
        api.state_of(bobs).await,
        "waiting",
        "the refused cancel changed nothing"
    );

    sqlx::query("update sked.tasks set state = 'cancelled', finished_at = now() where id = $1")
        .bind(bobs)
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (status, json) = api
        .post(
            &format!("/api/v1/tasks/{bobs}/retry"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a user cannot retry another owner's task"
    );
    assert_error(&json, "not_found");
    assert_eq!(
        api.state_of(bobs).await,
        "cancelled",
        "the refused retry changed nothing"
    );

    let (status, json) = api.get("/api/v1/tasks?owner=bob", &api.alice).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a user cannot list another owner"
    );
    assert_error(&json, "forbidden");

    let (status, page) = api.get("/api/v1/tasks", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [alices.to_string()],
        "a user's listing holds only its own tasks"
    );
    let (status, page) = api.get("/api/v1/tasks?owner=alice", &api.alice).await;
    assert_eq!(status, StatusCode::OK, "a user may name its own owner");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn user_cannot_submit_for_another_owner() {
    let api = Api::new().await;
    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "owner": "bob"}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a user submits for its own owner only"
    );
    assert_error(&json, "forbidden");
    let (status, json) = api
        .post(
            "/api/v1/tasks/batch",
            &api.alice,
            json!({"tasks": [{"command": ["true"]}, {"command": ["true"], "owner": "bob"}]}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a batch naming another owner is refused"
    );
    assert_error(&json, "forbidden");
    assert_eq!(
        api.task_count().await,
        0,
        "a refused submission inserts nothing"
    );

    let own = api
        .submit(&api.alice, json!({"command": ["true"], "owner": "alice"}))
        .await;
    let (_, task) = api.get(&format!("/api/v1/tasks/{own}"), &api.alice).await;
    assert_eq!(task["owner"], "alice", "a user may name itself as owner");

    let for_bob = api
        .submit(&api.admin, json!({"command": ["true"], "owner": "bob"}))
        .await;
    let (status, task) = api.get(&format!("/api/v1/tasks/{for_bob}"), &api.bob).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an admin may submit on behalf of another owner"
    );
    assert_eq!(task["owner"], "bob");
}

#[tokio::test]
async fn admin_sees_all() {
    let api = Api::new().await;
    let alices = api.submit(&api.alice, echo()).await;
    let bobs = api.submit(&api.bob, echo()).await;

    let (status, page) = api.get("/api/v1/tasks", &api.admin).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [bobs.to_string(), alices.to_string()],
        "an admin lists every owner's tasks, newest first"
    );

    let (status, page) = api.get("/api/v1/tasks?owner=bob", &api.admin).await;
    assert_eq!(status, StatusCode::OK, "an admin may filter by any owner");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(page["tasks"][0]["owner"], "bob");

    let (status, _) = api
        .get(&format!("/api/v1/tasks/{alices}"), &api.admin)
        .await;
    assert_eq!(status, StatusCode::OK, "an admin reads any task");
    let (status, change) = api
        .post(
            &format!("/api/v1/tasks/{bobs}/cancel"),
            &api.admin,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "an admin cancels any task");
    assert_eq!(change["state"], "cancelled");
}

#[tokio::test]
async fn submit_validation_rejects_with_readable_messages() {
    let api = Api::new().await;

    let (status, json) = api
        .post("/api/v1/tasks", &api.alice, json!({"command": []}))
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "an empty command is rejected"
    );
    assert_error(&json, "rejected");
    assert_eq!(
        json["message"], "command must not be empty",
        "the message is the rule, read from the constraint's name"
    );

    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "max_attempts": 0}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "max_attempts 0 is rejected"
    );
    assert_error(&json, "rejected");
    assert_eq!(
        json["message"], "max_attempts must be at least 1",
        "the message names the field and its lower bound"
    );

    let (status, json) = api.post("/api/v1/tasks", &api.alice, json!({})).await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a task needs something to run"
    );
    assert_error(&json, "rejected");

    let (status, json) = api
        .post("/api/v1/tasks", &api.alice, json!({"comand": ["true"]}))
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an unknown field is a bad request"
    );
    assert_error(&json, "invalid_request");
    assert!(
        json["message"].as_str().unwrap().contains("comand"),
        "the message names the unknown field: {json}"
    );

    let (status, _, json) = api
        .raw(
            Method::POST,
            "/api/v1/tasks",
            Some(&api.alice),
            Some("{\"command\": [".into()),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "malformed JSON is a bad request"
    );
    assert_error(&json, "invalid_request");

    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "delay_secs": 1e300}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an absurd duration is a bad request"
    );
    assert_error(&json, "invalid_request");

    let (status, json) = api
        .post("/api/v1/tasks", &api.alice, json!({"command": ["a\u{0}b"]}))
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "NUL characters cannot be stored"
    );
    assert_error(&json, "invalid_request");

    assert_eq!(
        api.task_count().await,
        0,
        "no rejected submission inserted a row"
    );
}

#[tokio::test]
async fn batch_is_all_or_nothing() {
    let api = Api::new().await;
    let (status, json) = api
        .post(
            "/api/v1/tasks/batch",
            &api.alice,
            json!({"tasks": [{"command": ["true"]}, {"command": [""]}, {"command": ["true"]}]}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "one bad task rejects the batch"
    );
    assert_error(&json, "rejected");
    assert_eq!(
        api.task_count().await,
        0,
        "a rejected batch inserts none of its tasks"
    );

    let (status, json) = api
        .post(
            "/api/v1/tasks/batch",
            &api.alice,
            json!({"tasks": [{"command": ["a"]}, {"command": ["b"]}, {"command": ["c"]}]}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a valid batch is accepted: {json}"
    );
    let ids = json["ids"].as_array().unwrap();
    assert_eq!(ids.len(), 3, "one id per task");
    for (id, name) in ids.iter().zip(["a", "b", "c"]) {
        let (_, task) = api
            .get(
                &format!("/api/v1/tasks/{}", id.as_str().unwrap()),
                &api.alice,
            )
            .await;
        assert_eq!(
            task["command"],
            json!([name]),
            "ids answer in request order"
        );
    }

    let too_many = vec![json!({"kind": "noop"}); sked_server::MAX_BATCH + 1];
    let (status, json) = api
        .post(
            "/api/v1/tasks/batch",
            &api.alice,
            json!({ "tasks": too_many }),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a batch has a size limit, which its schema declares (maxItems)"
    );
    assert_error(&json, "invalid_request");
    assert_eq!(
        api.task_count().await,
        3,
        "an oversized batch inserts nothing"
    );
}

#[tokio::test]
async fn keyset_pagination_returns_every_task_once() {
    let api = Api::new().await;
    let tasks: Vec<Value> = (0..23)
        .map(|i| json!({"command": ["echo", i.to_string()]}))
        .collect();
    let (status, json) = api
        .post("/api/v1/tasks/batch", &api.alice, json!({ "tasks": tasks }))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let submitted: HashSet<String> = json["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().to_owned())
        .collect();
    api.submit(&api.bob, echo()).await;

    let mut seen = Vec::new();
    let mut pages = 0;
    let mut uri = "/api/v1/tasks?limit=5".to_owned();
    loop {
        let (status, page) = api.get(&uri, &api.alice).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        pages += 1;
        let tasks = page["tasks"].as_array().unwrap();
        assert!(tasks.len() <= 5, "a page holds at most `limit` tasks");
        seen.extend(tasks.iter().map(|t| t["id"].as_str().unwrap().to_owned()));
        match page["next_cursor"].as_str() {
            Some(cursor) => uri = format!("/api/v1/tasks?limit=5&after={cursor}"),
            None => break,
        }
        assert!(pages < 10, "pagination ends");
    }
    assert_eq!(pages, 5, "23 tasks in pages of 5 take 5 pages");
    let unique: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(seen.len(), unique.len(), "no task appears on two pages");
    assert_eq!(
        unique, submitted,
        "every one of the user's tasks appears, and only those"
    );
    let mut newest_first = seen.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(
        seen, newest_first,
        "tasks are listed newest (largest id) first"
    );

    let (status, page) = api.get("/api/v1/tasks?limit=500", &api.admin).await;
    assert_eq!(status, StatusCode::OK, "the largest page is 500: {page}");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 24);
    for limit in ["0", "-1", "501", "100000"] {
        for listing in ["tasks", "workflows"] {
            let (status, json) = api
                .get(&format!("/api/v1/{listing}?limit={limit}"), &api.admin)
                .await;
            assert_eq!(
                status,
                StatusCode::BAD_REQUEST,
                "a {listing} limit of {limit} is out of range, refused rather than capped"
            );
            assert_error(&json, "invalid_request");
            assert!(
                json["message"]
                    .as_str()
                    .unwrap()
                    .contains("between 1 and 500"),
                "the refusal names the range: {json}"
            );
        }
    }
}

#[tokio::test]
async fn bad_query_and_path_values_are_400_json() {
    let api = Api::new().await;
    let (status, json) = api.get("/api/v1/tasks?state=bogus", &api.alice).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an unknown state is a bad request"
    );
    assert_error(&json, "invalid_request");
    assert!(
        json["message"].as_str().unwrap().contains("bogus"),
        "the message names the bad state: {json}"
    );
    let (status, json) = api.get("/api/v1/tasks?after=not-a-uuid", &api.alice).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a bad cursor is a bad request"
    );
    assert_error(&json, "invalid_request");
    let (status, json) = api.get("/api/v1/tasks/not-a-uuid", &api.alice).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "a bad task id is a bad request"
    );
    assert_error(&json, "invalid_request");
    let (status, json) = api.get("/api/v1/nowhere", &api.alice).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "an unknown endpoint is 404");
    assert_error(&json, "not_found");
    let (status, json) = api
        .call(Method::DELETE, "/api/v1/tasks", &api.alice, None)
        .await;
    assert_eq!(
        status,
        StatusCode::METHOD_NOT_ALLOWED,
        "a wrong method is 405"
    );
    assert_error(&json, "method_not_allowed");
}

#[tokio::test]
async fn cancel_and_retry_follow_the_state_machine() {
    let api = Api::new().await;
    let id = api.submit(&api.alice, echo()).await;
    let cancel = format!("/api/v1/tasks/{id}/cancel");
    let retry = format!("/api/v1/tasks/{id}/retry");

    let (status, json) = api.post(&retry, &api.alice, json!({})).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a waiting task cannot be retried"
    );
    assert_error(&json, "not_finished");

    let (status, change) = api.post(&cancel, &api.alice, json!({})).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a waiting task can be cancelled: {change}"
    );
    assert_eq!(
        change,
        json!({"id": id.to_string(), "state": "cancelled", "cancel_requested": false}),
        "a task that never started is cancelled at once"
    );
    assert_eq!(api.state_of(id).await, "cancelled");

    let (status, json) = api.post(&cancel, &api.alice, json!({})).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a finished task cannot be cancelled again"
    );
    assert_error(&json, "already_finished");

    let (status, change) = api.post(&retry, &api.alice, json!({})).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a cancelled task can be retried: {change}"
    );
    assert_eq!(change["state"], "waiting", "a retried task waits again");
    assert_eq!(api.state_of(id).await, "waiting");

    let (status, json) = api
        .post(
            &format!("/api/v1/tasks/{}/cancel", Uuid::nil()),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "cancelling an absent task is 404"
    );
    assert_error(&json, "not_found");
}

#[tokio::test]
async fn cancel_of_a_running_task_requests_it() {
    let api = Api::new().await;
    let id = api.submit(&api.alice, echo()).await;
    let claimed = sked_db::worker::claim(
        &api.db.pool,
        Uuid::new_v4(),
        &["default".to_owned()],
        &[],
        1,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1);

    let (status, change) = api
        .post(&format!("/api/v1/tasks/{id}/cancel"), &api.alice, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{change}");
    assert_eq!(
        change["state"], "running",
        "a running task keeps running until its worker stops it"
    );
    assert_eq!(
        change["cancel_requested"], true,
        "the cancel of a running task is requested"
    );
    let (status, json) = api
        .post(&format!("/api/v1/tasks/{id}/retry"), &api.alice, json!({}))
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a running task cannot be retried"
    );
    assert_error(&json, "not_finished");
}

#[tokio::test]
async fn logs_follow_by_chunk_id() {
    let api = Api::new().await;
    let id = api.submit(&api.alice, echo()).await;
    sked_db::worker::append_logs(
        &api.db.pool,
        &[
            (id, 1, "stdout", "one\n".to_owned()),
            (id, 1, "stderr", "two\n".to_owned()),
            (id, 1, "stdout", "three\n".to_owned()),
        ],
    )
    .await
    .unwrap();
    let (status, chunks) = api
        .get(&format!("/api/v1/tasks/{id}/logs"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK);
    let data: Vec<&str> = chunks
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["data"].as_str().unwrap())
        .collect();
    assert_eq!(
        data,
        ["one\n", "two\n", "three\n"],
        "chunks come oldest first"
    );
    assert_eq!(chunks[1]["stream"], "stderr");

    let first = chunks[0]["id"].as_i64().unwrap();
    let (_, rest) = api
        .get(
            &format!("/api/v1/tasks/{id}/logs?after={first}&limit=1"),
            &api.alice,
        )
        .await;
    assert_eq!(
        rest.as_array().unwrap().len(),
        1,
        "limit bounds the chunks returned"
    );
    assert_eq!(
        rest[0]["data"], "two\n",
        "`after` skips the chunks already seen"
    );
}

#[tokio::test]
async fn queues_count_only_a_users_own_tasks() {
    let api = Api::new().await;
    for _ in 0..2 {
        api.submit(&api.alice, json!({"command": ["true"], "queue": "a"}))
            .await;
    }
    api.submit(&api.bob, json!({"command": ["true"], "queue": "a"}))
        .await;
    api.submit(&api.bob, json!({"command": ["true"], "queue": "b"}))
        .await;

    // The counts by queue; each queue also tells how long its oldest due task has waited.
    let counts = |queues: Value| -> Value {
        queues
            .as_array()
            .unwrap()
            .iter()
            .map(|q| json!({"queue": q["queue"], "counts": q["counts"]}))
            .collect()
    };
    let (status, queues) = api.get("/api/v1/queues", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        counts(queues),
        json!([{"queue": "a", "counts": {"waiting": 2}}]),
        "a user counts its own tasks only"
    );
    let (status, queues) = api.get("/api/v1/queues", &api.admin).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        counts(queues),
        json!([{"queue": "a", "counts": {"waiting": 3}}, {"queue": "b", "counts": {"waiting": 1}}]),
        "an admin counts every task"
    );
}

#[tokio::test]
async fn workers_lists_the_registry() {
    let api = Api::new().await;
    let id = Uuid::new_v4();
    sked_db::worker::register(
        &api.db.pool,
        &sked_db::worker::Registration {
            id,
            name: "w1".into(),
            host: "box".into(),
            pid: 42,
            version: "0.1.0".into(),
            queues: vec!["default".into()],
            labels: vec![],
            concurrency: 4,
            lease: Duration::from_secs(30),
            cpu_millis: Some(2000),
            memory_mb: Some(4096),
        },
    )
    .await
    .unwrap();
    let (status, workers) = api.get("/api/v1/workers", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    let workers = workers.as_array().unwrap();
    assert_eq!(workers.len(), 1, "the registered worker is listed");
    assert_eq!(workers[0]["id"], id.to_string());
    assert_eq!(
        workers[0]["alive"], true,
        "a worker with a fresh heartbeat is alive"
    );
    assert_eq!(workers[0]["lease_secs"], 30.0);
    assert_eq!(
        (&workers[0]["cpu_millis"], &workers[0]["memory_mb"]),
        (&json!(2000), &json!(4096)),
        "the advertised capacity is shown"
    );
    assert_eq!(workers[0]["running_memory_mb"], 0, "it runs nothing yet");
}

#[tokio::test]
async fn an_idempotency_key_answers_with_its_task_200_and_a_different_definition_409() {
    let api = Api::new().await;
    let body = json!({"command": ["true"], "idempotency_key": "k1"});
    let (status, first) = api.post("/api/v1/tasks", &api.alice, body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["created"], json!([true]));
    let id = &first["ids"][0];
    sqlx::query("select sked.task_cancel($1::uuid)")
        .bind(id.as_str().unwrap())
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (status, again) = api.post("/api/v1/tasks", &api.alice, body.clone()).await;
    assert_eq!(
        (status, &again["ids"][0], &again["created"]),
        (StatusCode::OK, id, &json!([false])),
        "the key names its task after it finished: 200, that task, created false"
    );
    let (status, batch) = api
        .post(
            "/api/v1/tasks/batch",
            &api.alice,
            json!({"tasks": [body.clone(), {"command": ["true"]}]}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a batch that created a task: {batch}"
    );
    assert_eq!(batch["created"], json!([false, true]));
    assert_eq!(&batch["ids"][0], id);

    let other = json!({"command": ["false"], "idempotency_key": "k1"});
    let (status, err) = api.post("/api/v1/tasks", &api.alice, other).await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    assert_error(&err, "conflict");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("another definition"),
        "{err}"
    );
    let (status, _) = api.post("/api/v1/tasks", &api.bob, body).await;
    assert_eq!(status, StatusCode::CREATED, "keys are per owner");
    assert_eq!(api.task_count().await, 3, "a repeated key inserts nothing");
}

#[tokio::test]
async fn openapi_document_lists_the_api() {
    let api = Api::new().await;
    let (status, _, doc) = api
        .raw(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the OpenAPI document needs no token"
    );
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "it is an OpenAPI 3 document"
    );
    for path in [
        "/api/v1/tasks",
        "/api/v1/tasks/batch",
        "/api/v1/tasks/{id}",
        "/api/v1/tasks/{id}/logs",
        "/api/v1/tasks/{id}/cancel",
        "/api/v1/tasks/{id}/retry",
        "/api/v1/workers",
        "/api/v1/queues",
        "/api/v1/me",
        "/api/v1/health",
    ] {
        assert!(doc["paths"][path].is_object(), "the document lists {path}");
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer",
        "the bearer security scheme is declared"
    );
    assert!(
        doc["components"]["schemas"]["SubmitTask"].is_object(),
        "the wire types are described"
    );
}

#[tokio::test]
async fn health_works_without_token() {
    let api = Api::new().await;
    let (status, _, health) = api.raw(Method::GET, "/api/v1/health", None, None).await;
    assert_eq!(status, StatusCode::OK, "health needs no token: {health}");
    assert_eq!(health["status"], "ok");
    assert_eq!(
        health["schema_version"],
        sked_db::expected_schema_version(),
        "health reports the database's schema version"
    );
}

#[tokio::test]
async fn serve_refuses_a_database_without_the_schema() {
    let db = TestDb::empty().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = sked_server::serve(db.pool.clone(), listener, Default::default())
        .await
        .expect_err("the server refuses an unmigrated database");
    assert!(
        err.to_string().contains("sked migrate"),
        "the error says how to fix it: {err}"
    );
}

#[tokio::test]
async fn unexpected_database_errors_are_500_without_database_text() {
    let api = Api::new().await;
    let id = api.submit(&api.alice, echo()).await;
    sqlx::query("alter table sked.task_logs rename to task_logs_elsewhere")
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (status, json) = api
        .get(&format!("/api/v1/tasks/{id}/logs"), &api.alice)
        .await;
    assert_eq!(
        status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "an unexpected database error is a 500"
    );
    assert_error(&json, "internal");
    assert!(
        !json["message"].as_str().unwrap().contains("task_logs"),
        "a 500 hides what failed: {json}"
    );
}

#[tokio::test]
async fn health_reports_an_unreachable_database_as_503() {
    let api = Api::new().await;
    api.db.pool.close().await;
    let (status, _, json) = api.raw(Method::GET, "/api/v1/health", None, None).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "health fails when the database does not answer"
    );
    assert_error(&json, "unavailable");
}

#[tokio::test]
async fn delayed_tasks_take_a_start_time_a_delay_or_both() {
    let api = Api::new().await;
    let time = |v: &Value| -> chrono::DateTime<chrono::Utc> {
        v.as_str()
            .expect("a time")
            .parse()
            .expect("an RFC 3339 time")
    };
    let delayed = api
        .submit(&api.alice, json!({"kind": "noop", "delay_secs": 900}))
        .await;
    let (status, task) = api
        .get(&format!("/api/v1/tasks/{delayed}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(task["state"], "waiting");
    let after = (time(&task["next_run_at"]) - time(&task["created_at"])).as_seconds_f64();
    assert!(
        (900.0..901.0).contains(&after),
        "delay_secs counts from the submission's commit: {after} s after its start: {task}"
    );

    let at = api
        .submit(
            &api.alice,
            json!({"kind": "noop", "run_at": "2030-01-02T04:04:05+01:00", "delay_secs": 60.5}),
        )
        .await;
    let (_, task) = api.get(&format!("/api/v1/tasks/{at}"), &api.alice).await;
    assert_eq!(
        time(&task["next_run_at"]),
        time(&json!("2030-01-02T03:05:05.5Z")),
        "run_at plus delay_secs: {task}"
    );

    let count = api.task_count().await;
    for (body, says) in [
        (
            json!({"kind": "noop", "delay_secs": -5}),
            "delay_secs must be zero or more",
        ),
        (json!({"kind": "noop", "run_at": "tomorrow"}), "run_at"),
        (json!({"kind": "noop", "delay_secs": "15m"}), "delay_secs"),
    ] {
        let (status, json) = api.post("/api/v1/tasks", &api.alice, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} is refused: {json}");
        assert_error(&json, "invalid_request");
        assert!(
            json["message"].as_str().unwrap().contains(says),
            "the message for {body} says {says:?}: {json}"
        );
    }
    assert_eq!(
        api.task_count().await,
        count,
        "refused tasks are not inserted"
    );

    let (_, _, doc) = api
        .raw(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    let fields = &doc["components"]["schemas"]["SubmitTask"]["properties"];
    assert_eq!(
        fields["run_at"]["format"], "date-time",
        "the OpenAPI document describes run_at: {fields}"
    );
    assert!(
        fields["delay_secs"].is_object(),
        "the OpenAPI document describes delay_secs: {fields}"
    );
}

/// A body over the limit is refused with 413 naming the limits: 2 MiB for one task, while a
/// batch of the same size goes in (its limit is 32 MiB).
#[tokio::test]
async fn a_body_over_its_limit_is_refused_naming_the_limits() {
    let api = Api::new().await;
    let big = "x".repeat(3 * 1024 * 1024);
    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "input": {"blob": big}}),
        )
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{json}");
    assert_error(&json, "too_large");
    let message = json["message"].as_str().unwrap();
    assert!(
        message.contains("32 MiB for POST /api/v1/tasks/batch")
            && message.contains("2 MiB for any other request"),
        "{message}"
    );
    let (status, json) = api
        .post(
            "/api/v1/tasks/batch",
            &api.alice,
            json!({"tasks": [{"command": ["true"], "input": {"blob": big}}]}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a batch reads up to 32 MiB: {json}"
    );
}
