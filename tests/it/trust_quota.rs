//! The quota of task rows per owner per minute (`--max-rows-per-owner-per-minute`): a user
//! token's requests that create task rows take them from its owner's bucket in the database,
//! and one the bucket cannot cover is refused with 429 and `Retry-After` and writes nothing;
//! shards, copies, resubmissions, a schedule's run now and a service's new copies count;
//! owners do not share a bucket; admin tokens are exempt; the bucket refills with time; a
//! request that fails gives its rows back; the submitter role cannot touch the buckets, and
//! the server role takes from them through its function only.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sked_db::token::Role;
use sked_server::Quotas;
use tower::ServiceExt;

use crate::api::{Api, assert_error};
use crate::trust_roles::Login;

/// Quotas with `per_minute` task rows per owner per minute.
fn per_minute(per_minute: u64) -> Quotas {
    Quotas {
        max_rows_per_owner_per_minute: per_minute,
        ..Quotas::default()
    }
}

fn task() -> Value {
    json!({"command": ["true"]})
}

fn batch(n: usize) -> Value {
    json!({"tasks": vec![task(); n]})
}

async fn task_count(api: &Api) -> i64 {
    sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(&api.db.pool)
        .await
        .unwrap()
}

/// Posts `body` to `uri` with `token`; the status, the `Retry-After` header and the body.
async fn post(api: &Api, uri: &str, token: &str, body: Value) -> (StatusCode, Option<u64>, Value) {
    let (status, headers, json) = api
        .send(Method::POST, uri, Some(token), Some(body.to_string()))
        .await;
    let retry_after = headers.get(header::RETRY_AFTER).map(|v| {
        v.to_str()
            .unwrap()
            .parse()
            .expect("Retry-After is whole seconds")
    });
    (status, retry_after, json)
}

/// Asserts that `uri` refuses `body` from `token` with 429 `quota_exceeded`, a `Retry-After`
/// of at most `max_wait` seconds, and a message naming the limit and its flag; answers the
/// message.
async fn assert_over_quota(
    api: &Api,
    uri: &str,
    token: &str,
    body: Value,
    limit: u64,
    max_wait: u64,
) -> String {
    let (status, retry_after, json) = post(api, uri, token, body).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "a request over the owner's quota is refused: {json}"
    );
    assert_error(&json, "quota_exceeded");
    let retry_after = retry_after.expect("a 429 has a Retry-After header");
    assert!(
        (1..=max_wait).contains(&retry_after),
        "Retry-After is whole seconds until the rows are there (at most {max_wait}): {retry_after}"
    );
    let message = json["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains(&format!("at most {limit} task rows per minute"))
            && message.contains("--max-rows-per-owner-per-minute")
            && message.contains(&format!("try again in {retry_after} s")),
        "the refusal names the limit, its flag and when to try again: {message}"
    );
    message
}

#[tokio::test]
async fn a_user_token_creates_at_most_its_quota_of_rows_per_minute() {
    let api = Api::with_quotas(per_minute(10)).await;
    for _ in 0..4 {
        let (status, _, json) = post(&api, "/api/v1/tasks", &api.alice, task()).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
    }
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.alice, batch(6)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "10 rows in a minute are within a quota of 10: {json}"
    );
    assert_eq!(task_count(&api).await, 10);

    // One row refills in 6 s at 10 rows a minute.
    let message = assert_over_quota(&api, "/api/v1/tasks", &api.alice, task(), 10, 6).await;
    assert!(
        message.starts_with("owner alice may create at most 10 task rows per minute")
            && message.contains("this task would create 1"),
        "the refusal names the owner and the rows asked for: {message}"
    );
    let workflow = json!({"tasks": [{"name": "a", "command": ["true"]}]});
    assert_over_quota(&api, "/api/v1/workflows", &api.alice, workflow, 10, 6).await;
    assert_over_quota(&api, "/api/v1/tasks/batch", &api.alice, batch(2), 10, 12).await;
    assert_eq!(
        task_count(&api).await,
        10,
        "a refused request inserts no row"
    );
}

#[tokio::test]
async fn a_request_larger_than_the_whole_quota_is_refused_as_never_fitting() {
    let api = Api::with_quotas(per_minute(10)).await;
    let (status, retry_after, json) =
        post(&api, "/api/v1/tasks/batch", &api.alice, batch(11)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{json}");
    assert_error(&json, "too_large");
    assert_eq!(retry_after, None, "waiting would not help: no Retry-After");
    let message = json["message"].as_str().unwrap();
    assert!(
        message.contains("11 task rows")
            && message.contains("at most 10 per minute")
            && message.contains("--max-rows-per-owner-per-minute")
            && message.contains("can never be accepted"),
        "the refusal says the request can never fit, and why: {message}"
    );
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.alice, batch(10)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the refusal took nothing: {json}"
    );
    assert_eq!(task_count(&api).await, 10);
}

