//! Tests of DAG workflows: submission and its rules, trigger rules and failure propagation
//! (in SQL with time as an input), real workers running DAGs in order and passing outputs,
//! re-runs from a failed node, cancel, the REST API with owner isolation, and the CLI.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use chrono::{DateTime, Utc};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sked_db::token::Role;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use uuid::Uuid;

use crate::support::{config, start_worker, task_id};

/// Submits a workflow spec with `sked.workflow_submit`; returns its id.
pub(crate) async fn submit(pool: &PgPool, spec: Value) -> Uuid {
    sqlx::query_scalar("select sked.workflow_submit($1, 'alice')")
        .bind(spec)
        .fetch_one(pool)
        .await
        .expect("a valid workflow is accepted")
}

/// The states of a workflow's tasks by name.
pub(crate) async fn states(pool: &PgPool, workflow: Uuid) -> HashMap<String, String> {
    let rows: Vec<(String, String)> =
        sqlx::query_as("select name, state from sked.tasks where workflow_id = $1")
            .bind(workflow)
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter().collect()
}

pub(crate) async fn workflow_state(pool: &PgPool, workflow: Uuid) -> String {
    sqlx::query_scalar("select state from sked.workflows where id = $1")
        .bind(workflow)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Claims every due task at `now` (as one worker would) and returns their names (the id of
/// one without a name), sorted.
pub(crate) async fn claim_all(pool: &PgPool, now: DateTime<Utc>) -> Vec<String> {
    let mut names: Vec<String> = sqlx::query_scalar(
        "select coalesce(name, id::text) from sked.tasks_claim(gen_random_uuid(), '{default}', '{}', 1000, '1 minute', $1)",
    )
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap();
    names.sort();
    names
}

/// Finishes the running attempt of the named task with `outcome` at `now`.
async fn finish(pool: &PgPool, workflow: Uuid, name: &str, outcome: &str, now: DateTime<Utc>) {
    finish_as(pool, workflow, name, outcome, None, now).await;
}

/// Finishes the running attempt of the named task with `outcome` and `output` at `now`;
/// returns the state it ended in.
pub(crate) async fn finish_as(
    pool: &PgPool,
    workflow: Uuid,
    name: &str,
    outcome: &str,
    output: Option<Value>,
    now: DateTime<Utc>,
) -> String {
    let changed: Vec<(Uuid, String)> = sqlx::query_as(
        "select f.* from sked.tasks t,
                sked.tasks_finish(array[t.id], array[t.attempt], array[$3], array[0], array[null],
                                  array[null], array[null], array[null], array[$4::jsonb], $5) f
          where t.workflow_id = $1 and t.name = $2",
    )
    .bind(workflow)
    .bind(name)
    .bind(outcome)
    .bind(output)
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(changed.len(), 1, "task {name} was running and is finished");
    changed.into_iter().next().unwrap().1
}

pub(crate) fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(crate) async fn counts(pool: &PgPool) -> (i64, i64, i64) {
    sqlx::query_as(
        "select (select count(*) from sked.tasks), (select count(*) from sked.workflows),
                (select count(*) from sked.task_edges)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn bad_workflows_are_rejected_with_the_rule_and_nothing_is_inserted() {
    let db = TestDb::new().await;
    let noop =
        |name: &str, deps: &[&str]| json!({"name": name, "kind": "noop", "depends_on": deps});
    let cases = [
        (
            json!({"tasks": [noop("a", &["c"]), noop("b", &["a"]), noop("c", &["b"]), noop("d", &[])]}),
            "workflows_tasks_must_not_form_a_cycle",
            "cycle",
        ),
        (
            json!({"tasks": [noop("a", &[]), noop("b", &["b"])]}),
            "workflows_task_must_not_depend_on_itself",
            "'b' depends on itself",
        ),
        (
            json!({"tasks": [noop("a", &[]), noop("b", &["x"])]}),
            "workflows_depends_on_must_name_a_task_of_the_workflow",
            "'b' depends on 'x'",
        ),
        (
            json!({"tasks": [noop("a", &[]), noop("a", &[])]}),
            "workflows_task_names_must_be_unique",
            "named 'a'",
        ),
        (
            json!({"tasks": [{"kind": "noop"}]}),
            "workflows_tasks_must_have_names",
            "needs a non-empty \"name\"",
        ),
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "depend_on": ["b"]}]}),
            "workflows_task_keys_must_be_known",
            "unknown key 'depend_on'",
        ),
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "trigger_rule": "sometimes"}]}),
            "workflows_trigger_rule_is_known",
            "'sometimes'",
        ),
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "owner": "mallory"}]}),
            "workflows_tasks_belong_to_the_workflow_owner",
            "another owner",
        ),
        (
            json!({"tasks": []}),
            "workflows_spec_must_have_tasks",
            "at least one task",
        ),
        // A task's own rules apply as in any submission.
        (
            json!({"tasks": [{"name": "a", "command": ["true"], "queue": "bad queue"}]}),
            "tasks_queue_name_must_be_1_to_64_word_characters",
            "queue",
        ),
    ];
    for (spec, rule, says) in cases {
        assert_refused(&db.pool, &spec, rule, says).await;
    }
}

