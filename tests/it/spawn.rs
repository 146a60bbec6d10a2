//! Tests of spawning from a running task (`POST /api/v1/tasks/{id}/spawn`, `sked spawn`, the
//! task tokens of `db/src/task_token.rs` and `sked.task_spawn`), against a real server and a
//! real `sked-worker` process started with `--api-url`: a task's token opens its own task's
//! spawn and nothing else (not another task's, not any other route), a forged or altered one
//! nothing at all, and the token of an attempt that ended spawns nothing; a task outside a
//! workflow is refused by the database; each refusal inserts nothing; a task that runs `sked
//! spawn` adds a workflow of two tasks that its own child waits for, and a stored definition's
//! run, named, that it does not; a spawn takes its rows from the owner's quota; and `sked dev`
//! tells its tasks of its own server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sked_db::token::Role;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::api::assert_error;
use crate::support;

/// A server in this process and a `sked-worker` process told of it (`--api-url`), on a fresh
/// database; alice's API token; a directory where tasks leave what the test reads.
struct Env {
    db: TestDb,
    url: String,
    alice: String,
    http: reqwest::Client,
    stop: CancellationToken,
    worker: Child,
    keep: PathBuf,
}

impl Env {
    async fn start() -> Env {
        Env::with_quotas(sked_server::Quotas::default()).await
    }

