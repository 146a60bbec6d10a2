//! The dashboard end to end: a real `sked-server` process serving the embedded WebAssembly
//! app, a real worker, a real PostgreSQL, and a headless Chromium (see `browser.rs`).
//!
//! Every test also checks that the browser console holds no error or warning.

use std::net::SocketAddr;
use std::time::Duration;

use sked_db::testing::TestDb;
use sked_db::token::{self, Role};
use uuid::Uuid;

use crate::browser::{Browser, PATIENCE};
use crate::support::{self, insert, wait_for};

/// A `sked-server` process on a fixed port, which the test may kill and start again.
pub(crate) struct Server {
    addr: SocketAddr,
    pub(crate) url: String,
    database_url: String,
    child: Option<tokio::process::Child>,
}

impl Server {
    pub(crate) async fn start(db: &TestDb) -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut server = Server {
            addr,
            url: format!("http://{addr}"),
            database_url: db.url.clone(),
            child: None,
        };
        server.spawn().await;
        server
    }

    async fn spawn(&mut self) {
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-server"))
            .args(["--listen", &self.addr.to_string()])
            .env("DATABASE_URL", &self.database_url)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("start sked-server");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(self.addr).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "sked-server did not listen on {}",
                self.addr
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// kill -9: connections drop without a goodbye, as when a machine dies.
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.expect("kill sked-server");
        }
    }
}

pub(crate) async fn token_for(db: &TestDb, owner: &str, role: Role) -> String {
    token::create(&db.pool, owner, role, "dashboard test")
        .await
        .expect("create a token")
}

/// Opens the dashboard signed in through the `#token=` link.
pub(crate) async fn open_signed_in(b: &Browser, server: &Server, path: &str, token: &str) {
    b.goto(&format!("{}{path}#token={token}", server.url)).await;
    b.wait(".who .owner").await;
    b.wait("[data-live=live]").await;
}

