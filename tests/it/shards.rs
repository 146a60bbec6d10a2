//! Tests of sharded and broadcast tasks (docs/shards.md): real workers running shards in
//! parallel and failing over, the parent settled by the DAG machinery, the claim's spreading
//! and pinning rules with time as an input, and rejected submissions.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{config, start_worker, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// One shard as the tests look at it.
#[derive(Debug, sqlx::FromRow)]
struct Shard {
    id: Uuid,
    shard_index: i32,
    shard_total: i32,
    state: String,
    attempt: i32,
    worker_id: Option<Uuid>,
    pinned_worker: Option<Uuid>,
    stdout_tail: Option<String>,
    error: Option<String>,
}

async fn shards(pool: &PgPool, parent: Uuid) -> Vec<Shard> {
    sqlx::query_as(
        "select id, shard_index, shard_total, state, attempt, worker_id, pinned_worker,
                stdout_tail, error
           from sked.tasks where shard_of = $1 order by shard_index",
    )
    .bind(parent)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn submit(pool: &PgPool, call: &str) -> Uuid {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select {call}")))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{call} should be accepted: {e}"))
}

/// The constraint named by a rejected statement.
async fn rejected(pool: &PgPool, sql: &str) -> String {
    let err = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .expect_err(sql);
    let db = err.as_database_error().expect("a database error");
    assert_eq!(
        db.code().as_deref(),
        Some("23514"),
        "{sql}: check_violation"
    );
    db.constraint().unwrap_or_default().to_owned()
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select count(*) from {sql}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn row(pool: &PgPool, id: Uuid) -> (String, Option<String>, Option<Value>) {
    sqlx::query_as("select state, error, output from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Claims what `worker` may claim at `now` (up to 10): the shard indexes it took.
async fn claim(pool: &PgPool, worker: Uuid, now: DateTime<Utc>) -> Vec<i32> {
    sqlx::query_scalar(
        "select shard_index from sked.tasks_claim($1, '{default}', '{}', 10, '30 seconds', $2)
          order by shard_index",
    )
    .bind(worker)
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Finishes the running attempts of these tasks with `outcome` at `now`.
async fn finish(pool: &PgPool, ids: &[Uuid], outcome: &str, now: DateTime<Utc>) {
    let changed: i64 = sqlx::query_scalar(
        "select count(*) from sked.tasks t,
                sked.tasks_finish(array[t.id], array[t.attempt], array[$2], array[0], array['x'],
                                  array[null], array[null], array[null],
                                  array[to_jsonb(t.shard_index)], $3) f
          where t.id = any($1)",
    )
    .bind(ids)
    .bind(outcome)
    .bind(now)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(changed, ids.len() as i64, "every attempt was running");
}

/// A registered worker whose last heartbeat was at `at`.
async fn register(pool: &PgPool, labels: &[&str], at: DateTime<Utc>) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "select sked.worker_register($1, 'w', 'host', 1, 'test', '{default}', $2, 4,
                                     '30 seconds', $3)",
    )
    .bind(id)
    .bind(labels)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// The database clock, read once: tests move time from there.
async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("select now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_four_shard_job_runs_on_two_workers_and_succeeds_with_their_outputs() {
    let db = TestDb::new().await;
    // Two slots each: one worker can never hold all four shards, and while shards are new a
    // worker running one passes over the others, so both workers run some.
    let mut a = config(&["default"]);
    a.concurrency = 2;
    let mut b = config(&["default"]);
    b.concurrency = 2;
    let a = start_worker(&db, a);
    let b = start_worker(&db, b);
    let parent = submit(
        &db.pool,
        r#"sked.task_submit(command => array['sh', '-c',
             'sleep 1; echo "{\"index\": $SKED_SHARD_INDEX, \"total\": $SKED_SHARD_TOTAL}"'],
           shards => 4)"#,
    )
    .await;

    wait_for(&db.pool, parent, &["succeeded"], 30 * SECS).await;
    let shards = shards(&db.pool, parent).await;
    assert_eq!(
        shards.len(),
        4,
        "a task with shards = 4 runs as four shards"
    );
    for (i, s) in shards.iter().enumerate() {
        assert_eq!((s.shard_index, s.shard_total), (i as i32, 4));
        assert_eq!(s.state, "succeeded", "shard {i}: {:?}", s.error);
        let stdout = s.stdout_tail.as_deref().unwrap_or_default();
        assert!(
            stdout.contains(&format!("{{\"index\": {i}, \"total\": 4}}")),
            "shard {i} saw SKED_SHARD_INDEX={i} and SKED_SHARD_TOTAL=4: {stdout:?}"
        );
    }
    let workers: BTreeSet<Uuid> = shards.iter().filter_map(|s| s.worker_id).collect();
    assert_eq!(workers.len(), 2, "both workers ran shards: {shards:?}");
    let (_, error, output) = row(&db.pool, parent).await;
    assert_eq!(error, None);
    assert_eq!(
        output,
        Some(json!([
            {"index": 0, "total": 4},
            {"index": 1, "total": 4},
            {"index": 2, "total": 4},
            {"index": 3, "total": 4}
        ])),
        "the parent's output is its shards' outputs by index"
    );
    let attempts = count(
        &db.pool,
        &format!("sked.task_attempt_history where task_id = '{parent}'"),
    )
    .await;
    assert_eq!(attempts, 0, "the parent itself never runs");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_shard_fails_over_to_another_worker_when_its_worker_is_killed() {
    let db = TestDb::new().await;
    // The first attempt of each shard hangs; the worker running them is killed (kill -9).
    let parent = submit(
        &db.pool,
        r#"sked.task_submit(command => array['sh', '-c',
             'if [ "$SKED_ATTEMPT" = 1 ]; then sleep 300; fi; echo "shard $SKED_SHARD_INDEX"'],
           shards => 2)"#,
    )
    .await;
    let mut victim = std::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"))
        .env("DATABASE_URL", &db.url)
        .args(["--lease-secs", "2", "--poll-secs", "0.2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting sked-worker");
    let before = shards(&db.pool, parent).await;
    for s in &before {
        wait_for(&db.pool, s.id, &["running"], 20 * SECS).await;
    }
    let victim_id = shards(&db.pool, parent).await[0].worker_id;
    victim.kill().expect("kill -9 the worker");
    let _ = victim.wait();

    let mut c = config(&["default"]);
    c.lease = 2 * SECS;
    let rescuer = start_worker(&db, c);
    wait_for(&db.pool, parent, &["succeeded"], 30 * SECS).await;
    for s in shards(&db.pool, parent).await {
        assert_eq!(s.state, "succeeded");
        assert_ne!(
            s.worker_id, victim_id,
            "shard {} ran on the other worker",
            s.shard_index
        );
        let history: Vec<(i32, String)> = sqlx::query_as(
            "select attempt, outcome from sked.task_attempt_history where task_id = $1
              order by attempt",
        )
        .bind(s.id)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert_eq!(
            history,
            vec![(1, "worker_lost".to_owned()), (2, "succeeded".to_owned())],
            "shard {} lost its worker, then succeeded elsewhere",
            s.shard_index
        );
    }
    rescuer.shutdown().await;
}

