//! Alerts: a task's `notify` (or its queue's) tells webhooks and follow-up tasks when it
//! succeeds, fails or is retried. Real workers deliver to a real HTTP receiver in this process:
//! signed bodies (checked against HMAC computed here from SHA-256), retries while the receiver
//! is down or refuses, follow-up tasks, queue defaults; and what a submitter may not do:
//! insert a webhook task, name a target that does not exist, make a follow-up a webhook.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{config, start_worker, wait_for};
use crate::trust_roles::Login;

const SECRET: &str = "a-secret-of-twenty-chars";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    headers: HeaderMap,
    body: Vec<u8>,
}

/// An HTTP receiver: records every POST, answering 500 to the first `refuse` of them.
#[derive(Clone)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
    refuse: Arc<Mutex<usize>>,
}

impl Receiver {
    /// Listens on `addr` (port 0: any) until the test ends.
    async fn start(addr: SocketAddr, refuse: usize) -> (Receiver, SocketAddr) {
        let receiver = Receiver {
            got: Arc::default(),
            refuse: Arc::new(Mutex::new(refuse)),
        };
        let state = receiver.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let state = state.clone();
                async move {
                    state.got.lock().unwrap().push(Received {
                        headers,
                        body: body.to_vec(),
                    });
                    let mut refuse = state.refuse.lock().unwrap();
                    if *refuse > 0 {
                        *refuse -= 1;
                        (StatusCode::INTERNAL_SERVER_ERROR, "busy, try later")
                    } else {
                        (StatusCode::NO_CONTENT, "")
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind(addr).await.expect("listen");
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, addr)
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    async fn until(&self, n: usize, within: Duration) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let got = self.received();
            if got.len() >= n {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the receiver got {n} requests in {within:?}: {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// HMAC-SHA256 (RFC 2104) from SHA-256 alone, to check the worker's signature independently.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// Checks a delivery's headers and signature; answers its body as JSON.
fn verified(r: &Received) -> Value {
    let header = |name: &str| {
        r.headers
            .get(name)
            .unwrap_or_else(|| panic!("a delivery has {name}"))
            .to_str()
            .unwrap()
            .to_owned()
    };
    let timestamp = header("x-sked-timestamp");
    let mut message = format!("{timestamp}.").into_bytes();
    message.extend_from_slice(&r.body);
    assert_eq!(
        header("x-sked-signature"),
        format!(
            "sha256={}",
            hex::encode(hmac_sha256(SECRET.as_bytes(), &message))
        ),
        "the signature is HMAC-SHA256(secret, timestamp.body)"
    );
    assert_eq!(header("content-type"), "application/json");
    let body: Value = serde_json::from_slice(&r.body).expect("a JSON body");
    assert_eq!(header("x-sked-event"), body["event"].as_str().unwrap());
    body
}

async fn target(pool: &PgPool, name: &str, addr: SocketAddr, max_attempts: i32) {
    sked_db::alert::set(
        pool,
        name,
        &format!("http://{addr}/hook"),
        SECRET,
        "alerts",
        max_attempts,
    )
    .await
    .expect("an alert target");
}

async fn submit(pool: &PgPool, task: Value) -> Uuid {
    sqlx::query_scalar("select id from sked.tasks_submit($1)")
        .bind(json!([task]))
        .fetch_one(pool)
        .await
        .expect("submitted")
}

/// The webhook tasks, oldest first: (id, state, attempt, target, event).
async fn deliveries(pool: &PgPool) -> Vec<(Uuid, String, i32, String, String)> {
    sqlx::query_as(
        "select id, state, attempt, input->>'target', input->'event'->>'event'
           from sked.tasks where kind = 'webhook' order by created_at, id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_then_failed_task_notifies_its_webhook_signed_and_its_follow_up_task() {
    let db = TestDb::new().await;
    let (receiver, addr) = Receiver::start(([127, 0, 0, 1], 0).into(), 0).await;
    target(&db.pool, "ops", addr, 5).await;
    let id = submit(
        &db.pool,
        json!({
            "command": ["false"], "queue": "work", "max_attempts": 2, "backoff_base": "100 ms",
            "env": {"TOKEN": "s3cret"},
            "notify": {
                "on_retry": ["ops"],
                "on_failure": ["ops", {"task": {"kind": "noop", "queue": "work"}}],
                "on_success": ["ops"]
            }
        }),
    )
    .await;
    let worker = start_worker(&db, config(&["work", "alerts"]));
    assert_eq!(
        wait_for(&db.pool, id, &["failed"], Duration::from_secs(30)).await,
        "failed"
    );
    let got = receiver.until(2, Duration::from_secs(30)).await;
    let events: Vec<Value> = got.iter().map(verified).collect();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["task.retry", "task.failed"],
        "in the order they happened"
    );
    for e in &events {
        assert_eq!(e["task"]["id"], id.to_string());
        assert_eq!(e["task"]["queue"], "work");
        assert!(
            e["task"].get("env").is_none() && !e.to_string().contains("s3cret"),
            "an event carries nothing the task holds: {e}"
        );
    }
    assert_eq!(events[0]["task"]["attempt"], 1);
    assert!(
        events[0]["task"]["next_run_at"].is_string(),
        "when it runs again"
    );
    assert_eq!(events[1]["task"]["attempt"], 2);
    assert_eq!(events[1]["task"]["exit_code"], 1);

    // Each delivery is a webhook task of the target's queue, named in X-Sked-Delivery.
    let tasks = deliveries(&db.pool).await;
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    for (r, (task, state, _, target, _)) in got.iter().zip(&tasks) {
        assert_eq!(r.headers["x-sked-delivery"], task.to_string().as_str());
        assert_eq!(target, "ops");
        // The receiver answered before the worker wrote the result.
        let state = if state == "succeeded" {
            state.clone()
        } else {
            wait_for(&db.pool, *task, &["succeeded"], Duration::from_secs(10)).await
        };
        assert_eq!(state, "succeeded");
    }
    // The follow-up task ran, with the event as its input, for the same owner.
    let (state, input, owner): (String, Value, String) = sqlx::query_as(
        "select state, input, owner from sked.tasks where kind = 'noop' and queue = 'work'",
    )
    .fetch_one(&db.pool)
    .await
    .expect("one follow-up task");
    let failed_owner: String = sqlx::query_scalar("select owner from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(owner, failed_owner);
    assert_eq!(input["event"], "task.failed");
    assert_eq!(input["task"]["id"], id.to_string());
    let state = if state == "succeeded" {
        state
    } else {
        let follow_up: Uuid =
            sqlx::query_scalar("select id from sked.tasks where kind = 'noop' and queue = 'work'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        wait_for(&db.pool, follow_up, &["succeeded"], Duration::from_secs(10)).await
    };
    assert_eq!(state, "succeeded");
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_is_retried_while_the_receiver_is_down_or_refuses() {
    let db = TestDb::new().await;
    // A port with nothing listening: the first attempts find the receiver down.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    target(&db.pool, "ops", port, 10).await;
    let id = submit(
        &db.pool,
        json!({"kind": "noop", "queue": "work", "notify": {"on_success": ["ops"]}}),
    )
    .await;
    let worker = start_worker(&db, config(&["work", "alerts"]));
    assert_eq!(
        wait_for(&db.pool, id, &["succeeded"], Duration::from_secs(30)).await,
        "succeeded"
    );
    // The delivery fails its first attempt, saying why, and waits to be retried.
    let delivery: Uuid = {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let row: Option<(Uuid, Option<String>)> = sqlx::query_as(
                "select t.id, a.error from sked.tasks t
                   join sked.task_attempts a on a.task_id = t.id
                  where t.kind = 'webhook' order by a.attempt limit 1",
            )
            .fetch_optional(&db.pool)
            .await
            .unwrap();
            if let Some((id, error)) = row {
                let error = error.unwrap_or_default();
                assert!(
                    error.contains("could not be reached") && error.contains("ops"),
                    "the attempt says the webhook was down: {error}"
                );
                break id;
            }
            assert!(tokio::time::Instant::now() < deadline, "a first attempt");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    // The receiver comes up, refusing once with 500: the next attempt is refused, the one
    // after delivers.
    let (receiver, _) = Receiver::start(port, 1).await;
    assert_eq!(
        wait_for(&db.pool, delivery, &["succeeded"], Duration::from_secs(60)).await,
        "succeeded"
    );
    let got = receiver.received();
    assert_eq!(got.len(), 2, "one refused, one delivered: {got:?}");
    for r in &got {
        assert_eq!(r.headers["x-sked-delivery"], delivery.to_string().as_str());
        assert_eq!(verified(r)["event"], "task.succeeded");
    }
    let errors: Vec<Option<String>> = sqlx::query_scalar(
        "select error from sked.task_attempts where task_id = $1 order by attempt",
    )
    .bind(delivery)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        errors
            .iter()
            .flatten()
            .any(|e| e.contains("answered 500") && e.contains("busy, try later")),
        "a refusal is the attempt's error, with what the receiver said: {errors:?}"
    );
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_s_notify_covers_its_tasks_without_one_and_a_bad_follow_up_fails_alone() {
    let db = TestDb::new().await;
    let (receiver, addr) = Receiver::start(([127, 0, 0, 1], 0).into(), 0).await;
    target(&db.pool, "ops", addr, 3).await;
    sked_db::alert::set_queue_notify(&db.pool, "work", Some(&json!({"on_success": ["ops"]})))
        .await
        .unwrap();
    let plain = submit(&db.pool, json!({"kind": "noop", "queue": "work"})).await;
    // Its own notify wins: `{}` tells no one.
    let quiet = submit(
        &db.pool,
        json!({"kind": "noop", "queue": "work", "notify": {}}),
    )
    .await;
    // A follow-up task that breaks a rule when it is submitted: the task still ends, and its
    // log says why no follow-up came.
    let bad = submit(
        &db.pool,
        json!({"command": ["false"], "queue": "work", "max_attempts": 1,
               "notify": {"on_failure": [{"task": {"command": []}}]}}),
    )
    .await;
    let worker = start_worker(&db, config(&["work", "alerts"]));
    for id in [plain, quiet] {
        assert_eq!(
            wait_for(&db.pool, id, &["succeeded"], Duration::from_secs(30)).await,
            "succeeded"
        );
    }
    assert_eq!(
        wait_for(&db.pool, bad, &["failed"], Duration::from_secs(30)).await,
        "failed"
    );
    let got = receiver.until(1, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = if got.len() == 1 {
        receiver.received()
    } else {
        got
    };
    assert_eq!(
        got.len(),
        1,
        "only the task without a notify of its own: {got:?}"
    );
    assert_eq!(verified(&got[0])["task"]["id"], plain.to_string());
    let log: Vec<String> = sqlx::query_scalar(
        "select data from sked.task_logs where task_id = $1 and stream = 'stderr'",
    )
    .bind(bad)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        log.iter().any(
            |l| l.contains("follow-up task of task.failed could not be submitted")
                && l.contains("tasks_command_must_not_be_empty")
        ),
        "the failed task's log says why: {log:?}"
    );
    // Removing the queue's notify removes its row (it had no other control).
    sked_db::alert::set_queue_notify(&db.pool, "work", None)
        .await
        .unwrap();
    let rows: i64 = sqlx::query_scalar("select count(*) from sked.queues where name = 'work'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    worker.shutdown().await;
}

#[tokio::test]
async fn a_submitter_cannot_insert_a_webhook_name_an_unknown_target_or_follow_up_with_a_webhook() {
    let db = TestDb::new().await;
    let (_receiver, addr) = Receiver::start(([127, 0, 0, 1], 0).into(), 0).await;
    target(&db.pool, "ops", addr, 3).await;
    let alice = Login::new(&db, "sked_submitter").await;
    // A webhook task would have a worker sign a body of the submitter's choosing.
    alice
        .assert_refused(
            "insert into sked.tasks (kind, input) values ('webhook', \
             '{\"target\": \"ops\", \"event\": {\"event\": \"task.failed\"}}')",
            "kind webhook is sked's own",
            "a submitter's INSERT of a webhook task is refused",
        )
        .await;
    alice
        .assert_refused(
            "select * from sked.tasks_submit('[{\"kind\": \"webhook\", \"input\": {\"target\": \"ops\"}}]')",
            "tasks_webhook_kind_is_for_alerts_only",
            "a submitter's submission of a webhook task is refused",
        )
        .await;
    alice
        .assert_refused(
            "insert into sked.tasks (command, notify) values (array['true'], \
             '{\"on_failure\": [{\"task\": {\"kind\": \"webhook\", \"input\": {}}}]}')",
            "tasks_notify_must_be_an_object_of_event_lists",
            "a follow-up task cannot be a webhook",
        )
        .await;
    alice
        .assert_refused(
            "insert into sked.tasks (command, notify) values (array['true'], '{\"on_failure\": [\"nobody\"]}')",
            "alert target nobody, which does not exist",
            "an unknown target is refused at submit, named",
        )
        .await;
    for bad in [
        r#"{"on_failure": [{}]}"#,
        r#"{"on_failure": [{"task": null}]}"#,
        r#"{"on_failure": [1]}"#,
    ] {
        alice
            .assert_refused(
                &format!(
                    "insert into sked.tasks (command, notify) values (array['true'], '{bad}')"
                ),
                "tasks_notify_must_be_an_object_of_event_lists",
                "a target that is neither a name nor a follow-up task is refused",
            )
            .await;
    }
    alice
        .assert_refused(
            "insert into sked.tasks (command, notify) values (array['true'], '{\"on_crash\": [\"ops\"]}')",
            "tasks_notify_must_be_an_object_of_event_lists",
            "an unknown event is refused",
        )
        .await;
    // A submitter may not read targets (their secrets), nor change them.
    alice
        .assert_refused(
            "select * from sked.alert_targets",
            "permission denied",
            "the targets' secrets are no submitter's",
        )
        .await;
    alice
        .assert_refused(
            "select sked.alert_target_set('mine', 'http://10.0.0.1/', 'aaaaaaaaaaaaaaaaaaaa')",
            "permission denied",
            "a submitter cannot define targets",
        )
        .await;
    // What is allowed: a valid notify naming the target.
    sqlx::query(
        "insert into sked.tasks (command, notify) values (array['true'], '{\"on_failure\": [\"ops\"]}')",
    )
    .execute(&alice.pool)
    .await
    .expect("a submitter names an existing target");
    let webhooks: i64 =
        sqlx::query_scalar("select count(*) from sked.tasks where kind = 'webhook'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(webhooks, 0, "nothing was refused half-way");
}

#[tokio::test]
async fn alert_targets_over_rest_are_for_admins_and_never_show_their_secret() {
    use axum::http::Method;
    let api = crate::api::Api::new().await;
    let body = json!({"url": "http://127.0.0.1:9/hook", "secret": SECRET, "queue": "alerts"});
    let (status, json) = api
        .call(
            Method::PUT,
            "/api/v1/alert-targets/ops",
            &api.alice,
            Some(body.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a user token: {json}");
    let (status, json) = api
        .call(
            Method::PUT,
            "/api/v1/alert-targets/ops",
            &api.admin,
            Some(body),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["name"], "ops");
    assert_eq!(json["max_attempts"], 10);
    assert!(
        json.get("secret").is_none(),
        "the secret is never shown: {json}"
    );

    // Bad values are refused with the rule, and change nothing.
    for (bad, rule) in [
        (
            json!({"url": "ftp://x/", "secret": SECRET}),
            "alert_targets_url_must_be_http_or_https",
        ),
        (
            json!({"url": "http://x/", "secret": "short"}),
            "alert_targets_secret_must_be_16_to_512_characters",
        ),
        (
            json!({"url": "http://x/", "secret": SECRET, "max_attempts": 0}),
            "alert_targets_max_attempts_must_be_1_to_100",
        ),
    ] {
        let (status, json) = api
            .call(
                Method::PUT,
                "/api/v1/alert-targets/ops",
                &api.admin,
                Some(bad),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{json}");
        // The API says a rule in words.
        let words = rule.replace('_', " ");
        assert!(
            json["message"].as_str().unwrap().contains(&words),
            "{words} in {json}"
        );
    }
    let (status, list) = api.get("/api/v1/alert-targets", &api.admin).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(
        list[0]["url"], "http://127.0.0.1:9/hook",
        "unchanged by the refusals"
    );
    assert!(!list.to_string().contains(SECRET));
    let (status, _) = api.get("/api/v1/alert-targets", &api.alice).await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // Tasks name it in their notify; an unknown name or a webhook task is refused (422).
    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "notify": {"on_failure": ["ops"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "notify": {"on_failure": ["opz"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{json}");
    assert!(json.to_string().contains("alert target opz"), "{json}");
    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"kind": "webhook", "input": {"target": "ops", "event": {}}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{json}");
    assert!(
        json.to_string()
            .contains("tasks_webhook_kind_is_for_alerts_only"),
        "{json}"
    );

    // A queue's notify.
    let (status, json) = api
        .call(
            Method::PUT,
            "/api/v1/queues/mail/notify",
            &api.admin,
            Some(json!({"notify": {"on_failure": ["ops"]}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let (status, json) = api
        .call(
            Method::PUT,
            "/api/v1/queues/mail/notify",
            &api.admin,
            Some(json!({"notify": {"on_failure": ["nobody"]}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{json}");
    let (status, _) = api
        .call(
            Method::PUT,
            "/api/v1/queues/mail/notify",
            &api.alice,
            Some(json!({"notify": null})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (status, json) = api
        .call(
            Method::DELETE,
            "/api/v1/alert-targets/ops",
            &api.admin,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["name"], "ops");
    let (status, _) = api
        .call(
            Method::DELETE,
            "/api/v1/alert-targets/ops",
            &api.admin,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_targets_from_a_secret_file_and_tasks_and_queues_name_them() {
    use crate::cli::{output, sked, text};
    let db = TestDb::new().await;
    let server = crate::dashboard::Server::start(&db).await;
    let admin = crate::dashboard::token_for(&db, "root", sked_db::token::Role::Admin).await;
    let run = |args: &[&str]| {
        let mut cmd = sked();
        cmd.args(args)
            .env("SKED_URL", &server.url)
            .env("SKED_TOKEN", &admin);
        cmd
    };
    let dir = std::env::temp_dir().join(format!("sked-alert-cli-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let out = output(
        run(&[
            "alert",
            "target",
            "set",
            "ops",
            "--webhook",
            "http://127.0.0.1:9/hook",
        ])
        .arg("--secret-file")
        .arg(&secret_file),
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let (url, secret): (String, String) =
        sqlx::query_as("select url, secret from sked.alert_targets")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (url.as_str(), secret.as_str()),
        ("http://127.0.0.1:9/hook", SECRET),
        "the file's final newline is dropped"
    );
    let out = output(&mut run(&["alert", "target", "list"])).await;
    assert!(
        text(&out.stdout).contains("ops  http://127.0.0.1:9/hook"),
        "{out:?}"
    );
    assert!(!text(&out.stdout).contains(SECRET));
    let out = output(&mut run(&[
        "alert",
        "target",
        "set",
        "x",
        "--webhook",
        "http://h/",
    ]))
    .await;
    assert!(
        !out.status.success() && text(&out.stderr).contains("--secret-file"),
        "{out:?}"
    );

    let out = output(&mut run(&[
        "submit",
        "--on-failure",
        "ops",
        "--on-retry",
        "ops",
        "--",
        "false",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let notify: Value =
        sqlx::query_scalar("select notify from sked.tasks where command = array['false']")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(notify, json!({"on_failure": ["ops"], "on_retry": ["ops"]}));
    let out = output(&mut run(&["submit", "--on-failure", "nope", "--", "true"])).await;
    assert!(!out.status.success(), "{out:?}");
    assert!(text(&out.stderr).contains("alert target nope"), "{out:?}");

    let out = output(&mut run(&[
        "queue",
        "notify",
        "mail",
        "--on-success",
        "ops",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let queue: Value = sqlx::query_scalar("select notify from sked.queues where name = 'mail'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(queue, json!({"on_success": ["ops"]}));
    let out = output(&mut run(&["queue", "notify", "mail", "--clear"])).await;
    assert!(out.status.success(), "{out:?}");
    let out = output(&mut run(&["alert", "target", "delete", "ops"])).await;
    assert!(
        out.status.success() && text(&out.stdout).contains("deleted ops"),
        "{out:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_s_notify_is_told_when_it_fails() {
    let db = TestDb::new().await;
    let (receiver, addr) = Receiver::start(([127, 0, 0, 1], 0).into(), 0).await;
    target(&db.pool, "ops", addr, 3).await;
    let bad: String = sqlx::query_scalar("select sked.workflow_submit($1)::text")
        .bind(
            json!({"name": "etl", "tasks": [{"name": "a", "command": ["true"]}],
                 "notify": {"on_failure": ["nobody"]}}),
        )
        .fetch_one(&db.pool)
        .await
        .map(|_: String| String::new())
        .unwrap_or_else(|e| e.to_string());
    assert!(
        bad.contains("alert target nobody"),
        "an unknown target is refused: {bad}"
    );
    let wf: Uuid = sqlx::query_scalar("select sked.workflow_submit($1)")
        .bind(json!({
            "name": "etl",
            "tasks": [
                {"name": "extract", "command": ["false"], "queue": "work", "max_attempts": 1},
                {"name": "load", "kind": "noop", "queue": "work", "depends_on": ["extract"]}
            ],
            "notify": {"on_failure": ["ops"], "on_success": ["ops"]}
        }))
        .fetch_one(&db.pool)
        .await
        .expect("a workflow with a notify");
    let worker = start_worker(&db, config(&["work", "alerts"]));
    let got = receiver.until(1, Duration::from_secs(30)).await;
    let event = verified(&got[0]);
    assert_eq!(event["event"], "workflow.failed", "{event}");
    assert_eq!(event["workflow"]["id"], wf.to_string());
    assert_eq!(event["workflow"]["name"], "etl");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(receiver.received().len(), 1, "told once");
    worker.shutdown().await;
}

/// The events of the webhook tasks waiting to be delivered, oldest first.
async fn events_queued(pool: &PgPool) -> Vec<Value> {
    sqlx::query_scalar(
        "select input->'event' from sked.tasks where kind = 'webhook' order by created_at, id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_is_told_of_missed_ticks_and_once_of_failures_in_a_row() {
    let db = TestDb::new().await;
    let (_receiver, addr) = Receiver::start(([127, 0, 0, 1], 0).into(), 0).await;
    target(&db.pool, "ops", addr, 3).await;
    let fire = |at: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query("select sked.schedules_fire(p_now => $1::timestamptz)")
                .bind(at)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    // Bad notifies are refused when the schedule is written.
    for (notify, says) in [
        (json!({"on_missed": ["nobody"]}), "alert target nobody"),
        (
            json!({"on_failure": ["ops"], "failures_in_a_row": 0}),
            "schedules_notify_must_be_valid",
        ),
        (
            json!({"on_succes": ["ops"]}),
            "schedules_notify_must_be_valid",
        ),
    ] {
        let e = sqlx::query(
            "select sked.schedule_create(name => 'bad', cron => '* * * * *',
                                         task => '{\"kind\": \"noop\"}', notify => $1)",
        )
        .bind(&notify)
        .execute(&db.pool)
        .await
        .expect_err("refused");
        assert!(e.to_string().contains(says), "{notify}: {e}");
    }

    // Hourly, misfire skip, first looked at long after its first tick: its missed ticks are
    // told once.
    sqlx::query(
        "select sked.schedule_create(name => 'hourly', cron => '0 * * * *', misfire_policy => 'skip',
                                     task => '{\"kind\": \"noop\", \"queue\": \"idle\"}',
                                     notify => '{\"on_missed\": [\"ops\"]}',
                                     p_now => '2026-06-01T05:30:00Z')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // Every minute, occurrences that fail; told when two fail in a row.
    sqlx::query(
        "select sked.schedule_create(name => 'flaky', cron => '* * * * *', overlap_policy => 'allow',
                                     task => '{\"command\": [\"false\"], \"queue\": \"work\", \"max_attempts\": 1}',
                                     notify => '{\"on_failure\": [\"ops\"], \"failures_in_a_row\": 2}',
                                     p_now => '2026-06-01T10:00:30Z')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    fire("2026-06-01T10:01:00Z").await;
    let events = events_queued(&db.pool).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["event"], "schedule.missed");
    assert_eq!(events[0]["schedule"]["name"], "hourly");
    assert_eq!(events[0]["missed_ticks"], 5, "06:00 to 10:00");

    fire("2026-06-01T10:02:00Z").await;
    fire("2026-06-01T10:03:00Z").await;
    let worker = start_worker(&db, config(&["work"]));
    let occurrences = |pool: PgPool| async move {
        let n: i64 = sqlx::query_scalar(
            "select count(*) from sked.tasks where queue = 'work' and state = 'failed'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while occurrences(db.pool.clone()).await < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "three occurrences fail"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A fourth failure makes the streak longer, not new: still told once.
    fire("2026-06-01T10:04:00Z").await;
    while occurrences(db.pool.clone()).await < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a fourth occurrence fails"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let failing: Vec<Value> = events_queued(&db.pool)
        .await
        .into_iter()
        .filter(|e| e["event"] == "schedule.failing")
        .collect();
    assert_eq!(
        failing.len(),
        1,
        "told once, when the streak reached 2: {failing:?}"
    );
    assert_eq!(failing[0]["schedule"]["name"], "flaky");
    assert_eq!(failing[0]["failures_in_a_row"], 2);
    worker.shutdown().await;
}