#[tokio::test]
async fn shards_and_copies_of_services_count_against_the_quota() {
    let api = Api::with_quotas(per_minute(10)).await;
    let sharded = |n: u32| json!({"command": ["true"], "shards": n});
    let (status, _, json) = post(&api, "/api/v1/tasks", &api.alice, sharded(5)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    assert_eq!(task_count(&api).await, 6, "a task of 5 shards is 6 rows");
    // 6 taken, 4 left: a task of 4 shards (5 rows) does not fit, one of 3 (4 rows) does.
    let message = assert_over_quota(&api, "/api/v1/tasks", &api.alice, sharded(4), 10, 6).await;
    assert!(message.contains("would create 5"), "{message}");
    let (status, _, json) = post(&api, "/api/v1/tasks", &api.alice, sharded(3)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    assert_eq!(task_count(&api).await, 10);

    let service = json!({"kind": "service", "command": ["sleep"], "args": ["300"], "replicas": 2});
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.bob, batch(7)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    // A service of 2 copies is 3 rows: bob has 3 left.
    let (status, _, json) = post(&api, "/api/v1/tasks", &api.bob, service.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let message = assert_over_quota(&api, "/api/v1/tasks", &api.bob, service, 10, 18).await;
    assert!(
        message.starts_with("owner bob") && message.contains("would create 3"),
        "{message}"
    );
    assert_eq!(task_count(&api).await, 20);
}

#[tokio::test]
async fn another_owners_quota_is_its_own() {
    let api = Api::with_quotas(per_minute(10)).await;
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.alice, batch(10)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    assert_over_quota(&api, "/api/v1/tasks", &api.alice, task(), 10, 6).await;
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.bob, batch(10)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "bob's quota is untouched by alice's requests: {json}"
    );
    assert_over_quota(&api, "/api/v1/tasks", &api.bob, task(), 10, 6).await;
    assert_eq!(task_count(&api).await, 20);
}

#[tokio::test]
async fn admin_tokens_are_exempt() {
    let api = Api::with_quotas(per_minute(10)).await;
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.alice, batch(10)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    // 25 rows for the admin's own owner and 25 for alice, whose quota is spent.
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.admin, batch(25)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "an admin token is not held to the quota: {json}"
    );
    let for_alice = json!({"tasks": vec![json!({"command": ["true"], "owner": "alice"}); 25]});
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.admin, for_alice).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "an admin submits for an owner whose quota is spent: {json}"
    );
    assert_eq!(task_count(&api).await, 60);
    let buckets: Vec<String> =
        sqlx::query_scalar("select owner from sked.owner_quota order by owner")
            .fetch_all(&api.db.pool)
            .await
            .unwrap();
    assert_eq!(
        buckets,
        ["alice"],
        "an admin's requests take from no bucket"
    );
    assert_over_quota(&api, "/api/v1/tasks", &api.alice, task(), 10, 6).await;
}

/// `sked.owner_quota_take(owner, rows, per_minute, now)` at `secs` after a fixed instant.
async fn take(pool: &sqlx::PgPool, owner: &str, rows: i64, per_minute: i64, secs: f64) -> f64 {
    sqlx::query_scalar(
        "select sked.owner_quota_take($1, $2, $3,
                timestamptz '2026-12-18 12:00:00+00' + make_interval(secs => $4))",
    )
    .bind(owner)
    .bind(rows)
    .bind(per_minute)
    .bind(secs)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_bucket_refills_at_the_rate_up_to_the_limit() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    assert_eq!(
        take(pool, "carol", 60, 60, 0.0).await,
        0.0,
        "a new bucket is full"
    );
    let wait = take(pool, "carol", 1, 60, 0.0).await;
    assert!(
        (wait - 1.0).abs() < 1e-6,
        "an empty bucket of 60 a minute holds 1 row in 1 s: {wait}"
    );
    assert_eq!(
        take(pool, "carol", 1, 60, 1.0).await,
        0.0,
        "1 s later it does"
    );
    let wait = take(pool, "carol", 30, 60, 1.0).await;
    assert!((wait - 30.0).abs() < 1e-6, "30 rows take 30 s: {wait}");
    assert_eq!(take(pool, "carol", 30, 60, 31.0).await, 0.0);
    assert_eq!(
        take(pool, "carol", 60, 60, 3600.0).await,
        0.0,
        "an hour later the bucket is full"
    );
    let wait = take(pool, "carol", 1, 60, 3600.0).await;
    assert!(
        wait > 0.0,
        "a bucket holds at most its limit, however long it waited: {wait}"
    );
    assert!(
        take(pool, "carol", 61, 60, 7200.0).await.is_infinite(),
        "more rows than the limit never fit"
    );
    assert_eq!(
        take(pool, "dave", 60, 60, 3600.0).await,
        0.0,
        "another owner has its own bucket"
    );

    // Through the API: a spent quota is there again a minute later, and no more than it.
    let api = Api::with_quotas(per_minute(10)).await;
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.alice, batch(10)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    assert_over_quota(&api, "/api/v1/tasks", &api.alice, task(), 10, 6).await;
    sqlx::query("update sked.owner_quota set refreshed_at = refreshed_at - interval '1 minute'")
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.alice, batch(10)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a minute later the quota is whole again: {json}"
    );
    assert_over_quota(&api, "/api/v1/tasks", &api.alice, task(), 10, 6).await;
    assert_eq!(task_count(&api).await, 20);
}

