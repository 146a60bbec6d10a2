//! Least privilege in PostgreSQL: each group role set up by `sked migrate` (`sked_submitter`,
//! `sked_worker`, `sked_server`), used through a login role made for the test, is refused
//! what it must not do with a clear error and can do its part (docs/security.md).

use std::str::FromStr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sked_db::testing::{TestDb, execute_as_admin_in_drop};
use sked_db::token::Role;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool};
use tower::ServiceExt;
use uuid::Uuid;

use crate::support;

/// A login role made for one test, a member of one of sked's group roles, with a pool
/// connected as it. The role is dropped with the value.
pub(crate) struct Login {
    name: String,
    pub(crate) pool: PgPool,
}

impl Login {
    pub(crate) async fn new(db: &TestDb, group: &str) -> Login {
        let name = format!("sked_t_{}", &Uuid::new_v4().simple().to_string()[..16]);
        db.pool
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "create role {name} login; grant {group} to {name}"
            ))))
            .await
            .unwrap_or_else(|e| panic!("making a login role that is a member of {group}: {e}"));
        let options = PgConnectOptions::from_str(&db.url)
            .expect("the test database's URL")
            .username(&name);
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .expect("connecting as the login role");
        Login { name, pool }
    }

    /// Runs `sql` as this login; the error's text when PostgreSQL refuses it.
    async fn refused(&self, sql: &str) -> Option<String> {
        match self
            .pool
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql)))
            .await
        {
            Ok(_) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// Asserts that PostgreSQL refuses `sql` from this login with an error containing `says`.
    pub(crate) async fn assert_refused(&self, sql: &str, says: &str, rule: &str) {
        match self.refused(sql).await {
            None => panic!("{rule}, but `{sql}` succeeded"),
            Some(e) => assert!(
                e.contains(says),
                "{rule}: `{sql}` should be refused with \"{says}\", got \"{e}\""
            ),
        }
    }

    async fn scalar<T>(&self, sql: &str) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("`{sql}` as {} should work: {e}", self.name))
    }
}

impl Drop for Login {
    fn drop(&mut self) {
        // The role's sessions are ended from the server side before the role is dropped.
        execute_as_admin_in_drop(format!(
            "select pg_terminate_backend(pid) from pg_stat_activity
              where usename = '{name}';
             drop role if exists {name}",
            name = self.name
        ));
    }
}

/// A task of `owner` inserted by the owner of the schema, with a secret in its environment,
/// an input, an output, an attempt and a log line.
async fn task_of(db: &TestDb, owner: &str, secret: &str) -> Uuid {
    let id = support::insert(
        &db.pool,
        &format!(
            "(command, owner, env, input) values (array['true'], '{owner}', \
             '{{\"K\": \"{secret}\"}}', '{{\"in\": \"{secret}\"}}')"
        ),
    )
    .await;
    sqlx::query(
        "update sked.tasks set output = jsonb_build_object('out', $2::text) where id = $1;",
    )
    .bind(id)
    .bind(secret)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "insert into sked.task_attempts (task_id, attempt, started_at, finished_at, outcome, error)
         values ($1, 1, now(), now(), 'failed', $2)",
    )
    .bind(id)
    .bind(secret)
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(
        "select sked.task_logs_append(array[$1::uuid], array[1], array['stdout'], array[$2])",
    )
    .bind(id)
    .bind(secret)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

