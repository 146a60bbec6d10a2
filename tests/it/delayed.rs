//! Tests of delayed tasks: a task is claimable from its `next_run_at` on and not a moment
//! before (time as an input), the next due time a worker sleeps toward, and real workers
//! starting delayed tasks on time rather than at the next poll.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{config, insert, start_worker, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// Claims one task of `default` as of `now`; returns the ids claimed.
async fn claim_at(pool: &PgPool, now: DateTime<Utc>) -> Vec<Uuid> {
    sqlx::query_scalar(
        "select id from sked.tasks_claim(gen_random_uuid(), '{default}', '{}', 10, '30 s', $1)",
    )
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn next_run_at(pool: &PgPool, id: Uuid) -> DateTime<Utc> {
    sqlx::query_scalar("select next_run_at from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_delayed_task_is_claimed_from_its_due_time_on_and_not_a_microsecond_before() {
    let db = TestDb::new().await;
    let by_delay: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['true'], delay => interval '15 minutes')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let at: DateTime<Utc> = "2031-02-03T04:05:06.789012Z".parse().unwrap();
    let by_time: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['true'], run_at => $1, delay => interval '2 s')",
    )
    .bind(at)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        next_run_at(&db.pool, by_time).await,
        at + TimeDelta::seconds(2),
        "run_at and delay add up"
    );

    let due = next_run_at(&db.pool, by_delay).await;
    let just_before = due - TimeDelta::microseconds(1);
    assert!(
        claim_at(&db.pool, just_before).await.is_empty(),
        "a task is not claimable a microsecond before its next_run_at"
    );
    assert_eq!(
        claim_at(&db.pool, due).await,
        vec![by_delay],
        "a task is claimable at its next_run_at, and the later one is not"
    );
    let state: String = sqlx::query_scalar("select state from sked.tasks where id = $1")
        .bind(by_time)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state, "waiting", "the task due in 2031 still waits");
}

