//! A lease is held locally: a worker cut off from PostgreSQL (by a TCP proxy inside the test
//! that blackholes its connections) stops its attempts before their leases end, so a worker
//! that rescues the task never runs it beside the first copy, and a renewal of an expired
//! lease is refused by the database.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sked_db::testing::TestDb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use uuid::Uuid;

use crate::support::{TestWorker, config, insert, start_worker, start_worker_on, state, wait_for};

const SECS: Duration = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(2);

/// A TCP proxy to the PostgreSQL of the tests. While cut, it blackholes every connection:
/// bytes are neither forwarded nor answered, and new connections are accepted and left
/// hanging, as on a network that drops packets. While it loses replies to a statement, a
/// connection that sends bytes holding a marker (a bound value of that statement) still
/// forwards what the client sends, and drops what the server answers. When restored, the
/// connections that lived through the cut are closed (as a peer's reset would), and new ones
/// are forwarded.
struct Proxy {
    port: u16,
    state: Arc<watch::Sender<Link>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the proxy");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(watch::Sender::new(Link {
            cut: Cut::Open,
            generation: 0,
        }));
        let upstream = upstream_addr();
        let accept = tokio::spawn({
            let state = state.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let rx = state.subscribe();
                    let upstream = upstream.clone();
                    tokio::spawn(async move {
                        let generation = rx.borrow().generation;
                        let Ok(server) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        let losing = Arc::new(AtomicBool::new(false));
                        tokio::join!(
                            pump(
                                cr,
                                sw,
                                rx.clone(),
                                generation,
                                Side::Requests(losing.clone())
                            ),
                            pump(sr, cw, rx, generation, Side::Replies(losing))
                        );
                    });
                }
            }
        });
        Proxy {
            port,
            state,
            accept,
        }
    }

    fn url(&self, db: &TestDb) -> String {
        // Plain text: the proxy reads the replies it drops (what TLS would hide).
        format!(
            "postgres://postgres@127.0.0.1:{}/{}?sslmode=disable",
            self.port, db.name
        )
    }

    fn cut(&self) {
        self.state.send_modify(|s| s.cut = Cut::Both);
    }

    fn lose_replies_after(&self, marker: &'static [u8]) {
        self.state
            .send_modify(|s| s.cut = Cut::RepliesAfter(marker));
    }

    fn restore(&self) {
        self.state.send_modify(|s| {
            *s = Link {
                cut: Cut::Open,
                generation: s.generation + 1,
            }
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.restore();
    }
}

/// The host and port of the tests' PostgreSQL.
fn upstream_addr() -> String {
    let url = url::Url::parse(&sked_db::testing::admin_url()).expect("DATABASE_URL is a URL");
    format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port().unwrap_or(5432)
    )
}

/// What the proxy lets through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Open,
    /// Nothing passes.
    Both,
    /// Requests reach the server; the replies on a connection are dropped from its first
    /// request holding the marker on.
    RepliesAfter(&'static [u8]),
}

/// A direction of a connection, sharing whether its replies are being lost.
enum Side {
    Requests(Arc<AtomicBool>),
    Replies(Arc<AtomicBool>),
}

/// The proxy's state: a connection belongs to the generation it was accepted in and is
/// closed when the generation changes.
#[derive(Debug, Clone, Copy)]
struct Link {
    cut: Cut,
    generation: u64,
}

