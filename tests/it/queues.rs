//! Queue controls: pause and resume, a cluster-wide concurrency limit and a rate limit that
//! hold with several real workers racing, the REST endpoints (admin only) and the CLI, and
//! bad values refused with nothing changed.

use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::json;
use sked_db::testing::TestDb;
use sqlx::PgPool;

use crate::placement::{db_now, drained, register, sample_running};
use crate::support::{TestWorker, config, insert, start_worker_on, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// `n` workers of `queue` with `slots` each, every one on a pool of its own (as separate
/// processes would be).
async fn workers(db: &TestDb, queue: &str, n: usize, slots: usize) -> Vec<TestWorker> {
    let mut started = Vec::new();
    for i in 0..n {
        let pool = sked_db::connect(&db.url, "test-worker", 6).await.unwrap();
        let mut c = config(&[queue]);
        c.concurrency = slots;
        c.name = Some(format!("racer-{i}"));
        started.push(start_worker_on(&pool, c));
    }
    started
}

async fn controls(pool: &PgPool) -> Vec<(String, bool, Option<i32>, Option<f64>, Option<i32>)> {
    sqlx::query_as(
        "select name, paused_at is not null, max_running, rate_per_sec, burst
           from sked.queues order by name",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_paused_queue_is_not_claimed_and_a_resumed_one_is() {
    let db = TestDb::new().await;
    sqlx::query(
        "insert into sked.tasks (kind, queue) values ('noop', 'mail'), ('noop', 'mail'), ('noop', 'other')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let now = db_now(&db.pool).await;
    let w = register(&db.pool, &["mail", "other"], &[], None, None, now).await;
    sqlx::query("select sked.queue_pause('mail', $1)")
        .bind(now)
        .execute(&db.pool)
        .await
        .unwrap();
    let claim = |queues: &'static [&'static str]| {
        let pool = db.pool.clone();
        async move {
            let q: Vec<String> = queues.iter().map(|q| q.to_string()).collect();
            sqlx::query_scalar::<_, String>(
                "select queue from sked.tasks_claim($1, $2, '{}', 10, '30 seconds', null, null, $3)",
            )
            .bind(w)
            .bind(q)
            .bind(now)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    assert!(
        claim(&["mail"]).await.is_empty(),
        "a paused queue is not claimed"
    );
    assert_eq!(
        claim(&["mail", "other"]).await,
        ["other"],
        "a worker of several queues takes from those not paused"
    );
    sqlx::query("select sked.queue_resume('mail', $1)")
        .bind(now)
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        claim(&["mail"]).await,
        ["mail", "mail"],
        "resumed, it is claimed"
    );
    assert!(
        controls(&db.pool).await.is_empty(),
        "a queue left without controls has no row"
    );
}

#[tokio::test]
async fn a_real_worker_leaves_a_paused_queue_alone_and_wakes_when_it_is_resumed() {
    let db = TestDb::new().await;
    let mut c = config(&["mail"]);
    // A poll far longer than the test: only the resume's notification can wake the worker.
    c.poll_interval = 60 * SECS;
    let worker = crate::support::start_worker(&db, c);
    let long = insert(
        &db.pool,
        "(kind, queue, input) values ('sleep', 'mail', '{\"seconds\": 1}')",
    )
    .await;
    wait_for(&db.pool, long, &["running"], 10 * SECS).await;
    let paused: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("select paused_at from sked.queue_pause('mail')")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(paused.is_some());
    let id = insert(&db.pool, "(kind, queue) values ('noop', 'mail')").await;
    wait_for(&db.pool, long, &["succeeded"], 10 * SECS).await;
    tokio::time::sleep(SECS / 2).await;
    assert_eq!(
        crate::support::state(&db.pool, id).await,
        "waiting",
        "a paused queue's task waits; the one already running finished"
    );
    let why = sked_db::queue::waiting_reasons(&db.pool, id).await.unwrap();
    assert_eq!(why[0].code, "queue_paused", "{why:?}");
    let resumed_at = tokio::time::Instant::now();
    sqlx::query("select sked.queue_resume('mail')")
        .execute(&db.pool)
        .await
        .unwrap();
    wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    assert!(
        resumed_at.elapsed() < 2 * SECS,
        "the resume wakes the worker, which does not wait for its poll ({:?})",
        resumed_at.elapsed()
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_concurrency_limit_of_3_holds_with_4_workers_racing() {
    let db = TestDb::new().await;
    sqlx::query("select sked.queue_set_limits('limited', 3, null)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "insert into sked.tasks (kind, queue, input)
         select 'sleep', 'limited', '{\"seconds\": 0.2}' from generate_series(1, 30)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let racers = workers(&db, "limited", 4, 4).await;
    let most = sample_running(
        &db.pool,
        "limited",
        None,
        drained(&db.pool, "limited"),
        60 * SECS,
    )
    .await;
    assert_eq!(
        most, 3,
        "never more than 3 of the queue's tasks run at once over all workers, and the limit is used"
    );
    let (succeeded, workers_used): (i64, i64) = sqlx::query_as(
        "select count(*) filter (where state = 'succeeded'), count(distinct worker_id)
           from sked.tasks where queue = 'limited'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(succeeded, 30, "every task ran");
    assert!(
        workers_used >= 2,
        "the workers raced for the queue ({workers_used} of them ran tasks)"
    );
    for w in racers {
        w.shutdown().await;
    }
}

#[tokio::test]
async fn a_rate_limit_of_10_per_second_holds_within_10_percent_over_30_seconds() {
    let db = TestDb::new().await;
    sqlx::query("select sked.queue_set_limits('paced', null, 10)")
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "insert into sked.tasks (kind, queue) select 'noop', 'paced' from generate_series(1, 400)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let racers = workers(&db, "paced", 3, 50).await;
    // Wait until 33 s after the first start.
    let deadline = tokio::time::Instant::now() + 60 * SECS;
    loop {
        let span: Option<f64> = sqlx::query_scalar(
            "select extract(epoch from now() - min(started_at))::float8 from sked.tasks
              where queue = 'paced' and started_at is not null",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if span.is_some_and(|s| s > 33.0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "tasks should start");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for w in racers {
        w.shutdown().await;
    }
    // The 30 s from 2 s after the first start (past the first burst of 10).
    let (in_window, most_in_a_second): (i64, i64) = sqlx::query_as(
        "with s as (select started_at from sked.tasks where queue = 'paced' and started_at is not null),
              f as (select min(started_at) as first from s)
         select (select count(*) from s, f
                  where started_at >= first + interval '2 s' and started_at < first + interval '32 s'),
                (select max(n) from (select (select count(*) from s b
                                              where b.started_at >= a.started_at
                                                and b.started_at < a.started_at + interval '1 s') as n
                                       from s a) x)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    eprintln!(
        "rate limit 10/s: {in_window} starts in 30 s, at most {most_in_a_second} in one second"
    );
    assert!(
        (270..=330).contains(&in_window),
        "10 starts per second hold within 10 % over 30 s: {in_window} started"
    );
    assert!(
        most_in_a_second <= 21,
        "no second starts more than the burst (10) and the rate (10): {most_in_a_second}"
    );
}

#[tokio::test]
async fn bad_limits_are_refused_in_sql_and_change_nothing() {
    let db = TestDb::new().await;
    sqlx::query("select sked.queue_set_limits('q', 5, 2.5, 4)")
        .execute(&db.pool)
        .await
        .unwrap();
    let before = controls(&db.pool).await;
    assert_eq!(
        before,
        [("q".to_owned(), false, Some(5), Some(2.5), Some(4))]
    );
    for (call, rule) in [
        (
            "sked.queue_set_limits('q', 0, null)",
            "queues_max_running_must_be_1_to_1000000",
        ),
        (
            "sked.queue_set_limits('q', -3, null)",
            "queues_max_running_must_be_1_to_1000000",
        ),
        (
            "sked.queue_set_limits('q', null, 0)",
            "queues_rate_per_sec_must_be_positive_and_at_most_1000000",
        ),
        (
            "sked.queue_set_limits('q', null, 'NaN')",
            "queues_rate_per_sec_must_be_positive_and_at_most_1000000",
        ),
        (
            "sked.queue_set_limits('q', null, 'Infinity')",
            "queues_rate_per_sec_must_be_positive_and_at_most_1000000",
        ),
        (
            "sked.queue_set_limits('q', null, 5, 0)",
            "queues_burst_must_be_1_to_1000000",
        ),
        (
            "sked.queue_set_limits('q', 1, null, 3)",
            "queues_burst_needs_a_rate",
        ),
        (
            "sked.queue_set_limits('bad queue!', 1, null)",
            "queues_name_must_be_1_to_64_word_characters",
        ),
        (
            "sked.queue_pause('')",
            "queues_name_must_be_1_to_64_word_characters",
        ),
        (
            "sked.queue_resume('-x')",
            "queues_name_must_be_1_to_64_word_characters",
        ),
    ] {
        let err = sqlx::query(sqlx::AssertSqlSafe(format!("select {call}")))
            .execute(&db.pool)
            .await
            .unwrap_err();
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.constraint(), Some(rule), "{call}: {db_err}");
        assert_eq!(db_err.code().as_deref(), Some("23514"), "{call}");
        assert!(
            db_err.message().starts_with("sked.queues: "),
            "{call}: {db_err}"
        );
    }
    let err = sqlx::query("insert into sked.queues (name) values ('plain')")
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert_eq!(
        err.as_database_error().unwrap().constraint(),
        Some("queues_row_has_a_control"),
        "a row without a control is refused"
    );
    assert_eq!(controls(&db.pool).await, before, "nothing changed");
}

#[tokio::test]
async fn rest_queue_controls_are_for_admins_and_shown_by_get_queues() {
    let api = crate::api::Api::new().await;
    insert(&api.db.pool, "(kind, queue) values ('noop', 'mail')").await;

    let (status, body) = api
        .post("/api/v1/queues/mail/pause", &api.alice, json!({}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["code"], "forbidden");
    let (status, body) = api
        .call(
            Method::PATCH,
            "/api/v1/queues/mail",
            &api.alice,
            Some(json!({"max_running": 2})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        controls(&api.db.pool).await.is_empty(),
        "a user changed nothing"
    );

    let (status, body) = api
        .post("/api/v1/queues/mail/pause", &api.admin, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["queue"], "mail");
    assert!(body["paused_at"].is_string(), "{body}");
    let (status, body) = api
        .call(
            Method::PATCH,
            "/api/v1/queues/mail",
            &api.admin,
            Some(json!({"max_running": 3, "rate_per_sec": 2.5})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["max_running"], &body["rate_per_sec"], &body["burst"]),
        (&json!(3), &json!(2.5), &json!(3)),
        "the burst defaults to the rate rounded up: {body}"
    );
    assert!(
        body["paused_at"].is_string(),
        "limits keep the pause: {body}"
    );
    // Another, empty queue with a limit is listed too; a user sees the controls.
    let (status, _) = api
        .call(
            Method::PATCH,
            "/api/v1/queues/idle",
            &api.admin,
            Some(json!({"max_running": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, queues) = api.get("/api/v1/queues", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = queues
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["idle", "mail"], "{queues}");
    assert_eq!(queues[1]["max_running"], 3);
    assert!(queues[1]["paused_at"].is_string());
    assert_eq!(queues[0]["max_running"], 1);

    // PATCH changes only what it names; null removes; the rate's burst goes with it.
    let (status, body) = api
        .call(
            Method::PATCH,
            "/api/v1/queues/mail",
            &api.admin,
            Some(json!({"rate_per_sec": null})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["max_running"], &body["rate_per_sec"], &body["burst"]),
        (&json!(3), &json!(null), &json!(null)),
        "{body}"
    );
    let (status, body) = api
        .post("/api/v1/queues/mail/resume", &api.admin, json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["paused_at"].is_null(), "{body}");

    // Bad values: a readable 4xx, nothing changed.
    let before = controls(&api.db.pool).await;
    for (body, status, says) in [
        (
            json!({"max_running": 0}),
            StatusCode::BAD_REQUEST,
            "max_running must be between 1 and 1000000",
        ),
        (
            json!({"rate_per_sec": -1}),
            StatusCode::BAD_REQUEST,
            "rate_per_sec must be more than 0",
        ),
        (
            json!({"burst": 0}),
            StatusCode::BAD_REQUEST,
            "burst must be between 1 and 1000000",
        ),
        (
            json!({"burst": 5}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "burst needs rate_per_sec",
        ),
        (
            json!({"max_runing": 5}),
            StatusCode::BAD_REQUEST,
            "unknown field",
        ),
        (
            json!({"max_running": "many"}),
            StatusCode::BAD_REQUEST,
            "invalid type",
        ),
    ] {
        let (got, answer) = api
            .call(
                Method::PATCH,
                "/api/v1/queues/mail",
                &api.admin,
                Some(body.clone()),
            )
            .await;
        assert_eq!(got, status, "{body}: {answer}");
        assert!(
            answer["message"].as_str().unwrap().contains(says),
            "{body}: {answer}"
        );
    }
    let (got, answer) = api
        .post("/api/v1/queues/bad%20name/pause", &api.admin, json!({}))
        .await;
    assert_eq!(got, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("queue name must be 1 to 64"),
        "{answer}"
    );
    assert_eq!(controls(&api.db.pool).await, before, "nothing changed");

    let (_, doc) = api.get("/api/v1/openapi.json", &api.admin).await;
    for path in [
        "/api/v1/queues/{name}",
        "/api/v1/queues/{name}/pause",
        "/api/v1/queues/{name}/resume",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} is documented");
    }
}

#[tokio::test]
async fn cli_pauses_resumes_and_limits_queues() {
    let api = crate::cli::Api::start().await;
    insert(&api.db.pool, "(kind, queue) values ('noop', 'mail')").await;
    let out = api.ok(&["queue", "pause", "mail"]).await;
    assert!(out.starts_with("mail: paused since "), "{out}");
    let out = api
        .ok(&[
            "queue",
            "limit",
            "mail",
            "--max-running",
            "3",
            "--rate",
            "10",
        ])
        .await;
    assert!(out.contains("max 3 running, 10/s (burst 10)"), "{out}");
    let out = api.ok(&["queue", "list"]).await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("mail ") && l.contains("paused since")),
        "{out}"
    );
    let out = api.ok(&["queue", "limit", "mail", "--rate", "none"]).await;
    assert!(
        out.contains("max 3 running") && !out.contains("/s"),
        "{out}"
    );
    let out = api.ok(&["queue", "resume", "mail"]).await;
    assert_eq!(out.trim(), "mail: active, max 3 running");

    let before = controls(&api.db.pool).await;
    for args in [
        &["queue", "limit", "mail", "--max-running", "0"][..],
        &["queue", "limit", "mail", "--rate", "-1"],
        &["queue", "limit", "mail", "--burst", "x"],
        &["queue", "limit", "mail"],
        &["queue", "pause", "bad name"],
    ] {
        let out = crate::cli::output(&mut api.sked(args)).await;
        let stderr = crate::cli::text(&out.stderr);
        assert!(!out.status.success(), "{args:?} fails");
        assert!(!stderr.trim().is_empty(), "{args:?} says why");
    }
    assert_eq!(controls(&api.db.pool).await, before, "nothing changed");
}

#[tokio::test]
async fn a_resume_racing_the_removal_of_the_limits_leaves_a_valid_row() {
    // A paused queue with a limit: one session removes the limit while another resumes it.
    // Whichever commits first, the row ends with a control or is gone; the resume is never
    // refused by the rule that a row has a control.
    let db = TestDb::new().await;
    for sql in [
        "select sked.queue_set_limits('q', 5, null)",
        "select sked.queue_pause('q')",
    ] {
        sqlx::query(sql).execute(&db.pool).await.unwrap();
    }
    let mut removing = db.pool.begin().await.unwrap();
    sqlx::query("select sked.queue_set_limits('q', null, null)")
        .execute(&mut *removing)
        .await
        .unwrap();
    let pool = db.pool.clone();
    let resume = tokio::spawn(async move {
        sqlx::query("select sked.queue_resume('q')")
            .execute(&pool)
            .await
    });
    // The resume runs into the removal's lock on the row, then goes on after its commit.
    tokio::time::sleep(Duration::from_millis(500)).await;
    removing.commit().await.unwrap();
    resume
        .await
        .unwrap()
        .expect("the resume succeeds after the concurrent removal of the limits");
    let rows: i64 = sqlx::query_scalar("select count(*) from sked.queues where name = 'q'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "a queue left without any control has no row");
}