    async fn with_quotas(quotas: sked_server::Quotas) -> Env {
        let db = TestDb::new().await;
        let alice = sked_db::token::create(&db.pool, "alice", Role::User, "test")
            .await
            .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        tokio::spawn(sked_server::serve_configured(
            db.pool.clone(),
            listener,
            stop.clone(),
            sked_server::EventsConfig::default(),
            quotas,
            sked_server::upkeep(&db.pool),
        ));
        let id = Uuid::new_v4().simple();
        let keep = std::env::temp_dir().join(format!("sked-spawn-{id}"));
        std::fs::create_dir(&keep).unwrap();
        // Tasks of a root worker run as nobody: they may write here.
        std::fs::set_permissions(&keep, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let worker = Command::new(env!("CARGO_BIN_EXE_sked-worker"))
            .env("DATABASE_URL", &db.url)
            .env_remove("RUST_LOG")
            .env_remove("SKED_URL")
            .env_remove("SKED_TOKEN")
            .args([
                "--api-url",
                &url,
                "--concurrency",
                "8",
                "--poll-secs",
                "0.2",
            ])
            .args(["--shutdown-grace-secs", "2"])
            .arg("--work-dir")
            .arg(std::env::temp_dir().join(format!("sked-spawn-work-{id}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting sked-worker");
        Env {
            db,
            url,
            alice,
            http: reqwest::Client::new(),
            stop,
            worker,
            keep,
        }
    }

    /// `method path` with `token` (none: no Authorization) and `body`: the status and the
    /// JSON answer.
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status();
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, json)
    }

    /// `POST /api/v1/tasks/{task}/spawn` with `token`.
    async fn spawn(&self, task: Uuid, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(
            Method::POST,
            &format!("/api/v1/tasks/{task}/spawn"),
            Some(token),
            Some(body),
        )
        .await
    }

    /// Submits a workflow as alice: its id.
    async fn workflow(&self, body: Value) -> Uuid {
        let (status, json) = self
            .call(
                Method::POST,
                "/api/v1/workflows",
                Some(&self.alice),
                Some(body),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        json["id"].as_str().unwrap().parse().unwrap()
    }

    /// The rows of tasks, workflows and edges: what a refused spawn must leave as it was.
    async fn rows(&self) -> (i64, i64, i64) {
        sqlx::query_as(
            "select (select count(*) from sked.tasks), (select count(*) from sked.workflows),
                    (select count(*) from sked.task_edges)",
        )
        .fetch_one(&self.db.pool)
        .await
        .unwrap()
    }

    /// What a task left in the file `name` of the shared directory, once it is there.
    async fn kept(&self, name: &str) -> String {
        let path = self.keep.join(name);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&path)
                && !text.is_empty()
            {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "a task should write {} within 30 s",
                path.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the workflow is finished: its state.
    async fn finished(&self, workflow: Uuid) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (_, detail) = self
                .call(
                    Method::GET,
                    &format!("/api/v1/workflows/{workflow}"),
                    Some(&self.alice),
                    None,
                )
                .await;
            if detail["state"] != "running" {
                return detail;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the workflow should finish within 60 s: {detail}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // SAFETY: kill(2) of our own child, not yet reaped.
        unsafe { libc::kill(self.worker.id() as i32, libc::SIGTERM) };
        let _ = self.worker.wait();
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.keep);
    }
}

/// A task's env: the `sked` binary, the shared directory, and a token and an API address of
/// its own, which the worker's must replace.
fn task_env(keep: &Path) -> Value {
    json!({
        "SKED_CLI": env!("CARGO_BIN_EXE_sked"),
        "KEEP": keep.to_str().unwrap(),
        "SKED_TOKEN": "skt_planted_by_the_task",
        "SKED_URL": "http://127.0.0.1:9",
    })
}

/// A command that keeps its token in `$KEEP/<who>` and runs for a minute (until cancelled).
fn holding(who: &str) -> Value {
    json!([
        "sh",
        "-c",
        "printf '%s' \"$SKED_TOKEN\" > \"$KEEP/$0.tmp\" && mv \"$KEEP/$0.tmp\" \"$KEEP/$0\" && sleep 60",
        who
    ])
}

/// The state, kind, start and end of a task.
async fn task_row(
    pool: &sqlx::PgPool,
    id: Uuid,
) -> (
    String,
    String,
    Option<chrono::DateTime<chrono::Utc>>,
    Option<chrono::DateTime<chrono::Utc>>,
) {
    sqlx::query_as("select state, kind, started_at, finished_at from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_opens_its_own_running_tasks_spawn_and_nothing_else() {
    let env = Env::start().await;
    let a_flow = env
        .workflow(json!({"name": "a", "tasks": [
            {"name": "hold_a", "command": holding("a"), "env": task_env(&env.keep)},
            {"name": "after_a", "command": ["true"], "depends_on": ["hold_a"]},
        ]}))
        .await;
    let b_flow = env
        .workflow(json!({"name": "b", "tasks": [
            {"name": "hold_b", "command": holding("b"), "env": task_env(&env.keep)},
        ]}))
        .await;
    let (status, lone) = env
        .call(
            Method::POST,
            "/api/v1/tasks",
            Some(&env.alice),
            Some(json!({"command": holding("lone"), "env": task_env(&env.keep)})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{lone}");
    let lone: Uuid = lone["ids"][0].as_str().unwrap().parse().unwrap();
    let a = support::task_id(&env.db.pool, a_flow, "hold_a").await;
    let b = support::task_id(&env.db.pool, b_flow, "hold_b").await;
    let a_token = env.kept("a").await;
    let b_token = env.kept("b").await;
    let lone_token = env.kept("lone").await;
    for token in [&a_token, &b_token, &lone_token] {
        assert!(
            token.starts_with("skt_") && token != "skt_planted_by_the_task",
            "the worker's token replaces the task's own: {token}"
        );
    }
    assert!(a_token.starts_with(&format!("skt_{}_1_", a.simple())));
    let before = env.rows().await;
    let children = json!({"tasks": [{"name": "x", "kind": "noop"}]});

    // Another task's token: refused on this task's route, even while both run.
    let (status, json) = env.spawn(b, &a_token, children.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{json}");
    assert_error(&json, "forbidden");
    assert!(
        json["message"].as_str().unwrap().contains(&a.to_string()),
        "{json}"
    );

    // A task token opens no other route, however valid.
    let not_spawns = [
        (Method::GET, "/api/v1/tasks".to_owned(), None),
        (
            Method::POST,
            "/api/v1/tasks".to_owned(),
            Some(json!({"command": ["true"]})),
        ),
        (Method::GET, format!("/api/v1/tasks/{a}"), None),
        (Method::POST, format!("/api/v1/tasks/{a}/cancel"), None),
        (Method::POST, format!("/api/v1/tasks/{b}/retry"), None),
        (Method::GET, format!("/api/v1/workflows/{a_flow}"), None),
        (
            Method::POST,
            "/api/v1/workflows".to_owned(),
            Some(json!({"tasks": [{"name": "x", "command": ["true"]}]})),
        ),
        (Method::GET, "/api/v1/me".to_owned(), None),
        (Method::GET, "/api/v1/workers".to_owned(), None),
    ];
    for (method, path, body) in not_spawns {
        let (status, json) = env.call(method.clone(), &path, Some(&a_token), body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {json}");
        assert_error(&json, "forbidden");
        assert!(
            json["message"].as_str().unwrap().contains("may only spawn"),
            "the answer says what a task token may do: {json}"
        );
    }

    // Forged and altered tokens, and tokens that are not task tokens.
    let mac = &a_token[a_token.len() - 64..];
    let mut flipped = a_token.clone().into_bytes();
    let last = flipped.len() - 1;
    flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
    let flipped = String::from_utf8(flipped).unwrap();
    let forged = [
        flipped,
        format!("skt_{}_2_{mac}", a.simple()),
        format!("skt_{}_1_{mac}", b.simple()),
        sked_db::task_token::TokenKey::from_bytes(&[7; 32])
            .unwrap()
            .mint(a, 1),
        a_token[..a_token.len() - 2].to_owned(),
        format!("{a_token}0"),
        "skt_".to_owned(),
        a_token.to_uppercase().replacen("SKT_", "skt_", 1),
    ];
    for token in &forged {
        let (status, json) = env.spawn(a, token, children.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token}: {json}");
        assert_error(&json, "unauthorized");
    }
    let (status, json) = env.spawn(a, &env.alice, children.clone()).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "an API token does not spawn: {json}"
    );
    assert_error(&json, "forbidden");
    let (status, json) = env
        .call(
            Method::POST,
            &format!("/api/v1/tasks/{a}/spawn"),
            None,
            Some(children.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{json}");

    // A task that is in no workflow: the database refuses.
    let (status, json) = env.spawn(lone, &lone_token, children.clone()).await;
    assert!(
        status.is_client_error() && status != StatusCode::UNAUTHORIZED,
        "a task outside a workflow spawns nothing: {status} {json}"
    );
    assert!(json["message"].is_string(), "{json}");
    assert_eq!(env.rows().await, before, "no refusal inserted anything");

    // The token of an attempt that ended (cancelled) spawns nothing.
    let (status, json) = env
        .call(
            Method::POST,
            &format!("/api/v1/tasks/{b}/cancel"),
            Some(&env.alice),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    support::wait_for(&env.db.pool, b, &["cancelled"], Duration::from_secs(20)).await;
    let (status, json) = env.spawn(b, &b_token, children.clone()).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{json}");
    assert_error(&json, "forbidden");
    assert_eq!(env.rows().await, before, "the spawn inserted nothing");

    // The control: the live token spawns into its own task's workflow.
    let (status, json) = env
        .spawn(
            a,
            &a_token,
            json!({"tasks": [{"name": "x", "kind": "noop"}], "wait": false}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let spawned: Uuid = json["id"].as_str().unwrap().parse().unwrap();
    let (workflow, kind): (Option<Uuid>, String) =
        sqlx::query_as("select workflow_id, kind from sked.tasks where id = $1")
            .bind(spawned)
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!((workflow, kind.as_str()), (Some(a_flow), "workflow"));
    let depends: bool = sqlx::query_scalar(
        "select exists (select 1 from sked.task_edges where task_id = $1 and depends_on = $2)",
    )
    .bind(spawned)
    .bind(a)
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert!(depends, "the new task depends on the task that spawned it");

    for flow in [a_flow, b_flow] {
        env.call(
            Method::POST,
            &format!("/api/v1/workflows/{flow}/cancel"),
            Some(&env.alice),
            None,
        )
        .await;
    }
    env.call(
        Method::POST,
        &format!("/api/v1/tasks/{lone}/cancel"),
        Some(&env.alice),
        None,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_spawns_two_children_with_sked_spawn_and_its_join_runs_after_them() {
    let env = Env::start().await;
    let fan = r#"set -e
printf '%s' "$SKED_TOKEN" > "$KEEP/token"
"$SKED_CLI" spawn -f - > "$KEEP/spawned.tmp" <<'EOF'
tasks:
  - name: c1
    command: [sh, -c, 'sleep 0.5']
  - name: c2
    command: [sh, -c, 'sleep 0.7']
EOF
mv "$KEEP/spawned.tmp" "$KEEP/spawned"
printf 'definition: tiny\nparams: {word: aside}\n' > side.yaml
"$SKED_CLI" spawn --name side --no-wait -f side.yaml > "$KEEP/side"
"#;
    // A stored definition of alice's, which fan also spawns, beside its children.
    let (status, json) = env
        .call(
            Method::POST,
            "/api/v1/workflow-definitions",
            Some(&env.alice),
            Some(
                json!({"name": "tiny", "spec": {"params": {"word": "x"}, "tasks": [
                {"name": "say", "command": ["echo", "{{ params.word }}"]}]}}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{json}");
    let flow = env
        .workflow(json!({"name": "fan-join", "tasks": [
            {"name": "fan", "command": ["sh", "-c", fan], "env": task_env(&env.keep)},
            {"name": "join", "command": ["true"], "depends_on": ["fan"]},
        ]}))
        .await;
    let detail = env.finished(flow).await;
    let fan_id = support::task_id(&env.db.pool, flow, "fan").await;
    let join_id = support::task_id(&env.db.pool, flow, "join").await;
    assert_eq!(detail["state"], "succeeded", "{detail}");
    let spawned: Uuid = env
        .kept("spawned")
        .await
        .trim()
        .parse()
        .expect("sked spawn prints the new task's id");

    let (state, kind, _, spawned_finished) = task_row(&env.db.pool, spawned).await;
    assert_eq!((state.as_str(), kind.as_str()), ("succeeded", "workflow"));
    let (fan_state, _, _, fan_finished) = task_row(&env.db.pool, fan_id).await;
    let (join_state, _, join_started, _) = task_row(&env.db.pool, join_id).await;
    assert_eq!(
        (fan_state.as_str(), join_state.as_str()),
        ("succeeded", "succeeded")
    );
    let in_workflow: Option<Uuid> =
        sqlx::query_scalar("select workflow_id from sked.tasks where id = $1")
            .bind(spawned)
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        in_workflow,
        Some(flow),
        "the new task is in the spawning task's workflow"
    );

    // The two children: the tasks of the workflow the new task ran.
    type Child = (
        String,
        String,
        Option<chrono::DateTime<chrono::Utc>>,
        Option<chrono::DateTime<chrono::Utc>>,
    );
    let children: Vec<Child> = sqlx::query_as(
        "select t.name, t.state, t.started_at, t.finished_at
           from sked.tasks t join sked.workflows w on w.id = t.workflow_id
          where w.parent_task_id = $1 order by t.name",
    )
    .bind(spawned)
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    let names: Vec<&str> = children.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(names, ["c1", "c2"], "{children:?}");
    let join_started = join_started.expect("join started");
    for (name, state, started, finished) in &children {
        assert_eq!(state, "succeeded", "{name}: {children:?}");
        assert!(
            started.expect("it ran") >= fan_finished.unwrap(),
            "{name} started after fan, which it depends on through the spawned task, finished"
        );
        assert!(
            finished.unwrap() <= join_started,
            "join started at {join_started} after {name} finished at {finished:?}"
        );
    }
    assert!(
        spawned_finished.unwrap() <= join_started,
        "join waited for the spawned task"
    );
    let edges: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "select task_id, depends_on from sked.task_edges where task_id = any($1) order by 1, 2",
    )
    .bind(vec![spawned, join_id])
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert!(edges.contains(&(spawned, fan_id)), "{edges:?}");
    assert!(
        edges.contains(&(join_id, spawned)),
        "with wait, join waits: {edges:?}"
    );

    // The definition's run, named and not waited for: join does not depend on it.
    let side: Uuid = env.kept("side").await.trim().parse().unwrap();
    let side_in = support::task_id(&env.db.pool, flow, "side").await;
    assert_eq!(side, side_in, "--name names the new task");
    let side_after_fan: bool = sqlx::query_scalar(
        "select exists (select 1 from sked.task_edges where task_id = $1 and depends_on = $2)",
    )
    .bind(side)
    .bind(fan_id)
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert!(side_after_fan, "the definition's run depends on fan too");
    assert!(
        !edges.contains(&(join_id, side)),
        "--no-wait: join does not wait: {edges:?}"
    );
    support::wait_for(&env.db.pool, side, &["succeeded"], Duration::from_secs(30)).await;
    let said: Vec<String> = sqlx::query_scalar(
        "select t.stdout_tail from sked.tasks t join sked.workflows w on w.id = t.workflow_id
          where w.parent_task_id = $1",
    )
    .bind(side)
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(
        said,
        ["aside\n"],
        "the definition ran with the spawn's params"
    );

    // The token the task kept: its attempt ended, so it spawns nothing, and it never opened
    // anything else.
    let token = env.kept("token").await;
    assert!(
        token.starts_with(&format!("skt_{}_1_", fan_id.simple())),
        "{token}"
    );
    let before = env.rows().await;
    let (status, json) = env
        .spawn(
            fan_id,
            &token,
            json!({"tasks": [{"name": "late", "kind": "noop"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{json}");
    assert_error(&json, "forbidden");
    for (method, body) in [
        (Method::GET, None),
        (Method::POST, Some(json!({"command": ["true"]}))),
    ] {
        let (status, json) = env
            .call(method.clone(), "/api/v1/tasks", Some(&token), body)
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method}: {json}");
        assert_error(&json, "forbidden");
    }
    assert_eq!(env.rows().await, before, "nothing was inserted");
}

/// A spawn takes its rows from the quota of the spawning task's owner, as that owner's own
/// submission would: the new task and each task of its workflow; one the bucket cannot cover
/// now is 429, one larger than the bucket 413, and neither inserts anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_takes_its_rows_from_the_owners_quota() {
    let env = Env::with_quotas(sked_server::Quotas {
        max_rows_per_owner_per_minute: 5,
        ..sked_server::Quotas::default()
    })
    .await;
    let flow = env
        .workflow(json!({"tasks": [
            {"name": "hold", "command": holding("hold"), "env": task_env(&env.keep)},
        ]}))
        .await;
    let hold = support::task_id(&env.db.pool, flow, "hold").await;
    let token = env.kept("hold").await;
    let tasks = |n: usize| -> Value {
        let tasks: Vec<Value> = (0..n)
            .map(|i| json!({"name": format!("t{i}"), "kind": "noop"}))
            .collect();
        json!({ "tasks": tasks, "wait": false })
    };
    // Alice's bucket holds 4 rows from now on (it refills at one row per 12 s).
    sqlx::query(
        "update sked.owner_quota set tokens = 4, refreshed_at = now() where owner = 'alice'",
    )
    .execute(&env.db.pool)
    .await
    .unwrap();
    let before = env.rows().await;
    // 1 + 5 rows: more than the whole bucket of 5.
    let (status, json) = env.spawn(hold, &token, tasks(5)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{json}");
    assert_error(&json, "too_large");
    // 1 + 4 rows: more than the 4 there.
    let (status, json) = env.spawn(hold, &token, tasks(4)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{json}");
    assert_error(&json, "quota_exceeded");
    assert!(
        json["message"].as_str().unwrap().contains("owner alice"),
        "the task's owner pays: {json}"
    );
    assert_eq!(env.rows().await, before, "refused spawns insert nothing");
    let (status, json) = env.spawn(hold, &token, tasks(2)).await;
    assert_eq!(status, StatusCode::CREATED, "1 + 2 rows of the 4: {json}");
    let left: f64 = sqlx::query_scalar("select tokens from sked.owner_quota where owner = 'alice'")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert!(
        (1.0..2.0).contains(&left),
        "the spawn took 3 rows of alice's 4 (and less than one came back since): {left}"
    );
    env.call(
        Method::POST,
        &format!("/api/v1/workflows/{flow}/cancel"),
        Some(&env.alice),
        None,
    )
    .await;
}

/// `sked dev` tells its worker's tasks of its own server: a task spawns out of the box.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sked_dev_tells_its_tasks_of_its_own_server() {
    let db = TestDb::new().await;
    let alice = sked_db::token::create(&db.pool, "alice", Role::User, "test")
        .await
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let work = std::env::temp_dir().join(format!("sked-spawn-dev-{}", Uuid::new_v4().simple()));
    let dev = Command::new(env!("CARGO_BIN_EXE_sked"))
        .env("DATABASE_URL", &db.url)
        .env_remove("RUST_LOG")
        .env_remove("SKED_URL")
        .env_remove("SKED_TOKEN")
        .env_remove("SKED_API_URL")
        .args(["dev", "--listen", &listen, "--poll-secs", "0.2"])
        .args(["--shutdown-grace-secs", "2"])
        .arg("--work-dir")
        .arg(&work)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting sked dev");
    /// Stops `sked dev` (SIGTERM) and waits for it, on every way out of the test.
    struct Stop(Child, PathBuf);
    impl Drop for Stop {
        fn drop(&mut self) {
            // SAFETY: kill(2) of our own child, not yet reaped.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _stop = Stop(dev, work);
    let http = reqwest::Client::new();
    let api = format!("http://{listen}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !http
        .get(format!("{api}/api/v1/health"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "sked dev answers within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fan = r#""$SKED_CLI" spawn --name more -f - <<'EOF'
{"tasks": [{"name": "inner", "kind": "noop"}]}
EOF
"#;
    let response = http
        .post(format!("{api}/api/v1/workflows"))
        .bearer_auth(&alice)
        .json(&json!({"tasks": [
            {"name": "fan", "command": ["sh", "-c", fan],
             "env": {"SKED_CLI": env!("CARGO_BIN_EXE_sked")}},
            {"name": "join", "command": ["true"], "depends_on": ["fan"]},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let flow: Uuid = response.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let join = support::task_id(&db.pool, flow, "join").await;
    let ended = support::wait_for(
        &db.pool,
        join,
        &["succeeded", "failed", "upstream_failed", "cancelled"],
        Duration::from_secs(60),
    )
    .await;
    let fan = support::task_id(&db.pool, flow, "fan").await;
    let log: Option<String> = sqlx::query_scalar(
        "select string_agg(data, '' order by id) from sked.task_logs where task_id = $1",
    )
    .bind(fan)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(ended, "succeeded", "fan's output: {log:?}");
    let more = support::task_id(&db.pool, flow, "more").await;
    assert_eq!(support::state(&db.pool, more).await, "succeeded");
}
