//! Rows an operator or a race can leave behind: a task requeued with no attempt left never
//! stops a queue, a cron tick fires at most once whatever re-arms its schedule, and a re-run
//! beside a parent's finish never leaves a child blocked, and a row that holds a JSON number
//! no double holds fails alone. Time is an input where the SQL
//! takes one; the race runs on two real connections.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{config, insert, start_worker, wait_for};

/// The rule that keeps an unfinished task runnable.
const ATTEMPT_LEFT: &str = "tasks_waiting_task_must_have_an_attempt_left";

/// A command task that failed at its last attempt, as a worker leaves it.
async fn exhausted(pool: &PgPool, queue: &str) -> Uuid {
    insert(
        pool,
        &format!(
            "(command, queue, priority, state, attempt, max_attempts, started_at, finished_at, error)
             values (array['true'], '{queue}', 100, 'failed', 1, 1, now(), now(), 'exit code 1')"
        ),
    )
    .await
}

#[tokio::test]
async fn an_operator_requeue_of_an_exhausted_task_is_refused_with_the_rule() {
    let db = TestDb::new().await;
    let id = exhausted(&db.pool, "default").await;

    let err =
        sqlx::query("update sked.tasks set state = 'waiting', finished_at = null where id = $1")
            .bind(id)
            .execute(&db.pool)
            .await
            .expect_err("requeueing a task with no attempt left must be refused");
    let db_err = err.as_database_error().expect("a database error");
    assert_eq!(
        db_err.constraint(),
        Some(ATTEMPT_LEFT),
        "the refusal names the rule: {db_err}"
    );
    assert!(
        db_err.message().contains("attempt"),
        "the message says what is wrong: {db_err}"
    );
    let (state, attempt, max): (String, i32, i32) =
        sqlx::query_as("select state, attempt, max_attempts from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (state.as_str(), attempt, max),
        ("failed", 1, 1),
        "a refused requeue changes nothing"
    );

    // A plain INSERT of a claimable row with no attempt left is refused the same way.
    let err = sqlx::query(
        "insert into sked.tasks (command, state, attempt, max_attempts, started_at)
         values (array['true'], 'retry', 2, 2, now())",
    )
    .execute(&db.pool)
    .await
    .expect_err("inserting a retrying task with no attempt left must be refused");
    assert_eq!(
        err.as_database_error().and_then(|e| e.constraint()),
        Some(ATTEMPT_LEFT),
        "the refusal names the rule: {err}"
    );

    // The way to run it again gives it one more attempt.
    let state: String = sqlx::query_scalar("select sked.task_retry($1)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .expect("retrying a failed task");
    assert_eq!(state, "waiting", "sked.task_retry requeues a failed task");
}

/// Drops the rule (a database that holds rows from before it), then requeues `id` as an
/// operator would.
async fn requeue_without_the_rule(pool: &PgPool, id: Uuid) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "alter table sked.tasks drop constraint if exists {ATTEMPT_LEFT}"
    )))
    .execute(pool)
    .await
    .expect("dropping the rule");
    sqlx::query("update sked.tasks set state = 'waiting', finished_at = null where id = $1")
        .bind(id)
        .execute(pool)
        .await
        .expect("requeueing without the rule");
}