#[tokio::test]
async fn the_next_due_time_counts_from_the_last_claim_over_queues_and_priorities() {
    let db = TestDb::new().await;
    let t0: DateTime<Utc> = "2030-01-01T00:00:00Z".parse().unwrap();
    let s = |secs: i64| t0 + TimeDelta::seconds(secs);
    for (queue, priority, at) in [
        ("a", 0, s(30)),
        ("a", 5, s(40)),
        ("a", -5, s(10)),
        ("a", 5, s(20)),
        ("b", 0, s(5)),
        ("c", 0, s(1)),
    ] {
        sqlx::query("insert into sked.tasks (kind, queue, priority, next_run_at) values ('noop', $1, $2, $3)")
            .bind(queue)
            .bind(priority)
            .bind(at)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let due_from = async |queues: &[&str], from: DateTime<Utc>| -> Option<DateTime<Utc>> {
        sqlx::query_scalar("select sked.tasks_due_from($1, $2)")
            .bind(queues)
            .bind(from)
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    assert_eq!(
        due_from(&["a"], t0).await,
        Some(s(10)),
        "the earliest of every priority counts, not only the highest priority's"
    );
    assert_eq!(
        due_from(&["a"], s(10)).await,
        Some(s(10)),
        "due at `from` counts"
    );
    assert_eq!(
        due_from(&["a"], s(11)).await,
        Some(s(20)),
        "tasks due before `from` (claimed, or not this worker's) are passed over"
    );
    assert_eq!(due_from(&["a"], s(31)).await, Some(s(40)));
    assert_eq!(
        due_from(&["a"], s(41)).await,
        None,
        "nothing due from then on"
    );
    assert_eq!(
        due_from(&["a", "b"], t0).await,
        Some(s(5)),
        "the earliest over all the queues asked for"
    );
    assert_eq!(
        due_from(&["nope"], t0).await,
        None,
        "an empty queue has none"
    );

    // Only claimable tasks count: the task due at 5 s in `b` runs now.
    claim_at_queue(&db.pool, "b", s(5)).await;
    assert_eq!(
        due_from(&["b"], t0).await,
        None,
        "a running task is not due"
    );

    // tasks_next_due is the same answer as seconds from p_now, including tasks due already.
    let secs: Option<f64> = sqlx::query_scalar("select sked.tasks_next_due('{a,c}', $1)")
        .bind(s(3))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(secs, Some(-2.0), "c's task was due 2 s before p_now");

    // A task that never becomes due does not break the answer.
    sqlx::query(
        "insert into sked.tasks (kind, queue, next_run_at) values ('noop', 'far', 'infinity')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let secs: Option<f64> = sqlx::query_scalar("select sked.tasks_next_due('{far}', $1)")
        .bind(t0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(secs, Some(f64::INFINITY));
}

async fn claim_at_queue(pool: &PgPool, queue: &str, now: DateTime<Utc>) {
    let n: i64 = sqlx::query_scalar(
        "select count(*) from sked.tasks_claim(gen_random_uuid(), array[$1], '{}', 10, '30 s', $2)",
    )
    .bind(queue)
    .bind(now)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(n, 1, "one task of {queue} is due at {now}");
}

#[tokio::test]
async fn a_task_that_became_due_after_an_empty_claim_is_due_at_once_for_the_worker() {
    // The race a worker must not lose: its claim finds nothing, a task becomes due a moment
    // later, and only then does the worker ask when to claim next.
    let db = TestDb::new().await;
    let queues = vec!["default".to_owned()];
    let claim = sked_db::worker::claim_within(
        &db.pool,
        Uuid::new_v4(),
        &queues,
        &[],
        4,
        Duration::from_secs(30),
        sked_db::worker::Free::default(),
    )
    .await
    .unwrap();
    assert!(claim.tasks.is_empty(), "nothing to claim yet");
    let id: Uuid = sqlx::query_scalar(
        "insert into sked.tasks (kind, next_run_at) values ('noop', $1 + interval '1 microsecond')
         returning id",
    )
    .bind(claim.at)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let wait = sked_db::worker::next_due_from(&db.pool, &queues, claim.at)
        .await
        .unwrap()
        .expect("the task due after the claim is the next due");
    assert!(wait <= 0.0, "it is due already: wait {wait} s");

    // A claim that takes tasks answers the time they were started at.
    let claim = sked_db::worker::claim_within(
        &db.pool,
        Uuid::new_v4(),
        &queues,
        &[],
        4,
        Duration::from_secs(30),
        sked_db::worker::Free::default(),
    )
    .await
    .unwrap();
    assert_eq!(claim.tasks.len(), 1);
    assert_eq!(claim.tasks[0].id, id);
    let started: DateTime<Utc> =
        sqlx::query_scalar("select started_at from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(claim.at, started, "the claim's time is its tasks' start");
}

#[tokio::test]
async fn a_worker_starts_delayed_tasks_when_due_never_before_and_not_at_the_poll() {
    let db = TestDb::new().await;
    let mut c = config(&["default"]);
    c.poll_interval = Duration::from_secs(60);
    let worker = start_worker(&db, c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The later task goes in first: the worker sleeps toward it, and the insert of the
    // earlier ones must wake it. Ten tasks share one due time, more than the 8 slots.
    let late = insert(
        &db.pool,
        "(kind, next_run_at) values ('noop', now() + interval '2 s')",
    )
    .await;
    let same: Vec<Uuid> = sqlx::query_scalar(
        "insert into sked.tasks (kind, next_run_at)
         select 'noop', now() + interval '1.2 s' from generate_series(1, 10) returning id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let early = insert(
        &db.pool,
        "(kind, next_run_at) values ('noop', now() + interval '1 s')",
    )
    .await;
    for id in same.iter().chain([&late, &early]) {
        wait_for(&db.pool, *id, &["succeeded"], 20 * SECS).await;
    }
    let (too_early, latest): (i64, f64) = sqlx::query_as(
        "select count(*) filter (where started_at < next_run_at),
                max(extract(epoch from started_at - next_run_at))::float8
           from sked.tasks",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(too_early, 0, "no task starts before its next_run_at");
    assert!(
        latest < 10.0,
        "every task starts when due, not at the poll 60 s later: the latest started {latest} s late"
    );
    worker.shutdown().await;
}

/// `delay` counts from the commit of the submitting transaction, when the task becomes
/// visible: a 2 s delay asked for 1.5 s into a transaction starts the task 2 s after COMMIT
/// (not 0.5 s), whichever way in (`tasks_submit`, `task_submit`, a sharded task's shards).
/// `run_at` is a time and stays as given.
#[tokio::test]
async fn a_delay_counts_from_the_commit_of_a_long_transaction() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let mut tx = pool.begin().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let by_json: Uuid = sqlx::query_scalar(
        r#"select id from sked.tasks_submit('[{"command": ["true"], "delay": "2 s"}]')"#,
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let by_name: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['true'], delay => '2 s', shards => 2)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let at = "2030-01-01T00:00:00Z".parse::<DateTime<Utc>>().unwrap();
    let pinned: Uuid = sqlx::query_scalar(
        r#"select id from sked.tasks_submit('[{"command": ["true"], "run_at": "2030-01-01T00:00:00Z", "delay": "1 s"}]')"#,
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before_commit = Utc::now();
    tx.commit().await.unwrap();
    let after_commit = Utc::now();
    let shards: Vec<Uuid> = sqlx::query_scalar("select id from sked.tasks where shard_of = $1")
        .bind(by_name)
        .fetch_all(pool)
        .await
        .unwrap();
    assert_eq!(shards.len(), 2);
    for id in [by_json, by_name].into_iter().chain(shards) {
        let due = next_run_at(pool, id).await;
        assert!(
            due >= before_commit + TimeDelta::seconds(2)
                && due <= after_commit + TimeDelta::seconds(2),
            "{id}: due {due}, committed between {before_commit} and {after_commit}"
        );
    }
    assert_eq!(
        next_run_at(pool, pinned).await,
        at + TimeDelta::seconds(1),
        "run_at + delay is a time"
    );
    let notes: i64 = sqlx::query_scalar("select count(*) from sked.delays_from_commit")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(notes, 0, "nothing is left noted after the commit");

    // A real worker starts the task 2 s after the commit, not 0.5 s after it.
    let mut tx = pool.begin().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let id: Uuid = sqlx::query_scalar(
        r#"select id from sked.tasks_submit('[{"command": ["true"], "delay": "2 s", "queue": "late"}]')"#,
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let worker = start_worker(&db, config(&["late"]));
    tx.commit().await.unwrap();
    let committed = Utc::now();
    wait_for(pool, id, &["succeeded"], 10 * SECS).await;
    let started: DateTime<Utc> =
        sqlx::query_scalar("select started_at from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    let after = (started - committed).as_seconds_f64();
    assert!(
        (1.9..3.0).contains(&after),
        "started {after:.3} s after COMMIT, for a 2 s delay"
    );
    worker.shutdown().await;
}

/// The note of a delay names a new task only: a submitter that notes another owner's task
/// (or any existing one) moves nothing at its commit.
#[tokio::test]
async fn a_noted_delay_moves_no_existing_task() {
    let db = TestDb::new().await;
    let victim = insert(&db.pool, "(command, owner) values (array['true'], 'bob')").await;
    let due = next_run_at(&db.pool, victim).await;
    let alice = crate::trust_roles::Login::new(&db, "sked_submitter").await;
    let mut tx = alice.pool.begin().await.unwrap();
    sqlx::query(
        "select sked.delays_from_commit_note(array[$1::uuid], array[interval '100 years'])",
    )
    .bind(victim)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(r#"select * from sked.tasks_submit('[{"command": ["true"], "delay": "1 s"}]')"#)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        next_run_at(&db.pool, victim).await,
        due,
        "the victim's due time stands"
    );
    let e = sqlx::query("select * from sked.delays_from_commit")
        .execute(&alice.pool)
        .await
        .unwrap_err();
    assert_eq!(
        e.as_database_error().unwrap().code().as_deref(),
        Some("42501"),
        "the notes are sked's functions' only"
    );
}
