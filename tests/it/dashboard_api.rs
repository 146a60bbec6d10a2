//! Tests of the API the dashboard reads: the task list's filters (text, states, queue,
//! worker, owner), its summary view and its bounded scans, masked environments, resubmitting
//! a task, the overview's exact counts on a known data set (and their per-minute series with
//! time as an input), the queue counts, and what user and admin tokens see.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sked_db::listing::{ListFilter, list};
use sked_types::TaskState;
use sqlx::PgPool;
use uuid::Uuid;

use crate::api::{Api, assert_error};
use crate::support::{config, insert, start_worker};

/// The ids of a page's tasks, in order.
fn ids(page: &Value) -> Vec<Uuid> {
    page["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("a page has tasks: {page}"))
        .iter()
        .map(|t| t["id"].as_str().unwrap().parse().unwrap())
        .collect()
}

fn set(ids: &[Uuid]) -> BTreeSet<Uuid> {
    ids.iter().copied().collect()
}

/// Newest first: ids are time-ordered, and ids made in the same millisecond are ordered by
/// their random part, so the expected order is the sorted one.
fn newest_first(ids: &[Uuid]) -> Vec<Uuid> {
    let mut ids = ids.to_vec();
    ids.sort_by(|a, b| b.cmp(a));
    ids
}

/// A task of `owner` in `queue` in any state, inserted with plain SQL: `extra` adds columns
/// and values (`, col` and `, value` pairs) to those the state needs.
async fn task(pool: &PgPool, owner: &str, queue: &str, state: &str, when: &str) -> Uuid {
    let worker = "'00000000-0000-4000-8000-000000000001'";
    let (cols, vals) = match state {
        "waiting" => ("next_run_at".to_owned(), when.to_owned()),
        "retry" => (
            "attempt, started_at, next_run_at".to_owned(),
            format!("1, now() - interval '1 minute', {when}"),
        ),
        "blocked" => ("parents, parents_pending".to_owned(), "1, 1".to_owned()),
        "running" => (
            "attempt, worker_id, started_at, lease_expires_at".to_owned(),
            format!("1, {worker}, now(), now() + interval '30 seconds'"),
        ),
        "upstream_failed" | "skipped" | "cancelled" => ("finished_at".to_owned(), when.to_owned()),
        _ => (
            "attempt, started_at, finished_at".to_owned(),
            format!("1, {when} - interval '1 second', {when}"),
        ),
    };
    insert(
        pool,
        &format!(
            "(owner, queue, state, command, {cols}) \
             values ('{owner}', '{queue}', '{state}', array['echo', '{state}'], {vals})"
        ),
    )
    .await
}

#[tokio::test]
async fn the_list_filters_by_text_in_the_command_line_args_and_name() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let report = insert(
        pool,
        "(owner, command, args) values ('alice', array['/opt/Reports/render', '--month'], array['2030-01'])",
    )
    .await;
    let named = insert(
        pool,
        "(owner, command, name) values ('alice', array['true'], 'Nightly-Report')",
    )
    .await;
    let artifact = insert(
        pool,
        "(owner, artifact_url, artifact_sha256, args) values ('alice', 'https://example.com/report.sh', \
         repeat('a', 64), array['x'])",
    )
    .await;
    let across = insert(
        pool,
        "(owner, command, args) values ('alice', array['sh', '-c'], array['pg_dump shop'])",
    )
    .await;
    let other = insert(
        pool,
        "(owner, command) values ('alice', array['echo', 'hello'])",
    )
    .await;

    let (status, page) = api.get("/api/v1/tasks?q=REPORT", &api.alice).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        ids(&page),
        newest_first(&[report, named, artifact]),
        "q matches the command, the name and the artifact URL, ignoring case"
    );
    let (_, page) = api.get("/api/v1/tasks?q=-c%20pg_dump", &api.alice).await;
    assert_eq!(
        ids(&page),
        vec![across],
        "the command line is the command and the args joined by spaces"
    );
    let (_, page) = api.get("/api/v1/tasks?q=2030-01", &api.alice).await;
    assert_eq!(ids(&page), vec![report], "q matches the args");
    let (_, page) = api.get("/api/v1/tasks?q=%25", &api.alice).await;
    assert!(
        ids(&page).is_empty(),
        "q is a plain substring: % is no wildcard: {page}"
    );
    let (_, page) = api.get("/api/v1/tasks?q=", &api.alice).await;
    assert_eq!(ids(&page).len(), 5, "an empty q filters nothing");
    assert!(ids(&page).contains(&other));
    let (_, page) = api.get("/api/v1/tasks?q=report", &api.bob).await;
    assert!(ids(&page).is_empty(), "bob sees none of alice's tasks");
    let (_, page) = api.get("/api/v1/tasks?q=report&limit=2", &api.admin).await;
    assert_eq!(ids(&page), newest_first(&[report, named, artifact])[..2]);
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a full page has a cursor");
    let (_, page) = api
        .get(
            &format!("/api/v1/tasks?q=report&limit=2&after={cursor}"),
            &api.admin,
        )
        .await;
    assert_eq!(ids(&page), newest_first(&[report, named, artifact])[2..]);
    assert_eq!(
        page["next_cursor"],
        Value::Null,
        "the last page has no cursor"
    );
    assert_eq!(page["scan_limit_reached"], false);
}