#[tokio::test]
async fn a_submitter_cannot_read_another_owners_task_env_input_output_or_logs() {
    let db = TestDb::new().await;
    let alice = Login::new(&db, "sked_submitter").await;
    let bob_task = task_of(&db, "bob", "bob-s3cr3t").await;
    let own = task_of(&db, &alice.name, "alice-value").await;

    let seen: Vec<Uuid> = sqlx::query_scalar("select id from sked.tasks")
        .fetch_all(&alice.pool)
        .await
        .expect("a submitter may read its own tasks");
    assert_eq!(
        seen,
        vec![own],
        "a submitter sees its own tasks and no other owner's"
    );
    let env: Option<Value> = sqlx::query_scalar("select env from sked.tasks where id = $1")
        .bind(bob_task)
        .fetch_optional(&alice.pool)
        .await
        .unwrap();
    assert_eq!(env, None, "a submitter never reads another owner's env");
    for (table, column) in [
        ("sked.tasks", "env::text || input::text || output::text"),
        ("sked.task_logs", "data"),
        ("sked.task_attempts", "error"),
    ] {
        let texts: Vec<String> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select {column} from {table}")))
                .fetch_all(&alice.pool)
                .await
                .unwrap_or_else(|e| panic!("a submitter may read its own rows of {table}: {e}"));
        assert!(
            !texts.is_empty() && texts.iter().all(|t| !t.contains("bob-s3cr3t")),
            "a submitter reads its own rows of {table} and nothing of another owner's: {texts:?}"
        );
    }
    // What a submitter may not see at all is refused, not filtered.
    for table in [
        "sked.api_tokens",
        "sked.workers",
        "sked.artifacts",
        "sked.schedules",
    ] {
        alice
            .assert_refused(
                &format!("select * from {table}"),
                &format!("permission denied for table {}", &table[5..]),
                &format!("a submitter has no access to {table}"),
            )
            .await;
    }
}

