//! Tests of stored workflow definitions (`sql/definitions.sql`, `/api/v1/workflow-definitions`,
//! `sked workflow define|definitions|run`): versions kept only when the spec changes, a run of
//! the latest or a named version with parameters over the definition's own, the workflow
//! naming its definition, the rules, owner isolation in SQL and REST, a run through a real
//! worker, and the CLI.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use uuid::Uuid;

use crate::api::{Api, assert_error};
use crate::cli::{self, output, text};
use crate::support;
use crate::trust_roles::Login;

/// A spec whose one task echoes its `day` parameter after `word`.
fn spec(word: &str) -> Value {
    json!({"params": {"day": "today"},
           "tasks": [{"name": "say", "command": ["echo", word, "{{ params.day }}"]}]})
}

async fn define(pool: &sqlx::PgPool, name: &str, spec: &Value) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("select sked.workflow_define($1, $2, 'alice')")
        .bind(name)
        .bind(spec)
        .fetch_one(pool)
        .await
}

/// The command of a workflow's one task, its params and the definition it names.
async fn ran(pool: &sqlx::PgPool, workflow: Uuid) -> (Vec<String>, Value, Option<(String, i32)>) {
    let (command, params, name, version): (Vec<String>, Value, Option<String>, Option<i32>) =
        sqlx::query_as(
            "select t.command, w.params, d.name, d.version from sked.workflows w
               join sked.tasks t on t.workflow_id = w.id
               left join sked.workflow_definitions d on d.id = w.definition_id
              where w.id = $1",
        )
        .bind(workflow)
        .fetch_one(pool)
        .await
        .unwrap();
    (command, params, name.zip(version))
}

#[tokio::test]
async fn versions_are_kept_when_the_spec_changes_and_a_run_names_the_one_it_used() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    assert_eq!(define(pool, "etl", &spec("v1")).await.unwrap(), 1);
    assert_eq!(
        define(pool, "etl", &spec("v1")).await.unwrap(),
        1,
        "the same spec keeps its version"
    );
    assert_eq!(define(pool, "etl", &spec("v2")).await.unwrap(), 2);
    let kept: i64 = sqlx::query_scalar("select count(*) from sked.workflow_definitions")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(kept, 2);
    let workflows: i64 = sqlx::query_scalar("select count(*) from sked.workflows")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(workflows, 0, "checking a spec submits nothing");

    let latest: Uuid = sqlx::query_scalar(
        "select sked.workflow_run('etl', p_params => '{\"day\": \"monday\"}', p_owner => 'alice')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        ran(pool, latest).await,
        (
            vec!["echo".into(), "v2".into(), "monday".into()],
            json!({"day": "monday"}),
            Some(("etl".into(), 2))
        ),
        "the latest version, its parameters over the definition's"
    );
    let first: Uuid = sqlx::query_scalar("select sked.workflow_run('etl', 1, p_owner => 'alice')")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        ran(pool, first).await,
        (
            vec!["echo".into(), "v1".into(), "today".into()],
            json!({"day": "today"}),
            Some(("etl".into(), 1))
        ),
        "a named version, with the definition's own parameters"
    );
    let name: String = sqlx::query_scalar("select name from sked.workflows where id = $1")
        .bind(first)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        name, "etl",
        "a spec without a name is named after its definition"
    );
}

