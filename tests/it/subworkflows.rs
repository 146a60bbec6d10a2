//! Tests of sub-workflows (`sql/subworkflows.sql`, "Sub-workflows" in docs/workflows.md): a
//! workflow task whose body is a workflow, inline or a stored definition, runs it between its
//! parents and children with a real worker; a re-run from failed reaches inside; cancelling
//! reaches it; one that cannot start fails alone; nesting is bounded; the rules; a submitter's
//! sub-workflows are its own; the REST API shows both ends of the link; and the SQL side of a
//! spawn (`sked.task_spawn`), fenced by its attempt.

use std::time::Duration;

use axum::http::StatusCode;
use chrono::Utc;
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sqlx::{Executor, PgPool};
use uuid::Uuid;

use crate::api::Api;
use crate::support::{config, start_worker, task_id};
use crate::trust_roles::Login;
use crate::workflows::{assert_refused, claim_all, finish_as, map, states, submit, workflow_state};

/// The latest sub-workflow of the named task of `workflow`.
async fn subworkflow_of(pool: &PgPool, workflow: Uuid, name: &str) -> Option<Uuid> {
    sqlx::query_scalar(
        "select s.id from sked.tasks t join sked.workflows s on s.parent_task_id = t.id
          where t.workflow_id = $1 and t.name = $2 order by s.id desc limit 1",
    )
    .bind(workflow)
    .bind(name)
    .fetch_optional(pool)
    .await
    .unwrap()
}

