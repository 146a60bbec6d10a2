//! Crash tests of PostgreSQL itself: `kill -9` of the postmaster while a worker runs tasks
//! loses no task. The test runs its own private cluster (the code of `sked dev`), so killing
//! it disturbs no other test; it is skipped when no PostgreSQL server binaries are installed.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sked::embedded_pg::{Cluster, PgBinaries};
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

use crate::support::{config, process_alive, start_worker_on};

const SECS: Duration = Duration::from_secs(1);
const TASKS: i64 = 200;
/// How long PostgreSQL stays down after the `kill -9`.
const DOWNTIME: Duration = Duration::from_secs(12);

/// A private cluster that is stopped (`pg_ctl stop -m immediate`) and removed when dropped,
/// also when the test fails.
struct PgGuard {
    bins: PgBinaries,
    root: PathBuf,
    data_dir: PathBuf,
}

impl PgGuard {
    /// Runs `pg_ctl <args> -D <data dir>` as the owner of the data directory (PostgreSQL
    /// refuses to run as root).
    fn pg_ctl(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        let mut cmd = std::process::Command::new(self.bins.dir.join("pg_ctl"));
        cmd.args(args)
            .arg("-D")
            .arg(&self.data_dir)
            .current_dir("/")
            .stdin(std::process::Stdio::null());
        if let Ok(meta) = std::fs::metadata(&self.data_dir)
            && meta.uid() != 0
        {
            cmd.uid(meta.uid()).gid(meta.gid());
        }
        cmd.output()
    }
}

impl Drop for PgGuard {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "30"]);
        let _ = std::fs::remove_dir_all(&self.data_dir);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Starts the cluster, retrying while the processes of a killed one are still going away.
async fn start(bins: &PgBinaries, data_dir: &Path) -> Cluster {
    let deadline = Instant::now() + 30 * SECS;
    loop {
        match Cluster::start(bins, data_dir).await {
            Ok(cluster) => return cluster,
            Err(e) if Instant::now() < deadline => {
                eprintln!("starting the private cluster failed, retrying: {e}");
                tokio::time::sleep(SECS / 2).await;
            }
            Err(e) => panic!("the private cluster should start: {e}"),
        }
    }
}

/// Pids of live processes whose working directory is `dir` (PostgreSQL's processes work in
/// their data directory).
fn processes_in(dir: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir))
        .filter(|pid| process_alive(*pid))
        .collect()
}

/// Task counts by state; `None` while the database does not answer.
async fn counts(pool: &PgPool) -> Option<BTreeMap<String, i64>> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("select state, count(*) from sked.tasks group by state")
            .fetch_all(pool)
            .await
            .ok()?;
    Some(rows.into_iter().collect())
}

