//! Bytes a task prints or leaves that PostgreSQL cannot store, and results the database refuses
//! for any other reason, never cost another task its result or its log lines: real workers run
//! one hostile task beside 100 healthy ones (see "What PostgreSQL cannot store" in
//! `docs/runtime.md`).
//!
//! To put the hostile result in the same batch as healthy ones, a test holds the table the
//! batch writes to (`sked.task_attempts` for results, `sked.task_logs` for logs) with a lock
//! while the tasks end, as a slow database would: the worker's first write waits, and the
//! results or chunks that arrive meanwhile are written together in the next one when the lock
//! is released. A batch refused whole would show: its healthy tasks rescued as lost and run a
//! second time, or their log lines missing.

use std::time::Duration;

use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{TestWorker, config, insert, start_worker, wait_for};

const SECS: Duration = Duration::from_secs(1);
/// The healthy tasks run beside the hostile one.
const HEALTHY: usize = 100;

/// A worker with a slot for every task of a test, and a lease long enough to outlast the
/// held writes but short enough that an attempt whose result was lost is rescued (and so run
/// a second time) within the test's waits.
fn worker(db: &TestDb) -> TestWorker {
    let mut c = config(&["default"]);
    c.concurrency = 128;
    c.lease = 10 * SECS;
    start_worker(db, c)
}

/// Holds `table` with a lock that waits out every write to it (readers go on) until the
/// returned transaction is dropped or committed.
async fn hold(pool: &PgPool, table: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.expect("beginning a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "lock table {table} in share mode"
    )))
    .execute(&mut *tx)
    .await
    .expect("locking the table");
    tx
}

/// Waits until every task is in one of `states`.
async fn wait_all(pool: &PgPool, ids: &[Uuid], states: &[&str], within: Duration) {
    for id in ids {
        wait_for(pool, *id, states, within).await;
    }
}

async fn insert_noops(pool: &PgPool) -> Vec<Uuid> {
    sqlx::query_scalar(
        "insert into sked.tasks (kind) select 'noop' from generate_series(1, $1) returning id",
    )
    .bind(HEALTHY as i32)
    .fetch_all(pool)
    .await
    .expect("inserting noop tasks")
}

