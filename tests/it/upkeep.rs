//! Background upkeep (`sked_db::upkeep`): each duty on its own schedule, a failing duty and a
//! stuck one stopping no other, the loop ending with its token, the duties each process runs
//! (one loop per process, `sked dev` included), the pruning of recorded live events, of
//! finished tasks past their retention (the database's, or their queue's; none while it is
//! off) and of artifacts nothing refers to, and several loops at once.

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
    // Pruning finished tasks is stuck: there is a task to prune, and another transaction
    // prunes and holds the lock.
    finished_ago(pool, "8 days").await;
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
            .with(Duty::PruneTasks, pool)
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
            "fold finishes",
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
        ["rescue", "reconcile services", "fold finishes"],
        "--fire-schedules false: the worker neither fires nor trims runs"
    );
    assert_eq!(
        names(&sked_server::upkeep(pool)),
        [
            "fire schedules",
            "prune schedule runs",
            "prune live events",
            "prune finished tasks",
            "prune artifacts",
            "fold finishes"
        ],
        "every server applies the retention stored in the database"
    );
    // `sked dev`: the worker's loop takes the server's duties; each runs once.
    assert_eq!(
        names(&sked_worker::upkeep(pool, &worker).and(sked_server::upkeep(pool))),
        [
            "rescue",
            "reconcile services",
            "fold finishes",
            "fire schedules",
            "prune schedule runs",
            "prune live events",
            "prune finished tasks",
            "prune artifacts"
        ]
    );
    assert_eq!(
        names(&sked_worker::upkeep(pool, &quiet).and(sked_server::upkeep(pool))),
        [
            "rescue",
            "reconcile services",
            "fold finishes",
            "fire schedules",
            "prune schedule runs",
            "prune live events",
            "prune finished tasks",
            "prune artifacts"
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
    let running = Loop::start(sked_server::upkeep(pool));
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
async fn the_servers_upkeep_prunes_by_the_retention_in_the_database_and_nothing_while_it_is_off() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let eight_days = finished_ago(pool, "8 days").await;
    let six_days = finished_ago(pool, "6 days").await;
    let waiting = insert(pool, "(command) values (array['true'])").await;
    let scratch = insert(pool, "(command, queue) values (array['true'], 'scratch')").await;
    sqlx::query("select sked.task_cancel($1, now() - interval '2 days')")
        .bind(scratch)
        .execute(pool)
        .await
        .unwrap();

    // Retention off: a real loop runs its prunes and deletes nothing.
    sqlx::query("select sked.retention_set(p_enabled => false)")
        .execute(pool)
        .await
        .unwrap();
    let running = Loop::start(sked_server::upkeep(pool));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    running.stop().await;
    let mut all = vec![eight_days, six_days, waiting, scratch];
    all.sort();
    assert_eq!(
        task_ids(pool).await,
        all,
        "retention off: every task is kept"
    );

    // On, by default (7 days), and 1 day for the queue scratch: the loop deletes the task of
    // 8 days, with its log, and scratch's task of 2 days; the default queue keeps its task of
    // 6 days.
    sqlx::query("select sked.retention_set(p_enabled => true)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("select sked.queue_set_retention('scratch', interval '1 day', null)")
        .execute(pool)
        .await
        .unwrap();
    let running = Loop::start(sked_server::upkeep(pool));
    until_count(
        pool,
        "select count(*) from sked.tasks",
        |n| n == 2,
        Duration::from_secs(5),
    )
    .await;
    running.stop().await;
    let mut kept = vec![six_days, waiting];
    kept.sort();
    assert_eq!(
        task_ids(pool).await,
        kept,
        "a task finished within the retention, and an unfinished one, are kept"
    );
    let logs: i64 = sqlx::query_scalar("select count(*) from sked.task_logs where task_id = $1")
        .bind(eight_days)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(logs, 0, "the pruned task's logs went with it");
}

#[tokio::test]
async fn the_servers_upkeep_deletes_old_artifacts_nothing_refers_to_and_keeps_the_rest() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    sqlx::query(
        "insert into sked.artifacts (sha256, content, created_at)
         select encode(sha256(c::bytea), 'hex'), c::bytea, now() - age
           from (values ('referenced', interval '10 days'), ('orphan', interval '10 days'),
                        ('fresh', interval '1 minute')) v(c, age)",
    )
    .execute(pool)
    .await
    .unwrap();
    insert(
        pool,
        "(artifact_url, artifact_sha256)
         select 'pg:' || encode(sha256('referenced'), 'hex'), encode(sha256('referenced'), 'hex')",
    )
    .await;
    let running = Loop::start(sked_server::upkeep(pool));
    until_count(
        pool,
        "select count(*) from sked.artifacts",
        |n| n == 2,
        Duration::from_secs(5),
    )
    .await;
    running.stop().await;
    let left: Vec<Vec<u8>> =
        sqlx::query_scalar("select content from sked.artifacts order by content")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        left,
        [b"fresh".to_vec(), b"referenced".to_vec()],
        "the artifact a task refers to and the one stored a minute ago stay"
    );
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
    // 30 workflows of two tasks, cancelled eight days ago (past the 7 days by default).
    for i in 0..30 {
        let workflow: Uuid = sqlx::query_scalar(
            "select sked.workflow_submit($1, 'alice', now() - interval '9 days')",
        )
        .bind(serde_json::json!({"name": format!("w{i}"), "tasks": [
            {"name": "a", "command": ["true"]},
            {"name": "b", "command": ["true"], "depends_on": ["a"]}]}))
        .fetch_one(pool)
        .await
        .unwrap();
        sqlx::query("select sked.workflow_cancel($1, now() - interval '8 days')")
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
                    .with(Duty::PruneTasks, pool),
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
    // One snapshot: a firing a stopped loop left running in the server may still commit
    // (its ticks and their occurrences together), between two statements.
    let (runs, occurrences, noops): (i64, i64, i64) = sqlx::query_as(
        "select count(*), count(distinct task_id),
                (select count(*) from sked.tasks where kind = 'noop')
           from sked.schedule_runs where outcome = 'fired'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        (occurrences, noops),
        (runs, runs),
        "each fired tick has one occurrence, however many loops fire"
    );
}