pub(crate) fn assert_quiet_console(errors: Vec<String>) {
    assert!(
        errors.is_empty(),
        "the browser console has errors or warnings: {errors:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_with_a_token_and_out() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    b.goto(&server.url).await;
    let input = b.wait("input[name=token]").await;
    b.screenshot("signin").await;

    // A wrong token is refused with a message, and nothing else happens.
    input.send_keys("sked_not_a_real_token").await.unwrap();
    b.wait("form button[type=submit]")
        .await
        .click()
        .await
        .unwrap();
    let error = b.wait(".signin .error").await;
    assert!(
        error.text().await.unwrap().contains("not valid"),
        "a bad token says so"
    );

    input.clear().await.unwrap();
    input.send_keys(&alice).await.unwrap();
    b.wait("form button[type=submit]")
        .await
        .click()
        .await
        .unwrap();
    let who = b.wait(".who .owner").await;
    assert_eq!(who.text().await.unwrap(), "alice (user)");
    b.wait("[data-live=live]").await;

    // The token survives a reload; signing out forgets it.
    b.client.refresh().await.unwrap();
    b.wait(".who .owner").await;
    b.wait("[data-action=sign-out]")
        .await
        .click()
        .await
        .unwrap();
    b.wait("input[name=token]").await;
    b.client.refresh().await.unwrap();
    b.wait("input[name=token]").await;

    // The 401 of the bad token is the only expected console error.
    let errors: Vec<String> = b
        .console_errors()
        .await
        .into_iter()
        .filter(|e| !e.contains("401"))
        .collect();
    assert_quiet_console(errors);
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_inserted_by_sql_appears_and_turns_succeeded_without_reload() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/tasks", &admin).await;
    // A marker that a reload would erase.
    b.js("window.__skedNoReload = 1").await;

    let id = insert(
        &db.pool,
        "(command, queue) values (array['sh', '-c', 'sleep 1; echo done'], 'e2e')",
    )
    .await;
    let row = format!("tr[data-task-id='{id}']");
    b.wait(&format!("{row}[data-state=waiting]")).await;

    let worker = support::start_worker(&db, support::config(&["e2e"]));
    b.wait(&format!("{row}[data-state=running]")).await;
    b.wait(&format!("{row}[data-state=succeeded]")).await;
    assert_eq!(support::state(&db.pool, id).await, "succeeded");
    assert_eq!(
        b.js("window.__skedNoReload === 1").await,
        true,
        "the page was not reloaded"
    );
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_tail_follows_a_running_task_and_cancel_kills_it() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let worker = support::start_worker(&db, support::config(&["e2e"]));
    let pid_file = std::env::temp_dir().join(format!("sked-e2e-{}.pid", Uuid::new_v4().simple()));
    let script = format!(
        "echo $$ > {}; i=0; while true; do i=$((i+1)); echo line-$i; sleep 0.3; done",
        pid_file.display()
    );
    let id = insert(
        &db.pool,
        &format!("(owner, command, queue) values ('alice', array['sh', '-c', '{script}'], 'e2e')"),
    )
    .await;
    wait_for(&db.pool, id, &["running"], PATIENCE).await;
    let pid = support::read_pid(&pid_file, PATIENCE).await;

    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, &format!("/tasks/{id}"), &alice).await;
    let log = format!("pre.log[data-log='{id}']");
    b.wait(&log).await;
    // Lines keep arriving while the task runs, without reload.
    let text_of_log = format!("document.querySelector(\"{log}\").textContent");
    b.wait_js(
        "the first lines",
        &format!("{text_of_log}.includes('line-2')"),
    )
    .await;
    let lines_then = line_count(&b, &text_of_log).await;
    b.wait_js(
        "more lines",
        &format!(
            "{text_of_log}.split('line-').length - 1 >= {}",
            lines_then + 5
        ),
    )
    .await;
    assert_eq!(support::state(&db.pool, id).await, "running");
    b.screenshot("task-detail-running").await;

    // Cancel from the page: the process dies and the database says cancelled.
    b.wait("[data-action=cancel]").await.click().await.unwrap();
    wait_for(&db.pool, id, &["cancelled"], PATIENCE).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while support::process_alive(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the task's process {pid} still runs after cancel"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.wait(".task-head [data-state=cancelled]").await;
    b.screenshot("task-detail-cancelled").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    worker.shutdown().await;
    let _ = std::fs::remove_file(pid_file);
}

async fn line_count(b: &Browser, text_expr: &str) -> i64 {
    b.js(&format!("{text_expr}.split('line-').length - 1"))
        .await
        .as_i64()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_sees_only_their_own_tasks() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let mine = insert(&db.pool, "(owner, command) values ('alice', array['true'])").await;
    let bobs = insert(&db.pool, "(owner, command) values ('bob', array['true'])").await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/tasks", &alice).await;
    b.wait(&format!("tr[data-task-id='{mine}']")).await;
    assert!(
        !b.exists(&format!("tr[data-task-id='{bobs}']")).await,
        "bob's task is not listed for alice"
    );
    // A task inserted for bob while alice watches does not appear either; hers does.
    let bobs_new = insert(&db.pool, "(owner, command) values ('bob', array['true'])").await;
    let mine_new = insert(&db.pool, "(owner, command) values ('alice', array['true'])").await;
    b.wait(&format!("tr[data-task-id='{mine_new}']")).await;
    assert!(!b.exists(&format!("tr[data-task-id='{bobs_new}']")).await);

    // Bob's task by its address: not found, like a task that does not exist.
    b.goto(&format!("{}/tasks/{bobs}", server.url)).await;
    let error = b.wait(".error").await;
    let text = error.text().await.unwrap();
    assert!(text.contains("no such task"), "{text}");
    let page = b.client.source().await.unwrap();
    assert!(
        !page.contains("bob"),
        "nothing of bob's task is shown to alice"
    );
    // The 404 of bob's task is the expected console error.
    let errors: Vec<String> = b
        .console_errors()
        .await
        .into_iter()
        .filter(|e| !e.contains("404"))
        .collect();
    assert_quiet_console(errors);
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_reconnects_and_resyncs_after_a_server_restart() {
    let db = TestDb::new().await;
    let mut server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/tasks", &admin).await;
    b.js("window.__skedNoReload = 1").await;

    server.kill().await;
    b.wait("[data-live]:not([data-live=live])").await;
    // Changes made while the server is down reach the page after it comes back.
    let id = insert(&db.pool, "(command) values (array['true'])").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.spawn().await;
    b.wait("[data-live=live]").await;
    b.wait(&format!("tr[data-task-id='{id}']")).await;
    assert_eq!(b.js("window.__skedNoReload === 1").await, true);
    // While the server was down, the browser logged failed connections: expected here.
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_websockets_the_page_falls_back_to_polling() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    b.block_websockets().await;
    b.goto(&format!("{}/tasks#token={admin}", server.url)).await;
    b.wait("[data-live=polling]").await;
    b.js("window.__skedNoReload = 1").await;
    let id = insert(&db.pool, "(command) values (array['true'])").await;
    b.wait(&format!("tr[data-task-id='{id}']")).await;
    assert_eq!(b.js("window.__skedNoReload === 1").await, true);
    assert_quiet_console(b.console_errors().await);
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_real_data_on_a_laptop_and_a_phone() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let worker = support::start_worker(&db, support::config(&["default", "reports"]));
    // Some history: successes, a failure with stderr, a delayed task, a workflow, a schedule.
    for i in 0..5 {
        insert(
            &db.pool,
            &format!("(command, queue) values (array['sh', '-c', 'echo report {i}'], 'reports')"),
        )
        .await;
    }
    let failed = insert(
        &db.pool,
        "(command, max_attempts) values (array['sh', '-c', 'echo oops >&2; exit 3'], 1)",
    )
    .await;
    insert(
        &db.pool,
        "(command, next_run_at) values (array['echo', 'later'], now() + interval '1 hour')",
    )
    .await;
    let workflow: Uuid = sqlx::query_scalar(
        "select sked.workflow_submit('{\"name\": \"etl\", \"tasks\": [
            {\"name\": \"collect\", \"command\": [\"true\"]},
            {\"name\": \"clean\", \"command\": [\"true\"], \"depends_on\": [\"collect\"]},
            {\"name\": \"aggregate\", \"command\": [\"true\"], \"depends_on\": [\"clean\"]},
            {\"name\": \"export\", \"command\": [\"true\"], \"depends_on\": [\"aggregate\"]}]}'::jsonb)",
    )
    .fetch_one(&db.pool)
    .await
    .expect("submit a workflow");
    let schedule: Uuid = sqlx::query_scalar(
        "insert into sked.schedules (name, cron, task) values
           ('nightly-backup', '0 0 * * *', '{\"command\": [\"echo\", \"backup\"]}') returning id",
    )
    .fetch_one(&db.pool)
    .await
    .expect("create a schedule");
    sqlx::query("select sked.schedule_run_now($1)")
        .bind(schedule)
        .execute(&db.pool)
        .await
        .expect("run the schedule now");
    wait_for(&db.pool, failed, &["failed"], PATIENCE).await;

    let pages = [
        ("overview", "/".to_owned()),
        ("tasks", "/tasks".to_owned()),
        ("task-failed", format!("/tasks/{failed}")),
        ("workflows", "/workflows".to_owned()),
        ("workflow", format!("/workflows/{workflow}")),
        ("schedules", "/schedules".to_owned()),
        ("schedule", format!("/schedules/{schedule}")),
        ("workers", "/workers".to_owned()),
        ("queues", "/queues".to_owned()),
        ("submit", "/submit".to_owned()),
    ];
    for (size, (w, h), dark) in [
        ("laptop", (1280, 900), false),
        ("phone", (390, 844), false),
        ("laptop-dark", (1280, 900), true),
    ] {
        let Ok(b) = Browser::start(w, h, dark).await else {
            return;
        };
        open_signed_in(&b, &server, "/", &admin).await;
        for (name, path) in &pages {
            b.goto(&format!("{}{path}", server.url)).await;
            b.wait("main.page").await;
            // Wait for the page's data: no "loading" left, and no error shown.
            b.wait_js(
                &format!("{name} loads"),
                "!document.querySelector('main.page .loading')",
            )
            .await;
            assert!(!b.exists("main.page .error").await, "{name} shows an error");
            let viewport = b.js("window.innerWidth").await.as_i64().unwrap_or(0);
            assert_eq!(viewport, i64::from(w), "the viewport is {w} px wide");
            let body_width = b.js("document.documentElement.scrollWidth").await;
            assert!(
                body_width.as_i64().unwrap_or(0) <= viewport,
                "{name} at {w}px does not scroll sideways as a whole (width {body_width})"
            );
            b.screenshot(&format!("{name}-{size}")).await;
        }
        assert_quiet_console(b.console_errors().await);
        b.close().await;
    }
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_pauses_and_resumes_a_queue_from_the_queues_page() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "root", Role::Admin).await;
    let alice = token_for(&db, "alice", Role::User).await;
    insert(
        &db.pool,
        "(owner, kind, queue) values ('alice', 'noop', 'mail')",
    )
    .await;
    sqlx::query("select sked.queue_set_limits('mail', 3, 10)")
        .execute(&db.pool)
        .await
        .expect("limit the queue");
    let paused = async || -> bool {
        sqlx::query_scalar("select exists (select 1 from sked.queues where name = 'mail' and paused_at is not null)")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/queues", &admin).await;
    let row = "tr[data-queue=mail]";
    b.wait(&format!("{row}[data-paused=false]")).await;
    b.wait_js(
        "the limits show",
        &format!("document.querySelector('{row} .limits').textContent.includes('max 3 running')"),
    )
    .await;
    b.wait(&format!("{row} [data-action=pause]"))
        .await
        .click()
        .await
        .unwrap();
    b.wait(&format!("{row}[data-paused=true]")).await;
    assert!(paused().await, "the button paused the queue");
    b.screenshot("queues-paused").await;
    b.wait(&format!("{row} [data-action=resume]"))
        .await
        .click()
        .await
        .unwrap();
    b.wait(&format!("{row}[data-paused=false]")).await;
    assert!(!paused().await, "the button resumed the queue");
    assert_quiet_console(b.console_errors().await);
    b.close().await;

    // A user sees the controls but no buttons.
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/queues", &alice).await;
    b.wait(&format!("{row}[data-paused=false]")).await;
    assert!(
        !b.exists(&format!("{row} button")).await,
        "a user gets no pause button"
    );
    assert_quiet_console(b.console_errors().await);
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_edits_a_queues_limits_from_the_queues_page() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "root", Role::Admin).await;
    insert(
        &db.pool,
        "(owner, kind, queue) values ('alice', 'noop', 'mail')",
    )
    .await;
    let limits = async || -> (Option<i32>, Option<f64>, Option<i32>) {
        sqlx::query_as(
            "select max_running, rate_per_sec, burst from sked.queues where name = 'mail'",
        )
        .fetch_optional(&db.pool)
        .await
        .unwrap()
        .unwrap_or_default()
    };
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/queues", &admin).await;
    let row = "tr[data-queue=mail]";
    let form = "tr[data-limits-of=mail]";
    // Types `text` into a field of the form, replacing what it holds.
    let fill = async |name: &str, text: &str| {
        let css = format!("{form} input[name={name}]");
        let input = b.wait(&css).await;
        b.js(&format!(
            "(e => {{ e.value = ''; e.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})(document.querySelector('{css}'))"
        ))
        .await;
        if !text.is_empty() {
            input.send_keys(text).await.unwrap();
        }
    };
    let click = async |css: &str| b.wait(css).await.click().await.unwrap();
    let limits_text = format!("document.querySelector('{row} .limits').textContent");
    let form_error = async || {
        b.wait(&format!("{form} .error"))
            .await
            .text()
            .await
            .unwrap()
    };

    // Max running 3 and 5/s: the row and the database follow.
    b.wait(&format!("{row}[data-paused=false]")).await;
    click(&format!("{row} [data-action=edit-limits]")).await;
    fill("max_running", "3").await;
    fill("rate_per_sec", "5").await;
    // The live numbers change under the open form, which keeps what is typed.
    insert(
        &db.pool,
        "(owner, kind, queue) values ('alice', 'noop', 'mail')",
    )
    .await;
    b.wait_js(
        "the depth follows the new task",
        &format!("document.querySelector('{row} td:nth-child(2)').textContent === '2'"),
    )
    .await;
    assert_eq!(
        b.js(&format!(
            "document.querySelector('{form} input[name=max_running]').value"
        ))
        .await,
        "3",
        "a live update keeps the open form and what is typed in it"
    );
    b.screenshot("queues-limits-form").await;
    click(&format!("{form} [data-action=save-limits]")).await;
    b.wait_js(
        "the row shows the new limits",
        &format!("{limits_text} === 'max 3 running · 5/s, burst 5'"),
    )
    .await;
    assert!(!b.exists(form).await, "saving closes the form");
    assert_eq!(
        limits().await,
        (Some(3), Some(5.0), None),
        "the form set max running 3 and 5/s (the burst left to its default)"
    );

    // The form opens with the queue's limits.
    click(&format!("{row} [data-action=edit-limits]")).await;
    let value = async |name: &str| {
        b.js(&format!(
            "document.querySelector('{form} input[name={name}]').value"
        ))
        .await
    };
    assert_eq!(value("max_running").await, "3");
    assert_eq!(value("rate_per_sec").await, "5");
    assert_eq!(value("burst").await, "", "the default burst is left empty");

    // A value that is not a limit is refused in the browser: a message, nothing sent.
    fill("max_running", "-1").await;
    click(&format!("{form} [data-action=save-limits]")).await;
    let e = form_error().await;
    assert!(
        e.contains("Max running must be at least 1"),
        "a negative count is refused with a message: {e}"
    );
    fill("max_running", "many").await;
    click(&format!("{form} [data-action=save-limits]")).await;
    b.wait_js(
        "the message follows the field",
        &format!("document.querySelector('{form} .error').textContent.includes('whole number')"),
    )
    .await;
    b.screenshot("queues-limits-bad").await;
    assert_eq!(
        limits().await,
        (Some(3), Some(5.0), None),
        "a bad value changes nothing"
    );

    // What the server refuses (a burst without a rate) is shown with its message, and
    // changes nothing either.
    fill("max_running", "3").await;
    fill("rate_per_sec", "").await;
    fill("burst", "4").await;
    click(&format!("{form} [data-action=save-limits]")).await;
    b.wait_js(
        "the server's message shows in the form",
        &format!(
            "document.querySelector('{form} .error')?.textContent.includes('burst needs rate_per_sec')"
        ),
    )
    .await;
    assert!(b.exists(form).await, "a refused form stays open");
    assert_eq!(
        limits().await,
        (Some(3), Some(5.0), None),
        "a refused request changes nothing"
    );

    // Cancel closes the form and changes nothing.
    click(&format!("{form} [data-action=cancel-limits]")).await;
    b.wait_js(
        "cancel closes the form",
        &format!("!document.querySelector('{form}')"),
    )
    .await;
    assert_eq!(limits().await, (Some(3), Some(5.0), None));

    // Empty fields remove the limits.
    click(&format!("{row} [data-action=edit-limits]")).await;
    fill("max_running", "").await;
    fill("rate_per_sec", "").await;
    click(&format!("{form} [data-action=save-limits]")).await;
    b.wait_js("the row shows no limits", &format!("{limits_text} === ''"))
        .await;
    assert_eq!(
        limits().await,
        (None, None, None),
        "empty fields removed the limits"
    );

    // The 422 of the burst without a rate is the only expected console error.
    let errors: Vec<String> = b
        .console_errors()
        .await
        .into_iter()
        .filter(|e| !e.contains("422"))
        .collect();
    assert_quiet_console(errors);
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_submit_form_sends_resources_and_limits_and_refuses_a_bad_size() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let tasks = async || -> i64 {
        sqlx::query_scalar("select count(*) from sked.tasks")
            .fetch_one(&db.pool)
            .await
            .unwrap()
    };
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/submit", &alice).await;
    // Types `text` into the field `id`, replacing what it holds.
    let fill = async |id: &str, text: &str| {
        let input = b.wait(&format!("#{id}")).await;
        b.js(&format!(
            "(e => {{ e.value = ''; e.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})(document.getElementById('{id}'))"
        ))
        .await;
        if !text.is_empty() {
            input.send_keys(text).await.unwrap();
        }
    };
    let click = async |css: &str| b.wait(css).await.click().await.unwrap();
    let submit = "form.submit [data-action=submit]";
    let error_says = async |what: &str, text: &str| {
        b.wait_js(
            what,
            &format!(
                "document.querySelector('form.submit p.error')?.textContent.includes({})",
                serde_json::json!(text)
            ),
        )
        .await;
    };

    fill("submit-command", "echo hello").await;
    // The resources are folded away until asked for.
    let open = "document.querySelector('details[data-resources]').open";
    assert_eq!(b.js(open).await, false, "the resources start folded");
    click("details[data-resources] > summary").await;
    assert_eq!(b.js(open).await, true, "the summary unfolds them");
    fill("submit-cpu", "0.5").await;
    b.wait_js(
        "the CPU field says what it reads",
        "document.querySelector('#submit-cpu ~ [data-reading]')?.textContent === '500 millicores = 0.5 cores'",
    )
    .await;

    // A size with an unknown unit is refused in the browser with the CLI's sentence: a
    // message, and nothing sent.
    fill("submit-memory", "256X").await;
    click(submit).await;
    error_says(
        "a bad memory size is refused",
        r#"Memory: unknown unit in "256X" (use K, M, G or T)"#,
    )
    .await;
    b.screenshot("submit-resources-bad").await;
    assert_eq!(tasks().await, 0, "a bad size inserts nothing");

    // What the server refuses (a user name with a space) shows its message and inserts
    // nothing either.
    fill("submit-memory", "256M").await;
    fill("submit-run-as", "no body").await;
    click(submit).await;
    error_says("the server's message shows", "run_as must be a user name").await;
    assert_eq!(tasks().await, 0, "a refused task inserts nothing");

    fill("submit-run-as", "").await;
    // Number fields keep what is typed, key by key, sign and exponent included; what they
    // cannot take is refused naming the field and its range.
    fill("submit-priority", "-3").await;
    fill("submit-max-attempts", "1e3").await;
    fill("submit-timeout", "-5").await;
    click(submit).await;
    error_says(
        "a negative timeout is refused naming the field",
        "Timeout must be a number of seconds, more than 0",
    )
    .await;
    assert_eq!(tasks().await, 0, "a refused timeout inserts nothing");
    fill("submit-timeout", "2.5").await;
    click("#submit-preemptible").await;
    b.screenshot("submit-resources").await;
    click(submit).await;
    b.wait_js(
        "the page moves to the new task",
        "location.pathname.startsWith('/tasks/')",
    )
    .await;
    let path = b.js("location.pathname").await;
    let id: Uuid = path.as_str().unwrap()["/tasks/".len()..]
        .parse()
        .expect("the task's id in the address");
    let row: (
        Option<i32>,
        Option<i32>,
        bool,
        Option<i64>,
        Option<String>,
        String,
    ) = sqlx::query_as(
        "select cpu_millis, memory_mb, preemptible, max_output_bytes, run_as, owner
               from sked.tasks where id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("the submitted task");
    assert_eq!(
        row,
        (Some(500), Some(256), true, None, None, "alice".to_owned()),
        "the task asks for 0.5 CPU and 256 MB, is preemptible, and leaves the rest unset"
    );
    let typed: (i32, i32, f64) = sqlx::query_as(
        "select priority, max_attempts, extract(epoch from timeout)::float8
           from sked.tasks where id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(typed, (-3, 1000, 2.5), "-3, 1e3 and 2.5 as typed");
    assert_eq!(tasks().await, 1);

    // The 422 of the refused user name is the only expected console error.
    let errors: Vec<String> = b
        .console_errors()
        .await
        .into_iter()
        .filter(|e| !e.contains("422"))
        .collect();
    assert_quiet_console(errors);
    b.close().await;
}
