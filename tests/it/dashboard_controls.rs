//! What the dashboard changes, in a headless Chromium against a real `sked-server`, worker
//! and PostgreSQL (the harness of `dashboard.rs` and `browser.rs`): a service scaled, rolled
//! over to a new command and environment and stopped from its page by its owner (and refused
//! what it cannot take, with the field's label or the server's message); no controls for a
//! user who does not own it; a workflow pasted in YAML submitted from the Submit page, and its
//! syntax error said with its line; a schedule backfilled from its page and followed live; a
//! map drawn as one box with its instances counted, shown or listed; a sub-workflow task drawn
//! as one box with its sub-workflow's state, opening that sub-workflow, whose page links back
//! up, and turning succeeded live when the workflow is re-run from failed.
//! Screenshots go to `target/test-output/dashboard/`.

use std::time::Duration;

use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sked_db::token::Role;
use uuid::Uuid;

use crate::browser::{Browser, PATIENCE};
use crate::dashboard::{Server, assert_quiet_console, open_signed_in, token_for};
use crate::support;

/// Replaces what the field `id` holds with `text`, as typing would (one `input` event).
async fn fill(b: &Browser, id: &str, text: &str) {
    b.wait(&format!("#{id}")).await;
    b.js(&format!(
        "(e => {{ e.value = {}; e.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})(document.getElementById('{id}'))",
        json!(text)
    ))
    .await;
}

