//! Awaiting a task or a workflow without polling (`sql/awaits.sql`, `docs/sql.md`): the
//! registration and its notification in SQL, with real workers; no lost wake-up when tasks
//! end while waiters register; waiting holds no snapshot; owners; the REST long poll.

use std::collections::HashMap;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::time::Instant;
use uuid::Uuid;

use crate::api::Api;
use crate::support::{config, insert, start_worker};
use crate::trust_roles::Login;

/// A connection that awaits with SQL as an application would: it calls `sked.task_await`
/// (which LISTENs on the task's channel in this session) and reads the notifications.
async fn waiter(pool: &PgPool) -> PgListener {
    PgListener::connect_with(pool).await.unwrap()
}

/// `sked.task_await(id)` on the waiter's connection: the state and whether it is final.
async fn task_await(listener: &mut PgListener, id: Uuid) -> (String, bool) {
    sqlx::query_as("select * from sked.task_await($1)")
        .bind(id)
        .fetch_one(&mut *listener)
        .await
        .expect("sked.task_await")
}

/// The next notification within `within`, as (channel, payload).
async fn next(listener: &mut PgListener, within: Duration) -> Option<(String, Value)> {
    match tokio::time::timeout(within, listener.recv()).await {
        Ok(n) => {
            let n = n.expect("receiving a notification");
            let payload = serde_json::from_str(n.payload()).expect("the payload is JSON");
            Some((n.channel().to_owned(), payload))
        }
        Err(_) => None,
    }
}

async fn registrations(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sked.awaits")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_final_state_is_announced_on_the_task_channel_to_whoever_awaits_it() {
    let db = TestDb::new().await;
    let queue = "awaits";
    let ok = insert(
        &db.pool,
        &format!("(command, queue) values ('{{true}}', '{queue}')"),
    )
    .await;
    let failing = insert(
        &db.pool,
        &format!("(command, queue, max_attempts) values ('{{false}}', '{queue}', 1)"),
    )
    .await;
    let cancelled = insert(
        &db.pool,
        "(command, queue) values ('{true}', 'nobody-serves')",
    )
    .await;
    let unawaited = insert(
        &db.pool,
        &format!("(command, queue) values ('{{true}}', '{queue}')"),
    )
    .await;

    let mut w = waiter(&db.pool).await;
    for id in [ok, failing, cancelled] {
        assert_eq!(task_await(&mut w, id).await, ("waiting".to_owned(), false));
    }
    assert_eq!(registrations(&db.pool).await, 3);
    // The channel's name is the same fact in SQL and in Rust.
    let channel: String = sqlx::query_scalar("select sked.task_channel($1)")
        .bind(ok)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(channel, sked_db::awaits::task_channel(ok));
    assert_eq!(channel, format!("sked_task_{ok}"));

    // While it waits, the waiter's session is idle: no transaction, no snapshot.
    let pid: i32 = sqlx::query_scalar("select pg_backend_pid()")
        .fetch_one(&mut w)
        .await
        .unwrap();
    let (state, xmin_held): (String, bool) = sqlx::query_as(
        "select state, backend_xmin is not null from pg_stat_activity where pid = $1",
    )
    .bind(pid)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((state.as_str(), xmin_held), ("idle", false));

    let worker = start_worker(&db, config(&[queue]));
    sqlx::query("select sked.task_cancel($1)")
        .bind(cancelled)
        .execute(&db.pool)
        .await
        .unwrap();
    let mut heard = HashMap::new();
    while heard.len() < 3 {
        let (channel, payload) = next(&mut w, Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("three notifications, got {heard:?}"));
        heard.insert(channel, payload);
    }
    let expect = |id: Uuid, state: &str| {
        (
            format!("sked_task_{id}"),
            json!({"task_id": id, "state": state, "workflow_id": null}),
        )
    };
    for (id, state) in [
        (ok, "succeeded"),
        (failing, "failed"),
        (cancelled, "cancelled"),
    ] {
        let (channel, payload) = expect(id, state);
        assert_eq!(heard.get(&channel), Some(&payload), "{heard:?}");
    }
    // The unawaited task ended unannounced; every registration is gone with its notification.
    crate::support::wait_for(&db.pool, unawaited, &["succeeded"], Duration::from_secs(30)).await;
    assert_eq!(next(&mut w, Duration::from_millis(300)).await, None);
    assert_eq!(registrations(&db.pool).await, 0);

    // Awaiting a finished task answers at once and registers nothing.
    assert_eq!(task_await(&mut w, ok).await, ("succeeded".to_owned(), true));
    assert_eq!(registrations(&db.pool).await, 0);
    worker.shutdown().await;
}

