//! Limits and isolation of tasks, with real workers and processes: memory limits, the output
//! cap, the user tasks run as, the environment allow-list, working directories removed on
//! every ending, and the sandbox wrapper (bubblewrap). See `docs/runtime.md`.
//!
//! These tests run as root (as on CI): a worker without configuration runs tasks as
//! `nobody`. The memory limit is enforced here in the rlimit mode (this machine's cgroup v2
//! has no memory controller); the error recorded is the same in the cgroup mode.

use std::path::PathBuf;
use std::time::Duration;

use sked_db::testing::TestDb;
use sked_worker::isolation::sandbox::Sandbox;
use sked_worker::isolation::users::Users;
use sked_worker::isolation::{IsolationArgs, LimitsMode};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{config, insert, start_worker, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// A finished task's state, attempts, error and stdout tail.
async fn result(pool: &PgPool, id: Uuid) -> (String, i32, Option<String>, String) {
    sqlx::query_as(
        "select state, attempt, error, coalesce(stdout_tail, '') from sked.tasks where id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("reading a task")
}

/// Waits until the task's log has a first complete line and returns it.
async fn first_line(pool: &PgPool, id: Uuid) -> String {
    let deadline = tokio::time::Instant::now() + 10 * SECS;
    loop {
        let text: Option<String> = sqlx::query_scalar(
            "select string_agg(data, '' order by id) from sked.task_logs
              where task_id = $1 and stream = 'stdout'",
        )
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
        if let Some((line, _)) = text.as_deref().and_then(|t| t.split_once('\n')) {
            return line.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {id} printed no line"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Allocates 4 MB every 20 ms up to 1 GB, touching every byte, then prints "survived".
const HOG: &str = "import time\nb = []\nfor i in range(256):\n    b.append(b\"x\" * (4 << 20))\n    time.sleep(0.02)\nprint(\"survived\")";

#[tokio::test]
async fn a_memory_hungry_task_is_killed_by_its_limit_and_recorded_as_such() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["limited"]));
    let hog = insert(
        &db.pool,
        &format!(
            "(queue, command, memory_mb, max_attempts, backoff_base)
             values ('limited', array['python3', '-c', '{HOG}'], 64, 2, '50 ms')"
        ),
    )
    .await;
    // The same limit leaves room for a task that stays under it.
    let modest = insert(
        &db.pool,
        "(queue, command, memory_mb) values ('limited',
          array['python3', '-c', 'b = b''x'' * (16 << 20); print(len(b))'], 64)",
    )
    .await;
    wait_for(&db.pool, modest, &["succeeded"], 20 * SECS).await;
    wait_for(&db.pool, hog, &["failed"], 30 * SECS).await;
    let (_, attempts, error, stdout) = result(&db.pool, hog).await;
    let error = error.unwrap_or_default();
    assert!(
        error.starts_with("killed: exceeded its memory limit of 64 MB"),
        "the attempt is recorded as killed by its memory limit: {error:?}"
    );
    assert!(!stdout.contains("survived"), "it did not run to its end");
    assert_eq!(
        attempts, 2,
        "a memory kill is a failure, retried per the task's policy"
    );
    let outcomes: Vec<(String, String)> = sqlx::query_as(
        "select outcome, error from sked.task_attempts where task_id = $1 order by attempt",
    )
    .bind(hog)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(outcomes.len(), 2);
    for (outcome, error) in &outcomes {
        assert_eq!(outcome, "failed");
        assert!(
            error.starts_with("killed: exceeded its memory limit of 64 MB"),
            "{error}"
        );
    }
    worker.shutdown().await;

    // With limits off, the same request only counts for placement: the task runs to its end
    // (it allocates 200 MB here, not 1 GB).
    let mut off = config(&["unlimited"]);
    off.isolation.limits = LimitsMode::Off;
    let worker = start_worker(&db, off);
    let free = insert(
        &db.pool,
        &format!(
            "(queue, command, memory_mb) values ('unlimited', array['python3', '-c', '{}'], 64)",
            HOG.replace("range(256)", "range(50)")
        ),
    )
    .await;
    wait_for(&db.pool, free, &["succeeded"], 30 * SECS).await;
    worker.shutdown().await;
}

#[tokio::test]
async fn a_worker_default_memory_limit_applies_to_tasks_without_a_request() {
    let db = TestDb::new().await;
    let mut c = config(&["default"]);
    c.isolation.default_limits.memory_mb = Some(48);
    c.isolation.limits = LimitsMode::Rlimit;
    let worker = start_worker(&db, c);
    let hog = insert(
        &db.pool,
        &format!("(command, max_attempts) values (array['python3', '-c', '{HOG}'], 1)"),
    )
    .await;
    wait_for(&db.pool, hog, &["failed"], 30 * SECS).await;
    let (_, _, error, _) = result(&db.pool, hog).await;
    let error = error.unwrap_or_default();
    assert!(
        error.starts_with("killed: exceeded its memory limit of 48 MB (resident "),
        "the rlimit mode records the resident memory it saw: {error:?}"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_worker_that_must_use_cgroups_and_cannot_does_not_start() {
    let db = TestDb::new().await;
    let mut c = config(&["default"]);
    c.isolation.limits = LimitsMode::Cgroup;
    c.isolation.cgroup = Some(PathBuf::from("/nonexistent/cgroup"));
    let result = sked_worker::run(
        db.pool.clone(),
        c,
        tokio_util::sync::CancellationToken::new(),
    )
    .await;
    let error = result
        .expect_err("--limits cgroup without a usable cgroup")
        .to_string();
    assert!(
        error.contains("--limits cgroup: cannot use cgroup v2")
            && error.contains("/nonexistent/cgroup"),
        "{error}"
    );
    let workers: i64 = sqlx::query_scalar("select count(*) from sked.workers")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(workers, 0, "it never registered");

    // Auto falls back to the rlimit mode and runs tasks.
    let mut c = config(&["default"]);
    c.isolation.cgroup = Some(PathBuf::from("/nonexistent/cgroup"));
    let worker = start_worker(&db, c);
    let id = insert(&db.pool, "(command) values (array['true'])").await;
    wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
    worker.shutdown().await;
}

#[tokio::test]
async fn an_output_flood_is_cut_at_the_cap() {
    let db = TestDb::new().await;
    let mut c = config(&["default"]);
    c.isolation.max_output_bytes = Some(50_000);
    let worker = start_worker(&db, c);
    // Its own cap; then the worker's for a task without one; stderr counts too.
    let own = insert(
        &db.pool,
        "(command, max_output_bytes, max_attempts) values (array['yes', '0123456789'], 100000, 1)",
    )
    .await;
    let default = insert(
        &db.pool,
        "(command, max_attempts) values (array['sh', '-c', 'yes err >&2'], 1)",
    )
    .await;
    let under = insert(
        &db.pool,
        "(command) values (array['sh', '-c', 'head -c 49999 /dev/zero | tr ''\\0'' x; echo'])",
    )
    .await;
    for (id, cap, stream) in [(own, 100_000, "stdout"), (default, 50_000, "stderr")] {
        wait_for(&db.pool, id, &["failed"], 20 * SECS).await;
        let (_, _, error, _) = result(&db.pool, id).await;
        assert_eq!(
            error.as_deref(),
            Some(
                format!(
                    "stopped: its stdout and stderr wrote more than its output limit of {cap} \
                     bytes (the logs keep the first {cap})"
                )
                .as_str()
            )
        );
        let (logged, streams): (i64, Vec<String>) = sqlx::query_as(
            "select sum(octet_length(data)), array_agg(distinct stream) from sked.task_logs
              where task_id = $1",
        )
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(
            logged, cap,
            "the logs keep exactly what was written up to the cap"
        );
        assert_eq!(streams, [stream]);
    }
    wait_for(&db.pool, under, &["succeeded"], 20 * SECS).await;
    worker.shutdown().await;
}

#[tokio::test]
async fn a_root_worker_without_configuration_does_not_run_tasks_as_root() {
    let db = TestDb::new().await;
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests run as root");
    let worker = start_worker(&db, config(&["default"]));
    let plain = insert(
        &db.pool,
        "(command) values (array['sh', '-c', 'id -u; id -g; id -G; touch made && stat -c %U made; echo \"$HOME\" = \"$PWD\"'])",
    )
    .await;
    let as_root = insert(
        &db.pool,
        "(command, run_as, max_attempts) values (array['id', '-u'], 'root', 1)",
    )
    .await;
    wait_for(&db.pool, plain, &["succeeded"], 10 * SECS).await;
    let (_, _, _, out) = result(&db.pool, plain).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..4],
        ["65534", "65534", "65534", "nobody"],
        "uid, gid and groups are nobody's (no supplementary groups), and the working \
         directory is its own: {out}"
    );
    let (home, pwd) = lines[4].split_once(" = ").unwrap();
    assert_eq!(home, pwd, "HOME is the working directory");

    wait_for(&db.pool, as_root, &["failed"], 10 * SECS).await;
    let (_, _, error, out) = result(&db.pool, as_root).await;
    assert_eq!(
        error.as_deref(),
        Some(
            "cannot run as user \"root\": this worker runs as root and runs tasks as root only \
             when started with --allow-root-tasks"
        )
    );
    assert_eq!(out, "", "nothing ran");
    worker.shutdown().await;
}

/// The `sked-worker` binary started as `nobody`, with the work dir `work`.
fn worker_as_nobody(url: &str, work: &std::path::Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-worker"));
    cmd.args(["--poll-secs", "0.2", "--work-dir"])
        .arg(work)
        .args(args)
        .env_clear()
        .env("DATABASE_URL", url)
        .env("PATH", sked_worker::isolation::DEFAULT_PATH)
        .uid(65534)
        .gid(65534)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[tokio::test]
async fn a_worker_not_running_as_root_runs_tasks_only_as_itself() {
    let db = TestDb::new().await;
    let work = std::env::temp_dir().join(format!("sked-nonroot-{}", Uuid::new_v4().simple()));
    let refused = worker_as_nobody(&db.url, &work, &["--run-as", "daemon"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "--run-as: this worker runs as uid 65534 (not root) and can run tasks only as itself"
        ),
        "a non-root worker refuses --run-as of another user at start: {stderr}"
    );

    let mut worker = worker_as_nobody(&db.url, &work, &[]).spawn().unwrap();
    let itself = insert(&db.pool, "(command) values (array['id', '-u'])").await;
    let named_itself = insert(
        &db.pool,
        "(command, run_as) values (array['id', '-u'], 'nobody')",
    )
    .await;
    let other = insert(
        &db.pool,
        "(command, run_as, max_attempts) values (array['id', '-u'], 'daemon', 1)",
    )
    .await;
    for id in [itself, named_itself] {
        wait_for(&db.pool, id, &["succeeded"], 20 * SECS).await;
        assert_eq!(result(&db.pool, id).await.3, "65534\n");
    }
    wait_for(&db.pool, other, &["failed"], 20 * SECS).await;
    assert_eq!(
        result(&db.pool, other).await.2.as_deref(),
        Some(
            "cannot run as user \"daemon\": this worker runs as uid 65534 (not root) and can run \
             tasks only as itself; run the task on a worker started as root or as that user"
        )
    );
    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    unsafe {
        libc::kill(worker.id().unwrap() as i32, libc::SIGTERM);
    }
    let status = tokio::time::timeout(10 * SECS, worker.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "the worker shuts down cleanly: {status}");
    let _ = std::fs::remove_dir_all(&work);
}

#[tokio::test]
async fn tasks_run_as_the_configured_user() {
    let db = TestDb::new().await;
    // The worker's default user, and a task naming its own.
    let mut c = config(&["default"]);
    c.isolation.users = Users::new(0, Some("daemon".into()), false)
        .unwrap()
        .allowing(vec!["nobody".into(), "2".into()])
        .unwrap();
    let worker = start_worker(&db, c);
    let by_default = insert(&db.pool, "(command) values (array['id', '-un'])").await;
    let named = insert(
        &db.pool,
        "(command, run_as) values (array['id', '-un'], 'nobody')",
    )
    .await;
    let by_uid = insert(
        &db.pool,
        "(command, run_as) values (array['id', '-u'], '2')",
    )
    .await;
    let unknown = insert(
        &db.pool,
        "(command, run_as, max_attempts) values (array['true'], 'no_such_user', 1)",
    )
    .await;
    let not_allowed = insert(
        &db.pool,
        "(command, run_as, max_attempts) values (array['true'], 'sys', 1)",
    )
    .await;
    for (id, who) in [(by_default, "daemon"), (named, "nobody"), (by_uid, "2")] {
        wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
        assert_eq!(result(&db.pool, id).await.3, format!("{who}\n"));
    }
    wait_for(&db.pool, unknown, &["failed"], 10 * SECS).await;
    assert_eq!(
        result(&db.pool, unknown).await.2.as_deref(),
        Some(
            "cannot run as user \"no_such_user\": there is no user \"no_such_user\" on this \
             worker's machine"
        )
    );
    wait_for(&db.pool, not_allowed, &["failed"], 10 * SECS).await;
    let error = result(&db.pool, not_allowed).await.2.unwrap_or_default();
    assert!(
        error.starts_with("cannot run as user \"sys\": this worker lets tasks run as its default")
            && error.contains("--run-as-allow"),
        "a user the worker does not allow is refused: {error}"
    );
    worker.shutdown().await;

    // Root only when allowed.
    let mut c = config(&["root"]);
    c.isolation.users = Users::new(0, None, true).unwrap();
    let worker = start_worker(&db, c);
    let root = insert(
        &db.pool,
        "(queue, command, run_as) values ('root', array['id', '-u'], 'root')",
    )
    .await;
    wait_for(&db.pool, root, &["succeeded"], 10 * SECS).await;
    assert_eq!(result(&db.pool, root).await.3, "0\n");
    worker.shutdown().await;
}

#[tokio::test]
async fn the_environment_is_clean_but_for_the_allow_list() {
    let db = TestDb::new().await;
    // Cargo sets these in the test's environment; only the allowed one reaches tasks, and
    // the task's own env wins over it.
    let mut c = config(&["default"]);
    c.isolation = IsolationArgs {
        env_allow: vec!["CARGO_PKG_NAME".into(), "SKED_NOT_SET_ANYWHERE".into()],
        ..IsolationArgs::default()
    }
    .into_config()
    .unwrap();
    let worker = start_worker(&db, c);
    let name = std::env::var("CARGO_PKG_NAME").expect("cargo test sets CARGO_PKG_NAME");
    let script = "echo \"$CARGO_PKG_NAME ${CARGO_MANIFEST_DIR:-clean} ${SKED_NOT_SET_ANYWHERE-unset} $PATH\"";
    let plain = insert(
        &db.pool,
        &format!("(command) values (array['sh', '-c', '{script}'])"),
    )
    .await;
    let overriding = insert(
        &db.pool,
        &format!(
            "(command, env) values (array['sh', '-c', '{script}'], '{{\"CARGO_PKG_NAME\": \"mine\"}}')"
        ),
    )
    .await;
    for (id, name) in [(plain, name.as_str()), (overriding, "mine")] {
        wait_for(&db.pool, id, &["succeeded"], 10 * SECS).await;
        assert_eq!(
            result(&db.pool, id).await.3,
            format!(
                "{name} clean unset {}\n",
                sked_worker::isolation::DEFAULT_PATH
            )
        );
    }
    worker.shutdown().await;
}

#[tokio::test]
async fn working_directories_are_removed_on_every_ending() {
    let db = TestDb::new().await;
    let c = config(&["default"]);
    let tasks_root = c.work_dir.join("tasks");
    let worker = start_worker(&db, c);
    let mk = |script: &str, extra: &str| {
        format!(
            "(command, max_attempts{extra}) values (array['sh', '-c', 'pwd; touch left-behind; {script}'], 1"
        )
    };
    let succeeded = insert(&db.pool, &format!("{})", mk("true", ""))).await;
    let failed = insert(&db.pool, &format!("{})", mk("exit 3", ""))).await;
    let timed_out = insert(
        &db.pool,
        &format!("{}, '1 second')", mk("exec sleep 30", ", timeout")),
    )
    .await;
    let cancelled = insert(&db.pool, &format!("{})", mk("exec sleep 30", ""))).await;
    let handed_back = insert(&db.pool, &format!("{})", mk("exec sleep 30", ""))).await;

    let mut dirs: Vec<(Uuid, PathBuf)> = Vec::new();
    for id in [succeeded, failed, timed_out, cancelled, handed_back] {
        dirs.push((id, PathBuf::from(first_line(&db.pool, id).await)));
    }
    for (_, dir) in &dirs {
        assert!(
            dir.starts_with(&tasks_root),
            "{} is under the work dir",
            dir.display()
        );
    }
    sqlx::query("select sked.task_cancel($1)")
        .bind(cancelled)
        .execute(&db.pool)
        .await
        .unwrap();
    for (id, state) in [
        (succeeded, "succeeded"),
        (failed, "failed"),
        (timed_out, "failed"),
        (cancelled, "cancelled"),
    ] {
        wait_for(&db.pool, id, &[state], 10 * SECS).await;
    }
    // The worker shuts down with one task still running: it is stopped and handed back.
    worker.shutdown().await;
    assert_eq!(
        crate::support::state(&db.pool, handed_back).await,
        "waiting"
    );
    for (id, dir) in &dirs {
        assert!(
            !dir.exists(),
            "the working directory of {id} ({}) is removed",
            dir.display()
        );
    }
    let left: Vec<PathBuf> = std::fs::read_dir(&tasks_root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        left.is_empty(),
        "the stopped worker leaves nothing under {}: {left:?}",
        tasks_root.display()
    );
}

/// The sandbox program for the tests: `SKED_BWRAP` (set by `cargo xtask test`), else `bwrap`
/// on the PATH; `None` (with a message) when `SKED_SANDBOX_TESTS=skip`.
fn bwrap() -> Option<String> {
    if std::env::var("SKED_SANDBOX_TESTS").is_ok_and(|v| v == "skip") {
        eprintln!("SKED_SANDBOX_TESTS=skip: this sandbox test does not run");
        return None;
    }
    if let Ok(path) = std::env::var("SKED_BWRAP") {
        return Some(path);
    }
    let found = std::env::var("PATH").ok().and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("bwrap"))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => Some(p.to_string_lossy().into_owned()),
        None => panic!(
            "the sandbox tests need bubblewrap (`bwrap`): `apt-get install bubblewrap` (as \
             root with CI set, `cargo xtask test` installs it), or set SKED_SANDBOX_TESTS=skip"
        ),
    }
}