async fn workflows_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sked.workflows")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The error of the named task of `workflow`.
async fn error_of(pool: &PgPool, workflow: Uuid, name: &str) -> Option<String> {
    sqlx::query_scalar("select error from sked.tasks where workflow_id = $1 and name = $2")
        .bind(workflow)
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn wait_until_finished(pool: &PgPool, workflow: Uuid, within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let state = workflow_state(pool, workflow).await;
        if state != "running" {
            return state;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workflow {workflow} should finish within {within:?}: {:?}",
            states(pool, workflow).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn soon() -> chrono::DateTime<Utc> {
    Utc::now() + chrono::Duration::seconds(5)
}

#[tokio::test]
async fn a_worker_runs_an_inline_sub_workflow_between_its_parents_and_children() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let worker = start_worker(&db, config(&["default"]));
    let outer = submit(
        pool,
        json!({"name": "outer", "params": {"region": "eu"}, "tasks": [
            {"name": "a", "command": ["sh", "-c", "echo '{\"from\": \"a\"}'"]},
            {"name": "sub", "depends_on": ["a"], "workflow": {
                "params": {"r": "{{ params.region }}", "n": 3},
                "tasks": [
                    {"name": "x", "command": ["sh", "-c", "echo \"{\\\"r\\\": \\\"$0\\\", \\\"p\\\": $SKED_PARAMS}\"", "{{ params.r }}"]},
                    {"name": "y", "depends_on": ["x"], "command": ["sh", "-c", "cat"]}]}},
            {"name": "z", "depends_on": ["sub"], "command": ["sh", "-c", "cat"]}]}),
    )
    .await;
    assert_eq!(
        wait_until_finished(pool, outer, Duration::from_secs(30)).await,
        "succeeded"
    );
    let inner = subworkflow_of(pool, outer, "sub")
        .await
        .expect("sub ran a sub-workflow");
    assert_eq!(workflow_state(pool, inner).await, "succeeded");
    assert_eq!(
        states(pool, inner).await,
        map(&[("x", "succeeded"), ("y", "succeeded")])
    );
    let (name, params): (String, Value) =
        sqlx::query_as("select name, params from sked.workflows where id = $1")
            .bind(inner)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(
        name, "sub",
        "an inline sub-workflow is named after its task"
    );
    assert_eq!(
        params,
        json!({"r": "eu", "n": 3}),
        "a string parameter took the outer workflow's parameter"
    );
    // x printed its filled argument and its parameters; y passed x's output on; the sub-workflow
    // task's output is its last tasks' outputs by name, which z read as its parent's.
    let x_out = json!({"r": "eu", "p": {"r": "eu", "n": 3}});
    let z_out: Value = sqlx::query_scalar("select output from sked.tasks where id = $1")
        .bind(task_id(pool, outer, "z").await)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(z_out, json!({"sub": {"y": {"x": x_out}}}));
    // In order: a finished before the sub-workflow began, z began after it ended.
    type At = chrono::DateTime<Utc>;
    let (a_end, x_start, y_end, sub_end, z_start): (At, At, At, At, At) = sqlx::query_as(
        "select (select finished_at from sked.tasks where workflow_id = $1 and name = 'a'),
                (select started_at from sked.tasks where workflow_id = $2 and name = 'x'),
                (select finished_at from sked.tasks where workflow_id = $2 and name = 'y'),
                (select finished_at from sked.tasks where workflow_id = $1 and name = 'sub'),
                (select started_at from sked.tasks where workflow_id = $1 and name = 'z')",
    )
    .bind(outer)
    .bind(inner)
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(a_end <= x_start && y_end <= sub_end && sub_end <= z_start);
    let (kind, attempt): (String, i32) =
        sqlx::query_as("select kind, attempt from sked.tasks where id = $1")
            .bind(task_id(pool, outer, "sub").await)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!((kind.as_str(), attempt), ("workflow", 1));
    worker.shutdown().await;
}

#[tokio::test]
async fn a_stored_definition_runs_as_a_sub_workflow_at_the_version_named_or_the_latest() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    for word in ["one", "two"] {
        sqlx::query("select sked.workflow_define('say', $1, 'alice')")
            .bind(json!({"params": {"who": "nobody"},
                         "tasks": [{"name": "s", "command": ["echo", word, "{{ params.who }}"]}]}))
            .execute(pool)
            .await
            .unwrap();
    }
    let outer = submit(
        pool,
        json!({"params": {"me": "alice"}, "tasks": [
            {"name": "pinned", "workflow": {"definition": "say", "version": 1}},
            {"name": "latest", "workflow": {"definition": "say", "params": {"who": "{{ params.me }}"}}}]}),
    )
    .await;
    let mut ran = Vec::new();
    for name in ["pinned", "latest"] {
        let inner = subworkflow_of(pool, outer, name)
            .await
            .expect("started at submission");
        let (command, version): (Vec<String>, i32) = sqlx::query_as(
            "select t.command, d.version from sked.workflows w
               join sked.workflow_definitions d on d.id = w.definition_id
               join sked.tasks t on t.workflow_id = w.id where w.id = $1",
        )
        .bind(inner)
        .fetch_one(pool)
        .await
        .unwrap();
        ran.push((command, version));
    }
    assert_eq!(
        ran,
        vec![
            (vec!["echo".into(), "one".into(), "nobody".into()], 1),
            (vec!["echo".into(), "two".into(), "alice".into()], 2),
        ],
        "the version named, else the latest, with parameters over the definition's own"
    );
    assert_eq!(
        states(pool, outer).await,
        map(&[("pinned", "blocked"), ("latest", "blocked")]),
        "each waits for its sub-workflow"
    );
    let worker = start_worker(&db, config(&["default"]));
    assert_eq!(
        wait_until_finished(pool, outer, Duration::from_secs(30)).await,
        "succeeded"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_re_run_from_failed_reaches_inside_the_sub_workflow() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let marker = std::env::temp_dir().join(format!("sked-subworkflow-{}", Uuid::new_v4()));
    let worker = start_worker(&db, config(&["default"]));
    let outer = submit(
        pool,
        json!({"tasks": [
            {"name": "sub", "workflow": {"tasks": [
                {"name": "ok", "command": ["true"]},
                {"name": "flaky", "depends_on": ["ok"], "max_attempts": 1,
                 "command": ["sh", "-c", "test -e \"$0\" || { touch \"$0\"; echo broken >&2; exit 3; }",
                             marker.to_str().unwrap()]},
                {"name": "after", "depends_on": ["flaky"], "command": ["true"]}]}},
            {"name": "join", "depends_on": ["sub"], "command": ["true"]}]}),
    )
    .await;
    assert_eq!(
        wait_until_finished(pool, outer, Duration::from_secs(30)).await,
        "failed"
    );
    let inner = subworkflow_of(pool, outer, "sub").await.unwrap();
    assert_eq!(
        states(pool, inner).await,
        map(&[
            ("ok", "succeeded"),
            ("flaky", "failed"),
            ("after", "upstream_failed")
        ])
    );
    assert_eq!(
        states(pool, outer).await,
        map(&[("sub", "failed"), ("join", "upstream_failed")])
    );
    let error = error_of(pool, outer, "sub").await.unwrap();
    assert!(
        error.contains(&format!(
            "its sub-workflow {inner} failed: task 'flaky' failed"
        )),
        "the task says which task of its sub-workflow failed: {error}"
    );

    let rerun: i32 = sqlx::query_scalar("select sked.workflow_retry($1)")
        .bind(outer)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(rerun, 1, "the failed sub-workflow task runs again");
    assert_eq!(
        wait_until_finished(pool, outer, Duration::from_secs(30)).await,
        "succeeded"
    );
    assert_eq!(
        subworkflow_of(pool, outer, "sub").await,
        Some(inner),
        "the same sub-workflow ran again from where it failed, no new one"
    );
    assert_eq!(workflow_state(pool, inner).await, "succeeded");
    let attempts: Vec<(String, i32)> =
        sqlx::query_as("select name, attempt from sked.tasks where workflow_id = $1 order by name")
            .bind(inner)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        vec![("after".into(), 1), ("flaky".into(), 2), ("ok".into(), 1)],
        "the task that succeeded did not run again"
    );
    assert_eq!(workflows_count(pool).await, 2);

    // Retried from below: the sub-workflow's own retry carries up to the task that ran it.
    let _ = std::fs::remove_file(&marker);
    sqlx::query("select sked.workflow_retry($1)")
        .bind(outer)
        .execute(pool)
        .await
        .unwrap();
    // Nothing failed: the retry of a workflow that succeeded runs nothing.
    assert_eq!(workflow_state(pool, outer).await, "succeeded");
    sqlx::query("select sked.task_retry($1)")
        .bind(task_id(pool, outer, "sub").await)
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(
        wait_until_finished(pool, outer, Duration::from_secs(30)).await,
        "failed",
        "a re-run of the task after a success starts a new sub-workflow, whose flaky fails"
    );
    let second = subworkflow_of(pool, outer, "sub").await.unwrap();
    assert_ne!(second, inner, "{:?}", error_of(pool, outer, "sub").await);
    assert_eq!(states(pool, second).await["flaky"], "failed");
    let rerun: i32 = sqlx::query_scalar("select sked.workflow_retry($1)")
        .bind(second)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        rerun, 1,
        "retried through the workflow above: its one failed task"
    );
    assert_eq!(
        wait_until_finished(pool, outer, Duration::from_secs(30)).await,
        "succeeded"
    );
    assert_eq!(workflow_state(pool, second).await, "succeeded");
    assert_eq!(subworkflow_of(pool, outer, "sub").await, Some(second));
    assert_eq!(
        states(pool, outer).await,
        map(&[("sub", "succeeded"), ("join", "succeeded")])
    );
    let _ = std::fs::remove_file(&marker);
    worker.shutdown().await;
}

