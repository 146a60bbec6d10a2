//! No task process outlives its worker: what a task starts (backgrounded, `setsid`'d,
//! double-forked) is killed when its attempt ends, when the worker shuts down, and, after a
//! `kill -9` of the worker, by the next worker started with the same work dir. Each test runs
//! the `sked-worker` binary and finds the tasks' processes in `/proc` by a marker argument
//! (`sleep 300.<marker>`).

use std::time::Duration;

use sked_db::testing::TestDb;
use tokio::time::Instant;
use uuid::Uuid;

use crate::support::{insert, process_alive, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// A `sked-worker` process with the work dir `work`, and the markers of the processes its
/// tasks start; dropping it kills the worker and every marked process still alive, so a
/// failed test leaves nothing running.
struct Host {
    work: std::path::PathBuf,
    workers: Vec<std::process::Child>,
    /// The sleeps' arguments, unique to this test run: `300.<digits>`.
    markers: Vec<String>,
}

impl Host {
    fn new(markers: usize) -> Host {
        let run = Uuid::new_v4().as_u128() % 1_000_000_000;
        Host {
            work: std::env::temp_dir().join(format!("sked-orphans-{}", Uuid::new_v4().simple())),
            workers: Vec::new(),
            markers: (0..markers).map(|i| format!("300.{run}{i}")).collect(),
        }
    }

    /// Starts a worker on the host's work dir.
    fn start_worker(&mut self, db: &TestDb) -> &mut std::process::Child {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"))
            .env("DATABASE_URL", &db.url)
            .env_remove("RUST_LOG")
            .args([
                "--poll-secs",
                "0.2",
                "--kill-grace-secs",
                "0.5",
                "--shutdown-grace-secs",
                "0.5",
                "--work-dir",
            ])
            .arg(&self.work)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting sked-worker");
        self.workers.push(child);
        self.workers.last_mut().expect("just pushed")
    }

    /// The pids of the live processes that have `marker` as an argument.
    fn pids_of(marker: &str) -> Vec<i32> {
        let Ok(proc) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        proc.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                    cmdline
                        .split(|b| *b == 0)
                        .any(|arg| arg == marker.as_bytes())
                })
            })
            .filter(|pid| process_alive(*pid))
            .collect()
    }

    /// The markers whose processes are alive.
    fn alive(&self, markers: &[&String]) -> Vec<String> {
        markers
            .iter()
            .filter(|m| !Host::pids_of(m).is_empty())
            .map(|m| m.to_string())
            .collect()
    }

    /// Waits until every one of `markers` has a live process.
    async fn wait_alive(&self, markers: &[&String], within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let alive = self.alive(markers);
            if alive.len() == markers.len() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the tasks' processes should start within {within:?}: alive {alive:?} of {markers:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until none of `markers` has a live process; answers those still alive after
    /// `within`.
    async fn wait_gone(&self, markers: &[&String], within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        loop {
            let alive = self.alive(markers);
            if alive.is_empty() || Instant::now() >= deadline {
                return alive;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
        for marker in &self.markers {
            for pid in Host::pids_of(marker) {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// Inserts a task running `sh -c script`.
async fn sh(db: &TestDb, script: &str) -> Uuid {
    insert(
        &db.pool,
        &format!("(command) values (array['sh', '-c', '{script}'])"),
    )
    .await
}

#[tokio::test]
async fn a_killed_workers_task_processes_are_killed_by_the_next_worker_on_the_host() {
    let db = TestDb::new().await;
    let mut host = Host::new(4);
    let [bg, fg, setsid, leader] = [0, 1, 2, 3].map(|i| host.markers[i].clone());
    host.start_worker(&db);
    let backgrounded = sh(&db, &format!("sleep {bg} & sleep {fg}")).await;
    let escaped = sh(&db, &format!("setsid sleep {setsid} & exec sleep {leader}")).await;
    for id in [backgrounded, escaped] {
        wait_for(&db.pool, id, &["running"], 20 * SECS).await;
    }
    host.wait_alive(&[&bg, &fg, &setsid, &leader], 10 * SECS)
        .await;
    // Longer than the worker's sampling interval, so it has seen every process.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let victim = &mut host.workers[0];
    victim.kill().expect("kill -9 the worker");
    victim.wait().expect("the killed worker is reaped");
    // The leader dies with its worker (parent-death signal); what it started does not.
    let left = host.wait_gone(&[&leader], 5 * SECS).await;
    assert!(
        left.is_empty(),
        "a task's leader dies with its worker: {left:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let orphans = host.alive(&[&bg, &fg, &setsid]);
    assert_eq!(
        orphans.len(),
        3,
        "after kill -9 of the worker its tasks' other processes still run (so the next worker \
         has something to kill): alive {orphans:?}"
    );

    host.start_worker(&db);
    let left = host.wait_gone(&[&bg, &fg, &setsid], 5 * SECS).await;
    assert!(
        left.is_empty(),
        "the next worker started with the same work dir kills every process a killed worker's \
         tasks left (backgrounded, foreground child, setsid'd): still alive {left:?}"
    );
}

#[tokio::test]
async fn a_setsid_grandchild_is_killed_when_its_task_exits() {
    let db = TestDb::new().await;
    let mut host = Host::new(3);
    let [direct, bg, double] = [0, 1, 2].map(|i| host.markers[i].clone());
    host.start_worker(&db);
    // The leader is `setsid` itself, which forks the sleep into a new session and exits.
    let leader_forks = insert(
        &db.pool,
        &format!("(command) values (array['setsid', 'sleep', '{direct}'])"),
    )
    .await;
    // A backgrounded child, and a double-forked one in its own session (given the time to
    // leave the group before the shell exits).
    let shell = sh(
        &db,
        &format!("sleep {bg} & (setsid sleep {double} &); sleep 0.5; echo started"),
    )
    .await;
    for id in [leader_forks, shell] {
        wait_for(&db.pool, id, &["succeeded"], 20 * SECS).await;
    }
    let left = host.wait_gone(&[&direct, &bg, &double], 3 * SECS).await;
    assert!(
        left.is_empty(),
        "when a task's attempt ends, every process it started is killed, setsid'd and \
         double-forked ones included: still alive {left:?}"
    );
}

/// A process's name (`/proc/<pid>/stat`'s second field) is the first 15 bytes of the file it
/// runs, which a task chooses: bytes that are not UTF-8 must not hide it from tracking.
#[tokio::test]
async fn a_setsid_process_named_with_bytes_that_are_not_utf8_is_killed_when_its_task_exits() {
    let db = TestDb::new().await;
    let mut host = Host::new(1);
    let hidden = host.markers[0].clone();
    host.start_worker(&db);
    let id = sh(
        &db,
        &format!(
            r#"n=$(printf "\377\376x"); cp "$(command -v sleep)" "./$n" && setsid "./$n" {hidden} & sleep 1; echo started"#
        ),
    )
    .await;
    wait_for(&db.pool, id, &["running"], 20 * SECS).await;
    host.wait_alive(&[&hidden], 10 * SECS).await;
    wait_for(&db.pool, id, &["succeeded"], 20 * SECS).await;
    let left = host.wait_gone(&[&hidden], 3 * SECS).await;
    assert!(
        left.is_empty(),
        "a setsid'd process whose name is not UTF-8 is killed when its task exits: still \
         alive {left:?}"
    );
}

#[tokio::test]
async fn a_worker_shut_down_by_sigterm_kills_every_process_of_its_tasks() {
    let db = TestDb::new().await;
    let mut host = Host::new(2);
    let [escaped, fg] = [0, 1].map(|i| host.markers[i].clone());
    host.start_worker(&db);
    let id = sh(&db, &format!("setsid sleep {escaped} & sleep {fg}")).await;
    wait_for(&db.pool, id, &["running"], 20 * SECS).await;
    host.wait_alive(&[&escaped, &fg], 10 * SECS).await;

    let worker = &mut host.workers[0];
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(worker.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + 15 * SECS;
    while worker.try_wait().expect("polling the worker").is_none() {
        assert!(
            Instant::now() < deadline,
            "a worker shut down by SIGTERM stops within its grace periods: no process its \
             tasks started keeps it waiting"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left = host.wait_gone(&[&escaped, &fg], 3 * SECS).await;
    assert!(
        left.is_empty(),
        "a worker shut down by SIGTERM kills every process of the tasks it stops, setsid'd \
         ones included: still alive {left:?}"
    );
}

#[tokio::test]
async fn an_embedded_worker_kills_a_setsid_process_it_sampled_when_its_task_exits() {
    let db = TestDb::new().await;
    let host = Host::new(1);
    let escaped = host.markers[0].clone();
    // Embedded in this test process: tracking by samples only, no subreaper.
    let worker = crate::support::start_worker(&db, crate::support::config(&["default"]));
    // The shell outlives a few samples, so the worker has seen the process it set free.
    let id = sh(&db, &format!("setsid sleep {escaped} & sleep 0.5")).await;
    wait_for(&db.pool, id, &["succeeded"], 20 * SECS).await;
    let left = host.wait_gone(&[&escaped], 3 * SECS).await;
    assert!(
        left.is_empty(),
        "an embedded worker kills a setsid'd process of a task it has sampled when the task \
         exits: still alive {left:?}"
    );
    worker.shutdown().await;
}