#[tokio::test]
async fn a_submitter_cannot_submit_as_another_owner() {
    let db = TestDb::new().await;
    let alice = Login::new(&db, "sked_submitter").await;
    let rls = "new row violates row-level security policy";
    let rule = "a submitter's tasks and workflows belong to its own name";
    for sql in [
        "insert into sked.tasks (command, owner) values (array['true'], 'bob')",
        "select sked.task_submit(command => array['true'], owner => 'bob')",
        r#"select * from sked.tasks_submit('[{"command": ["true"]}]', 'bob')"#,
        r#"select * from sked.tasks_submit('[{"command": ["true"], "owner": "bob"}]')"#,
        r#"select sked.workflow_submit('{"tasks": [{"name": "a", "command": ["true"]}]}', 'bob')"#,
    ] {
        alice.assert_refused(sql, rls, rule).await;
    }
    let bobs: i64 = sqlx::query_scalar("select count(*) from sked.tasks where owner = 'bob'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(bobs, 0, "{rule}: nothing was inserted for bob");
}

#[tokio::test]
async fn a_submitter_cannot_touch_tokens_call_worker_functions_or_change_tasks() {
    let db = TestDb::new().await;
    let alice = Login::new(&db, "sked_submitter").await;
    let own = task_of(&db, &alice.name, "v").await;
    let bobs = task_of(&db, "bob", "v").await;
    let denied_table = |t: &str| format!("permission denied for table {t}");
    let denied_function = |f: &str| format!("permission denied for function {f}");
    let cases = [
        (
            "insert into sked.api_tokens (token_sha256, owner, role) values ('\\x00', 'x', 'admin')".to_owned(),
            denied_table("api_tokens"),
            "a submitter cannot make API tokens",
        ),
        (
            "select * from sked.tasks_claim(gen_random_uuid(), array['default'], '{}', 10, '1 minute', null, null, now())".to_owned(),
            denied_function("tasks_claim"),
            "a submitter cannot claim tasks",
        ),
        (
            format!("select * from sked.tasks_finish(array['{own}'::uuid], array[1], array['succeeded'], array[0], array[null], array[null], array[null], array[null], array[null]::jsonb[], now())"),
            denied_function("tasks_finish"),
            "a submitter cannot finish tasks",
        ),
        (
            "select sked.worker_register(gen_random_uuid(), 'w', 'h', 1, 'v', array['default'], '{}', 1, '1 minute', null, null)".to_owned(),
            denied_function("worker_register"),
            "a submitter cannot register as a worker",
        ),
        (
            format!("update sked.tasks set state = 'succeeded' where id = '{own}'"),
            denied_table("tasks"),
            "a submitter cannot change a task's state",
        ),
        (
            format!("delete from sked.tasks where id = '{own}'"),
            denied_table("tasks"),
            "a submitter cannot delete tasks",
        ),
        (
            format!("select sked.task_cancel('{bobs}')"),
            denied_function("task_cancel"),
            "a submitter cannot cancel tasks in SQL (the API cancels an owner's own)",
        ),
        (
            format!("insert into sked.task_edges (task_id, depends_on) values ('{bobs}', '{own}')"),
            "new row violates row-level security policy".to_owned(),
            "a submitter cannot make another owner's task wait for its own",
        ),
        (
            "create table sked.mine (x int)".to_owned(),
            "permission denied for schema sked".to_owned(),
            "a submitter cannot change the schema",
        ),
    ];
    for (sql, says, rule) in &cases {
        alice.assert_refused(sql, says, rule).await;
    }
}

#[tokio::test]
async fn a_submitter_submits_by_insert_and_functions_with_the_dashboard_open() {
    let db = TestDb::new().await;
    let alice = Login::new(&db, "sked_submitter").await;
    // A server with live-event clients: every statement on the tasks records an event.
    sqlx::query("select sked.events_listen(gen_random_uuid(), interval '1 hour')")
        .execute(&db.pool)
        .await
        .unwrap();

    let owner: String = alice
        .scalar("insert into sked.tasks (command, env) values (array['true'], '{\"K\": \"v\"}') returning owner")
        .await;
    assert_eq!(
        owner, alice.name,
        "a plain INSERT's owner is the submitter's own name"
    );
    let _: Uuid = alice
        .scalar("select sked.task_submit(command => array['true'], idempotency_key => 'k')")
        .await;
    let _: Uuid = alice
        .scalar("select sked.task_submit(command => array['true'], idempotency_key => 'k')")
        .await;
    let _: i64 = alice
        .scalar(r#"select count(*) from sked.tasks_submit('[{"command": ["true"]}, {"kind": "noop"}]')"#)
        .await;
    let _: Uuid = alice
        .scalar(
            "insert into sked.tasks (command, shard_total) values (array['true'], 3) returning id",
        )
        .await;
    let _: Uuid = alice
        .scalar(
            r#"select sked.workflow_submit('{"name": "w", "tasks": [
                 {"name": "a", "command": ["true"]},
                 {"name": "b", "command": ["true"], "depends_on": ["a"]}]}')"#,
        )
        .await;

    let seen: i64 = alice.scalar("select count(*) from sked.tasks").await;
    // 1 insert + 1 keyed submit (twice) + 2 + a parent with 3 shards + 2 in a workflow.
    assert_eq!(
        seen, 10,
        "a submitter sees every task it submitted, shards included"
    );
    let others: i64 = sqlx::query_scalar("select count(*) from sked.tasks where owner <> $1")
        .bind(&alice.name)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(others, 0, "every task a submitter submits is its own");
    let edges: i64 = alice.scalar("select count(*) from sked.task_edges").await;
    assert_eq!(
        edges, 4,
        "a submitter sees the edges of its workflow and of its shards"
    );
    let recorded: i64 = sqlx::query_scalar("select count(*) from sked.event_outbox")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        recorded >= 6,
        "a submitter's statements record live events while a dashboard watches ({recorded})"
    );
}

#[tokio::test]
async fn a_submitters_bad_insert_error_carries_no_row_data() {
    let db = TestDb::new().await;
    let alice = Login::new(&db, "sked_submitter").await;
    for (columns, values, constraint) in [
        (
            "kind, command",
            "'bogus', array['true']",
            "tasks_kind_is_known",
        ),
        (
            "max_attempts, command",
            "0, array['true']",
            "tasks_max_attempts_must_be_at_least_1",
        ),
        (
            "timeout, command",
            "'-1 second', array['true']",
            "tasks_timeout_must_be_positive",
        ),
    ] {
        let statement = format!(
            "insert into sked.tasks (env, {columns}) values ('{{\"K\": \"s3cr3t-value\"}}', {values})"
        );
        let err = sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
            .execute(&alice.pool)
            .await
            .expect_err("a row that breaks a rule is refused");
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(
            db_err.constraint(),
            Some(constraint),
            "the error names the rule that was broken"
        );
        let pg = db_err.downcast_ref::<sqlx::postgres::PgDatabaseError>();
        assert_eq!(
            pg.detail(),
            None,
            "a submitter's refused row comes back without PostgreSQL's failing-row DETAIL"
        );
        let everything = format!("{err:?}");
        assert!(
            !everything.contains("s3cr3t-value"),
            "no part of the error a submitter gets carries the row's values: {everything}"
        );
    }
}