/// Asserts that `sked.workflow_submit` refuses `spec` with check_violation naming `rule`, a
/// message that contains `says`, and nothing inserted.
pub(crate) async fn assert_refused(pool: &PgPool, spec: &Value, rule: &str, says: &str) {
    let err = sqlx::query_scalar::<_, Uuid>("select sked.workflow_submit($1, 'alice')")
        .bind(spec)
        .fetch_one(pool)
        .await
        .expect_err("a bad workflow is rejected");
    let db_err = err.as_database_error().expect("a database error");
    assert_eq!(db_err.code().as_deref(), Some("23514"), "{spec}: {db_err}");
    assert_eq!(db_err.constraint(), Some(rule), "{spec}: {db_err}");
    assert!(
        db_err.message().contains(says),
        "the message of {rule} says {says:?}: {}",
        db_err.message()
    );
    assert_eq!(
        counts(pool).await,
        (0, 0, 0),
        "a rejected workflow ({rule}) inserts no task, workflow or edge"
    );
}

#[tokio::test]
async fn submission_inserts_tasks_edges_and_counters_and_notifies_once() {
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&db.pool)
        .await
        .unwrap();
    listener.listen("sked_tasks").await.unwrap();
    let wf = submit(
        &db.pool,
        json!({"name": "diamond", "tasks": [
            {"name": "a", "kind": "noop"},
            {"name": "b", "kind": "noop", "depends_on": ["a"]},
            {"name": "c", "kind": "noop", "depends_on": ["a", "a"], "queue": "other"},
            {"name": "d", "kind": "noop", "depends_on": ["b", "c"], "trigger_rule": "on_failure"},
        ]}),
    )
    .await;
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[
            ("a", "waiting"),
            ("b", "blocked"),
            ("c", "blocked"),
            ("d", "blocked")
        ]),
        "only tasks without parents are claimable"
    );
    let rows: Vec<(String, i32, i32, i32, String, String)> = sqlx::query_as(
        "select name, parents, children, parents_pending, trigger_rule, owner from sked.tasks
          where workflow_id = $1 order by name",
    )
    .bind(wf)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let expected = [
        ("a", 0, 2, 0, "all_success"),
        ("b", 1, 1, 1, "all_success"),
        ("c", 1, 1, 1, "all_success"),
        ("d", 2, 0, 2, "one_failed"),
    ];
    for (row, (name, parents, children, pending, rule)) in rows.iter().zip(expected) {
        assert_eq!(
            (row.0.as_str(), row.1, row.2, row.3, row.4.as_str()),
            (name, parents, children, pending, rule),
            "counters of {name} (a name listed twice is one edge; on_failure is one_failed)"
        );
        assert_eq!(row.5, "alice", "every task belongs to the workflow's owner");
    }
    let (tasks, workflows, edges) = counts(&db.pool).await;
    assert_eq!((tasks, workflows, edges), (4, 1, 4));
    let first = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("the submission notifies")
        .unwrap();
    assert_eq!(
        first.payload(),
        "default",
        "one notification, for the claimable root"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.recv())
            .await
            .is_err(),
        "a submission sends one notification, not one per task"
    );
}

#[tokio::test]
async fn a_failure_ends_all_success_descendants_at_once_and_starts_all_done_and_one_failed() {
    let db = TestDb::new().await;
    // Later than the database's clock at submission, so that every root is due.
    let t0 = Utc::now() + chrono::Duration::seconds(5);
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            {"name": "a", "kind": "noop", "max_attempts": 1},
            {"name": "ok", "kind": "noop"},
            {"name": "b", "kind": "noop", "depends_on": ["a"]},
            {"name": "c", "kind": "noop", "depends_on": ["b", "ok"]},
            {"name": "always", "kind": "noop", "depends_on": ["a"], "trigger_rule": "all_done"},
            {"name": "alert", "kind": "noop", "depends_on": ["a"], "trigger_rule": "one_failed"},
            {"name": "after_alert", "kind": "noop", "depends_on": ["alert"]},
            {"name": "quiet", "kind": "noop", "depends_on": ["ok"], "trigger_rule": "one_failed"},
            {"name": "after_quiet", "kind": "noop", "depends_on": ["quiet"]},
        ]}),
    )
    .await;
    assert_eq!(claim_all(&db.pool, t0).await, vec!["a", "ok"]);
    finish(&db.pool, wf, "ok", "succeeded", t0).await;
    // `quiet` runs only if `ok` failed: it is skipped, and so is what needs it to succeed.
    let s = states(&db.pool, wf).await;
    assert_eq!(
        s["quiet"], "skipped",
        "one_failed with every parent succeeded"
    );
    assert_eq!(
        s["after_quiet"], "skipped",
        "a skipped parent skips an all_success child"
    );
    assert_eq!(s["c"], "blocked", "c still waits for b");

    finish(&db.pool, wf, "a", "failed", t0).await;
    // The same statement ended b and, through it, c.
    let s = states(&db.pool, wf).await;
    assert_eq!(s["a"], "failed");
    assert_eq!(
        s["b"], "upstream_failed",
        "all_success child of a failed task"
    );
    assert_eq!(s["c"], "upstream_failed", "upstream_failed is transitive");
    assert_eq!(
        s["always"], "waiting",
        "all_done runs after a failed parent"
    );
    assert_eq!(
        s["alert"], "waiting",
        "one_failed runs when a parent failed"
    );
    assert_eq!(s["after_alert"], "blocked");
    let error: String = sqlx::query_scalar("select error from sked.tasks where id = $1")
        .bind(task_id(&db.pool, wf, "c").await)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(error.contains("depends on failed"), "{error}");
    assert_eq!(workflow_state(&db.pool, wf).await, "running");

    assert_eq!(claim_all(&db.pool, t0).await, vec!["alert", "always"]);
    finish(&db.pool, wf, "always", "succeeded", t0).await;
    finish(&db.pool, wf, "alert", "succeeded", t0).await;
    assert_eq!(claim_all(&db.pool, t0).await, vec!["after_alert"]);
    finish(&db.pool, wf, "after_alert", "succeeded", t0).await;
    assert_eq!(
        workflow_state(&db.pool, wf).await,
        "failed",
        "a workflow with a failed task is failed once every task is finished"
    );
    let finished: Option<DateTime<Utc>> =
        sqlx::query_scalar("select finished_at from sked.workflows where id = $1")
            .bind(wf)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        finished.map(|f| f.timestamp_micros()),
        Some(t0.timestamp_micros()),
        "finished at the time of its last task"
    );
}

