//! Automatic failover of PostgreSQL under a real `sked-server` and `sked-worker`: a Patroni
//! cluster of three members (`failover/cluster.rs`), both sked processes given the
//! multi-host URL with `target_session_attrs=read-write`, tasks submitted over REST in a
//! steady flow, and `kill -9` of the primary's postmaster. Patroni promotes a replica at
//! another port; the pools find it (`sked_db::hosts`) and the work goes on.
//!
//! Each task takes an exclusive, non-blocking `flock` on a lock file of its own and holds it
//! while it sleeps: an attempt that finds it held writes an `OVERLAP-…` file, so two
//! attempts of one task running at once cannot go unseen.
//!
//! One failover per test by default; `SKED_FAILOVER_REPS=5` fails over five times in a row
//! (each time the primary of the moment) and prints each one's time to recover and the
//! throughput before, during and after it. `SKED_FAILOVER_KEEP=1` keeps the cluster's and
//! processes' directories (logs) for a look afterwards.

mod cluster;

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sked::embedded_pg::PgBinaries;
use sked_db::token::Role;
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::tool;
use cluster::Cluster;

const SECS: Duration = Duration::from_secs(1);
const QUEUE: &str = "failover";
/// The worker's lease: renewed every third of it; an attempt whose lease could not be
/// renewed is stopped before it ends.
const LEASE_SECS: u32 = 4;
/// Steady flow before each kill, and how long the flow goes on after it.
const BEFORE: Duration = Duration::from_secs(5);
const AFTER: Duration = Duration::from_secs(20);
/// Submissions per second.
const RATE: u32 = 10;

/// An acknowledged submission: its task's id and when the server answered 201.
#[derive(Clone, Copy)]
struct Acked {
    id: Uuid,
    at: Instant,
}

/// A child process killed when dropped; its output goes to a file.
struct Proc {
    child: tokio::process::Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(mut cmd: tokio::process::Command, log: PathBuf) -> Proc {
        let file = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("starting a sked process");
        Proc { child, log }
    }

    /// Panics (with its log's end) if the process has exited.
    fn assert_running(&mut self, what: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "{what} exited ({status}) instead of riding out the failover; its log ends:\n{}",
                tail(&self.log)
            );
        }
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The task of submission `key`: holds its lock file while it sleeps 0.2 to 1 s; an
/// attempt that finds the lock held leaves an `OVERLAP-<key>` file and fails.
fn command(locks: &Path, key: u64) -> serde_json::Value {
    let locks = locks.display();
    let sleep = 0.2 + (key % 5) as f64 * 0.2;
    json!([
        "sh",
        "-c",
        format!(
            "exec 9>'{locks}/{key}.lock'; \
             if ! flock -n 9; then echo \"attempt of task {key} while another runs\" > '{locks}/OVERLAP-{key}'; exit 3; fi; \
             sleep {sleep:.1}"
        )
    ])
}