#[tokio::test]
async fn a_worker_cannot_read_or_write_tables_directly() {
    let db = TestDb::new().await;
    let worker = Login::new(&db, "sked_worker").await;
    let own = task_of(&db, "bob", "v").await;
    let denied_table = |t: &str| format!("permission denied for table {t}");
    let cases = [
        (
            "select * from sked.tasks".to_owned(),
            denied_table("tasks"),
            "a worker reads tasks only by claiming them",
        ),
        (
            "insert into sked.tasks (command) values (array['true'])".to_owned(),
            denied_table("tasks"),
            "a worker cannot submit tasks",
        ),
        (
            format!("update sked.tasks set state = 'succeeded' where id = '{own}'"),
            denied_table("tasks"),
            "a worker changes a task only through the fenced functions",
        ),
        (
            "select * from sked.api_tokens".to_owned(),
            denied_table("api_tokens"),
            "a worker cannot read API tokens",
        ),
        (
            format!(
                "insert into sked.task_logs (task_id, attempt, stream, data) values ('{own}', 1, 'stdout', 'x')"
            ),
            denied_table("task_logs"),
            "a worker appends logs only through sked.task_logs_append",
        ),
        (
            "select * from sked.artifacts".to_owned(),
            denied_table("artifacts"),
            "a worker reads artifacts only by hash",
        ),
        (
            "update sked.workers set stopping_at = now()".to_owned(),
            denied_table("workers"),
            "a worker cannot touch other workers' rows",
        ),
        (
            "select sked.task_submit(command => array['true'])".to_owned(),
            "permission denied for function task_submit".to_owned(),
            "a worker cannot submit tasks",
        ),
        (
            format!("select sked.task_cancel('{own}')"),
            "permission denied for function task_cancel".to_owned(),
            "a worker cannot cancel tasks",
        ),
        (
            "create table sked.mine (x int)".to_owned(),
            "permission denied for schema sked".to_owned(),
            "a worker cannot change the schema",
        ),
    ];
    for (sql, says, rule) in &cases {
        worker.assert_refused(sql, says, rule).await;
    }
}

#[tokio::test]
async fn a_worker_role_claims_runs_and_finishes_tasks_end_to_end() {
    let db = TestDb::new().await;
    let worker = Login::new(&db, "sked_worker").await;
    let artifact = sked_db::worker::put_artifact(&db.pool, b"#!/bin/sh\necho from-pg\n")
        .await
        .unwrap();
    let logs = support::insert(
        &db.pool,
        "(command, output_path) values (array['sh', '-c', 'echo hello; echo result > out.txt'], 'out.txt')",
    )
    .await;
    let from_pg = support::insert(
        &db.pool,
        &format!("(artifact_url, artifact_sha256) values ('pg:{artifact}', '{artifact}')"),
    )
    .await;
    let noop = support::insert(&db.pool, "(kind) values ('noop')").await;

    let running = support::start_worker_on(&worker.pool, support::config(&["default"]));
    for id in [logs, from_pg, noop] {
        let state = support::wait_for(
            &db.pool,
            id,
            &["succeeded", "failed"],
            Duration::from_secs(20),
        )
        .await;
        let error: Option<String> =
            sqlx::query_scalar("select error from sked.tasks where id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(
            state, "succeeded",
            "a worker acting as sked_worker runs its tasks to the end ({error:?})"
        );
    }
    let output: Option<String> =
        sqlx::query_scalar("select output_sha256 from sked.tasks where id = $1")
            .bind(logs)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        output.is_some(),
        "the worker stores an output file as an artifact"
    );
    let text: Vec<String> =
        sqlx::query_scalar("select data from sked.task_logs where task_id = any($1) order by id")
            .bind(vec![logs, from_pg])
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let text = text.concat();
    assert!(
        text.contains("hello") && text.contains("from-pg"),
        "the worker writes its tasks' logs: {text:?}"
    );
    running.shutdown().await;
    let workers: i64 = sqlx::query_scalar("select count(*) from sked.workers")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(workers, 0, "the worker deregisters as sked_worker");

    // The background duties of a worker are callable as the role too.
    for sql in [
        "select count(*) from sked.tasks_rescue()",
        "select count(*) from sked.services_reconcile()",
        "select sked.schedules_fire(interval '1 second', 10, now())::bigint",
        "select count(*) from (select sked.schedules_next_due()) d",
        "select count(*) from (select sked.tasks_next_due(array['default'])) d",
    ] {
        let _: i64 = worker.scalar(sql).await;
    }
}

