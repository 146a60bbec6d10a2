//! Tests of the `sked`, `sked-server` and `sked-worker` binaries run as processes: database
//! administration, flag validation, the REST commands against an in-process server, refusing
//! an unmigrated database, and `sked dev` with its private PostgreSQL cluster.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sked_db::testing::TestDb;
use sked_db::token::Role;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support;

/// A command of one of the built binaries, with none of sked's environment inherited.
fn bin(path: &str) -> Command {
    let mut cmd = Command::new(path);
    for var in [
        "DATABASE_URL",
        "SKED_URL",
        "SKED_TOKEN",
        "SKED_LISTEN",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::null()).kill_on_drop(true);
    cmd
}

pub(crate) fn sked() -> Command {
    bin(env!("CARGO_BIN_EXE_sked"))
}

pub(crate) async fn output(cmd: &mut Command) -> Output {
    tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the command should finish within 60 s")
        .expect("running the command")
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn migrate_creates_the_schema_of_this_binary_and_can_run_again() {
    let db = TestDb::empty().await;
    for run in 1..=2 {
        let out = output(sked().arg("migrate").env("DATABASE_URL", &db.url)).await;
        assert!(
            out.status.success(),
            "migrate run {run} should succeed: {out:?}"
        );
        let expected = sked_db::expected_schema_version();
        assert!(
            text(&out.stdout).contains(&expected.to_string()),
            "migrate prints the schema version {expected}: {out:?}"
        );
    }
    let version = sked_db::schema_version(&db.pool).await.unwrap();
    assert_eq!(version, sked_db::expected_schema_version());
    sked_db::check_schema(&db.pool)
        .await
        .expect("the schema matches after migrate");
}

#[tokio::test]
async fn token_create_prints_a_secret_that_authenticates() {
    let db = TestDb::new().await;
    let out = output(
        sked()
            .args([
                "token", "create", "--owner", "alice", "--role", "user", "--name", "laptop",
            ])
            .env("DATABASE_URL", &db.url),
    )
    .await;
    assert!(out.status.success(), "token create should succeed: {out:?}");
    let secret = text(&out.stdout).trim().to_owned();
    assert!(
        !secret.contains('\n'),
        "stdout holds only the secret: {secret:?}"
    );
    let principal = sked_db::token::authenticate(&db.pool, &secret)
        .await
        .unwrap()
        .expect("the printed token authenticates");
    assert_eq!(principal.owner, "alice");
    assert_eq!(principal.role, Role::User);

    // `token list` shows the token (never its secret); `token revoke` ends it.
    let out = output(sked().args(["token", "list"]).env("DATABASE_URL", &db.url)).await;
    assert!(out.status.success(), "token list should succeed: {out:?}");
    let listing = text(&out.stdout);
    assert!(
        listing.contains("alice") && listing.contains("laptop"),
        "{listing}"
    );
    assert!(!listing.contains(&secret), "a listing never shows secrets");
    let id = listing
        .lines()
        .find(|l| l.contains("alice"))
        .and_then(|l| l.split_whitespace().next())
        .expect("a row for alice")
        .to_owned();
    let out = output(
        sked()
            .args(["token", "revoke", &id])
            .env("DATABASE_URL", &db.url),
    )
    .await;
    assert!(out.status.success(), "token revoke should succeed: {out:?}");
    assert!(
        sked_db::token::authenticate(&db.pool, &secret)
            .await
            .unwrap()
            .is_none(),
        "a revoked token no longer authenticates"
    );
    let out = output(
        sked()
            .args(["token", "revoke", &id])
            .env("DATABASE_URL", &db.url),
    )
    .await;
    assert!(
        !out.status.success() && text(&out.stderr).contains("no active token"),
        "revoking twice is an error: {out:?}"
    );
}

#[tokio::test]
async fn bad_flags_fail_clearly_before_any_request() {
    // Nothing listens on port 9: a request would fail with "cannot reach", never with the
    // flag's message.
    let cases: &[(&[&str], &str)] = &[
        (&["submit", "--env", "NOVALUE", "--", "true"], "KEY=VALUE"),
        (
            &["submit", "--input", "{bad", "--", "true"],
            "not valid JSON",
        ),
        (
            &["submit", "--delay", "-5", "--", "true"],
            "--delay must be zero or more seconds",
        ),
        (
            &["submit", "--delay", "15x", "--", "true"],
            "--delay: unknown unit \"x\"",
        ),
        (
            &["submit", "--delay", "soon", "--", "true"],
            "--delay must be a duration like",
        ),
        (
            &["submit", "--at", "tomorrow", "--", "true"],
            "--at must be an RFC 3339 time",
        ),
        (
            &[
                "submit",
                "--at",
                "2030-01-02T03:04:05Z",
                "--delay",
                "1m",
                "--",
                "true",
            ],
            "cannot be used with",
        ),
        (
            &["submit", "--timeout", "0s", "--", "true"],
            "--timeout must be positive",
        ),
        (
            &["submit", "--timeout", "0", "--", "true"],
            "--timeout must be positive",
        ),
        (
            &["submit", "--max-attempts", "0", "--", "true"],
            "--max-attempts",
        ),
        (
            &["submit", "--kind", "bogus", "--", "true"],
            "possible values",
        ),
        (&["submit"], "after `--`"),
        (
            &[
                "submit",
                "--input-file",
                "/nonexistent/input.json",
                "--",
                "true",
            ],
            "reading --input-file",
        ),
        (&["list", "--state", "bogus"], "possible values"),
        (&["show", "not-a-uuid"], "invalid value"),
        (
            &["token", "create", "--owner", "a", "--role", "root"],
            "possible values",
        ),
        (
            &["worker", "--concurrency", "0"],
            "--concurrency must be between",
        ),
        (&["dev", "--lease-secs", "0"], "--lease-secs must be"),
        (
            &["server", "--retention-days", "30"],
            "replaced by the retention stored in the database",
        ),
        (
            &["dev", "--retention-days", "forever"],
            "replaced by the retention stored in the database",
        ),
        (
            &["retention", "set", "--keep", "0"],
            "--keep must be between an hour and 36500 days",
        ),
        (
            &["queue", "retention", "q", "--keep-failed", "-1d"],
            "--keep-failed must be",
        ),
    ];
    for (args, expected) in cases {
        let out = output(
            sked()
                .args(*args)
                .env("SKED_URL", "http://127.0.0.1:9")
                .env("DATABASE_URL", "postgres://nobody@127.0.0.1:9/none"),
        )
        .await;
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "sked {args:?} should fail");
        assert!(
            stderr.contains(expected),
            "sked {args:?} should explain {expected:?}, got: {stderr}"
        );
        assert!(
            !stderr.contains("cannot reach") && !stderr.contains("connecting"),
            "sked {args:?} should fail before connecting: {stderr}"
        );
    }
    let out = output(
        bin(env!("CARGO_BIN_EXE_sked-worker"))
            .arg("--poll-secs=-1")
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:9/none"),
    )
    .await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--poll-secs must be"), "{out:?}");
}