/// A task's state, attempt and error.
async fn ending(pool: &PgPool, id: Uuid) -> (String, i32, Option<String>) {
    sqlx::query_as("select state, attempt, error from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("reading a task")
}

/// Asserts that every healthy task succeeded with its first attempt: its result was written
/// once, so it was neither rescued nor run twice.
async fn assert_each_succeeded_once(pool: &PgPool, healthy: &[Uuid], rule: &str) {
    let mut wrong = Vec::new();
    for id in healthy {
        let (state, attempt, error) = ending(pool, *id).await;
        if state != "succeeded" || attempt != 1 {
            wrong.push(format!("{id}: {state}, attempt {attempt}, error {error:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{rule}: {} of {} healthy tasks did not succeed with their first attempt: {wrong:?}",
        wrong.len(),
        healthy.len()
    );
}

/// Runs the `hostile` tasks (the column list and values of each) beside 100 noop tasks, their
/// results written in one batch, and waits until all have ended; returns the hostile tasks and
/// the healthy ones.
///
/// A first noop task's result is written alone and waits for the lock, as would a slow
/// statement; every result that arrives meanwhile, the hostile ones among them, goes in the
/// next batch.
async fn run_beside_noops(db: &TestDb, hostile: &[&str]) -> (Vec<Uuid>, Vec<Uuid>) {
    let _worker = worker(db);
    let held = hold(&db.pool, "sked.task_attempts").await;
    let first = insert(&db.pool, "(kind) values ('noop')").await;
    wait_for(&db.pool, first, &["running"], 10 * SECS).await;
    tokio::time::sleep(SECS / 2).await;
    let mut bad = Vec::new();
    for task in hostile {
        bad.push(insert(&db.pool, task).await);
    }
    let mut healthy = insert_noops(&db.pool).await;
    healthy.push(first);
    let all: Vec<Uuid> = healthy.iter().chain(&bad).copied().collect();
    wait_all(&db.pool, &all, &["running"], 30 * SECS).await;
    // Every process has ended well before this; their results wait for the lock.
    tokio::time::sleep(2 * SECS).await;
    held.commit().await.expect("releasing the lock");
    wait_all(&db.pool, &all, &["succeeded", "failed"], 40 * SECS).await;
    (bad, healthy)
}

#[tokio::test]
async fn a_nul_byte_in_one_output_loses_no_other_result() {
    let db = TestDb::new().await;
    // A NUL byte and a byte that is not UTF-8 (0xff) in stdout and stderr.
    let (bad, noops) = run_beside_noops(
        &db,
        &[r"(command, max_attempts) values (array['sh', '-c', 'printf ''a\0b\377c''; printf ''e\0r'' >&2'], 1)"],
    )
    .await;
    let bad = bad[0];
    assert_each_succeeded_once(
        &db.pool,
        &noops,
        "a NUL byte in one task's stdout must not lose the results of the tasks written with it",
    )
    .await;
    let (state, attempt, error): (String, i32, Option<String>) = ending(&db.pool, bad).await;
    assert_eq!(
        (state.as_str(), attempt, error),
        ("succeeded", 1, None),
        "a task that prints a NUL byte succeeds like any other"
    );
    let (stdout, stderr): (String, String) =
        sqlx::query_as("select stdout_tail, stderr_tail from sked.tasks where id = $1")
            .bind(bad)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (stdout.as_str(), stderr.as_str()),
        ("a\\0b\u{FFFD}c", "e\\0r"),
        "a NUL byte is stored as the two characters \\0, a byte that is not UTF-8 as U+FFFD"
    );
    let log: String = sqlx::query_scalar(
        "select string_agg(data, '' order by id) from sked.task_logs
          where task_id = $1 and stream = 'stdout'",
    )
    .bind(bad)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        log, "a\\0b\u{FFFD}c",
        "the log of a task that prints a NUL byte keeps it escaped as \\0"
    );
}

#[tokio::test]
async fn a_nul_character_in_one_json_output_loses_no_other_result() {
    let db = TestDb::new().await;
    // \u0000 in a nested value, and in a key: the JSON text is valid, its NUL is not storable.
    let (bad, noops) = run_beside_noops(
        &db,
        &[
            r#"(command, max_attempts) values (array['sh', '-c',
               'printf ''%s'' ''{"a": {"b": ["x\u0000y"]}}'' > "$SKED_OUTPUT"'], 1)"#,
            r#"(command, max_attempts) values (array['sh', '-c',
               'printf ''%s'' ''{"k\u0000": 1}'' > "$SKED_OUTPUT"'], 1)"#,
        ],
    )
    .await;
    assert_each_succeeded_once(
        &db.pool,
        &noops,
        "a NUL character in one task's JSON output must not lose the results written with it",
    )
    .await;
    for id in bad {
        let (state, attempt, error) = ending(&db.pool, id).await;
        assert_eq!(
            (state.as_str(), attempt),
            ("failed", 1),
            "a JSON output with a NUL character fails its own attempt (error {error:?})"
        );
        assert_eq!(
            error.as_deref(),
            Some(
                "the task's output contains a NUL character (\\u0000), which PostgreSQL \
                 cannot store"
            ),
            "the error names the NUL character and why it is refused"
        );
        let output: Option<serde_json::Value> =
            sqlx::query_scalar("select output from sked.tasks where id = $1")
                .bind(id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(output, None, "a refused output is not stored in any form");
    }
}