#[tokio::test]
async fn cancelling_the_workflow_or_the_sub_workflow_task_cancels_its_sub_workflow() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let spec = json!({"tasks": [
        {"name": "sub", "workflow": {"tasks": [
            {"name": "in1", "command": ["true"]},
            {"name": "in2", "depends_on": ["in1"], "command": ["true"]}]}},
        {"name": "after", "depends_on": ["sub"], "command": ["true"]}]});

    // The whole workflow: the sub-workflow's unstarted task ends at once, its running one is
    // asked to stop, and the sub-workflow ends cancelled once it has.
    let outer = submit(pool, spec.clone()).await;
    let inner = subworkflow_of(pool, outer, "sub").await.unwrap();
    assert_eq!(claim_all(pool, soon()).await, vec!["in1"]);
    let state: String = sqlx::query_scalar("select sked.workflow_cancel($1)")
        .bind(outer)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(state, "cancelled");
    assert_eq!(
        states(pool, outer).await,
        map(&[("sub", "cancelled"), ("after", "cancelled")])
    );
    assert_eq!(
        states(pool, inner).await,
        map(&[("in1", "running"), ("in2", "cancelled")])
    );
    let asked: bool = sqlx::query_scalar(
        "select cancel_requested_at is not null from sked.tasks where workflow_id = $1 and name = 'in1'",
    )
    .bind(inner)
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(asked, "its running task is asked to stop");
    finish_as(pool, inner, "in1", "cancelled", None, soon()).await;
    assert_eq!(workflow_state(pool, inner).await, "cancelled");
    assert_eq!(
        states(pool, outer).await,
        map(&[("sub", "cancelled"), ("after", "cancelled")]),
        "the sub-workflow's end changes nothing above once its task was cancelled"
    );

    // The task alone: its sub-workflow is cancelled, and its child follows its rule.
    let outer = submit(pool, spec).await;
    let inner = subworkflow_of(pool, outer, "sub").await.unwrap();
    let state: String = sqlx::query_scalar("select sked.task_cancel($1)")
        .bind(task_id(pool, outer, "sub").await)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(state, "cancelled");
    assert_eq!(workflow_state(pool, inner).await, "cancelled");
    assert_eq!(
        states(pool, outer).await,
        map(&[("sub", "cancelled"), ("after", "upstream_failed")])
    );
    assert_eq!(workflow_state(pool, outer).await, "cancelled");
}