#[tokio::test]
async fn a_superuser_worker_acts_as_the_worker_role() {
    let db = TestDb::new().await;
    let (pool, narrowed) = sked_db::connect_as(&db.url, "sked-test", 2, sked_db::GroupRole::Worker)
        .await
        .unwrap();
    assert!(narrowed, "a login that may act as sked_worker does");
    let role: String = sqlx::query_scalar("select current_user::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        role, "sked_worker",
        "every connection of the worker's pool acts as sked_worker"
    );
    let err = sqlx::query("select count(*) from sked.tasks")
        .execute(&pool)
        .await
        .expect_err("a worker pool has no table access, even when its login is a superuser");
    assert!(
        err.to_string()
            .contains("permission denied for table tasks"),
        "{err}"
    );
    pool.close().await;
}

#[tokio::test]
async fn a_server_cannot_write_tokens_task_state_artifacts_or_the_schema() {
    let db = TestDb::new().await;
    let server = Login::new(&db, "sked_server").await;
    let own = task_of(&db, "bob", "v").await;
    let denied_table = |t: &str| format!("permission denied for table {t}");
    let cases = [
        (
            "insert into sked.api_tokens (token_sha256, owner, role) values ('\\x00', 'x', 'admin')".to_owned(),
            denied_table("api_tokens"),
            "the server never makes API tokens (`sked token create` runs as the owner)",
        ),
        (
            "update sked.api_tokens set role = 'admin'".to_owned(),
            denied_table("api_tokens"),
            "the server cannot raise a token to admin",
        ),
        (
            format!("update sked.tasks set state = 'succeeded' where id = '{own}'"),
            denied_table("tasks"),
            "the server changes tasks only through the contract's functions",
        ),
        (
            "delete from sked.tasks".to_owned(),
            denied_table("tasks"),
            "the server cannot delete tasks",
        ),
        ("select * from sked.artifacts".to_owned(), denied_table("artifacts"), "artifacts are the worker's"),
        (
            "select * from sked.tasks_claim(gen_random_uuid(), array['default'], '{}', 10, '1 minute', null, null, now())".to_owned(),
            "permission denied for function tasks_claim".to_owned(),
            "the server cannot claim tasks",
        ),
        (
            "select sked.task_logs_append(array[gen_random_uuid()], array[1], array['stdout'], array['x'])".to_owned(),
            "permission denied for function task_logs_append".to_owned(),
            "the server cannot forge a task's logs",
        ),
        ("create table sked.mine (x int)".to_owned(), "permission denied for schema sked".to_owned(), "the server cannot change the schema"),
        ("alter table sked.tasks disable row level security".to_owned(), "must be owner of table tasks".to_owned(), "the server cannot turn row-level security off"),
    ];
    for (sql, says, rule) in &cases {
        server.assert_refused(sql, says, rule).await;
    }
}