#[tokio::test]
async fn bad_definitions_and_runs_are_refused_and_keep_nothing() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    define(pool, "etl", &spec("v1")).await.unwrap();
    let cycle = json!({"tasks": [{"name": "a", "command": ["x"], "depends_on": ["b"]},
                                 {"name": "b", "command": ["x"], "depends_on": ["a"]}]});
    let placeholder = json!({"tasks": [{"name": "a", "command": ["echo", "{{ params.nope }}"]}]});
    for (name, spec, rule, says) in [
        (
            "etl x",
            spec("v1"),
            "workflow_definitions_name_must_be_a_name",
            "is not a letter or digit",
        ),
        (
            "-etl",
            spec("v1"),
            "workflow_definitions_name_must_be_a_name",
            "is not a letter or digit",
        ),
        (
            "etl",
            cycle,
            "workflows_tasks_must_not_form_a_cycle",
            "form a cycle",
        ),
        (
            "etl",
            placeholder,
            "workflows_placeholders_must_name_parameters",
            "no parameter 'nope'",
        ),
        (
            "etl",
            json!({"tasks": []}),
            "workflows_spec_must_have_tasks",
            "at least one task",
        ),
    ] {
        let err = define(pool, name, &spec).await.expect_err("refused");
        let err = err.as_database_error().unwrap();
        assert_eq!(err.constraint(), Some(rule), "{name}: {}", err.message());
        assert!(err.message().contains(says), "{}", err.message());
    }
    let versions: i64 = sqlx::query_scalar("select count(*) from sked.workflow_definitions")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(versions, 1, "nothing more was kept");
    for (sql, rule, says) in [
        (
            "select sked.workflow_run('etl', 3, p_owner => 'alice')",
            "workflow_definitions_must_exist",
            "alice has no workflow definition 'etl' of version 3",
        ),
        (
            "select sked.workflow_run('nope', p_owner => 'alice')",
            "workflow_definitions_must_exist",
            "alice has no workflow definition 'nope'",
        ),
        (
            "select sked.workflow_run('etl', p_owner => 'bob')",
            "workflow_definitions_must_exist",
            "bob has no workflow definition 'etl'",
        ),
        (
            "select sked.workflow_run('etl', p_params => '[1]', p_owner => 'alice')",
            "workflows_params_must_be_an_object",
            "must be an object",
        ),
        (
            "select sked.workflow_run('etl', p_params => '{\"bad name\": 1}', p_owner => 'alice')",
            "workflows_param_names_must_be_identifiers",
            "'bad name'",
        ),
    ] {
        let err = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .expect_err("refused");
        let err = err.as_database_error().unwrap();
        assert_eq!(err.constraint(), Some(rule), "{sql}: {}", err.message());
        assert!(err.message().contains(says), "{}", err.message());
    }
    let workflows: i64 = sqlx::query_scalar("select count(*) from sked.workflows")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(workflows, 0);
}

