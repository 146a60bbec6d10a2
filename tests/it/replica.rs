//! `sked-server --read-database-url`: reads that tolerate staleness go to a real streaming
//! replica while it is within `--read-max-staleness` of the primary, and to the primary past
//! it or when the replica is down; writes, a task read by id and token checks always go to the
//! primary.
//!
//! The test makes its own primary cluster (`initdb` in a temporary directory, on a free port)
//! and a hot standby of it (`pg_basebackup -R`), as the `postgres` user when it runs as root,
//! and stops both and removes their directory when it ends, also when it fails.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sked::embedded_pg::PgBinaries;
use sked_db::token::Role;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{free_port, tool};

/// The bound the server is started with.
const MAX_STALENESS: Duration = Duration::from_secs(3);

/// A user to run PostgreSQL as: the `postgres` user when this runs as root.
#[derive(Clone, Copy)]
struct RunAs {
    uid: u32,
    gid: u32,
}

fn run_as() -> Option<RunAs> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").unwrap();
    // SAFETY: getpwnam returns null or a pointer to a record read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "PostgreSQL refuses to run as root and there is no postgres user"
    );
    // SAFETY: `pw` is non-null.
    Some(unsafe {
        RunAs {
            uid: (*pw).pw_uid,
            gid: (*pw).pw_gid,
        }
    })
}

/// A primary and its replica in one temporary directory; both stopped (`immediate`) and the
/// directory removed on drop.
struct Clusters {
    /// The folder of initdb, pg_ctl and postgres.
    bins: PathBuf,
    basebackup: PathBuf,
    user: Option<RunAs>,
    root: PathBuf,
    primary_port: u16,
    replica_port: u16,
}

impl Clusters {
    fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn command(&self, tool: &str) -> tokio::process::Command {
        let program = if tool == "pg_basebackup" {
            self.basebackup.clone()
        } else {
            self.bins.join(tool)
        };
        let mut cmd = tokio::process::Command::new(program);
        cmd.current_dir("/")
            .stdin(std::process::Stdio::null())
            .env_remove("PGDATA")
            .env("LC_MESSAGES", "C");
        if let Some(user) = self.user {
            cmd.uid(user.uid).gid(user.gid);
        }
        cmd
    }