/// Copies one direction of a connection while the proxy lets it through; drops what arrives
/// while it does not; returns (closing this direction) at the end of the stream or when the
/// connection's generation is over.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<Link>,
    generation: u64,
    side: Side,
) {
    let mut buf = vec![0u8; 64 * 1024];
    let blocked = |link: Link, bytes: &[u8]| match (&side, link.cut) {
        (_, Cut::Open) => false,
        (_, Cut::Both) => true,
        (Side::Requests(losing), Cut::RepliesAfter(marker)) => {
            if bytes.windows(marker.len()).any(|w| w == marker) {
                losing.store(true, Ordering::SeqCst);
            }
            false
        }
        (Side::Replies(losing), Cut::RepliesAfter(_)) => losing.load(Ordering::SeqCst),
    };
    loop {
        let link = *state.borrow_and_update();
        if link.generation != generation {
            return;
        }
        if link.cut == Cut::Both {
            // Neither read nor forwarded: the peer's bytes wait in the socket, unanswered.
            if state.changed().await.is_err() {
                return;
            }
            continue;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = state.changed() => continue,
        };
        let link = *state.borrow();
        if link.generation != generation {
            return;
        }
        if !blocked(link, &buf[..n]) && to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A directory every user may write to, for the records of tasks run as `nobody`.
fn shared_dir() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("sked-lease-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// A task that records, in `dir`, its pid (`pid-<attempt>`) and its start time on its own
/// clock (`start-<attempt>`). Its first attempt ignores SIGTERM and writes the time to
/// `alive-1` every 20 ms for at most `first_secs`; later attempts run `later_secs` and write
/// `end-<attempt>`.
fn recording_task(dir: &Path, first_secs: u32, later_secs: f64) -> String {
    let d = dir.display();
    let script = format!(
        "a=$SKED_ATTEMPT; echo $$ > {d}/pid-$a; date +%s.%N > {d}/start-$a; \
         if [ \"$a\" = 1 ]; then trap '' TERM; end=$(( $(date +%s) + {first_secs} )); \
         while [ $(date +%s) -lt $end ]; do date +%s.%N >> {d}/alive-1; sleep 0.02; done; \
         else sleep {later_secs}; date +%s.%N > {d}/end-$a; fi"
    );
    let script = script.replace('\'', "''");
    format!("(queue, command) values ('lease', array['sh', '-c', '{script}'])")
}

/// The seconds since the epoch written by a task (its own clock), one per line.
fn stamps(path: &Path) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn epoch_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// True while any process of the process group `pgid` exists and is not a zombie.
fn group_alive(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|e| {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            return false;
        };
        // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            return false;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        fields.len() > 2 && fields[2] == pgid.to_string() && !matches!(fields[0], "Z" | "X")
    })
}

/// Watches the process group `pgid` every 5 ms and returns when it was first seen gone
/// (seconds since the epoch), or `None` if it still lives after `within`.
async fn watch_group_end(pgid: i32, within: Duration) -> Option<f64> {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if !group_alive(pgid) {
            return Some(epoch_now());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

async fn wait_for_file(path: &Path, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} should appear within {within:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A worker on the `lease` queue with the lease `lease`, connected through `url`.
async fn lease_worker(url: &str, lease: Duration) -> TestWorker {
    let pool = sked_db::connect(url, "sked-worker", 10)
        .await
        .expect("connecting the worker");
    let mut c = config(&["lease"]);
    c.lease = lease;
    c.kill_grace = Duration::from_millis(300);
    c.poll_interval = Duration::from_millis(100);
    start_worker_on(&pool, c)
}

/// The pid a task wrote.
fn pid_in(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{} holds a pid", path.display()))
}

/// One cut: worker A (through the proxy) runs the first attempt, the proxy is cut for the
/// lease plus 1 s, worker B (direct) rescues the task and runs the second attempt. Returns
/// (when the first copy's group was seen gone, its last sign of life, the second's start).
async fn one_cut(db: &TestDb, proxy: &Proxy) -> (Option<f64>, f64, f64) {
    let dir = shared_dir();
    let id = insert(&db.pool, &recording_task(&dir, 12, 0.3)).await;
    let a = lease_worker(&proxy.url(db), LEASE).await;
    wait_for_file(&dir.join("start-1"), 10 * SECS).await;
    let pgid = pid_in(&dir.join("pid-1"));
    let gone = tokio::spawn(watch_group_end(pgid, 15 * SECS));
    let b = start_worker(db, {
        let mut c = config(&["lease"]);
        c.lease = LEASE;
        c.kill_grace = Duration::from_millis(300);
        c.poll_interval = Duration::from_millis(100);
        c
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.cut();
    tokio::time::sleep(LEASE + SECS).await;
    proxy.restore();
    wait_for(&db.pool, id, &["succeeded"], 15 * SECS).await;
    let gone = gone.await.unwrap();
    let last_alive = stamps(&dir.join("alive-1"))
        .last()
        .copied()
        .expect("the first copy ran");
    let second = stamps(&dir.join("start-2"))[0];
    // Nothing of the first copy may remain, whatever happened.
    assert!(
        !group_alive(pgid),
        "no process of the first copy (group {pgid}) remains once the task has succeeded elsewhere"
    );
    tokio::join!(a.shutdown(), b.shutdown());
    let _ = std::fs::remove_dir_all(&dir);
    (gone, last_alive, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_copies_at_once_never_run_when_a_worker_is_cut_off_past_its_lease() {
    let db = TestDb::new().await;
    let proxy = Proxy::start().await;
    let started = tokio::time::Instant::now();
    let mut overlaps = Vec::new();
    for run in 0..20 {
        let (gone, last_alive, second) = one_cut(&db, &proxy).await;
        let overlap = gone.unwrap_or(f64::INFINITY).max(last_alive) - second;
        eprintln!(
            "run {run}: first copy gone {:+.3} s, last alive {:+.3} s relative to the second start",
            gone.map_or(f64::INFINITY, |g| g - second),
            last_alive - second
        );
        if overlap >= 0.0 {
            overlaps.push((run, overlap));
        }
    }
    eprintln!("20 cuts in {:?}", started.elapsed());
    assert!(
        overlaps.is_empty(),
        "a worker cut off from the database kills its attempt before its lease ends, so the \
         copy a rescuer starts never overlaps it; overlaps (run, seconds): {overlaps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_copies_at_once_never_run_when_a_reconnected_worker_takes_its_own_task_again() {
    let db = TestDb::new().await;
    let proxy = Proxy::start().await;
    // A lease of 5 s leaves a loaded machine time to renew it once the connections are back
    // (with 3 s, a run of the whole suite on two busy cores once missed the second attempt's
    // renewal, which then ran a third time).
    let lease = 5 * SECS;
    for run in 0..3 {
        let dir = shared_dir();
        // The second attempt runs longer than the lease: its lease must be renewed.
        let id = insert(&db.pool, &recording_task(&dir, 14, 6.5)).await;
        let a = lease_worker(&proxy.url(&db), lease).await;
        wait_for_file(&dir.join("start-1"), 10 * SECS).await;
        let pgid = pid_in(&dir.join("pid-1"));
        let gone = tokio::spawn(watch_group_end(pgid, 20 * SECS));
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.cut();
        tokio::time::sleep(lease + SECS).await;
        proxy.restore();
        wait_for(&db.pool, id, &["succeeded", "failed"], 20 * SECS).await;
        let gone = gone.await.unwrap();
        let second = stamps(&dir.join("start-2"));
        assert_eq!(
            second.len(),
            1,
            "run {run}: after reconnecting, the worker rescues its own task and runs it once more"
        );
        let history: Vec<(i32, String, Option<String>)> = sqlx::query_as(
            "select attempt, outcome, error from sked.task_attempts where task_id = $1
              order by attempt",
        )
        .bind(id)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let (state, attempt): (String, i32) =
            sqlx::query_as("select state, attempt from sked.tasks where id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        // The first attempt ends "worker_lost" when the worker's rescue came first, or
        // "failed" (stopped for its lost lease) when its own result did.
        assert!(
            state == "succeeded"
                && attempt == 2
                && history.len() == 1
                && ["worker_lost", "failed"].contains(&history[0].1.as_str()),
            "run {run}: the second attempt is renewed as its own (keyed by task and attempt), \
             not confused with the lost first one, and succeeds: {state}, attempt {attempt}, \
             history {history:?}"
        );
        let gone = gone.expect("the first copy's processes end");
        assert!(
            gone < second[0],
            "run {run}: the first copy is gone before the worker starts the task again \
             ({:+.3} s after the second start)",
            gone - second[0]
        );
        a.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[tokio::test]
async fn two_copies_at_once_never_run_because_a_renewal_after_the_lease_expired_is_refused() {
    let db = TestDb::new().await;
    let id = insert(&db.pool, "(command) values (array['true'])").await;
    let worker = Uuid::new_v4();
    sked_db::worker::register(
        &db.pool,
        &sked_db::worker::Registration {
            id: worker,
            name: "w".into(),
            host: "h".into(),
            pid: 1,
            version: "0".into(),
            queues: vec!["default".into()],
            labels: vec![],
            concurrency: 1,
            lease: 30 * SECS,
            cpu_millis: None,
            memory_mb: None,
        },
    )
    .await
    .unwrap();
    let claimed = sked_db::worker::claim(&db.pool, worker, &["default".into()], &[], 1, 30 * SECS)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let renew = |secs: i32| {
        sqlx::query_scalar::<_, i64>(
            "select count(*) from sked.tasks_renew_leases($1, array[$2], array[1], '30 s',
                now() + make_interval(secs => $3))",
        )
        .bind(worker)
        .bind(id)
        .bind(secs)
        .fetch_one(&db.pool)
    };
    assert_eq!(
        renew(31).await.unwrap(),
        0,
        "a lease that expired is not renewed, even before any worker rescued the task"
    );
    assert_eq!(
        renew(29).await.unwrap(),
        1,
        "a lease that has not expired is renewed"
    );
}

#[tokio::test]
async fn two_copies_at_once_never_run_because_a_lease_too_short_for_the_kill_grace_is_refused() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"))
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
        .args(["--lease-secs", "2", "--kill-grace-secs", "5"])
        .output()
        .expect("running sked-worker");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("too short for a kill grace"),
        "a worker whose lease cannot hold the kill grace and the margin refuses to start, \
         saying why: {stderr}"
    );
    // Without a kill grace, a short lease gets a shorter one.
    let mut args = sked_worker::WorkerArgs {
        lease_secs: 2.0,
        ..config_args()
    };
    let c = args
        .clone()
        .into_config()
        .expect("a 2 s lease with the default kill grace");
    assert!(
        c.kill_grace + sked_worker::config::lease_margin(c.lease) <= c.lease / 2,
        "the default kill grace fits a short lease: {:?}",
        c.kill_grace
    );
    args.kill_grace_secs = Some(0.9);
    assert!(
        args.into_config().is_err(),
        "a kill grace leaving less than half the lease is refused"
    );
}

/// The flags' defaults, as `sked-worker` would parse them with no flag.
fn config_args() -> sked_worker::WorkerArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        worker: sked_worker::WorkerArgs,
    }
    Cli::parse_from(["sked-worker"]).worker
}

/// A claim whose answer is lost charges no attempt. The worker claims from a queue whose
/// name only its claims carry; once the proxy loses replies after that name, the worker's
/// claim at the task's due time reaches the server, takes the task and commits, and its answer
/// never arrives; restoring the proxy breaks the connection under the waiting claim. The
/// worker hands the task back uncharged and runs it: a task allowed one attempt succeeds,
/// instead of failing as "worker lost" once the lease expires. A round in which the claim did
/// not take the task while the replies were lost proves nothing; it is counted apart: the
/// task was not seen running, or it ran at its first attempt with no attempt handed back (its
/// claim was answered before the replies were lost: a slow machine reached the due time
/// first). Rounds go on until four have lost a claim's answer, sixteen at most.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_answer_is_lost_charges_no_attempt() {
    const QUEUE: &str = "lost-claim-answers";
    let db = TestDb::new().await;
    let proxy = Proxy::start().await;
    // Long enough that the lease cannot expire before the worker hands the task back.
    let lease = 10 * SECS;
    // A worker that claims when told of a task or when the next one is due, not by polling:
    // its claim at the task's due time is the first statement it sends once the replies are
    // lost.
    let pool = sked_db::connect(&proxy.url(&db), "sked-worker", 10)
        .await
        .expect("connecting the worker");
    let mut c = config(&[QUEUE]);
    c.lease = lease;
    c.poll_interval = 60 * SECS;
    let a = start_worker_on(&pool, c);
    let mut lost = 0;
    for run in 0..16 {
        if lost == 4 {
            break;
        }
        let id = insert(
            &db.pool,
            &format!(
                "(command, queue, max_attempts, next_run_at) \
                 values (array['echo', 'run {run}'], '{QUEUE}', 1, now() + interval '2 seconds')"
            ),
        )
        .await;
        // The worker learns of the task and asks when it is due before its replies are lost.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        proxy.lose_replies_after(QUEUE.as_bytes());
        // The worker's claim at the due time takes the task; its answer is dropped.
        let deadline = tokio::time::Instant::now() + 4 * SECS;
        let claimed = loop {
            if state(&db.pool, id).await == "running" {
                break true;
            }
            if tokio::time::Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy.restore();
        let restored = tokio::time::Instant::now();
        wait_for(&db.pool, id, &["succeeded", "failed"], 3 * lease).await;
        if !claimed {
            eprintln!("run {run}: the worker claimed nothing while its replies were lost");
            continue;
        }
        let state = state(&db.pool, id).await;
        let attempts: Vec<(String, Option<String>)> = sqlx::query_as(
            "select outcome, error from sked.task_attempts where task_id = $1 order by attempt",
        )
        .bind(id)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        if state == "succeeded" && attempts.is_empty() {
            eprintln!("run {run}: the claim was answered before the replies were lost");
            continue;
        }
        lost += 1;
        assert_eq!(
            state, "succeeded",
            "run {run}: a task allowed one attempt runs although the answer to its first claim \
             was lost; earlier attempts: {attempts:?}"
        );
        // The history holds the attempts before the last one, which is on the task's row.
        assert_eq!(attempts.len(), 1, "run {run}: {attempts:?}");
        assert_eq!(attempts[0].0, "interrupted", "run {run}: {attempts:?}");
        assert!(
            attempts[0]
                .1
                .as_deref()
                .is_some_and(|e| e.contains("the answer to the claim that took it was lost")),
            "run {run}: the handed-back attempt says why: {attempts:?}"
        );
        assert!(
            restored.elapsed() < lease,
            "run {run}: handed back before its lease could expire ({:?})",
            restored.elapsed()
        );
    }
    a.shutdown().await;
    assert!(
        lost >= 4,
        "at least 4 of 16 rounds lost the answer to a claim that took the task ({lost})"
    );
}