#[tokio::test]
async fn a_sub_workflow_that_cannot_start_fails_its_task_alone_and_nesting_is_bounded() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    // A definition whose placeholder needs a parameter the run does not give.
    sqlx::query("select sked.workflow_define('needs', $1, 'alice')")
        .bind(json!({"params": {"day": "monday"},
                     "tasks": [{"name": "s", "command": ["echo", "{{ params.day }}"]}]}))
        .execute(pool)
        .await
        .unwrap();
    // A definition that runs itself, for ever but for the bound.
    sqlx::query("select sked.workflow_define('again', $1, 'alice')")
        .bind(json!({"tasks": [{"name": "a", "command": ["true"]}]}))
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("select sked.workflow_define('again', $1, 'alice')")
        .bind(json!({"tasks": [{"name": "deeper", "workflow": {"definition": "again"}}]}))
        .execute(pool)
        .await
        .unwrap();
    // The version 2 of `needs` drops its default, so that version fails at its start.
    sqlx::query("select sked.workflow_define('needs', $1, 'alice')")
        .bind(json!({"tasks": [{"name": "s", "command": ["echo", "{{ params.day }}"]}]}))
        .execute(pool)
        .await
        .unwrap_err();

    let outer = submit(
        pool,
        json!({"tasks": [
            {"name": "start", "command": ["true"]},
            {"name": "bad", "depends_on": ["start"], "workflow": {"definition": "needs", "params": {"day": null}}},
            {"name": "good", "depends_on": ["start"], "workflow": {"tasks": [{"name": "g", "command": ["true"]}]}},
            {"name": "loop", "depends_on": ["start"], "workflow": {"definition": "again"}},
            {"name": "after_bad", "depends_on": ["bad"], "command": ["true"]}]}),
    )
    .await;
    assert_eq!(claim_all(pool, soon()).await, vec!["start"]);
    finish_as(pool, outer, "start", "succeeded", None, soon()).await;
    let s = states(pool, outer).await;
    assert_eq!(
        (
            s["bad"].as_str(),
            s["after_bad"].as_str(),
            s["good"].as_str(),
            s["loop"].as_str()
        ),
        ("blocked", "blocked", "blocked", "failed"),
        "a null parameter is a value: `needs` starts; the loop failed within the finish ({s:?})"
    );
    // Nested as deep as allowed: the loop's chain ends in a task that could not start.
    let failed: Vec<(i32, String)> = sqlx::query_as(
        "select sked.workflow_depth(workflow_id), error from sked.tasks
          where state = 'failed' and error like 'its sub-workflow could not start%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(
        failed[0].0, 8,
        "the task at depth 8 would start a ninth level"
    );
    assert!(
        failed[0].1.contains(
            "its sub-workflow could not start: it would nest sub-workflows deeper than 8 levels"
        ),
        "{}",
        failed[0].1
    );
    let depth: i32 = sqlx::query_scalar("select max(sked.workflow_depth(id)) from sked.workflows")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(depth, 8);
    // The chain failed up to the loop task; the others went on.
    let error = error_of(pool, outer, "loop").await.unwrap();
    assert!(
        error.contains("its sub-workflow") && error.contains("failed: task 'deeper' failed"),
        "{error}"
    );
    assert_eq!(claim_all(pool, soon()).await, vec!["g", "s"]);

    // A sub-workflow whose start fails (a definition written by hand, whose placeholder names
    // no parameter), beside one that starts: only its own task fails, saying why.
    sqlx::query(
        "insert into sked.workflow_definitions (owner, name, version, spec)
         values ('alice', 'broken', 1, '{\"tasks\": [{\"name\": \"s\", \"command\": [\"echo\", \"{{ params.day }}\"]}]}')",
    )
    .execute(pool)
    .await
    .unwrap();
    let second = submit(
        pool,
        json!({"tasks": [
            {"name": "start", "command": ["true"]},
            {"name": "bad", "depends_on": ["start"], "workflow": {"definition": "broken"}},
            {"name": "good", "depends_on": ["start"], "workflow": {"tasks": [{"name": "g2", "command": ["true"]}]}},
            {"name": "after_bad", "depends_on": ["bad"], "command": ["true"]}]}),
    )
    .await;
    assert_eq!(claim_all(pool, soon()).await, vec!["start"]);
    finish_as(pool, second, "start", "succeeded", None, soon()).await;
    assert_eq!(
        states(pool, second).await,
        map(&[
            ("start", "succeeded"),
            ("bad", "failed"),
            ("good", "blocked"),
            ("after_bad", "upstream_failed")
        ])
    );
    let error = error_of(pool, second, "bad").await.unwrap();
    assert!(
        error.starts_with("its sub-workflow could not start: task 's' uses {{ params.day }}"),
        "{error}"
    );
    assert_eq!(claim_all(pool, soon()).await, vec!["g2"]);
}