/// Sends one request to `router`; the status and the JSON body (null when empty).
async fn call(
    router: &Router,
    method: Method,
    uri: &str,
    token: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    let request = match body {
        Some(b) => request
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(b.to_string())),
        None => request.body(Body::empty()),
    }
    .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn the_server_role_serves_the_api() {
    let db = TestDb::new().await;
    let server = Login::new(&db, "sked_server").await;
    let alice = sked_db::token::create(&db.pool, "alice", Role::User, "test")
        .await
        .unwrap();
    let admin = sked_db::token::create(&db.pool, "root", Role::Admin, "test")
        .await
        .unwrap();
    let router = sked_server::router(server.pool.clone());

    let ok = |what: &str, status: StatusCode, body: &Value| {
        assert!(
            status.is_success(),
            "the REST API works over a connection of sked_server: {what} answered {status} {body}"
        );
    };
    let (s, b) = call(
        &router,
        Method::POST,
        "/api/v1/tasks",
        &alice,
        Some(json!({"command": ["true"], "env": {"K": "v"}})),
    )
    .await;
    ok("submit", s, &b);
    let id = b["ids"][0].as_str().unwrap().to_owned();
    // A batch of 64 or more goes in by COPY where row-level security does not apply.
    let batch: Vec<Value> = (0..70).map(|_| json!({"command": ["true"]})).collect();
    let (s, b) = call(
        &router,
        Method::POST,
        "/api/v1/tasks/batch",
        &alice,
        Some(json!({"tasks": batch})),
    )
    .await;
    ok("a batch of 70", s, &b);
    let spec = json!({"name": "w", "tasks": [{"name": "a", "command": ["true"]}, {"name": "b", "command": ["true"], "depends_on": ["a"]}]});
    let (s, b) = call(
        &router,
        Method::POST,
        "/api/v1/workflows",
        &alice,
        Some(spec),
    )
    .await;
    ok("a workflow", s, &b);
    let schedule = json!({"name": "yearly", "cron": "0 0 1 1 *", "task": {"command": ["true"]}});
    let (s, b) = call(
        &router,
        Method::POST,
        "/api/v1/schedules",
        &alice,
        Some(schedule),
    )
    .await;
    ok("a schedule", s, &b);
    let schedule_id = b["id"].as_str().unwrap().to_owned();
    for (method, uri, token, body) in [
        (Method::GET, "/api/v1/tasks".to_owned(), &alice, None),
        (Method::GET, format!("/api/v1/tasks/{id}"), &alice, None),
        (
            Method::GET,
            format!("/api/v1/tasks/{id}/logs"),
            &alice,
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/tasks/{id}/cancel"),
            &alice,
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/tasks/{id}/retry"),
            &alice,
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/tasks/{id}/resubmit"),
            &alice,
            None,
        ),
        (Method::GET, "/api/v1/workflows".to_owned(), &alice, None),
        (Method::GET, "/api/v1/schedules".to_owned(), &alice, None),
        (
            Method::POST,
            format!("/api/v1/schedules/{schedule_id}/pause"),
            &alice,
            None,
        ),
        (
            Method::POST,
            format!("/api/v1/schedules/{schedule_id}/resume"),
            &alice,
            None,
        ),
        (
            Method::PATCH,
            format!("/api/v1/schedules/{schedule_id}"),
            &alice,
            Some(json!({"cron": "0 0 2 1 *"})),
        ),
        (
            Method::DELETE,
            format!("/api/v1/schedules/{schedule_id}"),
            &alice,
            None,
        ),
        (
            Method::GET,
            "/api/v1/cron/preview?cron=*%20*%20*%20*%20*".to_owned(),
            &alice,
            None,
        ),
        (Method::GET, "/api/v1/overview".to_owned(), &admin, None),
        (Method::GET, "/api/v1/workers".to_owned(), &admin, None),
        (Method::GET, "/api/v1/queues".to_owned(), &admin, None),
        (Method::GET, "/api/v1/services".to_owned(), &admin, None),
        (
            Method::PATCH,
            "/api/v1/queues/default".to_owned(),
            &admin,
            Some(json!({"max_running": 3})),
        ),
        (
            Method::POST,
            "/api/v1/queues/default/pause".to_owned(),
            &admin,
            None,
        ),
        (
            Method::POST,
            "/api/v1/queues/default/resume".to_owned(),
            &admin,
            None,
        ),
        (Method::GET, "/api/v1/me".to_owned(), &alice, None),
    ] {
        let what = format!("{method} {uri}");
        let (s, b) = call(&router, method, &uri, token, body).await;
        ok(&what, s, &b);
    }
    let tasks: i64 = sqlx::query_scalar("select count(*) from sked.tasks where owner = 'alice'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        tasks,
        1 + 70 + 2 + 1,
        "the server submitted every task for its token's owner"
    );
}