#[tokio::test]
async fn tasks_run_through_the_sandbox_wrapper() {
    let Some(bwrap) = bwrap() else { return };
    let db = TestDb::new().await;
    let outside = std::env::temp_dir().join(format!("sked-sandbox-{}", Uuid::new_v4().simple()));
    let script = format!(
        "echo inside > in-dir && cat in-dir; id -un; \
         touch {0} 2>/dev/null && echo wrote-outside || echo read-only-outside; \
         tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d \" \" | tr \"\\n\" \" \"",
        outside.display()
    );
    let insert_task = |queue: &'static str| {
        let script = script.clone();
        let pool = db.pool.clone();
        async move {
            insert(
                &pool,
                &format!("(queue, command) values ('{queue}', array['sh', '-c', '{script}'])"),
            )
            .await
        }
    };

    let template = format!(
        "{bwrap} --die-with-parent --unshare-all --ro-bind / / --bind {{dir}} {{dir}} \
         --dev /dev --proc /proc --"
    );
    let mut c = config(&["sandboxed"]);
    c.isolation.sandbox = Some(Sandbox::parse(&template, "").expect("a valid template"));
    let worker = start_worker(&db, c);
    let sandboxed = insert_task("sandboxed").await;
    wait_for(&db.pool, sandboxed, &["succeeded"], 20 * SECS).await;
    let (_, _, _, out) = result(&db.pool, sandboxed).await;
    assert_eq!(
        out, "inside\nnobody\nread-only-outside\nlo ",
        "in the sandbox the task writes its own directory only, as nobody, and sees no network \
         but loopback"
    );
    assert!(!outside.exists(), "nothing was written outside");
    worker.shutdown().await;

    // The same task without the wrapper writes outside and sees the machine's interfaces.
    let worker = start_worker(&db, config(&["plain"]));
    let plain = insert_task("plain").await;
    wait_for(&db.pool, plain, &["succeeded"], 20 * SECS).await;
    let (_, _, _, out) = result(&db.pool, plain).await;
    assert!(
        out.starts_with("inside\nnobody\nwrote-outside\n"),
        "without the sandbox the same task writes outside its directory: {out:?}"
    );
    assert!(outside.exists());
    let _ = std::fs::remove_file(&outside);
    worker.shutdown().await;
}

#[test]
fn bad_sandbox_templates_stop_the_worker_at_start() {
    for (template, says) in [
        ("bwrap --bind {workdir} {workdir} --", "unknown placeholder"),
        ("/no/such/sandbox --", "not an executable"),
        ("'unclosed", "not closed"),
    ] {
        let err = IsolationArgs {
            sandbox: Some(template.into()),
            ..IsolationArgs::default()
        }
        .into_config()
        .expect_err(template);
        assert!(
            err.starts_with("--sandbox: ") && err.contains(says),
            "{err}"
        );
    }
}
