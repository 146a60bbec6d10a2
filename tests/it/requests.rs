//! What a task asks of its worker — `cpu_millis`, `memory_mb`, `max_output_bytes`, `run_as` —
//! through every way in: plain SQL, the submit functions, REST (one by JSON, a large batch by
//! COPY), workflows, shards, resubmit, schedules and the CLI; and bad values refused with
//! readable messages and nothing written.

use axum::http::StatusCode;
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