#[tokio::test]
async fn bad_sub_workflows_are_refused_and_change_nothing() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    sqlx::query("select sked.workflow_define('etl', $1, 'alice')")
        .bind(json!({"tasks": [{"name": "e", "command": ["true"]}]}))
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("delete from sked.workflows")
        .execute(pool)
        .await
        .unwrap();
    let with = |sub: Value| json!({"tasks": [{"name": "s", "workflow": sub}]});
    let cases = [
        (
            json!({"tasks": [{"name": "s", "command": ["true"], "workflow": {"definition": "etl"}}]}),
            "workflows_subworkflow_task_takes_only_its_place",
            "task 's' runs a sub-workflow; it takes name, depends_on, trigger_rule and workflow only, not 'command'",
        ),
        (
            with(json!("etl")),
            "workflows_subworkflow_must_be_valid",
            "the sub-workflow of task 's': must be an object",
        ),
        (
            with(json!({"definition": "nope"})),
            "workflows_subworkflow_must_be_valid",
            "alice has no workflow definition 'nope'",
        ),
        (
            with(json!({"definition": "etl", "version": 2})),
            "workflows_subworkflow_must_be_valid",
            "alice has no workflow definition 'etl' of version 2",
        ),
        (
            with(json!({"definition": "etl", "version": 0})),
            "workflows_subworkflow_must_be_valid",
            "version must be a whole number from 1",
        ),
        (
            with(json!({"definition": "etl", "tasks": [{"name": "a", "command": ["true"]}]})),
            "workflows_subworkflow_must_be_valid",
            "names a stored definition and also lists tasks",
        ),
        (
            with(
                json!({"tasks": [{"name": "a", "command": ["true"], "depends_on": ["b"]},
                                  {"name": "b", "command": ["true"], "depends_on": ["a"]}]}),
            ),
            "workflows_subworkflow_must_be_valid",
            "the sub-workflow of task 's': the dependencies form a cycle",
        ),
        (
            with(json!({"tasks": [{"name": "deep", "workflow": {"tasks": []}}]})),
            "workflows_subworkflow_must_be_valid",
            "a workflow is an object {\"name\": ..., \"tasks\": [...]} with at least one task",
        ),
        (
            with(json!({"tasks": [{"name": "a", "command": ["true"]}], "colour": "red"})),
            "workflows_subworkflow_must_be_valid",
            "has the unknown key 'colour'",
        ),
        (
            with(json!({"params": [1], "tasks": [{"name": "a", "command": ["true"]}]})),
            "workflows_subworkflow_must_be_valid",
            "params must be an object",
        ),
        (
            with(json!({"definition": "etl", "params": {"x": "{{ params.missing }}"}})),
            "workflows_placeholders_must_name_parameters",
            "uses {{ params.missing }}, but the workflow has no parameter 'missing'",
        ),
    ];
    for (spec, rule, says) in cases {
        assert_refused(pool, &spec, rule, says).await;
    }
    // A plain row cannot be a sub-workflow task outside a workflow, nor another kind with one.
    for (sql, rule) in [
        (
            "insert into sked.tasks (kind, subworkflow) values ('workflow', '{\"definition\": \"etl\"}')",
            "tasks_subworkflow_needs_a_workflow",
        ),
        (
            "insert into sked.tasks (kind) values ('workflow')",
            "tasks_subworkflow_iff_kind_workflow",
        ),
    ] {
        let err = sqlx::query(sql).execute(pool).await.unwrap_err();
        assert_eq!(
            err.as_database_error().and_then(|e| e.constraint()),
            Some(rule),
            "{sql}: {err}"
        );
    }
}