#[tokio::test]
async fn retrying_a_failed_node_puts_its_upstream_failed_descendants_back_and_reruns() {
    let db = TestDb::new().await;
    // Later than the database's clock at submission, so that every root is due.
    let t0 = Utc::now() + chrono::Duration::seconds(5);
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            {"name": "a", "kind": "noop", "max_attempts": 1},
            {"name": "b", "kind": "noop", "depends_on": ["a"]},
            {"name": "c", "kind": "noop", "depends_on": ["b"]},
        ]}),
    )
    .await;
    claim_all(&db.pool, t0).await;
    finish(&db.pool, wf, "a", "failed", t0).await;
    assert_eq!(workflow_state(&db.pool, wf).await, "failed");

    let a = task_id(&db.pool, wf, "a").await;
    let after: String = sqlx::query_scalar("select sked.task_retry($1, $2)")
        .bind(a)
        .bind(t0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, "waiting");
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[("a", "waiting"), ("b", "blocked"), ("c", "blocked")]),
        "the failed node's upstream_failed descendants wait for it again"
    );
    let pending: Vec<i32> = sqlx::query_scalar(
        "select parents_pending from sked.tasks where workflow_id = $1 order by name",
    )
    .bind(wf)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(pending, vec![0, 1, 1], "counters are recomputed");
    assert_eq!(workflow_state(&db.pool, wf).await, "running");

    for name in ["a", "b", "c"] {
        assert_eq!(claim_all(&db.pool, t0).await, vec![name]);
        finish(&db.pool, wf, name, "succeeded", t0).await;
    }
    assert_eq!(workflow_state(&db.pool, wf).await, "succeeded");
    let retried = sqlx::query_scalar::<_, Option<i32>>("select sked.workflow_retry($1)")
        .bind(wf)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        retried,
        Some(0),
        "a succeeded workflow has nothing to re-run"
    );
}

#[tokio::test]
async fn cancelling_a_workflow_cancels_its_tasks_and_asks_running_ones_to_stop() {
    let db = TestDb::new().await;
    // Later than the database's clock at submission, so that every root is due.
    let t0 = Utc::now() + chrono::Duration::seconds(5);
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            {"name": "a", "kind": "noop"},
            {"name": "b", "kind": "noop", "depends_on": ["a"]},
            {"name": "c", "kind": "noop"},
        ]}),
    )
    .await;
    assert_eq!(claim_all(&db.pool, t0).await, vec!["a", "c"]);
    finish(&db.pool, wf, "c", "succeeded", t0).await;
    let after: String = sqlx::query_scalar("select sked.workflow_cancel($1, $2)")
        .bind(wf)
        .bind(t0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        after, "running",
        "the workflow runs until its running task stops"
    );
    let s = states(&db.pool, wf).await;
    assert_eq!(
        s,
        map(&[("a", "running"), ("b", "cancelled"), ("c", "succeeded")])
    );
    let requested: bool =
        sqlx::query_scalar("select cancel_requested_at is not null from sked.tasks where id = $1")
            .bind(task_id(&db.pool, wf, "a").await)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(requested, "a running task gets a cancel request");
    finish(&db.pool, wf, "a", "cancelled", t0).await;
    assert_eq!(workflow_state(&db.pool, wf).await, "cancelled");

    // Re-running a cancelled workflow runs its cancelled tasks, in order.
    let rerun: Option<i32> = sqlx::query_scalar("select sked.workflow_retry($1, $2)")
        .bind(wf)
        .bind(t0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rerun, Some(2));
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[("a", "waiting"), ("b", "blocked"), ("c", "succeeded")])
    );
    assert_eq!(workflow_state(&db.pool, wf).await, "running");
}

/// Submits a workflow of shell commands with `sked.workflow_submit`.
fn sh(name: &str, script: &str, deps: &[&str]) -> Value {
    json!({"name": name, "command": ["sh", "-c", script], "depends_on": deps, "max_attempts": 1})
}