#[tokio::test]
async fn a_request_that_fails_takes_nothing() {
    let api = Api::with_quotas(per_minute(10)).await;
    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.alice, batch(5)).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    // The database refuses the last task (max_attempts must be at least 1) after the rows
    // were taken; the rollback gives them back.
    let mut bad = vec![task(); 4];
    bad.push(json!({"command": ["true"], "max_attempts": 0}));
    let (status, _, json) = post(
        &api,
        "/api/v1/tasks/batch",
        &api.alice,
        json!({"tasks": bad}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{json}");
    assert_error(&json, "rejected");
    let workflow = json!({"tasks": [
        {"name": "a", "command": ["true"]},
        {"name": "b", "command": ["true"], "depends_on": ["nowhere"]},
    ]});
    let (status, _, json) = post(&api, "/api/v1/workflows", &api.alice, workflow).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{json}");
    assert_eq!(task_count(&api).await, 5);

    let (status, _, json) = post(&api, "/api/v1/tasks/batch", &api.alice, batch(5)).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the failed requests took nothing: {json}"
    );
    assert_over_quota(&api, "/api/v1/tasks", &api.alice, task(), 10, 6).await;
    assert_eq!(task_count(&api).await, 10);
}

#[tokio::test]
async fn resubmissions_runs_of_schedules_and_new_copies_of_services_count() {
    let api = Api::with_quotas(per_minute(20)).await;
    let (status, _, json) = post(
        &api,
        "/api/v1/tasks",
        &api.alice,
        json!({"command": ["true"], "shards": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let sharded = json["ids"][0].as_str().unwrap().to_owned();
    let resubmit = format!("/api/v1/tasks/{sharded}/resubmit");
    let (status, _, json) = post(&api, &resubmit, &api.alice, json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    assert_eq!(task_count(&api).await, 6, "two tasks of 2 shards");

    let schedule = json!({"name": "yearly", "cron": "0 0 1 1 *",
                          "task": {"command": ["true"], "shards": 3}});
    let (status, _, json) = post(&api, "/api/v1/schedules", &api.alice, schedule).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let run = format!("/api/v1/schedules/{}/run", json["id"].as_str().unwrap());
    let (status, _, json) = post(&api, &run, &api.alice, json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    assert_eq!(
        task_count(&api).await,
        10,
        "the run made a task of 3 shards"
    );

    let service = json!({"kind": "service", "command": ["sleep"], "args": ["300"], "replicas": 1});
    let (status, _, json) = post(&api, "/api/v1/tasks", &api.alice, service).await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let service = json["ids"][0].as_str().unwrap().to_owned();
    assert_eq!(task_count(&api).await, 12);

    // 12 of 20 taken: scaling the service to 4 copies makes 3 rows, 15.
    let service_uri = format!("/api/v1/services/{service}");
    let patch = |body: Value| {
        api.send(
            Method::PATCH,
            &service_uri,
            Some(&api.alice),
            Some(body.to_string()),
        )
    };
    let (status, _, json) = patch(json!({"replicas": 4})).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(task_count(&api).await, 15);
    // A new definition makes a new copy at each of the 4 indexes: 19.
    let (status, _, json) = patch(json!({"args": ["301"]})).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    // 1 left: each of these is refused and changes nothing.
    let (status, headers, json) = patch(json!({"replicas": 6})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{json}");
    assert!(headers.contains_key(header::RETRY_AFTER), "{headers:?}");
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("this change of the service would create 2"),
        "{json}"
    );
    let replicas: i32 = sqlx::query_scalar("select replicas from sked.tasks where id = $1::uuid")
        .bind(&service)
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(replicas, 4, "a refused change changes nothing");
    let max_wait = 9;
    let message = assert_over_quota(&api, &resubmit, &api.alice, json!({}), 20, max_wait).await;
    assert!(
        message.contains("this resubmission would create 3"),
        "{message}"
    );
    let message = assert_over_quota(&api, &run, &api.alice, json!({}), 20, max_wait + 3).await;
    assert!(
        message.contains("this run of the schedule would create 4"),
        "{message}"
    );
    let counted: i64 = sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    let (status, _, json) = post(&api, "/api/v1/tasks", &api.alice, task()).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the last row of the quota: {json}"
    );
    assert_eq!(task_count(&api).await, counted + 1);
}

#[tokio::test]
async fn the_submitter_role_cannot_touch_the_quotas_and_the_server_role_takes_through_its_function()
{
    let db = TestDb::new().await;
    let submitter = Login::new(&db, "sked_submitter").await;
    let denied = "permission denied for table owner_quota";
    let cases = [
        (
            "select * from sked.owner_quota",
            denied,
            "a submitter cannot read the quotas",
        ),
        (
            "insert into sked.owner_quota (owner, tokens, refreshed_at) values (current_user, 1e9, now())",
            denied,
            "a submitter cannot give itself rows",
        ),
        (
            "update sked.owner_quota set tokens = 1e9",
            denied,
            "a submitter cannot refill a bucket",
        ),
        (
            "delete from sked.owner_quota",
            denied,
            "a submitter cannot empty the quotas",
        ),
        (
            "select sked.owner_quota_take(current_user, 1, 10)",
            "permission denied for function owner_quota_take",
            "a submitter cannot take from a bucket",
        ),
    ];
    for (sql, says, rule) in cases {
        submitter.assert_refused(sql, says, rule).await;
    }

    // The server role: no right on the table, the quota enforced through its function.
    let server = Login::new(&db, "sked_server").await;
    for sql in [
        "select * from sked.owner_quota",
        "update sked.owner_quota set tokens = 1e9",
    ] {
        server
            .assert_refused(
                sql,
                denied,
                "the server reaches the quotas through owner_quota_take only",
            )
            .await;
    }
    let alice = sked_db::token::create(&db.pool, "alice", Role::User, "test")
        .await
        .unwrap();
    let router = sked_server::router_with(server.pool.clone(), None, per_minute(3));
    let submit = async || {
        let request = Request::post("/api/v1/tasks/batch")
            .header(header::AUTHORIZATION, format!("Bearer {alice}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(batch(2).to_string()))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    let (status, body) = submit().await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "the API over a sked_server connection takes from the quota: {body}"
    );
    let (status, body) = submit().await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "and refuses what it cannot cover: {body}"
    );
    let tokens: f64 =
        sqlx::query_scalar("select tokens from sked.owner_quota where owner = 'alice'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        (tokens - 1.0).abs() < 0.01,
        "2 of 3 rows taken, the refusal took none: {tokens}"
    );
}

#[tokio::test]
async fn the_openapi_document_lists_the_quota_refusals() {
    let api = Api::new().await;
    let (status, _, doc) = api
        .raw(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    // Declared once, and referred to by every operation that creates task rows.
    let quota = &doc["components"]["responses"]["QuotaExceeded"];
    assert!(
        quota["description"]
            .as_str()
            .is_some_and(|d| d.contains("--max-rows-per-owner-per-minute")),
        "the 429 names the flag: {quota}"
    );
    assert!(
        quota["headers"]["Retry-After"].is_object(),
        "the 429 has Retry-After: {quota}"
    );
    for (path, method) in [
        ("/api/v1/tasks", "post"),
        ("/api/v1/tasks/batch", "post"),
        ("/api/v1/workflows", "post"),
        ("/api/v1/tasks/{id}/resubmit", "post"),
        ("/api/v1/schedules/{id}/run", "post"),
        ("/api/v1/services/{id}", "patch"),
    ] {
        let responses = &doc["paths"][path][method]["responses"];
        assert!(
            responses["413"].is_object(),
            "{method} {path} lists 413: {responses}"
        );
        assert_eq!(
            responses["429"]["$ref"], "#/components/responses/QuotaExceeded",
            "{method} {path} lists 429: {responses}"
        );
    }
}

#[tokio::test]
async fn a_bad_quota_flag_stops_the_server_at_start_with_a_clear_error() {
    for value in ["-1", "ten", "1000000001"] {
        let out = crate::cli::output(
            crate::cli::sked()
                .arg("server")
                .arg(format!("--max-rows-per-owner-per-minute={value}"))
                .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"),
        )
        .await;
        assert!(!out.status.success(), "{value} is refused: {out:?}");
        let stderr = crate::cli::text(&out.stderr);
        assert!(
            stderr.contains(&format!("invalid value '{value}'"))
                && stderr.contains("--max-rows-per-owner-per-minute"),
            "the error names the value and the flag: {stderr}"
        );
    }
}