#[tokio::test]
async fn no_wake_up_is_lost_when_tasks_end_while_their_waiters_register() {
    let db = TestDb::new().await;
    let queue = "race";
    let n = 300;
    let worker = start_worker(&db, {
        let mut c = config(&[queue]);
        c.concurrency = 64;
        c.poll_interval = Duration::from_millis(5);
        c
    });
    // Waiters register while the worker claims and finishes the same tasks: each learns the
    // final state either from its registration's read or from a notification.
    let mut waiters = Vec::new();
    for _ in 0..4 {
        let pool = db.pool.clone();
        waiters.push(tokio::spawn(async move {
            let mut w = waiter(&pool).await;
            let mut pending = std::collections::HashSet::new();
            for _ in 0..n / 4 {
                let id = insert(&pool, &format!("(kind, queue) values ('noop', '{queue}')")).await;
                let (_, finished) = task_await(&mut w, id).await;
                if !finished {
                    pending.insert(format!("sked_task_{id}"));
                }
            }
            let registered = pending.len();
            let deadline = Instant::now() + Duration::from_secs(60);
            while !pending.is_empty() {
                let left = deadline.saturating_duration_since(Instant::now());
                match next(&mut w, left).await {
                    Some((channel, payload)) => {
                        assert_eq!(payload["state"], "succeeded");
                        pending.remove(&channel);
                    }
                    None => panic!("{} of {registered} waiters never heard", pending.len()),
                }
            }
            registered
        }));
    }
    let mut registered = 0;
    for w in waiters {
        registered += w.await.unwrap();
    }
    // Most registrations raced a running worker (the test would prove nothing otherwise).
    assert!(registered > 0, "no waiter registered before its task ended");
    let unfinished: i64 =
        sqlx::query_scalar("select count(*) from sked.tasks where state <> 'succeeded'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(unfinished, 0);
    worker.shutdown().await;
}

#[tokio::test]
async fn a_workflow_is_announced_once_final_and_its_tasks_name_it() {
    let db = TestDb::new().await;
    let queue = "flows";
    let spec = json!({"tasks": [
        {"name": "a", "kind": "noop", "queue": queue},
        {"name": "b", "command": ["false"], "queue": queue, "max_attempts": 1, "depends_on": ["a"]},
    ]});
    let flow: Uuid = sqlx::query_scalar("select sked.workflow_submit($1, 'alice')")
        .bind(&spec)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let b: Uuid = crate::support::task_id(&db.pool, flow, "b").await;
    let mut w = waiter(&db.pool).await;
    let (state, finished): (String, bool) = sqlx::query_as("select * from sked.workflow_await($1)")
        .bind(flow)
        .fetch_one(&mut w)
        .await
        .unwrap();
    assert_eq!((state.as_str(), finished), ("running", false));
    assert_eq!(task_await(&mut w, b).await, ("blocked".to_owned(), false));

    let worker = start_worker(&db, config(&[queue]));
    let mut heard = HashMap::new();
    while heard.len() < 2 {
        let (channel, payload) = next(&mut w, Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("two notifications, got {heard:?}"));
        heard.insert(channel, payload);
    }
    assert_eq!(
        heard[&sked_db::awaits::workflow_channel(flow)],
        json!({"workflow_id": flow, "state": "failed"})
    );
    assert_eq!(
        heard[&sked_db::awaits::task_channel(b)],
        json!({"task_id": b, "state": "failed", "workflow_id": flow})
    );
    let (state, finished): (String, bool) = sqlx::query_as("select * from sked.workflow_await($1)")
        .bind(flow)
        .fetch_one(&mut w)
        .await
        .unwrap();
    assert_eq!((state.as_str(), finished), ("failed", true));
    worker.shutdown().await;
}

#[tokio::test]
async fn a_submitter_awaits_its_own_tasks_only_and_a_bad_registration_is_refused() {
    let db = TestDb::new().await;
    let alice = Login::new(&db, "sked_submitter").await;
    let bob = Login::new(&db, "sked_submitter").await;
    let mine: Uuid = sqlx::query_scalar(
        "insert into sked.tasks (command, queue) values ('{true}', 'q') returning id",
    )
    .fetch_one(&alice.pool)
    .await
    .unwrap();
    let mut w = waiter(&alice.pool).await;
    assert_eq!(
        task_await(&mut w, mine).await,
        ("waiting".to_owned(), false)
    );

    // Another submitter's task and a task that does not exist give the same error.
    let mut other = waiter(&bob.pool).await;
    let mut messages = Vec::new();
    for id in [mine, Uuid::now_v7()] {
        let err = sqlx::query("select * from sked.task_await($1)")
            .bind(id)
            .execute(&mut other)
            .await
            .unwrap_err();
        let e = err.as_database_error().expect("a database error");
        assert_eq!(e.code().as_deref(), Some("P0002"), "{e}");
        messages.push(e.message().replace(&id.to_string(), "<id>"));
    }
    assert_eq!(messages[0], messages[1]);
    // Nothing was registered for bob, and he hears nothing when the task ends.
    assert_eq!(registrations(&db.pool).await, 1);
    sqlx::query("select sked.task_cancel($1)")
        .bind(mine)
        .execute(&db.pool)
        .await
        .unwrap();
    assert!(next(&mut w, Duration::from_secs(10)).await.is_some());
    assert_eq!(next(&mut other, Duration::from_millis(300)).await, None);

    for bad in ["0 s", "-1 s", "2 days"] {
        let err = sqlx::query("select * from sked.task_await($1, true, $2::interval)")
            .bind(mine)
            .bind(bad)
            .execute(&db.pool)
            .await
            .unwrap_err();
        let e = err.as_database_error().unwrap();
        assert_eq!(e.code().as_deref(), Some("22023"), "{bad}: {e}");
        assert!(e.message().contains("p_for"), "{e}");
    }
}

/// `GET …?wait=` over the router.
async fn get_waiting(api: &Api, uri: &str, token: &str) -> (StatusCode, Value, Duration) {
    let started = Instant::now();
    let (status, body) = api.call(Method::GET, uri, token, None).await;
    (status, body, started.elapsed())
}

#[tokio::test]
async fn the_api_long_polls_a_task_and_a_workflow_until_final_or_the_wait_is_over() {
    let api = Api::new().await;
    let (status, submitted) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["sleep", "1"], "queue": "polls"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    let id = submitted["ids"][0].as_str().unwrap().to_owned();

    // Nobody serves the queue yet: the wait ends with the state then.
    let (status, body, took) =
        get_waiting(&api, &format!("/api/v1/tasks/{id}?wait=500ms"), &api.alice).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "waiting");
    assert!(took >= Duration::from_millis(500), "{took:?}");

    let worker = start_worker(&api.db, config(&["polls"]));
    let (status, body, took) =
        get_waiting(&api, &format!("/api/v1/tasks/{id}?wait=60s"), &api.alice).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "succeeded");
    assert_eq!(body["attempts"].as_array().map(Vec::len), Some(1), "{body}");
    assert!(took < Duration::from_secs(30), "{took:?}");

    // Final already: at once.
    let (_, body, took) =
        get_waiting(&api, &format!("/api/v1/tasks/{id}?wait=300"), &api.alice).await;
    assert_eq!(body["state"], "succeeded");
    assert!(took < Duration::from_secs(5), "{took:?}");

    // Another owner's task is not found, without waiting.
    let (status, body, took) =
        get_waiting(&api, &format!("/api/v1/tasks/{id}?wait=60s"), &api.bob).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(took < Duration::from_secs(5), "{took:?}");

    for bad in ["abc", "301", "-1", "5m1s", "1h", ""] {
        let (status, body) = api
            .get(&format!("/api/v1/tasks/{id}?wait={bad}"), &api.alice)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "wait={bad}: {body}");
        assert_eq!(body["code"], "invalid_request");
        assert!(body["message"].as_str().unwrap().contains("wait"), "{body}");
    }

    // A workflow: the answer comes when its last task has ended.
    let (status, flow) = api
        .post(
            "/api/v1/workflows",
            &api.alice,
            json!({"tasks": [
                {"name": "a", "command": ["sleep", "0.5"], "queue": "polls"},
                {"name": "b", "command": ["true"], "queue": "polls", "depends_on": ["a"]},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{flow}");
    let flow = flow["id"].as_str().unwrap().to_owned();
    let (status, body, _) = get_waiting(
        &api,
        &format!("/api/v1/workflows/{flow}?wait=60s"),
        &api.alice,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "succeeded", "{body}");
    assert!(
        body["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["state"] == "succeeded"),
        "{body}"
    );
    // Nothing is left registered nor listened on.
    assert_eq!(registrations(&api.db.pool).await, 0);
    worker.shutdown().await;
}

#[tokio::test]
async fn many_long_polls_of_one_task_all_answer_when_it_ends() {
    let api = std::sync::Arc::new(Api::new().await);
    let id = insert(&api.db.pool, "(command, queue) values ('{true}', 'shared')").await;
    let mut polls = Vec::new();
    for _ in 0..20 {
        let api = api.clone();
        polls.push(tokio::spawn(async move {
            api.get(&format!("/api/v1/tasks/{id}?wait=60s"), &api.admin)
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One registration for them all.
    assert_eq!(registrations(&api.db.pool).await, 1);
    let worker = start_worker(&api.db, config(&["shared"]));
    for p in polls {
        let (status, body) = p.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["state"], "succeeded");
    }
    worker.shutdown().await;
}

#[tokio::test]
async fn sked_wait_exits_with_how_the_tasks_and_workflows_ended() {
    let api = crate::cli::Api::start().await;
    let pool = &api.db.pool;
    let ok = insert(pool, "(command, queue) values ('{true}', 'cliwait')").await;
    let bad = insert(
        pool,
        "(command, queue, max_attempts) values ('{false}', 'cliwait', 1)",
    )
    .await;
    let never = insert(pool, "(command, queue) values ('{true}', 'nobody-serves')").await;
    let flow: Uuid = sqlx::query_scalar("select sked.workflow_submit($1, 'admin')")
        .bind(json!({"tasks": [{"name": "a", "kind": "noop", "queue": "cliwait"}]}))
        .fetch_one(pool)
        .await
        .unwrap();

    // Waiting starts before anything runs: the answers come from the long polls.
    let (ok_s, bad_s, flow_s) = (ok.to_string(), bad.to_string(), flow.to_string());
    let mut both = api.sked(&["wait", &ok_s, &flow_s]);
    let both = tokio::spawn(async move { crate::cli::output(&mut both).await });
    let mut failing = api.sked(&["wait", &ok_s, &bad_s]);
    let failing = tokio::spawn(async move { crate::cli::output(&mut failing).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let worker = start_worker(&api.db, config(&["cliwait"]));

    let out = both.await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed = crate::cli::text(&out.stdout);
    assert!(printed.contains(&format!("{ok} succeeded")), "{printed}");
    assert!(printed.contains(&format!("{flow} succeeded")), "{printed}");
    let out = failing.await.unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(crate::cli::text(&out.stdout).contains(&format!("{bad} failed")));

    let out =
        crate::cli::output(&mut api.sked(&["wait", "--timeout", "1s", &never.to_string()])).await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(crate::cli::text(&out.stdout).contains(&format!("{never} waiting")));

    let out = crate::cli::output(&mut api.sked(&["wait", "--json", &ok_s])).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["state"], "succeeded");

    let out = crate::cli::output(&mut api.sked(&["wait", &Uuid::now_v7().to_string()])).await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        crate::cli::text(&out.stderr).contains("no task or workflow"),
        "{out:?}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_stopping_server_answers_its_long_polls_at_once() {
    let db = TestDb::new().await;
    let token = sked_db::token::create(&db.pool, "admin", sked_db::token::Role::Admin, "test")
        .await
        .unwrap();
    let id = insert(
        &db.pool,
        "(command, queue) values ('{true}', 'nobody-serves')",
    )
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let served = tokio::spawn(sked_server::serve(db.pool.clone(), listener, stop.clone()));
    let client = sked::client::Client::new(&url, Some(token)).unwrap();
    let poll = tokio::spawn(async move { client.task_waiting(id, Duration::from_secs(50)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!poll.is_finished());
    let stopping = Instant::now();
    stop.cancel();
    let answer = poll.await.unwrap().expect("the long poll is answered");
    assert_eq!(answer.task.state, sked_types::TaskState::Waiting);
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "{:?}",
        stopping.elapsed()
    );
}

#[tokio::test]
async fn a_long_poll_outlives_the_loss_of_the_servers_listen_connection() {
    let api = std::sync::Arc::new(Api::new().await);
    let id = insert(
        &api.db.pool,
        "(command, queue) values ('{true}', 'nobody-serves')",
    )
    .await;
    let poll = {
        let api = api.clone();
        tokio::spawn(async move {
            api.get(&format!("/api/v1/tasks/{id}?wait=60s"), &api.admin)
                .await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while registrations(&api.db.pool).await == 0 {
        assert!(Instant::now() < deadline, "the long poll never registered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The server's LISTEN connection dies, and the task ends before it is back: its
    // notification is lost, and the poll learns the state when the connection returns.
    let killed: i64 = sqlx::query_scalar(
        "select count(pg_terminate_backend(pid)) from pg_stat_activity
          where datname = current_database() and query ilike 'listen %sked_task_%'",
    )
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    assert_eq!(
        killed, 1,
        "one LISTEN connection serves the server's long polls"
    );
    sqlx::query("select sked.task_cancel($1)")
        .bind(id)
        .execute(&api.db.pool)
        .await
        .unwrap();
    let (status, body) = tokio::time::timeout(Duration::from_secs(20), poll)
        .await
        .expect("the poll answers once the connection is back")
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "cancelled");
}