/// What the field `id` holds.
async fn value_of(b: &Browser, id: &str) -> String {
    b.js(&format!("document.getElementById('{id}').value"))
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn click(b: &Browser, css: &str) {
    b.wait(css).await.click().await.unwrap();
}

/// Waits until the first element `css` matches holds `text`.
async fn wait_text(b: &Browser, what: &str, css: &str, text: &str) {
    b.wait_js(
        what,
        &format!(
            "document.querySelector({})?.textContent.includes({})",
            json!(css),
            json!(text)
        ),
    )
    .await;
}

/// A service's generation and replicas, as its row holds them.
async fn service_row(db: &TestDb, id: Uuid) -> (i32, i32) {
    sqlx::query_as("select generation, replicas from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

/// The copies of a service whose process is up, by generation: `(generation, count)`.
async fn copies_up(db: &TestDb, id: Uuid) -> Vec<(i32, i64)> {
    sqlx::query_as(
        "select generation, count(*) from sked.tasks
          where shard_of = $1 and state = 'running' and up_since is not null
          group by generation order by generation",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// Polls `check` until it holds, for up to `within`.
async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Submits a service of `owner` through the API: one copy of `sleep 300`, with a secret in
/// its environment.
async fn submit_service(server: &Server, token: &str) -> Uuid {
    let answer: Value = reqwest::Client::new()
        .post(format!("{}/api/v1/tasks", server.url))
        .bearer_auth(token)
        .json(&json!({
            "kind": "service",
            "command": ["sleep", "300"],
            "replicas": 1,
            "env": {"API_TOKEN": "first-secret", "MODE": "a"},
        }))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    answer["ids"][0].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_scales_changes_and_stops_a_service_from_its_page() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let worker = support::start_worker(&db, support::config(&["default"]));
    let id = submit_service(&server, &alice).await;
    eventually("the copy is up", PATIENCE, async || {
        copies_up(&db, id).await == [(1, 1)]
    })
    .await;

    let Ok(b) = Browser::start(1280, 1100, false).await else {
        return;
    };
    open_signed_in(&b, &server, &format!("/tasks/{id}"), &alice).await;
    b.wait("[data-service-controls] [data-generation='1'][data-replicas='1']")
        .await;
    assert_eq!(value_of(&b, "service-replicas").await, "1");
    assert_eq!(value_of(&b, "service-command").await, "sleep 300");
    assert_eq!(
        value_of(&b, "service-env").await,
        format!("API_TOKEN={}\nMODE=a", sked_types::secrets::MASK),
        "the environment shows as the API shows it, its secret masked"
    );
    assert!(
        !b.exists(".actions [data-action=cancel]").await,
        "a service is stopped from its controls, after a confirmation, not by a bare Cancel"
    );

    // A replicas value the field cannot take is refused naming the field and its range,
    // stays as typed, and nothing is sent.
    let scale = "[data-form=scale]";
    fill(&b, "service-replicas", "-2").await;
    click(&b, &format!("{scale} [data-action=scale]")).await;
    wait_text(
        &b,
        "a negative replicas is refused",
        &format!("{scale} p.error"),
        "Replicas must be a whole number from 1 to 1000, got \"-2\"",
    )
    .await;
    assert_eq!(
        value_of(&b, "service-replicas").await,
        "-2",
        "kept as typed"
    );
    b.screenshot("service-scale-refused").await;
    fill(&b, "service-replicas", "1001").await;
    click(&b, &format!("{scale} [data-action=scale]")).await;
    wait_text(
        &b,
        "too many replicas are refused",
        &format!("{scale} p.error"),
        "from 1 to 1000, got \"1001\"",
    )
    .await;
    assert_eq!(service_row(&db, id).await, (1, 1), "nothing changed");

    // Scaled to 2: the page says so, and two copies run.
    fill(&b, "service-replicas", "2").await;
    click(&b, &format!("{scale} [data-action=scale]")).await;
    wait_text(
        &b,
        "the scale is done",
        &format!("{scale} [data-done]"),
        "generation 1, 2 replicas",
    )
    .await;
    assert!(!b.exists(&format!("{scale} p.error")).await);
    b.wait("[data-service-controls] [data-generation='1'][data-replicas='2']")
        .await;
    assert_eq!(service_row(&db, id).await, (1, 2));
    eventually("two copies run", PATIENCE, async || {
        copies_up(&db, id).await == [(1, 2)]
    })
    .await;
    wait_text(
        &b,
        "the copies panel shows both copies up",
        "[data-service] p.hint",
        "2 of 2 up · generation 1",
    )
    .await;
    b.screenshot("service-scaled").await;

    // A new command: the generation goes up and the copies roll over to it.
    let definition = "[data-form=definition]";
    fill(&b, "service-command", "sleep 301").await;
    b.wait_js(
        "the arguments the line splits into are shown",
        "document.querySelector('[data-form=definition] [data-argv]')?.textContent === 'argv: [\"sleep\",\"301\"]'",
    )
    .await;
    click(&b, &format!("{definition} [data-action=update]")).await;
    wait_text(
        &b,
        "the update is done",
        &format!("{definition} [data-done]"),
        "generation 2, 2 replicas",
    )
    .await;
    b.wait("[data-service-controls] [data-generation='2']")
        .await;
    assert_eq!(service_row(&db, id).await, (2, 2));
    let command: Vec<String> =
        sqlx::query_scalar("select command || args from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(command, ["sleep", "301"]);
    eventually(
        "both copies run the new generation",
        Duration::from_secs(30),
        async || copies_up(&db, id).await == [(2, 2)],
    )
    .await;
    wait_text(
        &b,
        "the copies panel follows the roll",
        "[data-service] p.hint",
        "2 of 2 up · generation 2",
    )
    .await;
    b.screenshot("service-updated").await;

    // The environment with its secret still masked is refused before sending: the mask would
    // replace the secret.
    fill(
        &b,
        "service-env",
        &format!("API_TOKEN={}\nMODE=b", sked_types::secrets::MASK),
    )
    .await;
    b.wait("[data-form=definition] [data-masked]").await;
    click(&b, &format!("{definition} [data-action=update]")).await;
    wait_text(
        &b,
        "a masked value is refused",
        &format!("{definition} p.error"),
        "the value of API_TOKEN is hidden",
    )
    .await;
    assert_eq!(service_row(&db, id).await, (2, 2), "nothing was sent");
    b.screenshot("service-env-masked-refused").await;

    // What the server refuses (a value longer than exec takes) shows its message.
    fill(
        &b,
        "service-env",
        &format!(
            "API_TOKEN=second-secret\nMODE=b\nDATA={}",
            "x".repeat(200 * 1024)
        ),
    )
    .await;
    click(&b, &format!("{definition} [data-action=update]")).await;
    wait_text(
        &b,
        "the server's refusal shows",
        &format!("{definition} p.error"),
        "131,072 bytes",
    )
    .await;
    assert_eq!(
        service_row(&db, id).await,
        (2, 2),
        "a refused change changes nothing"
    );
    b.js("document.querySelector('[data-form=definition] p.error').scrollIntoView()")
        .await;
    b.screenshot("service-update-refused").await;

    // With the real value typed, the environment is sent whole.
    fill(&b, "service-env", "API_TOKEN=second-secret\nMODE=b").await;
    click(&b, &format!("{definition} [data-action=update]")).await;
    wait_text(
        &b,
        "the environment is changed",
        &format!("{definition} [data-done]"),
        "generation 3",
    )
    .await;
    let env: Value = sqlx::query_scalar("select env from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(env, json!({"API_TOKEN": "second-secret", "MODE": "b"}));
    b.wait_js(
        "the field shows the new environment, its secret masked again",
        &format!(
            "document.getElementById('service-env').value === {}",
            json!(format!("API_TOKEN={}\nMODE=b", sked_types::secrets::MASK))
        ),
    )
    .await;

    // Stop asks first; "Keep it running" changes nothing.
    click(&b, "[data-service-controls] [data-action=stop]").await;
    wait_text(
        &b,
        "the stop asks for a confirmation",
        "[data-confirm=stop]",
        "Stop this service? Its 2 copies",
    )
    .await;
    b.screenshot("service-stop-confirm").await;
    click(&b, "[data-service-controls] [data-action=keep]").await;
    b.wait("[data-service-controls] [data-action=stop]").await;
    assert!(!b.exists("[data-confirm=stop]").await);
    assert_eq!(support::state(&db.pool, id).await, "blocked", "still runs");

    click(&b, "[data-service-controls] [data-action=stop]").await;
    click(&b, "[data-service-controls] [data-action=confirm-stop]").await;
    b.wait(".task-head [data-state=cancelled]").await;
    assert_eq!(support::state(&db.pool, id).await, "cancelled");
    eventually(
        "every copy has ended",
        PATIENCE,
        async || {
            let unfinished: i64 = sqlx::query_scalar(
                "select count(*) from sked.tasks where shard_of = $1
                  and state not in ('succeeded', 'failed', 'cancelled', 'upstream_failed', 'skipped')",
            )
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
            unfinished == 0
        },
    )
    .await;
    b.wait_js(
        "the controls are gone once the service has ended",
        "!document.querySelector('[data-service-controls]')",
    )
    .await;
    b.screenshot("service-stopped").await;

    // The refusals of the server (422) are the only expected console errors.
    let errors: Vec<String> = b
        .console_errors()
        .await
        .into_iter()
        .filter(|e| !e.contains("422"))
        .collect();
    assert_quiet_console(errors);
    b.close().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_does_not_own_a_service_gets_no_controls() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let bob = token_for(&db, "bob", Role::User).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let id = submit_service(&server, &alice).await;

    // The server refuses bob whatever a page offers: the service reads as absent to him.
    let http = reqwest::Client::new();
    let patch = http
        .patch(format!("{}/api/v1/services/{id}", server.url))
        .bearer_auth(&bob)
        .json(&json!({"replicas": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(patch.status(), 404);
    let cancel = http
        .post(format!("{}/api/v1/tasks/{id}/cancel", server.url))
        .bearer_auth(&bob)
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 404);
    assert_eq!(service_row(&db, id).await, (1, 1));
    assert_eq!(support::state(&db.pool, id).await, "blocked");

    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, &format!("/tasks/{id}"), &bob).await;
    b.wait("p.error").await;
    assert!(
        !b.exists("[data-service-controls]").await,
        "bob gets no controls"
    );
    assert!(!b.exists("#service-replicas").await);
    assert!(!b.exists("[data-action=stop]").await);
    b.screenshot("service-not-owner").await;

    // An admin gets them for any owner's service.
    b.js("localStorage.clear()").await;
    b.goto("about:blank").await;
    open_signed_in(&b, &server, &format!("/tasks/{id}"), &admin).await;
    b.wait("[data-service-controls] #service-replicas").await;
    assert!(b.exists("[data-service-controls] [data-action=stop]").await);

    // The 404s of bob's page are the only expected console errors.
    let errors: Vec<String> = b
        .console_errors()
        .await
        .into_iter()
        .filter(|e| !e.contains("404"))
        .collect();
    assert_quiet_console(errors);
    b.close().await;
}

/// A workflow of three tasks in YAML, as `sked submit -f` takes it.
const WORKFLOW: &str = "name: from-the-dashboard
tasks:
  - name: extract
    command: [\"true\"]
  - name: transform
    command: [\"sh\", \"-c\", \"echo '{\\\"rows\\\": 3}'\"]
    depends_on: [extract]
  - name: load
    command: [\"true\"]
    depends_on: [transform]
";

async fn workflows(db: &TestDb) -> i64 {
    sqlx::query_scalar("select count(*) from sked.workflows")
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_pasted_in_yaml_is_submitted_and_its_page_opens() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let worker = support::start_worker(&db, support::config(&["default"]));
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/workflows", &alice).await;
    click(&b, "[data-action=new-workflow]").await;
    b.wait_js(
        "the workflow form opens",
        "location.pathname === '/submit/workflow'",
    )
    .await;
    b.wait("[data-tab=workflow][aria-current=page]").await;

    // A syntax error (a list left open on line 7, found so at line 8) is said with its line
    // while typing, and again when submitting; nothing is sent.
    let broken = WORKFLOW.replace("depends_on: [extract]", "depends_on: [extract");
    fill(&b, "workflow-spec", &broken).await;
    wait_text(
        &b,
        "the reading says where the text is wrong",
        ".workflow-form p.hint.bad",
        "line 8, column 9",
    )
    .await;
    click(&b, "[data-action=submit-workflow]").await;
    wait_text(
        &b,
        "the error says its line",
        ".workflow-form p.error",
        "The workflow cannot be read: line 8, column 9:",
    )
    .await;
    assert_eq!(
        value_of(&b, "workflow-spec").await,
        broken,
        "the text is kept as typed"
    );
    b.screenshot("workflow-yaml-syntax-error").await;
    assert_eq!(workflows(&db).await, 0, "nothing was submitted");

    // What the server refuses (a cycle) shows its message.
    fill(
        &b,
        "workflow-spec",
        "tasks:\n  - name: a\n    kind: noop\n    depends_on: [b]\n  - name: b\n    kind: noop\n    depends_on: [a]\n",
    )
    .await;
    click(&b, "[data-action=submit-workflow]").await;
    wait_text(
        &b,
        "the server's refusal shows",
        ".workflow-form p.error",
        "the dependencies form a cycle",
    )
    .await;
    assert_eq!(
        workflows(&db).await,
        0,
        "a refused workflow inserts nothing"
    );
    b.screenshot("workflow-yaml-refused").await;

    // Three tasks: the page moves to the new workflow, which runs to its end.
    fill(&b, "workflow-spec", WORKFLOW).await;
    wait_text(
        &b,
        "the reading names the tasks",
        ".workflow-form [data-reading]",
        "from-the-dashboard: 3 tasks (extract, transform, load)",
    )
    .await;
    b.screenshot("workflow-yaml").await;
    click(&b, "[data-action=submit-workflow]").await;
    b.wait_js(
        "the page moves to the new workflow",
        "location.pathname.startsWith('/workflows/')",
    )
    .await;
    let path = b.js("location.pathname").await;
    let id: Uuid = path
        .as_str()
        .unwrap()
        .trim_start_matches("/workflows/")
        .parse()
        .unwrap();
    let (name, owner): (String, String) =
        sqlx::query_as("select name, owner from sked.workflows where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (name.as_str(), owner.as_str()),
        ("from-the-dashboard", "alice")
    );
    b.wait("h1 [data-state=succeeded]").await;
    let boxes = b
        .js("document.querySelectorAll('g.node[data-state=succeeded]').length")
        .await;
    assert_eq!(boxes, 3, "the graph shows the three tasks succeeded");
    let output: Value = sqlx::query_scalar(
        "select output from sked.tasks where workflow_id = $1 and name = 'transform'",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        output,
        json!({"rows": 3}),
        "the YAML's quoting reached the command"
    );
    b.screenshot("workflow-yaml-submitted").await;

    // The 422 of the cycle is the only expected console error.
    let errors: Vec<String> = b
        .console_errors()
        .await
        .into_iter()
        .filter(|e| !e.contains("422"))
        .collect();
    assert_quiet_console(errors);
    b.close().await;
    worker.shutdown().await;
}

/// The start of the hour `hours` hours before now's, in milliseconds since the epoch.
fn hour_ago_ms(hours: i64) -> i64 {
    let now = chrono::Utc::now().timestamp_millis();
    now - now.rem_euclid(3_600_000) - hours * 3_600_000
}

/// Sets the `datetime-local` field `id` to the moment `ms`, in the browser's own zone.
async fn fill_local_time(b: &Browser, id: &str, ms: i64) {
    let text = b
        .js(&format!(
            "(d => {{ const p = n => String(n).padStart(2, '0'); \
             return `${{d.getFullYear()}}-${{p(d.getMonth() + 1)}}-${{p(d.getDate())}}T${{p(d.getHours())}}:${{p(d.getMinutes())}}`; }})(new Date({ms}))"
        ))
        .await;
    fill(b, id, text.as_str().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_is_backfilled_from_its_page_and_its_progress_follows_live() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let id: Uuid = sqlx::query_scalar(
        r#"insert into sked.schedules (owner, name, cron, task, paused_at)
           values ('alice', 'hourly', '0 * * * *', '{"command": ["true"]}', now()) returning id"#,
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let worker = support::start_worker(&db, support::config(&["default"]));
    let Ok(b) = Browser::start(1280, 900, false).await else {
        worker.shutdown().await;
        return;
    };
    open_signed_in(&b, &server, &format!("/schedules/{id}"), &alice).await;
    b.js("window.__skedNoReload = 1").await;
    click(&b, "[data-action=backfill]").await;
    fill_local_time(&b, "backfill-from", hour_ago_ms(3)).await;
    fill_local_time(&b, "backfill-to", hour_ago_ms(1)).await;
    fill(&b, "backfill-max-active", "2").await;
    b.screenshot("schedule-backfill-form").await;
    click(&b, "[data-action=start-backfill]").await;
    wait_text(
        &b,
        "the start is said",
        "p.notice",
        "Backfill started: 3 ticks.",
    )
    .await;
    // The worker runs the three ticks; the row follows without a reload.
    b.wait("tr[data-backfill][data-state=succeeded]").await;
    wait_text(
        &b,
        "the progress shows",
        "tr[data-backfill] td.wrap",
        "3 of 3 ticks fired · 0 running · 3 succeeded · 0 failed",
    )
    .await;
    assert_eq!(b.js("window.__skedNoReload === 1").await, true);
    let fired: i64 = sqlx::query_scalar(
        "select count(*) from sked.schedule_runs where schedule_id = $1 and backfill_id is not null",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(fired, 3);
    b.js("document.querySelector('table.schedule-backfills').scrollIntoView()")
        .await;
    b.screenshot("schedule-backfill-done").await;

    // A range that ends before it starts: the server's rule is shown in the form.
    b.js("window.scrollTo(0, 0)").await;
    click(&b, "[data-action=backfill]").await;
    fill_local_time(&b, "backfill-from", hour_ago_ms(1)).await;
    fill_local_time(&b, "backfill-to", hour_ago_ms(3)).await;
    click(&b, "[data-action=start-backfill]").await;
    wait_text(
        &b,
        "the refusal shows",
        "form.backfill-form p.error",
        "is after to",
    )
    .await;
    let backfills: i64 = sqlx::query_scalar("select count(*) from sked.schedule_backfills")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(backfills, 1, "the refused one was not started");
    let errors: Vec<String> = b
        .console_errors()
        .await
        .into_iter()
        .filter(|e| !e.contains("422"))
        .collect();
    assert_quiet_console(errors);
    b.close().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_is_one_box_with_its_count_that_lists_or_draws_its_instances() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let worker = support::start_worker(&db, support::config(&["default"]));
    // extract → m (a map over 30 rows) and s (a map over 3) → sink.
    let rows: Vec<i32> = (0..30).collect();
    let output = json!({"rows": rows, "few": ["a", "b", "c"]}).to_string();
    let spec = json!({"name": "mapped", "tasks": [
        {"name": "extract", "command": ["sh", "-c", format!("echo '{output}'")]},
        {"name": "m", "command": ["true"], "depends_on": ["extract"], "map_over": "extract.rows"},
        {"name": "s", "command": ["true"], "depends_on": ["extract"], "map_over": "extract.few"},
        {"name": "sink", "command": ["true"], "depends_on": ["m", "s"]},
    ]});
    let wf: Uuid = sqlx::query_scalar("select sked.workflow_submit($1, 'alice')")
        .bind(spec)
        .fetch_one(&db.pool)
        .await
        .expect("a valid workflow is accepted");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let state: String = sqlx::query_scalar("select state from sked.workflows where id = $1")
            .bind(wf)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        if state != "running" {
            assert_eq!(state, "succeeded");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the workflow finishes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let map_id: Uuid =
        sqlx::query_scalar("select id from sked.tasks where workflow_id = $1 and name = 'm'")
            .bind(wf)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, &format!("/workflows/{wf}"), &alice).await;
    b.wait("h1 [data-state=succeeded]").await;

    // One box per map, with the count of its instances by state; none for the instances.
    b.wait("g.node[data-node=m][data-instances='30']").await;
    let boxes = b
        .js("document.querySelectorAll('svg.dag g.node').length")
        .await;
    assert_eq!(
        boxes, 4,
        "extract, m, s and sink: the instances fold into their maps"
    );
    let counts = b
        .js("document.querySelector('g.node[data-node=m]').getAttribute('data-counts')")
        .await;
    assert_eq!(counts, "30 shards · 30 succeeded");
    let tag = b
        .js("document.querySelector('g.node[data-node=m] text.tag').textContent")
        .await;
    assert_eq!(tag, "map", "a map's box says it is a map");
    let edges = b
        .js("document.querySelectorAll('svg.dag path.edge').length")
        .await;
    assert_eq!(edges, 4, "extract → m, s and m, s → sink");
    b.screenshot("workflow-map-folded").await;

    // Three instances are drawn in the graph on request, and folded again.
    click_js(&b, "g.node[data-node=s] [data-action=shards-show]").await;
    b.wait_js(
        "the instances of s are drawn",
        "document.querySelectorAll('g.node[data-node^=\"s[\"]').length === 3",
    )
    .await;
    b.screenshot("workflow-map-expanded").await;
    click_js(&b, "g.node[data-node=s] [data-action=shards-hide]").await;
    b.wait_js(
        "the instances of s fold again",
        "document.querySelectorAll('g.node[data-node^=\"s[\"]').length === 0",
    )
    .await;

    // Thirty are listed on the tasks page instead.
    let href = b
        .js("document.querySelector('g.node[data-node=m] [data-action=shards-list]').getAttribute('data-href')")
        .await;
    assert_eq!(href, format!("/tasks?shard_of={map_id}"));
    click_js(&b, "g.node[data-node=m] [data-action=shards-list]").await;
    b.wait_js(
        "the task list filtered by shard_of opens",
        &format!("location.pathname === '/tasks' && location.search.includes('shard_of={map_id}')"),
    )
    .await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    worker.shutdown().await;
}

/// Clicks the element `css` matches with a DOM event (an SVG element's click target may be
/// its box, which a WebDriver click would hit instead).
async fn click_js(b: &Browser, css: &str) {
    b.wait(css).await;
    b.js(&format!(
        "(e => {{ e.dispatchEvent(new MouseEvent('click', {{bubbles: true}})); return true; }})(document.querySelector({}))",
        json!(css)
    ))
    .await;
}

/// The state of workflow `id`.
async fn workflow_state(db: &TestDb, id: Uuid) -> String {
    sqlx::query_scalar("select state from sked.workflows where id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subworkflow_is_one_box_that_opens_it_and_turns_succeeded_live_on_a_rerun() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let worker = support::start_worker(&db, support::config(&["default"]));
    // a → sub (x → y, inline) → z, where y fails the first time it runs: so does the
    // sub-workflow, then sub, and z cannot run.
    let marker = std::env::temp_dir().join(format!("sked-sub-{}", Uuid::new_v4().simple()));
    let m = marker.display();
    let spec = json!({"name": "nested", "tasks": [
        {"name": "a", "command": ["true"]},
        {"name": "sub", "depends_on": ["a"], "workflow": {"tasks": [
            {"name": "x", "command": ["true"]},
            {"name": "y", "depends_on": ["x"], "max_attempts": 1,
             "command": ["sh", "-c", format!("test -e {m} || {{ touch {m}; exit 1; }}")]},
        ]}},
        {"name": "z", "command": ["true"], "depends_on": ["sub"]},
    ]});
    let wf: Uuid = sqlx::query_scalar("select sked.workflow_submit($1, 'alice')")
        .bind(spec)
        .fetch_one(&db.pool)
        .await
        .expect("a valid workflow is accepted");
    eventually("the workflow fails", Duration::from_secs(60), || async {
        workflow_state(&db, wf).await != "running"
    })
    .await;
    assert_eq!(workflow_state(&db, wf).await, "failed");
    let sub_task: Uuid =
        sqlx::query_scalar("select id from sked.tasks where workflow_id = $1 and name = 'sub'")
            .bind(wf)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let sub_wf: Uuid =
        sqlx::query_scalar("select id from sked.workflows where parent_task_id = $1")
            .bind(sub_task)
            .fetch_one(&db.pool)
            .await
            .expect("sub started one sub-workflow");
    assert_eq!(workflow_state(&db, sub_wf).await, "failed");

    let Ok(b) = Browser::start(1280, 900, false).await else {
        std::fs::remove_file(&marker).ok();
        return;
    };
    open_signed_in(&b, &server, &format!("/workflows/{wf}"), &alice).await;
    b.wait("h1 [data-state=failed]").await;

    // One box for sub, tagged, saying its sub-workflow failed, with a link to it.
    b.wait("g.node[data-node=sub][data-subworkflow=failed][data-state=failed]")
        .await;
    let boxes = b
        .js("document.querySelectorAll('svg.dag g.node').length")
        .await;
    assert_eq!(
        boxes, 3,
        "a, sub and z: the sub-workflow's tasks are not drawn here"
    );
    let tag = b
        .js("document.querySelector('g.node[data-node=sub] text.tag').textContent")
        .await;
    assert_eq!(tag, "sub-workflow", "the box says it runs a sub-workflow");
    let caption = b
        .js("document.querySelector('g.node[data-node=sub] text.caption').textContent")
        .await;
    assert_eq!(caption, "failed", "the box says the sub-workflow's state");
    let href = b
        .js("document.querySelector('g.node[data-node=sub] [data-action=open-subworkflow]').getAttribute('data-href')")
        .await;
    assert_eq!(href, format!("/workflows/{sub_wf}"));
    let row = b
        .js(&format!(
            "document.querySelector('tr[data-task-id=\"{sub_task}\"] a[data-action=open-subworkflow]').textContent"
        ))
        .await;
    assert_eq!(row, "sub-workflow failed", "its row says so too, as a link");
    b.wait("g.node[data-node=z][data-state=upstream_failed]")
        .await;
    b.screenshot("workflow-subworkflow-failed").await;

    // The link opens the sub-workflow, whose page names the task that runs it and links back.
    click_js(&b, "g.node[data-node=sub] [data-action=open-subworkflow]").await;
    b.wait_js(
        "the sub-workflow's page opens",
        &format!("location.pathname === '/workflows/{sub_wf}'"),
    )
    .await;
    b.wait("g.node[data-node=y][data-state=failed]").await;
    b.wait(&format!("[data-parent-workflow='{wf}']")).await;
    wait_text(
        &b,
        "the sub-workflow names the task that runs it",
        "[data-parent-workflow]",
        "sub-workflow of task sub in workflow",
    )
    .await;
    let up = b
        .js("document.querySelector('[data-parent-workflow] a[data-action=parent-workflow]').getAttribute('href')")
        .await;
    assert_eq!(up, format!("/workflows/{wf}"));
    let task_link = b
        .js("document.querySelector('[data-parent-workflow] a[data-action=parent-task]').getAttribute('href')")
        .await;
    assert_eq!(task_link, format!("/tasks/{sub_task}"));
    b.screenshot("subworkflow-page").await;

    // The task's page shows what it runs and links to its sub-workflow.
    click(&b, "[data-parent-workflow] a[data-action=parent-task]").await;
    b.wait_js(
        "the task's page opens",
        &format!("location.pathname === '/tasks/{sub_task}'"),
    )
    .await;
    b.wait(&format!(
        "[data-field=subworkflow] a[data-action=open-subworkflow][href='/workflows/{sub_wf}']"
    ))
    .await;
    wait_text(
        &b,
        "the task shows its sub-workflow's body",
        "[data-field=subworkflow-body]",
        "\"name\": \"y\"",
    )
    .await;
    b.screenshot("subworkflow-task").await;

    // Back up to the workflow, re-run it from failed: y runs again (and succeeds), so do the
    // sub-workflow, sub and z, and the page follows without a reload.
    b.goto(&format!("{}/workflows/{sub_wf}", server.url)).await;
    click(&b, "[data-parent-workflow] a[data-action=parent-workflow]").await;
    b.wait_js(
        "the parent workflow's page opens",
        &format!("location.pathname === '/workflows/{wf}'"),
    )
    .await;
    b.wait("g.node[data-node=sub][data-subworkflow=failed]")
        .await;
    b.js("(window.skedSameDocument = true)").await;
    click(&b, "button[data-action=rerun]:not([disabled])").await;
    b.wait("g.node[data-node=sub][data-subworkflow=succeeded][data-state=succeeded]")
        .await;
    b.wait("g.node[data-node=z][data-state=succeeded]").await;
    b.wait("h1 [data-state=succeeded]").await;
    let caption = b
        .js("document.querySelector('g.node[data-node=sub] text.caption').textContent")
        .await;
    assert_eq!(caption, "succeeded");
    assert_eq!(
        b.js("window.skedSameDocument === true").await,
        true,
        "the page was not reloaded"
    );
    let href = b
        .js("document.querySelector('g.node[data-node=sub] [data-action=open-subworkflow]').getAttribute('data-href')")
        .await;
    assert_eq!(
        href,
        format!("/workflows/{sub_wf}"),
        "the sub-workflow ran again from where it failed"
    );
    assert_eq!(workflow_state(&db, wf).await, "succeeded");
    b.screenshot("workflow-subworkflow-rerun").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    worker.shutdown().await;
    std::fs::remove_file(&marker).ok();
}