async fn wait_for_workflow(pool: &PgPool, wf: Uuid, within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let s = workflow_state(pool, wf).await;
        if s != "running" {
            return s;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "workflow {wf} should finish within {within:?}; its tasks: {:?}",
                states(pool, wf).await
            );
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn a_worker_runs_a_diamond_in_dependency_order() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            sh("a", "sleep 0.1", &[]),
            sh("b", "sleep 0.3", &["a"]),
            sh("c", "sleep 0.2", &["a"]),
            sh("d", "true", &["b", "c"]),
        ]}),
    )
    .await;
    assert_eq!(
        wait_for_workflow(&db.pool, wf, Duration::from_secs(30)).await,
        "succeeded"
    );
    let rows: Vec<(String, DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "select name, started_at, finished_at from sked.tasks where workflow_id = $1",
    )
    .bind(wf)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let t: HashMap<&str, (DateTime<Utc>, DateTime<Utc>)> = rows
        .iter()
        .map(|(n, s, f)| (n.as_str(), (*s, *f)))
        .collect();
    assert!(
        t["b"].0 >= t["a"].1 && t["c"].0 >= t["a"].1,
        "b and c start after a: {t:?}"
    );
    assert!(
        t["d"].0 >= t["b"].1 && t["d"].0 >= t["c"].1,
        "d starts after both b and c finished: {t:?}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn outputs_flow_from_parents_to_children() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            sh("writer", r#"echo '{"rows": 3}' > "$SKED_OUTPUT"; echo done"#, &[]),
            sh("printer", r#"echo working; echo '{"path": "/tmp/x"}'"#, &[]),
            sh("plain", "echo not json", &[]),
            sh("child", r#"cat "$SKED_PARENT_OUTPUTS"; echo; cat"#, &["writer", "printer", "plain"]),
        ]}),
    )
    .await;
    assert_eq!(
        wait_for_workflow(&db.pool, wf, Duration::from_secs(30)).await,
        "succeeded"
    );
    let outputs: Vec<(String, Option<Value>, Option<String>)> = sqlx::query_as(
        "select name, output, stdout_tail from sked.tasks where workflow_id = $1 order by name",
    )
    .bind(wf)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let by_name: HashMap<&str, (&Option<Value>, &Option<String>)> = outputs
        .iter()
        .map(|(n, o, s)| (n.as_str(), (o, s)))
        .collect();
    assert_eq!(
        by_name["writer"].0,
        &Some(json!({"rows": 3})),
        "$SKED_OUTPUT"
    );
    assert_eq!(
        by_name["printer"].0,
        &Some(json!({"path": "/tmp/x"})),
        "the last stdout line when it is JSON"
    );
    assert_eq!(by_name["plain"].0, &None, "no output when neither is there");
    let expected = json!({"writer": {"rows": 3}, "printer": {"path": "/tmp/x"}, "plain": null});
    let stdout = by_name["child"].1.clone().unwrap_or_default();
    let lines: Vec<Value> = stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(
        lines,
        vec![expected.clone(), expected],
        "the child reads its parents' outputs from $SKED_PARENT_OUTPUTS and from stdin"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_worker_follows_trigger_rules_after_a_real_failure_and_a_retry_resumes() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let dir = std::env::temp_dir().join(format!("sked-wf-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let flag = dir.join("fixed");
    let flaky = format!("test -f {}", flag.display());
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            sh("flaky", &flaky, &[]),
            sh("next", "true", &["flaky"]),
            sh("last", "true", &["next"]),
            {"name": "cleanup", "command": ["true"], "depends_on": ["flaky"], "trigger_rule": "all_done"},
            {"name": "alert", "command": ["true"], "depends_on": ["flaky"], "trigger_rule": "on_failure"},
        ]}),
    )
    .await;
    assert_eq!(
        wait_for_workflow(&db.pool, wf, Duration::from_secs(30)).await,
        "failed"
    );
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[
            ("flaky", "failed"),
            ("next", "upstream_failed"),
            ("last", "upstream_failed"),
            ("cleanup", "succeeded"),
            ("alert", "succeeded"),
        ])
    );

    // Fix the cause and re-run from the failed node: its descendants run, the workflow
    // succeeds; tasks that already ran are not run again.
    std::fs::write(&flag, "").unwrap();
    let rerun: Option<i32> = sqlx::query_scalar("select sked.workflow_retry($1)")
        .bind(wf)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(rerun, Some(1), "one failed task runs again");
    assert_eq!(
        wait_for_workflow(&db.pool, wf, Duration::from_secs(30)).await,
        "succeeded"
    );
    let attempts: Vec<(String, i32)> =
        sqlx::query_as("select name, attempt from sked.tasks where workflow_id = $1 order by name")
            .bind(wf)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        vec![
            ("alert".to_owned(), 1),
            ("cleanup".to_owned(), 1),
            ("flaky".to_owned(), 2),
            ("last".to_owned(), 1),
            ("next".to_owned(), 1),
        ]
    );
    worker.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn cancelling_a_workflow_stops_its_running_task() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let wf = submit(
        &db.pool,
        json!({"tasks": [sh("long", "sleep 30", &[]), sh("after", "true", &["long"])]}),
    )
    .await;
    let long = task_id(&db.pool, wf, "long").await;
    crate::support::wait_for(&db.pool, long, &["running"], Duration::from_secs(10)).await;
    let after: String = sqlx::query_scalar("select sked.workflow_cancel($1)")
        .bind(wf)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, "running");
    assert_eq!(
        wait_for_workflow(&db.pool, wf, Duration::from_secs(10)).await,
        "cancelled",
        "the worker stops the running task and the workflow ends cancelled"
    );
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[("long", "cancelled"), ("after", "cancelled")])
    );
    worker.shutdown().await;
}

/// The API router over a fresh database, with tokens for alice and bob (users).
struct Api {
    db: TestDb,
    router: axum::Router,
    alice: String,
    bob: String,
}