/// The stdout log of each task, concatenated in order.
async fn stdout_logs(pool: &PgPool, ids: &[Uuid]) -> std::collections::HashMap<Uuid, String> {
    sqlx::query_as(
        "select task_id, string_agg(data, '' order by id) from sked.task_logs
          where task_id = any($1) and stream = 'stdout' group by task_id",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .expect("reading logs")
    .into_iter()
    .collect()
}

/// Runs `hostile` beside 100 tasks that each print one line, with the log writes held back
/// until every task ended; returns the hostile task and the others.
async fn run_beside_printers(db: &TestDb, hostile: &str) -> (Uuid, Vec<Uuid>) {
    let _worker = worker(db);
    let held = hold(&db.pool, "sked.task_logs").await;
    let mut printers: Vec<Uuid> = sqlx::query_scalar(
        "insert into sked.tasks (command)
         select array['sh', '-c', 'echo \"line of $SKED_TASK_ID\"'] from generate_series(1, $1)
         returning id",
    )
    .bind((HEALTHY / 2) as i32)
    .fetch_all(&db.pool)
    .await
    .expect("inserting printing tasks");
    let bad = insert(&db.pool, hostile).await;
    printers.extend(
        sqlx::query_scalar::<_, Uuid>(
            "insert into sked.tasks (command)
             select array['sh', '-c', 'echo \"line of $SKED_TASK_ID\"']
               from generate_series(1, $1) returning id",
        )
        .bind((HEALTHY / 2) as i32)
        .fetch_all(&db.pool)
        .await
        .expect("inserting printing tasks"),
    );
    let mut all = printers.clone();
    all.push(bad);
    // A task's result is written without its logs after two seconds of waiting for them.
    wait_all(&db.pool, &all, &["succeeded", "failed"], 60 * SECS).await;
    held.commit().await.expect("releasing the lock");
    // The log writer retries and writes what it holds within a few flushes.
    tokio::time::sleep(3 * SECS).await;
    (bad, printers)
}

fn assert_every_line_kept(
    logs: &std::collections::HashMap<Uuid, String>,
    printers: &[Uuid],
    rule: &str,
) {
    let missing: Vec<&Uuid> = printers
        .iter()
        .filter(|id| logs.get(id).map(String::as_str) != Some(&format!("line of {id}\n")))
        .collect();
    assert!(
        missing.is_empty(),
        "{rule}: {} of {} tasks lost their log line: {missing:?}",
        missing.len(),
        printers.len()
    );
}

#[tokio::test]
async fn a_nul_byte_in_one_log_loses_no_other_log_line() {
    let db = TestDb::new().await;
    let (bad, printers) = run_beside_printers(
        &db,
        r"(command) values (array['sh', '-c', 'sleep 0.2; printf ''x\0y\n''; printf ''z\n'''])",
    )
    .await;
    let mut ids = printers.clone();
    ids.push(bad);
    let logs = stdout_logs(&db.pool, &ids).await;
    assert_every_line_kept(
        &logs,
        &printers,
        "a NUL byte in one task's log must not lose the log lines written with it",
    );
    assert_eq!(
        logs.get(&bad).map(String::as_str),
        Some("x\\0y\nz\n"),
        "the log of a task that prints a NUL byte keeps every line, the NUL escaped as \\0"
    );
}

#[tokio::test]
async fn a_result_the_database_refuses_fails_only_its_own_attempt() {
    let db = TestDb::new().await;
    // A rule of this database (as an operator may add one) that one task's result breaks.
    sqlx::query(
        "alter table sked.tasks add constraint tasks_stdout_tail_must_not_say_refuse_me
           check (stdout_tail not like '%refuse me%')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let (bad, noops) = run_beside_noops(
        &db,
        &["(command, max_attempts) values (array['echo', 'refuse me'], 1)"],
    )
    .await;
    let bad = bad[0];
    assert_each_succeeded_once(
        &db.pool,
        &noops,
        "a result the database refuses must not lose the results written with it",
    )
    .await;
    let (state, attempt, error) = ending(&db.pool, bad).await;
    assert_eq!(
        (state.as_str(), attempt),
        ("failed", 1),
        "the attempt whose result is refused fails, and is not rescued as lost (error {error:?})"
    );
    assert_eq!(
        error.as_deref(),
        Some(
            "the attempt's result could not be stored: rejected by the schema: \
             tasks_stdout_tail_must_not_say_refuse_me"
        ),
        "the error says the result could not be stored and why"
    );
}

#[tokio::test]
async fn a_log_chunk_the_database_refuses_loses_no_other_log_line() {
    let db = TestDb::new().await;
    sqlx::query(
        "alter table sked.task_logs add constraint task_logs_must_not_say_refuse_me
           check (data not like '%refuse me%')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let (bad, printers) = run_beside_printers(
        &db,
        "(command) values (array['sh', '-c', 'sleep 0.2; echo refuse me'])",
    )
    .await;
    let mut ids = printers.clone();
    ids.push(bad);
    let logs = stdout_logs(&db.pool, &ids).await;
    assert_every_line_kept(
        &logs,
        &printers,
        "a log chunk the database refuses must not lose the log lines written with it",
    );
    assert_eq!(
        logs.get(&bad).map(String::as_str),
        Some(
            "[sked: 10 bytes of stdout could not be stored: rejected by the schema: \
             task_logs_must_not_say_refuse_me]\n"
        ),
        "a refused log chunk is replaced by a line saying what was lost and why"
    );
    assert_eq!(
        wait_for(&db.pool, bad, &["succeeded"], SECS).await,
        "succeeded",
        "a refused log chunk does not change its task's result"
    );
}