#[tokio::test]
async fn a_submitter_defines_and_runs_its_own_definitions_only() {
    let db = TestDb::new().await;
    define(&db.pool, "etl", &spec("alice's")).await.unwrap();
    let login = Login::new(&db, "sked_submitter").await;
    let mine: i32 = sqlx::query_scalar("select sked.workflow_define('etl', $1)")
        .bind(spec("mine"))
        .fetch_one(&login.pool)
        .await
        .expect("a submitter keeps a definition of its own");
    assert_eq!(mine, 1, "its own versions, apart from alice's");
    let seen: i64 = sqlx::query_scalar("select count(*) from sked.workflow_definitions")
        .fetch_one(&login.pool)
        .await
        .unwrap();
    assert_eq!(seen, 1, "it sees its own definitions only");
    let workflow: Uuid = sqlx::query_scalar("select sked.workflow_run('etl')")
        .fetch_one(&login.pool)
        .await
        .expect("it runs its own");
    assert_eq!(ran(&db.pool, workflow).await.0[1], "mine");
    login
        .assert_refused(
            "select sked.workflow_run('etl', p_owner => 'alice')",
            "has no workflow definition 'etl'",
            "another owner's definition is not there for it",
        )
        .await;
    login
        .assert_refused(
            "insert into sked.workflow_definitions (owner, name, version, spec)
             values ('alice', 'etl', 9, '{}')",
            "row-level security",
            "it keeps no definition for another owner",
        )
        .await;
    let alices: Uuid =
        sqlx::query_scalar("select id from sked.workflow_definitions where owner = 'alice'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    login
        .assert_refused(
            &format!(
                "select sked.workflow_submit_from('{{\"tasks\": [{{\"name\": \"a\", \"command\": [\"true\"]}}]}}', \
                 current_user, '{alices}')"
            ),
            "row-level security",
            "a workflow of its own cannot claim another owner's definition",
        )
        .await;
}

#[tokio::test]
async fn a_definition_over_rest_runs_through_a_real_worker_and_bob_sees_none_of_it() {
    let api = Api::new().await;
    let body = json!({"name": "report", "spec": {
        "params": {"day": "today"},
        "tasks": [{"name": "say", "command": ["sh", "-c", "echo \"$0 $API_TOKEN\"", "{{ params.day }}"],
                   "env": {"API_TOKEN": "s3cret-value"}}]}});
    let (status, v1) = api
        .post("/api/v1/workflow-definitions", &api.alice, body.clone())
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v1}");
    assert_eq!((&v1["name"], &v1["version"]), (&json!("report"), &json!(1)));
    assert!(
        !v1.to_string().contains("s3cret-value"),
        "a secret of the spec is masked in answers: {v1}"
    );
    let (status, same) = api
        .post("/api/v1/workflow-definitions", &api.alice, body.clone())
        .await;
    assert_eq!(
        (status, &same["version"]),
        (StatusCode::OK, &json!(1)),
        "{same}"
    );
    let mut changed = body.clone();
    changed["spec"]["tasks"][0]["timeout_secs"] = json!(60);
    let (status, v2) = api
        .post("/api/v1/workflow-definitions", &api.alice, changed)
        .await;
    assert_eq!(
        (status, &v2["version"]),
        (StatusCode::CREATED, &json!(2)),
        "{v2}"
    );

    let worker = support::start_worker(&api.db, support::config(&["default"]));
    let (status, run) = api
        .post(
            "/api/v1/workflow-definitions/report/runs",
            &api.alice,
            json!({"version": 1, "params": {"day": "monday"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let id = run["id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let detail = loop {
        let (_, detail) = api
            .get(&format!("/api/v1/workflows/{id}"), &api.alice)
            .await;
        if detail["state"] != "running" {
            break detail;
        }
        assert!(tokio::time::Instant::now() < deadline, "{detail}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    worker.shutdown().await;
    assert_eq!(detail["state"], "succeeded", "{detail}");
    assert_eq!(
        detail["definition"],
        json!({"name": "report", "version": 1})
    );
    assert_eq!(detail["params"], json!({"day": "monday"}));
    assert_eq!(
        detail["tasks"][0]["stdout_tail"], "monday s3cret-value\n",
        "{detail}"
    );
    let (_, listed) = api.get("/api/v1/workflows", &api.alice).await;
    assert_eq!(
        listed["workflows"][0]["definition"]["version"], 1,
        "{listed}"
    );

    let (_, all) = api.get("/api/v1/workflow-definitions", &api.alice).await;
    let all = all["definitions"].as_array().unwrap().clone();
    assert_eq!(all.len(), 1, "the latest of each name: {all:?}");
    assert_eq!(all[0]["version"], 2);
    let (_, versions) = api
        .get("/api/v1/workflow-definitions/report", &api.alice)
        .await;
    let numbers: Vec<&Value> = versions["definitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| &d["version"])
        .collect();
    assert_eq!(numbers, [&json!(2), &json!(1)], "newest first");

    // Bob's owner has none of alice's definitions.
    let (_, bobs) = api.get("/api/v1/workflow-definitions", &api.bob).await;
    assert_eq!(bobs["definitions"], json!([]));
    for (uri, body) in [
        ("/api/v1/workflow-definitions/report", None),
        ("/api/v1/workflow-definitions/report/runs", Some(json!({}))),
    ] {
        let method = if body.is_some() {
            axum::http::Method::POST
        } else {
            axum::http::Method::GET
        };
        let (status, json) = api.call(method, uri, &api.bob, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}: {json}");
        assert_error(&json, "not_found");
    }
    for (uri, body) in [
        ("/api/v1/workflow-definitions?owner=alice", None),
        ("/api/v1/workflow-definitions/report?owner=alice", None),
        (
            "/api/v1/workflow-definitions/report/runs",
            Some(json!({"owner": "alice"})),
        ),
        (
            "/api/v1/workflow-definitions",
            Some(json!({"name": "x", "owner": "alice",
            "spec": {"tasks": [{"name": "a", "command": ["true"]}]}})),
        ),
    ] {
        let method = if body.is_some() {
            axum::http::Method::POST
        } else {
            axum::http::Method::GET
        };
        let (status, json) = api.call(method, uri, &api.bob, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{uri}: {json}");
    }
    let (status, json) = api
        .post(
            "/api/v1/workflow-definitions/report/runs",
            &api.admin,
            json!({"owner": "alice", "version": 2}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "an admin runs alice's: {json}");
}

#[tokio::test]
async fn bad_definition_requests_are_refused_and_keep_nothing() {
    let api = Api::new().await;
    let task = json!([{"name": "a", "command": ["true"]}]);
    let cases = [
        (
            json!({"name": "bad name", "spec": {"tasks": task}}),
            422,
            "is not a letter or digit",
        ),
        (
            json!({"name": "ok", "spec": {"tasks": [{"name": "a", "command": ["x"], "depends_on": ["a"]}]}}),
            422,
            "depends on itself",
        ),
        (
            json!({"name": "ok", "spec": {"tasks": task, "owner": "alice"}}),
            422,
            "takes no owner",
        ),
        (
            json!({"name": "ok", "spec": {"tasks": task}, "version": 3}),
            400,
            "version",
        ),
        (json!({"name": "ok"}), 400, "spec"),
    ];
    for (body, status, says) in cases {
        let (got, json) = api
            .post("/api/v1/workflow-definitions", &api.alice, body.clone())
            .await;
        assert_eq!(got.as_u16(), status, "{body}: {json}");
        assert!(
            json["message"].as_str().unwrap().contains(says),
            "{body}: {json}"
        );
    }
    let kept: i64 = sqlx::query_scalar("select count(*) from sked.workflow_definitions")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(kept, 0);
    let (status, _) = api
        .post(
            "/api/v1/workflow-definitions",
            &api.alice,
            json!({"name": "ok", "spec": {"tasks": task}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    for (body, status, says) in [
        (
            json!({"version": 2}),
            404,
            "alice has no workflow definition \"ok\" of version 2",
        ),
        (json!({"params": {"bad name": 1}}), 422, "'bad name'"),
        (json!({"params": [1]}), 400, "params"),
        (json!({"version": 0}), 404, "of version 0"),
    ] {
        let (got, json) = api
            .post(
                "/api/v1/workflow-definitions/ok/runs",
                &api.alice,
                body.clone(),
            )
            .await;
        assert_eq!(got.as_u16(), status, "{body}: {json}");
        assert!(
            json["message"].as_str().unwrap().contains(says),
            "{body}: {json}"
        );
    }
    let workflows: i64 = sqlx::query_scalar("select count(*) from sked.workflows")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert_eq!(workflows, 0, "no refused run submitted anything");
}

#[tokio::test]
async fn the_cli_defines_lists_and_runs_a_definition() {
    let api = cli::Api::start().await;
    let file = std::env::temp_dir().join(format!("sked-definition-{}.yaml", Uuid::new_v4()));
    std::fs::write(
        &file,
        "params: {day: today}\ntasks:\n  - name: say\n    command: [echo, '{{ params.day }}']\n",
    )
    .unwrap();
    let path = file.clone();
    let file = path.to_str().unwrap();
    assert_eq!(
        api.ok(&["workflow", "define", "etl", "-f", file]).await,
        "etl version 1\n"
    );
    assert_eq!(
        api.ok(&["workflow", "define", "etl", "-f", file]).await,
        "etl version 1\n"
    );
    let listed = api.ok(&["workflow", "definitions"]).await;
    assert!(
        listed.contains("etl") && listed.contains("      1  "),
        "{listed}"
    );
    let id = api
        .ok(&[
            "workflow",
            "run",
            "etl",
            "--param",
            "day=monday",
            "--param",
            "n=3",
        ])
        .await;
    let id: Uuid = id.trim().parse().expect("the new workflow's id");
    let (command, params, definition) = ran(&api.db.pool, id).await;
    assert_eq!(command, ["echo", "monday"]);
    assert_eq!(
        params,
        json!({"day": "monday", "n": 3}),
        "a value that reads as JSON is JSON"
    );
    assert_eq!(definition, Some(("etl".into(), 1)));
    let shown = api.ok(&["workflow", "show", &id.to_string()]).await;
    assert!(shown.contains("defined:   etl version 1"), "{shown}");
    let out = output(&mut api.sked(&["workflow", "run", "etl", "--version", "4"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("has no workflow definition \"etl\" of version 4"),
        "{out:?}"
    );
    std::fs::remove_file(&path).unwrap();
}
