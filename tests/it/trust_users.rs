//! What one user of a host or of the API cannot do to another: a worker's default work
//! directory is private to its user, `sked dev` keeps its files under `.sked/` and takes the
//! next free port, a task cannot read its worker's environment, one request cannot create
//! more task rows than the server allows, tokens expire and a revoked token's websocket is
//! closed, only admins see where workers run, and a service's health check runs under the
//! same limits as its process.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use sked_db::testing::TestDb;
use sked_db::token::Role;
use sked_server::EventsConfig;
use sked_types::events::CLOSE_UNAUTHORIZED;
use sked_worker::isolation::LimitsMode;
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::api::Api;
use crate::support::{config, insert, start_worker, start_worker_on, wait_for};

const SECS: Duration = Duration::from_secs(1);
const NOBODY: u32 = 65534;

/// A fresh directory that every user may create files in, as the system temp directory.
fn shared_temp() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sked-users-{}", Uuid::new_v4().simple()));
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// The `sked-worker` binary run as `nobody` with `tmp` as its temp directory and no
/// `--work-dir`: it picks its default work directory.
fn nobody_worker(url: &str, tmp: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"));
    cmd.args(["--poll-secs", "0.2"])
        .env_clear()
        .env("DATABASE_URL", url)
        .env("PATH", sked_worker::isolation::DEFAULT_PATH)
        .env("TMPDIR", tmp)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Waits until task `id` succeeded while `worker` runs; panics with the worker's stderr when
/// it stops first.
async fn succeeds_on(pool: &PgPool, id: Uuid, worker: &mut tokio::process::Child, rule: &str) {
    let deadline = Instant::now() + 30 * SECS;
    loop {
        if let Some(status) = worker.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut stderr) = worker.stderr.take() {
                use tokio::io::AsyncReadExt;
                let _ = stderr.read_to_string(&mut err).await;
            }
            panic!("{rule}: the worker stopped ({status}): {err}");
        }
        if crate::support::state(pool, id).await == "succeeded" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{rule}: the task should succeed within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn stdout_tail(pool: &PgPool, id: Uuid) -> String {
    sqlx::query_scalar("select coalesce(stdout_tail, '') from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn two_users_on_one_host_run_workers_with_the_default_work_dir() {
    let db = TestDb::new().await;
    let tmp = shared_temp();
    // What a worker run by another user (root) leaves in the temp directory.
    std::fs::create_dir_all(tmp.join("sked-worker/tasks")).unwrap();
    std::fs::set_permissions(
        tmp.join("sked-worker/tasks"),
        std::fs::Permissions::from_mode(0o711),
    )
    .unwrap();

    let mut worker = nobody_worker(&db.url, &tmp).spawn().unwrap();
    let id = insert(&db.pool, "(command) values (array['id', '-u'])").await;
    succeeds_on(
        &db.pool,
        id,
        &mut worker,
        "a user's worker starts with the default work dir after another user's worker ran",
    )
    .await;
    assert_eq!(stdout_tail(&db.pool, id).await, "65534\n");
    let own = tmp.join(format!("sked-worker-{NOBODY}"));
    let meta = std::fs::symlink_metadata(&own)
        .unwrap_or_else(|e| panic!("the default work dir is {}: {e}", own.display()));
    assert!(meta.is_dir());
    assert_eq!(
        meta.uid(),
        NOBODY,
        "the default work dir belongs to its user"
    );
    assert_eq!(
        meta.mode() & 0o022,
        0,
        "nobody else may write in the default work dir"
    );
    worker.kill().await.unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
}

#[tokio::test]
async fn a_default_work_dir_that_is_a_symlink_or_someone_elses_is_refused() {
    let db = TestDb::new().await;
    let tmp = shared_temp();
    let own = tmp.join(format!("sked-worker-{NOBODY}"));
    let elsewhere = tmp.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::chown(&elsewhere, Some(NOBODY), Some(NOBODY)).unwrap();

    let refused = |what: &'static str, wanted: &'static str| {
        let (url, tmp) = (db.url.clone(), tmp.clone());
        async move {
            let out = tokio::time::timeout(10 * SECS, nobody_worker(&url, &tmp).output())
                .await
                .unwrap_or_else(|_| {
                    panic!("a worker should refuse a default work dir that is {what}, not run")
                })
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(!out.status.success(), "{what}: {stderr}");
            assert!(
                stderr.contains(wanted),
                "a default work dir that is {what} is refused with a message saying so \
                 ({wanted:?}): {stderr}"
            );
        }
    };
    // Planted by another user: a link to a directory of its choice.
    std::os::unix::fs::symlink(&elsewhere, &own).unwrap();
    refused("a symbolic link", "is a symbolic link").await;
    std::fs::remove_file(&own).unwrap();
    // Made by another user (root here).
    std::fs::create_dir(&own).unwrap();
    refused("owned by another user", "is owned by uid 0").await;
    // Its own, but others may write in it.
    std::os::unix::fs::chown(&own, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused("writable by others", "others may write in it").await;
    assert_eq!(
        std::fs::read_dir(&elsewhere).unwrap().count(),
        0,
        "nothing was written through the link"
    );
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `sked dev` over `url` in `dir` on `listen`: the child and its banner's lines.
fn dev(url: &str, dir: &Path, listen: &str) -> (std::process::Child, Vec<String>) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sked"))
        .args(["dev", "--listen", listen, "--poll-secs", "0.2"])
        .args(["--shutdown-grace-secs", "2"])
        .env("DATABASE_URL", url)
        .env_remove("SKED_WORK_DIR")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut banner = vec![];
    for line in BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        let done = line.contains("Press Ctrl-C");
        banner.push(line);
        if done {
            break;
        }
    }
    (child, banner)
}

#[tokio::test]
async fn sked_dev_keeps_its_work_dir_under_dot_sked_and_takes_the_next_port_when_busy() {
    let db = TestDb::new().await;
    let dir = std::env::temp_dir().join(format!("sked-dev-{}", Uuid::new_v4().simple()));
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Another user's `sked dev` holds the port.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();

    let (url, d) = (db.url.clone(), dir.clone());
    let (mut child, banner) =
        tokio::task::spawn_blocking(move || dev(&url, &d, &format!("127.0.0.1:{port}")))
            .await
            .unwrap();
    let api = banner
        .iter()
        .find_map(|l| l.trim().strip_prefix("API:"))
        .map(|rest| rest.trim().to_owned())
        .unwrap_or_else(|| panic!("sked dev starts although its port is busy: {banner:?}"));
    assert!(
        !api.contains(&format!(":{port}/")),
        "the banner names the free port taken instead of the busy one: {api}"
    );
    assert!(
        banner
            .iter()
            .any(|l| l.contains(&format!("{port} was busy"))),
        "the banner says the asked port was busy: {banner:?}"
    );

    let id = insert(&db.pool, "(command) values (array['pwd'])").await;
    wait_for(&db.pool, id, &["succeeded"], 30 * SECS).await;
    let pwd = stdout_tail(&db.pool, id).await;
    assert!(
        pwd.starts_with(&format!("{}/", dir.join(".sked/work").display())),
        "sked dev keeps its task directories under .sked/ of the current directory: {pwd}"
    );
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let _ = tokio::task::spawn_blocking(move || child.wait()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_task_cannot_read_its_workers_environment() {
    let db = TestDb::new().await;
    let work = std::env::temp_dir().join(format!("sked-environ-{}", Uuid::new_v4().simple()));
    let mut worker = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"))
        .args(["--poll-secs", "0.2", "--work-dir"])
        .arg(&work)
        .env_clear()
        .env("DATABASE_URL", &db.url)
        .env("PATH", sked_worker::isolation::DEFAULT_PATH)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The task runs as the worker's own user; its parent is the worker.
    let id = insert(
        &db.pool,
        r#"(command) values (array['sh', '-c', 'tr "\0" "\n" < /proc/$PPID/environ; echo read=$?'])"#,
    )
    .await;
    succeeds_on(&db.pool, id, &mut worker, "the probe runs").await;
    let out = stdout_tail(&db.pool, id).await;
    assert!(
        !out.contains("DATABASE_URL"),
        "a task running as its worker's user cannot read the worker's environment: {out}"
    );
    assert!(
        out.contains("read=1") || out.contains("read=2"),
        "reading /proc/<worker>/environ is refused: {out}"
    );
    worker.kill().await.unwrap();
    let _ = std::fs::remove_dir_all(&work);
}

#[tokio::test]
async fn one_request_cannot_create_more_task_rows_than_the_quota() {
    let api = Api::new().await;
    let count = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from sked.tasks")
            .fetch_one(&api.db.pool)
            .await
            .unwrap()
    };
    // 3 tasks of 10,000 shards each: 30,003 rows.
    let task = json!({"command": ["true"], "shards": 10000});
    let (status, body) = api
        .post(
            "/api/v1/tasks/batch",
            &api.alice,
            json!({"tasks": [task, task, task]}),
        )
        .await;
    assert_eq!(
        status.as_u16(),
        413,
        "a batch over the rows allowed per request is refused: {body}"
    );
    crate::api::assert_error(&body, "too_large");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("30003") && message.contains("20000"),
        "the refusal names the rows asked for and the limit: {message}"
    );
    assert_eq!(count().await, 0, "a refused request writes nothing");

    // A workflow of two such tasks: 20,002 rows.
    let (status, body) = api
        .post(
            "/api/v1/workflows",
            &api.alice,
            json!({"tasks": [
                {"name": "a", "command": ["true"], "shards": 10000},
                {"name": "b", "command": ["true"], "shards": 10000, "depends_on": ["a"]},
            ]}),
        )
        .await;
    assert_eq!(status.as_u16(), 413, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("20000"),
        "the refusal names the limit: {body}"
    );
    assert_eq!(count().await, 0, "a refused workflow writes nothing");

    // Within the limit: one task of 10,000 shards.
    let (status, body) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"command": ["true"], "shards": 10000}),
        )
        .await;
    assert_eq!(
        status.as_u16(),
        201,
        "a request within the limit is accepted: {body}"
    );
    assert_eq!(count().await, 10001);
}