impl Api {
    async fn new() -> Api {
        let db = TestDb::new().await;
        let router = sked_server::router(db.pool.clone());
        let alice = sked_db::token::create(&db.pool, "alice", Role::User, "t")
            .await
            .unwrap();
        let bob = sked_db::token::create(&db.pool, "bob", Role::User, "t")
            .await
            .unwrap();
        Api {
            db,
            router,
            alice,
            bob,
        }
    }

    async fn call(
        &self,
        method: Method,
        uri: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).expect("every answer is JSON"),
        )
    }
}

#[tokio::test]
async fn rest_submits_shows_cancels_and_retries_workflows_of_their_owner_only() {
    let api = Api::new().await;
    let spec = json!({"name": "etl", "params": {"day": "2026-12-01"}, "tasks": [
        {"name": "extract", "command": ["true"], "timeout_secs": 60.0, "branch": true},
        {"name": "load", "kind": "noop", "depends_on": ["extract"], "trigger_rule": "all_done"},
    ]});
    let (status, body) = api
        .call(Method::POST, "/api/v1/workflows", &api.alice, Some(spec))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id: Uuid = body["id"].as_str().unwrap().parse().unwrap();
    let uri = format!("/api/v1/workflows/{id}");

    let (status, detail) = api.call(Method::GET, &uri, &api.alice, None).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["name"], "etl");
    assert_eq!(detail["state"], "running");
    assert_eq!(detail["params"], json!({"day": "2026-12-01"}));
    let tasks = detail["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2);
    assert_eq!(tasks[0]["name"], "extract");
    assert_eq!(tasks[0]["state"], "waiting");
    assert_eq!(tasks[0]["timeout_secs"], 60.0, "REST durations are seconds");
    assert_eq!(tasks[1]["state"], "blocked");
    assert_eq!(tasks[1]["trigger_rule"], "all_done");
    assert_eq!(tasks[0]["branch"], true, "a branch says so");
    assert_eq!(tasks[1]["branch"], false);
    assert_eq!(
        detail["edges"],
        json!([{"task": tasks[1]["id"], "depends_on": tasks[0]["id"]}])
    );

    // Bob sees none of it: 404 as for a workflow that does not exist.
    for (method, path) in [
        (Method::GET, uri.clone()),
        (Method::POST, format!("{uri}/cancel")),
        (Method::POST, format!("{uri}/retry")),
    ] {
        let (status, body) = api.call(method, &path, &api.bob, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {body}");
        assert_eq!(body["code"], "not_found");
    }
    let (_, page) = api
        .call(Method::GET, "/api/v1/workflows", &api.bob, None)
        .await;
    assert_eq!(
        page["workflows"],
        json!([]),
        "bob lists none of alice's workflows"
    );
    let (status, _) = api
        .call(Method::GET, "/api/v1/workflows?owner=alice", &api.bob, None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, page) = api
        .call(Method::GET, "/api/v1/workflows", &api.alice, None)
        .await;
    assert_eq!(page["workflows"][0]["id"], id.to_string());

    let (status, body) = api
        .call(Method::POST, &format!("{uri}/retry"), &api.alice, None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "nothing failed yet: {body}");
    let (status, body) = api
        .call(Method::POST, &format!("{uri}/cancel"), &api.alice, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "cancelled");
    let (status, body) = api
        .call(Method::POST, &format!("{uri}/cancel"), &api.alice, None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "already_finished");
    let (status, body) = api
        .call(Method::POST, &format!("{uri}/retry"), &api.alice, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["state"], "running");
    assert_eq!(body["tasks_rerun"], 2);

    // A user may not submit for another owner.
    let (status, _) = api
        .call(
            Method::POST,
            "/api/v1/workflows",
            &api.bob,
            Some(json!({"owner": "alice", "tasks": [{"name": "a", "kind": "noop"}]})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn rest_rejects_bad_workflows_with_a_clear_message_and_inserts_nothing() {
    let api = Api::new().await;
    let cases = [
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "depends_on": ["b"]},
                             {"name": "b", "kind": "noop", "depends_on": ["a"]}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cycle",
        ),
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "depends_on": ["nope"]}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "'a' depends on 'nope', which is not a task of this workflow",
        ),
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "depend_on": ["b"]}]}),
            StatusCode::BAD_REQUEST,
            "unknown field `depend_on`",
        ),
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "trigger_rule": "maybe"}]}),
            StatusCode::BAD_REQUEST,
            "unknown variant `maybe`",
        ),
        (
            json!({"tasks": [{"name": "a", "kind": "teleport"}]}),
            StatusCode::BAD_REQUEST,
            "kind: unknown variant `teleport`, expected one of `command`, `noop`, `sleep`, `service`",
        ),
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "branch": 1}]}),
            StatusCode::BAD_REQUEST,
            "task \"a\": `branch` must be true or false",
        ),
        (
            json!({"tasks": [{"name": "a", "command": ["true"], "branch": true}]}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "task 'a' is a branch, but no task depends on it",
        ),
    ];
    for (spec, status, says) in cases {
        let (got, body) = api
            .call(
                Method::POST,
                "/api/v1/workflows",
                &api.alice,
                Some(spec.clone()),
            )
            .await;
        assert_eq!(got, status, "{spec}: {body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(says), "{spec}: {message:?} says {says:?}");
        assert!(!message.contains("sked."), "no database text: {message}");
    }
    assert_eq!(counts(&api.db.pool).await, (0, 0, 0));
    let (_, doc) = api
        .call(Method::GET, "/api/v1/openapi.json", &api.alice, None)
        .await;
    for path in [
        "/api/v1/workflows",
        "/api/v1/workflows/{id}",
        "/api/v1/workflows/{id}/cancel",
        "/api/v1/workflows/{id}/retry",
    ] {
        assert!(
            doc["paths"].get(path).is_some(),
            "the OpenAPI document has {path}"
        );
    }
}