/// Submits `RATE` tasks a second over REST until `stop`, recording those the server
/// acknowledged.
async fn submit_until(
    api: String,
    token: String,
    locks: PathBuf,
    acked: Arc<Mutex<Vec<Acked>>>,
    refused: Arc<Mutex<u64>>,
    stop: CancellationToken,
) {
    let http = reqwest::Client::builder()
        .timeout(3 * SECS)
        .build()
        .unwrap();
    let mut tick = tokio::time::interval(SECS / RATE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut key = 0u64;
    while !stop.is_cancelled() {
        tick.tick().await;
        key += 1;
        let body = json!({
            "queue": QUEUE,
            "command": command(&locks, key),
            "max_attempts": 20,
            "backoff_base_secs": 0.2,
        });
        let answer = http
            .post(format!("{api}/api/v1/tasks"))
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await;
        let id = match answer {
            Ok(r) if r.status() == reqwest::StatusCode::CREATED => r
                .json::<serde_json::Value>()
                .await
                .ok()
                .and_then(|v| v["ids"][0].as_str()?.parse::<Uuid>().ok()),
            _ => None,
        };
        match id {
            Some(id) => acked.lock().unwrap().push(Acked {
                id,
                at: Instant::now(),
            }),
            None => *refused.lock().unwrap() += 1,
        }
    }
}

/// Succeeded tasks per second whose finish falls in `[from, to)`.
async fn rate(pool: &PgPool, from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let n: i64 = sqlx::query_scalar(
        "select count(*) from sked.tasks
          where state = 'succeeded' and finished_at >= $1 and finished_at < $2",
    )
    .bind(from)
    .bind(to)
    .fetch_one(pool)
    .await
    .expect("reading finishes");
    n as f64 / (to - from).as_seconds_f64()
}

/// What one failover measured.
struct Rep {
    leader_after: f64,
    recovered_after: f64,
    submitted_after: Option<f64>,
    before: f64,
    during: f64,
    after: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_with_synchronous_replication_loses_no_acknowledged_task() {
    scenario(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_with_asynchronous_replication_keeps_running() {
    scenario(false).await;
}

async fn scenario(synchronous: bool) {
    let what = if synchronous {
        "synchronous"
    } else {
        "asynchronous"
    };
    let Some(patroni) = tool("patroni", "apt-get install patroni") else {
        return;
    };
    let Some(etcd) = tool("etcd", "apt-get install etcd-server") else {
        return;
    };
    let bins = match PgBinaries::find(std::env::var_os("PATH").as_deref()) {
        Ok(bins) => bins,
        Err(e) => {
            eprintln!("SKIPPED: the failover test needs the PostgreSQL server binaries: {e}");
            return;
        }
    };
    // Patroni runs more of PostgreSQL's programs than sked does (pg_controldata, pg_rewind,
    // pg_basebackup): from the directory the server binary really lives in.
    let bin_dir = std::fs::canonicalize(bins.dir.join("postgres"))
        .ok()
        .and_then(|p| Some(p.parent()?.to_path_buf()))
        .unwrap_or(bins.dir.clone());
    let missing: Vec<&str> = ["pg_controldata", "pg_rewind", "pg_basebackup"]
        .into_iter()
        .filter(|p| !bin_dir.join(p).is_file())
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "SKIPPED: Patroni needs {missing:?}, which are not in {}",
            bin_dir.display()
        );
        return;
    }
    let reps: usize = std::env::var("SKED_FAILOVER_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);

    let cluster = match Cluster::start(&patroni, &etcd, &bin_dir, synchronous).await {
        Ok(c) => c,
        Err(why) => {
            let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
            assert!(!ci, "the Patroni cluster cannot run here: {why}");
            eprintln!("SKIPPED: the Patroni cluster cannot run here: {why}");
            return;
        }
    };
    let leader = cluster.wait_healthy(synchronous, 60 * SECS).await;
    {
        let admin = PgPool::connect(&cluster.member_url(leader, "postgres"))
            .await
            .expect("connecting to the leader");
        sqlx::query("create database sked")
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
    }
    let url = cluster.url("sked");
    let pool = sked_db::connect(&url, "sked-failover-test", 4)
        .await
        .expect("the multi-host URL connects to the leader");
    sked_db::migrate(&pool).await.unwrap();
    let token = sked_db::token::create(&pool, "failover", Role::User, "failover test")
        .await
        .unwrap();

    // The worker's and server's directories; tasks (run as `nobody` under a root worker)
    // write their locks to a directory anyone may write.
    let work = std::env::temp_dir().join(format!("sked-failover-work-{}", Uuid::new_v4().simple()));
    let locks = work.join("locks");
    std::fs::create_dir_all(&locks).unwrap();
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o777)).unwrap();
    let _work = RemoveOnDrop(work.clone());

    let log_filter = "info,sqlx=warn";
    let api_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let api = format!("http://127.0.0.1:{api_port}");
    let mut server = {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-server"));
        cmd.args(["--listen", &format!("127.0.0.1:{api_port}")])
            .env("DATABASE_URL", &url)
            .env("RUST_LOG", log_filter);
        Proc::spawn(cmd, work.join("server.log"))
    };
    let mut worker = {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"));
        cmd.args([
            "--queues",
            QUEUE,
            "--concurrency",
            "10",
            "--poll-secs",
            "0.2",
        ])
        .args(["--lease-secs", &LEASE_SECS.to_string(), "--work-dir"])
        .arg(work.join("worker"))
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", log_filter);
        Proc::spawn(cmd, work.join("worker.log"))
    };
    let deadline = Instant::now() + 30 * SECS;
    while tokio::net::TcpStream::connect(("127.0.0.1", api_port))
        .await
        .is_err()
    {
        server.assert_running("sked-server");
        assert!(Instant::now() < deadline, "sked-server should listen");
        tokio::time::sleep(SECS / 20).await;
    }

    let acked = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(Mutex::new(0u64));
    let stop = CancellationToken::new();
    let submitter = tokio::spawn(submit_until(
        api.clone(),
        token.clone(),
        locks.clone(),
        acked.clone(),
        refused.clone(),
        stop.clone(),
    ));
    let _stop = stop.clone().drop_guard();

    // Warm up: the worker takes its first tasks before the first window of steady flow.
    tokio::time::sleep(BEFORE).await;
    let mut measured = Vec::new();
    for rep in 1..=reps {
        let leader = cluster.wait_healthy(synchronous, 90 * SECS).await;
        tokio::time::sleep(BEFORE).await;
        worker.assert_running("sked-worker");
        server.assert_running("sked-server");
        let postmaster = cluster.postmaster(leader);
        let killed_wall = Utc::now();
        let killed_at = Instant::now();
        // SAFETY: kill has no memory preconditions; the pid is this test's leader's postmaster.
        assert_eq!(unsafe { libc::kill(postmaster, libc::SIGKILL) }, 0);
        eprintln!(
            "{what} rep {rep}: kill -9 of {}'s postmaster {postmaster}",
            cluster.members[leader].name
        );

        // Until Patroni names another leader and a task finishes on the new primary (the
        // test's pool follows it too).
        let mut leader_after = None;
        let mut recovered_after = None;
        while leader_after.is_none() || recovered_after.is_none() {
            if leader_after.is_none() && cluster.leader().await.is_some_and(|l| l != leader) {
                leader_after = Some(killed_at.elapsed().as_secs_f64());
            }
            if recovered_after.is_none() {
                let first: Option<DateTime<Utc>> = sqlx::query_scalar(
                    "select min(finished_at) from sked.tasks
                      where state = 'succeeded' and finished_at > $1",
                )
                // A finish whose transaction began in the instant before the kill may still
                // have committed on the old primary: 0.2 s later, none can.
                .bind(killed_wall + chrono::Duration::milliseconds(200))
                .fetch_one(&pool)
                .await
                .ok()
                .flatten();
                recovered_after = first.map(|first| (first - killed_wall).as_seconds_f64());
            }
            assert!(
                killed_at.elapsed() < 90 * SECS,
                "{what} rep {rep}: within 90 s Patroni should name a new leader ({leader_after:?}) \
                 and a task should finish on it ({recovered_after:?}); worker log:\n{}\n\
                 server log:\n{}",
                tail(&worker.log),
                tail(&server.log)
            );
            tokio::time::sleep(SECS / 10).await;
        }
        let (leader_after, recovered_after) = (leader_after.unwrap(), recovered_after.unwrap());
        let rest = AFTER.saturating_sub(killed_at.elapsed());
        tokio::time::sleep(rest).await;
        // The longest wait for an acknowledgement from the kill on: how long the server
        // could not take submissions.
        let submitted_after = {
            let acked = acked.lock().unwrap();
            let times: Vec<Instant> = std::iter::once(killed_at)
                .chain(acked.iter().map(|a| a.at).filter(|t| *t > killed_at))
                .collect();
            (times.len() > 1).then(|| {
                times
                    .windows(2)
                    .map(|w| (w[1] - w[0]).as_secs_f64())
                    .fold(0.0, f64::max)
            })
        };
        let k = killed_wall;
        let ten = chrono::Duration::seconds(10);
        let before = rate(&pool, k - chrono::Duration::from_std(BEFORE).unwrap(), k).await;
        let during = rate(&pool, k, k + ten).await;
        let after = rate(&pool, k + ten, k + ten + ten).await;
        eprintln!(
            "{what} rep {rep}: new leader after {leader_after:.1} s, first task finished on it \
             {recovered_after:.1} s after the kill, the server's longest wait for an acknowledgement {}; \
             succeeded tasks/s: {before:.1} in the 5 s before, {during:.1} in the 10 s after, \
             {after:.1} in the next 10 s",
            submitted_after.map_or("-".into(), |s| format!("{s:.1} s"))
        );
        measured.push(Rep {
            leader_after,
            recovered_after,
            submitted_after,
            before,
            during,
            after,
        });
        assert!(
            submitted_after.is_some(),
            "{what} rep {rep}: the server acknowledges submissions again after the failover; \
             server log:\n{}",
            tail(&server.log)
        );
    }
    stop.cancel();
    submitter.await.unwrap();
    worker.assert_running("sked-worker");
    server.assert_running("sked-server");

    // Every acknowledged submission that the new primary has ends succeeded.
    let acked: Vec<Uuid> = acked.lock().unwrap().iter().map(|a| a.id).collect();
    let deadline = Instant::now() + 90 * SECS;
    let (found, succeeded) = loop {
        let (found, succeeded): (i64, i64) = sqlx::query_as(
            "select count(*), count(*) filter (where state = 'succeeded')
               from sked.tasks where id = any($1)",
        )
        .bind(&acked)
        .fetch_one(&pool)
        .await
        .unwrap();
        if found == succeeded {
            break (found, succeeded);
        }
        let states: Vec<(String, i64)> = sqlx::query_as(
            "select state, count(*) from sked.tasks where id = any($1) group by 1 order by 1",
        )
        .bind(&acked)
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(
            Instant::now() < deadline,
            "{what}: every acknowledged task should end succeeded; by state: {states:?}; \
             worker log:\n{}",
            tail(&worker.log)
        );
        tokio::time::sleep(SECS / 5).await;
    };
    let lost = acked.len() as i64 - found;
    let overlaps: Vec<String> = std::fs::read_dir(&locks)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.starts_with("OVERLAP-").then_some(name)
        })
        .collect();
    let concurrent: i64 = sqlx::query_scalar(
        "select count(*) from sked.task_attempt_history a
           join sked.task_attempt_history b
             on b.task_id = a.task_id and b.attempt > a.attempt and b.started_at < a.finished_at
          where a.task_id = any($1)",
    )
    .bind(&acked)
    .fetch_one(&pool)
    .await
    .unwrap();
    let retried: i64 =
        sqlx::query_scalar("select count(*) from sked.tasks where id = any($1) and attempt > 1")
            .bind(&acked)
            .fetch_one(&pool)
            .await
            .unwrap();
    eprintln!(
        "{what}: {} submissions acknowledged ({} not), {found} on the last primary, {lost} lost, \
         {succeeded} succeeded, {retried} needed more than one attempt",
        acked.len(),
        refused.lock().unwrap()
    );
    for (i, r) in measured.iter().enumerate() {
        eprintln!(
            "{what} | rep {} | leader {:.1} s | recovered {:.1} s | submission gap {} | tasks/s before {:.1} | during {:.1} | after {:.1}",
            i + 1,
            r.leader_after,
            r.recovered_after,
            r.submitted_after
                .map_or("-".into(), |s| format!("{s:.1} s")),
            r.before,
            r.during,
            r.after
        );
    }
    assert!(
        overlaps.is_empty(),
        "{what}: two attempts of a task ran at once: {overlaps:?}"
    );
    assert_eq!(
        concurrent, 0,
        "{what}: no attempt of a task starts before the one before it has ended"
    );
    if synchronous {
        assert_eq!(
            lost, 0,
            "with synchronous replication every acknowledged submission is on the new primary"
        );
    }
    assert!(found > 0 && succeeded == found);
    for r in &measured {
        assert!(
            r.after > 0.0,
            "{what}: the worker works after each failover"
        );
    }
    pool.close().await;
    drop(worker);
    drop(server);
    drop(cluster);
}

/// Removes a directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if std::env::var_os("SKED_FAILOVER_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
