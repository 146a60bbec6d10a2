//! Paths a task controls are confined to its working directory: the output file
//! (`$SKED_OUTPUT`) and `output_path` are read only as regular files beneath it, without
//! following symlinks, never blocking and up to a cap; an absolute or escaping `output_path`
//! is refused at submit. See `docs/runtime.md` ("Files a task leaves").
//!
//! These tests run as root (as on CI), so a worker without configuration runs tasks as
//! `nobody`, who cannot read a root-only file but can point a symlink at it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::json;
use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

use crate::api::{Api, assert_error};
use crate::support::{TestWorker, config, insert, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// The rule's constraint, as the schema names it.
const RULE: &str = "tasks_output_path_must_be_relative_beneath_the_task_directory";

/// The start of the error of an attempt whose output file is not a regular file beneath its
/// directory.
const NOT_REGULAR: &str = "is not a regular file beneath its directory";

/// A file only root may read (mode 0600), holding a JSON document; removed when dropped.
struct RootOnly(PathBuf);

impl RootOnly {
    fn new() -> RootOnly {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("sked-root-only-{}.json", Uuid::new_v4()));
        std::fs::write(&path, br#"{"secret": "root-only-content"}"#).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        RootOnly(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for RootOnly {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A worker on a runtime of its own with 2 threads, as the worker binary has on a 2-core
/// host: a blocking call inside it stalls that runtime, not the test's, whose waits stay
/// bounded. Its runtime is shut down without waiting for threads when dropped.
struct OwnWorker {
    worker: Option<TestWorker>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl OwnWorker {
    async fn start(db: &TestDb, config: sked_worker::WorkerConfig) -> OwnWorker {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let (url, token) = (db.url.clone(), stop.clone());
        // The pool is made on the worker's runtime: its connections belong to that runtime.
        let handle = runtime.spawn(async move {
            let pool = PgPool::connect(&url).await.expect("connecting the worker");
            sked_worker::run(pool, config, token).await
        });
        OwnWorker {
            worker: Some(TestWorker {
                stop,
                handle: Some(handle),
            }),
            runtime: Some(runtime),
        }
    }

    /// Stops the worker as on SIGTERM and waits, at most 20 s, until it has deregistered.
    async fn shutdown(mut self) {
        let worker = self.worker.take().unwrap();
        tokio::time::timeout(20 * SECS, worker.shutdown())
            .await
            .expect("the worker shuts down within 20 s");
    }
}

impl Drop for OwnWorker {
    fn drop(&mut self) {
        drop(self.worker.take());
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A finished task's error, output and output artifact.
async fn ending(
    pool: &PgPool,
    id: Uuid,
) -> (Option<String>, Option<serde_json::Value>, Option<String>) {
    sqlx::query_as("select error, output, output_sha256 from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("reading a task")
}

async fn artifacts(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sked.artifacts")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The resident memory of this process (the worker runs in it), in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

#[tokio::test]
async fn a_symlink_to_a_root_only_file_as_the_output_does_not_read_it() {
    let db = TestDb::new().await;
    let secret = RootOnly::new();
    let worker = OwnWorker::start(&db, config(&["default"])).await;
    // `cat` of the file as nobody is refused; a symlink to it is not.
    let id = insert(
        &db.pool,
        &format!(
            "(command, max_attempts) values (array['sh', '-c', 'ln -s {} \"$SKED_OUTPUT\"'], 1)",
            secret.path()
        ),
    )
    .await;
    let state = wait_for(&db.pool, id, &["succeeded", "failed"], 20 * SECS).await;
    let (error, output, _) = ending(&db.pool, id).await;
    assert!(
        !output
            .as_ref()
            .is_some_and(|o| o.to_string().contains("root-only-content")),
        "a task's output is never the content of a file it cannot read: {output:?}"
    );
    assert_eq!(
        state, "failed",
        "an output file that is a symlink fails the task"
    );
    let error = error.unwrap_or_default();
    assert!(
        error.starts_with("the task's output ($SKED_OUTPUT) ") && error.contains(NOT_REGULAR),
        "the error names the rule: {error:?}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn an_absolute_or_escaping_output_path_is_refused_at_submit() {
    let api = Api::new().await;
    let pool = &api.db.pool;
    let bad = ["/etc/shadow", "../../../../etc/shadow", "out/../../x", ".."];
    for path in bad {
        // A plain INSERT.
        let err =
            sqlx::query("insert into sked.tasks (command, output_path) values ('{true}', $1)")
                .bind(path)
                .execute(pool)
                .await
                .expect_err("an absolute or escaping output_path is refused by a plain INSERT");
        assert_eq!(
            err.as_database_error().and_then(|e| e.constraint()),
            Some(RULE),
            "{path:?}: the refusal names the rule"
        );
        // The submit function every other way in calls.
        let err = sqlx::query("select sked.tasks_submit($1, 'alice')")
            .bind(json!([{"command": ["true"], "output_path": path}]))
            .execute(pool)
            .await
            .expect_err("sked.tasks_submit refuses it");
        assert_eq!(
            err.as_database_error().and_then(|e| e.constraint()),
            Some(RULE),
            "{path:?}: sked.tasks_submit names the rule"
        );
        // REST, alone and in a batch with a valid task.
        for (uri, body) in [
            (
                "/api/v1/tasks",
                json!({"command": ["true"], "output_path": path}),
            ),
            (
                "/api/v1/tasks/batch",
                json!({"tasks": [{"command": ["true"]}, {"command": ["true"], "output_path": path}]}),
            ),
        ] {
            let (status, json) = api.post(uri, &api.alice, body).await;
            assert_eq!(
                status,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{path:?}: REST refuses it: {json}"
            );
            assert_error(&json, "rejected");
            assert_eq!(
                json["message"],
                "output_path must be a relative path beneath the task's working directory \
                 (no leading / and no .. component)",
                "the message states the rule"
            );
        }
    }
    let count: i64 = sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(count, 0, "a refused submission writes nothing");
    // Relative paths, also with dots that are not `..` components, are accepted.
    for path in ["out.txt", "./dir/out.txt", "a..b/..c", "dir/.hidden"] {
        sqlx::query("insert into sked.tasks (command, output_path) values ('{true}', $1)")
            .bind(path)
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{path:?} is beneath the task's directory: {e}"));
    }
}

#[tokio::test]
async fn an_output_path_that_is_a_symlink_or_escapes_is_refused_at_run_time_and_uploads_nothing() {
    let db = TestDb::new().await;
    let secret = RootOnly::new();
    // Rows written before the rule existed: the worker is the last line.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "alter table sked.tasks drop constraint if exists {RULE}"
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let worker = OwnWorker::start(&db, config(&["default"])).await;
    let escaping = format!("../../../../../../../..{}", secret.path());
    let cases = [
        (
            format!("ln -s {} out.json", secret.path()),
            "out.json".to_owned(),
            NOT_REGULAR,
        ),
        (
            format!(
                "mkdir d && ln -s {} d/link && ln -s d/link out.json",
                secret.path()
            ),
            "out.json".to_owned(),
            NOT_REGULAR,
        ),
        (
            format!("ln -s {} linked && true", std::env::temp_dir().display()),
            format!("linked/{}", secret.0.file_name().unwrap().to_str().unwrap()),
            NOT_REGULAR,
        ),
        (
            "true".to_owned(),
            secret.path().to_owned(),
            "is not a relative path beneath the task's directory",
        ),
        (
            "true".to_owned(),
            escaping,
            "is not a relative path beneath the task's directory",
        ),
    ];
    let mut ids = Vec::new();
    for (script, path, _) in &cases {
        let id: Uuid = sqlx::query_scalar(
            "insert into sked.tasks (command, output_path, max_attempts)
             values (array['sh', '-c', $1], $2, 1) returning id",
        )
        .bind(script)
        .bind(path)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        ids.push(id);
    }
    for (id, (_, path, rule)) in ids.iter().zip(&cases) {
        let state = wait_for(&db.pool, *id, &["succeeded", "failed"], 20 * SECS).await;
        let (error, _, sha) = ending(&db.pool, *id).await;
        assert_eq!(
            sha, None,
            "{path:?}: nothing outside the task's directory is stored"
        );
        assert_eq!(state, "failed", "{path:?}: the task fails: {error:?}");
        let error = error.unwrap_or_default();
        assert!(
            error.starts_with(&format!("the task succeeded but its output_path {path:?} "))
                && error.contains(rule),
            "{path:?}: the error names the rule: {error:?}"
        );
    }
    assert_eq!(artifacts(&db.pool).await, 0, "no row in sked.artifacts");
    worker.shutdown().await;
}

#[tokio::test]
async fn a_dev_zero_symlink_as_the_output_ends_the_task_without_growing_the_worker() {
    let db = TestDb::new().await;
    let worker = OwnWorker::start(&db, config(&["default"])).await;
    // A few tasks first, so the worker's own memory is at its working size.
    for _ in 0..3 {
        let id = insert(&db.pool, "(command) values (array['true'])").await;
        wait_for(&db.pool, id, &["succeeded"], 20 * SECS).await;
    }
    let before = resident_bytes();
    let started = Instant::now();
    let zero = insert(
        &db.pool,
        "(command, max_attempts) values (array['sh', '-c', 'ln -s /dev/zero \"$SKED_OUTPUT\"'], 1)",
    )
    .await;
    // A file of 1 GB (sparse) as the output and as output_path: refused by its size.
    let big = insert(
        &db.pool,
        "(command, max_attempts)
         values (array['sh', '-c', 'truncate -s 1G \"$SKED_OUTPUT\"'], 1)",
    )
    .await;
    let big_artifact = insert(
        &db.pool,
        "(command, output_path, max_attempts)
         values (array['sh', '-c', 'truncate -s 1G big'], 'big', 1)",
    )
    .await;
    let mut grown = 0;
    for id in [zero, big, big_artifact] {
        let deadline = Instant::now() + 20 * SECS;
        loop {
            grown = grown.max(resident_bytes().saturating_sub(before));
            assert!(
                grown < 100 << 20,
                "the worker's memory never grows with a file a task leaves: +{} MB",
                grown >> 20
            );
            let state = crate::support::state(&db.pool, id).await;
            if state == "failed" || state == "succeeded" {
                assert_eq!(state, "failed", "task {id} fails");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "task {id} ends promptly, but is {state} after 20 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let (error, _, _) = ending(&db.pool, zero).await;
    let error = error.unwrap_or_default();
    assert!(
        error.starts_with("the task's output ($SKED_OUTPUT) ") && error.contains(NOT_REGULAR),
        "a device is refused with the rule: {error:?}"
    );
    let (error, _, _) = ending(&db.pool, big).await;
    assert_eq!(
        error.as_deref(),
        Some("the task's output ($SKED_OUTPUT) is larger than the limit of 65536 bytes"),
        "an output file past the cap is refused"
    );
    let (error, _, _) = ending(&db.pool, big_artifact).await;
    assert_eq!(
        error.as_deref(),
        Some(
            "the task succeeded but its output_path \"big\" is larger than the limit of \
             536870912 bytes"
        ),
        "an output_path past the cap is refused"
    );
    println!(
        "three hostile outputs refused in {:?}; resident memory grew by at most {} KB",
        started.elapsed(),
        grown >> 10
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn fifos_as_the_output_do_not_block_the_worker() {
    let db = TestDb::new().await;
    let mut c = config(&["default"]);
    c.concurrency = 4;
    let worker = OwnWorker::start(&db, c).await;
    let mut fifos = Vec::new();
    for script in [
        "mkfifo \"$SKED_OUTPUT\"",
        "mkfifo \"$SKED_OUTPUT\"; sleep 0.2",
    ] {
        fifos.push(
            insert(
                &db.pool,
                &format!("(command, max_attempts) values (array['sh', '-c', '{script}'], 1)"),
            )
            .await,
        );
    }
    // And a FIFO as output_path.
    fifos.push(
        insert(
            &db.pool,
            "(command, output_path, max_attempts)
             values (array['sh', '-c', 'mkfifo pipe'], 'pipe', 1)",
        )
        .await,
    );
    for id in &fifos {
        wait_for(&db.pool, *id, &["failed"], 20 * SECS).await;
        let (error, _, _) = ending(&db.pool, *id).await;
        let error = error.unwrap_or_default();
        assert!(
            error.contains(NOT_REGULAR),
            "a FIFO is refused with the rule: {error:?}"
        );
    }
    let later: Vec<Uuid> = {
        let mut ids = Vec::new();
        for _ in 0..5 {
            ids.push(insert(&db.pool, "(command) values (array['true'])").await);
        }
        ids
    };
    for id in later {
        wait_for(&db.pool, id, &["succeeded"], 20 * SECS).await;
    }
    worker.shutdown().await;
}

/// Takes the database back to before the rule: its migration not applied, its constraint gone.
async fn before_the_rule(pool: &PgPool) {
    sqlx::query("delete from _sqlx_migrations where version = 20261211000001")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "alter table sked.tasks drop constraint {RULE}"
    )))
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn the_migration_names_unfinished_rows_that_break_the_output_path_rule_and_keeps_history() {
    let db = TestDb::new().await;
    before_the_rule(&db.pool).await;
    // A finished task is history: the migration leaves it, and the rule is not validated.
    let old = insert(
        &db.pool,
        "(command, output_path, state, finished_at, attempt)
         values (array['true'], '/etc/shadow', 'succeeded', now(), 1)",
    )
    .await;
    sked_db::migrate(&db.pool)
        .await
        .expect("finished rows that break the rule do not stop the migration");
    let validated: bool = sqlx::query_scalar(
        "select convalidated from pg_constraint where conname = $1 and conrelid = 'sked.tasks'::regclass",
    )
    .bind(RULE)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        !validated,
        "the rule is not validated while history breaks it"
    );
    let err = insert_err(
        &db.pool,
        "(command, output_path) values ('{true}', '/etc/x')",
    )
    .await;
    assert!(err.contains(RULE), "new rows are held to the rule: {err}");

    // An unfinished task would fail every later write of its row: the migration stops and
    // names it, and changes nothing.
    before_the_rule(&db.pool).await;
    let waiting = insert(
        &db.pool,
        "(command, output_path) values ('{true}', '../../x')",
    )
    .await;
    // On a pool of its own, closed after: a failed migration may leave the migrator's
    // session lock on its connection.
    let refused = PgPool::connect(&db.url).await.unwrap();
    let err = sked_db::migrate(&refused)
        .await
        .expect_err("an unfinished task that breaks the rule stops the migration")
        .to_string();
    refused.close().await;
    assert!(
        err.contains("output_path must be a relative path beneath the task's directory")
            && err.contains(&waiting.to_string())
            && !err.contains(&old.to_string()),
        "the error states the rule and names the unfinished task only: {err}"
    );
    let applied: i64 =
        sqlx::query_scalar("select count(*) from _sqlx_migrations where version = 20261211000001")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        applied, 0,
        "the refused migration is not recorded as applied"
    );

    // Once the operator fixed it, the migration runs and validates the rule.
    sqlx::query("delete from sked.tasks")
        .execute(&db.pool)
        .await
        .unwrap();
    sked_db::migrate(&db.pool).await.expect("migrating again");
    let validated: bool = sqlx::query_scalar(
        "select convalidated from pg_constraint where conname = $1 and conrelid = 'sked.tasks'::regclass",
    )
    .bind(RULE)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(validated, "with no row breaking it the rule is validated");
}

/// The error of a plain INSERT expected to be refused.
async fn insert_err(pool: &PgPool, columns_and_values: &str) -> String {
    let sql = format!("insert into sked.tasks {columns_and_values}");
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .expect_err("the insert is refused")
        .as_database_error()
        .and_then(|e| e.constraint().map(str::to_owned))
        .unwrap_or_default()
}
