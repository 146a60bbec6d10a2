//! Background upkeep (`sked_db::upkeep`): each duty on its own schedule, a failing duty and a
//! stuck one stopping no other, the loop ending with its token, the duties each process runs
//! (one loop per process, `sked dev` included), the pruning of recorded live events and of
//! finished tasks past a retention (and none without one), and several loops at once.

use std::time::Duration;

use sked_db::testing::TestDb;
use sked_db::upkeep::{Duty, FiringConfig, Upkeep};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{self, insert};

/// An upkeep loop running in this process.
struct Loop {
    stop: CancellationToken,
    handle: JoinHandle<()>,
}

impl Loop {
    fn start(upkeep: Upkeep) -> Loop {
        let stop = CancellationToken::new();
        let handle = tokio::spawn(upkeep.run(stop.clone()));
        Loop { stop, handle }
    }

    /// Cancels the loop's token; the loop must end within 5 s, runs in flight included.
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.handle)
            .await
            .expect("the loop ends within 5 s of its token's cancellation")
            .expect("the loop's task");
    }
}

/// Rescue every 100 ms, a run given up after 5 s.
const RESCUE: Duty = Duty::Rescue {
    every: Duration::from_millis(100),
    limit: Duration::from_secs(5),
};

/// A task claimed by a worker that never renews its lease of one second.
async fn abandoned(pool: &PgPool) -> Uuid {
    let id = insert(pool, "(command) values (array['true'])").await;
    let queues = vec!["default".to_owned()];
    let claimed = sked_db::worker::claim(
        pool,
        Uuid::new_v4(),
        &queues,
        &[],
        1,
        Duration::from_secs(1),
    )
    .await
    .expect("claiming");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, id);
    id
}

/// A schedule firing a noop every second.
async fn every_second(pool: &PgPool) {
    sqlx::query(
        "insert into sked.schedules (name, cron, task, overlap_policy)
         values ('every second', '* * * * * *', '{\"kind\": \"noop\"}', 'allow')",
    )
    .execute(pool)
    .await
    .expect("a schedule");
}

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("`{sql}`: {e}"))
}

/// Waits until `sql` counts `want`; panics with the last count after `within`.
async fn until_count(pool: &PgPool, sql: &str, want: impl Fn(i64) -> bool, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let n = scalar(pool, sql).await;
        if want(n) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "`{sql}` is still {n} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_failing_duty_and_a_stuck_one_stop_no_other_duty() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    // Pruning live events fails at every run: its function is gone.
    sqlx::query("drop function sked.events_prune(timestamptz)")
        .execute(pool)
        .await
        .unwrap();
    // Pruning finished tasks is stuck: another transaction prunes, and holds its lock.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("select sked.tasks_prune(now() - interval '1 day')")
        .execute(&mut *holder)
        .await
        .unwrap();
    let id = abandoned(pool).await;
    every_second(pool).await;

    let running = Loop::start(
        Upkeep::new()
            .with(Duty::PruneEvents, pool)
            .with(
                Duty::PruneTasks {
                    retention: Duration::from_secs(86_400),
                },
                pool,
            )
            .with(RESCUE, pool)
            .with(Duty::FireSchedules(FiringConfig::default()), pool),
    );
    // The stuck prune waits for the lock, while the other duties go on.
    until_count(
        pool,
        "select count(*) from pg_locks where locktype = 'advisory' and not granted",
        |n| n == 1,
        Duration::from_secs(5),
    )
    .await;
    support::wait_for(pool, id, &["retry"], Duration::from_secs(10)).await;
    until_count(
        pool,
        "select count(*) from sked.schedule_runs where outcome = 'fired'",
        |n| n >= 3,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        scalar(
            pool,
            "select count(*) from pg_locks where locktype = 'advisory' and not granted"
        )
        .await,
        1,
        "the stuck prune is still waiting: the other duties did not wait for it"
    );
    // Cancelling the token ends the loop, the stuck run included.
    running.stop().await;
    holder.rollback().await.unwrap();
    let fired = scalar(
        pool,
        "select count(*) from sked.schedule_runs where outcome = 'fired'",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        scalar(
            pool,
            "select count(*) from sked.schedule_runs where outcome = 'fired'"
        )
        .await,
        fired,
        "nothing fires after the loop stopped"
    );
}

