//! Artifacts cannot reach past the worker: `file://` only beneath the directories its operator
//! allows, a refused hash reveals nothing of the content, the cache is private to the worker
//! and evicted by size, and a download is bounded in size and time and stops on cancel. See
//! `docs/runtime.md`, "Artifacts".
//!
//! These tests run as root (as on CI): the worker runs tasks as `nobody`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::Digest;
use sked_db::testing::TestDb;
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use crate::support::{config, insert, start_worker, wait_for};

const SECS: Duration = Duration::from_secs(1);

fn sha256(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A fresh directory under the system temp directory.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sked-{name}-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a file only root may read (0600), as a secret of the worker's machine would be.
fn root_only(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A script that prints `marker` when it runs.
fn script(marker: &str) -> Vec<u8> {
    format!("#!/bin/sh\necho {marker}\n").into_bytes()
}

/// A finished task's state and error.
async fn outcome(pool: &PgPool, id: Uuid) -> (String, String, String) {
    sqlx::query_as(
        "select state, coalesce(error, ''), coalesce(stdout_tail, '') from sked.tasks where id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("reading a task")
}

/// Inserts a task running the artifact at `url`, tried once.
async fn artifact_task(pool: &PgPool, url: &str, sha: &str) -> Uuid {
    insert(
        pool,
        &format!("(artifact_url, artifact_sha256, max_attempts) values ('{url}', '{sha}', 1)"),
    )
    .await
}

#[tokio::test]
async fn a_root_only_file_url_is_refused_without_an_allowed_directory() {
    let db = TestDb::new().await;
    let dir = temp_dir("secret");
    let secret = dir.join("secret.sh");
    let content = script("root-only-content");
    root_only(&secret, &content);
    let sha = sha256(&content);
    let c = config(&["default"]);
    let cache = c.work_dir.join("artifacts");
    let worker = start_worker(&db, c);

    let id = artifact_task(&db.pool, &format!("file://{}", secret.display()), &sha).await;
    wait_for(&db.pool, id, &["failed", "succeeded"], 10 * SECS).await;
    let (state, error, stdout) = outcome(&db.pool, id).await;
    assert_eq!(
        (state.as_str(), stdout.as_str()),
        ("failed", ""),
        "a worker without --artifact-dir refuses every file:// artifact (error: {error:?})"
    );
    assert!(
        error.contains("--artifact-dir"),
        "the refusal names the flag that allows a directory: {error}"
    );
    assert!(
        !cache.join(&sha).exists(),
        "a refused file is not copied into the cache"
    );
    worker.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_symlink_or_dotdot_out_of_an_allowed_directory_is_refused() {
    let db = TestDb::new().await;
    let root = temp_dir("allow");
    let allowed = root.join("allowed");
    let outside = root.join("outside");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let tool = script("allowed-tool");
    root_only(&allowed.join("tool.sh"), &tool);
    let secret = script("outside-secret");
    root_only(&outside.join("secret.sh"), &secret);
    std::os::unix::fs::symlink(outside.join("secret.sh"), allowed.join("link.sh")).unwrap();
    std::os::unix::fs::symlink(allowed.join("tool.sh"), allowed.join("inner.sh")).unwrap();

    let mut c = config(&["default"]);
    c.artifacts.dirs = vec![std::fs::canonicalize(&allowed).unwrap()];
    let worker = start_worker(&db, c);
    let (tool_sha, secret_sha) = (sha256(&tool), sha256(&secret));
    let a = allowed.display();
    let direct = artifact_task(&db.pool, &format!("file://{a}/tool.sh"), &tool_sha).await;
    let inner = artifact_task(&db.pool, &format!("file://{a}/inner.sh"), &tool_sha).await;
    let link = artifact_task(&db.pool, &format!("file://{a}/link.sh"), &secret_sha).await;
    let dotdot = artifact_task(
        &db.pool,
        &format!("file://{a}/../outside/secret.sh"),
        &secret_sha,
    )
    .await;
    for id in [direct, inner, link, dotdot] {
        wait_for(&db.pool, id, &["failed", "succeeded"], 10 * SECS).await;
    }
    for (id, what) in [(direct, "a file"), (inner, "a symlink to a file")] {
        let (state, error, stdout) = outcome(&db.pool, id).await;
        assert_eq!(
            (state.as_str(), stdout.as_str()),
            ("succeeded", "allowed-tool\n"),
            "{what} beneath an allowed directory runs (error: {error:?})"
        );
    }
    for (id, what) in [(link, "a symlink pointing out of"), (dotdot, "`..` out of")] {
        let (state, error, stdout) = outcome(&db.pool, id).await;
        assert_eq!(
            (state.as_str(), stdout.as_str()),
            ("failed", ""),
            "{what} an allowed directory is refused (error: {error:?})"
        );
        assert!(
            error.contains("not beneath") && error.contains("--artifact-dir"),
            "the refusal says the file is not beneath an allowed directory: {error}"
        );
    }
    worker.shutdown().await;
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test]
async fn a_wrong_sha256_error_does_not_reveal_the_actual_hash() {
    let db = TestDb::new().await;
    let allowed = temp_dir("hash");
    let content = script("hashed");
    root_only(&allowed.join("tool.sh"), &content);
    let actual = sha256(&content);
    let mut c = config(&["default"]);
    c.artifacts.dirs = vec![std::fs::canonicalize(&allowed).unwrap()];
    let worker = start_worker(&db, c);
    let expected = "0".repeat(64);
    let url = format!("file://{}/tool.sh", allowed.display());
    let id = artifact_task(&db.pool, &url, &expected).await;
    wait_for(&db.pool, id, &["failed", "succeeded"], 10 * SECS).await;
    let (state, error, _) = outcome(&db.pool, id).await;
    assert_eq!(state, "failed", "a wrong hash is refused: {error}");
    assert!(
        error.contains(&expected) && error.contains("differs"),
        "the error says which hash was expected and that the content differs: {error}"
    );
    assert!(
        !error.contains(&actual[..12]),
        "the error never reveals the content's actual SHA-256 ({actual}): {error}"
    );
    worker.shutdown().await;
    let _ = std::fs::remove_dir_all(allowed);
}

#[tokio::test]
async fn the_cache_is_private_and_a_task_runs_only_its_own_read_only_copy() {
    let db = TestDb::new().await;
    let content = b"#!/bin/sh\n# cached-secret-marker\necho \"$0\"\nstat -c '%a %U' \"$0\"\n";
    let sha = sked_db::worker::put_artifact(&db.pool, content)
        .await
        .unwrap();
    let c = config(&["default"]);
    let cache = c.work_dir.join("artifacts");
    let tasks = c.work_dir.join("tasks");
    let worker = start_worker(&db, c);

    let owner = artifact_task(&db.pool, &format!("pg:{sha}"), &sha).await;
    wait_for(&db.pool, owner, &["failed", "succeeded"], 10 * SECS).await;
    // A later task of another owner, as `nobody` too, reads the cache directly.
    let cached = cache.join(&sha);
    let reader = insert(
        &db.pool,
        &format!(
            "(command, max_attempts) values (array['cat', '{}'], 1)",
            cached.display()
        ),
    )
    .await;
    wait_for(&db.pool, reader, &["failed", "succeeded"], 10 * SECS).await;
    let (state, error, stdout) = outcome(&db.pool, reader).await;
    assert!(
        state == "failed" && !stdout.contains("cached-secret-marker"),
        "a task cannot read the worker's artifact cache: {state}, {error:?}, {stdout:?}"
    );

    let (state, error, stdout) = outcome(&db.pool, owner).await;
    assert_eq!(state, "succeeded", "the artifact runs: {error}");
    let mut lines = stdout.lines();
    let argv0 = lines.next().unwrap_or_default();
    assert!(
        Path::new(argv0).starts_with(&tasks),
        "the task runs a copy in its own attempt directory under {}, not {argv0}",
        tasks.display()
    );
    assert_eq!(
        lines.next(),
        Some("500 nobody"),
        "the task's copy is read-only (0500) and owned by the task's user"
    );
    let dir = std::fs::symlink_metadata(&cache).unwrap();
    assert!(
        dir.is_dir() && dir.mode() & 0o777 == 0o700 && dir.uid() == 0,
        "the cache directory is 0700 and the worker's: {:o}, uid {}",
        dir.mode(),
        dir.uid()
    );
    let file = std::fs::symlink_metadata(&cached).unwrap();
    assert!(
        file.is_file() && file.mode() & 0o077 == 0 && file.uid() == 0,
        "a cached artifact is readable by the worker's user only: {:o}, uid {}",
        file.mode(),
        file.uid()
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn the_cache_is_evicted_by_size_least_recently_used_first() {
    let db = TestDb::new().await;
    // Three artifacts of 400 KB each: a script that exits before its padding.
    let mut shas = Vec::new();
    for name in ["first", "second", "third"] {
        let mut content = format!("#!/bin/sh\necho {name}\nexit 0\n").into_bytes();
        content.extend(std::iter::repeat_n(b'#', 400 << 10));
        shas.push(
            sked_db::worker::put_artifact(&db.pool, &content)
                .await
                .unwrap(),
        );
    }
    let mut c = config(&["default"]);
    c.artifacts.cache_bytes = 1 << 20;
    let cache = c.work_dir.join("artifacts");
    let worker = start_worker(&db, c);
    // Used in this order: first, second, first again, third. The second is then the least
    // recently used, and three do not fit in 1 MB.
    for i in [0, 1, 0, 2] {
        let sha = &shas[i];
        let id = artifact_task(&db.pool, &format!("pg:{sha}"), sha).await;
        wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    }
    let kept: Vec<bool> = shas.iter().map(|s| cache.join(s).exists()).collect();
    assert_eq!(
        kept,
        [true, false, true],
        "past --artifact-cache-mb the least recently used artifact is evicted"
    );
    let total: u64 = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(total <= 1 << 20, "the cache holds at most 1 MB: {total}");
    worker.shutdown().await;
}

/// Serves plain HTTP on 127.0.0.1, answering every request with `answer`; returns the base URL.
async fn serve<F, Fut>(answer: F) -> String
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            tokio::spawn(answer(socket));
        }
    });
    format!("http://{addr}")
}

/// The `sked-worker` binary on `queue` with its own work dir and extra flags.
fn worker_process(url: &str, queue: &str, work: &Path, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"))
        .args(["--poll-secs", "0.2", "--queues", queue, "--work-dir"])
        .arg(work)
        .args(args)
        .env_clear()
        .env("DATABASE_URL", url)
        .env("PATH", sked_worker::isolation::DEFAULT_PATH)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("starting sked-worker")
}

/// The peak resident memory of a process, in bytes (`VmHWM`).
fn peak_resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kb << 10
}

#[tokio::test]
async fn an_endless_chunked_body_fails_at_the_size_cap_with_bounded_worker_memory() {
    let db = TestDb::new().await;
    // An endless chunked body, of 64 KiB chunks; the server gives up after 384 MiB so that a
    // worker buffering the body cannot take the host.
    let base = serve(|mut socket| async move {
        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        if socket.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = vec![b'x'; 64 << 10];
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(&chunk);
        frame.extend_from_slice(b"\r\n");
        for _ in 0..(384 << 4) {
            if socket.write_all(&frame).await.is_err() {
                return;
            }
        }
    })
    .await;
    let work = temp_dir("endless");
    let mut worker = worker_process(&db.url, "endless", &work, &["--artifact-max-mb", "8"]);
    let started = tokio::time::Instant::now();
    let id = insert(
        &db.pool,
        &format!(
            "(queue, artifact_url, artifact_sha256, max_attempts)
             values ('endless', '{base}/endless', '{}', 1)",
            "a".repeat(64)
        ),
    )
    .await;
    wait_for(&db.pool, id, &["failed", "succeeded"], 30 * SECS).await;
    let took = started.elapsed();
    let peak = peak_resident(worker.id().unwrap());
    let (_, error, _) = outcome(&db.pool, id).await;
    eprintln!(
        "the download ended after {took:?}; the worker's peak resident memory: {} MB",
        peak >> 20
    );
    assert!(
        error.contains("larger than") && error.contains("--artifact-max-mb"),
        "the download stops at the cap: {error}"
    );
    assert!(
        took < 10 * SECS,
        "the download stops at the cap promptly: {took:?}"
    );
    assert!(
        peak < 100 << 20,
        "the body is streamed to disk, never buffered whole: the worker's peak resident \
         memory is {} MB",
        peak >> 20
    );
    worker.kill().await.unwrap();
    let _ = std::fs::remove_dir_all(work);
}

#[tokio::test]
async fn a_server_that_never_answers_fails_the_download_at_the_timeout() {
    let db = TestDb::new().await;
    let base = serve(|socket| async move {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        drop(socket);
    })
    .await;
    let mut c = config(&["default"]);
    c.artifacts.timeout = Duration::from_secs(1);
    let worker = start_worker(&db, c);
    let started = tokio::time::Instant::now();
    let id = artifact_task(&db.pool, &format!("{base}/silent"), &"b".repeat(64)).await;
    wait_for(&db.pool, id, &["failed", "succeeded"], 10 * SECS).await;
    let took = started.elapsed();
    let (state, error, _) = outcome(&db.pool, id).await;
    assert_eq!(
        state, "failed",
        "a download without an answer fails: {error}"
    );
    assert!(
        error.contains("--artifact-timeout-secs"),
        "the error names the timeout: {error}"
    );
    assert!(
        took < 5 * SECS,
        "the download fails at its timeout of 1 s: {took:?}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_cancel_during_a_slow_download_ends_the_task_cancelled_promptly() {
    let db = TestDb::new().await;
    // Promises 1 MB and sends a byte every 100 ms.
    let base = serve(|mut socket| async move {
        let head = "HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n";
        if socket.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if socket.write_all(b"x").await.is_err() {
                return;
            }
        }
    })
    .await;
    let worker = start_worker(&db, config(&["default"]));
    let id = artifact_task(&db.pool, &format!("{base}/slow"), &"c".repeat(64)).await;
    wait_for(&db.pool, id, &["running"], 10 * SECS).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancelled_at = tokio::time::Instant::now();
    sqlx::query("select sked.task_cancel($1)")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    let state = wait_for(
        &db.pool,
        id,
        &["cancelled", "failed", "succeeded"],
        10 * SECS,
    )
    .await;
    assert_eq!(state, "cancelled", "a cancel stops the download");
    assert!(
        cancelled_at.elapsed() < 3 * SECS,
        "the download stops within a few seconds of the cancel: {:?}",
        cancelled_at.elapsed()
    );
    worker.shutdown().await;
}