#[tokio::test]
async fn the_list_filters_by_several_states_queue_worker_and_owner() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let failed = task(pool, "alice", "q1", "failed", "now()").await;
    let cancelled = task(pool, "alice", "q2", "cancelled", "now()").await;
    let succeeded = task(pool, "alice", "q1", "succeeded", "now()").await;
    let waiting = task(pool, "alice", "q1", "waiting", "now()").await;
    let running = task(pool, "alice", "q2", "running", "").await;
    let blocked = task(pool, "alice", "q1", "blocked", "").await;
    let bob_failed = task(pool, "bob", "q1", "failed", "now()").await;
    let other_worker = insert(
        pool,
        "(owner, state, command, attempt, worker_id, started_at, lease_expires_at) values \
         ('bob', 'running', array['x'], 1, '00000000-0000-4000-8000-000000000002', now(), now() + interval '1 minute')",
    )
    .await;

    let (status, page) = api
        .get("/api/v1/tasks?state=failed,cancelled", &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(ids(&page), newest_first(&[failed, cancelled]));
    let (_, page) = api
        .get("/api/v1/tasks?state=failed,running,waiting", &api.admin)
        .await;
    assert_eq!(
        set(&ids(&page)),
        set(&[failed, running, waiting, bob_failed, other_worker]),
        "states with and without an index of their own mix"
    );
    let (_, page) = api
        .get("/api/v1/tasks?state=succeeded&queue=q1", &api.alice)
        .await;
    assert_eq!(ids(&page), vec![succeeded]);
    let (_, page) = api.get("/api/v1/tasks?queue=q1", &api.alice).await;
    assert_eq!(
        ids(&page),
        newest_first(&[failed, succeeded, waiting, blocked])
    );
    let (_, page) = api.get("/api/v1/tasks?state=blocked", &api.admin).await;
    assert_eq!(ids(&page), vec![blocked]);

    let (_, page) = api
        .get(
            "/api/v1/tasks?worker=00000000-0000-4000-8000-000000000001",
            &api.admin,
        )
        .await;
    assert_eq!(ids(&page), vec![running], "worker= lists what it runs now");
    let (_, page) = api
        .get(
            "/api/v1/tasks?worker=00000000-0000-4000-8000-000000000002",
            &api.alice,
        )
        .await;
    assert!(
        ids(&page).is_empty(),
        "a user sees no other owner's task on a worker: {page}"
    );
    let (_, page) = api
        .get(
            "/api/v1/tasks?worker=00000000-0000-4000-8000-000000000001&state=failed",
            &api.admin,
        )
        .await;
    assert!(ids(&page).is_empty(), "filters combine with AND");

    let (_, page) = api.get("/api/v1/tasks", &api.alice).await;
    assert_eq!(
        ids(&page),
        newest_first(&[failed, cancelled, succeeded, waiting, running, blocked]),
        "a user lists its finished, pending and running tasks, newest first"
    );
    let (_, page) = api.get("/api/v1/tasks?owner=bob", &api.admin).await;
    assert_eq!(ids(&page), newest_first(&[bob_failed, other_worker]));
    let (status, body) = api.get("/api/v1/tasks?owner=bob", &api.alice).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_error(&body, "forbidden");
    let (status, body) = api
        .get("/api/v1/tasks?state=failed,bogus", &api.alice)
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error(&body, "invalid_request");
    let (status, body) = api.get("/api/v1/tasks?worker=nope", &api.alice).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn an_owners_pages_merge_its_finished_pending_and_running_tasks_in_id_order() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let mut all = Vec::new();
    for state in [
        "succeeded",
        "waiting",
        "running",
        "failed",
        "blocked",
        "retry",
    ] {
        for _ in 0..3 {
            all.push(task(pool, "alice", "q", state, "now()").await);
        }
    }
    task(pool, "bob", "q", "waiting", "now()").await;
    let expected = newest_first(&all);
    let mut seen = Vec::new();
    let mut after = String::new();
    loop {
        let (status, page) = api
            .get(&format!("/api/v1/tasks?limit=4{after}"), &api.alice)
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        seen.extend(ids(&page));
        match page["next_cursor"].as_str() {
            Some(cursor) => after = format!("&after={cursor}"),
            None => break,
        }
    }
    assert_eq!(
        seen, expected,
        "pages by keyset give every task of the owner once, newest first"
    );
}