#[tokio::test]
async fn a_row_without_an_attempt_left_is_passed_over_by_every_claim() {
    let db = TestDb::new().await;
    let bad = exhausted(&db.pool, "a").await;
    requeue_without_the_rule(&db.pool, bad).await;
    let good_a = insert(&db.pool, "(command, queue) values (array['true'], 'a')").await;
    let good_b = insert(&db.pool, "(command, queue) values (array['true'], 'b')").await;

    let claim = |queues: &'static str| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>(
                "select id from sked.tasks_claim(gen_random_uuid(), $1::text[], '{}', 10, '30 s')",
            )
            .bind(queues)
            .fetch_all(&pool)
            .await
            .unwrap_or_else(|e| panic!("a claim of {queues} must not fail for one row: {e}"))
        }
    };
    // One queue, then two queues, then a queue with controls: each shape of the claim.
    assert_eq!(
        claim("{a}").await,
        vec![good_a],
        "the claim of one queue skips the row"
    );
    sqlx::query("update sked.tasks set state = 'waiting', attempt = 0, worker_id = null, lease_expires_at = null, started_at = null where id = $1")
        .bind(good_a)
        .execute(&db.pool)
        .await
        .unwrap();
    let mut both = claim("{a,b}").await;
    both.sort();
    let mut want = vec![good_a, good_b];
    want.sort();
    assert_eq!(both, want, "the claim of several queues skips the row");
    sqlx::query("select sked.queue_set_limits('a', 5, null, null)")
        .execute(&db.pool)
        .await
        .expect("limiting queue a");
    let c = insert(&db.pool, "(command, queue) values (array['true'], 'a')").await;
    assert_eq!(
        claim("{a}").await,
        vec![c],
        "the claim of a limited queue skips the row"
    );

    // The row stays where it was, and says why it waits.
    assert_eq!(crate::support::state(&db.pool, bad).await, "waiting");
    let reasons: Vec<(String, String)> =
        sqlx::query_as("select code, message from sked.task_waiting_reasons($1)")
            .bind(bad)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(
        reasons.iter().any(|(code, _)| code == "no_attempt_left"),
        "a task no claim takes says so: {reasons:?}"
    );
}

#[tokio::test]
async fn a_requeued_exhausted_task_stops_no_queue() {
    let db = TestDb::new().await;
    let bad = exhausted(&db.pool, "a").await;
    requeue_without_the_rule(&db.pool, bad).await;
    let mut others = Vec::new();
    for queue in ["a", "b"] {
        for _ in 0..4 {
            others.push(
                insert(
                    &db.pool,
                    &format!("(command, queue) values (array['true'], '{queue}')"),
                )
                .await,
            );
        }
    }
    let worker = start_worker(&db, config(&["a", "b"]));
    for id in &others {
        wait_for(&db.pool, *id, &["succeeded"], Duration::from_secs(5)).await;
    }
    worker.shutdown().await;
    assert_eq!(
        crate::support::state(&db.pool, bad).await,
        "waiting",
        "the row no claim can take is left as it is"
    );
}

// ---------------------------------------------------------------------------------------------
// Cron ticks
// ---------------------------------------------------------------------------------------------

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .with_timezone(&Utc)
}

async fn hourly(pool: &PgPool, overlap: &str, now: &str) -> Uuid {
    sqlx::query_scalar(
        "select sked.schedule_create(name => $1, cron => '0 * * * *',
                                     task => '{\"command\": [\"true\"]}',
                                     overlap_policy => $1, p_now => $2)",
    )
    .bind(overlap)
    .bind(at(now))
    .fetch_one(pool)
    .await
    .expect("creating a schedule")
}

/// Fires as the firing duty of the background upkeep does: `horizon` ahead of `now`.
async fn fire(pool: &PgPool, now: DateTime<Utc>, horizon: &str) -> i32 {
    sqlx::query_scalar("select sked.schedules_fire($1::interval, p_now => $2)")
        .bind(horizon)
        .bind(now)
        .fetch_one(pool)
        .await
        .expect("firing")
}

