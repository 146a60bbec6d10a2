//! Tests of long-running services (docs/services.md): copies spread over real workers and
//! moved after kill -9 of one within the lease, restarts in place with a growing backoff,
//! on_failure, health checks, a rolling update that never drops below N−1 running copies,
//! stop, scaling, the REST API and CLI, the dashboard (a service's copies, the services page),
//! rejected input, and the reconciler in SQL with time as an input.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use chrono::{DateTime, Utc};
use serde_json::json;
use sked_db::testing::TestDb;
use sked_types::{TaskKind, TaskState};
use sqlx::PgPool;
use tokio::time::Instant;
use uuid::Uuid;

use crate::support::{config, process_alive, read_pid, start_worker, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// One copy as the tests look at it.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Copy {
    id: Uuid,
    shard_index: i32,
    generation: i32,
    state: String,
    attempt: i32,
    worker_id: Option<Uuid>,
    up: bool,
    attached: bool,
    restarts: i32,
}

async fn copies(pool: &PgPool, service: Uuid) -> Vec<Copy> {
    sqlx::query_as(
        "select c.id, c.shard_index, c.generation, c.state, c.attempt, c.worker_id,
                sked.service_copy_up(c.state, c.up_since, c.started_at) as up,
                exists (select 1 from sked.task_edges e
                         where e.task_id = $1 and e.depends_on = c.id) as attached,
                coalesce(c.restarts, 0) as restarts
           from sked.tasks c where c.shard_of = $1 order by c.shard_index, c.generation, c.id",
    )
    .bind(service)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Waits until `ok` holds for the service's copies; panics with them after `within`.
async fn wait_copies(
    pool: &PgPool,
    service: Uuid,
    within: Duration,
    what: &str,
    ok: impl Fn(&[Copy]) -> bool,
) -> Vec<Copy> {
    let deadline = Instant::now() + within;
    loop {
        let now = copies(pool, service).await;
        if ok(&now) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; copies: {now:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn submit(pool: &PgPool, call: &str) -> Uuid {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select {call}")))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{call} should be accepted: {e}"))
}

/// A directory that the tasks may write to whatever user they run as (a worker running as
/// root runs them as an unprivileged user).
fn open_dir(dir: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
}

fn worker_process(db: &TestDb, lease_secs: &str) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"))
        .env("DATABASE_URL", &db.url)
        .env_remove("RUST_LOG")
        .args(["--lease-secs", lease_secs, "--poll-secs", "0.2"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting sked-worker")
}

#[tokio::test]
async fn two_replicas_run_on_two_workers_and_a_killed_workers_copy_moves_within_the_lease() {
    let db = TestDb::new().await;
    let lease = 3 * SECS;
    let mut victim = worker_process(&db, "3");
    let mut survivor = worker_process(&db, "3");
    // Both workers are registered before the service exists, so both see the copies as new.
    let deadline = Instant::now() + 20 * SECS;
    while sqlx::query_scalar::<_, i64>("select count(*) from sked.workers")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        < 2
    {
        assert!(Instant::now() < deadline, "two workers registered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let service = submit(
        &db.pool,
        "sked.task_submit(kind => 'service', command => array['sleep', '300'], replicas => 2)",
    )
    .await;
    let placed = wait_copies(&db.pool, service, 20 * SECS, "both copies up", |c| {
        c.len() == 2 && c.iter().all(|c| c.up)
    })
    .await;
    let workers: BTreeSet<Uuid> = placed.iter().filter_map(|c| c.worker_id).collect();
    assert_eq!(
        workers.len(),
        2,
        "anti-affinity: the two copies run on two workers: {placed:#?}"
    );

    // kill -9 the worker of copy 0 (which one it is depends on who claimed first).
    let victim_worker: Uuid = sqlx::query_scalar("select id from sked.workers where pid = $1")
        .bind(victim.id() as i32)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let moved = placed
        .iter()
        .find(|c| c.worker_id == Some(victim_worker))
        .expect("a copy on the victim")
        .clone();
    victim.kill().expect("kill -9 the worker");
    let _ = victim.wait();
    let killed_at = Instant::now();
    let after = wait_copies(&db.pool, service, 30 * SECS, "the copy moved", |c| {
        c.iter()
            .any(|c| c.id == moved.id && c.up && c.worker_id != Some(victim_worker))
    })
    .await;
    let took = killed_at.elapsed();
    eprintln!("a copy moved {took:?} after kill -9 of its worker (lease {lease:?})");
    assert!(
        took < lease + 3 * SECS,
        "the copy runs elsewhere within the lease and a rescue (every poll interval) plus the claim: {took:?}"
    );
    assert!(
        after.iter().all(|c| c.up),
        "both copies run again: {after:#?}"
    );
    let history: Vec<(i32, String)> = sqlx::query_as(
        "select attempt, outcome from sked.task_attempt_history where task_id = $1 order by attempt",
    )
    .bind(moved.id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        history[0],
        (moved.attempt, "worker_lost".to_owned()),
        "the lost attempt is recorded as worker_lost"
    );
    assert_eq!(
        sked_db::task::get(&db.pool, service)
            .await
            .unwrap()
            .unwrap()
            .state,
        TaskState::Blocked,
        "the service runs on: losing a worker never fails it"
    );
    sked_db::task::cancel(&db.pool, service).await.unwrap();
    wait_for(&db.pool, service, &["cancelled"], 5 * SECS).await;
    wait_copies(&db.pool, service, 20 * SECS, "copies stopped", |c| {
        c.iter().all(|c| c.state == "cancelled")
    })
    .await;
    let _ = survivor.kill();
    let _ = survivor.wait();
}

/// The exits of a copy, oldest first: (exit code, seconds from the exit to the planned start).
async fn exits(pool: &PgPool, copy: Uuid) -> Vec<(Option<i32>, Option<f64>, String)> {
    sqlx::query_as(
        "select exit_code, extract(epoch from restart_at - exited_at)::float8, error
           from sked.service_exits where task_id = $1 order by id",
    )
    .bind(copy)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_crash_looping_copy_backs_off_longer_each_time_and_the_api_shows_it() {
    let api = crate::api::Api::new().await;
    let worker = start_worker(&api.db, config(&["default"]));
    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"kind": "service", "command": ["sh", "-c", "echo crashing; exit 3"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let service: Uuid = json["ids"][0].as_str().unwrap().parse().unwrap();
    let copy = wait_copies(&api.db.pool, service, 20 * SECS, "three restarts", |c| {
        c.len() == 1 && c[0].restarts >= 3
    })
    .await[0]
        .clone();
    assert_eq!(
        copy.state, "running",
        "a crash-looping copy stays running (in place)"
    );
    let seen = exits(&api.db.pool, copy.id).await;
    assert!(seen.len() >= 3, "{seen:?}");
    let waits: Vec<f64> = seen.iter().take(3).map(|e| e.1.unwrap()).collect();
    for (i, (wait, base)) in waits.iter().zip([1.0, 2.0, 4.0]).enumerate() {
        assert!(
            *wait >= base && *wait < base * 1.2 + 0.05,
            "restart {i} waits {base} s plus up to 20% jitter: {waits:?}"
        );
    }
    assert!(
        seen.iter()
            .all(|e| e.0 == Some(3) && e.2 == "exited with code 3"),
        "each exit is recorded with its code: {seen:?}"
    );

    let (status, shown) = api
        .get(&format!("/api/v1/services/{service}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK, "{shown}");
    let c = &shown["copies"][0];
    assert!(c["restarts"].as_i64().unwrap() >= 3, "{shown}");
    assert_eq!(c["last_exits"][0]["exit_code"], 3, "{shown}");
    assert!(c["last_exits"].as_array().unwrap().len() >= 3, "{shown}");
    assert_eq!(shown["replicas"], 1);
    assert_eq!(shown["generation"], 1);
    // The service sums its copies' restarts, in the listing too; it has no health check.
    assert_eq!(shown["restarts"], c["restarts"], "{shown}");
    assert!(shown["healthy"].is_null(), "{shown}");
    assert_eq!(shown["waiting"], 0, "{shown}");
    let (_, listed) = api.get("/api/v1/services", &api.alice).await;
    let restarts = listed["services"][0]["restarts"].as_i64().unwrap();
    assert!(restarts >= 3, "{listed}");
    // While it waits for its 4th start (8 s), the copy shows when it starts again.
    assert!(
        c["backing_off_until"].is_string() || c["up_since"].is_string(),
        "a copy either runs or says until when it backs off: {c}"
    );
    let (status, _) = api
        .get(&format!("/api/v1/services/{service}"), &api.bob)
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another user does not see it"
    );
    let logs = sked_db::task::logs(&api.db.pool, copy.id, 0, 100)
        .await
        .unwrap();
    let printed = logs.iter().filter(|l| l.data.contains("crashing")).count();
    assert!(
        printed >= 3 && logs.iter().all(|l| l.attempt == copy.attempt),
        "every restart appends to the attempt's log: {logs:?}"
    );
    sked_db::task::cancel(&api.db.pool, service).await.unwrap();
    wait_copies(
        &api.db.pool,
        service,
        10 * SECS,
        "the copy stopped while backing off",
        |c| c[0].state == "cancelled",
    )
    .await;
    worker.shutdown().await;
}

#[tokio::test]
async fn on_failure_restarts_a_failed_copy_and_ends_it_when_it_exits_0() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let marks = std::env::temp_dir().join(format!("sked-svc-{}", Uuid::new_v4().simple()));
    open_dir(&marks);
    // Each copy fails its first run and succeeds at its second.
    let script = format!(
        "m={}/$SKED_SHARD_INDEX; if [ -e $m ]; then exit 0; fi; touch $m; exit 1",
        marks.display()
    );
    let service = submit(
        &db.pool,
        &format!(
            "sked.task_submit(kind => 'service', command => array['sh', '-c', '{script}'],
                              replicas => 2, restart_policy => 'on_failure')"
        ),
    )
    .await;
    wait_for(&db.pool, service, &["succeeded"], 20 * SECS).await;
    for c in copies(&db.pool, service).await {
        assert_eq!(c.state, "succeeded", "{c:?}");
        assert_eq!(c.restarts, 1, "restarted once after its failure: {c:?}");
        let seen = exits(&db.pool, c.id).await;
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0].0, Some(1));
        assert_eq!(seen[1].0, Some(0));
        assert_eq!(
            seen[1].1, None,
            "an exit 0 under on_failure is not restarted"
        );
    }
    let _ = std::fs::remove_dir_all(&marks);
    worker.shutdown().await;
}

#[tokio::test]
async fn a_failing_health_check_restarts_the_copy_and_a_passing_one_marks_it_healthy() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    // An HTTP endpoint that answers 200 to every request.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
            });
        }
    });
    let healthy = submit(
        &db.pool,
        &format!(
            "sked.task_submit(kind => 'service', command => array['sleep', '300'],
               health_check => '{{\"http\": \"http://127.0.0.1:{port}/health\", \"interval_secs\": 0.2}}')"
        ),
    )
    .await;
    let sick = submit(
        &db.pool,
        r#"sked.task_submit(kind => 'service', command => array['sleep', '300'],
             health_check => '{"command": ["sh", "-c", "test -e ./never"], "interval_secs": 0.2,
                               "failures": 2}')"#,
    )
    .await;
    let sick_copy = wait_copies(&db.pool, sick, 20 * SECS, "the sick copy restarted", |c| {
        c.len() == 1 && c[0].restarts >= 1
    })
    .await[0]
        .clone();
    let seen = exits(&db.pool, sick_copy.id).await;
    assert!(
        seen[0]
            .2
            .starts_with("health check failed 2 times in a row"),
        "the exit says why: {seen:?}"
    );
    let healthy_at: Option<DateTime<Utc>> = {
        let deadline = Instant::now() + 10 * SECS;
        loop {
            let at: Option<DateTime<Utc>> =
                sqlx::query_scalar("select healthy_at from sked.tasks where shard_of = $1")
                    .bind(healthy)
                    .fetch_one(&db.pool)
                    .await
                    .unwrap();
            if at.is_some() || Instant::now() > deadline {
                break at;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    assert!(
        healthy_at.is_some(),
        "a passing HTTP probe marks the copy healthy"
    );
    let healthy_copy = copies(&db.pool, healthy).await[0].clone();
    assert_eq!(healthy_copy.restarts, 0, "a healthy copy is left alone");
    // The listing counts the copies up that passed their health check.
    let rows = sked_db::service::running(&db.pool, None, 10).await.unwrap();
    let listed = sked_db::service::summaries(&db.pool, rows).await.unwrap();
    let shown = listed.iter().find(|s| s.id == healthy).unwrap();
    assert_eq!((shown.running, shown.healthy), (1, Some(1)), "{shown:?}");
    server.abort();
    worker.shutdown().await;
}

/// Copies that count for the service (attached) whose process is up, and how many of them
/// are of the service's generation.
async fn up_counts(pool: &PgPool, service: Uuid) -> (i64, i64) {
    sqlx::query_as(
        "select count(*), count(*) filter (where c.generation = s.generation)
           from sked.tasks c join sked.tasks s on s.id = c.shard_of
           join sked.task_edges e on e.task_id = s.id and e.depends_on = c.id
          where c.shard_of = $1 and sked.service_copy_up(c.state, c.up_since, c.started_at)",
    )
    .bind(service)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_rolling_update_keeps_n_minus_1_copies_up_and_ends_on_the_new_generation() {
    let api = crate::api::Api::new().await;
    let w1 = start_worker(&api.db, config(&["default"]));
    let w2 = start_worker(&api.db, config(&["default"]));
    let (status, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"kind": "service", "command": ["sleep"], "args": ["300"], "replicas": 3,
                   "env": {"API_TOKEN": "s3cret", "MODE": "a"}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let service: Uuid = json["ids"][0].as_str().unwrap().parse().unwrap();
    wait_copies(&api.db.pool, service, 20 * SECS, "three copies up", |c| {
        c.iter().filter(|c| c.up).count() == 3
    })
    .await;

    let (status, updated) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/services/{service}"),
            &api.alice,
            Some(json!({"args": ["301"], "env": {"API_TOKEN": "s3cret", "MODE": "b"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(updated["generation"], 2);
    let started = Instant::now();
    let (mut least, mut most, mut samples) = (i64::MAX, 0, 0);
    loop {
        let (up, new) = up_counts(&api.db.pool, service).await;
        least = least.min(up);
        most = most.max(up);
        samples += 1;
        let all = copies(&api.db.pool, service).await;
        let done = new == 3
            && all
                .iter()
                .filter(|c| c.attached)
                .all(|c| c.generation == 2 && c.up)
            && all
                .iter()
                .filter(|c| !c.attached)
                .all(|c| c.state == "cancelled");
        if done {
            break;
        }
        assert!(
            started.elapsed() < 60 * SECS,
            "the roll ends within a minute; copies: {all:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "rolled 3 copies in {:?}: between {least} and {most} copies up over {samples} samples",
        started.elapsed()
    );
    assert!(least >= 2, "never below N-1 = 2 copies up: saw {least}");
    assert!(
        most <= 4,
        "never more than N+1 = 4 copies up (one surge): saw {most}"
    );
    let all = copies(&api.db.pool, service).await;
    assert_eq!(
        all.len(),
        6,
        "three old copies retired, three new ones: {all:#?}"
    );
    let args: Vec<Vec<String>> =
        sqlx::query_scalar("select args from sked.tasks where shard_of = $1 and generation = 2")
            .bind(service)
            .fetch_all(&api.db.pool)
            .await
            .unwrap();
    assert!(
        args.iter().all(|a| a == &["301"]),
        "the new copies run the new args"
    );

    let (status, shown) = api
        .get(&format!("/api/v1/services/{service}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        shown["env"]["API_TOKEN"],
        sked_types::secrets::MASK,
        "masked: {shown}"
    );
    assert_eq!(shown["env"]["MODE"], "b");
    assert_eq!(shown["running"], 3, "{shown}");
    let (status, listed) = api.get("/api/v1/services", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["services"][0]["id"], service.to_string());
    assert_eq!(listed["services"][0]["generation"], 2);
    let (_, others) = api.get("/api/v1/services", &api.bob).await;
    assert_eq!(
        others["services"],
        json!([]),
        "bob sees none of alice's services"
    );
    let (_, all) = api.get("/api/v1/services", &api.admin).await;
    assert_eq!(
        all["services"].as_array().unwrap().len(),
        1,
        "an admin sees all"
    );

    sked_db::task::cancel(&api.db.pool, service).await.unwrap();
    wait_copies(
        &api.db.pool,
        service,
        20 * SECS,
        "every copy stopped",
        |c| c.iter().all(|c| c.state == "cancelled"),
    )
    .await;
    w1.shutdown().await;
    w2.shutdown().await;
}

#[tokio::test]
async fn stopping_a_service_stops_every_copy_with_sigterm_and_its_process_is_gone() {
    let api = crate::cli::Api::start().await;
    let worker = start_worker(&api.db, config(&["default"]));
    let dir = std::env::temp_dir().join(format!("sked-svc-{}", Uuid::new_v4().simple()));
    open_dir(&dir);
    // The process records its pid, and that SIGTERM reached it.
    let script = format!(
        "trap 'echo term > {d}/term-$SKED_SHARD_INDEX; exit 0' TERM; echo $$ > {d}/pid-$SKED_SHARD_INDEX; \
         while true; do sleep 0.05; done",
        d = dir.display()
    );
    let id = api
        .ok(&[
            "submit",
            "--service",
            "--replicas",
            "2",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .await
        .trim()
        .to_owned();
    let service: Uuid = id.parse().unwrap();
    let pids = [
        read_pid(&dir.join("pid-0"), 20 * SECS).await,
        read_pid(&dir.join("pid-1"), 20 * SECS).await,
    ];
    let listed = api.ok(&["services"]).await;
    assert!(listed.contains(&id) && listed.contains("2/2"), "{listed}");
    let shown = api.ok(&["service", "show", &id]).await;
    assert!(shown.contains("2 running of 2 wanted"), "{shown}");
    assert!(
        shown.contains(&format!("{:<15} 0\n", "restarts:")),
        "{shown}"
    );
    assert!(listed.contains("RESTARTS"), "{listed}");
    // Copies never run out of attempts, and the task list says so rather than a huge number.
    let running = api.ok(&["list", "--state", "running"]).await;
    assert!(
        running.contains("1/∞") && !running.contains("1000000000"),
        "{running}"
    );
    assert!(shown.contains("[0]") && shown.contains("[1]"), "{shown}");

    api.ok(&["cancel", &id]).await;
    wait_for(&api.db.pool, service, &["cancelled"], 5 * SECS).await;
    wait_copies(
        &api.db.pool,
        service,
        10 * SECS,
        "both copies cancelled",
        |c| c.iter().all(|c| c.state == "cancelled"),
    )
    .await;
    for (i, pid) in pids.iter().enumerate() {
        assert!(!process_alive(*pid), "copy {i}'s process {pid} is gone");
        assert_eq!(
            std::fs::read_to_string(dir.join(format!("term-{i}"))).unwrap_or_default(),
            "term\n",
            "copy {i} was stopped with SIGTERM first"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    worker.shutdown().await;
}

#[tokio::test]
async fn scaling_up_adds_copies_and_scaling_down_stops_the_highest_indexes() {
    let api = crate::cli::Api::start().await;
    let worker = start_worker(&api.db, config(&["default"]));
    let id = api
        .ok(&["submit", "--service", "--", "sleep", "300"])
        .await
        .trim()
        .to_owned();
    let service: Uuid = id.parse().unwrap();
    wait_copies(&api.db.pool, service, 20 * SECS, "one copy up", |c| {
        c.len() == 1 && c[0].up
    })
    .await;
    let first = copies(&api.db.pool, service).await[0].id;

    let out = api.ok(&["service", "update", &id, "--replicas", "3"]).await;
    assert!(out.contains("generation 1, 3 replicas"), "{out}");
    let up = wait_copies(&api.db.pool, service, 20 * SECS, "three copies up", |c| {
        c.iter().filter(|c| c.up).count() == 3
    })
    .await;
    let indexes: Vec<i32> = up.iter().map(|c| c.shard_index).collect();
    assert_eq!(indexes, [0, 1, 2]);
    assert_eq!(up[0].id, first, "scaling up leaves the running copy alone");

    api.ok(&["service", "update", &id, "--replicas", "1"]).await;
    let after = wait_copies(
        &api.db.pool,
        service,
        20 * SECS,
        "two copies stopped",
        |c| c.iter().filter(|c| c.state == "cancelled").count() == 2,
    )
    .await;
    let kept: Vec<(i32, Uuid)> = after
        .iter()
        .filter(|c| c.state == "running")
        .map(|c| (c.shard_index, c.id))
        .collect();
    assert_eq!(kept, [(0, first)], "the highest indexes were stopped");
    let (parents, pending, total): (i32, i32, i32) = sqlx::query_as(
        "select parents, parents_pending, shard_total from sked.tasks where id = $1",
    )
    .bind(service)
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    assert_eq!(
        (parents, pending, total),
        (1, 1, 1),
        "the service waits on one copy"
    );
    api.ok(&["cancel", &id]).await;
    wait_copies(&api.db.pool, service, 10 * SECS, "stopped", |c| {
        c.iter().all(|c| c.state == "cancelled")
    })
    .await;
    worker.shutdown().await;
}

#[tokio::test]
async fn bad_service_input_is_refused_with_readable_messages_and_writes_nothing() {
    let api = crate::api::Api::new().await;
    let bad = [
        (
            json!({"kind": "service", "command": ["x"], "replicas": 0}),
            "replicas must be between 1 and 1000",
        ),
        (
            json!({"kind": "service", "command": ["x"], "restart_policy": "never"}),
            "restart_policy must be always or on_failure",
        ),
        (
            json!({"command": ["x"], "replicas": 2}),
            "replicas is only for tasks of kind service",
        ),
        (
            json!({"command": ["x"], "restart_policy": "always"}),
            "restart_policy is only for tasks of kind service",
        ),
        (
            json!({"kind": "service", "command": ["x"], "timeout_secs": 5}),
            "a service runs until it is stopped: it takes no timeout",
        ),
        (
            json!({"kind": "service", "command": ["x"], "shards": 3, "replicas": 2}),
            "a service takes `replicas`; `shards` must be absent or equal to it",
        ),
        (
            json!({"kind": "service"}),
            "command (or artifact_url) is required",
        ),
        (
            json!({"kind": "service", "command": ["x"], "health_check": {"http": "ftp://x"}}),
            "health_check.http must be a URL starting with http:// (for example http://127.0.0.1:8080/health)",
        ),
        (
            json!({"kind": "service", "command": ["x"], "health_check": {"command": ["true"], "failures": 0}}),
            "health_check.failures must be a whole number from 1 to 100",
        ),
        (
            json!({"kind": "service", "command": ["x"], "health_check": {"command": ["true"], "every": 1}}),
            "health_check has unknown keys: every (known: command, http, interval_secs, timeout_secs, failures)",
        ),
        (
            json!({"kind": "service", "command": ["x"], "health_check": {}}),
            "health_check needs exactly one of \"command\" (an array of strings) or \"http\" (a URL)",
        ),
    ];
    for (body, message) in &bad {
        let (status, json) = api.post("/api/v1/tasks", &api.alice, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {json}");
        assert_eq!(json["message"], *message, "{body}");
    }
    let count = |pool: PgPool| async move {
        sqlx::query_scalar::<_, i64>("select count(*) from sked.tasks")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(count(api.db.pool.clone()).await, 0, "nothing was written");

    let (_, json) = api
        .post(
            "/api/v1/tasks",
            &api.alice,
            json!({"kind": "service", "command": ["sleep", "300"], "replicas": 2}),
        )
        .await;
    let service = json["ids"][0].as_str().unwrap().to_owned();
    let before: Vec<(String, Option<i32>, Option<i32>)> =
        sqlx::query_as("select state, generation, replicas from sked.tasks order by id")
            .fetch_all(&api.db.pool)
            .await
            .unwrap();
    let patches = [
        (
            json!({"bogus": 1}),
            StatusCode::BAD_REQUEST,
            "unknown or unchangeable keys: bogus",
        ),
        (json!({}), StatusCode::BAD_REQUEST, "nothing to change"),
        (
            json!({"replicas": "two"}),
            StatusCode::BAD_REQUEST,
            "invalid changes",
        ),
        (
            json!({"replicas": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "replicas must be between 1 and 1000",
        ),
        (
            json!({"replicas": null}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "these keys cannot be null: replicas",
        ),
        (
            json!({"restart_policy": "sometimes"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "restart_policy must be always or on_failure",
        ),
        (
            json!({"health_check": {"http": "nope"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "health_check.http must be a URL",
        ),
        (
            json!({"env": {"A_TOKEN": sked_types::secrets::MASK}}),
            StatusCode::BAD_REQUEST,
            "env A_TOKEN: the value holds the mask",
        ),
        // What the service keeps decides whether these leave it something to run, so they
        // are conflicts with its definition, not bad requests.
        (
            json!({"command": null}),
            StatusCode::CONFLICT,
            "this change leaves the service with neither a command nor an artifact_url",
        ),
        (
            json!({"artifact_url": "file:///srv/app", "artifact_sha256": "0".repeat(64)}),
            StatusCode::CONFLICT,
            "this change leaves the service with both a command and an artifact_url",
        ),
        (
            json!({"artifact_url": "file:///srv/app", "command": null}),
            StatusCode::CONFLICT,
            "this change leaves the service's artifact_url without an artifact_sha256",
        ),
    ];
    for (body, status, message) in &patches {
        let (got, json) = api
            .call(
                Method::PATCH,
                &format!("/api/v1/services/{service}"),
                &api.alice,
                Some(body.clone()),
            )
            .await;
        assert_eq!(got, *status, "{body}: {json}");
        assert!(
            json["message"].as_str().unwrap().starts_with(message),
            "{body}: {json}"
        );
        if got == StatusCode::CONFLICT {
            assert_eq!(json["code"], "conflict", "{body}: {json}");
        }
    }
    let after: Vec<(String, Option<i32>, Option<i32>)> =
        sqlx::query_as("select state, generation, replicas from sked.tasks order by id")
            .fetch_all(&api.db.pool)
            .await
            .unwrap();
    assert_eq!(before, after, "refused changes change nothing");
    // A whole number written with a fraction of zero is an integer, as the document reads it.
    let (status, json) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/services/{service}"),
            &api.alice,
            Some(json!({"replicas": 3.0})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["replicas"], 3, "{json}");
    let (status, _) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/services/{service}"),
            &api.bob,
            Some(json!({"replicas": 3})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another user's service reads as absent"
    );
    let task = api
        .post("/api/v1/tasks", &api.alice, json!({"command": ["true"]}))
        .await
        .1["ids"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/services/{task}"),
            &api.alice,
            Some(json!({"replicas": 3})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a plain task is not a service"
    );
    api.post(
        &format!("/api/v1/tasks/{service}/cancel"),
        &api.alice,
        json!({}),
    )
    .await;
    let (status, json) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/services/{service}"),
            &api.alice,
            Some(json!({"replicas": 3})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "an ended service cannot change: {json}"
    );

    // The CLI refuses bad flags before any request.
    for args in [
        &["submit", "--replicas", "2", "--", "x"][..],
        &["submit", "--service", "--replicas", "0", "--", "x"],
        &["submit", "--service", "--restart", "never", "--", "x"],
        &["submit", "--health-url", "http://127.0.0.1:1/", "--", "x"],
        &["submit", "--service", "--health-interval", "1", "--", "x"],
    ] {
        let out = crate::cli::output(
            crate::cli::sked()
                .args(args)
                .env("SKED_URL", "http://127.0.0.1:9"),
        )
        .await;
        assert!(!out.status.success(), "sked {args:?} fails");
        assert!(
            !crate::cli::text(&out.stderr).contains("unreachable")
                && !crate::cli::text(&out.stderr).is_empty(),
            "sked {args:?} says why without a request: {}",
            crate::cli::text(&out.stderr)
        );
    }
}

#[tokio::test]
async fn every_way_in_carries_the_service_fields() {
    let db = TestDb::new().await;
    let hc = r#"{"command": ["true"], "interval_secs": 1}"#;
    // Named arguments, a JSON batch, a plain INSERT, and COPY (64 or more plain tasks).
    submit(
        &db.pool,
        &format!(
            "sked.task_submit(kind => 'service', command => array['a'], replicas => 2,
                              restart_policy => 'on_failure', health_check => '{hc}')"
        ),
    )
    .await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "select sked.tasks_submit('[{{\"kind\": \"service\", \"command\": [\"b\"], \"replicas\": 2,
             \"restart_policy\": \"on_failure\", \"health_check\": {hc}}}]'::jsonb, 'me')"
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    crate::support::insert(
        &db.pool,
        &format!(
            "(kind, command, replicas, restart_policy, health_check)
             values ('service', array['c'], 2, 'on_failure', '{hc}')"
        ),
    )
    .await;
    let batch: Vec<sked_types::SubmitTask> = (0..64)
        .map(|_| sked_types::SubmitTask {
            kind: Some(TaskKind::Service),
            command: Some(vec!["d".into()]),
            replicas: Some(2),
            restart_policy: Some("on_failure".into()),
            health_check: Some(serde_json::from_str(hc).unwrap()),
            ..Default::default()
        })
        .collect();
    sked_db::task::submit(&db.pool, &batch, "me").await.unwrap();
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "select s.command[1], count(c.id),
                count(c.id) filter (where c.restart_policy = 'on_failure'
                                      and c.health_check = s.health_check
                                      and c.max_attempts = 1000000000 and c.generation = 1)
           from sked.tasks s join sked.tasks c on c.shard_of = s.id
          where s.shard_of is null and s.replicas = 2 and s.restart_policy = 'on_failure'
            and s.health_check = $1::jsonb and s.shard_total = 2 and s.state = 'blocked'
          group by s.id, s.command[1] order by 1",
    )
    .bind(hc)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 67, "every service went in whole: {rows:?}");
    assert!(
        rows.iter().all(|r| r.1 == 2 && r.2 == 2),
        "each has two copies carrying its fields: {rows:?}"
    );
}

/// The database clock, read once: tests move time from there.
async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("select now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Claims what a fake worker may claim at `now`; returns how many it took.
async fn claim(pool: &PgPool, worker: Uuid, now: DateTime<Utc>) -> usize {
    sqlx::query_scalar::<_, Uuid>(
        "select id from sked.tasks_claim($1, '{default}', '{}', 10, '30 seconds', $2)",
    )
    .bind(worker)
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap()
    .len()
}

async fn reconcile(pool: &PgPool, now: DateTime<Utc>) -> Vec<String> {
    sqlx::query_scalar("select action from sked.services_reconcile(p_now => $1) order by action")
        .bind(now)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Marks the running copies of `service` whose process is not up as started at `at`, as
/// their worker does when it starts the process.
async fn started(pool: &PgPool, service: Uuid, at: DateTime<Utc>) {
    sqlx::query(
        "select sked.service_copy_started(id, attempt, $2) from sked.tasks
          where shard_of = $1 and state = 'running'
            and not sked.service_copy_up(state, up_since, started_at)",
    )
    .bind(service)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn the_reconciler_rolls_one_copy_at_a_time_with_time_as_an_input() {
    let db = TestDb::new().await;
    let t0 = db_now(&db.pool).await;
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    let worker = Uuid::new_v4();
    sqlx::query(
        "select sked.worker_register($1, 'w', 'host', 1, 'test', '{default}', '{}', 10,
                                     '1 hour', $2)",
    )
    .bind(worker)
    .bind(t0)
    .execute(&db.pool)
    .await
    .unwrap();
    let service = submit(
        &db.pool,
        "sked.task_submit(kind => 'service', command => array['sleep', '300'], replicas => 2)",
    )
    .await;
    assert_eq!(claim(&db.pool, worker, at(5)).await, 2);
    started(&db.pool, service, at(5)).await;
    assert!(reconcile(&db.pool, at(6)).await.is_empty(), "nothing to do");

    let generation: i32 = sqlx::query_scalar("select sked.service_update($1, $2, $3)")
        .bind(service)
        .bind(json!({"args": ["301"]}))
        .bind(at(10))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(generation, 2);
    let c = copies(&db.pool, service).await;
    assert_eq!(c.len(), 3, "the update surged one new copy at once: {c:#?}");
    assert!(
        reconcile(&db.pool, at(11)).await.is_empty(),
        "the surge is not running yet"
    );
    assert_eq!(claim(&db.pool, worker, at(12)).await, 1);
    started(&db.pool, service, at(12)).await;
    assert!(
        reconcile(&db.pool, at(13)).await.is_empty(),
        "the new copy has been up for 1 s only, less than the ready period"
    );
    assert_eq!(
        reconcile(&db.pool, at(14)).await,
        ["retired"],
        "ready: the old copy 0 goes"
    );
    let c = copies(&db.pool, service).await;
    let retired: Vec<&Copy> = c.iter().filter(|c| !c.attached).collect();
    assert_eq!(retired.len(), 1);
    assert_eq!((retired[0].shard_index, retired[0].generation), (0, 1));
    let cancel_requested: bool =
        sqlx::query_scalar("select cancel_requested_at is not null from sked.tasks where id = $1")
            .bind(retired[0].id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(cancel_requested, "the running old copy is asked to stop");
    assert_eq!(
        reconcile(&db.pool, at(14)).await,
        ["surged"],
        "then copy 1 surges"
    );
    assert!(
        reconcile(&db.pool, at(15)).await.is_empty(),
        "one at a time"
    );
    assert_eq!(claim(&db.pool, worker, at(16)).await, 1);
    started(&db.pool, service, at(16)).await;
    assert_eq!(reconcile(&db.pool, at(18)).await, ["retired"]);
    assert!(
        reconcile(&db.pool, at(19)).await.is_empty(),
        "the roll is over"
    );
    let c = copies(&db.pool, service).await;
    let attached: Vec<(i32, i32)> = c
        .iter()
        .filter(|c| c.attached)
        .map(|c| (c.shard_index, c.generation))
        .collect();
    assert_eq!(attached, [(0, 2), (1, 2)]);
    let (parents, pending): (i32, i32) =
        sqlx::query_as("select parents, parents_pending from sked.tasks where id = $1")
            .bind(service)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (parents, pending),
        (2, 2),
        "the service counts its attached copies"
    );

    // A retired copy's end does not settle the service.
    let old: Vec<(Uuid, i32)> =
        sqlx::query_as("select id, attempt from sked.tasks where shard_of = $1 and generation = 1")
            .bind(service)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    for (id, attempt) in old {
        sqlx::query(
            "select sked.tasks_finish(array[$1], array[$2], array['cancelled'], array[null::int],
                                      array['cancelled'], array[null], array[null], array[null],
                                      array[null::jsonb], $3)",
        )
        .bind(id)
        .bind(attempt)
        .bind(at(20))
        .execute(&db.pool)
        .await
        .unwrap();
    }
    assert_eq!(
        sked_db::task::get(&db.pool, service)
            .await
            .unwrap()
            .unwrap()
            .state,
        TaskState::Blocked,
        "the service runs on"
    );

    // An old copy that is not running (its worker handed it back) is replaced without a
    // surge, and only it in one step.
    sqlx::query(
        "select sked.tasks_finish(array[id], array[attempt], array['interrupted'],
                                  array[null::int], array['x'], array[null], array[null],
                                  array[null], array[null::jsonb], $2)
           from sked.tasks where shard_of = $1 and generation = 2 and shard_index = 0",
    )
    .bind(service)
    .bind(at(25))
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("select sked.service_update($1, '{\"args\": [\"302\"]}', $2)")
        .bind(service)
        .bind(at(30))
        .execute(&db.pool)
        .await
        .unwrap();
    let c = copies(&db.pool, service).await;
    let newest: Vec<i32> = c
        .iter()
        .filter(|c| c.generation == 3)
        .map(|c| c.shard_index)
        .collect();
    assert_eq!(
        newest,
        [0],
        "one copy of the new generation, at index 0: {c:#?}"
    );
    let replaced = c
        .iter()
        .find(|c| c.generation == 2 && c.shard_index == 0)
        .unwrap();
    assert_eq!(
        (replaced.state.as_str(), replaced.attached),
        ("cancelled", false),
        "the waiting old copy was replaced at once"
    );
}

#[tokio::test]
async fn cancelling_one_copy_ends_the_service_and_the_reconciler_stops_the_others() {
    let db = TestDb::new().await;
    let t0 = db_now(&db.pool).await;
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    let worker = Uuid::new_v4();
    sqlx::query(
        "select sked.worker_register($1, 'w', 'host', 1, 'test', '{default}', '{}', 10,
                                     '1 hour', $2)",
    )
    .bind(worker)
    .bind(t0)
    .execute(&db.pool)
    .await
    .unwrap();
    let service = submit(
        &db.pool,
        "sked.task_submit(kind => 'service', command => array['sleep', '300'], replicas => 3)",
    )
    .await;
    // Copies 0 and 1 run; copy 2 waits.
    sqlx::query("select sked.tasks_claim($1, '{default}', '{}', 2, '30 seconds', $2)")
        .bind(worker)
        .bind(at(5))
        .execute(&db.pool)
        .await
        .unwrap();
    assert!(
        reconcile(&db.pool, at(6)).await.is_empty(),
        "a healthy service costs the reconciler no step"
    );
    let c = copies(&db.pool, service).await;
    let running: Vec<&Copy> = c.iter().filter(|c| c.state == "running").collect();
    assert_eq!(running.len(), 2, "{c:#?}");
    sqlx::query("select sked.task_cancel($1, $2)")
        .bind(running[0].id)
        .bind(at(7))
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "select sked.tasks_finish(array[$1], array[$2], array['cancelled'], array[null::int],
                                  array['cancelled'], array[null], array[null], array[null],
                                  array[null::jsonb], $3)",
    )
    .bind(running[0].id)
    .bind(running[0].attempt)
    .bind(at(8))
    .execute(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        sked_db::task::get(&db.pool, service)
            .await
            .unwrap()
            .unwrap()
            .state,
        TaskState::UpstreamFailed,
        "a cancelled copy ends its service, as a shard its parent"
    );
    assert_eq!(
        reconcile(&db.pool, at(9)).await,
        ["stopped", "stopped"],
        "the other two copies of the ended service are stopped"
    );
    let c = copies(&db.pool, service).await;
    let other = c.iter().find(|c| c.id == running[1].id).unwrap();
    assert_eq!(
        other.state, "running",
        "a running copy is asked to stop by its worker"
    );
    let asked: bool =
        sqlx::query_scalar("select cancel_requested_at is not null from sked.tasks where id = $1")
            .bind(other.id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(asked);
    assert!(
        c.iter().any(|c| c.state == "cancelled" && c.attempt == 0),
        "the copy that never started ends cancelled: {c:#?}"
    );
    assert!(
        reconcile(&db.pool, at(10)).await.is_empty(),
        "asked once: the stopping copy is left to its worker"
    );
}

#[tokio::test]
async fn retrying_a_stopped_service_runs_its_copies_again_but_not_its_retired_ones() {
    let db = TestDb::new().await;
    let t0 = db_now(&db.pool).await;
    let service = submit(
        &db.pool,
        "sked.task_submit(kind => 'service', command => array['sleep', '300'])",
    )
    .await;
    // No worker: the update replaces the waiting copy at once.
    sqlx::query("select sked.service_update($1, '{\"args\": [\"1\"]}', $2)")
        .bind(service)
        .bind(t0)
        .execute(&db.pool)
        .await
        .unwrap();
    sked_db::task::cancel(&db.pool, service).await.unwrap();
    let state: String = sqlx::query_scalar("select sked.task_retry($1)")
        .bind(service)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state, "blocked", "the service runs again");
    let live = |c: &[Copy]| {
        c.iter()
            .filter(|c| c.state == "waiting")
            .map(|c| (c.generation, c.attached))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        live(&copies(&db.pool, service).await),
        [(1, false), (2, true)],
        "the retry re-ran every cancelled copy"
    );
    assert_eq!(reconcile(&db.pool, t0).await, ["stopped"]);
    assert_eq!(
        live(&copies(&db.pool, service).await),
        [(2, true)],
        "the retired copy was stopped again; the current one waits for a worker"
    );
}

#[tokio::test]
async fn a_surge_taken_over_from_a_dead_worker_is_not_ready_until_its_new_process_is_up() {
    let db = TestDb::new().await;
    let t0 = db_now(&db.pool).await;
    let at = |s: i64| t0 + chrono::Duration::seconds(s);
    let worker = Uuid::new_v4();
    sqlx::query(
        "select sked.worker_register($1, 'w', 'host', 1, 'test', '{default}', '{}', 10,
                                     '1 hour', $2)",
    )
    .bind(worker)
    .bind(t0)
    .execute(&db.pool)
    .await
    .unwrap();
    let service = submit(
        &db.pool,
        "sked.task_submit(kind => 'service', command => array['sleep', '300'])",
    )
    .await;
    assert_eq!(claim(&db.pool, worker, at(5)).await, 1);
    started(&db.pool, service, at(5)).await;
    sqlx::query("select sked.service_update($1, '{\"args\": [\"1\"]}', $2)")
        .bind(service)
        .bind(at(10))
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(claim(&db.pool, worker, at(12)).await, 1, "the surge");
    started(&db.pool, service, at(12)).await;
    // Its worker dies before the surge is ready: the lease (30 s) expires, the rescue puts it
    // back, and another claim takes it; its old process start is stale.
    sqlx::query("select sked.tasks_rescue(p_now => $1)")
        .bind(at(50))
        .execute(&db.pool)
        .await
        .unwrap();
    let old_copy_claimed_again = claim(&db.pool, worker, at(51)).await;
    assert_eq!(
        old_copy_claimed_again, 2,
        "both copies were rescued and claimed again"
    );
    let up = copies(&db.pool, service)
        .await
        .iter()
        .filter(|c| c.up)
        .count();
    assert_eq!(up, 0, "no process is up until the new worker starts it");
    assert!(
        reconcile(&db.pool, at(60)).await.is_empty(),
        "the surge is not ready on its old process's start"
    );
    started(&db.pool, service, at(61)).await;
    assert_eq!(reconcile(&db.pool, at(63)).await, ["retired"]);
}

#[tokio::test]
async fn a_copy_keeps_its_last_20_exits_and_records_only_its_own_attempt() {
    let db = TestDb::new().await;
    let worker = Uuid::new_v4();
    sqlx::query(
        "select sked.worker_register($1, 'w', 'host', 1, 'test', '{default}', '{}', 10,
                                     '1 hour', now())",
    )
    .bind(worker)
    .execute(&db.pool)
    .await
    .unwrap();
    let service = submit(
        &db.pool,
        "sked.task_submit(kind => 'service', command => array['false'])",
    )
    .await;
    let now = db_now(&db.pool).await;
    assert_eq!(
        claim(&db.pool, worker, now + chrono::Duration::seconds(2)).await,
        1
    );
    let copy = copies(&db.pool, service).await[0].clone();
    for i in 0..25 {
        let ok: bool = sqlx::query_scalar(
            "select sked.service_copy_exited($1, $2, now(), $3, null, 'exited', now() + interval '1 s')",
        )
        .bind(copy.id)
        .bind(copy.attempt)
        .bind(i)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert!(ok);
    }
    let kept: Vec<i32> = sqlx::query_scalar(
        "select exit_code from sked.service_exits where task_id = $1 order by id",
    )
    .bind(copy.id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(kept, (5..25).collect::<Vec<_>>(), "the last 20 exits");
    assert_eq!(copies(&db.pool, service).await[0].restarts, 25);
    let stale: bool = sqlx::query_scalar(
        "select sked.service_copy_exited($1, $2, now(), 1, null, 'exited', null)",
    )
    .bind(copy.id)
    .bind(copy.attempt + 1)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(!stale, "another attempt's record is refused (fenced)");
    let started: bool = sqlx::query_scalar("select sked.service_copy_started($1, $2)")
        .bind(copy.id)
        .bind(copy.attempt + 1)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(!started, "fenced by attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_page_of_a_service_shows_its_copies() {
    use crate::browser::{Browser, PATIENCE};
    use crate::dashboard::{Server, assert_quiet_console, open_signed_in, token_for};
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", sked_db::token::Role::User).await;
    let worker = start_worker(&db, config(&["default"]));
    let service = submit(
        &db.pool,
        "sked.task_submit(kind => 'service', owner => 'alice', replicas => 2,
                          command => array['sh', '-c', 'if [ \"$SKED_SHARD_INDEX\" = 1 ]; then exit 7; fi; sleep 300'])",
    )
    .await;
    wait_copies(&db.pool, service, PATIENCE, "copy 1 restarted", |c| {
        c.len() == 2 && c[0].up && c[1].restarts >= 1
    })
    .await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        worker.shutdown().await;
        return;
    };
    open_signed_in(&b, &server, &format!("/tasks/{service}"), &alice).await;
    b.wait(&format!("[data-service='{service}'] table.copies tbody tr"))
        .await;
    b.wait_js(
        "both copies, one up and one that exited with code 7",
        "(() => { const t = document.querySelector('table.copies').textContent; \
           return document.querySelectorAll('table.copies tbody tr').length === 2 \
             && t.includes('exited with code 7'); })()",
    )
    .await;
    b.screenshot("service-copies").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    sked_db::task::cancel(&db.pool, service).await.unwrap();
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_page_follows_a_service_from_down_to_up_to_stopped() {
    use crate::browser::{Browser, PATIENCE};
    use crate::dashboard::{Server, assert_quiet_console, open_signed_in, token_for};
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", sked_db::token::Role::User).await;
    let service = submit(
        &db.pool,
        "sked.task_submit(kind => 'service', owner => 'alice',
                          command => array['sleep', '300'], replicas => 2)",
    )
    .await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    // The nav leads to the page; without a worker no copy is up.
    open_signed_in(&b, &server, "/", &alice).await;
    b.wait("nav a[href='/services']")
        .await
        .click()
        .await
        .expect("click Services");
    let row = format!("table.service-list tr[data-service-id='{service}']");
    let short_id = service.simple().to_string()[20..].to_owned();
    b.wait(&format!("{row}[data-health='down']")).await;
    let text = b
        .js(&format!("document.querySelector(\"{row}\").textContent"))
        .await;
    let text = text.as_str().unwrap_or_default();
    assert!(
        text.contains(&short_id)
            && text.contains("sleep 300")
            && text.contains("0 of 2 up")
            && text.contains("down"),
        "a service without a copy up is marked down: {text}"
    );
    let href = b
        .js(&format!(
            "document.querySelector(\"{row} a\").getAttribute('href')"
        ))
        .await;
    assert_eq!(
        href.as_str(),
        Some(format!("/tasks/{service}").as_str()),
        "the name links to the service's task page"
    );

    // A worker starts both copies: the page follows without a reload.
    let worker = start_worker(&db, config(&["default"]));
    wait_copies(&db.pool, service, PATIENCE, "both copies up", |c| {
        c.len() == 2 && c.iter().all(|c| c.up)
    })
    .await;
    b.wait(&format!("{row}[data-health='up'][data-running='2']"))
        .await;
    let text = b
        .js(&format!("document.querySelector(\"{row}\").textContent"))
        .await;
    assert!(
        text.as_str().unwrap_or_default().contains("2 of 2 up"),
        "both copies up: {text}"
    );
    b.screenshot("services").await;

    // Stopping the service takes it off the list.
    sqlx::query("select sked.task_cancel($1)")
        .bind(service)
        .execute(&db.pool)
        .await
        .unwrap();
    b.wait_js(
        "the stopped service leaves the list and the page says none runs",
        &format!(
            "!document.querySelector(\"{row}\") \
             && document.querySelector('main.page .empty')?.textContent.includes('No services run')"
        ),
    )
    .await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    worker.shutdown().await;
}