#[tokio::test]
async fn a_residual_filter_reads_at_most_the_scan_limit_and_continues_from_its_cursor() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let needle = insert(
        pool,
        "(owner, command) values ('alice', array['find', 'the-needle'])",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    sqlx::query(
        "insert into sked.tasks (owner, command)
         select 'alice', array['echo', 'hay'] from generate_series(1, $1)",
    )
    .bind(sked_db::listing::SCAN_LIMIT as i32)
    .execute(pool)
    .await
    .unwrap();

    // The trigram index (`sked search-index enable`) finds a rare text at once; without it,
    // a walk reads the scan limit's rows per request.
    sked_db::listing::text_index_enable(pool).await.unwrap();
    let (status, page) = api.get("/api/v1/tasks?q=needle", &api.admin).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(
        ids(&page),
        vec![needle],
        "the trigram index finds the needle"
    );
    assert_eq!(page["scan_limit_reached"], false);
    sked_db::listing::text_index_disable(pool).await.unwrap();
    let (status, page) = api.get("/api/v1/tasks?q=needle", &api.admin).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        ids(&page).is_empty(),
        "the newest scan-limit tasks hold no match"
    );
    assert_eq!(
        page["scan_limit_reached"], true,
        "the page says the scan stopped at its limit"
    );
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a scan that stopped has a cursor");
    let (_, page) = api
        .get(
            &format!("/api/v1/tasks?q=needle&after={cursor}"),
            &api.admin,
        )
        .await;
    assert_eq!(
        ids(&page),
        vec![needle],
        "the next request continues the scan"
    );
    assert_eq!(page["scan_limit_reached"], false);
    assert_eq!(page["next_cursor"], Value::Null);

    // Without a residual filter the index answers exactly, whatever the table holds.
    let (_, page) = api.get("/api/v1/tasks?limit=3", &api.alice).await;
    assert_eq!(ids(&page).len(), 3);
    assert_eq!(page["scan_limit_reached"], false);

    // A user's text search reads whole rows of its owner's walks, which lie across the
    // table: at most the smaller limit per request.
    let total = sked_db::listing::SCAN_LIMIT + 1;
    let per_request = sked_db::listing::SCAN_LIMIT_SCATTERED;
    let mut after = String::new();
    let mut requests = 0;
    let found = loop {
        let (status, page) = api
            .get(&format!("/api/v1/tasks?q=needle{after}"), &api.alice)
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        requests += 1;
        if !ids(&page).is_empty() {
            break ids(&page);
        }
        assert_eq!(page["scan_limit_reached"], true);
        after = format!("&after={}", page["next_cursor"].as_str().unwrap());
    };
    assert_eq!(found, vec![needle]);
    assert_eq!(
        requests,
        (total + per_request - 1) / per_request,
        "{total} tasks take one request per {per_request}"
    );
}

#[tokio::test]
async fn the_scan_limit_bounds_every_driver_and_the_cursor_resumes_where_it_stopped() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let mut failed = Vec::new();
    for i in 0..7 {
        let queue = if i == 1 || i == 5 { "hit" } else { "miss" };
        failed.push(task(pool, "alice", queue, "failed", "now()").await);
    }
    let mut others = Vec::new();
    for (queue, state) in [
        ("miss", "succeeded"),
        ("hit", "running"),
        ("miss", "running"),
        ("hit", "waiting"),
        ("miss", "succeeded"),
    ] {
        others.push((queue, task(pool, "alice", queue, state, "now()").await));
    }
    let bob = task(pool, "bob", "hit", "failed", "now()").await;
    let in_hit = |ids: &[Uuid], extra: &[Uuid]| -> Vec<Uuid> {
        let hit: Vec<Uuid> = [failed[1], failed[5]]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        newest_first(ids)
            .into_iter()
            .filter(|id| hit.contains(id))
            .collect()
    };
    let all_alice: Vec<Uuid> = failed
        .iter()
        .copied()
        .chain(others.iter().map(|(_, id)| *id))
        .collect();
    let hit_others: Vec<Uuid> = others
        .iter()
        .filter(|(q, _)| *q == "hit")
        .map(|(_, id)| *id)
        .collect();
    // Three rows read per request, one task per page. The queue's walks drive, one per
    // state (the failed ones, or every state merged), with the owner residual when given.
    let cases = [
        (
            None,
            vec![TaskState::Failed],
            in_hit(&[failed.as_slice(), &[bob]].concat(), &[bob]),
        ),
        (Some("alice"), vec![TaskState::Failed], in_hit(&failed, &[])),
        (Some("alice"), vec![], in_hit(&all_alice, &hit_others)),
    ];
    for (owner, states, expected) in cases {
        let mut filter = ListFilter {
            owner: owner.map(str::to_owned),
            states: states.clone(),
            queue: Some("hit".into()),
            limit: 1,
            scan_limit: 3,
            ..ListFilter::default()
        };
        let mut found = Vec::new();
        let mut requests = 0;
        loop {
            let page = list(pool, &filter).await.unwrap();
            requests += 1;
            assert!(page.rows.len() <= 1);
            found.extend(page.rows.iter().map(|r| r.id));
            match page.next_cursor {
                Some(cursor) => filter.after = Some(cursor),
                None => break,
            }
        }
        assert_eq!(
            found, expected,
            "every match once, in order ({owner:?}, {states:?})"
        );
        assert!(
            requests >= expected.len(),
            "one task per page: at least as many requests as matches ({owner:?})"
        );
    }
}

#[tokio::test]
async fn the_summary_view_lists_what_a_task_list_shows() {
    let api = Api::new().await;
    let id = insert(
        &api.db.pool,
        "(owner, command, args, env) values ('alice', array['echo'], array['hi'], '{\"API_TOKEN\": \"t\"}')",
    )
    .await;
    let (status, page) = api.get("/api/v1/tasks?view=summary", &api.alice).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    let summary = &page["tasks"][0];
    assert_eq!(summary["id"], id.to_string());
    assert_eq!(summary["argv"], json!(["echo", "hi"]));
    assert_eq!(summary["state"], "waiting");
    assert!(
        summary.get("env").is_none() && summary.get("input").is_none(),
        "a summary leaves out the environment and the input: {summary}"
    );
    let parsed: sked_types::TaskSummaryPage =
        serde_json::from_value(page.clone()).expect("the page is a TaskSummaryPage");
    assert_eq!(parsed.tasks.len(), 1);
    let (_, full) = api.get("/api/v1/tasks?view=full", &api.alice).await;
    assert_eq!(
        full["tasks"][0]["env"]["API_TOKEN"],
        sked_types::secrets::MASK
    );
    let (status, body) = api.get("/api/v1/tasks?view=compact", &api.alice).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&body, "invalid_request");
}

