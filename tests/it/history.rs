//! Tests of the rollups of finishes and the history read from them (`sql/finishes.sql`,
//! `GET /api/v1/history`): every finish counted once whoever folds and however many fold at
//! once, nothing left by a finish that rolled back, pruning with time as an input, the
//! history's counts and percentiles, and what user and admin tokens see.

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sked_db::testing::TestDb;
use sked_types::HistoryRange;
use sqlx::PgPool;

use crate::api::{Api, assert_error};

/// Inserts `n` finished tasks of `owner` in `queue`, in `state`, finished at `finished`
/// (an SQL expression of `i`, 1 to n), having run `run` and started `late` after their due
/// time (SQL intervals).
async fn finished(
    pool: &PgPool,
    owner: &str,
    queue: &str,
    state: &str,
    n: i32,
    finished: &str,
    [run, late]: [&str; 2],
) {
    // The SQL expressions are the tests' own.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "insert into sked.tasks (owner, queue, state, command, attempt, started_at, finished_at,
                                 next_run_at)
         select $1, $2, $3, array['x'], 1, f - {run}, f, f - {run} - {late}
           from generate_series(1, $4) i, lateral (select {finished} as f) x"
    )))
    .bind(owner)
    .bind(queue)
    .bind(state)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

async fn deltas(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sked.finish_deltas")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The rollups' counts per grain, start, queue, owner and state, next to the task table's.
async fn rollups_and_tasks(
    pool: &PgPool,
) -> (
    Vec<(String, DateTime<Utc>, String, String, String, i64)>,
    Vec<(String, DateTime<Utc>, String, String, String, i64)>,
) {
    let rollups = sqlx::query_as(
        "select grain, start, queue, owner, state, tasks from sked.finish_rollups
          where tasks <> 0 and queue <> '' and owner <> '' order by 1, 2, 3, 4, 5",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let tasks = sqlx::query_as(
        "select g.grain,
                case g.grain when '5min'
                  then date_bin('5 minutes', t.finished_at, timestamptz '2000-01-01 00:00:00+00')
                  else date_trunc(g.grain, t.finished_at, 'UTC') end,
                t.queue, t.owner, t.state,
                count(*)
           from sked.tasks t cross join (values ('minute'), ('5min'), ('hour')) g(grain)
          where t.finished_at is not null
          group by 1, 2, 3, 4, 5 order by 1, 2, 3, 4, 5",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    (rollups, tasks)
}

#[tokio::test]
async fn two_folds_at_once_count_every_finish_once() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    // 40 finishing statements of 50 tasks each, over 40 minutes and two queues. Each spans
    // the 50 seconds before 25 s past a minute, so it touches two minutes whatever the
    // clock says (from `now()`, one in six runs fell within one minute).
    for s in 0..40 {
        finished(
            pool,
            if s % 4 == 0 { "bob" } else { "alice" },
            if s % 2 == 0 { "q1" } else { "q2" },
            if s % 5 == 0 { "failed" } else { "succeeded" },
            50,
            &format!(
                "date_trunc('minute', now()) - interval '35 seconds' - interval '{s} minutes' \
                 - i * interval '1 second'"
            ),
            ["interval '1 second'", "interval '0'"],
        )
        .await;
    }
    assert_eq!(
        deltas(pool).await,
        40 * 2,
        "one delta per statement and minute touched"
    );
    let folder = |pool: PgPool| async move {
        let mut folded = 0;
        loop {
            folded += sked_db::history::fold(&pool, 3).await.unwrap();
            if deltas(&pool).await == 0 {
                return folded;
            }
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(folder(pool.clone())),
        tokio::spawn(folder(pool.clone()))
    );
    assert_eq!(
        a.unwrap() + b.unwrap(),
        80,
        "the two folds together fold every delta exactly once"
    );
    let (rollups, tasks) = rollups_and_tasks(pool).await;
    assert_eq!(
        rollups, tasks,
        "the rollups count each finished task once, in its minute, 5 minutes and hour"
    );
    let levels_disagree: i64 = sqlx::query_scalar(
        "select count(*) from (
           select 1 from (
             select grain, start, state, queue = '' as every_queue, owner = '' as every_owner,
                    sum(tasks) as tasks
               from sked.finish_rollups group by 1, 2, 3, 4, 5) l
            group by grain, start, state having count(distinct tasks) > 1
               or count(*) <> 4) d",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        levels_disagree, 0,
        "each level of the rollups (every queue, every owner, both, neither) sums to the same"
    );
}

#[tokio::test]
async fn a_finish_that_rolls_back_leaves_no_delta() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let running = crate::support::insert(
        pool,
        "(state, command, attempt, worker_id, started_at, lease_expires_at)
         values ('running', array['x'], 1, '00000000-0000-4000-8000-000000000001', now(),
                 now() + interval '1 minute')",
    )
    .await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("update sked.tasks set state = 'succeeded', finished_at = now(), lease_expires_at = null where id = $1")
        .bind(running)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "insert into sked.tasks (state, command, attempt, started_at, finished_at)
         values ('failed', array['x'], 1, now(), now())",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let seen: i64 = sqlx::query_scalar("select count(*) from sked.finish_deltas")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(seen, 2, "the transaction sees the deltas of its finishes");
    tx.rollback().await.unwrap();
    assert_eq!(
        deltas(pool).await,
        0,
        "a rolled-back finish leaves no delta"
    );
    assert_eq!(sked_db::history::fold(pool, 100).await.unwrap(), 0);
    let h = sked_db::history::history(pool, None, None, HistoryRange::Day, None)
        .await
        .unwrap();
    assert!(
        h.points.iter().all(|p| p.finished.total() == 0),
        "nothing finished"
    );
}