#[tokio::test]
async fn server_and_worker_refuse_an_unmigrated_database() {
    let db = TestDb::empty().await;
    let runs: Vec<(&str, Vec<&str>)> = vec![
        (env!("CARGO_BIN_EXE_sked-worker"), vec![]),
        (
            env!("CARGO_BIN_EXE_sked-server"),
            vec!["--listen", "127.0.0.1:0"],
        ),
        (env!("CARGO_BIN_EXE_sked"), vec!["worker"]),
        (
            env!("CARGO_BIN_EXE_sked"),
            vec!["server", "--listen", "127.0.0.1:0"],
        ),
    ];
    for (program, args) in runs {
        let out = output(bin(program).args(&args).env("DATABASE_URL", &db.url)).await;
        let stderr = text(&out.stderr);
        assert!(
            !out.status.success(),
            "{program} {args:?} must not run on an unmigrated database"
        );
        assert!(
            stderr.contains("sked migrate"),
            "{program} {args:?} should say to run `sked migrate`, got: {stderr}"
        );
    }
}

/// An API server in this process over a fresh database, with an admin token.
pub(crate) struct Api {
    pub(crate) db: TestDb,
    url: String,
    token: String,
    stop: CancellationToken,
}

impl Api {
    pub(crate) async fn start() -> Api {
        let db = TestDb::new().await;
        let token = sked_db::token::create(&db.pool, "admin", Role::Admin, "test")
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        tokio::spawn(sked_server::serve(db.pool.clone(), listener, stop.clone()));
        Api {
            db,
            url,
            token,
            stop,
        }
    }