#[tokio::test]
async fn a_failed_shard_fails_the_parent_and_retrying_it_resumes_the_parent() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let parent = submit(
        &db.pool,
        r#"sked.task_submit(command => array['sh', '-c',
             'if [ "$SKED_SHARD_INDEX" = 1 ] && [ "$SKED_ATTEMPT" = 1 ]; then exit 3; fi'],
           shards => 3, max_attempts => 1)"#,
    )
    .await;
    wait_for(&db.pool, parent, &["upstream_failed"], 30 * SECS).await;
    let (_, error, output) = row(&db.pool, parent).await;
    assert_eq!(
        error.as_deref(),
        Some("shard 1 of 3 failed: exited with code 3"),
        "the parent names the shard that failed"
    );
    assert_eq!(output, None);
    let failed = shards(&db.pool, parent).await.remove(1);
    assert_eq!(failed.state, "failed");

    let state: String = sqlx::query_scalar("select sked.task_retry($1)")
        .bind(failed.id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state, "waiting");
    assert_eq!(
        row(&db.pool, parent).await.0,
        "blocked",
        "retrying the shard puts the parent back to waiting for it"
    );
    wait_for(&db.pool, parent, &["succeeded"], 30 * SECS).await;
    worker.shutdown().await;
}

#[tokio::test]
async fn a_broadcast_runs_once_on_every_live_worker() {
    let db = TestDb::new().await;
    let a = start_worker(&db, config(&["default"]));
    let b = start_worker(&db, config(&["default"]));
    let deadline = tokio::time::Instant::now() + 20 * SECS;
    while count(&db.pool, "sked.workers").await < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "both workers register"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let parent = submit(
        &db.pool,
        "sked.task_submit(command => array['sh', '-c', 'echo on $SKED_SHARD_INDEX'], broadcast => true)",
    )
    .await;
    wait_for(&db.pool, parent, &["succeeded"], 30 * SECS).await;
    let shards = shards(&db.pool, parent).await;
    assert_eq!(shards.len(), 2, "one shard per live worker");
    for s in &shards {
        assert_eq!(s.state, "succeeded");
        assert!(s.pinned_worker.is_some());
        assert_eq!(
            s.worker_id, s.pinned_worker,
            "a broadcast shard runs on the worker it is pinned to"
        );
    }
    assert_ne!(
        shards[0].worker_id, shards[1].worker_id,
        "it ran once on each worker"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_broadcast_without_a_live_worker_is_rejected_and_inserts_nothing() {
    let db = TestDb::new().await;
    let submit = "select sked.task_submit(command => array['true'], broadcast => true)";
    assert_eq!(
        rejected(&db.pool, submit).await,
        "tasks_broadcast_needs_a_live_worker"
    );
    // A worker silent for longer than its lease, and one that is stopping, are not live.
    let now = db_now(&db.pool).await;
    register(&db.pool, &[], now - chrono::Duration::seconds(31)).await;
    let stopping = register(&db.pool, &[], now).await;
    sqlx::query("update sked.workers set stopping_at = now() where id = $1")
        .bind(stopping)
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        rejected(&db.pool, submit).await,
        "tasks_broadcast_needs_a_live_worker"
    );
    // A live worker without the task's labels does not count either.
    register(&db.pool, &["cpu"], now).await;
    let err = sqlx::query(
        "select sked.task_submit(command => array['true'], broadcast => true, labels => '{gpu}')",
    )
    .execute(&db.pool)
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("broadcast: no live worker serves queue 'default' with the labels gpu"),
        "the message says why: {err}"
    );
    assert_eq!(
        count(&db.pool, "sked.tasks").await,
        0,
        "nothing was inserted"
    );
    assert_eq!(count(&db.pool, "sked.task_edges").await, 0);
}

