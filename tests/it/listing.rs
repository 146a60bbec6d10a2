//! Task listings whose every filter finds its first page on an index: state (waiting and
//! succeeded too), queue, owner, workflow, schedule, submission-time range and text (the
//! trigram index, made by `sked search-index enable`), each alone and combined, behind many
//! newer tasks that do not match; counts ("more than" past the limit); the text filter
//! without its trigram index; the REST parameters (`GET /api/v1/tasks`,
//! `GET /api/v1/tasks/count`); and `sked search-index`.

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sked_db::listing::{COUNT_LIMIT, Count, ListFilter, count, list};
use sked_types::TaskState;
use sqlx::PgPool;
use uuid::Uuid;

use crate::api::{Api, assert_error};
use crate::support::insert;

/// Newer tasks that match none of the cases, more than the scan limit of the cases.
const NEWER: i32 = 40;
/// The scan limit of the cases: a walk of residual filters reads this many rows at most.
const SCAN: i64 = 5;

/// The ids `condition` selects, newest first, by a plain scan of the table.
async fn expected(pool: &PgPool, condition: &str) -> Vec<Uuid> {
    let sql = format!("select t.id from sked.tasks t where {condition} order by t.id desc");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("{condition}: {e}"))
}

/// Every page of `filter`, three tasks a page: the first one and all the ids in order.
async fn pages(pool: &PgPool, filter: &ListFilter) -> (Vec<Uuid>, Vec<Uuid>) {
    let mut filter = ListFilter {
        limit: 3,
        scan_limit: SCAN,
        ..filter.clone()
    };
    let mut first = None;
    let mut all = Vec::new();
    for _ in 0..200 {
        let page = list(pool, &filter).await.unwrap();
        let ids: Vec<Uuid> = page.rows.iter().map(|r| r.id).collect();
        first.get_or_insert(ids.clone());
        all.extend(ids);
        match page.next_cursor {
            Some(cursor) => filter.after = Some(cursor),
            None => return (first.unwrap(), all),
        }
    }
    panic!("{filter:?} does not end in 200 pages");
}

/// A task inserted with plain SQL in `state` (waiting, running, succeeded or cancelled).
async fn task(pool: &PgPool, owner: &str, queue: &str, state: &str, command: &str) -> Uuid {
    let (cols, vals) = match state {
        "waiting" => ("", String::new()),
        "running" => (
            ", attempt, worker_id, started_at, lease_expires_at",
            ", 1, '00000000-0000-4000-8000-000000000001', now(), now() + interval '30 seconds'"
                .to_owned(),
        ),
        "cancelled" => (", finished_at", ", now()".to_owned()),
        _ => (
            ", attempt, started_at, finished_at",
            ", 1, now() - interval '1 second', now()".to_owned(),
        ),
    };
    insert(
        pool,
        &format!(
            "(owner, queue, state, command{cols}) values ('{owner}', '{queue}', '{state}', \
             string_to_array('{command}', ' '){vals})"
        ),
    )
    .await
}

/// The older tasks each case finds, then the mid-point of their submission times, then
/// `NEWER` cancelled tasks of another owner and queue that match no case.
struct Data {
    workflow: Uuid,
    schedule: Uuid,
    mid: DateTime<Utc>,
}