#[tokio::test]
async fn answers_mask_secret_environment_values_and_the_worker_gets_the_real_ones() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let (status, submitted) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({
                "command": ["sh", "-c", "printf '%s %s' \"$API_TOKEN\" \"$DATABASE_URL\""],
                "env": {
                    "API_TOKEN": "tok-123",
                    "db_password": "hunter2",
                    "DATABASE_URL": "postgres://app:hunter2@db/shop",
                    "LOG_LEVEL": "info",
                },
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    let id = submitted["ids"][0].as_str().unwrap().to_owned();

    let mask = sked_types::secrets::MASK;
    let (_, detail) = api.get(&format!("/api/v1/tasks/{id}"), &api.alice).await;
    assert_eq!(
        detail["env"],
        json!({
            "API_TOKEN": mask,
            "db_password": mask,
            "DATABASE_URL": format!("postgres://app:{mask}@db/shop"),
            "LOG_LEVEL": "info",
        }),
        "secret names and URL passwords are masked, other values are not"
    );
    let (_, page) = api.get("/api/v1/tasks", &api.admin).await;
    assert_eq!(
        page["tasks"][0]["env"]["API_TOKEN"], mask,
        "listings mask too"
    );
    let stored: Value = sqlx::query_scalar("select env from sked.tasks where id = $1::uuid")
        .bind(&id)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        stored["API_TOKEN"], "tok-123",
        "the database keeps the real value"
    );
    let read = sked_db::task::get(pool, id.parse().unwrap())
        .await
        .unwrap()
        .unwrap()
        .into_task();
    assert_eq!(
        read.env["API_TOKEN"], "tok-123",
        "sked-db reads the real value: the server masks its answers"
    );
    let (status, workflow) = api
        .post(
            "/api/v1/workflows",
            &api.alice,
            json!({"tasks": [{"name": "a", "kind": "noop", "env": {"API_TOKEN": "tok-9"}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{workflow}");
    let workflow = workflow["id"].as_str().unwrap();
    let (_, shown) = api
        .get(&format!("/api/v1/workflows/{workflow}"), &api.alice)
        .await;
    assert_eq!(
        shown["tasks"][0]["env"]["API_TOKEN"], mask,
        "a workflow's tasks are masked: {shown}"
    );

    let worker = start_worker(&api.db, config(&["default"]));
    let id: Uuid = id.parse().unwrap();
    crate::support::wait_for(pool, id, &["succeeded"], Duration::from_secs(20)).await;
    worker.shutdown().await;
    let (_, detail) = api.get(&format!("/api/v1/tasks/{id}"), &api.alice).await;
    assert_eq!(
        detail["stdout_tail"], "tok-123 postgres://app:hunter2@db/shop",
        "the process got the real values"
    );
}

/// Schedules show their templates' environments masked too, in every answer; their ticks
/// (here a run now) submit the real values.
#[tokio::test]
async fn schedule_templates_show_masked_environments_and_submit_the_real_ones() {
    let api = Api::new().await;
    let mask = sked_types::secrets::MASK;
    let (status, created) = api
        .post(
            "/api/v1/schedules",
            &api.alice,
            json!({"name": "backup", "cron": "0 0 * * *", "task": {
                "command": ["backup"],
                "env": {"PGPASSWORD": "hunter2", "TARGET": "s3://b:sk@bucket/x", "MODE": "full"},
            }}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let masked =
        json!({"PGPASSWORD": mask, "TARGET": format!("s3://b:{mask}@bucket/x"), "MODE": "full"});
    assert_eq!(created["task"]["env"], masked, "the create answer masks");
    let id = created["id"].as_str().unwrap().to_owned();
    let (_, detail) = api
        .get(&format!("/api/v1/schedules/{id}"), &api.alice)
        .await;
    assert_eq!(detail["task"]["env"], masked, "the detail masks");
    let (_, page) = api.get("/api/v1/schedules", &api.admin).await;
    assert_eq!(
        page["schedules"][0]["task"]["env"], masked,
        "the list masks"
    );

    let ran = api.run_now(id.parse().unwrap()).await;
    let mut env: Value = sqlx::query_scalar("select env from sked.tasks where id = $1::uuid")
        .bind(ran["task_id"].as_str().unwrap())
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    let env = env.as_object_mut().unwrap();
    for tick in ["SKED_TICK", "SKED_TICK_UTC", "SKED_TICK_DATE"] {
        assert!(
            env.remove(tick).is_some(),
            "an occurrence knows its tick: {tick}"
        );
    }
    assert_eq!(
        Value::Object(env.clone()),
        json!({"PGPASSWORD": "hunter2", "TARGET": "s3://b:sk@bucket/x", "MODE": "full"}),
        "the occurrence gets the real values"
    );

    // Sending back the template as it was shown would store the mask: refused.
    let (status, refused) = api
        .call(
            axum::http::Method::PATCH,
            &format!("/api/v1/schedules/{id}"),
            &api.alice,
            Some(json!({"task": detail["task"].clone()})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_error(&refused, "invalid_request");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("env PGPASSWORD"),
        "the error names the variable: {refused}"
    );
    let env: Value =
        sqlx::query_scalar("select task -> 'env' from sked.schedules where id = $1::uuid")
            .bind(&id)
            .fetch_one(&api.db.pool)
            .await
            .unwrap();
    assert_eq!(
        env["PGPASSWORD"], "hunter2",
        "the refused change changed nothing"
    );

    let (status, created) = api
        .post(
            "/api/v1/schedules",
            &api.alice,
            json!({"name": "etl", "cron": "0 1 * * *", "workflow": {"tasks": [
                {"name": "a", "command": ["extract"], "env": {"API_TOKEN": "t0k", "N": "1"}},
                {"name": "b", "command": ["load"], "depends_on": ["a"]},
            ]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap();
    let (_, detail) = api
        .get(&format!("/api/v1/schedules/{id}"), &api.alice)
        .await;
    assert_eq!(
        detail["workflow"]["tasks"][0]["env"],
        json!({"API_TOKEN": mask, "N": "1"}),
        "a workflow template's tasks are masked"
    );
}

#[tokio::test]
async fn resubmit_copies_the_definition_for_the_caller() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let (status, submitted) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({
                "command": ["sh", "-c", "exit 0"],
                "args": ["a"],
                "queue": "reports",
                "priority": 7,
                "input": {"month": "2030-01"},
                "env": {"API_TOKEN": "tok-123", "LEVEL": "debug"},
                "labels": ["gpu"],
                "timeout_secs": 90,
                "max_attempts": 5,
                "backoff_base_secs": 2,
                "backoff_max_secs": 60,
                "idempotency_key": "once",
                "delay_secs": 3600,
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    let id: Uuid = submitted["ids"][0].as_str().unwrap().parse().unwrap();
    sqlx::query(
        "update sked.tasks set state = 'failed', attempt = 5, started_at = now(),
                finished_at = now(), exit_code = 1 where id = $1",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();

    let (status, answer) = api
        .post(
            &format!("/api/v1/tasks/{id}/resubmit"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let new: Uuid = answer["ids"][0].as_str().unwrap().parse().unwrap();
    assert_ne!(new, id, "resubmit makes a new task");
    let old = sked_db::task::get(pool, id).await.unwrap().unwrap();
    let copy = sked_db::task::get(pool, new).await.unwrap().unwrap();
    assert_eq!(
        old.state,
        TaskState::Failed,
        "the task itself is left as it was"
    );
    assert_eq!(
        (
            copy.command.clone(),
            copy.args.clone(),
            copy.queue.clone(),
            copy.priority
        ),
        (
            old.command.clone(),
            old.args.clone(),
            old.queue.clone(),
            old.priority
        )
    );
    assert_eq!(
        (copy.input.clone(), copy.env.clone(), copy.labels.clone()),
        (old.input.clone(), old.env.clone(), old.labels.clone()),
        "input, the real environment and labels are copied"
    );
    assert_eq!(copy.env["API_TOKEN"], "tok-123");
    assert_eq!(
        (
            copy.max_attempts,
            copy.timeout_secs,
            copy.backoff_base_secs,
            copy.backoff_max_secs
        ),
        (
            old.max_attempts,
            old.timeout_secs,
            old.backoff_base_secs,
            old.backoff_max_secs
        ),
        "the limits are copied"
    );
    assert_eq!(copy.owner, "alice");
    assert_eq!(copy.state, TaskState::Waiting);
    assert_eq!(copy.attempt, 0, "a resubmitted task starts with no attempt");
    assert_eq!(copy.idempotency_key, None, "no idempotency key is copied");
    assert!(
        copy.next_run_at < old.next_run_at,
        "it waits from now, not from the delayed start"
    );

    let (status, body) = api
        .post(&format!("/api/v1/tasks/{id}/resubmit"), &api.bob, json!({}))
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another user's task is not found"
    );
    assert_error(&body, "not_found");
    let (status, answer) = api
        .post(
            &format!("/api/v1/tasks/{id}/resubmit"),
            &api.admin,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let by_admin: Uuid = answer["ids"][0].as_str().unwrap().parse().unwrap();
    assert_eq!(
        sked_db::task::get(pool, by_admin)
            .await
            .unwrap()
            .unwrap()
            .owner,
        "root",
        "the new task belongs to the caller"
    );
    let (status, body) = api
        .post(
            &format!("/api/v1/tasks/{}/resubmit", Uuid::new_v4()),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&body, "not_found");
}

#[tokio::test]
async fn resubmit_refuses_workflow_tasks_and_shards_and_resubmits_sharded_tasks_whole() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let (status, wf) = api
        .post(
            "/api/v1/workflows",
            &api.alice,
            json!({"name": "w", "tasks": [{"name": "a", "command": ["true"]}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{wf}");
    let node: Uuid = sqlx::query_scalar("select id from sked.tasks where workflow_id is not null")
        .fetch_one(pool)
        .await
        .unwrap();
    let before = api_task_count(pool).await;
    let (status, body) = api
        .post(
            &format!("/api/v1/tasks/{node}/resubmit"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_error(&body, "conflict");
    assert!(body["message"].as_str().unwrap().contains("workflow"));
    assert_eq!(
        api_task_count(pool).await,
        before,
        "a refusal inserts nothing"
    );

    let (status, submitted) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "shards": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{submitted}");
    let parent: Uuid = submitted["ids"][0].as_str().unwrap().parse().unwrap();
    let shard: Uuid = sqlx::query_scalar("select id from sked.tasks where shard_of = $1 limit 1")
        .bind(parent)
        .fetch_one(pool)
        .await
        .unwrap();
    let before_shard = api_task_count(pool).await;
    assert_eq!(before_shard, before + 4);
    let (status, body) = api
        .post(
            &format!("/api/v1/tasks/{shard}/resubmit"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_error(&body, "conflict");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&parent.to_string()),
        "the refusal names the parent to resubmit: {body}"
    );
    assert_eq!(
        api_task_count(pool).await,
        before_shard,
        "a refusal inserts nothing"
    );

    let (status, answer) = api
        .post(
            &format!("/api/v1/tasks/{parent}/resubmit"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let new: Uuid = answer["ids"][0].as_str().unwrap().parse().unwrap();
    let shards: i64 = sqlx::query_scalar("select count(*) from sked.tasks where shard_of = $1")
        .bind(new)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(shards, 3, "a sharded task is resubmitted with its shards");

    // The SQL function refuses on its own, for applications that call it directly.
    let err = sked_db::task::resubmit(pool, node, "alice")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, sked_db::DbError::Rejected { constraint, .. }
                 if constraint == "tasks_resubmit_is_not_for_workflow_tasks"),
        "{err:?}"
    );
}

async fn api_task_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A known data set: alice's and bob's tasks in queues q1 and q2, and two workers, one of
/// them dead. Times are relative to the database clock, away from the edges of the hour.
async fn known_data(pool: &PgPool) {
    for (owner, queue, state, when) in [
        ("alice", "q1", "waiting", "now() - interval '10 minutes'"),
        ("alice", "q1", "waiting", "now() - interval '1 minute'"),
        ("alice", "q1", "waiting", "now() + interval '1 hour'"),
        ("alice", "q1", "blocked", ""),
        ("alice", "q1", "running", ""),
        ("alice", "q1", "retry", "now() - interval '30 seconds'"),
        ("alice", "q1", "retry", "now() + interval '5 minutes'"),
        ("alice", "q1", "succeeded", "now() - interval '5 minutes'"),
        ("alice", "q1", "succeeded", "now() - interval '30 minutes'"),
        ("alice", "q1", "failed", "now() - interval '10 minutes'"),
        ("alice", "q1", "cancelled", "now() - interval '2 hours'"),
        ("alice", "q1", "succeeded", "now() - interval '3 hours'"),
        ("bob", "q1", "waiting", "now() - interval '2 hours'"),
        ("bob", "q2", "running", ""),
        ("bob", "q2", "succeeded", "now() - interval '1 minute'"),
        (
            "bob",
            "q2",
            "upstream_failed",
            "now() - interval '3 minutes'",
        ),
        ("bob", "q2", "skipped", "now() - interval '20 minutes'"),
        ("bob", "q3", "succeeded", "now() - interval '1 day'"),
    ] {
        task(pool, owner, queue, state, when).await;
    }
    sqlx::query(
        "insert into sked.workers (id, name, host, version, queues, concurrency, lease, heartbeat_at)
         values ('00000000-0000-4000-8000-000000000001', 'a', 'h', '0', '{q1}', 4, '30 s', now()),
                ('00000000-0000-4000-8000-000000000002', 'b', 'h', '0', '{q1}', 4, '30 s',
                 now() - interval '1 hour')",
    )
    .execute(pool)
    .await
    .unwrap();
}

fn queue<'a>(overview: &'a Value, name: &str) -> &'a Value {
    overview["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == name)
        .unwrap_or_else(|| panic!("queue {name} is in the overview: {overview}"))
}

fn assert_about(value: &Value, expected: f64, what: &str) {
    let v = value
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is a number: {value}"));
    assert!(
        (v - expected).abs() < 20.0,
        "{what} is about {expected} s, got {v}"
    );
}

#[tokio::test]
async fn the_overview_counts_a_known_data_set_exactly() {
    let api = Api::new().await;
    known_data(&api.db.pool).await;

    let (status, mine) = api.get("/api/v1/overview", &api.alice).await;
    assert_eq!(status, StatusCode::OK, "{mine}");
    assert_eq!(
        mine["owner"], "alice",
        "a user's overview counts its own tasks"
    );
    assert_eq!(
        mine["queues"].as_array().unwrap().len(),
        1,
        "alice has tasks in q1 only: {mine}"
    );
    let q1 = queue(&mine, "q1");
    for (field, n) in [
        ("blocked", 1),
        ("waiting_due", 2),
        ("waiting_delayed", 1),
        ("running", 1),
        ("retry", 2),
    ] {
        assert_eq!(q1[field], n, "alice's q1 {field}: {q1}");
    }
    assert_eq!(
        q1["finished"],
        json!({"succeeded": 2, "failed": 1, "cancelled": 0, "upstream_failed": 0, "skipped": 0}),
        "finished in the last hour only"
    );
    assert_about(&q1["oldest_due_secs"], 600.0, "the oldest due task's wait");
    assert_eq!(mine["workers"], json!({"alive": 1, "total": 2}));
    let series = mine["series"].as_array().unwrap();
    assert_eq!(series.len(), 60, "one point per minute of the last hour");
    let total: i64 = series
        .iter()
        .map(|p| {
            let f = &p["finished"];
            [
                "succeeded",
                "failed",
                "cancelled",
                "upstream_failed",
                "skipped",
            ]
            .iter()
            .map(|s| f[s].as_i64().unwrap())
            .sum::<i64>()
        })
        .sum();
    assert_eq!(total, 3, "the series adds up to the last hour's finishes");
    let since: DateTime<Utc> = mine["since"].as_str().unwrap().parse().unwrap();
    let at: DateTime<Utc> = mine["at"].as_str().unwrap().parse().unwrap();
    assert!(
        at - since >= chrono::Duration::minutes(59) && at - since < chrono::Duration::minutes(60)
    );

    let (_, all) = api.get("/api/v1/overview", &api.admin).await;
    assert_eq!(
        all["owner"],
        Value::Null,
        "an admin counts every owner's tasks"
    );
    let q1 = queue(&all, "q1");
    assert_eq!(q1["waiting_due"], 3, "bob's due task counts for the admin");
    assert_about(
        &q1["oldest_due_secs"],
        7200.0,
        "bob's task waits the longest",
    );
    let q2 = queue(&all, "q2");
    assert_eq!(q2["running"], 1);
    assert_eq!(
        q2["finished"],
        json!({"succeeded": 1, "failed": 0, "cancelled": 0, "upstream_failed": 1, "skipped": 1})
    );
    assert_eq!(q2["oldest_due_secs"], Value::Null, "nothing of q2 is due");
    assert!(
        all["queues"]
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["queue"] != "q3"),
        "a queue with only old finished tasks is not listed: {all}"
    );

    // The same counts; the waits differ by the time between the two requests.
    let counts = |overview: &Value| {
        let mut queues = overview["queues"].clone();
        for q in queues.as_array_mut().unwrap() {
            q["oldest_due_secs"] = Value::Null;
        }
        queues
    };
    let (_, alices) = api.get("/api/v1/overview?owner=alice", &api.admin).await;
    assert_eq!(
        counts(&alices),
        counts(&mine),
        "an admin may count one owner's tasks"
    );
    let (status, body) = api.get("/api/v1/overview?owner=bob", &api.alice).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_error(&body, "forbidden");
}

#[tokio::test]
async fn the_overview_series_puts_each_finish_in_its_minute_with_time_as_input() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let now: DateTime<Utc> = "2030-01-01T12:30:30Z".parse().unwrap();
    for (state, at) in [
        ("succeeded", "2030-01-01T11:30:59.999999Z"),
        ("succeeded", "2030-01-01T11:31:00Z"),
        ("failed", "2030-01-01T11:31:59Z"),
        ("succeeded", "2030-01-01T12:00:00Z"),
        ("cancelled", "2030-01-01T12:30:30Z"),
        ("succeeded", "2030-01-01T12:30:30.000001Z"),
    ] {
        task(pool, "alice", "q", state, &format!("'{at}'::timestamptz")).await;
    }
    let o = sked_db::overview::overview(pool, None, Some(now))
        .await
        .unwrap();
    assert_eq!(
        o.since,
        "2030-01-01T11:31:00Z".parse::<DateTime<Utc>>().unwrap()
    );
    let point = |i: usize| o.series[i].finished;
    assert_eq!(
        point(0).succeeded,
        1,
        "the first minute starts at `since`, inclusive"
    );
    assert_eq!(point(0).failed, 1);
    assert_eq!(point(29).succeeded, 1, "12:00 is the 30th minute");
    assert_eq!(
        point(59).cancelled,
        1,
        "the current minute is the last point"
    );
    assert_eq!(point(59).succeeded, 0, "a finish after `at` is not counted");
    let q = &o.queues[0];
    assert_eq!(
        (
            q.finished.succeeded,
            q.finished.failed,
            q.finished.cancelled
        ),
        (2, 1, 1)
    );
    let o = sked_db::overview::overview(pool, Some("bob"), Some(now))
        .await
        .unwrap();
    assert!(o.queues.is_empty(), "bob has no tasks");
    assert!(o.series.iter().all(|p| p.finished.total() == 0));
}

#[tokio::test]
async fn queue_counts_take_unfinished_tasks_and_the_last_hours_finishes() {
    let api = Api::new().await;
    known_data(&api.db.pool).await;
    let (status, queues) = api.get("/api/v1/queues", &api.alice).await;
    assert_eq!(status, StatusCode::OK, "{queues}");
    let q1 = &queues[0];
    assert_eq!(queues.as_array().unwrap().len(), 1, "{queues}");
    assert_eq!(
        q1["counts"],
        json!({"blocked": 1, "waiting": 3, "running": 1, "retry": 2, "succeeded": 2, "failed": 1}),
        "a task finished hours ago is not counted"
    );
    assert_about(&q1["oldest_due_secs"], 600.0, "the oldest due task's wait");
    let (_, queues) = api.get("/api/v1/queues", &api.admin).await;
    let names: Vec<&str> = queues
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["q1", "q2"]);
}

#[tokio::test]
async fn the_dashboard_endpoints_need_a_token_and_are_documented() {
    let api = Api::new().await;
    for uri in ["/api/v1/overview", "/api/v1/tasks?view=summary"] {
        let (status, _, body) = api.raw(axum::http::Method::GET, uri, None, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri} needs a token");
        assert_error(&body, "unauthorized");
    }
    let id = Uuid::new_v4();
    let (status, _, _) = api
        .raw(
            axum::http::Method::POST,
            &format!("/api/v1/tasks/{id}/resubmit"),
            None,
            Some("{}".into()),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (_, _, doc) = api
        .raw(axum::http::Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    for path in ["/api/v1/overview", "/api/v1/tasks/{id}/resubmit"] {
        assert!(doc["paths"][path].is_object(), "the document lists {path}");
    }
    let params: Vec<&str> = doc["paths"]["/api/v1/tasks"]["get"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for name in ["q", "state", "worker", "owner", "view"] {
        assert!(
            params.contains(&name),
            "the listing documents {name}: {params:?}"
        );
    }
    for schema in ["Overview", "TaskSummaryPage", "TaskPage"] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "{schema} is described"
        );
    }
}

#[tokio::test]
async fn the_cli_searches_resubmits_and_shows_masked_values() {
    let cli = crate::cli::Api::start().await;
    let pool = &cli.db.pool;
    let id = insert(
        pool,
        "(owner, command, env) values ('admin', array['render', 'Monthly-Report'], \
         '{\"API_TOKEN\": \"tok-123\"}')",
    )
    .await;
    insert(
        pool,
        "(owner, command) values ('admin', array['echo', 'x'])",
    )
    .await;
    let listed = cli.ok(&["list", "--search", "monthly"]).await;
    assert!(listed.contains(&id.to_string()), "{listed}");
    assert_eq!(
        listed.lines().count(),
        2,
        "a header and the one match: {listed}"
    );
    let shown = cli.ok(&["show", &id.to_string()]).await;
    assert!(
        shown.contains(sked_types::secrets::MASK) && !shown.contains("tok-123"),
        "sked show prints the masked value: {shown}"
    );
    let out = cli.ok(&["resubmit", &id.to_string()]).await;
    let new: Uuid = out.trim().parse().expect("resubmit prints the new id");
    let copy = sked_db::task::get(pool, new).await.unwrap().unwrap();
    assert_eq!(
        copy.env["API_TOKEN"], "tok-123",
        "the copy has the real value"
    );
}

/// The finishes of the last hour at `now`, counted from the task table as the overview
/// counted them before it read the rollups: per queue and per minute, by final state.
async fn finishes_scanned(
    pool: &PgPool,
    owner: Option<&str>,
    now: DateTime<Utc>,
) -> (
    std::collections::BTreeMap<String, sked_types::FinalCounts>,
    std::collections::BTreeMap<DateTime<Utc>, sked_types::FinalCounts>,
) {
    let rows: Vec<(String, DateTime<Utc>, String, i64)> = sqlx::query_as(
        "select queue, date_trunc('minute', finished_at), state, count(*) from sked.tasks
          where finished_at >= sked.overview_since($2) and finished_at <= $2
            and ($1::text is null or owner = $1)
          group by 1, 2, 3",
    )
    .bind(owner)
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap();
    let (mut queues, mut minutes) = (
        std::collections::BTreeMap::new(),
        std::collections::BTreeMap::new(),
    );
    for (queue, minute, state, n) in rows {
        let state: TaskState = state.parse().unwrap();
        queues
            .entry(queue)
            .or_insert_with(sked_types::FinalCounts::default)
            .add(state, n);
        minutes
            .entry(minute)
            .or_insert_with(sked_types::FinalCounts::default)
            .add(state, n);
    }
    (queues, minutes)
}

/// Asserts that the overview at `now` counts the last hour's finishes as a scan of the task
/// table does, for every owner and for alice.
async fn assert_overview_matches_scan(pool: &PgPool, now: DateTime<Utc>, when: &str) {
    for owner in [None, Some("alice")] {
        let o = sked_db::overview::overview(pool, owner, Some(now))
            .await
            .unwrap();
        let (queues, minutes) = finishes_scanned(pool, owner, now).await;
        let got: std::collections::BTreeMap<String, sked_types::FinalCounts> = o
            .queues
            .iter()
            .filter(|q| q.finished.total() > 0)
            .map(|q| (q.queue.clone(), q.finished))
            .collect();
        assert_eq!(
            got, queues,
            "{when}: the overview's finished counts per queue ({owner:?}) are the task table's"
        );
        let got: std::collections::BTreeMap<DateTime<Utc>, sked_types::FinalCounts> = o
            .series
            .iter()
            .filter(|p| p.finished.total() > 0)
            .map(|p| (p.minute, p.finished))
            .collect();
        assert_eq!(
            got, minutes,
            "{when}: the overview's series ({owner:?}) is the task table's, minute by minute"
        );
    }
}

#[tokio::test]
async fn the_overview_counts_many_finishes_of_the_last_hour_from_the_rollups_exactly() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let now: DateTime<Utc> = "2030-01-01T12:30:30Z".parse().unwrap();
    // 6,000 finishes from 70 minutes before `now` to 30 s after it, in two queues, of two
    // owners, in three final states; the newest after `now` must not count.
    sqlx::query(
        "insert into sked.tasks (owner, queue, state, command, attempt, started_at, finished_at,
                                 next_run_at)
         select case when i % 3 = 0 then 'bob' else 'alice' end, 'q' || (i % 2 + 1),
                (array['succeeded', 'failed', 'cancelled'])[i % 3 + 1], array['x'], 1,
                f - interval '2 seconds', f, f - interval '5 seconds'
           from generate_series(1, 6000) i,
                lateral (select $1::timestamptz - interval '70 minutes'
                                + (i * interval '710 milliseconds') as f) x",
    )
    .bind(now)
    .execute(pool)
    .await
    .unwrap();
    assert_overview_matches_scan(pool, now, "before any fold").await;

    // Part of the deltas folded, then finishes undone and changed by later statements.
    sked_db::history::fold(pool, 2).await.unwrap();
    sqlx::query(
        "update sked.tasks set state = 'waiting', finished_at = null, attempt = 1
          where id in (select id from sked.tasks where state = 'failed' order by id limit 300)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "update sked.tasks set state = 'upstream_failed'
          where id in (select id from sked.tasks where state = 'succeeded' order by id limit 200)",
    )
    .execute(pool)
    .await
    .unwrap();
    assert_overview_matches_scan(pool, now, "partly folded, with finishes undone").await;

    while sked_db::history::fold(pool, 3).await.unwrap() > 0 {}
    let left: i64 = sqlx::query_scalar("select count(*) from sked.finish_deltas")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "folding until nothing is folded leaves no delta");
    assert_overview_matches_scan(pool, now, "all folded").await;
}
