//! The thin clients' own test suites, each against a fresh migrated database with a real
//! worker serving queue `default`: `clients/python` (pytest, sync and async) and
//! `clients/typescript` (node's test runner). They cover submitting inside the caller's
//! transaction, bulk and workflow submissions, awaiting (success, failure, cancel, timeout,
//! workflows), idempotency across completion and conflicts, reads, logs, retry, schedules
//! and the typed errors.
//!
//! Needs `SKED_CLIENT_PYTHON` (an interpreter with `clients/python[test]` installed) and
//! `SKED_CLIENT_NPM` (with `npm ci` run in `clients/typescript`), which `cargo xtask test`
//! sets up; `SKED_CLIENT_TESTS=skip` leaves these tests out.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use sked_db::testing::TestDb;

use crate::support::{config, start_worker};

/// The program named by `var`, or `None` (with a message) when the clients' tests are
/// skipped.
fn program(var: &str) -> Option<PathBuf> {
    if std::env::var("SKED_CLIENT_TESTS").is_ok_and(|v| v == "skip") {
        eprintln!("SKED_CLIENT_TESTS=skip: the clients' tests do not run");
        return None;
    }
    let found = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "the clients' tests need {var} (set by `cargo xtask test`, which installs what they \
             need), or SKED_CLIENT_TESTS=skip"
        )
    });
    Some(found)
}

fn client_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("clients")
        .join(name)
}

/// Runs `command` with `DATABASE_URL` of a fresh database that a worker serves, and asserts
/// that it succeeds, showing its output.
async fn passes(mut command: tokio::process::Command, what: &str) {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    // A libpq URL: the test database's without the options only sqlx reads.
    let mut url = url::Url::parse(&db.url).expect("the test database's URL");
    url.set_query(None);
    command
        .env("DATABASE_URL", url.as_str())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(300), command.output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within 5 minutes"))
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{what}:\n{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn the_python_client_passes_its_tests_against_a_real_worker() {
    let Some(python) = program("SKED_CLIENT_PYTHON") else {
        return;
    };
    let dir = client_dir("python");
    let mut command = tokio::process::Command::new(python);
    command
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&dir);
    passes(command, "pytest in clients/python").await;
}

#[tokio::test]
async fn the_typescript_client_passes_its_tests_against_a_real_worker() {
    let Some(npm) = program("SKED_CLIENT_NPM") else {
        return;
    };
    let dir = client_dir("typescript");
    let mut command = tokio::process::Command::new(npm);
    command.args(["test", "--silent"]).current_dir(&dir);
    passes(command, "npm test in clients/typescript").await;
}
