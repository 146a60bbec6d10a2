//! Tests of the worker: real processes, real PostgreSQL.

use std::time::Duration;

use sha2::Digest;
use sked_db::testing::TestDb;
use uuid::Uuid;

use crate::support::{config, insert, process_alive, read_pid, start_worker, state, wait_for};

const SECS: Duration = Duration::from_secs(1);

#[tokio::test]
async fn a_plain_sql_insert_runs_and_succeeds() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let id = insert(
        &db.pool,
        "(command) values (array['sh','-c','echo hello; echo oops >&2'])",
    )
    .await;
    wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    let (attempt, exit_code, out, err, worker_id): (i32, Option<i32>, String, String, Option<Uuid>) =
        sqlx::query_as("select attempt, exit_code, stdout_tail, stderr_tail, worker_id from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(attempt, 1, "one attempt was needed");
    assert_eq!(exit_code, Some(0), "exit code 0 is success");
    assert_eq!(out, "hello\n", "stdout tail is kept");
    assert_eq!(err, "oops\n", "stderr tail is kept");
    assert!(worker_id.is_some(), "the worker that ran it is recorded");
    let logged: Vec<(String, String)> =
        sqlx::query_as("select stream, data from sked.task_logs where task_id = $1 order by id")
            .bind(id)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(
        logged.contains(&("stdout".into(), "hello\n".into())),
        "stdout is in the logs table: {logged:?}"
    );
    assert!(
        logged.contains(&("stderr".into(), "oops\n".into())),
        "stderr is in the logs table: {logged:?}"
    );
    let history: Vec<(i32, String)> =
        sqlx::query_as("select attempt, outcome from sked.task_attempt_history where task_id = $1")
            .bind(id)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(history, vec![(1, "succeeded".to_string())]);
    worker.shutdown().await;
    let workers: i64 = sqlx::query_scalar("select count(*) from sked.workers")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(workers, 0, "a cleanly stopped worker deregisters");
}