#[tokio::test]
async fn bad_shard_counts_are_rejected_and_insert_nothing() {
    let db = TestDb::new().await;
    let cases = [
        "select sked.task_submit(command => array['true'], shards => 0)",
        "select sked.task_submit(command => array['true'], shards => -2)",
        "select sked.task_submit(command => array['true'], shards => 10001)",
        r#"select sked.tasks_submit('[{"command": ["true"]}, {"command": ["true"], "shards": 0}]')"#,
        "insert into sked.tasks (command, shard_total) values ('{true}', 3), ('{true}', 20000)",
    ];
    for sql in cases {
        assert_eq!(
            rejected(&db.pool, sql).await,
            "tasks_shard_total_must_be_1_to_10000",
            "{sql}"
        );
    }
    assert_eq!(
        rejected(
            &db.pool,
            "select sked.task_submit(command => array['true'], shards => 2, broadcast => true)"
        )
        .await,
        "tasks_shards_and_broadcast_are_exclusive"
    );
    assert_eq!(
        count(&db.pool, "sked.tasks").await,
        0,
        "nothing was inserted"
    );
    assert_eq!(count(&db.pool, "sked.task_edges").await, 0);

    // The REST API answers 422 naming the rule (409 for a broadcast: the live workers, not
    // the request, decide); the CLI refuses before any request.
    let api = crate::api::Api::new().await;
    for body in [
        json!({"command": ["true"], "shards": 0}),
        json!({"command": ["true"], "shards": 10_001}),
    ] {
        let (status, json) = api.post("/api/v1/tasks", &api.alice, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{json}");
        crate::api::assert_error(&json, "rejected");
        assert_eq!(json["message"], "shards must be between 1 and 10000");
    }
    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "broadcast": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{json}");
    crate::api::assert_error(&json, "conflict");
    assert!(
        json["message"].as_str().unwrap().contains("live worker"),
        "{json}"
    );
    assert_eq!(count(&api.db.pool, "sked.tasks").await, 0);
    for (flags, says) in [
        (["--shards", "0"], "0 is not in 1..=10000"),
        (["--shards", "-3"], "-3 is not in 1..=10000"),
        (["--shards", "10001"], "10001 is not in 1..=10000"),
    ] {
        let mut cmd = crate::cli::sked();
        cmd.args(["submit", "--url", "http://127.0.0.1:9"])
            .args(flags)
            .args(["--", "true"]);
        let out = crate::cli::output(&mut cmd).await;
        let stderr = crate::cli::text(&out.stderr);
        assert!(!out.status.success(), "{flags:?} fails");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

#[tokio::test]
async fn new_shards_go_one_per_claim_and_to_workers_not_running_their_siblings() {
    let db = TestDb::new().await;
    let plain = submit(&db.pool, "sked.task_submit(kind => 'noop')").await;
    let parent = submit(&db.pool, "sked.task_submit(kind => 'noop', shards => 4)").await;
    let t0: DateTime<Utc> = sqlx::query_scalar("select next_run_at from sked.tasks where id = $1")
        .bind(parent)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let ms = chrono::Duration::milliseconds;

    let took: Vec<Option<i32>> = sqlx::query_scalar(
        "select shard_index from sked.tasks_claim($1, '{default}', '{}', 10, '30 seconds', $2)
          order by shard_index nulls first",
    )
    .bind(a)
    .bind(t0)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        took,
        vec![None, Some(0)],
        "a claim takes other tasks as usual and at most one new shard of a parent"
    );
    assert_eq!(
        sqlx::query_scalar::<_, String>("select state from sked.tasks where id = $1")
            .bind(plain)
            .fetch_one(&db.pool)
            .await
            .unwrap(),
        "running"
    );
    assert_eq!(
        claim(&db.pool, a, t0 + ms(500)).await,
        Vec::<i32>::new(),
        "a worker running a shard passes over its new siblings"
    );
    assert_eq!(
        claim(&db.pool, b, t0 + ms(500)).await,
        vec![1],
        "an idle worker gets one"
    );
    assert_eq!(claim(&db.pool, b, t0 + ms(900)).await, Vec::<i32>::new());
    assert_eq!(
        claim(&db.pool, a, t0 + ms(1000)).await,
        vec![2, 3],
        "after their first second shards are claimed like any task"
    );
}

#[tokio::test]
async fn a_pinned_shard_runs_only_on_its_worker_and_fails_when_the_worker_is_gone() {
    let db = TestDb::new().await;
    let now = db_now(&db.pool).await;
    let (a, b) = (
        register(&db.pool, &[], now).await,
        register(&db.pool, &[], now).await,
    );
    let parent = submit(
        &db.pool,
        "sked.task_submit(kind => 'noop', broadcast => true)",
    )
    .await;
    let pinned: Vec<Option<Uuid>> = shards(&db.pool, parent)
        .await
        .iter()
        .map(|s| s.pinned_worker)
        .collect();
    let mut expected = vec![Some(a), Some(b)];
    expected.sort();
    assert_eq!(pinned, expected, "one shard pinned to each live worker");

    let later = now + chrono::Duration::seconds(5);
    let stranger = Uuid::new_v4();
    assert!(
        claim(&db.pool, stranger, later).await.is_empty(),
        "no other worker may claim a pinned shard"
    );
    let took_a = claim(&db.pool, a, later).await;
    assert_eq!(took_a.len(), 1, "a worker claims the shard pinned to it");
    // Worker a dies while running its shard, and b stops before it claimed its own.
    sqlx::query("update sked.workers set stopping_at = $2 where id = $1")
        .bind(b)
        .bind(later)
        .execute(&db.pool)
        .await
        .unwrap();
    let rescued: Vec<(Uuid, String)> =
        sqlx::query_as("select * from sked.tasks_rescue(p_now => $1)")
            .bind(now + chrono::Duration::minutes(2))
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(rescued.len(), 1);
    assert_eq!(
        rescued[0].1, "failed",
        "a pinned shard whose worker died fails at once, with attempts left"
    );
    for s in shards(&db.pool, parent).await {
        assert_eq!(s.state, "failed");
        let error = s.error.unwrap_or_default();
        if s.pinned_worker == Some(a) {
            assert_eq!(s.attempt, 1);
            assert!(error.contains("runs only on its own worker"), "{error}");
        } else {
            assert_eq!(s.attempt, 0, "the shard of the stopped worker never ran");
            assert!(
                error.contains(&format!("only on worker {b}, which is no longer live")),
                "{error}"
            );
        }
    }
    assert_eq!(row(&db.pool, parent).await.0, "upstream_failed");
}

#[tokio::test]
async fn cancelling_the_parent_cancels_its_shards_and_retrying_it_runs_them_again() {
    let db = TestDb::new().await;
    let parent = submit(&db.pool, "sked.task_submit(kind => 'noop', shards => 3)").await;
    let now = db_now(&db.pool).await + chrono::Duration::seconds(5);
    let worker = Uuid::new_v4();
    let first = claim(&db.pool, worker, now).await;
    assert_eq!(first, vec![0, 1, 2]);
    let ids: Vec<Uuid> = shards(&db.pool, parent)
        .await
        .iter()
        .map(|s| s.id)
        .collect();
    finish(&db.pool, &ids[..1], "succeeded", now).await;
    finish(&db.pool, &ids[1..2], "failed", now).await;
    // Shard 1 has attempts left: it waits for its retry when the parent is cancelled.
    let state: String = sqlx::query_scalar("select sked.task_cancel($1, $2)")
        .bind(parent)
        .bind(now)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state, "cancelled");
    let states: Vec<(String, bool)> = sqlx::query_as(
        "select state, cancel_requested_at is not null from sked.tasks
          where shard_of = $1 order by shard_index",
    )
    .bind(parent)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        vec![
            ("succeeded".to_owned(), false),
            ("cancelled".to_owned(), false),
            ("running".to_owned(), true)
        ],
        "unstarted shards are cancelled, running ones are asked to stop"
    );
    finish(&db.pool, &ids[2..], "cancelled", now).await;
    assert_eq!(row(&db.pool, parent).await.0, "cancelled");

    let state: String = sqlx::query_scalar("select sked.task_retry($1, $2)")
        .bind(parent)
        .bind(now)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        state, "blocked",
        "the parent waits for the shards that run again"
    );
    let later = now + chrono::Duration::seconds(5);
    assert_eq!(
        claim(&db.pool, worker, later).await,
        vec![1, 2],
        "the shards that did not succeed run again"
    );
    finish(&db.pool, &ids[1..], "succeeded", later).await;
    let (state, _, output) = row(&db.pool, parent).await;
    assert_eq!(state, "succeeded");
    assert_eq!(output, Some(json!([0, 1, 2])));
}