    pub(crate) fn sked(&self, args: &[&str]) -> Command {
        let mut cmd = sked();
        cmd.args(args)
            .env("SKED_URL", &self.url)
            .env("SKED_TOKEN", &self.token);
        cmd
    }

    pub(crate) async fn ok(&self, args: &[&str]) -> String {
        let out = output(&mut self.sked(args)).await;
        assert!(
            out.status.success(),
            "sked {args:?} should succeed: {out:?}"
        );
        text(&out.stdout)
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[tokio::test]
async fn rest_commands_submit_list_show_cancel_and_retry() {
    let api = Api::start().await;
    let out = api
        .ok(&[
            "submit",
            "--queue",
            "cli",
            "--priority",
            "-3",
            "--env",
            "A=1=2",
            "--input",
            r#"{"n":1}"#,
            "--delay",
            "3600",
            "--max-attempts",
            "2",
            "--timeout",
            "5",
            "--label",
            "gpu",
            "--",
            "sh",
            "-c",
            "echo hi",
        ])
        .await;
    let id: Uuid = out.trim().parse().expect("submit prints the task id");
    let task = sked_db::task::get(&api.db.pool, id)
        .await
        .unwrap()
        .expect("the task exists");
    assert_eq!(task.queue, "cli");
    assert_eq!(task.priority, -3);
    assert_eq!(
        task.command,
        Some(vec!["sh".into(), "-c".into(), "echo hi".into()])
    );
    assert_eq!(task.env.get("A").map(String::as_str), Some("1=2"));
    assert_eq!(task.input, Some(serde_json::json!({"n": 1})));
    assert_eq!(task.max_attempts, 2);
    assert_eq!(task.labels, vec!["gpu".to_owned()]);
    assert_eq!(task.state, sked_types::TaskState::Waiting);

    let listed = api.ok(&["list", "--queue", "cli"]).await;
    assert!(
        listed.contains(&id.to_string()) && listed.contains("waiting"),
        "{listed}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&api.ok(&["list", "--json", "--state", "waiting"]).await).unwrap();
    assert_eq!(
        json["tasks"][0]["id"],
        id.to_string(),
        "list --json prints the page"
    );

    let shown = api.ok(&["show", &id.to_string()]).await;
    assert!(
        shown.contains("waiting") && shown.contains("sh -c 'echo hi'"),
        "{shown}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&api.ok(&["show", "--json", &id.to_string()]).await).unwrap();
    assert_eq!(json["id"], id.to_string());

    let cancelled = api.ok(&["cancel", &id.to_string()]).await;
    assert!(cancelled.contains("cancelled"), "{cancelled}");
    let retried = api.ok(&["retry", &id.to_string()]).await;
    assert!(retried.contains(&id.to_string()), "{retried}");
    assert_ne!(
        support::state(&api.db.pool, id).await,
        "cancelled",
        "retry revives the task"
    );

    // API errors come back as `error: <message> (<code>)`.
    let out = output(&mut api.sked(&["show", &Uuid::new_v4().to_string()])).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("(not_found)"), "{out:?}");
    let out = output(api.sked(&["list"]).env("SKED_TOKEN", "sked_wrong")).await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("(unauthorized)"), "{out:?}");
}

#[tokio::test]
async fn logs_follow_prints_both_streams_until_the_task_ends() {
    let api = Api::start().await;
    let worker = support::start_worker(&api.db, support::config(&["default"]));
    let out = api
        .ok(&[
            "submit",
            "--",
            "sh",
            "-c",
            "echo hi; sleep 0.5; echo oops >&2; sleep 0.5; echo bye",
        ])
        .await;
    let id = out.trim().to_owned();
    let out = output(&mut api.sked(&["logs", "--follow", &id])).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "hi\nbye\n", "stdout chunks go to stdout");
    assert_eq!(text(&out.stderr), "oops\n", "stderr chunks go to stderr");
    assert_eq!(
        support::state(&api.db.pool, id.parse().unwrap()).await,
        "succeeded"
    );
    let again = api.ok(&["logs", &id]).await;
    assert_eq!(
        again, "hi\nbye\n",
        "logs without --follow prints what there is"
    );
    worker.shutdown().await;
}

/// A running `sked dev`: its stdout lines arrive on a channel, its stderr goes to a file.
struct Dev {
    child: Child,
    lines: mpsc::Receiver<String>,
    banner: Vec<String>,
}

impl Dev {
    fn start(data_dir: &Path, listen: &str, log: &Path) -> Dev {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sked"));
        for var in ["DATABASE_URL", "SKED_URL", "SKED_TOKEN", "SKED_LISTEN"] {
            cmd.env_remove(var);
        }
        let mut child = cmd
            .args([
                "dev",
                "--listen",
                listen,
                "--poll-secs",
                "0.2",
                "--shutdown-grace-secs",
                "5",
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("starting sked dev");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut dev = Dev {
            child,
            lines,
            banner: vec![],
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match dev.lines.recv_timeout(left) {
                Ok(line) if line.contains("Press Ctrl-C") => break,
                Ok(line) => dev.banner.push(line),
                Err(_) => panic!(
                    "sked dev should print its banner within 120 s; stdout: {:?}; stderr: {}",
                    dev.banner,
                    std::fs::read_to_string(log).unwrap_or_default()
                ),
            }
        }
        dev
    }

    /// The value after `label` in the banner.
    fn field(&self, label: &str) -> Option<String> {
        self.banner.iter().find_map(|l| {
            let rest = l.trim().strip_prefix(label)?;
            rest.split_whitespace().next().map(str::to_owned)
        })
    }

    /// SIGINT, then the exit status (within 60 s).
    fn interrupt(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sked dev should stop within 60 s of SIGINT"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.interrupt();
        }
    }
}

async fn wait_healthy(client: &reqwest::Client, api: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.get(format!("{api}/api/v1/health")).send().await {
            Ok(r) if r.status().is_success() => return,
            other => assert!(
                Instant::now() < deadline,
                "the API should answer its health check within 30 s: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn task_state(client: &reqwest::Client, api: &str, token: &str, id: &str) -> String {
    let r = client
        .get(format!("{api}/api/v1/tasks/{id}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("the API answers");
    assert!(r.status().is_success(), "GET task {id}: {}", r.status());
    let task: serde_json::Value = r.json().await.unwrap();
    task["state"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn dev_runs_a_private_cluster_that_keeps_tasks_across_restarts() {
    if let Err(e) = sked::embedded_pg::PgBinaries::find(std::env::var_os("PATH").as_deref()) {
        eprintln!("SKIPPED: sked dev needs the PostgreSQL server binaries: {e}");
        return;
    }
    let root = std::env::temp_dir().join(format!("sked-cli-dev-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&root).unwrap();
    let _cleanup = RemoveDir(root.clone());
    let data_dir = root.join("postgres");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let api = format!("http://{listen}");
    let http = reqwest::Client::new();

    let mut dev = Dev::start(&data_dir, &listen, &root.join("dev-1.log"));
    let token = dev
        .field("Admin token:")
        .expect("the first start prints an admin token");
    assert!(token.starts_with("sked_"), "banner: {:?}", dev.banner);
    let database_url = dev
        .field("DATABASE_URL:")
        .expect("the banner shows DATABASE_URL");
    assert!(
        database_url.starts_with("postgres://postgres@127.0.0.1:"),
        "{database_url}"
    );
    wait_healthy(&http, &api).await;
    let me = http
        .get(format!("{api}/api/v1/me"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert!(
        me.status().is_success(),
        "the printed admin token authenticates: {}",
        me.status()
    );

    let out = output(
        sked()
            .args(["submit", "--", "sh", "-c", "echo hi"])
            .env("SKED_URL", &api)
            .env("SKED_TOKEN", &token),
    )
    .await;
    assert!(
        out.status.success(),
        "sked submit against sked dev: {out:?}"
    );
    let id = text(&out.stdout).trim().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = task_state(&http, &api, &token, &id).await;
        if state == "succeeded" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the in-process worker runs the task; it is {state}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let status = dev.interrupt();
    assert!(status.success(), "sked dev exits 0 on SIGINT, got {status}");
    assert!(
        !data_dir.join("postmaster.pid").exists(),
        "the private PostgreSQL is stopped when sked dev exits"
    );
    let options: sqlx::postgres::PgConnectOptions = database_url.parse().unwrap();
    assert!(
        sqlx::ConnectOptions::connect(&options).await.is_err(),
        "nothing answers at the private cluster's URL after sked dev exits"
    );

    let mut dev = Dev::start(&data_dir, &listen, &root.join("dev-2.log"));
    assert_eq!(
        dev.field("Admin token:").as_deref(),
        Some("one"),
        "no second admin token"
    );
    assert!(
        dev.banner.iter().any(|l| l.contains("sked token create")),
        "{:?}",
        dev.banner
    );
    assert_eq!(
        dev.field("DATABASE_URL:"),
        Some(database_url),
        "the cluster keeps its port"
    );
    wait_healthy(&http, &api).await;
    assert_eq!(
        task_state(&http, &api, &token, &id).await,
        "succeeded",
        "tasks survive a restart"
    );
    let status = dev.interrupt();
    assert!(status.success(), "sked dev exits 0 on SIGINT, got {status}");
    assert!(!data_dir.join("postmaster.pid").exists());
}

/// Removes a directory when dropped (after the `Dev` processes that use it have stopped).
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn submit_delays_a_task_by_a_duration_or_until_a_time() {
    let api = Api::start().await;
    let submitted = async |args: &[&str]| -> sked_db::task::TaskRow {
        let out = api.ok(args).await;
        let id: Uuid = out.trim().parse().expect("submit prints the task id");
        sked_db::task::get(&api.db.pool, id)
            .await
            .unwrap()
            .expect("the task exists")
    };
    // A delay counts from the commit, a moment after the transaction's start (created_at).
    let after = |t: &sked_db::task::TaskRow| {
        let secs = (t.next_run_at - t.created_at).as_seconds_f64();
        assert!(secs - secs.floor() < 0.5, "due {secs} s after the start");
        secs.floor()
    };

    let t = submitted(&["submit", "--delay", "15m", "--", "true"]).await;
    assert_eq!(
        after(&t),
        900.0,
        "--delay 15m starts 15 minutes after the submit"
    );
    assert_eq!(t.state, sked_types::TaskState::Waiting);
    let t = submitted(&[
        "submit",
        "--delay",
        "1h30m",
        "--timeout",
        "2m",
        "--max-attempts",
        "5",
        "--priority",
        "7",
        "--queue",
        "later",
        "--",
        "true",
    ])
    .await;
    assert_eq!(after(&t), 5_400.0, "--delay 1h30m");
    assert_eq!(t.timeout_secs, Some(120.0), "--timeout 2m");
    assert_eq!(
        (t.max_attempts, t.priority, t.queue.as_str()),
        (5, 7, "later")
    );
    let t = submitted(&["submit", "--delay", "90", "--", "true"]).await;
    assert_eq!(after(&t), 90.0, "a bare number is seconds");

    let t = submitted(&[
        "submit",
        "--at",
        "2030-01-02T04:04:05.25+01:00",
        "--",
        "true",
    ])
    .await;
    assert_eq!(
        t.next_run_at,
        "2030-01-02T03:04:05.25Z"
            .parse::<chrono::DateTime<chrono::Utc>>()
            .unwrap(),
        "--at is the start time, in any offset"
    );

    // A bad value against a live server: a clear error, a failure, and nothing submitted.
    let count = async || -> i64 {
        sqlx::query_scalar("select count(*) from sked.tasks")
            .fetch_one(&api.db.pool)
            .await
            .unwrap()
    };
    let before = count().await;
    for bad in [["--delay", "15 parsecs"], ["--at", "2030-13-01T00:00:00Z"]] {
        let out = output(&mut api.sked(&["submit", bad[0], bad[1], "--", "true"])).await;
        assert!(!out.status.success(), "sked submit {bad:?} must fail");
        assert!(
            text(&out.stderr).contains(bad[0]),
            "the error names the flag {}: {out:?}",
            bad[0]
        );
    }
    assert_eq!(count().await, before, "a rejected submit submits nothing");
}

/// A reader that goes away (`sked list | head`) ends `sked` quietly with status 0: no panic,
/// no backtrace. The read end is closed before `sked` writes anything, so its first write
/// meets the closed pipe.
#[tokio::test]
async fn a_closed_pipe_ends_sked_quietly() {
    let api = Api::start().await;
    let id = api.ok(&["submit", "--", "true"]).await;
    let id = id.trim();
    for args in [
        &["list"][..],
        &["list", "--json"],
        &["show", id],
        &["submit", "--", "true"],
        &["queue", "list"],
    ] {
        let mut child = api
            .sked(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .expect("sked ends")
            .unwrap();
        let stderr = text(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "sked {args:?} with its reader gone: {:?}, stderr {stderr:?}",
            out.status
        );
    }
}
