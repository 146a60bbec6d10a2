//! Through a real PgBouncer in transaction mode (`--database-pooler transaction`): servers,
//! workers and the CLI work with fewer server connections than clients, LISTEN goes to the
//! direct URL, and what needs a session without one is refused with a clear error. Workers
//! that cannot LISTEN find new work at their heartbeat; a transaction whose BEGIN is cut off
//! on its way never stays open on a pool (direct or pooled).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use sked_db::testing::TestDb;
use sqlx::Row as _;
use tokio::process::{Child, Command};

use crate::support::{Logged, free_port, tool};

/// A PgBouncer in transaction mode in front of the test PostgreSQL, stopped on drop.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    pub port: u16,
}

impl PgBouncer {
    /// PgBouncer on a free port, `pool_size` server connections per database and user; `None`
    /// (after saying why) when it is not installed outside CI.
    pub async fn start(pool_size: u32) -> Option<PgBouncer> {
        let program = tool("pgbouncer", "apt-get install pgbouncer")?;
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("sked-pgbouncer-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let admin = url::Url::parse(&sked_db::testing::admin_url()).unwrap();
        let user = if admin.username().is_empty() {
            "postgres"
        } else {
            admin.username()
        };
        std::fs::write(dir.join("userlist.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        // No `ignore_startup_parameters`: sked sends none that PgBouncer does not know.
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host={host} port={pg_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {auth}\npool_mode = transaction\n\
                 default_pool_size = {pool_size}\nmax_client_conn = 2000\n\
                 server_reset_query =\n",
                host = admin.host_str().unwrap_or("127.0.0.1"),
                pg_port = admin.port().unwrap_or(5432),
                auth = dir.join("userlist.txt").display(),
            ),
        )
        .unwrap();
        // PgBouncer refuses to run as root: as root, it runs as the `postgres` user.
        let mut command = if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting pgbouncer");
        let bouncer = PgBouncer { child, dir, port };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "pgbouncer listens on {port}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(bouncer)
    }

    /// `url` (the test PostgreSQL's) with PgBouncer's address instead.
    pub fn url(&self, url: &str) -> String {
        let mut url = url::Url::parse(url).unwrap();
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.to_string()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill has no memory preconditions; the pid is our child's (runuser
            // passes SIGTERM on to pgbouncer).
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A sked binary with the pooler's URL, `--database-pooler transaction` and, when given, the
/// direct URL for LISTEN (through the environment, as a deployment sets them).
fn pooled(program: &str, pooled_url: &str, direct: Option<&str>) -> Command {
    let mut c = Command::new(program);
    c.env("DATABASE_URL", pooled_url)
        .env("SKED_DATABASE_POOLER", "transaction")
        .env_remove("SKED_LISTEN_DATABASE_URL")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(direct) = direct {
        c.env("SKED_LISTEN_DATABASE_URL", direct);
    }
    c
}

async fn output(c: &mut Command) -> std::process::Output {
    let what = format!("{:?}", c.as_std());
    tokio::time::timeout(Duration::from_secs(60), c.output())
        .await
        .unwrap_or_else(|_| panic!("the command ends within 60 s: {what}"))
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn until_listening(addr: std::net::SocketAddr) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "sked-server listens on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The lines of a process's logs that report an error of the database.
fn database_errors(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| {
            l.contains("prepared statement")
                || l.contains("ERROR")
                || l.contains("unsupported startup parameter")
                || l.contains("no transaction in progress")
                || l.contains("already a transaction in progress")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_workers_and_the_cli_work_through_a_transaction_mode_pgbouncer() {
    // Two server connections for a server, four workers and the CLI: statements of different
    // clients share server connections, so a statement prepared on one and run on another, or
    // a role set for a session, would show.
    let Some(bouncer) = PgBouncer::start(2).await else {
        return;
    };
    let db = TestDb::empty().await;
    let through = bouncer.url(&db.url);

    // `sked migrate` migrates over the direct URL: it holds a session's advisory lock.
    let migrated =
        output(pooled(env!("CARGO_BIN_EXE_sked"), &through, Some(&db.url)).arg("migrate")).await;
    assert!(
        migrated.status.success(),
        "sked migrate through the pooler, with a direct URL: {}",
        text(&migrated.stderr)
    );
    // `sked token create` works through the pooler itself.
    let created = output(pooled(env!("CARGO_BIN_EXE_sked"), &through, None).args([
        "token", "create", "--owner", "pool", "--role", "admin", "--name", "pooler",
    ]))
    .await;
    assert!(
        created.status.success(),
        "sked token create through the pooler: {}",
        text(&created.stderr)
    );
    let secret = text(&created.stdout).trim().to_owned();
    assert!(!secret.is_empty(), "the token's secret is printed");

    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let server = Logged::spawn(
        pooled(env!("CARGO_BIN_EXE_sked-server"), &through, Some(&db.url))
            .env("SKED_LISTEN", addr.to_string()),
    );
    let work = std::env::temp_dir().join(format!("sked-pooler-{}", uuid::Uuid::new_v4()));
    let mut workers = Vec::new();
    for i in 0..4 {
        // The last one has no direct URL: it polls instead of listening.
        let direct = (i < 3).then_some(db.url.as_str());
        let worker = Logged::spawn(
            pooled(env!("CARGO_BIN_EXE_sked-worker"), &through, direct)
                .args(["--name", &format!("pooled-{i}"), "--queues", "pq"])
                .args(["--concurrency", "8", "--poll-secs", "5"])
                .arg("--work-dir")
                .arg(work.join(i.to_string()))
                .stdout(Stdio::null()),
        );
        workers.push(worker);
    }
    until_listening(addr).await;

    let http = reqwest::Client::new();
    let api = format!("http://{addr}/api/v1");
    // Submitted one by one, concurrently, through the API (whose writes go through the
    // pooler); every fourth fails once and is retried.
    let mut submits = tokio::task::JoinSet::new();
    for i in 0..120 {
        let (http, api, secret) = (http.clone(), api.clone(), secret.clone());
        submits.spawn(async move {
            let command = if i % 4 == 0 {
                serde_json::json!(["sh", "-c", "test \"$SKED_ATTEMPT\" -ge 2"])
            } else {
                serde_json::json!(["true"])
            };
            let answer = http
                .post(format!("{api}/tasks"))
                .bearer_auth(&secret)
                .json(&serde_json::json!({
                    "queue": "pq", "command": command, "max_attempts": 3, "backoff_base_secs": 0.1,
                    "idempotency_key": format!("pooled-{i}"),
                }))
                .send()
                .await
                .unwrap();
            let status = answer.status();
            let body: serde_json::Value = answer.json().await.unwrap();
            assert!(status.is_success(), "submit {i}: {status} {body}");
            body["ids"][0].as_str().unwrap().to_owned()
        });
    }
    let ids: Vec<String> = submits.join_all().await;
    assert_eq!(ids.len(), 120);

    // Long polls wake up from NOTIFY, heard on the direct URL.
    let mut waits = tokio::task::JoinSet::new();
    for id in ids.clone() {
        let (http, api, secret) = (http.clone(), api.clone(), secret.clone());
        waits.spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let body: serde_json::Value = http
                    .get(format!("{api}/tasks/{id}?wait=30s"))
                    .bearer_auth(&secret)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let state = body["state"].as_str().unwrap_or_default().to_owned();
                if ["succeeded", "failed", "cancelled"].contains(&state.as_str())
                    || tokio::time::Instant::now() > deadline
                {
                    return (id, state);
                }
            }
        });
    }
    for (id, state) in waits.join_all().await {
        assert_eq!(state, "succeeded", "task {id} succeeds through the pooler");
    }
    let attempts: Vec<(i32, i64)> = sqlx::query_as(
        "select attempt, count(*) from sked.tasks where queue = 'pq' group by 1 order by 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        attempts,
        vec![(1, 90), (2, 30)],
        "each task ran once, and each failing one once more"
    );
    let ran_by: i64 =
        sqlx::query_scalar("select count(distinct worker_id) from sked.tasks where queue = 'pq'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        ran_by >= 2,
        "the workers share the tasks ({ran_by} of 4 ran some)"
    );

    let mut logs = String::new();
    for (i, worker) in workers.into_iter().enumerate() {
        let (status, stderr) = worker.stop().await;
        assert!(
            status.success(),
            "the worker stops cleanly: {status:?}\n{stderr}"
        );
        assert_eq!(
            stderr.contains("polling instead"),
            i == 3,
            "a worker without a direct URL says it polls, the others listen:\n{stderr}"
        );
        logs.push_str(&stderr);
    }
    let (status, stderr) = server.stop().await;
    assert!(
        status.success(),
        "the server stops cleanly: {status:?}\n{stderr}"
    );
    logs.push_str(&stderr);
    let _ = std::fs::remove_dir_all(&work);
    let errors = database_errors(&logs);
    assert!(
        errors.is_empty(),
        "no database errors in the logs: {errors:#?}"
    );
}

#[tokio::test]
async fn what_needs_a_session_is_refused_through_a_transaction_pooler_without_a_direct_url() {
    let Some(bouncer) = PgBouncer::start(2).await else {
        return;
    };
    let db = TestDb::new().await;
    let through = bouncer.url(&db.url);
    let wants_direct = |what: &str, out: &std::process::Output| {
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{what} is refused: {stderr}");
        assert!(
            stderr.contains("--listen-database-url") && stderr.contains("session"),
            "{what} says it needs a session and which flag gives one: {stderr}"
        );
    };
    let migrate = output(pooled(env!("CARGO_BIN_EXE_sked"), &through, None).arg("migrate")).await;
    wants_direct("sked migrate", &migrate);
    let index =
        output(pooled(env!("CARGO_BIN_EXE_sked"), &through, None).args(["search-index", "status"]))
            .await;
    wants_direct("sked search-index", &index);
    let mut server = pooled(env!("CARGO_BIN_EXE_sked-server"), &through, None);
    server.env("SKED_LISTEN", format!("127.0.0.1:{}", free_port()));
    let out = output(&mut server).await;
    wants_direct("sked-server (its long polls and live events)", &out);
    // A direct URL that does not parse is named as such.
    let bad =
        output(pooled(env!("CARGO_BIN_EXE_sked"), &through, Some("postgres://[")).arg("migrate"))
            .await;
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("invalid listen database URL"),
        "{}",
        text(&bad.stderr)
    );
    // Unchanged by all of it.
    let version = sked_db::schema_version(&db.pool).await.unwrap();
    assert_eq!(version, sked_db::expected_schema_version());
}

#[tokio::test]
async fn polling_workers_behind_the_pooler_find_new_work_at_their_heartbeat_not_their_poll() {
    // Without LISTEN, two idle workers would look for work again only at their poll (two
    // minutes, times the two of them sharing it): the heartbeat (every 2 s with a 6 s lease)
    // asks how soon a task of their queues is due and wakes the claim.
    let Some(bouncer) = PgBouncer::start(2).await else {
        return;
    };
    let db = TestDb::new().await;
    let through = bouncer.url(&db.url);
    let work = std::env::temp_dir().join(format!("sked-pooler-{}", uuid::Uuid::new_v4()));
    let mut workers = Vec::new();
    for i in 0..2 {
        let worker = Logged::spawn(
            pooled(env!("CARGO_BIN_EXE_sked-worker"), &through, None)
                .args(["--name", &format!("polling-{i}"), "--queues", "idle"])
                .args([
                    "--concurrency",
                    "4",
                    "--poll-secs",
                    "120",
                    "--lease-secs",
                    "6",
                ])
                .arg("--work-dir")
                .arg(work.join(i.to_string()))
                .stdout(Stdio::null()),
        );
        workers.push(worker);
    }
    // Both registered, and past their first claim (made at start, before any task existed)
    // and a heartbeat that found nothing due.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let beating: i64 = sqlx::query_scalar(
            "select count(*) from sked.workers
              where queues = '{idle}' and heartbeat_at > started_at + interval '2 s'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if beating == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "both workers register and beat"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let submitted = tokio::time::Instant::now();
    sqlx::query(
        "insert into sked.tasks (queue, command)
         select 'idle', array['true'] from generate_series(1, 10)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    loop {
        let done: i64 = sqlx::query_scalar(
            "select count(*) from sked.tasks where queue = 'idle' and state = 'succeeded'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if done == 10 {
            break;
        }
        assert!(
            submitted.elapsed() < Duration::from_secs(40),
            "the workers found the tasks within a few heartbeats, far before their next poll \
             ({done} of 10 done after {:?})",
            submitted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let unfinished_attempts: i64 =
        sqlx::query_scalar("select count(*) from sked.tasks where queue = 'idle' and attempt <> 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(unfinished_attempts, 0, "each task ran once");

    for worker in workers {
        let (status, stderr) = worker.stop().await;
        assert!(
            status.success(),
            "the worker stops cleanly: {status:?}\n{stderr}"
        );
        assert!(stderr.contains("polling instead"), "it polls:\n{stderr}");
        let errors = database_errors(&stderr);
        assert!(
            errors.is_empty(),
            "no database errors in the logs: {errors:#?}"
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

#[tokio::test]
async fn a_transaction_whose_begin_is_cut_off_is_never_left_open_on_the_pool() {
    // A caller that stops waiting (a timeout, a dropped future) while its BEGIN is on the way:
    // the next statement on that connection must run in a transaction of its own, not inside
    // one that nobody will commit. One connection, so that the next statement gets it.
    let db = TestDb::new().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&db.url)
        .await
        .unwrap();
    let mut cut = 0;
    for polls in 1..=40 {
        for _ in 0..5 {
            let mut begin = Box::pin(sked_db::begin(&pool));
            let mut ready = false;
            for _ in 0..polls {
                if futures::poll!(begin.as_mut()).is_ready() {
                    ready = true;
                    break;
                }
                tokio::task::yield_now().await;
            }
            cut += usize::from(!ready);
            drop(begin);
            // In a transaction of its own, a statement starts when its transaction does (the
            // simple protocol: the extended one stamps the statement again at Execute).
            let own: bool = sqlx::raw_sql("select now() = statement_timestamp()")
                .fetch_one(&pool)
                .await
                .unwrap()
                .get(0);
            assert!(
                own,
                "after a BEGIN cut off at poll {polls}, the next statement runs in a transaction \
                 of its own"
            );
        }
    }
    assert!(cut > 0, "some BEGINs were cut off before their answer");
    pool.close().await;
}