#[tokio::test]
async fn rollups_are_pruned_after_their_keeping_with_time_as_input() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let now: DateTime<Utc> = "2030-01-10T12:00:00Z".parse().unwrap();
    for at in [
        "2030-01-10T11:00:00Z",
        "2030-01-07T12:00:00Z",
        "2030-01-01T12:00:00Z",
    ] {
        finished(
            pool,
            "alice",
            "q",
            "succeeded",
            1,
            &format!("'{at}'::timestamptz"),
            ["interval '1 second'", "interval '0'"],
        )
        .await;
    }
    sked_db::history::fold(pool, 100).await.unwrap();
    let rows = |pool: PgPool| async move {
        sqlx::query_as::<_, (String, DateTime<Utc>)>(
            "select distinct grain, start from sked.finish_rollups order by 1, 2",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    assert_eq!(rows(pool.clone()).await.len(), 9);
    let count = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("select count(*) from sked.finish_rollups")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(
        count(pool.clone()).await,
        36,
        "a minute, a 5-minute and an hour row per finish at each of four levels"
    );
    let early: DateTime<Utc> = "2030-01-02T00:00:00Z".parse().unwrap();
    assert_eq!(
        sked_db::history::prune(pool, Some(early)).await.unwrap(),
        0,
        "nothing is pruned before its time"
    );
    let pruned = sked_db::history::prune(pool, Some(now)).await.unwrap();
    assert_eq!(
        pruned, 20,
        "minute and 5-minute rows older than two days, hour rows older than eight, at every level"
    );
    let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
    assert_eq!(
        rows(pool.clone()).await,
        vec![
            ("5min".to_owned(), at("2030-01-10T11:00:00Z")),
            ("hour".to_owned(), at("2030-01-07T12:00:00Z")),
            ("hour".to_owned(), at("2030-01-10T11:00:00Z")),
            ("minute".to_owned(), at("2030-01-10T11:00:00Z")),
        ],
        "the 7-day view keeps its hours, the 24-hour view its 5 minutes, the overview its minutes"
    );
}

/// Asserts that `got` is within a bucket (a factor of √2) of `expected` seconds.
fn assert_near(got: Option<f64>, expected: f64, what: &str) {
    let got = got.unwrap_or_else(|| panic!("{what} is known"));
    assert!(
        got >= expected / 1.42 && got <= expected * 1.42,
        "{what} is about {expected} s (within a histogram bucket), got {got}"
    );
}

#[tokio::test]
async fn the_history_counts_steps_exactly_and_estimates_percentiles() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let now: DateTime<Utc> = "2030-01-01T12:32:10Z".parse().unwrap();
    // alice, q1: 90 tasks that ran 1 s and 10 that ran 100 s in 12:31, each started 3 s late;
    // 5 failures at 11:00; bob, q2: 7 at 12:00.
    let in_1231 = "'2030-01-01T12:31:00Z'::timestamptz + i * interval '0.5 seconds'";
    finished(
        pool,
        "alice",
        "q1",
        "succeeded",
        90,
        in_1231,
        ["interval '1 second'", "interval '3 seconds'"],
    )
    .await;
    finished(
        pool,
        "alice",
        "q1",
        "succeeded",
        10,
        in_1231,
        ["interval '100 seconds'", "interval '3 seconds'"],
    )
    .await;
    finished(
        pool,
        "alice",
        "q1",
        "failed",
        5,
        "'2030-01-01T11:00:00Z'::timestamptz",
        ["interval '1 minute'", "interval '0'"],
    )
    .await;
    finished(
        pool,
        "bob",
        "q2",
        "succeeded",
        7,
        "'2030-01-01T12:00:00Z'::timestamptz",
        ["interval '1 second'", "interval '0'"],
    )
    .await;
    // Half folded: the history adds what is not.
    sked_db::history::fold(pool, 2).await.unwrap();

    let h = sked_db::history::history(pool, Some("alice"), None, HistoryRange::Day, Some(now))
        .await
        .unwrap();
    assert_eq!(h.points.len(), 288, "24 hours in steps of 5 minutes");
    assert_eq!(h.step_secs, 300);
    let last = h.points.last().unwrap();
    assert_eq!(
        last.start,
        "2030-01-01T12:30:00Z".parse::<DateTime<Utc>>().unwrap(),
        "the last step holds `at`"
    );
    assert_eq!(last.finished.succeeded, 100);
    assert_near(last.duration.p50, 1.0, "the median duration");
    assert_near(last.duration.p99, 100.0, "the 99th percentile of durations");
    assert_near(last.lateness.p50, 3.0, "the median lateness");
    let at_11 = h
        .points
        .iter()
        .find(|p| p.start == "2030-01-01T11:00:00Z".parse::<DateTime<Utc>>().unwrap())
        .unwrap();
    assert_eq!(at_11.finished.failed, 5);
    assert_near(at_11.duration.p90, 60.0, "the failures' durations");
    let total: i64 = h.points.iter().map(|p| p.finished.total()).sum();
    assert_eq!(total, 105, "alice's finishes only");
    assert_eq!(h.queues, ["q1"]);

    let week = sked_db::history::history(pool, None, Some("q2"), HistoryRange::Week, Some(now))
        .await
        .unwrap();
    assert_eq!(week.points.len(), 168, "7 days in steps of an hour");
    assert_eq!(
        week.points.last().unwrap().start,
        "2030-01-01T12:00:00Z".parse::<DateTime<Utc>>().unwrap()
    );
    let total: i64 = week.points.iter().map(|p| p.finished.total()).sum();
    assert_eq!(total, 7, "queue q2 only");
    assert_eq!(week.points.last().unwrap().finished.succeeded, 7);
    assert_eq!(
        week.queues,
        ["q1", "q2"],
        "the filter's choices are every queue's"
    );
}

