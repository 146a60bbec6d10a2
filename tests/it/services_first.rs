//! Services first (docs/runtime.md): a claim takes the due copies of services before any
//! other task, a worker holds its CPU and memory for a copy that does not fit yet, paused
//! queues start no copy, and a copy that no worker had room for makes a worker stop its
//! preemptible tasks (never others) — in SQL with time as an input, and with real workers.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sked_db::testing::TestDb;
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

use crate::placement::{db_now, register};
use crate::support::{TestWorker, config, start_worker, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// Claims up to 10 tasks as `worker` at `now` with this free capacity; their ids and kinds,
/// in claim order.
async fn claim(
    pool: &PgPool,
    worker: Uuid,
    free: (Option<i32>, Option<i32>),
    now: DateTime<Utc>,
) -> Vec<(Uuid, String)> {
    sqlx::query_as(
        "select id, kind from sked.tasks_claim($1, '{default}', '{}', 10, '30 seconds', $2, $3, $4)
          order by priority desc, next_run_at",
    )
    .bind(worker)
    .bind(free.0)
    .bind(free.1)
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// `n` noop batch tasks due at `due` with this priority and CPU request.
async fn batch(pool: &PgPool, n: i32, priority: i32, cpu: Option<i32>, due: DateTime<Utc>) {
    sqlx::query(
        "insert into sked.tasks (kind, priority, cpu_millis, next_run_at)
         select 'noop', $2, $3, $4 from generate_series(1, $1)",
    )
    .bind(n)
    .bind(priority)
    .bind(cpu)
    .bind(due)
    .execute(pool)
    .await
    .unwrap();
}

/// A service with one copy, requesting `cpu` millicores, due at `due`; its copy's id.
async fn service(pool: &PgPool, cpu: Option<i32>, due: DateTime<Utc>) -> (Uuid, Uuid) {
    let service: Uuid = sqlx::query_scalar(
        "select sked.task_submit(kind => 'service', command => array['sleep', '300'],
                                 cpu_millis => $1, run_at => $2)",
    )
    .bind(cpu)
    .bind(due)
    .fetch_one(pool)
    .await
    .unwrap();
    let copy = sqlx::query_scalar("select id from sked.tasks where shard_of = $1")
        .bind(service)
        .fetch_one(pool)
        .await
        .unwrap();
    (service, copy)
}

#[tokio::test]
async fn a_claim_takes_a_due_copy_before_a_backlog_of_higher_priority_batch_tasks() {
    let db = TestDb::new().await;
    let now = db_now(&db.pool).await;
    let worker = register(&db.pool, &["default"], &[], None, None, now).await;
    // 50 batch tasks, due for a minute and of a higher priority, then one copy due now.
    batch(&db.pool, 50, 5, None, now - chrono::Duration::seconds(60)).await;
    let (_, copy) = service(&db.pool, None, now).await;

    let first = claim(&db.pool, worker, (None, None), now).await;
    assert_eq!(
        first,
        vec![(copy, "service".to_owned())],
        "the first claim takes the copy alone"
    );
    let second = claim(&db.pool, worker, (None, None), now).await;
    assert_eq!(second.len(), 10, "then the batch tasks: {second:?}");
    assert!(second.iter().all(|(_, kind)| kind == "noop"));
}

#[tokio::test]
async fn a_worker_holds_its_capacity_for_a_due_copy_that_does_not_fit_yet() {
    let db = TestDb::new().await;
    let now = db_now(&db.pool).await;
    // A worker of 1000 millicores, 700 of them in use: 300 free.
    let worker = register(&db.pool, &["default"], &[], Some(1000), None, now).await;
    batch(&db.pool, 3, 0, Some(100), now).await;
    batch(&db.pool, 2, 0, None, now).await;
    let (_, copy) = service(&db.pool, Some(800), now).await;

    let held = claim(&db.pool, worker, (Some(300), None), now).await;
    assert_eq!(
        held.len(),
        2,
        "only the tasks without requests: the CPU drains for the copy: {held:?}"
    );
    let with_requests: i64 = sqlx::query_scalar(
        "select count(*) from sked.tasks where cpu_millis = 100 and state = 'running'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(with_requests, 0);
    // Why they wait says so.
    let copy_says = crate::placement::reasons(&db.pool, copy, now).await;
    assert!(
        copy_says.len() == 1
            && copy_says[0]
                .1
                .contains("a copy of a service: it goes before other tasks"),
        "{copy_says:?}"
    );
    let waiting: Uuid = sqlx::query_scalar(
        "select id from sked.tasks where cpu_millis = 100 and state = 'waiting' limit 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let batch_says = crate::placement::reasons(&db.pool, waiting, now).await;
    assert!(
        batch_says.len() == 1
            && batch_says[0]
                .1
                .contains("1 copy of services waits for room"),
        "{batch_says:?}"
    );

    // A worker too small for the copy does not hold back for it.
    let small = register(&db.pool, &["default"], &[], Some(500), None, now).await;
    let small_took = claim(&db.pool, small, (Some(300), None), now).await;
    assert_eq!(small_took.len(), 3, "{small_took:?}");

    // Once the capacity has drained, the copy is claimed.
    let took = claim(&db.pool, worker, (Some(1000), None), now).await;
    assert_eq!(took, vec![(copy, "service".to_owned())]);
}

#[tokio::test]
async fn a_paused_queue_starts_no_copy_and_preemption_waits_for_the_workers_with_room() {
    let db = TestDb::new().await;
    let now = db_now(&db.pool).await;
    let worker = register(&db.pool, &["default"], &[], Some(1000), None, now).await;
    let (_, copy) = service(&db.pool, Some(800), now).await;
    sqlx::query("select sked.queue_pause('default')")
        .execute(&db.pool)
        .await
        .unwrap();
    assert!(
        claim(&db.pool, worker, (Some(1000), None), now)
            .await
            .is_empty()
    );
    sqlx::query("select sked.queue_resume('default')")
        .execute(&db.pool)
        .await
        .unwrap();

    let preempting = |reclaimable: i32, at: DateTime<Utc>| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>(
                "select id from sked.copies_claim_preempting($1, '{default}', '{}', '30 seconds', $2, null, $3)",
            )
            .bind(worker)
            .bind(reclaimable)
            .bind(at)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    // Not before the copy has waited sked.preempt_after() (2 s) for a worker with room.
    assert!(
        preempting(1000, now + chrono::Duration::milliseconds(1500))
            .await
            .is_empty()
    );
    // Not when stopping every preemptible attempt would not make room.
    let later = now + chrono::Duration::seconds(3);
    assert!(preempting(700, later).await.is_empty());
    assert_eq!(preempting(800, later).await, vec![copy]);
    assert_eq!(super::support::state(&db.pool, copy).await, "running");
}

#[tokio::test]
async fn a_service_cannot_be_preemptible() {
    let db = TestDb::new().await;
    let err = sqlx::query(
        "insert into sked.tasks (kind, command, preemptible) values ('service', array['sleep', '1'], true)",
    )
    .execute(&db.pool)
    .await
    .expect_err("a preemptible service is refused");
    let constraint = err
        .as_database_error()
        .and_then(|e| e.constraint())
        .map(str::to_owned);
    assert_eq!(
        constraint.as_deref(),
        Some("tasks_services_are_not_preemptible")
    );
    let n: i64 = sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
}

/// A batch task that sleeps 300 s requesting 500 millicores, of this priority.
async fn sleeper(pool: &PgPool, priority: i32, preemptible: bool) -> Uuid {
    sqlx::query_scalar(
        "insert into sked.tasks (command, priority, cpu_millis, preemptible)
         values (array['sleep', '300'], $1, 500, $2) returning id",
    )
    .bind(priority)
    .bind(preemptible)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A worker of 2 slots and 1000 millicores, filled with two sleepers of these priorities
/// and preemptibility, once both run.
async fn full_worker(db: &TestDb, sleepers: [(i32, bool); 2]) -> (TestWorker, [Uuid; 2]) {
    let mut c = config(&["default"]);
    c.concurrency = 2;
    c.capacity.cpu_millis = Some(1000);
    let worker = start_worker(db, c);
    let mut ids = [Uuid::nil(); 2];
    for (id, (priority, preemptible)) in ids.iter_mut().zip(sleepers) {
        *id = sleeper(&db.pool, priority, preemptible).await;
    }
    for id in ids {
        wait_for(&db.pool, id, &["running"], 20 * SECS).await;
    }
    (worker, ids)
}

/// Cancels every task that has not ended.
async fn stop_all(pool: &PgPool) {
    sqlx::query(
        "select sked.task_cancel(id) from sked.tasks where state in ('running', 'waiting')",
    )
    .execute(pool)
    .await
    .unwrap();
}

#[derive(Debug, sqlx::FromRow)]
struct Attempt {
    attempt: i32,
    outcome: String,
    error: Option<String>,
}

async fn attempts(pool: &PgPool, id: Uuid) -> Vec<Attempt> {
    sqlx::query_as(
        "select attempt, outcome, error from sked.task_attempts where task_id = $1 order by attempt",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn copy_up(pool: &PgPool, copy: Uuid) -> bool {
    sqlx::query_scalar(
        "select sked.service_copy_up(state, up_since, started_at) from sked.tasks where id = $1",
    )
    .bind(copy)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_full_worker_stops_its_lowest_priority_preemptible_task_for_a_copy() {
    let db = TestDb::new().await;
    let (worker, [low, high]) = full_worker(&db, [(0, true), (5, true)]).await;

    let submitted = Instant::now();
    let (_, copy) = service(&db.pool, Some(500), db_now(&db.pool).await).await;
    let deadline = submitted + 20 * SECS;
    while !copy_up(&db.pool, copy).await {
        assert!(
            Instant::now() < deadline,
            "the copy should start within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = submitted.elapsed();
    eprintln!("the copy started {took:?} after its submission");
    // preempt_after (2 s) + the next poll (0.2 s) + the stopped task's exit.
    assert!(took < 8 * SECS, "the copy started after {took:?}");

    assert_eq!(super::support::state(&db.pool, low).await, "waiting");
    let history = attempts(&db.pool, low).await;
    assert_eq!(history.len(), 1, "{history:?}");
    assert_eq!(history[0].attempt, 1);
    assert_eq!(history[0].outcome, "interrupted");
    assert!(
        history[0]
            .error
            .as_deref()
            .is_some_and(|e| e.starts_with("preempted:") && e.contains(&copy.to_string())),
        "{history:?}"
    );
    let max_attempts: i32 = sqlx::query_scalar("select max_attempts from sked.tasks where id = $1")
        .bind(low)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        max_attempts, 4,
        "the preempted attempt is not charged (3 + 1)"
    );
    // The higher-priority task runs on in its first attempt.
    assert_eq!(super::support::state(&db.pool, high).await, "running");
    assert!(attempts(&db.pool, high).await.is_empty());
    // And the preempted one stays waiting: the worker is full.
    tokio::time::sleep(SECS).await;
    assert_eq!(super::support::state(&db.pool, low).await, "waiting");

    stop_all(&db.pool).await;
    worker.shutdown().await;
}

#[tokio::test]
async fn tasks_that_are_not_preemptible_are_never_stopped_for_a_copy() {
    let db = TestDb::new().await;
    let (worker, [a, b]) = full_worker(&db, [(0, false), (0, true)]).await;

    // A copy that needs 1000 millicores: only stopping both tasks would make room, and one of
    // them is not preemptible.
    let (service_id, copy) = service(&db.pool, Some(1000), db_now(&db.pool).await).await;
    tokio::time::sleep(5 * SECS).await;
    assert_eq!(super::support::state(&db.pool, copy).await, "waiting");
    let rows = sked_db::service::running(&db.pool, None, 10).await.unwrap();
    let listed = sked_db::service::summaries(&db.pool, rows).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, service_id);
    assert_eq!(
        (listed[0].running, listed[0].waiting),
        (0, 1),
        "the listing shows the copy waiting"
    );
    assert_eq!(super::support::state(&db.pool, a).await, "running");
    assert_eq!(super::support::state(&db.pool, b).await, "running");
    assert!(attempts(&db.pool, a).await.is_empty());
    assert!(attempts(&db.pool, b).await.is_empty());

    // When the task that is not preemptible ends, the preemptible one makes room.
    sqlx::query("select sked.task_cancel($1)")
        .bind(a)
        .execute(&db.pool)
        .await
        .unwrap();
    let deadline = Instant::now() + 20 * SECS;
    while !copy_up(&db.pool, copy).await {
        assert!(
            Instant::now() < deadline,
            "the copy should start once a ends"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(super::support::state(&db.pool, b).await, "waiting");
    assert_eq!(attempts(&db.pool, b).await[0].outcome, "interrupted");

    stop_all(&db.pool).await;
    worker.shutdown().await;
}