#[tokio::test]
async fn a_sharded_task_of_a_workflow_waits_for_its_parents_and_feeds_its_children() {
    let db = TestDb::new().await;
    let wf: Uuid = sqlx::query_scalar("select sked.workflow_submit($1)")
        .bind(json!({"name": "w", "tasks": [
            {"name": "a", "kind": "noop"},
            {"name": "b", "kind": "noop", "shards": 2, "depends_on": ["a"]},
            {"name": "c", "kind": "noop", "depends_on": ["b"]},
        ]}))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let tasks: Vec<(String, String, String, i32, i32)> = sqlx::query_as(
        "select name, state, trigger_rule, parents, children from sked.tasks
          where workflow_id = $1 order by name",
    )
    .bind(wf)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let t = |n: &str, s: &str, r: &str, p: i32, c: i32| {
        (n.to_owned(), s.to_owned(), r.to_owned(), p, c)
    };
    assert_eq!(
        tasks,
        vec![
            t("a", "waiting", "all_success", 0, 2),
            t("b", "blocked", "shards", 2, 1),
            t("b[0]", "blocked", "all_success", 1, 1),
            t("b[1]", "blocked", "all_success", 1, 1),
            t("c", "blocked", "all_success", 1, 0),
        ],
        "the shards take over b's parents; b waits for its shards"
    );
    let now = db_now(&db.pool).await + chrono::Duration::seconds(5);
    let worker = Uuid::new_v4();
    let names = |pool: &PgPool, now| {
        let pool = pool.clone();
        async move {
            let names: Vec<String> = sqlx::query_scalar(
                "select name from sked.tasks_claim($1, '{default}', '{}', 10, '30 seconds', $2)
                  order by name",
            )
            .bind(worker)
            .bind(now)
            .fetch_all(&pool)
            .await
            .unwrap();
            names
        }
    };
    assert_eq!(names(&db.pool, now).await, vec!["a"]);
    let id = |name: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>(
                "select id from sked.tasks where workflow_id = $1 and name = $2",
            )
            .bind(wf)
            .bind(name)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    finish(&db.pool, &[id("a").await], "succeeded", now).await;
    // Released shards are new for a second: one claim takes one of them.
    assert_eq!(names(&db.pool, now).await, vec!["b[0]"]);
    let now = now + chrono::Duration::seconds(2);
    assert_eq!(names(&db.pool, now).await, vec!["b[1]"]);
    finish(
        &db.pool,
        &[id("b[0]").await, id("b[1]").await],
        "succeeded",
        now,
    )
    .await;
    assert_eq!(row(&db.pool, id("b").await).await.2, Some(json!([0, 1])));
    assert_eq!(names(&db.pool, now).await, vec!["c"]);
    let outputs: Value = sqlx::query_scalar("select sked.task_parent_outputs($1)")
        .bind(id("c").await)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        outputs,
        json!({"b": [0, 1]}),
        "c reads b's output, the shards' outputs"
    );
    finish(&db.pool, &[id("c").await], "succeeded", now).await;
    let state: String = sqlx::query_scalar("select state from sked.workflows where id = $1")
        .bind(wf)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state, "succeeded");
}