    async fn run(&self, tool: &str, args: &[&str]) {
        let out = self.command(tool).args(args).output().await.unwrap();
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the cluster in `name` on `port`, listening on 127.0.0.1 only.
    async fn start(&self, name: &str, port: u16) {
        let dir = self.dir(name);
        let log = self.root.join(format!("{name}.log"));
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
            self.root.display()
        );
        let out = self
            .command("pg_ctl")
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(&dir)
            .arg("-l")
            .arg(&log)
            .args(["-o", &options])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start {name} failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    async fn stop(&self, name: &str) {
        let dir = self.dir(name);
        self.run(
            "pg_ctl",
            &["stop", "-m", "fast", "-w", "-D", dir.to_str().unwrap()],
        )
        .await;
    }

    fn url(port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }
}

impl Drop for Clusters {
    fn drop(&mut self) {
        for name in ["replica", "primary"] {
            let dir = self.dir(name);
            if dir.join("postmaster.pid").exists() {
                let mut cmd = std::process::Command::new(self.bins.join("pg_ctl"));
                cmd.args(["stop", "-m", "immediate", "-w", "-D"])
                    .arg(&dir)
                    .current_dir("/")
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null());
                if let Some(user) = self.user {
                    use std::os::unix::process::CommandExt as _;
                    cmd.uid(user.uid).gid(user.gid);
                }
                let _ = cmd.status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

const INSTALL: &str = "apt-get install postgresql (its binaries are in /usr/lib/postgresql/*/bin)";

/// The folder of the server binaries and `pg_basebackup` (beside them, beside what they link
/// to, or on the PATH), or `None` after `tool`'s message when they are missing.
fn binaries() -> Option<(PathBuf, PathBuf)> {
    let bins = match PgBinaries::find(std::env::var_os("PATH").as_deref()) {
        Ok(bins) => bins.dir,
        Err(e) => {
            tool("initdb", INSTALL)?;
            panic!("{e}");
        }
    };
    let beside = |dir: &Path| {
        let tool = dir.join("pg_basebackup");
        tool.is_file().then_some(tool)
    };
    // /usr/local/bin/initdb may be a link into /usr/lib/postgresql/15/bin.
    let linked = bins
        .join("initdb")
        .canonicalize()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let basebackup = beside(&bins)
        .or_else(|| linked.as_deref().and_then(beside))
        .or_else(|| tool("pg_basebackup", INSTALL))?;
    Some((bins, basebackup))
}

/// Initialises and starts the primary, migrates it, and starts a replica of it.
async fn clusters((bins, basebackup): (PathBuf, PathBuf)) -> (Clusters, PgPool, PgPool) {
    let user = run_as();
    let root = std::env::temp_dir().join(format!("sked-replica-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
    if let Some(user) = user {
        std::os::unix::fs::chown(&root, Some(user.uid), Some(user.gid)).unwrap();
    }
    let clusters = Clusters {
        bins,
        basebackup,
        user,
        root,
        primary_port: free_port(),
        replica_port: free_port(),
    };
    let primary = clusters.dir("primary");
    clusters
        .run(
            "initdb",
            &[
                "-D",
                primary.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
            ],
        )
        .await;
    // initdb's defaults serve a replica: wal_level replica, WAL senders, and `host
    // replication all 127.0.0.1/32 trust` with --auth=trust.
    clusters.start("primary", clusters.primary_port).await;
    let primary_pool = sked_db::connect(&Clusters::url(clusters.primary_port), "replica-test", 4)
        .await
        .expect("connect to the primary");
    sked_db::migrate(&primary_pool).await.expect("migrate");
    let replica = clusters.dir("replica");
    clusters
        .run(
            "pg_basebackup",
            &[
                "-D",
                replica.to_str().unwrap(),
                "-h",
                "127.0.0.1",
                "-p",
                &clusters.primary_port.to_string(),
                "-U",
                "postgres",
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
            ],
        )
        .await;
    clusters.start("replica", clusters.replica_port).await;
    let replica_pool = sked_db::connect(&Clusters::url(clusters.replica_port), "replica-test", 2)
        .await
        .expect("connect to the replica");
    let in_recovery: bool = sqlx::query_scalar("select pg_is_in_recovery()")
        .fetch_one(&replica_pool)
        .await
        .unwrap();
    assert!(in_recovery, "the replica is a hot standby");
    (clusters, primary_pool, replica_pool)
}

/// `sked-server` over the primary with the replica for reads; its stderr kept.
struct Server {
    child: tokio::process::Child,
    base: String,
    log: Arc<Mutex<String>>,
    http: reqwest::Client,
    token: String,
}

impl Server {
    async fn start(clusters: &Clusters, token: String) -> Server {
        let port = free_port();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-server"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--read-database-url", &Clusters::url(clusters.replica_port)])
            .args([
                "--read-max-staleness",
                &format!("{}s", MAX_STALENESS.as_secs()),
            ])
            .env("DATABASE_URL", Clusters::url(clusters.primary_port))
            .env("RUST_LOG", "info")
            .env_remove("SKED_READ_DATABASE_URL")
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start sked-server");
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = child.stderr.take().unwrap();
        tokio::spawn({
            let log = log.clone();
            async move {
                use tokio::io::AsyncReadExt as _;
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    log.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        let addr = format!("127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(&addr).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "sked-server did not listen: {}",
                log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Server {
            child,
            base: format!("http://{addr}/api/v1"),
            log,
            http: reqwest::Client::new(),
            token,
        }
    }

    async fn get_as(&self, token: &str, path: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> Value {
        let (status, body) = self.get_as(&self.token, path).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
        body
    }

    /// Submits a task and reads it by id at once: both on the primary, so the read always
    /// finds it, whatever the replica holds.
    async fn submit(&self, name: &str) -> Uuid {
        let response = self
            .http
            .post(format!("{}/tasks", self.base))
            .bearer_auth(&self.token)
            .json(&json!({"command": ["true", name], "queue": "replica-test"}))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let id: Uuid = body["ids"][0].as_str().unwrap().parse().unwrap();
        let task = self.get(&format!("/tasks/{id}")).await;
        assert_eq!(
            task["id"].as_str(),
            Some(id.to_string().as_str()),
            "a task read by id right after its submission is found: {task}"
        );
        id
    }

    /// The ids of the listing of the test's queue.
    async fn listed(&self) -> Vec<Uuid> {
        let page = self
            .get("/tasks?queue=replica-test&view=summary&limit=500")
            .await;
        page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().parse().unwrap())
            .collect()
    }

    /// `reads` of the health check: where the reads that tolerate staleness go.
    async fn routing(&self) -> Value {
        let response = self
            .http
            .get(format!("{}/health", self.base))
            .send()
            .await
            .unwrap();
        let health: Value = response.json().await.unwrap();
        health["reads"].clone()
    }

    /// Waits until `on_replica` is `want`.
    async fn routed(&self, want: bool, within: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let routing = self.routing().await;
            if routing["on_replica"] == json!(want) {
                return routing;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the reads did not go to the {} within {within:?}: {routing}\n{}",
                if want { "replica" } else { "primary" },
                self.log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the listing holds `id`.
    async fn listed_within(&self, id: Uuid, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while !self.listed().await.contains(&id) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "task {id} is not listed after {within:?}: {}",
                self.routing().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn on_replica(replica: &PgPool, id: Uuid) -> bool {
    sqlx::query_scalar("select exists (select 1 from sked.tasks where id = $1)")
        .bind(id)
        .fetch_one(replica)
        .await
        .unwrap()
}

/// Pauses the replica's replay and waits until it has paused.
async fn pause_replay(replica: &PgPool) {
    sqlx::query("select pg_wal_replay_pause()")
        .execute(replica)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state: String = sqlx::query_scalar("select pg_get_wal_replay_pause_state()")
            .fetch_one(replica)
            .await
            .unwrap();
        if state == "paused" {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "replay did not pause"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_tolerant_reads_use_the_replica_within_the_bound_and_the_primary_past_it() {
    let Some(bins) = binaries() else {
        return;
    };
    let started = std::time::Instant::now();
    let (clusters, primary, replica) = clusters(bins).await;
    let admin = sked_db::token::create(&primary, "admin", Role::Admin, "replica test")
        .await
        .unwrap();
    let bob = sked_db::token::create(&primary, "bob", Role::User, "replica test bob")
        .await
        .unwrap();
    let server = Server::start(&clusters, admin).await;

    // In sync: the reads go to the replica, whose connections act as sked_server, and a task
    // written through the primary is listed once replayed.
    let routing = server.routed(true, Duration::from_secs(15)).await;
    assert_eq!(
        routing["max_staleness_secs"],
        json!(MAX_STALENESS.as_secs_f64())
    );
    let first = server.submit("first").await;
    server.listed_within(first, Duration::from_secs(5)).await;
    let count = server.get("/tasks/count?queue=replica-test").await;
    assert_eq!(count["count"], json!(1), "{count}");
    let overview = server.get("/overview").await;
    assert!(
        overview["queues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["queue"] == "replica-test"),
        "{overview}"
    );
    let readers: i64 = sqlx::query_scalar(
        "select count(*) from pg_stat_activity where application_name = 'sked-server-reads'",
    )
    .fetch_one(&replica)
    .await
    .unwrap();
    assert!(readers > 0, "the server reads on the replica");

    // Replay paused, a task written through the primary: while the replica is within the
    // bound, the listing is the replica's and misses it, though the task is read by id (on the
    // primary) at once; a revoked token is refused at once (token checks on the primary).
    let mut proven = false;
    let mut second = Uuid::nil();
    for _attempt in 0..3 {
        // A fresh replayed commit, so that the lag after the pause starts near zero.
        let warm = server.submit("warm").await;
        server.listed_within(warm, Duration::from_secs(5)).await;
        pause_replay(&replica).await;
        second = server.submit("second").await;
        let listed = server.listed().await;
        let routing = server.routing().await;
        if routing["on_replica"] == json!(true) {
            assert!(
                !listed.contains(&second),
                "the replica's replay is paused, yet the listing it served holds the new task"
            );
            assert!(
                !on_replica(&replica, second).await,
                "replay is paused on the replica"
            );
            proven = true;
            break;
        }
        // The machine was too slow to list within the bound: again.
        sqlx::query("select pg_wal_replay_resume()")
            .execute(&replica)
            .await
            .unwrap();
    }
    assert!(
        proven,
        "three times, the listing right after a write came later than the bound"
    );
    let bob_token: Uuid = sked_db::token::list(&primary)
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.name == "replica test bob")
        .unwrap()
        .id;
    assert!(sked_db::token::revoke(&primary, bob_token).await.unwrap());
    let (status, body) = server.get_as(&bob, "/tasks").await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a revoked token stops at once, though the replica still holds it: {body}"
    );

    // Past the bound the reads go to the primary: the listing holds the task the paused
    // replica still lacks.
    let routing = server
        .routed(false, MAX_STALENESS + Duration::from_secs(3))
        .await;
    // The last check measured a lag that, with the time since, passes the bound.
    assert!(
        routing["replica_lag_secs"].as_f64().unwrap() > 0.0,
        "the paused replica is behind: {routing}"
    );
    assert!(
        server.listed().await.contains(&second),
        "the primary serves the listing"
    );
    assert!(
        !on_replica(&replica, second).await,
        "the replica still lacks the task"
    );
    let count = server.get("/tasks/count?queue=replica-test").await;
    assert_eq!(
        count["count"],
        json!(server.listed().await.len()),
        "{count}"
    );

    // Replay resumed: back to the replica once it has caught up.
    sqlx::query("select pg_wal_replay_resume()")
        .execute(&replica)
        .await
        .unwrap();
    let routing = server.routed(true, Duration::from_secs(5)).await;
    assert!(
        routing["replica_lag_secs"].as_f64().unwrap() <= MAX_STALENESS.as_secs_f64(),
        "{routing}"
    );
    assert!(on_replica(&replica, second).await);
    assert!(server.listed().await.contains(&second));

    // The replica down: the reads answer from the primary, at once (a read that fails on the
    // replica runs again on the primary) and after the check has noticed.
    replica.close().await;
    clusters.stop("replica").await;
    let third = server.submit("third").await;
    let listed = server.listed().await;
    assert!(
        listed.contains(&third) && listed.contains(&second),
        "{listed:?}"
    );
    server.get("/overview").await;
    server.get("/history").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let routing = server.routing().await;
        assert_eq!(routing["on_replica"], json!(false), "{routing}");
        if routing["replica_lag_secs"].is_null() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no failed check of the stopped replica: {routing}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(server.listed().await.contains(&third));
    server.get("/tasks/count?queue=replica-test").await;

    let log = server.log.lock().unwrap().clone();
    assert!(
        log.contains("go to the read replica") && log.contains("go to the primary"),
        "the server logs each switch: {log}"
    );
    let Server { child, .. } = server;
    drop(child);
    primary.close().await;
    drop(clusters);
    eprintln!("replica test took {:?}", started.elapsed());
}