#[tokio::test]
async fn a_submitter_runs_sub_workflows_of_its_own_and_cannot_attach_one_to_another_owners_task() {
    let db = TestDb::new().await;
    let login = Login::new(&db, "sked_submitter").await;
    let mine: Uuid = sqlx::query_scalar("select sked.workflow_submit($1)")
        .bind(json!({"tasks": [{"name": "sub", "workflow": {"tasks": [{"name": "in", "command": ["true"]}]}}]}))
        .fetch_one(&login.pool)
        .await
        .expect("a submitter's sub-workflow starts at its submission");
    let inner = subworkflow_of(&db.pool, mine, "sub")
        .await
        .expect("it started");
    let owners: Vec<String> =
        sqlx::query_scalar("select distinct owner from sked.tasks where workflow_id in ($1, $2)")
            .bind(mine)
            .bind(inner)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(owners.len(), 1);
    assert!(owners[0].starts_with("sked_t_"), "{owners:?}");

    // Alice's sub-workflow task, waiting for its sub-workflow.
    let alices = submit(
        &db.pool,
        json!({"tasks": [{"name": "sub", "workflow": {"tasks": [{"name": "in", "command": ["true"]}]}}]}),
    )
    .await;
    let alices_task = task_id(&db.pool, alices, "sub").await;
    login
        .assert_refused(
            &format!(
                "insert into sked.workflows (owner, name, parent_task_id) values (current_user, 'x', '{alices_task}')"
            ),
            "row-level security",
            "a submitter's workflow cannot name another owner's task as its parent",
        )
        .await;
    // Through the setting the submission reads: refused the same way.
    login
        .assert_refused(
            &format!(
                "select set_config('sked.subworkflow_of', '{alices_task}', false);
                 select sked.workflow_submit('{{\"tasks\": [{{\"name\": \"a\", \"command\": [\"true\"]}}]}}')"
            ),
            "row-level security",
            "nor through the setting a submission reads",
        )
        .await;
    assert_eq!(states(&db.pool, alices).await, map(&[("sub", "blocked")]));
    assert!(
        login
            .pool
            .execute(sqlx::raw_sql(
                "select sked.subworkflows_start(array[gen_random_uuid()], now())"
            ))
            .await
            .is_err(),
        "the start itself is sked's own"
    );
}