#[tokio::test]
async fn cli_submits_a_yaml_workflow_and_shows_cancels_and_retries_it() {
    let db = TestDb::new().await;
    let token = sked_db::token::create(&db.pool, "carol", Role::User, "t")
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let _stop_on_drop = stop.clone().drop_guard();
    tokio::spawn(sked_server::serve(db.pool.clone(), listener, stop));
    let dir = std::env::temp_dir().join(format!("sked-wf-cli-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let sked = |args: &[&str]| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked"));
        cmd.args(args)
            .env("SKED_URL", &url)
            .env("SKED_TOKEN", &token)
            .env_remove("DATABASE_URL")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        cmd
    };
    let run = async |args: &[&str]| {
        tokio::time::timeout(Duration::from_secs(60), sked(args).output())
            .await
            .expect("sked finishes within 60 s")
            .unwrap()
    };

    let file = dir.join("etl.yaml");
    std::fs::write(
        &file,
        "name: nightly\ntasks:\n  - name: extract\n    command: [\"true\"]\n  - name: load\n    command: [\"true\"]\n    depends_on: [extract]\n  - name: report\n    kind: noop\n    depends_on: [load]\n    trigger_rule: on_failure\n",
    )
    .unwrap();
    let out = run(&["submit", "-f", file.to_str().unwrap()]).await;
    assert!(out.status.success(), "{out:?}");
    let id: Uuid = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(workflow_state(&db.pool, id).await, "running");

    let out = run(&["workflow", "show", &id.to_string()]).await;
    assert!(out.status.success(), "{out:?}");
    let shown = String::from_utf8_lossy(&out.stdout);
    for text in [
        "nightly",
        "extract",
        "load",
        "report",
        "blocked",
        "one_failed",
    ] {
        assert!(shown.contains(text), "show prints {text:?}:\n{shown}");
    }
    let out = run(&["workflow", "list"]).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains(&id.to_string()));

    let out = run(&["workflow", "cancel", &id.to_string()]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("cancelled"));
    let out = run(&["workflow", "retry", &id.to_string()]).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(workflow_state(&db.pool, id).await, "running");

    // A cycle in a JSON file: a clear message, a failing exit, nothing inserted.
    let bad = dir.join("bad.json");
    std::fs::write(
        &bad,
        r#"{"tasks": [{"name": "x", "kind": "noop", "depends_on": ["y"]},
                      {"name": "y", "kind": "noop", "depends_on": ["x"]}]}"#,
    )
    .unwrap();
    let before = counts(&db.pool).await;
    let out = run(&["submit", "-f", bad.to_str().unwrap()]).await;
    assert!(!out.status.success(), "a cycle fails: {out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cycle") && err.contains("'x'"), "{err}");
    assert_eq!(counts(&db.pool).await, before, "nothing inserted");
    let out = run(&["submit", "-f", dir.join("missing.yaml").to_str().unwrap()]).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.yaml"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Finishes the running attempt of the named task as succeeded with `output` at `now`;
/// returns the state it ended in.
async fn finish_with_output(
    pool: &PgPool,
    workflow: Uuid,
    name: &str,
    output: Value,
    now: DateTime<Utc>,
) -> String {
    finish_as(pool, workflow, name, "succeeded", Some(output), now).await
}

/// A task's error by name.
async fn error_of(pool: &PgPool, workflow: Uuid, name: &str) -> Option<String> {
    sqlx::query_scalar("select error from sked.tasks where workflow_id = $1 and name = $2")
        .bind(workflow)
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_branch_runs_the_children_its_output_names_and_skips_the_others() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let mut decide = sh(
        "decide",
        r#"echo '{"next": ["full"]}' > "$SKED_OUTPUT""#,
        &[],
    );
    decide["branch"] = json!(true);
    let mut report = sh("report", "true", &["full", "incremental"]);
    report["trigger_rule"] = json!("none_failed");
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            decide,
            sh("full", "true", &["decide"]),
            sh("incremental", "true", &["decide"]),
            report,
            sh("after_incremental", "true", &["incremental"]),
        ]}),
    )
    .await;
    assert_eq!(
        wait_for_workflow(&db.pool, wf, Duration::from_secs(30)).await,
        "succeeded",
        "a skipped branch is no failure"
    );
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[
            ("decide", "succeeded"),
            ("full", "succeeded"),
            ("incremental", "skipped"),
            ("report", "succeeded"),
            ("after_incremental", "skipped"),
        ]),
        "the chosen child ran, the other was skipped, the skip went on by the trigger rules, \
         and the none_failed join ran after the skipped one"
    );
    assert_eq!(
        error_of(&db.pool, wf, "incremental").await.as_deref(),
        Some("skipped: the branch 'decide' did not choose it")
    );
    let attempts: i64 = sqlx::query_scalar(
        "select count(*) from sked.tasks where workflow_id = $1 and attempt > 0",
    )
    .bind(wf)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(attempts, 3, "decide, full and report ran; nothing else did");
    worker.shutdown().await;
}

