//! Resource-aware placement: the claim takes only tasks that fit a worker's free CPU and
//! memory and whose labels it has, the rule against starving big tasks, real workers that
//! never hold more than their capacity, and why a task waits (SQL, REST and `sked show`).

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{config, insert, start_worker, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// A worker registered at `at` with these labels and capacity (CPU millicores, memory MB).
pub(crate) async fn register(
    pool: &PgPool,
    queues: &[&str],
    labels: &[&str],
    cpu_millis: Option<i32>,
    memory_mb: Option<i32>,
    at: DateTime<Utc>,
) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "select sked.worker_register($1, 'w', 'host', 1, 'test', $2, $3, 8, '30 seconds', $4, $5, $6)",
    )
    .bind(id)
    .bind(queues)
    .bind(labels)
    .bind(cpu_millis)
    .bind(memory_mb)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
    id
}

pub(crate) async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("select now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Claims as `worker` at `now` with this free capacity; the names of the tasks it took, in
/// claim order.
async fn claim(
    pool: &PgPool,
    worker: Uuid,
    labels: &[&str],
    free: (Option<i32>, Option<i32>),
    now: DateTime<Utc>,
) -> Vec<String> {
    sqlx::query_scalar(
        "select name from sked.tasks_claim($1, '{default}', $2, 10, '30 seconds', $3, $4, $5)
          order by priority desc, next_run_at",
    )
    .bind(worker)
    .bind(labels)
    .bind(free.0)
    .bind(free.1)
    .bind(now)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Inserts a noop task named `name`, due `due_secs` from `now`, with these requests.
async fn task(
    pool: &PgPool,
    name: &str,
    cpu: Option<i32>,
    mem: Option<i32>,
    due_secs: f64,
    now: DateTime<Utc>,
) -> Uuid {
    sqlx::query_scalar(
        "insert into sked.tasks (kind, name, cpu_millis, memory_mb, next_run_at)
         values ('noop', $1, $2, $3, $4 + make_interval(secs => $5)) returning id",
    )
    .bind(name)
    .bind(cpu)
    .bind(mem)
    .bind(now)
    .bind(due_secs)
    .fetch_one(pool)
    .await
    .unwrap()
}

pub(crate) async fn reasons(pool: &PgPool, id: Uuid, now: DateTime<Utc>) -> Vec<(String, String)> {
    sqlx::query_as("select code, message from sked.task_waiting_reasons($1, $2)")
        .bind(id)
        .bind(now)
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_claim_takes_the_prefix_that_fits_the_free_capacity_and_skips_what_never_fits() {
    let db = TestDb::new().await;
    let now = db_now(&db.pool).await;
    let w = register(&db.pool, &["default"], &[], Some(2000), Some(4096), now).await;
    // In claim order (the oldest first): a task bigger than the free memory, then three of
    // 600 millicores, a task without requests after them, and a small one last.
    task(&db.pool, "huge", None, Some(8192), -10.0, now).await;
    for (i, due) in [-9.0, -8.0, -7.0].into_iter().enumerate() {
        task(&db.pool, &format!("cpu{i}"), Some(600), None, due, now).await;
    }
    task(&db.pool, "plain", None, None, -6.0, now).await;
    task(&db.pool, "small", Some(100), Some(64), -5.0, now).await;

    let took = claim(&db.pool, w, &[], (Some(1000), Some(4096)), now).await;
    assert_eq!(
        took,
        ["cpu0", "plain"],
        "the running sums of 600 millicores fit 1000 once; a task without requests always \
         passes; the task bigger than the free memory is passed over, and nothing with requests \
         is taken after the first that overflowed"
    );
    let took = claim(&db.pool, w, &[], (Some(400), Some(4096)), now).await;
    assert_eq!(
        took,
        ["small"],
        "with 400 millicores free, the 600-millicore tasks no longer qualify and the small one \
         behind them is taken"
    );
    let took = claim(&db.pool, w, &[], (Some(1200), Some(4096)), now).await;
    assert_eq!(took, ["cpu1", "cpu2"], "1200 millicores hold two more");
    let took = claim(&db.pool, w, &[], (None, None), now).await;
    assert_eq!(
        took,
        ["huge"],
        "a worker that advertises no capacity claims by slots and labels only"
    );
}

#[tokio::test]
async fn labels_route_tasks_in_the_claim() {
    let db = TestDb::new().await;
    sqlx::query(
        "insert into sked.tasks (kind, name, labels) values
           ('noop', 'needs-gpu', '{gpu}'), ('noop', 'needs-gpu-and-ssd', '{gpu,ssd}'),
           ('noop', 'any', '{}')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let now = db_now(&db.pool).await;
    let w = register(&db.pool, &["default"], &["gpu"], None, None, now).await;
    let plain = claim(&db.pool, w, &[], (None, None), now).await;
    assert_eq!(
        plain,
        ["any"],
        "a worker without labels takes unlabelled tasks only"
    );
    let gpu = claim(&db.pool, w, &["gpu"], (None, None), now).await;
    assert_eq!(
        gpu,
        ["needs-gpu"],
        "a task's labels must all be among the worker's"
    );
    let id: Uuid = sqlx::query_scalar("select id from sked.tasks where name = 'needs-gpu-and-ssd'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let why = reasons(&db.pool, id, now).await;
    assert_eq!(why[0].0, "missing_labels", "{why:?}");
    assert!(
        why[0].1.contains("none has ssd"),
        "the reason names the label no worker has: {why:?}"
    );
}

#[tokio::test]
async fn a_big_task_due_for_long_holds_back_tasks_with_requests_behind_it() {
    let db = TestDb::new().await;
    let now = db_now(&db.pool).await;
    let w = register(&db.pool, &["default"], &[], Some(1000), None, now).await;
    // Due 60 s ago (longer than sked.claim_reserve_after()), needing more than the 400
    // millicores free but less than the worker's 1000.
    task(&db.pool, "big", Some(800), None, -60.0, now).await;
    task(&db.pool, "small", Some(200), None, -10.0, now).await;
    task(&db.pool, "plain", None, None, -5.0, now).await;
    let took = claim(&db.pool, w, &[], (Some(400), None), now).await;
    assert_eq!(
        took,
        ["plain"],
        "the starving task reserves the worker: no task with requests behind it is taken, \
         tasks without requests still are"
    );
    let took = claim(&db.pool, w, &[], (Some(1000), None), now).await;
    assert_eq!(
        took,
        ["big", "small"],
        "once the capacity drained, the big task goes first"
    );

    // A big task that has not waited that long is simply passed over.
    let db = TestDb::new().await;
    let now = db_now(&db.pool).await;
    let w = register(&db.pool, &["default"], &[], Some(1000), None, now).await;
    task(&db.pool, "big", Some(800), None, -20.0, now).await;
    task(&db.pool, "small", Some(200), None, -10.0, now).await;
    let took = claim(&db.pool, w, &[], (Some(400), None), now).await;
    assert_eq!(took, ["small"], "a recent big task blocks nothing");
}

#[tokio::test]
async fn waiting_reasons_say_why_with_time_as_input() {
    let db = TestDb::new().await;
    let now = db_now(&db.pool).await;
    let later = task(&db.pool, "later", None, None, 90.0, now).await;
    let why = reasons(&db.pool, later, now).await;
    assert_eq!(why[0].0, "due_later", "{why:?}");
    assert!(why[0].1.contains("(in 90.0 s)"), "{why:?}");
    assert_eq!(
        why[1].0, "no_worker",
        "reasons that will matter when it is due follow: {why:?}"
    );

    let big = task(&db.pool, "big", Some(500), Some(4096), -1.0, now).await;
    register(&db.pool, &["default"], &[], Some(2000), Some(1024), now).await;
    register(&db.pool, &["default"], &[], Some(1000), Some(2048), now).await;
    let why = reasons(&db.pool, big, now).await;
    assert_eq!(
        why,
        [(
            "too_big".to_owned(),
            "needs 4096 MB of memory and the largest live worker of queue default has 2048 MB"
                .to_owned()
        )]
    );

    let fits = task(&db.pool, "fits", Some(500), Some(512), 0.0, now).await;
    let why = reasons(&db.pool, fits, now).await;
    assert_eq!(why[0].0, "ready", "two workers have room for it: {why:?}");
    assert!(
        why[0].1.contains("; 1 task is ahead of it in the queue"),
        "the big task is ahead: {why:?}"
    );

    // Dead workers serve nobody: an hour later no heartbeat is fresh.
    let why = reasons(&db.pool, fits, now + chrono::Duration::hours(1)).await;
    assert_eq!(why[0].0, "no_worker", "{why:?}");

    sqlx::query("select sked.queue_pause('default', $1)")
        .bind(now)
        .execute(&db.pool)
        .await
        .unwrap();
    let why = reasons(&db.pool, fits, now).await;
    assert_eq!(why[0].0, "queue_paused", "{why:?}");
    assert_eq!(why.len(), 1, "{why:?}");

    let done = insert(
        &db.pool,
        "(kind, state, finished_at) values ('noop', 'cancelled', now())",
    )
    .await;
    assert!(
        reasons(&db.pool, done, now).await.is_empty(),
        "a finished task does not wait"
    );
}

/// The largest number of `queue`'s tasks seen running at once on `worker` (any worker when
/// `None`) while `until` holds, sampling every 10 ms; the samples are consistent snapshots.
pub(crate) async fn sample_running(
    pool: &PgPool,
    queue: &str,
    worker: Option<Uuid>,
    done: impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>>,
    within: Duration,
) -> i64 {
    let deadline = tokio::time::Instant::now() + within;
    let mut most = 0;
    loop {
        let n: i64 = sqlx::query_scalar(
            "select count(*) from sked.tasks
              where state = 'running' and queue = $1 and ($2::uuid is null or worker_id = $2)",
        )
        .bind(queue)
        .bind(worker)
        .fetch_one(pool)
        .await
        .unwrap();
        most = most.max(n);
        if done().await {
            return most;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tasks should finish within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A future that is true once no task of `queue` is unfinished.
pub(crate) fn drained(
    pool: &PgPool,
    queue: &'static str,
) -> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    let pool = pool.clone();
    move || {
        let pool = pool.clone();
        Box::pin(async move {
            let left: i64 = sqlx::query_scalar(
                "select count(*) from sked.tasks where queue = $1 and finished_at is null",
            )
            .bind(queue)
            .fetch_one(&pool)
            .await
            .unwrap();
            left == 0
        })
    }
}

#[tokio::test]
async fn a_real_worker_never_holds_more_than_its_capacity() {
    let db = TestDb::new().await;
    let mut c = config(&["default"]);
    c.concurrency = 8;
    c.capacity = sked_worker::capacity::Capacity {
        cpu_millis: Some(1000),
        memory_mb: Some(2048),
    };
    c.name = Some("small-box".into());
    // Six tasks of 600 millicores: one at a time fits. Four without requests run beside them.
    sqlx::raw_sql(
        "insert into sked.tasks (kind, input, cpu_millis, memory_mb)
         select 'sleep', '{\"seconds\": 0.3}', 600, 256 from generate_series(1, 6);
         insert into sked.tasks (kind, input)
         select 'sleep', '{\"seconds\": 0.3}' from generate_series(1, 4)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let worker = start_worker(&db, c);
    let mut most_requesting = 0;
    let mut most_total = 0;
    let deadline = tokio::time::Instant::now() + 30 * SECS;
    loop {
        let (requesting, total, left): (i64, i64, i64) = sqlx::query_as(
            "select count(*) filter (where state = 'running' and cpu_millis is not null),
                    count(*) filter (where state = 'running'),
                    count(*) filter (where finished_at is null)
               from sked.tasks",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        most_requesting = most_requesting.max(requesting);
        most_total = most_total.max(total);
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tasks should finish"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        most_requesting, 1,
        "two tasks of 600 millicores never run at once on 1000"
    );
    assert!(
        most_total >= 3,
        "tasks without requests ran beside them (most at once: {most_total})"
    );
    let states: Vec<String> = sqlx::query_scalar("select distinct state from sked.tasks")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(states, ["succeeded"]);
    let (cpu, mem): (Option<i32>, Option<i32>) =
        sqlx::query_as("select cpu_millis, memory_mb from sked.workers where name = 'small-box'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (cpu, mem),
        (Some(1000), Some(2048)),
        "the worker registers its capacity"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn labelled_tasks_run_only_on_workers_with_the_labels() {
    let db = TestDb::new().await;
    let mut gpu = config(&["default"]);
    gpu.labels = vec!["gpu".into()];
    gpu.name = Some("gpu-box".into());
    let mut plain = config(&["default"]);
    plain.name = Some("plain-box".into());
    let gpu_worker = start_worker(&db, gpu);
    let plain_worker = start_worker(&db, plain);
    // Both registered before the tasks go in.
    let deadline = tokio::time::Instant::now() + 10 * SECS;
    while sqlx::query_scalar::<_, i64>("select count(*) from sked.workers")
        .fetch_one(&db.pool)
        .await
        .unwrap()
        < 2
    {
        assert!(tokio::time::Instant::now() < deadline, "workers register");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ids: HashSet<(String, String)> =
        sqlx::query_as("select w.name, w.id::text from sked.workers w")
            .fetch_all(&db.pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    sqlx::raw_sql(
        "insert into sked.tasks (kind, input, labels, name)
         select 'sleep', '{\"seconds\": 0.05}', '{gpu}', 'gpu' from generate_series(1, 12);
         insert into sked.tasks (kind, input, name)
         select 'sleep', '{\"seconds\": 0.05}', 'any' from generate_series(1, 12);
         insert into sked.tasks (kind, labels, name) values ('noop', '{tpu}', 'tpu')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + 20 * SECS;
    loop {
        let left: i64 = sqlx::query_scalar(
            "select count(*) from sked.tasks where name <> 'tpu' and state <> 'succeeded'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tasks should run"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ran: Vec<(String, String)> =
        sqlx::query_as("select distinct name, worker_id::text from sked.tasks where name <> 'tpu'")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let worker_of = |id: &str| {
        ids.iter()
            .find(|(_, w)| w == id)
            .map(|(n, _)| n.clone())
            .unwrap()
    };
    for (name, worker) in &ran {
        if name == "gpu" {
            assert_eq!(worker_of(worker), "gpu-box", "a gpu task ran on {worker}");
        }
    }
    let tpu: Uuid = sqlx::query_scalar("select id from sked.tasks where name = 'tpu'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        crate::support::state(&db.pool, tpu).await,
        "waiting",
        "no worker has the label tpu"
    );
    let why = sked_db::queue::waiting_reasons(&db.pool, tpu)
        .await
        .unwrap();
    assert_eq!(why[0].code, "missing_labels");
    assert!(why[0].message.contains("none has tpu"), "{why:?}");
    gpu_worker.shutdown().await;
    plain_worker.shutdown().await;
}

#[tokio::test]
async fn a_task_needing_more_memory_than_any_worker_waits_and_says_why() {
    let api = crate::cli::Api::start().await;
    let pool = &api.db.pool;
    let mut c = config(&["default"]);
    c.capacity = sked_worker::capacity::Capacity {
        cpu_millis: Some(2000),
        memory_mb: Some(1024),
    };
    let worker = start_worker(&api.db, c);
    let big = insert(pool, "(kind, memory_mb) values ('noop', 4096)").await;
    let small = insert(pool, "(kind, memory_mb) values ('noop', 512)").await;
    wait_for(pool, small, &["succeeded"], 10 * SECS).await;
    tokio::time::sleep(SECS).await;
    assert_eq!(
        crate::support::state(pool, big).await,
        "waiting",
        "no worker can hold 4096 MB"
    );
    let expected =
        "needs 4096 MB of memory and the largest live worker of queue default has 1024 MB";
    let why = sked_db::queue::waiting_reasons(pool, big).await.unwrap();
    assert_eq!(why[0].code, "too_big");
    assert_eq!(why[0].message, expected);

    let shown = api.ok(&["show", &big.to_string()]).await;
    assert!(
        shown.contains("waits:") && shown.contains(&format!("{expected} (too_big)")),
        "sked show prints the reason: {shown}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&api.ok(&["show", "--json", &big.to_string()]).await).unwrap();
    assert_eq!(json["waiting_reason"]["code"], "too_big", "{json}");
    assert_eq!(json["waiting_reason"]["message"], expected);
    let done: serde_json::Value =
        serde_json::from_str(&api.ok(&["show", "--json", &small.to_string()]).await).unwrap();
    assert!(
        done.get("waiting_reason").is_none(),
        "a finished task has no waiting reason: {done}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn worker_capacity_flags_are_validated() {
    for (flag, value, says) in [
        ("--cpu-millis", "0", "--cpu-millis must be between 1 and"),
        ("--cpu-millis", "-5", "--cpu-millis must be between 1 and"),
        (
            "--memory-mb",
            "lots",
            "--memory-mb must be a whole number of MB",
        ),
        (
            "--memory-mb",
            "1.5",
            "--memory-mb must be a whole number of MB",
        ),
    ] {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"));
        cmd.args([flag, value])
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
            .stdin(std::process::Stdio::null());
        let out = crate::cli::output(&mut cmd).await;
        let stderr = crate::cli::text(&out.stderr);
        assert!(!out.status.success(), "{flag} {value} is refused");
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
    }
    let mut args = sked_worker_args();
    args.cpu_millis = Some("1500".into());
    args.memory_mb = Some("512".into());
    let c = args.into_config().unwrap();
    assert_eq!(
        c.capacity,
        sked_worker::capacity::Capacity {
            cpu_millis: Some(1500),
            memory_mb: Some(512)
        },
        "given values win over detection"
    );
    let detected = sked_worker_args().into_config().unwrap().capacity;
    assert!(
        detected.cpu_millis.is_some_and(|c| c >= 1000) && detected.memory_mb.is_some(),
        "this machine's capacity is detected: {detected:?}"
    );
}

/// The flags of a worker with the defaults, parsed as the binary parses them.
fn sked_worker_args() -> sked_worker::WorkerArgs {
    use clap::Parser;
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        worker: sked_worker::WorkerArgs,
    }
    Flags::try_parse_from(["sked-worker"]).unwrap().worker
}