#[tokio::test]
async fn rest_submits_a_sub_workflow_and_shows_both_ends_of_the_link() {
    let api = Api::new().await;
    let (status, body) = api
        .post(
            "/api/v1/workflows",
            &api.alice,
            json!({"name": "outer", "tasks": [
                {"name": "sub", "workflow": {"name": "inner", "tasks": [
                    {"name": "in", "command": ["sh", "-c", "sleep 0.2"], "timeout_secs": 5,
                     "env": {"API_TOKEN": "s3cret-value"}}]}},
                {"name": "after", "depends_on": ["sub"], "command": ["true"]}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let outer: Uuid = body["id"].as_str().unwrap().parse().unwrap();
    let inner = subworkflow_of(&api.db.pool, outer, "sub").await.unwrap();
    let timeout: f64 = sqlx::query_scalar(
        "select extract(epoch from timeout)::float8 from sked.tasks where workflow_id = $1",
    )
    .bind(inner)
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    assert_eq!(
        timeout, 5.0,
        "a sub-workflow's task is read as a workflow's task is"
    );

    let (status, detail) = api
        .get(&format!("/api/v1/workflows/{outer}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    let sub = detail["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "sub")
        .unwrap();
    assert_eq!(sub["kind"], "workflow");
    assert_eq!(sub["subworkflow"]["name"], "inner");
    assert!(
        !detail.to_string().contains("s3cret-value"),
        "a secret of the sub-workflow's tasks is masked: {detail}"
    );
    assert_eq!(
        detail["subworkflows"],
        json!([{"task": sub["id"], "workflow": inner, "state": "running"}])
    );
    assert!(detail.get("parent").is_none(), "{detail}");
    let (status, below) = api
        .get(&format!("/api/v1/workflows/{inner}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK, "{below}");
    assert_eq!(
        below["parent"],
        json!({"task": sub["id"], "workflow": outer})
    );
    assert_eq!(below["name"], "inner");
    let (status, _) = api
        .get(&format!("/api/v1/workflows/{inner}"), &api.bob)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "bob sees none of alice's");

    let (status, bad) = api
        .post(
            "/api/v1/workflows",
            &api.alice,
            json!({"tasks": [{"name": "s", "command": ["true"], "workflow": {"definition": "etl"}}]}),
        )
        .await;
    // A rule about the request's content, which its JSON Schema cannot state: 422.
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    assert!(
        bad.to_string().contains(
            "runs a sub-workflow; it takes name, depends_on, trigger_rule and workflow only"
        ),
        "{bad}"
    );
    let (status, bad) = api
        .post(
            "/api/v1/workflows",
            &api.alice,
            json!({"tasks": [{"name": "s", "workflow": {"definition": "nope", "version": 2.0}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    assert!(
        bad.to_string()
            .contains("alice has no workflow definition 'nope' of version 2"),
        "a version read as any integer of a request: {bad}"
    );
    let worker = start_worker(&api.db, config(&["default"]));
    assert_eq!(
        wait_until_finished(&api.db.pool, outer, Duration::from_secs(30)).await,
        "succeeded"
    );
    worker.shutdown().await;
}

/// Claims `fan` of a `fan -> join` workflow; returns the workflow, fan's id and attempt.
async fn running_fan(pool: &PgPool) -> (Uuid, Uuid, i32) {
    let wf = submit(
        pool,
        json!({"name": "f", "tasks": [
            {"name": "fan", "command": ["true"]},
            {"name": "join", "depends_on": ["fan"], "command": ["true"]}]}),
    )
    .await;
    assert!(claim_all(pool, soon()).await.contains(&"fan".to_owned()));
    let fan = task_id(pool, wf, "fan").await;
    let attempt: i32 = sqlx::query_scalar("select attempt from sked.tasks where id = $1")
        .bind(fan)
        .fetch_one(pool)
        .await
        .unwrap();
    (wf, fan, attempt)
}

async fn spawn(pool: &PgPool, task: Uuid, attempt: i32, body: Value) -> Result<Uuid, sqlx::Error> {
    sqlx::query_scalar("select sked.task_spawn($1, $2, $3)")
        .bind(task)
        .bind(attempt)
        .bind(body)
        .fetch_one(pool)
        .await
}

#[tokio::test]
async fn a_spawn_adds_a_sub_workflow_its_task_waits_for_and_the_join_waits_for_it() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let (wf, fan, attempt) = running_fan(pool).await;
    let children = json!({"tasks": [{"name": "c1", "command": ["true"]},
                                    {"name": "c2", "command": ["true"]}]});
    let spawned = spawn(pool, fan, attempt, children.clone()).await.unwrap();
    assert_eq!(
        spawn(pool, fan, attempt, children.clone()).await.unwrap(),
        spawned,
        "spawning again under the same name replaces the spawn, which has not started"
    );
    let loose = spawn(
        pool,
        fan,
        attempt,
        json!({"name": "loose", "wait": false,
                                                 "tasks": [{"name": "l", "command": ["true"]}]}),
    )
    .await
    .unwrap();
    let counts: Vec<(String, i32, i32, i32)> = sqlx::query_as(
        "select name, parents, parents_pending, children from sked.tasks
          where workflow_id = $1 order by id",
    )
    .bind(wf)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        counts,
        vec![
            ("fan".into(), 0, 0, 3),
            ("join".into(), 2, 2, 0),
            ("fan.spawned".into(), 1, 1, 1),
            ("loose".into(), 1, 1, 0),
        ],
        "the join waits for the spawn made with wait, not for the loose one"
    );
    assert_eq!(
        finish_as(pool, wf, "fan", "succeeded", None, soon()).await,
        "succeeded"
    );
    assert_eq!(
        states(pool, wf).await,
        map(&[
            ("fan", "succeeded"),
            ("join", "blocked"),
            ("fan.spawned", "blocked"),
            ("loose", "blocked")
        ])
    );
    assert_eq!(claim_all(pool, soon()).await, vec!["c1", "c2", "l"]);
    let inner = subworkflow_of(pool, wf, "fan.spawned").await.unwrap();
    finish_as(pool, inner, "c1", "succeeded", None, soon()).await;
    assert_eq!(states(pool, wf).await["join"], "blocked", "c2 still runs");
    finish_as(pool, inner, "c2", "succeeded", None, soon()).await;
    assert_eq!(states(pool, wf).await["join"], "waiting");
    assert_eq!(claim_all(pool, soon()).await, vec!["join"]);
    assert_ne!(loose, spawned);
    assert_eq!(states(pool, wf).await["loose"], "blocked", "l still runs");
}

#[tokio::test]
async fn a_spawn_is_refused_after_its_attempt_for_another_attempt_and_outside_a_workflow() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let (wf, fan, attempt) = running_fan(pool).await;
    let body = json!({"tasks": [{"name": "c", "command": ["true"]}]});
    let before = crate::workflows::counts(pool).await;

    let refused = |err: sqlx::Error| {
        let e = err
            .as_database_error()
            .expect("a database error")
            .to_owned();
        (
            e.code().map(|c| c.into_owned()),
            e.constraint().map(str::to_owned),
            e.message().to_owned(),
        )
    };
    let (code, rule, says) = refused(
        spawn(pool, fan, attempt + 1, body.clone())
            .await
            .unwrap_err(),
    );
    assert_eq!(code.as_deref(), Some("42501"));
    assert_eq!(
        rule.as_deref(),
        Some("tasks_spawn_needs_its_running_attempt")
    );
    assert!(
        says.contains("is not running any more (the task is running at attempt 1)"),
        "{says}"
    );
    // Its lease expired: the attempt can prove nothing any more.
    sqlx::query("update sked.tasks set lease_expires_at = now() - interval '1 s' where id = $1")
        .bind(fan)
        .execute(pool)
        .await
        .unwrap();
    let (code, rule, _) = refused(spawn(pool, fan, attempt, body.clone()).await.unwrap_err());
    assert_eq!(
        (code.as_deref(), rule.as_deref()),
        (Some("42501"), Some("tasks_spawn_needs_its_running_attempt"))
    );
    sqlx::query("update sked.tasks set lease_expires_at = now() + interval '1 min' where id = $1")
        .bind(fan)
        .execute(pool)
        .await
        .unwrap();
    finish_as(pool, wf, "fan", "succeeded", None, soon()).await;
    let (code, _, says) = refused(spawn(pool, fan, attempt, body.clone()).await.unwrap_err());
    assert_eq!(code.as_deref(), Some("42501"));
    assert!(
        says.contains("the task is succeeded at attempt 1"),
        "{says}"
    );
    assert_eq!(
        crate::workflows::counts(pool).await,
        before,
        "nothing was added"
    );

    // A task outside a workflow, and bad bodies of a running one.
    let (wf2, fan2, attempt2) = running_fan(pool).await;
    let lone: Uuid = sqlx::query_scalar("select sked.task_submit(command => '{true}')")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(claim_all(pool, soon()).await, vec![lone.to_string()]);
    let lone_attempt = 1;
    let (_, rule, _) = refused(
        spawn(pool, lone, lone_attempt, body.clone())
            .await
            .unwrap_err(),
    );
    assert_eq!(rule.as_deref(), Some("tasks_spawn_needs_a_workflow"));
    for (bad, rule) in [
        (json!(["x"]), "tasks_spawn_body_must_be_an_object"),
        (
            json!({"wait": "yes", "tasks": []}),
            "tasks_spawn_wait_must_be_a_boolean",
        ),
        (
            json!({"name": "", "tasks": []}),
            "tasks_spawn_name_must_be_a_name",
        ),
        (
            json!({"name": "join", "tasks": [{"name": "c", "command": ["true"]}]}),
            "tasks_spawn_name_must_be_new",
        ),
        (
            json!({"tasks": [{"name": "c", "depends_on": ["c"], "command": ["true"]}]}),
            "workflows_subworkflow_must_be_valid",
        ),
        (
            json!({"definition": "nope"}),
            "workflows_subworkflow_must_be_valid",
        ),
    ] {
        let (_, got, says) = refused(spawn(pool, fan2, attempt2, bad.clone()).await.unwrap_err());
        assert_eq!(got.as_deref(), Some(rule), "{bad}: {says}");
    }
    assert_eq!(
        states(pool, wf2).await,
        map(&[("fan", "running"), ("join", "blocked")]),
        "no refused spawn added a task"
    );
}

#[tokio::test]
async fn the_cli_submits_a_yaml_sub_workflow_and_shows_both_ends() {
    let api = crate::cli::Api::start().await;
    let file = std::env::temp_dir().join(format!("sked-subworkflow-{}.yaml", Uuid::new_v4()));
    std::fs::write(
        &file,
        "name: outer\ntasks:\n  - name: sub\n    workflow:\n      tasks:\n        - name: in\n          command: [\"true\"]\n          timeout_secs: 30\n  - name: after\n    depends_on: [sub]\n    command: [\"true\"]\n",
    )
    .unwrap();
    let out = api.ok(&["submit", "-f", file.to_str().unwrap()]).await;
    let _ = std::fs::remove_file(&file);
    let outer: Uuid = out
        .split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("the new workflow's id in {out:?}"));
    let inner = subworkflow_of(&api.db.pool, outer, "sub")
        .await
        .expect("it started");
    let shown = api.ok(&["workflow", "show", &outer.to_string()]).await;
    assert!(
        shown.contains(&format!("sub-workflow {inner} running")),
        "the task's line names its sub-workflow: {shown}"
    );
    let below = api.ok(&["workflow", "show", &inner.to_string()]).await;
    let sub = task_id(&api.db.pool, outer, "sub").await;
    assert!(
        below.contains(&format!(
            "parent:    sub-workflow of task {sub} in workflow {outer}"
        )),
        "{below}"
    );
}

#[tokio::test]
async fn the_tasks_of_an_inline_sub_workflow_count_toward_the_quota() {
    let api = Api::with_quotas(sked_server::Quotas {
        max_rows_per_request: 5,
        ..sked_server::Quotas::default()
    })
    .await;
    let inner = |n: usize| -> Value {
        let tasks: Vec<Value> = (0..n)
            .map(|i| json!({"name": format!("t{i}"), "kind": "noop"}))
            .collect();
        json!({"tasks": [{"name": "sub", "workflow": {"tasks": tasks}}]})
    };
    // The task and its sub-workflow's five tasks: six rows, over the five a request may make.
    let (status, body) = api.post("/api/v1/workflows", &api.alice, inner(5)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert!(
        body.to_string().contains("would create 6 task rows"),
        "{body}"
    );
    assert_eq!(workflows_count(&api.db.pool).await, 0);
    let (status, body) = api.post("/api/v1/workflows", &api.alice, inner(4)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}
