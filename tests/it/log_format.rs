//! `--log-format json`: every line a binary logs is one JSON object, with the fields of the
//! event and of its spans flattened (an attempt's `task_id`, `attempt` and `queue`, the
//! `worker`'s name); a format it does not know is refused before anything runs.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use sked_db::testing::TestDb;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::support::{insert, stop, wait_for};

/// Every line of `stderr` as a JSON object with a time, a level and a target.
fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("every log line is JSON ({e}): {line:?}"));
            for key in ["timestamp", "level", "target"] {
                assert!(v[key].is_string(), "a log line has {key}: {line}");
            }
            v
        })
        .collect()
}

#[tokio::test]
async fn a_worker_logs_json_lines_with_the_attempt_and_the_worker_as_fields() {
    let db = TestDb::new().await;
    let id = insert(&db.pool, "(queue, command) values ('lq', array['true'])").await;
    let work = std::env::temp_dir().join(format!("sked-logjson-{}", uuid::Uuid::new_v4()));
    let worker = Command::new(env!("CARGO_BIN_EXE_sked-worker"))
        .args(["--log-format", "json", "--name", "w-json", "--queues", "lq"])
        .args(["--poll-secs", "0.2", "--work-dir"])
        .arg(&work)
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "info,sked_worker=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start sked-worker");
    assert_eq!(
        wait_for(&db.pool, id, &["succeeded"], Duration::from_secs(30)).await,
        "succeeded"
    );
    // SIGTERM: the worker shuts down, logging that too.
    let (status, stderr) = stop(worker).await;
    assert!(status.success(), "{status:?}\n{stderr}");
    let _ = std::fs::remove_dir_all(&work);

    let lines = json_lines(&stderr);
    let started = lines
        .iter()
        .find(|l| l["message"] == "attempt started")
        .unwrap_or_else(|| panic!("the attempt's start is logged:\n{stderr}"));
    assert_eq!(started["task_id"], id.to_string(), "{started}");
    assert_eq!(started["attempt"], 1, "{started}");
    assert_eq!(started["queue"], "lq", "{started}");
    assert_eq!(started["worker"], "w-json", "{started}");
    assert_eq!(started["level"], "DEBUG");
    let stopped = lines
        .iter()
        .find(|l| l["message"] == "worker stopped")
        .unwrap_or_else(|| panic!("the worker's stop is logged:\n{stderr}"));
    assert_eq!(
        stopped["worker"], "w-json",
        "what the worker logs outside attempts names it too: {stopped}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["task_id"].is_null() || l["task_id"] == id.to_string()),
        "no other task appears"
    );
}

#[tokio::test]
async fn the_server_logs_json_and_an_unknown_format_is_refused() {
    let db = TestDb::new().await;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_sked-server"))
        .args(["--listen", &addr.to_string()])
        .env("SKED_LOG_FORMAT", "json")
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start sked-server");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the server listens");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = server.id().expect("running") as i32;
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let mut stderr = String::new();
    server
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    let _ = server.wait().await;
    let lines = json_lines(&stderr);
    let listening = lines
        .iter()
        .find(|l| l["message"] == "API listening")
        .unwrap_or_else(|| panic!("the server says where it listens:\n{stderr}"));
    assert_eq!(listening["addr"], addr.to_string(), "{listening}");
    assert_eq!(listening["level"], "INFO");

    let refused = Command::new(env!("CARGO_BIN_EXE_sked"))
        .args(["--log-format", "xml", "list"])
        .output()
        .await
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "a usage error");
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("xml") && message.contains("text") && message.contains("json"),
        "the refusal names the value and the formats: {message}"
    );
}