#[tokio::test]
async fn each_process_runs_each_duty_once_and_dev_runs_both_parts_in_one_loop() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let names = |u: &Upkeep| u.duties().map(Duty::name).collect::<Vec<_>>();
    let worker = support::config(&["default"]);
    assert_eq!(
        names(&sked_worker::upkeep(pool, &worker)),
        [
            "rescue",
            "reconcile services",
            "fire schedules",
            "prune schedule runs"
        ]
    );
    let quiet = sked_worker::WorkerConfig {
        fire_schedules: false,
        ..worker.clone()
    };
    assert_eq!(
        names(&sked_worker::upkeep(pool, &quiet)),
        ["rescue", "reconcile services"],
        "--fire-schedules false: the worker neither fires nor trims runs"
    );
    assert_eq!(
        names(&sked_server::upkeep(pool, None)),
        ["fire schedules", "prune schedule runs", "prune live events"],
        "finished tasks are kept unless a retention is given"
    );
    let day = Duration::from_secs(86_400);
    assert_eq!(
        names(&sked_server::upkeep(pool, Some(day))),
        [
            "fire schedules",
            "prune schedule runs",
            "prune live events",
            "prune finished tasks"
        ]
    );
    // `sked dev`: the worker's loop takes the server's duties; each runs once.
    assert_eq!(
        names(&sked_worker::upkeep(pool, &worker).and(sked_server::upkeep(pool, Some(day)))),
        [
            "rescue",
            "reconcile services",
            "fire schedules",
            "prune schedule runs",
            "prune live events",
            "prune finished tasks"
        ]
    );
    assert_eq!(
        names(&sked_worker::upkeep(pool, &quiet).and(sked_server::upkeep(pool, None))),
        [
            "rescue",
            "reconcile services",
            "fire schedules",
            "prune schedule runs",
            "prune live events"
        ],
        "a worker that does not fire leaves firing to the server's duties"
    );
}

#[tokio::test]
async fn the_servers_upkeep_prunes_recorded_live_events_a_minute_old_without_clients() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    sqlx::query(
        "insert into sked.event_outbox (slot, n, at, kind) values
           (0, 1, now() - interval '2 minutes', 't'), (0, 2, now(), 't')",
    )
    .execute(pool)
    .await
    .unwrap();
    let running = Loop::start(sked_server::upkeep(pool, None));
    until_count(
        pool,
        "select count(*) from sked.event_outbox where n = 1",
        |n| n == 0,
        Duration::from_secs(5),
    )
    .await;
    running.stop().await;
    assert_eq!(
        scalar(pool, "select count(*) from sked.event_outbox where n = 2").await,
        1,
        "a change recorded just now stays for the hubs to read"
    );
}

/// A finished task that finished `age` ago, with a log line.
async fn finished_ago(pool: &PgPool, age: &str) -> Uuid {
    let id = insert(pool, "(command) values (array['true'])").await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "select sked.task_cancel($1, now() - interval '{age}')"
    )))
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "insert into sked.task_logs (task_id, attempt, stream, data) values ($1, 1, 'stdout', 'x')",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    id
}

