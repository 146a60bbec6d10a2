//! What a task asks of its worker — `cpu_millis`, `memory_mb`, `max_output_bytes`, `run_as`,
//! and whether it is `preemptible` — through every way in: plain SQL, the submit functions,
//! REST (one by JSON, a large batch by COPY), workflows, shards, resubmit, schedules and the
//! CLI; and bad values refused with readable messages and nothing written, among them
//! commands and environments larger than exec takes.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::PgPool;
use uuid::Uuid;

use crate::api::{Api, assert_error};
use crate::cli;
use crate::support::insert;

/// The four columns of a task, as stored.
async fn stored(
    pool: &PgPool,
    id: Uuid,
) -> (Option<i32>, Option<i32>, Option<i64>, Option<String>) {
    sqlx::query_as(
        "select cpu_millis, memory_mb, max_output_bytes, run_as from sked.tasks where id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// What every test asks for: half a core, 256 MB, 1 MB of output, as `nobody`.
fn asked() -> (Option<i32>, Option<i32>, Option<i64>, Option<String>) {
    (
        Some(500),
        Some(256),
        Some(1_000_000),
        Some("nobody".to_owned()),
    )
}

async fn count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn every_sql_way_in_keeps_the_requests() {
    let api = Api::new().await;
    let pool = &api.db.pool;

    let plain = insert(
        pool,
        "(command, cpu_millis, memory_mb, max_output_bytes, run_as) \
         values ('{true}', 500, 256, 1000000, 'nobody')",
    )
    .await;
    assert_eq!(stored(pool, plain).await, asked(), "a plain INSERT");

    let by_fn: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['true'], cpu_millis => 500, memory_mb => 256,
                                 max_output_bytes => 1000000, run_as => 'nobody')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(stored(pool, by_fn).await, asked(), "sked.task_submit");

    let by_json: Uuid = sqlx::query_scalar(
        r#"select id from sked.tasks_submit('[{"command": ["true"], "cpu_millis": 500,
             "memory_mb": 256, "max_output_bytes": 1000000, "run_as": "nobody"}]')"#,
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(stored(pool, by_json).await, asked(), "sked.tasks_submit");
    let unset: Uuid =
        sqlx::query_scalar(r#"select id from sked.tasks_submit('[{"command": ["true"]}]')"#)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(
        stored(pool, unset).await,
        (None, None, None, None),
        "absent means no request"
    );

    let workflow: Uuid = sqlx::query_scalar(
        r#"select sked.workflow_submit('{"tasks": [{"name": "a", "command": ["true"],
             "cpu_millis": 500, "memory_mb": 256, "max_output_bytes": 1000000,
             "run_as": "nobody"}]}')"#,
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let node: Uuid = sqlx::query_scalar("select id from sked.tasks where workflow_id = $1")
        .bind(workflow)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(stored(pool, node).await, asked(), "a workflow's task");

    let parent: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['true'], shards => 3, cpu_millis => 500,
                                 memory_mb => 256, max_output_bytes => 1000000, run_as => 'nobody')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let shards: Vec<Uuid> = sqlx::query_scalar("select id from sked.tasks where shard_of = $1")
        .bind(parent)
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(shards.len(), 3);
    for shard in shards {
        assert_eq!(stored(pool, shard).await, asked(), "each shard copies them");
    }

    let again: Uuid = sqlx::query_scalar("select sked.task_resubmit($1, 'alice')")
        .bind(by_fn)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(stored(pool, again).await, asked(), "a resubmitted task");
}