async fn data(api: &Api) -> Data {
    let pool = &api.db.pool;
    for i in 0..4 {
        task(
            pool,
            "carol",
            "rare",
            "succeeded",
            &format!("render report-{i}"),
        )
        .await;
        task(pool, "alice", "q", "waiting", "sleep 1").await;
        task(pool, "alice", "q", "running", "sleep 2").await;
        task(pool, "alice", "q", "succeeded", &format!("send needle-{i}")).await;
    }
    task(pool, "alice", "q", "succeeded", "price 50%_off").await;
    task(pool, "alice", "q", "succeeded", "price 50x_off").await;
    task(pool, "alice", "q", "succeeded", "price 50%_off again").await;
    task(pool, "alice", "q", "succeeded", "price 50%_off thrice").await;
    let (status, workflow) = api
        .post(
            "/api/v1/workflows",
            &api.alice,
            json!({"tasks": [
                {"name": "a", "command": ["true"]},
                {"name": "b", "command": ["true"], "depends_on": ["a"]},
                {"name": "c", "command": ["true"], "depends_on": ["a"]},
                {"name": "d", "command": ["true"], "depends_on": ["b", "c"]},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{workflow}");
    let workflow: Uuid = workflow["id"].as_str().unwrap().parse().unwrap();
    let (status, schedule) = api
        .post(
            "/api/v1/schedules",
            &api.alice,
            json!({"name": "nightly", "cron": "0 3 * * *", "task": {"command": ["nightly"]}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{schedule}");
    let schedule: Uuid = schedule["id"].as_str().unwrap().parse().unwrap();
    for _ in 0..4 {
        let (status, body) = api
            .post(
                &format!("/api/v1/schedules/{schedule}/run"),
                &api.alice,
                json!({}),
            )
            .await;
        assert!(status.is_success(), "{status} {body}");
    }
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let mid = Utc::now();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for _ in 0..3 {
        task(pool, "carol", "rare", "succeeded", "render late").await;
    }
    sqlx::query(
        "insert into sked.tasks (owner, queue, state, command, finished_at)
         select 'bob', 'common', 'cancelled', array['echo', 'hay'], now()
           from generate_series(1, $1)",
    )
    .bind(NEWER)
    .execute(pool)
    .await
    .unwrap();
    assert!(
        matches!(
            sked_db::listing::text_index_enable(pool).await.unwrap(),
            sked_db::listing::TextIndex::Ready { .. }
        ),
        "the trigram index is made and ready"
    );
    Data {
        workflow,
        schedule,
        mid,
    }
}

/// Each case: a filter and the SQL condition it means.
fn cases(d: &Data) -> Vec<(ListFilter, String)> {
    let f = ListFilter::default;
    let search = "sked.task_search_text(t.artifact_url, t.command, t.args, t.name)";
    let schedule_runs = format!(
        "(t.id in (select task_id from sked.schedule_runs where schedule_id = '{0}') \
         or t.workflow_id in (select workflow_id from sked.schedule_runs \
         where schedule_id = '{0}'))",
        d.schedule
    );
    vec![
        (
            ListFilter {
                queue: Some("rare".into()),
                ..f()
            },
            "t.queue = 'rare'".into(),
        ),
        (
            ListFilter {
                states: vec![TaskState::Waiting],
                ..f()
            },
            "t.state = 'waiting'".into(),
        ),
        (
            ListFilter {
                states: vec![TaskState::Succeeded],
                ..f()
            },
            "t.state = 'succeeded'".into(),
        ),
        (
            ListFilter {
                states: vec![
                    TaskState::Blocked,
                    TaskState::Waiting,
                    TaskState::Running,
                    TaskState::Retry,
                ],
                ..f()
            },
            "t.state in ('blocked', 'waiting', 'running', 'retry')".into(),
        ),
        (
            ListFilter {
                owner: Some("carol".into()),
                ..f()
            },
            "t.owner = 'carol'".into(),
        ),
        (
            ListFilter {
                workflow: Some(d.workflow),
                ..f()
            },
            format!("t.workflow_id = '{}'", d.workflow),
        ),
        (
            ListFilter {
                schedule: Some(d.schedule),
                ..f()
            },
            schedule_runs,
        ),
        (
            ListFilter {
                text: Some("NEEDLE".into()),
                ..f()
            },
            format!("{search} ilike '%needle%'"),
        ),
        (
            ListFilter {
                text: Some("50%_off".into()),
                ..f()
            },
            format!("{search} like '%50\\%\\_off%'"),
        ),
        (
            ListFilter {
                created_before: Some(d.mid),
                states: vec![TaskState::Succeeded],
                ..f()
            },
            format!(
                "t.state = 'succeeded' and t.created_at < '{}'",
                d.mid.to_rfc3339()
            ),
        ),
        (
            ListFilter {
                created_after: Some(d.mid),
                queue: Some("rare".into()),
                ..f()
            },
            format!(
                "t.queue = 'rare' and t.created_at >= '{}'",
                d.mid.to_rfc3339()
            ),
        ),
        (
            ListFilter {
                queue: Some("q".into()),
                states: vec![TaskState::Running, TaskState::Waiting],
                owner: Some("alice".into()),
                ..f()
            },
            "t.queue = 'q' and t.state in ('running', 'waiting') and t.owner = 'alice'".into(),
        ),
        (
            ListFilter {
                text: Some("needle".into()),
                owner: Some("alice".into()),
                states: vec![TaskState::Succeeded],
                ..f()
            },
            format!("{search} ilike '%needle%' and t.owner = 'alice' and t.state = 'succeeded'"),
        ),
    ]
}

#[tokio::test]
async fn every_filter_fills_its_first_page_behind_newer_tasks_that_do_not_match() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let d = data(&api).await;
    for (filter, condition) in cases(&d) {
        let expected = expected(pool, &condition).await;
        assert!(
            expected.len() >= 3,
            "the data set gives {condition} a full first page: {expected:?}"
        );
        let (first, all) = pages(pool, &filter).await;
        assert_eq!(
            first,
            expected[..3],
            "the first page of {filter:?} is full although the newest {NEWER} tasks do not \
             match and a walk reads {SCAN} rows at most"
        );
        assert_eq!(all, expected, "every page of {filter:?}, in id order");
    }
}

#[tokio::test]
async fn counts_are_exact_below_the_limit_and_say_more_than_past_it() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let d = data(&api).await;
    for (filter, condition) in cases(&d) {
        let n = expected(pool, &condition).await.len() as i64;
        assert_eq!(
            count(pool, &filter).await.unwrap(),
            Count {
                count: n,
                exact: true
            },
            "{condition}"
        );
    }
    sqlx::query(
        "insert into sked.tasks (owner, queue, command)
         select 'dave', 'big', array['echo', 'x' || g] from generate_series(1, $1) g",
    )
    .bind(COUNT_LIMIT as i32 + 1)
    .execute(pool)
    .await
    .unwrap();
    let big = ListFilter {
        queue: Some("big".into()),
        ..ListFilter::default()
    };
    assert_eq!(
        count(pool, &big).await.unwrap(),
        Count {
            count: COUNT_LIMIT,
            exact: false
        },
        "more than the limit"
    );
    let one_less = ListFilter {
        text: Some("x1".into()),
        queue: Some("big".into()),
        ..ListFilter::default()
    };
    let n = expected(
        pool,
        "t.queue = 'big' and array_to_string(t.command, ' ') like '%x1%'",
    )
    .await
    .len() as i64;
    let counted = count(pool, &one_less).await.unwrap();
    assert!(
        counted.count <= n && counted.count > 0 && !counted.exact,
        "a text too short for trigrams is counted on a walk of the scan limit's rows, which \
         does not reach the oldest of the {} tasks: at least {counted:?} of {n}",
        COUNT_LIMIT + 1
    );
    // The cursor and page size do not change a count.
    let paged = ListFilter {
        after: Some(Uuid::nil()),
        limit: 1,
        ..big
    };
    assert_eq!(count(pool, &paged).await.unwrap().count, COUNT_LIMIT);
}

#[tokio::test]
async fn without_its_trigram_index_the_text_filter_walks_and_finds_the_same_tasks() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let d = data(&api).await;
    sked_db::listing::text_index_disable(pool).await.unwrap();
    assert_eq!(
        sked_db::listing::text_index(pool).await.unwrap(),
        sked_db::listing::TextIndex::Missing
    );
    for (filter, condition) in cases(&d) {
        if filter.text.is_none() {
            continue;
        }
        let (_, all) = pages(pool, &filter).await;
        assert_eq!(all, expected(pool, &condition).await, "{filter:?}");
        let counted = count(pool, &filter).await.unwrap();
        assert!(counted.count > 0, "{filter:?}: {counted:?}");
    }
}

#[tokio::test]
async fn rest_takes_the_new_filters_and_counts_what_the_token_may_see() {
    let api = Api::new().await;
    let d = data(&api).await;
    let ids = |page: &Value| -> Vec<String> {
        page["tasks"]
            .as_array()
            .unwrap_or_else(|| panic!("{page}"))
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (status, page) = api
        .get(
            &format!("/api/v1/tasks?workflow={}&limit=10", d.workflow),
            &api.alice,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(ids(&page).len(), 4, "the workflow's four tasks");
    let (_, page) = api
        .get(
            &format!("/api/v1/tasks?schedule={}&limit=10", d.schedule),
            &api.alice,
        )
        .await;
    assert_eq!(ids(&page).len(), 4, "the schedule's four runs: {page}");
    let mid = d.mid.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let (_, page) = api
        .get(
            &format!("/api/v1/tasks?queue=rare&created_after={mid}&limit=10"),
            &api.admin,
        )
        .await;
    assert_eq!(ids(&page).len(), 3, "the three late renders: {page}");

    // Counts: a user token counts its own tasks; an admin all of them.
    let (status, counted) = api.get("/api/v1/tasks/count?queue=rare", &api.admin).await;
    assert_eq!(status, StatusCode::OK, "{counted}");
    assert_eq!(counted, json!({"count": 7, "exact": true}));
    let (_, counted) = api.get("/api/v1/tasks/count?queue=rare", &api.alice).await;
    assert_eq!(counted, json!({"count": 0, "exact": true}), "carol's tasks");
    let (_, counted) = api.get("/api/v1/tasks/count?q=needle", &api.alice).await;
    assert_eq!(counted, json!({"count": 4, "exact": true}));
    let (status, body) = api.get("/api/v1/tasks/count?owner=carol", &api.alice).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    for bad in [
        "/api/v1/tasks/count?after=00000000-0000-0000-0000-000000000000",
        "/api/v1/tasks/count?limit=5",
        "/api/v1/tasks/count?view=summary",
        "/api/v1/tasks/count?state=sleeping",
        "/api/v1/tasks?created_after=yesterday",
        "/api/v1/tasks?workflow=not-a-uuid",
    ] {
        let (status, body) = api.get(bad, &api.admin).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_error(&body, "invalid_request");
    }
}

#[tokio::test]
async fn sked_search_index_makes_shows_and_drops_the_trigram_index() {
    let db = sked_db::testing::TestDb::new().await;
    let run = |args: &'static [&'static str]| {
        let url = db.url.clone();
        async move {
            let out = crate::cli::output(
                crate::cli::sked()
                    .args(["search-index"])
                    .args(args)
                    .env("DATABASE_URL", url),
            )
            .await;
            assert!(out.status.success(), "sked search-index {args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap()
        }
    };
    assert_eq!(
        run(&["status"]).await,
        "search index: off (text searches walk the tasks)\n"
    );
    let on = run(&["enable"]).await;
    assert!(on.starts_with("search index: on ("), "{on}");
    assert!(
        matches!(
            sked_db::listing::text_index(&db.pool).await.unwrap(),
            sked_db::listing::TextIndex::Ready { .. }
        ),
        "the index is there"
    );
    assert_eq!(run(&["enable"]).await, on, "enabling twice changes nothing");
    // A build that failed leaves an invalid index: enable makes it again.
    sqlx::query(
        "update pg_index set indisvalid = false where indexrelid = 'sked.tasks_text'::regclass",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    assert!(
        run(&["status"])
            .await
            .starts_with("search index: not ready")
    );
    assert!(run(&["enable"]).await.starts_with("search index: on ("));
    assert_eq!(
        run(&["disable"]).await,
        "search index: off (text searches walk the tasks)\n"
    );
    let out = crate::cli::output(
        crate::cli::sked()
            .args(["search-index", "enable"])
            .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/nothing"),
    )
    .await;
    assert!(!out.status.success(), "no database, no index: {out:?}");
}

#[tokio::test]
async fn sked_list_takes_the_new_filters_and_counts() {
    let api = crate::cli::Api::start().await;
    let pool = &api.db.pool;
    for i in 0..3 {
        task(pool, "ops", "mail", "succeeded", &format!("send batch-{i}")).await;
    }
    task(pool, "ops", "mail", "waiting", "send later").await;
    task(pool, "ops", "other", "succeeded", "send elsewhere").await;
    sqlx::query(
        "update sked.tasks set finished_at = now() - interval '3 hours'
          where array_to_string(command, ' ') = 'send batch-0'",
    )
    .execute(pool)
    .await
    .unwrap();

    assert_eq!(api.ok(&["list", "--queue", "mail", "--count"]).await, "4\n");
    assert_eq!(
        api.ok(&[
            "list",
            "--queue",
            "mail",
            "--finished-after",
            "1h",
            "--count"
        ])
        .await,
        "2\n",
        "a duration ago; batch-0 finished three hours ago"
    );
    let listed = api
        .ok(&["list", "--queue", "mail", "--finished-before", "2h"])
        .await;
    assert!(
        listed.contains("batch-0") && !listed.contains("batch-1"),
        "{listed}"
    );
    let out = crate::cli::output(&mut api.sked(&["list", "--created-after", "tomorrow"])).await;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--created-after must be an RFC 3339 time"),
        "{stderr}"
    );
}

#[tokio::test]
async fn past_the_queues_walked_one_by_one_waiting_and_succeeded_tasks_are_still_all_listed() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let queues = sked_db::listing::MAX_QUEUE_WALKS as i32 + 1;
    sqlx::query(
        "insert into sked.tasks (owner, queue, command)
         select 'ops', 'q' || g, array['echo', g::text] from generate_series(1, $1) g",
    )
    .bind(queues)
    .execute(pool)
    .await
    .unwrap();
    for i in 0..4 {
        task(pool, "ops", "q1", "succeeded", &format!("done {i}")).await;
    }
    for (state, condition) in [
        (TaskState::Waiting, "t.state = 'waiting'"),
        (TaskState::Succeeded, "t.state = 'succeeded'"),
    ] {
        let filter = ListFilter {
            states: vec![state],
            ..ListFilter::default()
        };
        let (_, all) = pages(pool, &filter).await;
        assert_eq!(all, expected(pool, condition).await, "{state:?}");
        let counted = count(pool, &filter).await.unwrap();
        assert_eq!(counted.count, all.len() as i64, "{state:?}: {counted:?}");
    }
}