/// Every task the test's one schedule inserted, recorded in its runs or not: the database
/// holds no other task.
async fn occurrences(pool: &PgPool) -> Vec<(String, DateTime<Utc>)> {
    sqlx::query_as("select state, next_run_at from sked.tasks order by id")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn fired_runs(pool: &PgPool, id: Uuid) -> i64 {
    sqlx::query_scalar(
        "select count(*) from sked.schedule_runs where schedule_id = $1 and outcome = 'fired'",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_cron_tick_fires_once_across_a_pause_and_resume() {
    for overlap in ["allow", "replace"] {
        let db = TestDb::new().await;
        let id = hourly(&db.pool, overlap, "2026-06-01T10:20:00Z").await;
        let tick = at("2026-06-01T11:00:00Z");
        // The firing duty fires the tick 100 ms ahead.
        let before = tick - chrono::Duration::milliseconds(50);
        assert_eq!(fire(&db.pool, before, "100 ms").await, 1);
        for (f, now) in [("schedule_pause", 40), ("schedule_resume", 30)] {
            sqlx::query(sqlx::AssertSqlSafe(format!("select sked.{f}($1, $2)")))
                .bind(id)
                .bind(tick - chrono::Duration::milliseconds(now))
                .execute(&db.pool)
                .await
                .unwrap();
        }
        let next: DateTime<Utc> =
            sqlx::query_scalar("select next_run_at from sked.schedules where id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert!(
            next > tick,
            "overlap {overlap}: a resume never re-arms a tick that fired ({next})"
        );
        fire(&db.pool, tick, "100 ms").await;
        fire(
            &db.pool,
            tick + chrono::Duration::milliseconds(10),
            "100 ms",
        )
        .await;
        let occ = occurrences(&db.pool).await;
        assert_eq!(
            occ,
            vec![("waiting".to_string(), tick)],
            "overlap {overlap}: the tick fired once and its occurrence was not cancelled"
        );
        assert_eq!(fired_runs(&db.pool, id).await, 1);
    }
}

/// Creates a schedule whose next tick is a year boundary, fires it as the firing duty would on
/// the real clock (the trigger that re-arms a changed schedule reads the clock), and returns
/// (schedule, tick).
async fn fired_yearly(pool: &PgPool) -> (Uuid, DateTime<Utc>) {
    let id: Uuid = sqlx::query_scalar(
        "insert into sked.schedules (name, cron, task, overlap_policy)
         values ('yearly', '0 0 1 1 *', '{\"command\": [\"true\"]}', 'allow') returning id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let tick: DateTime<Utc> =
        sqlx::query_scalar("select next_run_at from sked.schedules where id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(fire_until(pool, tick).await, 1);
    (id, tick)
}

/// Fires every tick due up to one hour past `tick`, from the real clock.
async fn fire_until(pool: &PgPool, tick: DateTime<Utc>) -> i32 {
    sqlx::query_scalar("select sked.schedules_fire($1 - now() + interval '1 hour', p_now => now())")
        .bind(tick)
        .fetch_one(pool)
        .await
        .expect("firing")
}

#[tokio::test]
async fn a_cron_tick_fires_once_across_an_equivalent_time_zone() {
    let db = TestDb::new().await;
    let (id, tick) = fired_yearly(&db.pool).await;
    sqlx::query("update sked.schedules set time_zone = 'Etc/UTC' where id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    fire_until(&db.pool, tick).await;
    assert_eq!(
        occurrences(&db.pool).await,
        vec![("waiting".to_string(), tick)],
        "a change of time zone right after a fire never fires that tick again"
    );
    assert_eq!(fired_runs(&db.pool, id).await, 1);
}

#[tokio::test]
async fn a_cron_tick_fires_once_across_a_change_of_cron() {
    let db = TestDb::new().await;
    let (id, tick) = fired_yearly(&db.pool).await;
    // Monthly at midnight of the 1st: the year boundary is one of its ticks.
    sqlx::query("update sked.schedules set cron = '0 0 1 * *' where id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    fire_until(&db.pool, tick).await;
    assert_eq!(
        occurrences(&db.pool).await,
        vec![("waiting".to_string(), tick)],
        "a change of cron that includes the fired tick never fires it again"
    );
    assert_eq!(fired_runs(&db.pool, id).await, 1);
}

#[tokio::test]
async fn a_cron_tick_set_back_by_hand_is_claimed_before_its_task() {
    let db = TestDb::new().await;
    let id = hourly(&db.pool, "allow", "2026-06-01T10:20:00Z").await;
    let tick = at("2026-06-01T11:00:00Z");
    assert_eq!(fire(&db.pool, tick, "0").await, 1);
    // An operator moves next_run_at back to the tick that fired.
    sqlx::query("update sked.schedules set next_run_at = $2 where id = $1")
        .bind(id)
        .bind(tick)
        .execute(&db.pool)
        .await
        .unwrap();
    fire(&db.pool, tick + chrono::Duration::seconds(1), "0").await;
    assert_eq!(
        occurrences(&db.pool).await,
        vec![("waiting".to_string(), tick)],
        "a tick already recorded inserts no second task"
    );
    assert_eq!(fired_runs(&db.pool, id).await, 1);
    let next: DateTime<Utc> =
        sqlx::query_scalar("select next_run_at from sked.schedules where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        next,
        at("2026-06-01T12:00:00Z"),
        "the schedule moves on past the tick"
    );
}

// ---------------------------------------------------------------------------------------------
// Re-run beside a finish
// ---------------------------------------------------------------------------------------------

async fn claim_all(pool: &PgPool, queue: &str) -> Vec<(Uuid, i32, String)> {
    sqlx::query_as(
        "select c.id, c.attempt, c.name from sked.tasks_claim(gen_random_uuid(), array[$1], '{}', 10, '1 min') c",
    )
    .bind(queue)
    .fetch_all(pool)
    .await
    .expect("claiming")
}

const FINISH: &str =
    "select count(*) from sked.tasks_finish(array[$1]::uuid[], array[$2]::integer[],
                          array[$3]::text[], array[0]::integer[], array[null]::text[],
                          array[null]::text[], array[null]::text[], array[null]::text[],
                          array[null]::jsonb[])";

#[tokio::test]
async fn a_rerun_beside_a_parents_finish_never_leaves_a_child_blocked() {
    let db = TestDb::new().await;
    for round in 0..24 {
        let queue = format!("q{round}");
        // a and b run side by side; c needs both. a fails for good, so c ends upstream_failed
        // while b still runs.
        let spec = serde_json::json!({
            "name": format!("race {round}"),
            "tasks": [
                {"name": "a", "command": ["true"], "queue": queue, "max_attempts": 1},
                {"name": "b", "command": ["true"], "queue": queue},
                {"name": "c", "command": ["true"], "queue": queue, "depends_on": ["a", "b"]},
            ]
        });
        sqlx::query("select sked.workflow_submit($1)")
            .bind(&spec)
            .execute(&db.pool)
            .await
            .expect("submitting the workflow");
        let claimed = claim_all(&db.pool, &queue).await;
        let find = |name: &str| {
            claimed
                .iter()
                .find(|c| c.2 == name)
                .map(|c| (c.0, c.1))
                .unwrap_or_else(|| panic!("{name} claimed: {claimed:?}"))
        };
        let (a, a_attempt) = find("a");
        let (b, b_attempt) = find("b");
        sqlx::query(FINISH)
            .bind(a)
            .bind(a_attempt)
            .bind("failed")
            .execute(&db.pool)
            .await
            .unwrap();
        let c: Uuid =
            sqlx::query_scalar("select id from sked.tasks where queue = $1 and name = 'c'")
                .bind(&queue)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(crate::support::state(&db.pool, c).await, "upstream_failed");

        // b's finish and a's retry at once, on two connections.
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query(FINISH)
            .bind(b)
            .bind(b_attempt)
            .bind("succeeded")
            .execute(&mut *tx)
            .await
            .unwrap();
        let pool = db.pool.clone();
        let retry = tokio::spawn(async move {
            sqlx::query_scalar::<_, String>("select sked.task_retry($1)")
                .bind(a)
                .fetch_one(&pool)
                .await
        });
        let pause = rand::rng().random_range(0..20);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        tx.commit().await.unwrap();
        let retried = tokio::time::timeout(Duration::from_secs(10), retry)
            .await
            .expect("the retry ends once the finish commits")
            .unwrap()
            .expect("retrying a");
        assert_eq!(retried, "waiting");

        // a runs again and succeeds: c must be released.
        let again = claim_all(&db.pool, &queue).await;
        assert_eq!(
            again.len(),
            1,
            "round {round}: only a is claimable: {again:?}"
        );
        sqlx::query(FINISH)
            .bind(a)
            .bind(again[0].1)
            .bind("succeeded")
            .execute(&db.pool)
            .await
            .unwrap();
        let (state, pending): (String, i32) =
            sqlx::query_as("select state, parents_pending from sked.tasks where id = $1")
                .bind(c)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(
            (state.as_str(), pending),
            ("waiting", 0),
            "round {round} (finish committed {pause} ms after the retry started): a child whose \
             parents have all succeeded is released, never left blocked"
        );
    }
}

/// The rule that keeps a task's input readable: every JSON number fits a double.
const INPUT_NUMBERS: &str = "tasks_input_numbers_must_fit_a_double";

#[tokio::test]
async fn a_json_number_no_double_holds_is_refused_where_a_task_or_schedule_keeps_json() {
    let db = TestDb::new().await;
    for (what, sql, rule) in [
        (
            "a task's input",
            "insert into sked.tasks (command, input) values (array['cat'], '{\"n\": [1, 1e400]}')",
            INPUT_NUMBERS,
        ),
        (
            "a task's input, negative",
            "insert into sked.tasks (command, input) values (array['cat'], '-1e309')",
            INPUT_NUMBERS,
        ),
        (
            "a schedule's task template",
            "insert into sked.schedules (name, cron, task)
             values ('s', '* * * * *', '{\"command\": [\"cat\"], \"input\": 2e308}')",
            // Held to the rules of a task by submitting it once.
            "schedules_task_template_must_be_valid",
        ),
    ] {
        let err = sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&db.pool)
            .await
            .expect_err(what);
        assert_eq!(
            err.as_database_error().and_then(|e| e.constraint()),
            Some(rule),
            "{what}: the refusal names the rule: {err}"
        );
        assert!(
            err.to_string().contains(INPUT_NUMBERS),
            "{what}: the message names the rule of numbers: {err}"
        );
    }
    // An update that writes a number no double holds is refused too, naming its column's
    // rule.
    let task = insert(&db.pool, "(command) values (array['cat'])").await;
    for (column, rule) in [
        ("input", INPUT_NUMBERS),
        ("output", "tasks_output_numbers_must_fit_a_double"),
    ] {
        let err = sqlx::query(sqlx::AssertSqlSafe(format!(
            "update sked.tasks set {column} = '[1e400]' where id = $1"
        )))
        .bind(task)
        .execute(&db.pool)
        .await
        .expect_err(column);
        assert_eq!(
            err.as_database_error().and_then(|e| e.constraint()),
            Some(rule),
            "an update of {column}: {err}"
        );
    }
    // The largest double is a number like any other, and reads back as itself.
    let id = insert(
        &db.pool,
        "(command, input) values (array['cat'], '[1.7976931348623157e308, -1.7976931348623157e308, 1e-400]')",
    )
    .await;
    let input: serde_json::Value = sqlx::query_scalar("select input from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .expect("reading the input back");
    assert_eq!(
        input,
        serde_json::json!([f64::MAX, f64::MIN, 0.0]),
        "the largest doubles read back exactly; a number too small for a double is 0"
    );
}

#[tokio::test]
async fn a_claimed_row_the_worker_cannot_read_fails_alone_and_the_queue_goes_on() {
    let db = TestDb::new().await;
    // A row from before the rule: its input holds a number no double holds. (The rules of
    // inserts are checked by the statement trigger that also announces new tasks.)
    sqlx::raw_sql("alter table sked.tasks disable trigger tasks_after_insert_notify")
        .execute(&db.pool)
        .await
        .expect("setting the rules aside");
    let bad = insert(
        &db.pool,
        "(command, input, max_attempts, priority) values (array['cat'], '{\"n\": 1e400}', 1, 10)",
    )
    .await;
    sqlx::raw_sql("alter table sked.tasks enable trigger tasks_after_insert_notify")
        .execute(&db.pool)
        .await
        .expect("restoring the rules");
    let mut good = Vec::new();
    for _ in 0..3 {
        good.push(insert(&db.pool, "(command) values (array['true'])").await);
    }
    let worker = start_worker(&db, config(&["default"]));
    assert_eq!(
        wait_for(&db.pool, bad, &["failed"], Duration::from_secs(30)).await,
        "failed"
    );
    for id in &good {
        wait_for(&db.pool, *id, &["succeeded"], Duration::from_secs(30)).await;
    }
    let (error, attempts): (Option<String>, i64) = sqlx::query_as(
        "select t.error, (select count(*) from sked.task_attempts a where a.task_id = t.id)
           from sked.tasks t where t.id = $1",
    )
    .bind(bad)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let error = error.unwrap_or_default();
    assert!(
        error.contains("could not read the task") && error.contains("input"),
        "the task's error says the worker could not read it, and what: {error}"
    );
    assert_eq!(attempts, 1, "its one attempt is charged once");
    worker.shutdown().await;
}
