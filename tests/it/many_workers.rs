//! Several real `sked-worker` processes on one queue: every task runs exactly once and the
//! processes share the tasks. What idle workers cost the database is a rate, measured by
//! `sked-bench w17` (bench/README.md), not asserted here: a loaded machine running the suite
//! bends it.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sked_db::testing::TestDb;
use sqlx::PgPool;
use tokio::time::Instant;

/// Worker processes started by the test; killed when dropped (a failed assertion too).
struct Workers(Vec<Child>);

impl Workers {
    fn start(db: &TestDb, n: usize, concurrency: usize) -> Workers {
        let children = (0..n)
            .map(|_| {
                let work_dir =
                    std::env::temp_dir().join(format!("sked-many-{}", uuid::Uuid::new_v4()));
                Command::new(env!("CARGO_BIN_EXE_sked-worker"))
                    .env("DATABASE_URL", &db.url)
                    .env_remove("RUST_LOG")
                    .args(["--concurrency", &concurrency.to_string()])
                    .arg("--work-dir")
                    .arg(&work_dir)
                    .args(["--shutdown-grace-secs", "5"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("starting sked-worker")
            })
            .collect();
        Workers(children)
    }

    /// SIGTERM to each, then waits for its clean exit.
    fn stop(mut self) {
        for child in &self.0 {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        for child in &mut self.0 {
            let status = child.wait().expect("waiting for a worker");
            assert!(status.success(), "a worker exited with {status}");
        }
        self.0.clear();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn scalar(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn worker_processes_share_a_queue_and_run_each_task_once() {
    // Eight processes of four slots (each a pool of at most ten connections).
    const WORKERS: usize = 8;
    const TASKS: i64 = 4000;
    let db = TestDb::new().await;
    let workers = Workers::start(&db, WORKERS, 4);
    let deadline = Instant::now() + Duration::from_secs(20);
    while scalar(&db.pool, "select count(*) from sked.workers").await < WORKERS as i64 {
        assert!(Instant::now() < deadline, "the workers registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    sqlx::query("insert into sked.tasks (kind) select 'noop' from generate_series(1, $1)")
        .bind(TASKS)
        .execute(&db.pool)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while scalar(
        &db.pool,
        "select count(*) from sked.tasks where finished_at is null",
    )
    .await
        > 0
    {
        assert!(Instant::now() < deadline, "the workers drained the queue");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Each task ran exactly once: one claim (its attempt counts claims), one success, and no
    // other attempt recorded.
    let (succeeded, once, attempts): (i64, i64, i64) = sqlx::query_as(
        "select count(*) filter (where state = 'succeeded'),
                count(*) filter (where attempt = 1),
                (select count(*) from sked.task_attempts)
           from sked.tasks",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (succeeded, once, attempts),
        (TASKS, TASKS, 0),
        "every task succeeded on its one attempt"
    );

    // Every process took a fair part: at least a quarter of an even share (a process that
    // lost its CPU for a while still claims whenever it has free slots).
    let per_worker: Vec<i64> = sqlx::query_scalar(
        "select count(t.id) from sked.workers w left join sked.tasks t on t.worker_id = w.id
          group by w.id order by 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let even = TASKS / WORKERS as i64;
    assert_eq!(per_worker.len(), WORKERS, "every worker is registered");
    assert_eq!(per_worker.iter().sum::<i64>(), TASKS);
    assert!(
        per_worker.iter().all(|&n| n >= even / 4),
        "each worker ran at least a quarter of an even share ({even}): {per_worker:?}"
    );

    workers.stop();
}