/// Waits until `done` holds for the task counts; panics with the last counts after `within`.
async fn wait_counts(
    pool: &PgPool,
    what: &str,
    within: Duration,
    done: impl Fn(&BTreeMap<String, i64>) -> bool,
) -> BTreeMap<String, i64> {
    let deadline = Instant::now() + within;
    let mut last = None;
    loop {
        if let Some(c) = counts(pool).await {
            if done(&c) {
                return c;
            }
            last = Some(c);
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}; task counts by state: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn kill_9_of_postgres_loses_no_task() {
    let bins = match PgBinaries::find(std::env::var_os("PATH").as_deref()) {
        Ok(bins) => bins,
        Err(e) => {
            eprintln!("SKIPPED: the crash test needs the PostgreSQL server binaries: {e}");
            return;
        }
    };
    // The worker's events go to the test's output (shown when it fails).
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "sked_worker=info".into());
    let _log = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .finish(),
    );

    let root = std::env::temp_dir().join(format!("sked-recovery-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&root).unwrap();
    let data_dir = root.join("postgres");
    let mut guard = PgGuard {
        bins: bins.clone(),
        root: root.clone(),
        data_dir: data_dir.clone(),
    };
    let cluster = start(&bins, &data_dir).await;
    // The data directory may have moved (see `Cluster::notes`); the guard follows it.
    guard.data_dir = cluster.data_dir.clone();
    let data_dir = cluster.data_dir.clone();
    // The cluster must come back on the same port (the worker's pool knows no other). A new
    // cluster prefers a fixed default port that other private clusters want too, so move
    // this one to a free port of its own: the restart reuses the port of the last start.
    cluster.stop().await.expect("stopping the new cluster");
    let own_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    std::fs::write(data_dir.join("sked-port"), format!("{own_port}\n")).unwrap();
    let cluster = start(&bins, &data_dir).await;
    assert_eq!(cluster.port, own_port, "the cluster takes the saved port");

    cluster.ensure_database("sked").await.unwrap();
    let url = cluster.url("sked");
    let pool = sked_db::connect(&url, "sked-test", 4).await.unwrap();
    sked_db::migrate(&pool).await.unwrap();
    let worker_pool = sked_db::connect(&url, "sked-worker", 10).await.unwrap();
    let mut cfg = config(&["default"]);
    cfg.lease = 2 * SECS;
    cfg.poll_interval = Duration::from_millis(200);
    let worker = start_worker_on(&worker_pool, cfg);

    let inserted = sqlx::query(
        "insert into sked.tasks (kind, command)
         select case when i % 2 = 0 then 'noop' else 'command' end,
                case when i % 2 = 0 then null else array['sh', '-c', 'sleep 0.2'] end
           from generate_series(1, $1) as i",
    )
    .bind(TASKS)
    .execute(&pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(inserted, TASKS as u64);

    let before = wait_counts(&pool, "tasks should be running", 30 * SECS, |c| {
        c.get("succeeded").copied().unwrap_or(0) >= 20 && c.get("running").copied().unwrap_or(0) > 0
    })
    .await;

    let pid_file = std::fs::read_to_string(data_dir.join("postmaster.pid")).unwrap();
    let postmaster: i32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
    // SAFETY: kill has no memory preconditions; the pid is the postmaster of this test's cluster.
    assert_eq!(
        unsafe { libc::kill(postmaster, libc::SIGKILL) },
        0,
        "kill -9 {postmaster}"
    );
    eprintln!("killed the postmaster {postmaster} (kill -9); task counts before: {before:?}");
    // The server's other processes notice that the postmaster died and exit; a new
    // postmaster refuses to start while they hold the shared memory.
    let killed_at = Instant::now();
    let deadline = killed_at + 30 * SECS;
    while !processes_in(&data_dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the processes of the killed cluster should exit: {:?}",
            processes_in(&data_dir)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Down for longer than the lease, so leases expire, and longer than the 10 s a pool waits
    // for a connection (`sked_db::connect`), so the worker's statements fail instead of only
    // stalling until the server is back: claims, heartbeats, rescues, results and LISTEN.
    eprintln!(
        "the killed cluster's processes are gone after {:?}",
        killed_at.elapsed()
    );
    tokio::time::sleep(DOWNTIME).await;

    let cluster = start(&bins, &data_dir).await;
    assert_eq!(
        cluster.port, own_port,
        "the restarted cluster listens where the worker connects"
    );
    let restarted_at: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("select now()")
        .fetch_one(&pool)
        .await
        .expect("the test's pool reconnects after the restart");
    eprintln!(
        "restarted the cluster {:?} after the kill",
        killed_at.elapsed()
    );

    let after = wait_counts(
        &pool,
        "after kill -9 of PostgreSQL, every task should end succeeded (none lost, none stuck)",
        60 * SECS,
        |c| c.get("succeeded") == Some(&TASKS),
    )
    .await;
    assert_eq!(
        after.values().sum::<i64>(),
        TASKS,
        "no task is lost: {after:?}"
    );

    let over: i64 =
        sqlx::query_scalar("select count(*) from sked.tasks where attempt > max_attempts")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(over, 0, "no task runs more attempts than max_attempts");
    let attempts: Vec<(i32, i64)> = sqlx::query_as(
        "select attempt, count(*) from sked.tasks group by attempt order by attempt",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    eprintln!("tasks by attempt count: {attempts:?}");
    let not_once: i64 = sqlx::query_scalar(
        "select count(*) from (select task_id from sked.task_attempt_history
                                 group by task_id
                                having count(*) filter (where outcome = 'succeeded') <> 1) x",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        not_once, 0,
        "every task's history holds exactly one successful attempt"
    );

    // The worker reconnected: it renews its registry row and listens again.
    let deadline = Instant::now() + 15 * SECS;
    loop {
        let alive: bool = sqlx::query_scalar(
            "select coalesce(bool_and(heartbeat_at > $1 and stopping_at is null), false)
               from sked.workers",
        )
        .bind(restarted_at)
        .fetch_one(&pool)
        .await
        .unwrap();
        let listening: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
              where datname = current_database() and query ilike 'listen%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if alive && listening > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after the restart the worker should heartbeat (alive: {alive}) and LISTEN again \
             (listening sessions: {listening})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !worker.handle.as_ref().unwrap().is_finished(),
        "the worker is still running after the crash"
    );

    worker.shutdown().await;
    let workers: i64 = sqlx::query_scalar("select count(*) from sked.workers")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(workers, 0, "the worker shuts down cleanly and deregisters");
    worker_pool.close().await;
    pool.close().await;
    drop(guard);
}