#[tokio::test]
async fn plain_inserts_and_batches_expand_every_parent_into_its_shards() {
    let db = TestDb::new().await;
    sqlx::query(
        "insert into sked.tasks (kind, args, shard_total)
         values ('noop', '{a}', 2), ('noop', '{b}', null), ('noop', '{c}', 3)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let ids: Vec<Uuid> = sqlx::query_scalar(
        r#"select id from sked.tasks_submit('[{"kind": "noop", "args": ["d"], "shards": 1},
                                              {"kind": "noop", "args": ["e"]},
                                              {"kind": "noop", "args": ["f"], "shards": 5, "queue": "q"}]')"#,
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let per_parent: Vec<(String, i64, String)> = sqlx::query_as(
        "select p.args[1], count(s.id), p.state from sked.tasks p
           left join sked.tasks s on s.shard_of = p.id
          where p.shard_of is null group by p.id order by p.args[1]",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let counts: Vec<(&str, i64, &str)> = per_parent
        .iter()
        .map(|(a, n, s)| (a.as_str(), *n, s.as_str()))
        .collect();
    assert_eq!(
        counts,
        vec![
            ("a", 2, "blocked"),
            ("b", 0, "waiting"),
            ("c", 3, "blocked"),
            ("d", 1, "blocked"),
            ("e", 0, "waiting"),
            ("f", 5, "blocked")
        ],
        "every parent of the statement has its shards, other tasks none"
    );
    let queues: Vec<String> =
        sqlx::query_scalar("select distinct queue from sked.tasks where shard_of = $1")
            .bind(ids[2])
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(queues, vec!["q"], "shards copy their parent's queue");
    assert_eq!(
        count(&db.pool, "sked.task_edges").await,
        11,
        "one edge per shard"
    );
}

#[tokio::test]
async fn rest_shows_shard_fields_and_lists_the_shards_of_a_task() {
    let api = crate::api::Api::new().await;
    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["echo", "hi"], "shards": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let parent = json["ids"][0].as_str().unwrap().to_owned();
    let (status, detail) = api
        .get(&format!("/api/v1/tasks/{parent}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(detail["shard_total"], 3);
    assert_eq!(detail["shard_index"], Value::Null);
    assert_eq!(detail["state"], "blocked");
    assert_eq!(detail["trigger_rule"], "shards");
    assert_eq!(detail["attempts"], json!([]));

    let (status, page) = api
        .get(&format!("/api/v1/tasks?shard_of={parent}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK);
    let mut indexes: Vec<i64> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert_eq!(t["shard_of"], parent.as_str());
            assert_eq!(t["shard_total"], 3);
            t["shard_index"].as_i64().unwrap()
        })
        .collect();
    indexes.sort();
    assert_eq!(indexes, vec![0, 1, 2], "?shard_of lists the task's shards");
    let (status, page) = api
        .get(&format!("/api/v1/tasks?shard_of={parent}"), &api.bob)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["tasks"], json!([]), "another user sees none of them");

    let cli = crate::cli::Api::start().await;
    let id = cli
        .ok(&["submit", "--shards", "2", "--", "echo", "hi"])
        .await
        .trim()
        .to_owned();
    let shown = cli.ok(&["show", &id]).await;
    assert!(shown.contains("shards:       2"), "{shown}");
    let listed = cli.ok(&["list", "--shard-of", &id]).await;
    assert_eq!(
        listed.lines().count(),
        3,
        "a header and two shards: {listed}"
    );
    let shard = listed
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap();
    let shown = cli.ok(&["show", shard]).await;
    assert!(shown.contains(&format!("of task {id}")), "{shown}");
}

#[tokio::test]
async fn a_sharded_submission_sends_one_notification() {
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&db.pool)
        .await
        .unwrap();
    listener.listen("sked_tasks").await.unwrap();
    // A plain task in queue a and a sharded one in queue b, in one statement: the statement's
    // notification names both queues, and the shards' own insert adds none.
    sqlx::query(
        r#"select sked.tasks_submit('[{"kind": "noop", "queue": "a"},
                                      {"kind": "noop", "queue": "b", "shards": 3}]')"#,
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let first = tokio::time::timeout(5 * SECS, listener.recv())
        .await
        .expect("the submission notifies")
        .unwrap();
    assert_eq!(first.payload(), "a,b");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.recv())
            .await
            .is_err(),
        "one notification per statement, none for the shards"
    );
}