fn total(history: &Value) -> i64 {
    history["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["finished"]
                .as_object()
                .unwrap()
                .values()
                .map(|n| n.as_i64().unwrap())
                .sum::<i64>()
        })
        .sum()
}

#[tokio::test]
async fn the_history_api_shows_a_user_its_own_finishes() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let recent = "now() - interval '10 minutes'";
    finished(
        pool,
        "alice",
        "q1",
        "succeeded",
        3,
        recent,
        ["interval '1 second'", "interval '0'"],
    )
    .await;
    finished(
        pool,
        "bob",
        "q2",
        "failed",
        4,
        recent,
        ["interval '1 second'", "interval '0'"],
    )
    .await;

    let (status, mine) = api.get("/api/v1/history", &api.alice).await;
    assert_eq!(status, StatusCode::OK, "{mine}");
    assert_eq!(mine["range"], "24h", "the default range is a day");
    assert_eq!(mine["owner"], "alice");
    assert_eq!(total(&mine), 3, "a user token counts its own tasks: {mine}");
    let (status, all) = api.get("/api/v1/history?range=7d", &api.admin).await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(all["points"].as_array().unwrap().len(), 168);
    assert_eq!(total(&all), 7, "an admin counts every owner's tasks");
    let (_, q2) = api.get("/api/v1/history?queue=q2", &api.admin).await;
    assert_eq!(total(&q2), 4, "the queue filter");

    let (status, body) = api.get("/api/v1/history?owner=alice", &api.bob).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_error(&body, "forbidden");
    let (status, body) = api.get("/api/v1/history?range=1h", &api.admin).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_error(&body, "invalid_request");
    let (status, _) = api.get("/api/v1/history", "").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the history needs a token"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_page_charts_finishes_and_percentiles_by_range_and_queue() {
    use crate::browser::Browser;
    use crate::dashboard::{Server, assert_quiet_console, open_signed_in, token_for};
    use sked_db::token::Role;

    let db = TestDb::new().await;
    let pool = &db.pool;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let spread = "now() - interval '20 minutes' - i * interval '97 seconds'";
    finished(
        pool,
        "alice",
        "q1",
        "succeeded",
        30,
        spread,
        ["interval '2 seconds'", "interval '1 second'"],
    )
    .await;
    finished(
        pool,
        "alice",
        "q2",
        "failed",
        5,
        "now() - interval '3 hours'",
        ["interval '10 seconds'", "interval '0'"],
    )
    .await;
    finished(
        pool,
        "bob",
        "q1",
        "succeeded",
        100,
        spread,
        ["interval '1 second'", "interval '0'"],
    )
    .await;
    sked_db::history::fold(pool, 2).await.unwrap();

    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/history", &alice).await;
    let bars =
        |chart: &str| format!("document.querySelectorAll('[data-chart={chart}] g.bar').length");
    b.wait("[data-chart=finished-per-step]").await;
    assert_eq!(
        b.js(&bars("finished-per-step")).await,
        288,
        "24 hours of 5-minute steps"
    );
    let summary =
        "document.querySelector('[data-chart=finished-per-step]').getAttribute('aria-label')";
    assert_eq!(
        b.js(summary).await,
        "35 tasks finished in the last 24 hours, 5 of them failed",
        "alice's finishes only"
    );
    assert!(
        b.js("document.querySelector('[data-chart=duration] path.line-p99').getAttribute('d')")
            .await
            .as_str()
            .is_some_and(|d| d.starts_with('M')),
        "the duration chart draws its 99th percentile"
    );
    assert_eq!(b.js(&bars("lateness")).await, 288);
    b.screenshot("history-24h").await;

    b.wait("a[data-range='7d']").await.click().await.unwrap();
    b.wait_js(
        "the week shows",
        &format!("{} == 168", bars("finished-per-step")),
    )
    .await;
    b.wait_js(
        "the queue filter offers alice's queues",
        "document.querySelectorAll('select[name=queue] option').length == 3",
    )
    .await;
    b.js(
        "(() => { const s = document.querySelector('select[name=queue]'); s.value = 'q2'; \
         s.dispatchEvent(new Event('change')); return true })()",
    )
    .await;
    b.wait_js(
        "the queue filter applies",
        &format!("{summary} == '5 tasks finished in the last 7 days, 5 of them failed'"),
    )
    .await;
    assert!(
        b.js("location.search")
            .await
            .as_str()
            .is_some_and(|s| s.contains("range=7d") && s.contains("queue=q2")),
        "the range and the queue are in the URL"
    );
    b.screenshot("history-7d-queue").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
}