async fn task_ids(pool: &PgPool) -> Vec<Uuid> {
    sqlx::query_scalar("select id from sked.tasks order by id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn finished_tasks_are_pruned_past_the_retention_and_kept_without_one() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let old = finished_ago(pool, "2 days").await;
    let recent = finished_ago(pool, "1 hour").await;
    let waiting = insert(pool, "(command) values (array['true'])").await;
    let mut all = vec![old, recent, waiting];
    all.sort();

    // Without a retention (the default), nothing is pruned.
    let running = Loop::start(sked_server::upkeep(pool, None));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    running.stop().await;
    assert_eq!(
        task_ids(pool).await,
        all,
        "no retention: every task is kept"
    );

    // With a retention of a day, the task finished two days ago goes, with its log.
    let running = Loop::start(sked_server::upkeep(pool, Some(Duration::from_secs(86_400))));
    until_count(
        pool,
        "select count(*) from sked.tasks",
        |n| n == 2,
        Duration::from_secs(5),
    )
    .await;
    running.stop().await;
    let mut kept = vec![recent, waiting];
    kept.sort();
    assert_eq!(
        task_ids(pool).await,
        kept,
        "a task finished within the retention, and an unfinished one, are kept"
    );
    let logs: i64 = sqlx::query_scalar("select count(*) from sked.task_logs where task_id = $1")
        .bind(old)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(logs, 0, "the pruned task's logs went with it");
}

#[tokio::test]
async fn three_loops_at_once_rescue_each_task_once_fire_each_tick_once_and_prune_whole_workflows() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let mut lost = Vec::new();
    for _ in 0..20 {
        lost.push(abandoned(pool).await);
    }
    every_second(pool).await;
    // 30 workflows of two tasks, cancelled two days ago.
    for i in 0..30 {
        let workflow: Uuid = sqlx::query_scalar(
            "select sked.workflow_submit($1, 'alice', now() - interval '2 days')",
        )
        .bind(serde_json::json!({"name": format!("w{i}"), "tasks": [
            {"name": "a", "command": ["true"]},
            {"name": "b", "command": ["true"], "depends_on": ["a"]}]}))
        .fetch_one(pool)
        .await
        .unwrap();
        sqlx::query("select sked.workflow_cancel($1, now() - interval '2 days')")
            .bind(workflow)
            .execute(pool)
            .await
            .unwrap();
    }
    assert_eq!(
        scalar(pool, "select count(*) from sked.workflows").await,
        30
    );

    let loops: Vec<Loop> = (0..3)
        .map(|_| {
            Loop::start(
                Upkeep::new()
                    .with(RESCUE, pool)
                    .with(Duty::FireSchedules(FiringConfig::default()), pool)
                    .with(
                        Duty::PruneTasks {
                            retention: Duration::from_secs(86_400),
                        },
                        pool,
                    ),
            )
        })
        .collect();
    until_count(
        pool,
        "select count(*) from sked.workflows",
        |n| n == 0,
        Duration::from_secs(10),
    )
    .await;
    for id in &lost {
        support::wait_for(pool, *id, &["retry"], Duration::from_secs(10)).await;
    }
    until_count(
        pool,
        "select count(*) from sked.schedule_runs where outcome = 'fired'",
        |n| n >= 3,
        Duration::from_secs(10),
    )
    .await;
    for l in loops {
        l.stop().await;
    }
    assert_eq!(
        scalar(
            pool,
            "select count(*) from sked.tasks where workflow_id is not null"
        )
        .await,
        0,
        "every workflow's tasks were pruned, and no workflow row was left behind"
    );
    let attempts: Vec<(Uuid, i64)> = sqlx::query_as(
        "select task_id, count(*) from sked.task_attempts where outcome = 'worker_lost'
          group by task_id order by task_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    lost.sort();
    assert_eq!(
        attempts,
        lost.iter().map(|id| (*id, 1)).collect::<Vec<_>>(),
        "each lost task was rescued once, by one of the three loops"
    );
    let (runs, occurrences): (i64, i64) = sqlx::query_as(
        "select count(*), count(distinct task_id) from sked.schedule_runs where outcome = 'fired'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let noops = scalar(pool, "select count(*) from sked.tasks where kind = 'noop'").await;
    assert_eq!(
        (occurrences, noops),
        (runs, runs),
        "each fired tick has one occurrence, however many loops fire"
    );
}