/// The last two shards finish in concurrent transactions: the one that completes the parent
/// waits for the other's lock, and must still see that shard's output once it commits.
#[tokio::test]
async fn concurrent_finishes_of_the_last_shards_keep_every_output() {
    let db = TestDb::new().await;
    let parent = submit(&db.pool, "sked.task_submit(kind => 'noop', shards => 2)").await;
    let now = db_now(&db.pool).await + chrono::Duration::seconds(5);
    let a = register(&db.pool, &[], now).await;
    let b = register(&db.pool, &[], now).await;
    let mut taken = claim(&db.pool, a, now).await;
    taken.extend(claim(&db.pool, b, now).await);
    taken.sort();
    assert_eq!(taken, [0, 1]);
    let ids: Vec<Uuid> = shards(&db.pool, parent)
        .await
        .iter()
        .map(|s| s.id)
        .collect();

    let finish_sql = "select count(*) from sked.tasks t,
            sked.tasks_finish(array[t.id], array[t.attempt], array['succeeded'], array[0],
                              array[null], array[null], array[null], array[null],
                              array[to_jsonb(t.shard_index)], $2) f
      where t.id = $1";
    let mut first = db.pool.begin().await.unwrap();
    let n: i64 = sqlx::query_scalar(finish_sql)
        .bind(ids[0])
        .bind(now)
        .fetch_one(&mut *first)
        .await
        .unwrap();
    assert_eq!(n, 1);
    let pool = db.pool.clone();
    let second_id = ids[1];
    let second = tokio::spawn(async move {
        let n: i64 = sqlx::query_scalar(finish_sql)
            .bind(second_id)
            .bind(now)
            .fetch_one(&pool)
            .await
            .unwrap();
        n
    });
    // Let the second finish reach the parent's lock, then commit the first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second finish waits for the first's lock"
    );
    first.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), 1);

    let (state, _, output) = row(&db.pool, parent).await;
    assert_eq!(state, "succeeded");
    assert_eq!(
        output,
        Some(json!([0, 1])),
        "both shards' outputs, in order"
    );
}
