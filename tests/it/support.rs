//! Test helpers shared by the modules: an in-process worker and waiting for task states.

use std::time::Duration;

use sked_db::testing::TestDb;
use sked_worker::WorkerConfig;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// A worker running in this process until dropped or stopped.
pub struct TestWorker {
    pub stop: CancellationToken,
    pub handle: Option<tokio::task::JoinHandle<Result<(), sked_worker::WorkerError>>>,
}

impl TestWorker {
    /// Stops the worker (as on SIGTERM) and waits until it has deregistered.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(h) = self.handle.take() {
            h.await
                .expect("worker task")
                .expect("worker shut down cleanly");
        }
    }
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A worker configuration for tests: fast polls, short grace periods, a private work dir.
pub fn config(queues: &[&str]) -> WorkerConfig {
    let mut c = WorkerConfig::for_queues(queues);
    c.poll_interval = Duration::from_millis(200);
    c.kill_grace = Duration::from_millis(500);
    c.shutdown_grace = Duration::from_secs(2);
    c.work_dir = std::env::temp_dir().join(format!("sked-test-{}", Uuid::new_v4().simple()));
    c
}

pub fn start_worker(db: &TestDb, config: WorkerConfig) -> TestWorker {
    start_worker_on(&db.pool, config)
}

/// A worker on any pool (a database of a test's own PostgreSQL cluster, say).
pub fn start_worker_on(pool: &PgPool, config: WorkerConfig) -> TestWorker {
    let stop = CancellationToken::new();
    let handle = tokio::spawn(sked_worker::run(pool.clone(), config, stop.clone()));
    TestWorker {
        stop,
        handle: Some(handle),
    }
}

/// Inserts a task with plain SQL (`insert into sked.tasks <columns_and_values>`).
pub async fn insert(pool: &PgPool, columns_and_values: &str) -> Uuid {
    let sql = format!("insert into sked.tasks {columns_and_values} returning id");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .expect("inserting a task")
}

/// The id of the task named `name` in a workflow.
pub async fn task_id(pool: &PgPool, workflow: Uuid, name: &str) -> Uuid {
    sqlx::query_scalar("select id from sked.tasks where workflow_id = $1 and name = $2")
        .bind(workflow)
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

pub async fn state(pool: &PgPool, id: Uuid) -> String {
    sqlx::query_scalar("select state from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("reading a task's state")
}

/// Waits until the task is in one of `states`; panics with the last state after `within`.
pub async fn wait_for(pool: &PgPool, id: Uuid, states: &[&str], within: Duration) -> String {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let s = state(pool, id).await;
        if states.contains(&s.as_str()) {
            return s;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("task {id} should reach one of {states:?} within {within:?}, but is {s}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// True while a process with this pid exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    // Bytes, not text: a process's name (on the `Name:` line) may be any bytes.
    match std::fs::read(format!("/proc/{pid}/status")) {
        Ok(status) => !status.split(|b| *b == b'\n').any(|l| {
            l.starts_with(b"State:") && (l.ends_with(b"Z (zombie)") || l.ends_with(b"X (dead)"))
        }),
        Err(_) => false,
    }
}

/// Waits for a file to exist and hold a pid.
pub async fn read_pid(path: &std::path::Path, within: Duration) -> i32 {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pid appeared in {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The program `name` from the PATH, or `None` after printing why the test that needs it does
/// not run. In CI (`CI` set) a missing program fails the test instead: `.ci/run` installs it
/// (`install` says how).
pub fn tool(name: &str, install: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
        assert!(
            !ci,
            "{name} is not on the PATH: CI must run this test ({install} in .ci/run)"
        );
        eprintln!("SKIPPED: {name} is not on the PATH, so this test does not run ({install})");
    }
    found
}

/// SIGTERM to a process started with its stderr piped, then its exit status and stderr.
pub async fn stop(child: tokio::process::Child) -> (std::process::ExitStatus, String) {
    Logged::reading(child).stop().await
}

/// A process whose stderr is read as it comes, until [`Logged::stop`]: a pipe that nobody
/// reads fills at 64 KiB, and the process then blocks at its next log line (a server's
/// runtime stops answering mid-request, holding its transactions open).
pub struct Logged {
    pub child: tokio::process::Child,
    stderr: tokio::task::JoinHandle<String>,
}

impl Logged {
    /// Spawns `command` with its stderr piped and read.
    pub fn spawn(command: &mut tokio::process::Command) -> Logged {
        let what = format!("{:?}", command.as_std().get_program());
        let child = command
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        Logged::reading(child)
    }

    /// Reads the stderr of `child`, started with it piped, from now on.
    pub fn reading(mut child: tokio::process::Child) -> Logged {
        use tokio::io::AsyncReadExt as _;
        let mut pipe = child.stderr.take().expect("stderr piped");
        let stderr = tokio::spawn(async move {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes).await;
            String::from_utf8_lossy(&bytes).into_owned()
        });
        Logged { child, stderr }
    }

    /// SIGTERM, then the exit status and everything the process wrote to stderr.
    pub async fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = self.child.id().expect("running") as i32;
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("the process stops")
            .unwrap();
        (status, self.stderr.await.expect("reading stderr"))
    }
}

/// A TCP port free on 127.0.0.1 now, for a server a test starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