#[tokio::test]
async fn migrate_sets_up_the_roles_and_runs_again_safely() {
    let db = TestDb::new().await;
    sked_db::migrate(&db.pool)
        .await
        .expect("migrating again changes nothing");
    sked_db::migrate(&db.pool).await.expect("and again");
    let roles: Vec<(String, bool)> = sqlx::query_as(
        "select rolname::text, rolcanlogin from pg_roles
          where rolname in ('sked_submitter', 'sked_worker', 'sked_server') order by 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        roles,
        vec![
            ("sked_server".to_owned(), false),
            ("sked_submitter".to_owned(), false),
            ("sked_worker".to_owned(), false)
        ],
        "migrate makes the three group roles, which cannot log in"
    );
    let public: i64 = sqlx::query_scalar(
        "select count(*) from pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
          where p.pronamespace = 'sked'::regnamespace and a.grantee = 0",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(public, 0, "no function of sked is executable by PUBLIC");
    let invoker: Vec<String> = sqlx::query_scalar(
        "select p.proname::text from pg_proc p
          where p.pronamespace = 'sked'::regnamespace
            and (p.prorettype = 'trigger'::regtype
                 or p.proname in ('tasks_claim', 'tasks_finish', 'task_cancel', 'events_listen'))
            and not (p.prosecdef and 'search_path=sked, pg_temp' = any(p.proconfig))",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        invoker,
        Vec::<String>::new(),
        "trigger functions and the roles' functions run as their owner on a fixed search path"
    );
}

#[tokio::test]
async fn the_api_answers_a_refused_row_without_its_values() {
    // The server's pool is the schema's owner here, to whom PostgreSQL sends the failing
    // row's DETAIL: the answer must still carry nothing of the row.
    let db = TestDb::new().await;
    let alice = sked_db::token::create(&db.pool, "alice", Role::User, "test")
        .await
        .unwrap();
    let router = sked_server::router(db.pool.clone());
    for body in [
        json!({"command": ["true"], "max_attempts": 0, "env": {"K": "s3cr3t-value"}}),
        json!({"command": ["true"], "cpu_millis": 0, "env": {"K": "s3cr3t-value"}}),
    ] {
        let (status, answer) =
            call(&router, Method::POST, "/api/v1/tasks", &alice, Some(body)).await;
        assert!(
            status.is_client_error(),
            "a task the schema refuses is answered 4xx: {status} {answer}"
        );
        let text = answer.to_string();
        assert!(
            !text.contains("s3cr3t-value") && !text.contains("Failing row"),
            "the API never passes the database's DETAIL of a refused row on: {text}"
        );
    }
}

/// A submitter reads its own tasks' attempts through `sked.task_attempt_history` (the view
/// reads with the reader's rights) and never another owner's.
#[tokio::test]
async fn a_submitter_reads_the_attempts_of_its_own_tasks_only() {
    let db = TestDb::new().await;
    let alice = Login::new(&db, "sked_submitter").await;
    let own: Uuid = alice
        .scalar("select sked.task_submit(command => array['true'])")
        .await;
    let bobs: Uuid =
        sqlx::query_scalar("select sked.task_submit(command => array['true'], owner => 'bob')")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    // Both ran once and failed: an attempt each in sked.task_attempts.
    for id in [own, bobs] {
        sqlx::query(
            "insert into sked.task_attempts (task_id, attempt, started_at, finished_at, outcome, error)
             values ($1, 1, now(), now(), 'failed', 'secret of ' || $1::text)",
        )
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let seen: Vec<Uuid> = sqlx::query_scalar("select task_id from sked.task_attempt_history")
        .fetch_all(&alice.pool)
        .await
        .expect("a submitter reads the view");
    assert_eq!(seen, vec![own], "its own task's attempt, not bob's");
}