#[tokio::test]
async fn a_branch_whose_output_does_not_name_its_children_fails_and_says_why() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let cases = [
        (
            r#"echo '{"next": ["load", "nope"]}' > "$SKED_OUTPUT""#,
            "the branch chose 'nope', which does not depend on it (the tasks that do: 'load', 'skip_it')",
        ),
        (
            r#"echo '["load"]'"#,
            r#"a branch's output must be {"next": [names of the tasks that depend on it]}, not ["load"]"#,
        ),
        (
            r#"echo '{"next": [1]}'"#,
            r#"a branch's output must be {"next": [names of the tasks that depend on it]}, not {"next": [1]}"#,
        ),
        (
            "echo no output",
            r#"a branch's output must be {"next": [names of the tasks that depend on it]}, not null"#,
        ),
    ];
    for (script, error) in cases {
        let mut decide = sh("decide", script, &[]);
        decide["branch"] = json!(true);
        let wf = submit(
            &db.pool,
            json!({"tasks": [decide, sh("load", "true", &["decide"]), sh("skip_it", "true", &["decide"])]}),
        )
        .await;
        assert_eq!(
            wait_for_workflow(&db.pool, wf, Duration::from_secs(30)).await,
            "failed",
            "{script}"
        );
        assert_eq!(
            states(&db.pool, wf).await,
            map(&[
                ("decide", "failed"),
                ("load", "upstream_failed"),
                ("skip_it", "upstream_failed"),
            ]),
            "{script}: the branch's attempt failed, so nothing after it ran"
        );
        assert_eq!(
            error_of(&db.pool, wf, "decide").await.as_deref(),
            Some(error),
            "{script}"
        );
    }
    // An empty choice is a choice: every child is skipped, and the workflow succeeds.
    let mut decide = sh("decide", r#"echo '{"next": []}'"#, &[]);
    decide["branch"] = json!(true);
    let wf = submit(
        &db.pool,
        json!({"tasks": [decide, sh("load", "true", &["decide"])]}),
    )
    .await;
    assert_eq!(
        wait_for_workflow(&db.pool, wf, Duration::from_secs(30)).await,
        "succeeded"
    );
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[("decide", "succeeded"), ("load", "skipped")])
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn bad_branches_are_rejected_with_the_rule_and_nothing_is_inserted() {
    let db = TestDb::new().await;
    let cases = [
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "branch": "yes"},
                             {"name": "b", "kind": "noop", "depends_on": ["a"]}]}),
            "workflows_branch_must_be_a_boolean",
            "branch of task 'a' must be true or false, not \"yes\"",
        ),
        (
            json!({"tasks": [{"name": "a", "command": ["true"], "branch": true},
                             {"name": "b", "kind": "noop"}]}),
            "workflows_branch_must_have_children",
            "task 'a' is a branch, but no task depends on it",
        ),
        (
            json!({"tasks": [{"name": "a", "kind": "noop", "branch": true},
                             {"name": "b", "kind": "noop", "depends_on": ["a"]}]}),
            "workflows_branch_must_be_a_command",
            "task 'a' is a branch, but a noop task writes no output to choose with",
        ),
        (
            json!({"tasks": [{"name": "a", "command": ["true"], "branch": true, "shards": 3},
                             {"name": "b", "kind": "noop", "depends_on": ["a"]}]}),
            "workflows_branch_must_not_be_sharded",
            "task 'a' is a branch and sharded",
        ),
    ];
    for (spec, rule, says) in cases {
        assert_refused(&db.pool, &spec, rule, says).await;
    }
}

#[tokio::test]
async fn a_rerun_keeps_the_children_a_branch_did_not_choose_skipped_and_a_rerun_branch_chooses_again()
 {
    let db = TestDb::new().await;
    let t0 = Utc::now() + chrono::Duration::seconds(5);
    // c depends on x and on the branch, which does not choose it; x then fails.
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            {"name": "decide", "command": ["true"], "branch": true, "max_attempts": 1},
            {"name": "x", "kind": "noop", "max_attempts": 1},
            {"name": "b", "kind": "noop", "depends_on": ["decide"]},
            {"name": "c", "kind": "noop", "depends_on": ["x", "decide"], "trigger_rule": "all_done"},
        ]}),
    )
    .await;
    assert_eq!(claim_all(&db.pool, t0).await, vec!["decide", "x"]);
    assert_eq!(
        finish_with_output(&db.pool, wf, "decide", json!({"next": "b"}), t0).await,
        "succeeded"
    );
    finish(&db.pool, wf, "x", "failed", t0).await;
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[
            ("decide", "succeeded"),
            ("x", "failed"),
            ("b", "waiting"),
            ("c", "skipped")
        ]),
        "a child the branch did not choose is skipped whatever its trigger rule (all_done)"
    );
    assert_eq!(claim_all(&db.pool, t0).await, vec!["b"]);
    finish(&db.pool, wf, "b", "succeeded", t0).await;

    // Running x again does not bring c back: the branch outside the re-run still did not
    // choose it.
    let retried: Option<i32> = sqlx::query_scalar("select sked.workflow_retry($1, $2)")
        .bind(wf)
        .bind(t0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(retried, Some(1), "x, the failed task, is re-run");
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[
            ("decide", "succeeded"),
            ("x", "waiting"),
            ("b", "succeeded"),
            ("c", "skipped")
        ])
    );
    assert_eq!(
        error_of(&db.pool, wf, "c").await.as_deref(),
        Some("skipped: the branch 'decide' did not choose it")
    );
    assert_eq!(claim_all(&db.pool, t0).await, vec!["x"]);
    finish(&db.pool, wf, "x", "succeeded", t0).await;
    assert_eq!(workflow_state(&db.pool, wf).await, "succeeded");

    // Running the branch again puts its skipped children back behind it, and it decides again.
    let decide = task_id(&db.pool, wf, "decide").await;
    let after: String = sqlx::query_scalar("select sked.task_retry($1, $2)")
        .bind(decide)
        .bind(t0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, "waiting");
    assert_eq!(
        states(&db.pool, wf).await,
        map(&[
            ("decide", "waiting"),
            ("x", "succeeded"),
            ("b", "succeeded"),
            ("c", "blocked")
        ])
    );
    assert_eq!(claim_all(&db.pool, t0).await, vec!["decide"]);
    finish_with_output(&db.pool, wf, "decide", json!({"next": ["c"]}), t0).await;
    assert_eq!(claim_all(&db.pool, t0).await, vec!["c"]);
    finish(&db.pool, wf, "c", "succeeded", t0).await;
    assert_eq!(workflow_state(&db.pool, wf).await, "succeeded");
}