#[tokio::test]
async fn failures_retry_with_backoff_and_fail_after_max_attempts() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let id = insert(
        &db.pool,
        "(command, backoff_base) values (array['sh','-c','echo attempt $SKED_ATTEMPT; exit 3'], '100 ms')",
    )
    .await;
    wait_for(&db.pool, id, &["failed"], 15 * SECS).await;
    type AttemptRow = (i32, String, Option<i32>, Option<String>, String);
    let attempts: Vec<AttemptRow> = sqlx::query_as(
        "select attempt, outcome, exit_code, error, stdout_tail from sked.task_attempt_history
          where task_id = $1 order by attempt",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(attempts.len(), 3, "three attempts by default: {attempts:?}");
    for (i, (attempt, outcome, code, error, out)) in attempts.iter().enumerate() {
        assert_eq!(*attempt, i as i32 + 1);
        assert_eq!(outcome, "failed");
        assert_eq!(*code, Some(3), "the exit code is recorded");
        assert_eq!(error.as_deref(), Some("exited with code 3"));
        assert_eq!(
            out,
            &format!("attempt {}\n", i + 1),
            "SKED_ATTEMPT counts attempts"
        );
    }
    // Backoff: attempt n+1 starts no earlier than base * 2^(n-1) after attempt n ended.
    let gaps: Vec<f64> = sqlx::query_scalar(
        "select g from (select extract(epoch from lead(started_at) over (order by attempt) - finished_at)::float8 as g, attempt
                          from sked.task_attempts where task_id = $1) x
          where g is not null order by attempt",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(
        gaps[0] >= 0.1 && gaps[1] >= 0.2,
        "backoff doubles from the base: {gaps:?}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let db = TestDb::new().await;
    let pidfile = std::env::temp_dir().join(format!("sked-gc-{}", Uuid::new_v4().simple()));
    let worker = start_worker(&db, config(&["default"]));
    let id = insert(
        &db.pool,
        &format!(
            "(command, timeout, max_attempts) values
             (array['sh','-c','sleep 300 & echo $! > {}; wait'], '1 s', 1)",
            pidfile.display()
        ),
    )
    .await;
    let grandchild = read_pid(&pidfile, 10 * SECS).await;
    assert!(
        process_alive(grandchild),
        "the grandchild runs before the timeout"
    );
    wait_for(&db.pool, id, &["failed"], 10 * SECS).await;
    let (outcome, error): (String, String) =
        sqlx::query_as("select outcome, error from sked.task_attempts where task_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(outcome, "timed_out");
    assert!(error.starts_with("timed out after 1"), "{error}");
    assert!(
        !process_alive(grandchild),
        "the timeout killed the grandchild {grandchild} too"
    );
    let _ = std::fs::remove_file(pidfile);
    worker.shutdown().await;
}

#[tokio::test]
async fn cancelling_a_running_task_kills_it_at_once() {
    let db = TestDb::new().await;
    let pidfile = std::env::temp_dir().join(format!("sked-cancel-{}", Uuid::new_v4().simple()));
    let worker = start_worker(&db, config(&["default"]));
    let id = insert(
        &db.pool,
        &format!(
            "(command) values (array['sh','-c','echo $$ > {}; exec sleep 300'])",
            pidfile.display()
        ),
    )
    .await;
    let pid = read_pid(&pidfile, 10 * SECS).await;
    let after: String = sqlx::query_scalar("select sked.task_cancel($1)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, "running", "a running task gets a cancel request");
    // The request reaches the worker by notification (and by its check every second): the
    // process is killed at once, not at the end of its 300 s. The bound leaves room for a
    // loaded machine; how fast it is, is not a test's to measure.
    wait_for(&db.pool, id, &["cancelled"], 15 * SECS).await;
    assert!(!process_alive(pid), "the process was killed");
    let outcome: String =
        sqlx::query_scalar("select outcome from sked.task_attempts where task_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(outcome, "cancelled");
    let _ = std::fs::remove_file(pidfile);
    worker.shutdown().await;
}

#[tokio::test]
async fn cancelling_a_waiting_task_is_immediate() {
    let db = TestDb::new().await;
    let id = insert(
        &db.pool,
        "(command, next_run_at) values (array['true'], now() + interval '1 hour')",
    )
    .await;
    let after: String = sqlx::query_scalar("select sked.task_cancel($1)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, "cancelled");
    assert_eq!(state(&db.pool, id).await, "cancelled");
    let again: String = sqlx::query_scalar("select sked.task_cancel($1)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        again, "cancelled",
        "cancelling a final task reports its state and changes nothing"
    );
}

#[tokio::test]
async fn graceful_shutdown_hands_running_tasks_back() {
    let db = TestDb::new().await;
    let mut c = config(&["default"]);
    c.shutdown_grace = Duration::from_millis(300);
    let first = start_worker(&db, c);
    // Slow on the first attempt only, so the second worker finishes it at once.
    let id = insert(
        &db.pool,
        "(command) values (array['sh','-c','if [ \"$SKED_ATTEMPT\" = 1 ]; then sleep 300; fi; echo done'])",
    )
    .await;
    wait_for(&db.pool, id, &["running"], 10 * SECS).await;
    first.shutdown().await;
    let (st, attempt, max_attempts): (String, i32, i32) =
        sqlx::query_as("select state, attempt, max_attempts from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(st, "waiting", "a shutting-down worker hands its task back");
    assert_eq!(
        (attempt, max_attempts),
        (1, 4),
        "the interrupted attempt is not charged"
    );
    let second = start_worker(&db, config(&["default"]));
    wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    let outcomes: Vec<String> = sqlx::query_scalar(
        "select outcome from sked.task_attempt_history where task_id = $1 order by attempt",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(outcomes, vec!["interrupted", "succeeded"]);
    second.shutdown().await;
}

#[tokio::test]
async fn a_killed_worker_process_loses_its_task_to_another_worker_after_the_lease() {
    let db = TestDb::new().await;
    let id = insert(
        &db.pool,
        "(command) values (array['sh','-c','if [ \"$SKED_ATTEMPT\" = 1 ]; then sleep 300; fi; echo finished'])",
    )
    .await;
    let mut victim = std::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"))
        .env("DATABASE_URL", &db.url)
        .args(["--lease-secs", "2", "--poll-secs", "0.2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting sked-worker");
    wait_for(&db.pool, id, &["running"], 20 * SECS).await;
    victim.kill().expect("kill -9 the worker");
    let _ = victim.wait();
    let killed_at = tokio::time::Instant::now();

    let mut c = config(&["default"]);
    c.lease = 2 * SECS;
    let rescuer = start_worker(&db, c);
    wait_for(&db.pool, id, &["succeeded"], 15 * SECS).await;
    assert!(
        killed_at.elapsed() < 6 * SECS,
        "taken over within the lease plus a poll: {:?}",
        killed_at.elapsed()
    );
    let history: Vec<(i32, String)> =
        sqlx::query_as("select attempt, outcome from sked.task_attempt_history where task_id = $1 order by attempt")
            .bind(id)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        history,
        vec![(1, "worker_lost".to_string()), (2, "succeeded".to_string())],
        "the lost attempt counts as failed and the second attempt succeeds"
    );
    rescuer.shutdown().await;
}

#[tokio::test]
async fn input_goes_to_stdin_and_the_environment_is_clean() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["q1"]));
    let id = insert(
        &db.pool,
        r#"(queue, command, input, env) values ('q1',
            array['sh','-c','cat; echo "$SKED_QUEUE $SKED_ATTEMPT $GREETING ${CARGO_MANIFEST_DIR:-clean} $SKED_TASK_ID"'],
            '{"order": 42}', '{"GREETING": "hi"}')"#,
    )
    .await;
    wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    let out: String = sqlx::query_scalar("select stdout_tail from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        out,
        format!("{{\"order\":42}}\nq1 1 hi clean {id}\n"),
        "stdin gets the input; env is the task's only"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_delayed_task_starts_on_time_not_at_the_next_poll() {
    let db = TestDb::new().await;
    let mut c = config(&["default"]);
    c.poll_interval = Duration::from_secs(30);
    let worker = start_worker(&db, c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id = insert(
        &db.pool,
        "(kind, next_run_at) values ('noop', now() + interval '1.5 s')",
    )
    .await;
    wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    let late: f64 = sqlx::query_scalar(
        "select extract(epoch from started_at - next_run_at)::float8 from sked.tasks where id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        (0.0..0.5).contains(&late),
        "started {late} s after it was due (poll is 30 s)"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn artifacts_run_when_their_hash_matches_and_are_refused_otherwise() {
    let db = TestDb::new().await;
    let script = b"#!/bin/sh\necho artifact says $1\n".to_vec();
    let sha = hex::encode(sha2::Sha256::digest(&script));
    let dir = std::env::temp_dir().join(format!("sked-artifact-{}", Uuid::new_v4().simple()));
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("tool.sh");
    std::fs::write(&path, &script).unwrap();
    let stored = sked_db::worker::put_artifact(&db.pool, &script)
        .await
        .unwrap();
    assert_eq!(stored, sha);
    let mut c = config(&["default"]);
    c.artifacts.dirs = vec![std::fs::canonicalize(&dir).unwrap()];
    let worker = start_worker(&db, c);
    let from_file = insert(
        &db.pool,
        &format!(
            "(artifact_url, artifact_sha256, args) values ('file://{}', '{sha}', array['file'])",
            path.display()
        ),
    )
    .await;
    let from_pg = insert(
        &db.pool,
        &format!("(artifact_url, artifact_sha256, args) values ('pg:{sha}', '{sha}', array['pg'])"),
    )
    .await;
    let wrong = "0".repeat(64);
    let tampered = insert(
        &db.pool,
        &format!(
            "(artifact_url, artifact_sha256, max_attempts) values ('file://{}', '{wrong}', 1)",
            path.display()
        ),
    )
    .await;
    wait_for(&db.pool, from_file, &["succeeded"], 10 * SECS).await;
    wait_for(&db.pool, from_pg, &["succeeded"], 10 * SECS).await;
    wait_for(&db.pool, tampered, &["failed"], 10 * SECS).await;
    let outs: Vec<Option<String>> = sqlx::query_scalar(
        "select coalesce(t.stdout_tail, t.error) from unnest($1::uuid[]) with ordinality as u(id, n)
           join sked.tasks t on t.id = u.id order by u.n",
    )
    .bind(vec![from_file, from_pg, tampered])
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(outs[0].as_deref(), Some("artifact says file\n"));
    assert_eq!(outs[1].as_deref(), Some("artifact says pg\n"));
    let error = outs[2].clone().unwrap_or_default();
    assert!(
        error.contains("refused") && error.contains(&wrong) && !error.contains(&sha),
        "a wrong hash is refused, naming the expected hash only: {error}"
    );
    let _ = std::fs::remove_dir_all(dir);
    worker.shutdown().await;
}

#[tokio::test]
async fn an_output_file_is_stored_as_the_output_artifact() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let id = insert(
        &db.pool,
        "(command, output_path) values (array['sh','-c','echo result > out.txt'], 'out.txt')",
    )
    .await;
    wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    let content: Vec<u8> = sqlx::query_scalar(
        "select a.content from sked.tasks t join sked.artifacts a on a.sha256 = t.output_sha256 where t.id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(content, b"result\n");
    worker.shutdown().await;
}

#[tokio::test]
async fn a_last_stdout_line_that_is_almost_json_is_pointed_out_in_the_log() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let broken = insert(
        &db.pool,
        r#"(command) values (array['sh','-c','echo starting; echo "{\"rows\": 3"'])"#,
    )
    .await;
    let json = insert(
        &db.pool,
        r#"(command) values (array['sh','-c','echo starting; echo "{\"rows\": 3}"'])"#,
    )
    .await;
    let text = insert(&db.pool, "(command) values (array['echo','done'])").await;
    for id in [broken, json, text] {
        wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    }
    let read = |id: Uuid| {
        let pool = db.pool.clone();
        async move {
            sqlx::query_as::<_, (Option<serde_json::Value>, Option<String>, Option<String>)>(
                "select output, stderr_tail,
                        (select string_agg(data, '' order by l.id) from sked.task_logs l
                          where l.task_id = t.id and l.stream = 'stderr')
                   from sked.tasks t where id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let (output, tail, log) = read(broken).await;
    assert_eq!(output, None);
    let hint = "[sked: the last line of stdout looks like JSON but is not";
    assert!(tail.as_deref().unwrap_or("").contains(hint), "{tail:?}");
    assert!(log.as_deref().unwrap_or("").contains(hint), "{log:?}");
    assert!(log.unwrap().contains("$SKED_OUTPUT"));
    let (output, tail, log) = read(json).await;
    assert_eq!(output, Some(serde_json::json!({"rows": 3})));
    assert!(!tail.unwrap_or_default().contains("[sked:") && log.is_none());
    let (output, tail, log) = read(text).await;
    assert_eq!(output, None);
    assert!(!tail.unwrap_or_default().contains("[sked:") && log.is_none());
    worker.shutdown().await;
}

#[tokio::test]
async fn builtin_noop_and_sleep_run_in_process() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let noop = insert(&db.pool, "(kind) values ('noop')").await;
    let sleep = insert(
        &db.pool,
        r#"(kind, input) values ('sleep', '{"seconds": 0.2}')"#,
    )
    .await;
    let too_long = insert(
        &db.pool,
        r#"(kind, input, timeout, max_attempts) values ('sleep', '{"seconds": 60}', '200 ms', 1)"#,
    )
    .await;
    wait_for(&db.pool, noop, &["succeeded"], 10 * SECS).await;
    wait_for(&db.pool, sleep, &["succeeded"], 10 * SECS).await;
    wait_for(&db.pool, too_long, &["failed"], 10 * SECS).await;
    let took: f64 = sqlx::query_scalar(
        "select extract(epoch from finished_at - started_at)::float8 from sked.tasks where id = $1",
    )
    .bind(sleep)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(took >= 0.2, "sleep slept {took} s");
    worker.shutdown().await;
}

#[tokio::test]
async fn output_reaches_the_logs_table_while_the_task_runs() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let id = insert(
        &db.pool,
        "(command) values (array['sh','-c','echo first; sleep 30; echo second'])",
    )
    .await;
    wait_for(&db.pool, id, &["running"], 10 * SECS).await;
    let deadline = tokio::time::Instant::now() + 2 * SECS;
    loop {
        let logged: Vec<String> = sqlx::query_scalar(
            "select data from sked.task_logs where task_id = $1 and stream = 'stdout' order by id",
        )
        .bind(id)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        if logged.concat() == "first\n" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "output written by a running task is in sked.task_logs within a second: {logged:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        state(&db.pool, id).await,
        "running",
        "the task is still running"
    );
    sqlx::query("select sked.task_cancel($1)")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    wait_for(&db.pool, id, &["cancelled"], 5 * SECS).await;
    worker.shutdown().await;
}

/// Serves `body` at any path over plain HTTP on 127.0.0.1; returns the base URL.
async fn serve_bytes(body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = socket.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn http_artifacts_are_downloaded_checked_and_cached() {
    let db = TestDb::new().await;
    let script = b"#!/bin/sh\necho downloaded $SKED_ATTEMPT\n".to_vec();
    let sha = hex::encode(sha2::Sha256::digest(&script));
    let base = serve_bytes(script).await;
    let c = config(&["default"]);
    let cache = c.work_dir.join("artifacts").join(&sha);
    let worker = start_worker(&db, c);
    let id = insert(
        &db.pool,
        &format!("(artifact_url, artifact_sha256) values ('{base}/tool.sh', '{sha}')"),
    )
    .await;
    wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    let out: String = sqlx::query_scalar("select stdout_tail from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(out, "downloaded 1\n");
    assert!(
        cache.exists(),
        "the artifact is cached by its hash at {}",
        cache.display()
    );
    let wrong = insert(
        &db.pool,
        &format!(
            "(artifact_url, artifact_sha256, max_attempts) values ('{base}/other', '{}', 1)",
            "f".repeat(64)
        ),
    )
    .await;
    wait_for(&db.pool, wrong, &["failed"], 10 * SECS).await;
    let error: String = sqlx::query_scalar("select error from sked.tasks where id = $1")
        .bind(wrong)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(
        error.contains("refused"),
        "a download with the wrong hash is refused: {error}"
    );
    worker.shutdown().await;
}