#[tokio::test]
async fn a_user_token_sees_no_hosts_or_pids_of_workers() {
    let api = Api::new().await;
    let mut c = config(&["default"]);
    c.name = None;
    let worker = start_worker_on(&api.db.pool, c);
    let deadline = Instant::now() + 10 * SECS;
    let admin_view = loop {
        let (_, body) = api.get("/api/v1/workers", &api.admin).await;
        if body.as_array().is_some_and(|w| !w.is_empty()) {
            break body[0].clone();
        }
        assert!(
            Instant::now() < deadline,
            "the worker registers within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let pid = std::process::id();
    assert_eq!(admin_view["pid"], pid, "an admin sees the worker's pid");
    let host = admin_view["host"].as_str().unwrap().to_owned();
    assert!(!host.is_empty(), "an admin sees the worker's host");

    let (status, body) = api.get("/api/v1/workers", &api.alice).await;
    assert_eq!(status.as_u16(), 200, "{body}");
    let seen = body[0].to_string();
    assert!(
        body[0]["pid"].is_null(),
        "a user token does not see a worker's pid: {seen}"
    );
    assert!(
        body[0]["host"].as_str().is_none_or(str::is_empty),
        "a user token does not see a worker's host: {seen}"
    );
    assert!(
        !seen.contains(&host) && !seen.contains(&format!(":{pid}")),
        "nothing in a user's answer names the host or the pid: {seen}"
    );
    let listed_name = body[0]["name"].clone();

    // Nor do the copies of the user's own service, which name their worker as the list does.
    let service: uuid::Uuid = sqlx::query_scalar(
        "select sked.task_submit(kind => 'service', command => array['sleep', '300'], owner => 'alice')",
    )
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    let path = format!("/api/v1/services/{service}");
    let copy = loop {
        let (_, body) = api.get(&path, &api.alice).await;
        if body["copies"][0]["worker_id"].is_string() {
            break body["copies"][0].clone();
        }
        assert!(
            Instant::now() < deadline + 10 * SECS,
            "the copy is claimed: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seen = copy.to_string();
    assert!(
        copy["worker_host"].is_null() && !seen.contains(&host),
        "a user's service does not name its workers' host: {seen}"
    );
    assert_eq!(
        copy["worker_name"], listed_name,
        "its copies name the worker as the list does"
    );
    let (_, body) = api.get(&path, &api.admin).await;
    assert_eq!(
        body["copies"][0]["worker_host"], host,
        "an admin sees the copy's host"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn an_expired_token_is_refused_with_a_401_naming_its_expiry() {
    let api = Api::new().await;
    let sked = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sked"))
            .args(args)
            .env("DATABASE_URL", &api.db.url)
            .output()
            .unwrap()
    };
    let out = sked(&[
        "token",
        "create",
        "--owner",
        "carol",
        "--role",
        "user",
        "--expires-in",
        "1s",
    ]);
    assert!(out.status.success(), "{out:?}");
    let secret = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    let (status, body) = api.get("/api/v1/me", &secret).await;
    assert_eq!(
        status.as_u16(),
        200,
        "a token works until it expires: {body}"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, body) = api.get("/api/v1/me", &secret).await;
    assert_eq!(status.as_u16(), 401, "an expired token is refused: {body}");
    assert!(
        body["message"].as_str().unwrap().contains("expired"),
        "the refusal says the token expired: {body}"
    );

    let out = sked(&[
        "token",
        "create",
        "--owner",
        "carol",
        "--role",
        "user",
        "--expires-in",
        "30d",
    ]);
    assert!(out.status.success(), "{out:?}");
    let list = String::from_utf8(sked(&["token", "list"]).stdout).unwrap();
    assert!(
        list.contains("EXPIRES"),
        "sked token list shows when tokens expire: {list}"
    );
    for bad in ["0s", "soon", "-3d"] {
        let out = sked(&[
            "token",
            "create",
            "--owner",
            "carol",
            "--role",
            "user",
            &format!("--expires-in={bad}"),
        ]);
        assert!(!out.status.success(), "--expires-in {bad} is refused");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--expires-in"),
            "the refusal names the flag: {out:?}"
        );
    }
}

#[tokio::test]
async fn a_revoked_tokens_open_websocket_is_closed() {
    let db = TestDb::new().await;
    let secret = sked_db::token::create(&db.pool, "alice", Role::User, "t")
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn(sked_server::serve_with(
        db.pool.clone(),
        listener,
        stop.clone(),
        EventsConfig::default(),
    ));
    let mut request = format!("ws://{addr}/api/v1/events")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {secret}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let hello = tokio::time::timeout(5 * SECS, ws.next()).await.unwrap();
    assert!(
        matches!(&hello, Some(Ok(Message::Text(t))) if t.contains("hello")),
        "{hello:?}"
    );
    let id: Uuid = sqlx::query_scalar("select id from sked.api_tokens where owner = 'alice'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(sked_db::token::revoke(&db.pool, id).await.unwrap());
    let revoked = Instant::now();
    let closed = loop {
        let message = tokio::time::timeout_at(revoked + 15 * SECS, ws.next())
            .await
            .unwrap_or_else(|_| panic!("a revoked token's websocket is closed within seconds"));
        match message {
            Some(Ok(Message::Close(Some(frame)))) => break frame,
            Some(Ok(Message::Text(_) | Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("the server closes with a code and a reason, got {other:?}"),
        }
    };
    assert_eq!(u16::from(closed.code), CLOSE_UNAUTHORIZED);
    assert!(
        closed.reason.contains("revoked"),
        "the reason says the token was revoked: {closed:?}"
    );
    assert!(
        revoked.elapsed() < 10 * SECS,
        "closed within 10 s of the revocation"
    );
    stop.cancel();
    let _ = server.await;
}

#[tokio::test]
async fn a_health_check_runs_under_the_limits_of_its_service() {
    let db = TestDb::new().await;
    let mut c = config(&["default"]);
    c.isolation.limits = LimitsMode::Rlimit;
    let worker = start_worker(&db, c);
    // Healthy only when the probe has the copy's memory limit (RLIMIT_DATA in this mode).
    let service: Uuid = sqlx::query_scalar(
        r#"select sked.task_submit(kind => 'service', command => array['sleep', '300'],
             memory_mb => 64,
             health_check => '{"command": ["sh", "-c",
                 "grep \"Max data size\" /proc/self/limits | grep -qv unlimited"],
                 "interval_secs": 0.2, "failures": 100}')"#,
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let deadline = Instant::now() + 20 * SECS;
    loop {
        let healthy: Option<bool> =
            sqlx::query_scalar("select healthy_at is not null from sked.tasks where shard_of = $1")
                .bind(service)
                .fetch_optional(&db.pool)
                .await
                .unwrap();
        if healthy == Some(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a health check probe runs with its service's limits, so it passes within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sqlx::query("select sked.task_cancel($1)")
        .bind(service)
        .execute(&db.pool)
        .await
        .unwrap();
    worker.shutdown().await;
}