#[tokio::test]
async fn parameters_fill_placeholders_in_arguments_and_reach_tasks_as_sked_params() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let marker = std::env::temp_dir().join(format!("sked-params-{}", Uuid::new_v4()));
    // A value that a shell would run: it must reach the task as one argument, unread.
    let evil = format!(
        "$(touch {m}); `touch {m}`; echo x > {m}; {{{{ params.day }}}}",
        m = marker.display()
    );
    let params = json!({"day": "2026-12-01", "n": 3, "evil": evil, "deep": {"a": [1, 2]}});
    let wf = submit(
        &db.pool,
        json!({"params": params, "tasks": [{
            "name": "a", "max_attempts": 1,
            "command": ["sh", "-c",
                        r#"printf '%s|%s|%s|%s\n' "$1" "$2" "$3" "$4"; printf '%s\n' "$SKED_PARAMS""#,
                        "sh", "{{ params.day }}", "--n={{params.n}}", "{{ params.evil }}"],
            "args": ["{{params.deep}}"],
        }]}),
    )
    .await;
    assert_eq!(
        wait_for_workflow(&db.pool, wf, Duration::from_secs(30)).await,
        "succeeded"
    );
    let stdout: String = sqlx::query_scalar(
        "select stdout_tail from sked.tasks where workflow_id = $1 and name = 'a'",
    )
    .bind(wf)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let mut lines = stdout.lines();
    assert_eq!(
        lines.next(),
        Some(format!("2026-12-01|--n=3|{evil}|{{\"a\": [1, 2]}}").as_str()),
        "each placeholder is its value, in its own argument, a value is not read again: {stdout}"
    );
    let seen: Value = serde_json::from_str(lines.next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("SKED_PARAMS is JSON ({e}): {stdout}"));
    assert_eq!(seen, params, "SKED_PARAMS holds the workflow's parameters");
    assert!(!marker.exists(), "no shell ever read a parameter");
    let kept: Value = sqlx::query_scalar("select params from sked.workflows where id = $1")
        .bind(wf)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        kept, params,
        "the workflow says which parameters it ran with"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn bad_parameters_are_rejected_with_the_rule_and_nothing_is_inserted() {
    let db = TestDb::new().await;
    let task = |arg: &str| json!({"name": "a", "command": ["echo", arg]});
    let cases = [
        (
            json!({"params": {"day": "d"}, "tasks": [task("{{ params.dayz }}")]}),
            "workflows_placeholders_must_name_parameters",
            "task 'a' uses {{ params.dayz }}, but the workflow has no parameter 'dayz' (its parameters: 'day')",
        ),
        (
            json!({"tasks": [task("{{params.day}}")]}),
            "workflows_placeholders_must_name_parameters",
            "(its parameters: none)",
        ),
        (
            json!({"params": ["day"], "tasks": [task("x")]}),
            "workflows_params_must_be_an_object",
            "must be an object of names and values, not [\"day\"]",
        ),
        (
            json!({"params": {"the day": 1}, "tasks": [task("x")]}),
            "workflows_param_names_must_be_identifiers",
            "'the day'",
        ),
        (
            json!({"params": {"big": "x".repeat(70_000)}, "tasks": [task("x")]}),
            "workflows_params_must_be_at_most_64_kib",
            "at most 65536",
        ),
        // Filling placeholders keeps a task's own faults for its rules to refuse.
        (
            json!({"params": {"x": 1}, "tasks": [{"name": "a", "command": []}]}),
            "tasks_command_must_not_be_empty",
            "",
        ),
    ];
    for (spec, rule, says) in cases {
        assert_refused(&db.pool, &spec, rule, says).await;
    }
    // Text that is no placeholder of a parameter stays as it is.
    let wf = submit(
        &db.pool,
        json!({"params": {"x": 1}, "tasks": [task("{{ tick }} {{ params. x }} {{params.x}}")]}),
    )
    .await;
    let command: Vec<String> =
        sqlx::query_scalar("select command from sked.tasks where workflow_id = $1")
            .bind(wf)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(command, vec!["echo", "{{ tick }} {{ params. x }} 1"]);
}
