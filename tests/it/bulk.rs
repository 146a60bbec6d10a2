//! Bulk retry and bulk cancel (`POST /api/v1/tasks/retry`, `POST /api/v1/tasks/cancel`)
//! against a real server on a fresh database: the selection is a listing's query string, a
//! dry run counts exactly and changes nothing, a run changes at most `max` tasks of the
//! caller's, in batches, and counts the tasks whose state changed since the preview as
//! skipped; bad input is refused and changes nothing; `sked tasks retry` with `--yes`.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sked_db::listing::ListFilter;
use sked_db::testing::TestDb;
use sked_db::token::Role;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cli;

/// A server on a fresh database, and tokens for `alice` and `bob` (users) and an admin.
pub(crate) struct Server {
    pub(crate) db: TestDb,
    pub(crate) url: String,
    pub(crate) alice: String,
    pub(crate) bob: String,
    pub(crate) admin: String,
    shutdown: CancellationToken,
    http: reqwest::Client,
}

impl Server {
    pub(crate) async fn start() -> Server {
        let db = TestDb::new().await;
        let token = |owner: &'static str, role| {
            let pool = db.pool.clone();
            async move {
                sked_db::token::create(&pool, owner, role, "test")
                    .await
                    .unwrap()
            }
        };
        let alice = token("alice", Role::User).await;
        let bob = token("bob", Role::User).await;
        let admin = token("root", Role::Admin).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(sked_server::serve_configured(
            db.pool.clone(),
            listener,
            shutdown.clone(),
            sked_server::EventsConfig::default(),
            sked_server::Quotas::default(),
            sked_server::upkeep(&db.pool),
        ));
        Server {
            db,
            url,
            alice,
            bob,
            admin,
            shutdown,
            http: reqwest::Client::new(),
        }
    }

    /// `POST /api/v1/tasks/<action>?<query>` with `body`: the status and the JSON answer.
    pub(crate) async fn bulk(
        &self,
        token: &str,
        action: &str,
        query: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}/api/v1/tasks/{action}?{query}", self.url))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("every answer is JSON ({e}): {status} {text}"));
        (status, json)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Inserts `n` tasks of `owner` in `queue` and `state` (a final state: finished now, after
/// one attempt); their ids.
pub(crate) async fn tasks(
    pool: &PgPool,
    n: i64,
    owner: &str,
    queue: &str,
    state: &str,
) -> Vec<Uuid> {
    let finished = !matches!(state, "waiting" | "blocked" | "retry");
    sqlx::query_scalar(
        "insert into sked.tasks (owner, queue, command, state, attempt, started_at, finished_at)
         select $1, $2, array['send', i::text], $3,
                case when $4 then 1 else 0 end,
                case when $4 then now() end, case when $4 then now() end
           from generate_series(1, $5) i
         returning id",
    )
    .bind(owner)
    .bind(queue)
    .bind(state)
    .bind(finished)
    .bind(n)
    .fetch_all(pool)
    .await
    .expect("inserting tasks")
}

/// Every task's `owner/queue/state`, counted, sorted: what a test compares before and after.
pub(crate) async fn census(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as(
        "select owner || '/' || queue || '/' || state, count(*) from sked.tasks
          group by 1 order by 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn count(pool: &PgPool, owner: &str, queue: &str, state: &str) -> i64 {
    sqlx::query_scalar(
        "select count(*) from sked.tasks where owner = $1 and queue = $2 and state = $3",
    )
    .bind(owner)
    .bind(queue)
    .bind(state)
    .fetch_one(pool)
    .await
    .unwrap()
}

fn n(answer: &Value, field: &str) -> u64 {
    answer[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} is a count: {answer}"))
}

#[tokio::test]
async fn a_retry_previews_exactly_and_changes_at_most_max_of_the_callers_tasks() {
    let s = Server::start().await;
    let pool = &s.db.pool;
    tasks(pool, 10, "alice", "mail", "failed").await;
    tasks(pool, 3, "alice", "mail", "succeeded").await;
    tasks(pool, 2, "alice", "mail", "waiting").await;
    tasks(pool, 4, "alice", "other", "failed").await;
    tasks(pool, 5, "bob", "mail", "failed").await;
    let before = census(pool).await;

    // The preview: alice's failed tasks of queue mail, exactly; nothing changes.
    let (status, preview) = s
        .bulk(
            &s.alice,
            "retry",
            "state=failed&queue=mail",
            json!({"dry_run": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{preview}");
    assert_eq!(n(&preview, "matched"), 10, "{preview}");
    assert_eq!(
        preview["by_state"],
        json!([{"state": "failed", "count": 10}])
    );
    assert_eq!(preview["more"], json!(false));
    assert_eq!(n(&preview, "changed"), 0);
    assert_eq!(census(pool).await, before, "a dry run changes nothing");

    // Without a state, a retry applies to every finished task: failed and succeeded ones,
    // not the waiting ones.
    let (_, finished) = s
        .bulk(&s.alice, "retry", "queue=mail", json!({"dry_run": true}))
        .await;
    assert_eq!(n(&finished, "matched"), 13, "{finished}");
    // A state the action does not apply to selects nothing.
    let (_, none) = s
        .bulk(
            &s.alice,
            "retry",
            "state=waiting&queue=mail",
            json!({"dry_run": true}),
        )
        .await;
    assert_eq!(n(&none, "matched"), 0, "{none}");

    // A run with max below the count changes exactly max.
    let (status, run) = s
        .bulk(
            &s.alice,
            "retry",
            "state=failed&queue=mail",
            json!({"max": 4}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(
        (n(&run, "matched"), n(&run, "changed"), n(&run, "skipped")),
        (4, 4, 0),
        "{run}"
    );
    assert_eq!(
        run["more"],
        json!(true),
        "more failed tasks are left: {run}"
    );
    assert_eq!(count(pool, "alice", "mail", "failed").await, 6);
    assert_eq!(count(pool, "alice", "mail", "waiting").await, 2 + 4);
    assert_eq!(count(pool, "alice", "other", "failed").await, 4);
    assert_eq!(
        count(pool, "bob", "mail", "failed").await,
        5,
        "bob's tasks are untouched"
    );
    assert_eq!(count(pool, "alice", "mail", "succeeded").await, 3);

    // The rest, confirmed as previewed.
    let (_, preview) = s
        .bulk(
            &s.alice,
            "retry",
            "state=failed&queue=mail",
            json!({"dry_run": true}),
        )
        .await;
    assert_eq!(n(&preview, "matched"), 6);
    let (_, run) = s
        .bulk(
            &s.alice,
            "retry",
            "state=failed&queue=mail",
            json!({"max": 6}),
        )
        .await;
    assert_eq!((n(&run, "changed"), n(&run, "skipped")), (6, 0), "{run}");
    assert_eq!(run["more"], json!(false));
    assert_eq!(count(pool, "alice", "mail", "failed").await, 0);
    assert_eq!(
        count(pool, "bob", "mail", "failed").await,
        5,
        "bob's tasks are untouched"
    );

    // A user token may not name another owner; an admin acts on anyone's.
    let before = census(pool).await;
    let (status, refused) = s
        .bulk(&s.alice, "retry", "owner=bob", json!({"max": 5}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(refused["code"], json!("forbidden"));
    let (_, bobs) = s
        .bulk(&s.bob, "retry", "state=failed", json!({"dry_run": true}))
        .await;
    assert_eq!(n(&bobs, "matched"), 5, "bob sees his own: {bobs}");
    assert_eq!(census(pool).await, before, "a refusal changes nothing");
    let (_, all) = s
        .bulk(&s.admin, "retry", "state=failed", json!({"max": 9}))
        .await;
    assert_eq!(
        (n(&all, "changed"), n(&all, "skipped")),
        (9, 0),
        "bob's 5 and alice's 4 of queue other: {all}"
    );
}

#[tokio::test]
async fn a_cancel_of_the_waiting_tasks_of_one_queue_leaves_other_queues_alone() {
    let s = Server::start().await;
    let pool = &s.db.pool;
    tasks(pool, 6, "alice", "mail", "waiting").await;
    tasks(pool, 2, "alice", "mail", "failed").await;
    tasks(pool, 5, "alice", "reports", "waiting").await;
    tasks(pool, 3, "bob", "mail", "waiting").await;

    let (_, preview) = s
        .bulk(
            &s.admin,
            "cancel",
            "state=waiting&queue=mail&owner=alice",
            json!({"dry_run": true}),
        )
        .await;
    assert_eq!(n(&preview, "matched"), 6, "{preview}");
    // Without a state, a cancel applies to unfinished tasks only.
    let (_, unfinished) = s
        .bulk(&s.alice, "cancel", "queue=mail", json!({"dry_run": true}))
        .await;
    assert_eq!(n(&unfinished, "matched"), 6, "{unfinished}");

    let (status, run) = s
        .bulk(
            &s.alice,
            "cancel",
            "state=waiting&queue=mail",
            json!({"max": 6}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(
        (
            n(&run, "changed"),
            n(&run, "skipped"),
            n(&run, "cancel_requested")
        ),
        (6, 0, 0),
        "{run}"
    );
    assert_eq!(count(pool, "alice", "mail", "cancelled").await, 6);
    assert_eq!(count(pool, "alice", "mail", "failed").await, 2);
    assert_eq!(
        count(pool, "alice", "reports", "waiting").await,
        5,
        "another queue"
    );
    assert_eq!(
        count(pool, "bob", "mail", "waiting").await,
        3,
        "another owner"
    );
}

#[tokio::test]
async fn a_selection_of_more_than_one_batch_is_changed_whole() {
    let s = Server::start().await;
    let pool = &s.db.pool;
    let total = 1_200;
    tasks(pool, total, "alice", "mail", "failed").await;
    tasks(pool, 300, "alice", "mail", "succeeded").await;
    let (_, preview) = s
        .bulk(&s.alice, "retry", "state=failed", json!({"dry_run": true}))
        .await;
    assert_eq!(n(&preview, "matched"), total as u64, "{preview}");
    let started = std::time::Instant::now();
    let (status, run) = s
        .bulk(&s.alice, "retry", "state=failed", json!({"max": total}))
        .await;
    eprintln!("{total} tasks retried in {:?}", started.elapsed());
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(
        (n(&run, "changed"), n(&run, "skipped")),
        (total as u64, 0),
        "{run}"
    );
    assert_eq!(count(pool, "alice", "mail", "failed").await, 0);
    assert_eq!(count(pool, "alice", "mail", "waiting").await, total);
    assert_eq!(count(pool, "alice", "mail", "succeeded").await, 300);
}

#[tokio::test]
async fn a_task_that_finishes_between_preview_and_run_is_skipped() {
    let s = Server::start().await;
    let pool = &s.db.pool;
    let ids = tasks(pool, 5, "alice", "mail", "waiting").await;
    let (_, preview) = s
        .bulk(&s.alice, "cancel", "queue=mail", json!({"dry_run": true}))
        .await;
    assert_eq!(n(&preview, "matched"), 5);
    // One of them runs and succeeds meanwhile.
    sqlx::query(
        "update sked.tasks set state = 'succeeded', attempt = 1, started_at = now(),
                finished_at = now() where id = $1",
    )
    .bind(ids[2])
    .execute(pool)
    .await
    .unwrap();
    let (_, run) = s
        .bulk(&s.alice, "cancel", "queue=mail", json!({"max": 5}))
        .await;
    assert_eq!(
        (n(&run, "matched"), n(&run, "changed"), n(&run, "skipped")),
        (4, 4, 1),
        "{run}"
    );
    assert_eq!(crate::support::state(pool, ids[2]).await, "succeeded");
    assert_eq!(count(pool, "alice", "mail", "cancelled").await, 4);
}

/// A task that changes between the selection and its batch: the batch's statement tests the
/// state again and leaves it, uncounted.
#[tokio::test]
async fn a_batch_leaves_a_task_whose_state_changed_since_the_selection() {
    let db = TestDb::new().await;
    let ids = tasks(&db.pool, 4, "alice", "mail", "failed").await;
    let filter = ListFilter {
        owner: Some("alice".into()),
        ..ListFilter::default()
    };
    let action = sked_db::bulk::Action::Retry;
    let selection = sked_db::bulk::select(&db.pool, &filter, action, 100)
        .await
        .unwrap();
    assert_eq!(selection.ids.len(), 4);
    assert_eq!(selection.by_state, vec![(sked_types::TaskState::Failed, 4)]);
    // Someone retries one first.
    sked_db::task::retry(&db.pool, ids[0]).await.unwrap();
    let attempt_before: i32 =
        sqlx::query_scalar("select max_attempts from sked.tasks where id = $1")
            .bind(ids[0])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let acted = sked_db::bulk::act_all(&db.pool, action, &selection.ids)
        .await
        .unwrap();
    assert_eq!(acted.changed, 3);
    let attempt_after: i32 =
        sqlx::query_scalar("select max_attempts from sked.tasks where id = $1")
            .bind(ids[0])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        attempt_before, attempt_after,
        "the task retried meanwhile is not retried again"
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_json_and_changes_nothing() {
    let s = Server::start().await;
    let pool = &s.db.pool;
    tasks(pool, 3, "alice", "mail", "failed").await;
    tasks(pool, 3, "alice", "mail", "waiting").await;
    let before = census(pool).await;
    let cases: &[(&str, &str, Value, &str)] = &[
        (
            "retry",
            "state=failed",
            json!({"max": 0}),
            "between 1 and 100000",
        ),
        (
            "retry",
            "state=failed",
            json!({"max": 100_001}),
            "between 1 and 100000",
        ),
        (
            "cancel",
            "",
            json!({"max": 100_001}),
            "between 1 and 100000",
        ),
        ("retry", "state=failed", json!({}), "max is required"),
        (
            "retry",
            "state=failed",
            json!({"dry_run": false}),
            "max is required",
        ),
        ("retry", "state=failed", json!({"max": null}), "max"),
        (
            "retry",
            "state=failed",
            json!({"max": 3, "all": true}),
            "all",
        ),
        ("retry", "state=failed", json!({"max": -1}), "max"),
        (
            "retry",
            "state=failed&after=0190a8a0-0000-7000-8000-000000000000",
            json!({"max": 3}),
            "after",
        ),
        ("cancel", "limit=10", json!({"max": 3}), "limit"),
        ("cancel", "view=summary", json!({"dry_run": true}), "view"),
        ("retry", "state=finished", json!({"max": 3}), "finished"),
        ("retry", "colour=red", json!({"max": 3}), "colour"),
    ];
    for (action, query, body, says) in cases {
        let (status, answer) = s.bulk(&s.alice, action, query, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{action}?{query} {body}: {answer}"
        );
        assert_eq!(answer["code"], json!("invalid_request"), "{answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains(says), "{action}?{query} {body}: {message}");
    }
    let response = s
        .http
        .post(format!("{}/api/v1/tasks/retry?state=failed", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        census(pool).await,
        before,
        "no refused request changed anything"
    );
}

#[tokio::test]
async fn sked_tasks_retry_with_yes_retries_what_it_counted() {
    let s = Server::start().await;
    let pool = &s.db.pool;
    tasks(pool, 7, "alice", "mail", "failed").await;
    tasks(pool, 2, "alice", "reports", "failed").await;
    tasks(pool, 4, "bob", "mail", "failed").await;
    let out = cli::output(
        cli::sked()
            .args([
                "tasks", "retry", "--state", "failed", "--queue", "mail", "--yes",
            ])
            .args(["--url", &s.url, "--token", &s.alice]),
    )
    .await;
    let stdout = cli::text(&out.stdout);
    let stderr = cli::text(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("7 failed"),
        "it says how many it acts on: {stdout}{stderr}"
    );
    assert!(stdout.contains("retried 7"), "{stdout}{stderr}");
    assert_eq!(count(pool, "alice", "mail", "failed").await, 0);
    assert_eq!(count(pool, "alice", "mail", "waiting").await, 7);
    assert_eq!(count(pool, "alice", "reports", "failed").await, 2);
    assert_eq!(count(pool, "bob", "mail", "failed").await, 4);

    // Without --yes and without a terminal, it shows the count and changes nothing.
    let out = cli::output(
        cli::sked()
            .args(["tasks", "retry", "--queue", "reports"])
            .args(["--url", &s.url, "--token", &s.alice]),
    )
    .await;
    assert!(!out.status.success(), "{out:?}");
    assert!(cli::text(&out.stderr).contains("--yes"), "{out:?}");
    assert_eq!(count(pool, "alice", "reports", "failed").await, 2);

    // --dry-run only counts.
    let out = cli::output(
        cli::sked()
            .args(["tasks", "retry", "--queue", "reports", "--dry-run"])
            .args(["--url", &s.url, "--token", &s.alice]),
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(cli::text(&out.stdout).contains("2 failed"), "{out:?}");
    assert_eq!(count(pool, "alice", "reports", "failed").await, 2);
}

/// Waits until the first element `css` matches holds `text`.
async fn wait_text(b: &crate::browser::Browser, what: &str, css: &str, text: &str) {
    b.wait_js(
        what,
        &format!(
            "document.querySelector({})?.textContent.includes({})",
            json!(css),
            json!(text)
        ),
    )
    .await;
}

/// The task list's "Retry all" and "Cancel all" in a headless Chromium against a real
/// `sked-server`: the dry run's count asked first, nothing changed until confirmed, then
/// exactly the shown tasks changed and the result said; screenshots in
/// `target/test-output/dashboard/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_lists_retry_all_and_cancel_all_ask_with_the_count_then_act() {
    use crate::browser::Browser;
    use crate::dashboard::{Server as Dashboard, assert_quiet_console, open_signed_in, token_for};

    let db = TestDb::new().await;
    let server = Dashboard::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let pool = &db.pool;
    tasks(pool, 12, "alice", "mail", "failed").await;
    tasks(pool, 3, "alice", "other", "failed").await;
    tasks(pool, 4, "alice", "mail", "waiting").await;
    tasks(pool, 5, "bob", "mail", "failed").await;

    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    // Signing in through the link lands on the page without its query: the filters come
    // with the address after.
    open_signed_in(&b, &server, "/tasks", &alice).await;
    b.goto(&format!("{}/tasks?state=failed&queue=mail", server.url))
        .await;
    b.wait("[data-action=retry-all]").await;
    assert!(
        !b.exists("[data-action=cancel-all]").await,
        "no cancel for a list of failed tasks"
    );
    b.wait("[data-action=retry-all]")
        .await
        .click()
        .await
        .unwrap();
    wait_text(
        &b,
        "the question with the dry run's count",
        "[data-confirm=bulk]",
        "Retry 12 failed tasks in queue mail?",
    )
    .await;
    wait_text(
        &b,
        "the confirming button with the count",
        "[data-action=confirm-bulk]",
        "Retry 12 tasks",
    )
    .await;
    b.screenshot("bulk-retry-confirm").await;
    assert_eq!(
        count(pool, "alice", "mail", "failed").await,
        12,
        "asking changes nothing"
    );

    b.wait("[data-action=confirm-bulk]")
        .await
        .click()
        .await
        .unwrap();
    wait_text(&b, "the result", "[data-done=bulk]", "Retried 12 tasks").await;
    b.screenshot("bulk-retry-done").await;
    assert_eq!(count(pool, "alice", "mail", "failed").await, 0);
    assert_eq!(count(pool, "alice", "mail", "waiting").await, 16);
    assert_eq!(
        count(pool, "alice", "other", "failed").await,
        3,
        "another queue"
    );
    assert_eq!(
        count(pool, "bob", "mail", "failed").await,
        5,
        "another owner"
    );

    // Cancel all of the waiting tasks of queue mail: "Leave them" changes nothing, the
    // confirmation cancels them.
    b.goto(&format!("{}/tasks?state=waiting&queue=mail", server.url))
        .await;
    b.wait("[data-action=cancel-all]")
        .await
        .click()
        .await
        .unwrap();
    wait_text(
        &b,
        "the question",
        "[data-confirm=bulk]",
        "Cancel 16 waiting tasks in queue mail?",
    )
    .await;
    b.wait("[data-action=keep]").await.click().await.unwrap();
    b.wait("[data-action=cancel-all]").await;
    assert_eq!(count(pool, "alice", "mail", "waiting").await, 16);
    b.wait("[data-action=cancel-all]")
        .await
        .click()
        .await
        .unwrap();
    b.wait("[data-action=confirm-bulk]")
        .await
        .click()
        .await
        .unwrap();
    wait_text(&b, "the result", "[data-done=bulk]", "Cancelled 16 tasks").await;
    b.screenshot("bulk-cancel-done").await;
    assert_eq!(count(pool, "alice", "mail", "waiting").await, 0);
    assert_eq!(count(pool, "alice", "mail", "cancelled").await, 16);
    assert_eq!(count(pool, "bob", "mail", "failed").await, 5);

    // An admin's list without an owner takes every owner's tasks, and the question says so.
    let admin = token_for(&db, "ops", Role::Admin).await;
    open_signed_in(&b, &server, "/tasks", &admin).await;
    b.goto(&format!("{}/tasks?state=failed", server.url)).await;
    b.wait("[data-action=retry-all]")
        .await
        .click()
        .await
        .unwrap();
    wait_text(
        &b,
        "the question naming every owner",
        "[data-confirm=bulk]",
        "Retry 8 failed tasks of every owner?",
    )
    .await;
    b.wait("[data-action=keep]").await.click().await.unwrap();
    b.wait("[data-action=retry-all]").await;
    assert_eq!(
        count(pool, "bob", "mail", "failed").await,
        5,
        "left as they were"
    );
    assert_quiet_console(b.console_errors().await);
    b.close().await;
}

/// Running tasks are asked to stop, counted apart, and their worker ends them `cancelled`;
/// a second cancel finds nothing left to ask.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_asks_running_tasks_to_stop_once() {
    let s = Server::start().await;
    let pool = &s.db.pool;
    let worker = crate::support::start_worker(&s.db, crate::support::config(&["mail"]));
    let mut running = Vec::new();
    for _ in 0..2 {
        running.push(
            crate::support::insert(
                pool,
                "(owner, queue, command) values ('alice', 'mail', array['sleep', '30'])",
            )
            .await,
        );
    }
    let delayed = crate::support::insert(
        pool,
        "(owner, queue, command, next_run_at)
         values ('alice', 'mail', array['true'], now() + interval '1 hour')",
    )
    .await;
    for id in &running {
        crate::support::wait_for(pool, *id, &["running"], Duration::from_secs(15)).await;
    }
    let (_, preview) = s
        .bulk(&s.alice, "cancel", "queue=mail", json!({"dry_run": true}))
        .await;
    assert_eq!(n(&preview, "matched"), 3, "{preview}");
    assert_eq!(
        preview["by_state"],
        json!([{"state": "waiting", "count": 1}, {"state": "running", "count": 2}])
    );
    let (_, run) = s
        .bulk(&s.alice, "cancel", "queue=mail", json!({"max": 3}))
        .await;
    assert_eq!(
        (
            n(&run, "changed"),
            n(&run, "cancel_requested"),
            n(&run, "skipped")
        ),
        (3, 2, 0),
        "{run}"
    );
    assert_eq!(crate::support::state(pool, delayed).await, "cancelled");
    // Asked once: until their worker has stopped them, they are nothing left to cancel.
    let (_, again) = s
        .bulk(&s.alice, "cancel", "queue=mail", json!({"dry_run": true}))
        .await;
    assert_eq!(n(&again, "matched"), 0, "{again}");
    for id in &running {
        crate::support::wait_for(pool, *id, &["cancelled"], Duration::from_secs(15)).await;
    }
    worker.shutdown().await;
}