#[tokio::test]
async fn rest_keeps_and_shows_the_requests_one_by_one_and_by_copy() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let task = json!({"command": ["true"], "cpu_millis": 500, "memory_mb": 256,
                      "max_output_bytes": 1_000_000, "run_as": "nobody"});
    let (status, one) = api.post("/api/v1/tasks", &api.alice, task.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{one}");
    let id: Uuid = one["ids"][0].as_str().unwrap().parse().unwrap();
    assert_eq!(stored(pool, id).await, asked());
    let (_, detail) = api.get(&format!("/api/v1/tasks/{id}"), &api.alice).await;
    for (field, value) in [
        ("cpu_millis", json!(500)),
        ("memory_mb", json!(256)),
        ("max_output_bytes", json!(1_000_000)),
        ("run_as", json!("nobody")),
    ] {
        assert_eq!(detail[field], value, "GET shows {field}");
    }

    // 100 tasks go in by COPY (sked_db::task::submit); the columns travel too.
    let tasks: Vec<Value> = (0..100).map(|_| task.clone()).collect();
    let (status, many) = api
        .post("/api/v1/tasks/batch", &api.alice, json!({ "tasks": tasks }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{many}");
    let ids: Vec<Uuid> = many["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 100);
    for id in [ids[0], ids[99]] {
        assert_eq!(stored(pool, id).await, asked(), "a task of a COPY batch");
    }
    let mixed: Vec<Value> = (0..100)
        .map(|i| {
            if i % 2 == 0 {
                task.clone()
            } else {
                json!({"command": ["true"]})
            }
        })
        .collect();
    let (_, mixed) = api
        .post("/api/v1/tasks/batch", &api.alice, json!({ "tasks": mixed }))
        .await;
    let second: Uuid = mixed["ids"][1].as_str().unwrap().parse().unwrap();
    assert_eq!(
        stored(pool, second).await,
        (None, None, None, None),
        "absent stays null"
    );

    // A schedule's template carries them to its occurrences.
    let (status, schedule) = api
        .post(
            "/api/v1/schedules",
            &api.alice,
            json!({"name": "nightly", "cron": "0 0 * * *", "task": task}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{schedule}");
    let (status, ran) = api
        .post(
            &format!("/api/v1/schedules/{}/run", schedule["id"].as_str().unwrap()),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ran}");
    let occurrence: Uuid = ran["task_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        stored(pool, occurrence).await,
        asked(),
        "a schedule's occurrence"
    );
}

#[tokio::test]
async fn bad_requests_are_refused_with_the_rule_and_write_nothing() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let cases = [
        (
            json!({"cpu_millis": 0}),
            "cpu_millis must be between 1 and 1000000",
        ),
        (
            json!({"cpu_millis": 1_000_001}),
            "cpu_millis must be between 1 and 1000000",
        ),
        (
            json!({"memory_mb": -1}),
            "memory_mb must be between 1 and 16777216",
        ),
        (
            json!({"max_output_bytes": 0}),
            "max_output_bytes must be positive",
        ),
        (json!({"run_as": "no body"}), "run_as must be a user name"),
        (json!({"run_as": ""}), "run_as must be a user name"),
    ];
    for (fields, says) in cases {
        let mut task = json!({"command": ["true"]});
        task.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        let (status, body) = api.post("/api/v1/tasks", &api.alice, task.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{task}: {body}");
        assert_error(&body, "rejected");
        assert!(
            body["message"].as_str().unwrap().contains(says),
            "{task}: the message says {says:?}: {body}"
        );
    }
    assert_eq!(count(pool).await, 0, "nothing was inserted");

    for (column, value, rule) in [
        ("cpu_millis", "0", "tasks_cpu_millis_must_be_1_to_1000000"),
        (
            "memory_mb",
            "16777217",
            "tasks_memory_mb_must_be_1_to_16777216",
        ),
        (
            "max_output_bytes",
            "-5",
            "tasks_max_output_bytes_must_be_positive",
        ),
        (
            "run_as",
            "'root; rm -rf /'",
            "tasks_run_as_must_be_a_user_name_or_uid",
        ),
    ] {
        let err = sqlx::query(sqlx::AssertSqlSafe(format!(
            "insert into sked.tasks (command, {column}) values ('{{true}}', {value})"
        )))
        .execute(pool)
        .await
        .expect_err("a bad value is refused");
        let db = err.as_database_error().expect("a database error");
        assert_eq!(db.constraint(), Some(rule), "{column} = {value}");
    }
    assert_eq!(count(pool).await, 0, "nothing was inserted");
}

#[tokio::test]
async fn the_cli_takes_cores_sizes_and_a_user_and_refuses_bad_ones_before_any_request() {
    let api = cli::Api::start().await;
    let pool = &api.db.pool;
    let out = api
        .ok(&[
            "submit",
            "--cpu",
            "0.5",
            "--memory",
            "256M",
            "--max-output",
            "1000000",
            "--run-as",
            "nobody",
            "--",
            "true",
        ])
        .await;
    let id: Uuid = out.trim().parse().expect("submit prints the id");
    assert_eq!(stored(pool, id).await, asked());
    let shown = api.ok(&["show", &id.to_string()]).await;
    assert!(
        shown.contains("cpu 500m, memory 256 MB") && shown.contains("nobody"),
        "sked show prints the requests: {shown}"
    );

    for (flag, value) in [
        ("--cpu", "0"),
        ("--cpu", "lots"),
        ("--memory", "12X"),
        ("--memory", "0"),
        ("--max-output", "-1"),
    ] {
        let out = cli::output(&mut api.sked(&["submit", flag, value, "--", "true"])).await;
        assert!(!out.status.success(), "{flag} {value} is refused");
        let stderr = cli::text(&out.stderr);
        assert!(stderr.contains(flag), "the error names {flag}: {stderr}");
    }
    assert_eq!(count(pool).await, 1, "refused flags submitted nothing");
}

/// Whether a task is preemptible, as stored.
async fn preemptible(pool: &PgPool, id: Uuid) -> bool {
    sqlx::query_scalar("select preemptible from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

fn ids_of(answer: &Value) -> Vec<Uuid> {
    answer["ids"]
        .as_array()
        .unwrap_or_else(|| panic!("an answer with ids: {answer}"))
        .iter()
        .map(|id| id.as_str().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test]
async fn every_sql_way_in_keeps_preemptible() {
    let api = Api::new().await;
    let pool = &api.db.pool;

    let plain = insert(pool, "(command) values ('{true}')").await;
    assert!(
        !preemptible(pool, plain).await,
        "a plain INSERT is not preemptible"
    );
    let marked = insert(pool, "(command, preemptible) values ('{true}', true)").await;
    assert!(
        preemptible(pool, marked).await,
        "a plain INSERT that says so"
    );

    let by_fn: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['true'], preemptible => true)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(preemptible(pool, by_fn).await, "sked.task_submit");
    let by_fn_default: Uuid =
        sqlx::query_scalar("select sked.task_submit(command => array['true'])")
            .fetch_one(pool)
            .await
            .unwrap();
    assert!(
        !preemptible(pool, by_fn_default).await,
        "sked.task_submit defaults to false"
    );

    let by_json: Vec<Uuid> = sqlx::query_scalar(
        r#"select id from sked.tasks_submit('[{"command": ["true"], "preemptible": true},
                                              {"command": ["true"], "preemptible": false},
                                              {"command": ["true"], "preemptible": null},
                                              {"command": ["true"]}]')"#,
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut got = Vec::new();
    for id in &by_json {
        got.push(preemptible(pool, *id).await);
    }
    assert_eq!(
        got,
        [true, false, false, false],
        "sked.tasks_submit: true is kept; false, null and absent mean not preemptible"
    );

    let workflow: Uuid = sqlx::query_scalar(
        r#"select sked.workflow_submit('{"tasks": [
             {"name": "a", "command": ["true"], "preemptible": true},
             {"name": "b", "command": ["true"], "depends_on": ["a"]}]}')"#,
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let nodes: Vec<(String, bool)> = sqlx::query_as(
        "select name, preemptible from sked.tasks where workflow_id = $1 order by name",
    )
    .bind(workflow)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        nodes,
        [("a".to_owned(), true), ("b".to_owned(), false)],
        "a workflow's tasks keep their own preemptible"
    );

    let parent: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['true'], shards => 3, preemptible => true)",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(preemptible(pool, parent).await, "the sharded parent");
    let shards: Vec<bool> =
        sqlx::query_scalar("select preemptible from sked.tasks where shard_of = $1")
            .bind(parent)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        shards,
        [true, true, true],
        "shards inherit preemptible from their parent"
    );
    let sharded_plain: Uuid =
        sqlx::query_scalar("select sked.task_submit(command => array['true'], shards => 2)")
            .fetch_one(pool)
            .await
            .unwrap();
    let plain_shards: Vec<bool> =
        sqlx::query_scalar("select preemptible from sked.tasks where shard_of = $1")
            .bind(sharded_plain)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        plain_shards,
        [false, false],
        "and so does a parent that is not"
    );

    let again: Uuid = sqlx::query_scalar("select sked.task_resubmit($1, 'alice')")
        .bind(by_fn)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(preemptible(pool, again).await, "a resubmitted task");
    let again_sharded: Uuid = sqlx::query_scalar("select sked.task_resubmit($1, 'alice')")
        .bind(parent)
        .fetch_one(pool)
        .await
        .unwrap();
    let resubmitted_shards: Vec<bool> =
        sqlx::query_scalar("select preemptible from sked.tasks where shard_of = $1")
            .bind(again_sharded)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        resubmitted_shards,
        [true, true, true],
        "the new shards of a resubmitted sharded task"
    );

    let schedule: Uuid = sqlx::query_scalar(
        r#"select sked.schedule_create(name => 'nightly', cron => '0 0 * * *',
             task => '{"command": ["true"], "preemptible": true}')"#,
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let occurrence: Uuid = sqlx::query_scalar("select sked.schedule_run_now($1)")
        .bind(schedule)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(
        preemptible(pool, occurrence).await,
        "a schedule's template carries it to its occurrences"
    );
}

#[tokio::test]
async fn rest_keeps_and_shows_preemptible_one_by_one_by_copy_and_in_workflows_and_schedules() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let task = json!({"command": ["true"], "preemptible": true});

    let (status, one) = api.post("/api/v1/tasks", &api.alice, task.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{one}");
    let id = ids_of(&one)[0];
    assert!(preemptible(pool, id).await);
    let (_, detail) = api.get(&format!("/api/v1/tasks/{id}"), &api.alice).await;
    assert_eq!(
        detail["preemptible"],
        json!(true),
        "GET shows preemptible: {detail}"
    );
    let (_, plain) = api
        .post("/api/v1/tasks", &api.alice, json!({"command": ["true"]}))
        .await;
    let plain = ids_of(&plain)[0];
    let (_, detail) = api.get(&format!("/api/v1/tasks/{plain}"), &api.alice).await;
    assert_eq!(
        detail["preemptible"],
        json!(false),
        "GET shows false for a task that is not: {detail}"
    );

    // 100 tasks go in by COPY (sked_db::task::submit): true where given, false elsewhere.
    let mixed: Vec<Value> = (0..100)
        .map(|i| {
            if i % 2 == 0 {
                task.clone()
            } else {
                json!({"command": ["true"]})
            }
        })
        .collect();
    let (status, many) = api
        .post("/api/v1/tasks/batch", &api.alice, json!({ "tasks": mixed }))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{many}");
    let ids = ids_of(&many);
    assert_eq!(ids.len(), 100);
    for (i, id) in [(0, ids[0]), (1, ids[1]), (98, ids[98]), (99, ids[99])] {
        assert_eq!(
            preemptible(pool, id).await,
            i % 2 == 0,
            "task {i} of a COPY batch"
        );
    }
    // A small batch goes through sked.tasks_submit instead.
    let (status, few) = api
        .post(
            "/api/v1/tasks/batch",
            &api.alice,
            json!({"tasks": [task.clone(), {"command": ["true"]}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{few}");
    let few = ids_of(&few);
    assert!(preemptible(pool, few[0]).await && !preemptible(pool, few[1]).await);

    // Resubmitting keeps it.
    let (status, again) = api
        .post(
            &format!("/api/v1/tasks/{id}/resubmit"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert!(
        preemptible(pool, ids_of(&again)[0]).await,
        "a resubmitted task"
    );

    // A workflow's task.
    let (status, workflow) = api
        .post(
            "/api/v1/workflows",
            &api.alice,
            json!({"tasks": [{"name": "a", "command": ["true"], "preemptible": true},
                             {"name": "b", "command": ["true"], "depends_on": ["a"]}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{workflow}");
    let (_, detail) = api
        .get(
            &format!("/api/v1/workflows/{}", workflow["id"].as_str().unwrap()),
            &api.alice,
        )
        .await;
    let flags: Vec<(&str, &Value)> = detail["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), &t["preemptible"]))
        .collect();
    assert_eq!(
        flags,
        [("a", &json!(true)), ("b", &json!(false))],
        "a workflow's tasks keep their own"
    );

    // A sharded task's shards inherit it.
    let (status, sharded) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "shards": 2, "preemptible": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{sharded}");
    let shards: Vec<bool> =
        sqlx::query_scalar("select preemptible from sked.tasks where shard_of = $1")
            .bind(ids_of(&sharded)[0])
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(shards, [true, true], "shards inherit preemptible");

    // A schedule's template carries it to its occurrences.
    let (status, schedule) = api
        .post(
            "/api/v1/schedules",
            &api.alice,
            json!({"name": "nightly", "cron": "0 0 * * *", "task": task}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{schedule}");
    let (status, ran) = api
        .post(
            &format!("/api/v1/schedules/{}/run", schedule["id"].as_str().unwrap()),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ran}");
    let occurrence: Uuid = ran["task_id"].as_str().unwrap().parse().unwrap();
    assert!(
        preemptible(pool, occurrence).await,
        "a schedule's occurrence"
    );
}

#[tokio::test]
async fn a_preemptible_service_and_a_preemptible_that_is_not_a_boolean_are_refused() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let rule = "tasks_services_are_not_preemptible";
    let says = "a service cannot be preemptible";

    for statement in [
        "insert into sked.tasks (kind, command, preemptible) values ('service', '{sleep,60}', true)",
        "select sked.task_submit(kind => 'service', command => array['sleep', '60'], preemptible => true)",
        r#"select * from sked.tasks_submit('[{"kind": "service", "command": ["sleep", "60"],
                                            "preemptible": true}]')"#,
    ] {
        let err = sqlx::query(statement)
            .execute(pool)
            .await
            .expect_err("a preemptible service is refused");
        let db = err.as_database_error().expect("a database error");
        assert_eq!(db.constraint(), Some(rule), "{statement}");
    }
    assert_eq!(count(pool).await, 0, "nothing was inserted");

    let service = json!({"kind": "service", "command": ["sleep", "60"], "preemptible": true});
    let (status, body) = api.post("/api/v1/tasks", &api.alice, service.clone()).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_error(&body, "rejected");
    assert!(
        body["message"].as_str().unwrap().contains(says),
        "the message states the rule: {body}"
    );
    // In a batch large enough for COPY, one preemptible service rejects all of it.
    let mut batch: Vec<Value> = (0..99).map(|_| json!({"command": ["true"]})).collect();
    batch.push(service);
    let (status, body) = api
        .post("/api/v1/tasks/batch", &api.alice, json!({ "tasks": batch }))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_error(&body, "rejected");
    assert!(
        body["message"].as_str().unwrap().contains(says),
        "the message states the rule: {body}"
    );
    assert_eq!(count(pool).await, 0, "nothing was inserted");

    // Only a JSON boolean is a value of preemptible: the REST API refuses anything else before
    // the database, and so do the JSON functions of the SQL contract (whose reading of text
    // would otherwise take 1 or "yes" for true).
    for value in [
        json!("yes"),
        json!(1),
        json!("true"),
        json!([true]),
        json!({}),
    ] {
        let task = json!({"command": ["true"], "preemptible": value});
        let (status, body) = api.post("/api/v1/tasks", &api.alice, task.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{task}: {body}");
        assert_error(&body, "invalid_request");
        assert!(
            body["message"].as_str().unwrap().contains("preemptible"),
            "{task}: the message names the field: {body}"
        );

        let array = json!([task]);
        let err = sqlx::query("select * from sked.tasks_submit($1)")
            .bind(&array)
            .execute(pool)
            .await
            .expect_err("sked.tasks_submit refuses a preemptible that is not a boolean");
        let db = err.as_database_error().expect("a database error");
        assert_eq!(
            db.constraint(),
            Some("tasks_preemptible_must_be_a_boolean"),
            "{array}"
        );
        let spec = json!({"tasks": [{"name": "a", "command": ["true"], "preemptible": value}]});
        let err = sqlx::query("select sked.workflow_submit($1)")
            .bind(&spec)
            .execute(pool)
            .await
            .expect_err("sked.workflow_submit refuses it too");
        let db = err.as_database_error().expect("a database error");
        assert_eq!(
            db.constraint(),
            Some("tasks_preemptible_must_be_a_boolean"),
            "{spec}"
        );
    }
    let (status, body) = api
        .post(
            "/api/v1/schedules",
            &api.alice,
            json!({"name": "n", "cron": "0 0 * * *",
                   "task": {"command": ["true"], "preemptible": "yes"}}),
        )
        .await;
    assert!(
        status.is_client_error(),
        "a schedule's template too: {body}"
    );
    assert_eq!(count(pool).await, 0, "nothing was inserted");
    let schedules: i64 = sqlx::query_scalar("select count(*) from sked.schedules")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(schedules, 0, "no schedule was created");

    // A running service cannot be made preemptible either: its changes do not take the key.
    let (status, body) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"kind": "service", "command": ["sleep", "60"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let service = ids_of(&body)[0];
    let (status, body) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/services/{service}"),
            &api.alice,
            Some(json!({"preemptible": true})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("preemptible"),
        "the message names the key: {body}"
    );
    assert!(
        !preemptible(pool, service).await,
        "the service is unchanged"
    );
}

#[tokio::test]
async fn the_cli_submits_preemptible_tasks_and_schedules_shows_them_and_refuses_services() {
    let api = cli::Api::start().await;
    let pool = &api.db.pool;
    let out = api.ok(&["submit", "--preemptible", "--", "true"]).await;
    let id: Uuid = out.trim().parse().expect("submit prints the id");
    assert!(preemptible(pool, id).await, "sked submit --preemptible");
    let shown = api.ok(&["show", &id.to_string()]).await;
    assert!(
        shown.contains("preemptible:"),
        "sked show prints that the task is preemptible: {shown}"
    );
    let out = api.ok(&["submit", "--", "true"]).await;
    let plain: Uuid = out.trim().parse().unwrap();
    assert!(!preemptible(pool, plain).await, "not without the flag");
    let shown = api.ok(&["show", &plain.to_string()]).await;
    assert!(
        !shown.contains("preemptible"),
        "sked show says nothing of it for a task that is not: {shown}"
    );

    for (args, says) in [
        (
            &["submit", "--service", "--preemptible", "--", "sleep", "60"][..],
            "--preemptible",
        ),
        (
            &[
                "submit",
                "--kind",
                "service",
                "--preemptible",
                "--",
                "sleep",
                "60",
            ][..],
            "not for services",
        ),
    ] {
        let out = cli::output(&mut api.sked(args)).await;
        assert!(!out.status.success(), "{args:?} is refused");
        let stderr = cli::text(&out.stderr);
        assert!(
            stderr.contains(says),
            "{args:?}: the error says {says:?}: {stderr}"
        );
    }
    assert_eq!(count(pool).await, 2, "refused services submitted nothing");

    // A service is never preemptible, so `sked service update` does not offer the flag.
    let service = api.ok(&["submit", "--service", "--", "sleep", "60"]).await;
    let service = service.trim().to_owned();
    let out = cli::output(&mut api.sked(&["service", "update", &service, "--preemptible"])).await;
    assert!(
        !out.status.success(),
        "sked service update has no --preemptible"
    );
    assert!(
        cli::text(&out.stderr).contains("--preemptible"),
        "the error names the flag"
    );

    api.ok(&[
        "schedule",
        "create",
        "nightly",
        "--cron",
        "0 0 * * *",
        "--preemptible",
        "--",
        "true",
    ])
    .await;
    let template: Value =
        sqlx::query_scalar("select task from sked.schedules where name = 'nightly'")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(
        template["preemptible"],
        json!(true),
        "sked schedule create --preemptible: {template}"
    );
}

/// The rule of a refused statement, as its error's constraint.
async fn refused_by(pool: &PgPool, sql: &str, binds: &[&str]) -> String {
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()));
    for b in binds {
        query = query.bind(*b);
    }
    let err = query
        .execute(pool)
        .await
        .expect_err("a task exec would refuse is refused at submit");
    let db = err.as_database_error().expect("a database error");
    assert_eq!(
        db.code().as_deref(),
        Some("23514"),
        "{sql}: check_violation"
    );
    db.constraint().unwrap_or_default().to_owned()
}

const ONE_STRING_TOO_LONG: &str = "tasks_argument_and_env_strings_must_be_at_most_131072_bytes";
const TOO_MUCH_IN_ALL: &str = "tasks_command_and_env_must_total_at_most_1048576_bytes";

#[tokio::test]
async fn a_command_or_env_exec_would_refuse_is_refused_at_submit_by_every_way_in() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let big = "x".repeat(200 * 1024);

    // Plain SQL, the submit functions, and an update: one 200 KB argument or env value.
    for (sql, binds) in [
        ("insert into sked.tasks (command) values (array['echo', $1])", vec![big.as_str()]),
        (
            "insert into sked.tasks (command, args) values (array['echo'], array[$1])",
            vec![big.as_str()],
        ),
        (
            "insert into sked.tasks (command, env) values (array['true'], jsonb_build_object('DATA', $1::text))",
            vec![big.as_str()],
        ),
        (
            "select sked.task_submit(command => array['echo', $1])",
            vec![big.as_str()],
        ),
        (
            "select sked.tasks_submit(jsonb_build_array(jsonb_build_object(
               'command', jsonb_build_array('true'), 'env', jsonb_build_object('DATA', $1::text))))",
            vec![big.as_str()],
        ),
    ] {
        assert_eq!(refused_by(pool, sql, &binds).await, ONE_STRING_TOO_LONG, "{sql}");
    }
    let kept = insert(pool, "(command) values (array['true'])").await;
    assert_eq!(
        refused_by(
            pool,
            &format!("update sked.tasks set env = jsonb_build_object('DATA', $1::text) where id = '{kept}'"),
            &[big.as_str()],
        )
        .await,
        ONE_STRING_TOO_LONG,
        "an update that puts a value exec refuses"
    );
    // Every string may be long, but not all of them together: nine of 120 KB.
    assert_eq!(
        refused_by(
            pool,
            "insert into sked.tasks (command) values (array['echo'] || array_fill($1::text, array[9]))",
            &[&"y".repeat(120 * 1024)],
        )
        .await,
        TOO_MUCH_IN_ALL
    );
    // The limits themselves are taken: a string of 131,072 bytes with its NUL.
    let at_limit = "z".repeat(131_071);
    sqlx::query("insert into sked.tasks (command, env) values (array['echo', $1], jsonb_build_object('A', $2::text))")
        .bind(&at_limit)
        .bind(&at_limit[..131_069]) // A=…\0 is 131,072 bytes
        .execute(pool)
        .await
        .expect("strings of exactly 131,072 bytes with their NUL are taken");
    assert_eq!(
        refused_by(
            pool,
            "insert into sked.tasks (command, env) values (array['true'], jsonb_build_object('A', $1::text))",
            &[&at_limit[..131_070]],
        )
        .await,
        ONE_STRING_TOO_LONG,
        "A=value of 131,073 bytes with its NUL"
    );
    assert_eq!(count(pool).await, 2, "nothing refused was written");

    // REST: 422 with the rule's sentence and the limit.
    for task in [
        json!({"command": ["echo", big]}),
        json!({"command": ["true"], "env": {"DATA": big}}),
    ] {
        let (status, body) = api.post("/api/v1/tasks", &api.alice, task).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_error(&body, "rejected");
        let says = body["message"].as_str().unwrap();
        assert!(
            says.contains("131,072 bytes") && says.contains("MAX_ARG_STRLEN"),
            "the message names the limit: {says}"
        );
    }
    let (status, body) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["echo"], "args": vec!["y".repeat(120 * 1024); 9]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("1,048,576 bytes"),
        "{body}"
    );
    assert_eq!(count(pool).await, 2, "nothing refused was written");
}

#[tokio::test]
async fn the_cli_is_refused_a_command_exec_would_refuse_and_a_worker_runs_one_at_the_limits() {
    let api = cli::Api::start().await;
    let pool = &api.db.pool;
    // Nine arguments of 120 KB: each fits, together they pass the 1 MiB of the rule (the CLI's
    // own exec takes them: 2 MB).
    let arg = "y".repeat(120 * 1024);
    let mut argv = vec!["submit", "--", "echo"];
    argv.extend(std::iter::repeat_n(arg.as_str(), 9));
    let out = cli::output(&mut api.sked(&argv)).await;
    assert!(!out.status.success(), "sked submit is refused");
    let stderr = cli::text(&out.stderr);
    assert!(
        stderr.contains("1,048,576 bytes"),
        "sked says the limit: {stderr}"
    );
    assert_eq!(count(pool).await, 0, "nothing was written");

    // What the rules take, exec takes: six arguments of 131,071 bytes and an env string of
    // 131,072 bytes with its NUL (under 1 MiB in all), with the environment the worker adds.
    let at_limit = "z".repeat(131_071);
    let id: Uuid = sqlx::query_scalar(
        "insert into sked.tasks (command, env, max_attempts) values
           (array['sh', '-c', 'echo \"$# ${#1} ${#BIG}\"', 'sh'] || array_fill($1::text, array[6]),
            jsonb_build_object('BIG', $2::text), 1)
         returning id",
    )
    .bind(&at_limit)
    .bind(&at_limit[..131_067]) // BIG=…\0 is 131,072 bytes
    .fetch_one(pool)
    .await
    .expect("a task at the limits is taken");
    let worker = crate::support::start_worker(&api.db, crate::support::config(&["default"]));
    let state = crate::support::wait_for(
        pool,
        id,
        &["succeeded", "failed"],
        std::time::Duration::from_secs(30),
    )
    .await;
    let (error, stdout): (Option<String>, Option<String>) =
        sqlx::query_as("select error, stdout_tail from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(state, "succeeded", "exec took it: {error:?}");
    assert_eq!(
        stdout.as_deref().map(str::trim),
        Some("6 131071 131067"),
        "the process got every string whole"
    );
    worker.shutdown().await;
}
