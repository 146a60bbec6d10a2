//! The dashboard as an on-call engineer reads it, in a headless Chromium against a real
//! `sked-server`, worker and PostgreSQL (the harness of `dashboard.rs` and `browser.rs`): why
//! a task waits, long commands and values cut, what exec cannot take refused at submit, one
//! name per worker, the time zone said, every page reachable on a phone, the overview's cards
//! opening the lists they count, a service's and a sharded task's parent, the log's times,
//! search and download, and the task list's count and its time, workflow and schedule
//! filters. Screenshots go to `target/test-output/dashboard/`.

use sked_db::testing::TestDb;
use sked_db::token::Role;

use crate::browser::Browser;
use crate::dashboard::{Server, assert_quiet_console, open_signed_in, token_for};
use crate::support::{self, insert};

/// The text of the first element `css` matches (empty when none does).
async fn text_of(b: &Browser, css: &str) -> String {
    b.js(&format!(
        "document.querySelector({})?.textContent ?? ''",
        serde_json::json!(css)
    ))
    .await
    .as_str()
    .unwrap_or_default()
    .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_tasks_page_says_why_it_waits_and_follows_the_workers() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let id = insert(
        &db.pool,
        "(command, queue, labels) values (array['true'], 'gpu', array['cuda'])",
    )
    .await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, &format!("/tasks/{id}"), &admin).await;
    let reason = ".waiting-reason";
    b.wait(&format!("{reason}[data-reason=no_worker]")).await;
    let text = text_of(&b, reason).await;
    assert!(
        text.contains("no live worker serves queue gpu"),
        "the page says why the task waits: {text}"
    );
    assert!(
        text.contains("sked-worker --queues gpu"),
        "and what would start it: {text}"
    );
    b.screenshot("task-waiting-no-worker").await;

    // A worker of the queue without the task's label starts: the reason follows without a
    // reload (a worker event), and names the missing label.
    b.js("window.__skedNoReload = 1").await;
    let worker = support::start_worker(&db, support::config(&["gpu"]));
    b.wait(&format!("{reason}[data-reason=missing_labels]"))
        .await;
    let text = text_of(&b, reason).await;
    assert!(
        text.contains("none has cuda"),
        "the reason names the label no worker has: {text}"
    );
    assert_eq!(b.js("window.__skedNoReload === 1").await, true);
    assert_eq!(support::state(&db.pool, id).await, "waiting");
    b.screenshot("task-waiting-missing-labels").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    worker.shutdown().await;
}

/// Sets the field `id` of a form to `text` as typing would (one `input` event), for values too
/// long to type key by key.
async fn set_field(b: &Browser, id: &str, text: &str) {
    b.wait(&format!("#{id}")).await;
    b.js(&format!(
        "(e => {{ e.value = {}; e.dispatchEvent(new Event('input', {{bubbles: true}})); return true; }})(document.getElementById('{id}'))",
        serde_json::json!(text)
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_submit_form_shows_the_refusal_of_an_env_value_exec_would_refuse() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/submit", &alice).await;
    set_field(&b, "submit-command", "printenv DATA").await;
    set_field(
        &b,
        "submit-env",
        &format!("DATA={}", "x".repeat(200 * 1024)),
    )
    .await;
    b.wait("form.submit [data-action=submit]")
        .await
        .click()
        .await
        .unwrap();
    b.wait_js(
        "the refusal shows",
        "document.querySelector('form.submit p.error')?.textContent.includes('131,072 bytes')",
    )
    .await;
    let says = text_of(&b, "form.submit p.error").await;
    assert!(
        says.contains("MAX_ARG_STRLEN"),
        "the form shows the rule's limit: {says}"
    );
    let tasks: i64 = sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(tasks, 0, "nothing was submitted");
    b.js("document.querySelector('form.submit p.error').scrollIntoView()")
        .await;
    b.screenshot("submit-env-too-long").await;
    // The 422 of the refusal is the only expected console error.
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
async fn long_commands_and_env_values_are_cut_in_lists_and_shown_whole_on_demand() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    // 150 arguments of 1,000 bytes (150 KB: each within what exec takes) and a 100 KB value.
    let id: uuid::Uuid = sqlx::query_scalar(
        "insert into sked.tasks (command, env, queue) values
           (array['echo'] || array_fill(repeat('a', 999) || 'b', array[150]),
            jsonb_build_object('PAYLOAD', repeat('v', 100000)), 'nowhere')
         returning id",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    for _ in 0..20 {
        insert(
            &db.pool,
            "(command, queue) values (array['true'], 'nowhere')",
        )
        .await;
    }

    // The listing sends a preview of 512 bytes, says it is cut and how long the whole is.
    let http = reqwest::Client::new();
    let page = http
        .get(format!("{}/api/v1/tasks?view=summary", server.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.len() < 20_000,
        "the first page of the list is small: {} bytes",
        page.len()
    );
    let page: serde_json::Value = serde_json::from_str(&page).unwrap();
    let summary = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id.to_string())
        .expect("the long task is listed");
    assert_eq!(summary["argv_cut"], true);
    assert_eq!(
        summary["argv_bytes"],
        4 + 150 * 1001,
        "the whole line's bytes"
    );
    let preview: usize = summary["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().len())
        .sum();
    assert_eq!(preview, sked_types::events::ARGV_PREVIEW_BYTES);

    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/tasks", &admin).await;
    let row = format!("tr[data-task-id='{id}'] .cmd");
    b.wait(&row).await;
    let line = text_of(&b, &row).await;
    assert!(
        line.starts_with("echo aaaa") && line.ends_with("… (146.6 KB in all)"),
        "the list shows the preview and the whole size: {}",
        &line[line.len().saturating_sub(80)..]
    );
    b.screenshot("tasks-long-command").await;

    // The task's page: the command line and the value cut, each with "show all".
    b.goto(&format!("{}/tasks/{id}", server.url)).await;
    let command = "p.command-line .cut";
    b.wait(&format!("{command}[data-cut=cut]")).await;
    let env = "dd[data-env=PAYLOAD] .cut";
    b.wait(&format!("{env}[data-cut=cut]")).await;
    let height = b.js("document.documentElement.scrollHeight").await;
    assert!(
        height.as_i64().unwrap() < 2500,
        "the page keeps a readable height: {height}"
    );
    assert!(
        text_of(&b, &format!("{command} [data-action=show-all]"))
            .await
            .contains("show all (146.6 KB)"),
        "the button says how long the whole is"
    );
    b.screenshot("task-long-command").await;
    b.wait(&format!("{command} [data-action=show-all]"))
        .await
        .click()
        .await
        .unwrap();
    b.wait(&format!("{command}[data-cut=open]")).await;
    let shown = text_of(&b, command).await;
    assert!(
        shown.starts_with(&format!("echo {}", "a".repeat(999)))
            && shown.ends_with(&format!("{}b show less", "a".repeat(999)))
            && shown.len() == 4 + 150 * 1001 + " show less".len(),
        "show all shows the whole command line ({} characters)",
        shown.len()
    );
    assert!(
        b.exists(&format!("{env}[data-cut=cut]")).await,
        "the value stays cut until asked"
    );
    b.wait(&format!("{env} [data-action=show-all]"))
        .await
        .click()
        .await
        .unwrap();
    b.wait_js(
        "the whole value shows",
        &format!("document.querySelector('{env}').textContent.includes('v'.repeat(100000))"),
    )
    .await;
    // "show less", at the end of the whole line, cuts it again.
    let less = format!("{command} [data-action=show-all]");
    b.js(&format!(
        "document.querySelector('{less}').scrollIntoView({{block: 'center'}})"
    ))
    .await;
    b.wait(&less).await.click().await.unwrap();
    b.wait(&format!("{command}[data-cut=cut]")).await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_has_one_name_on_the_task_page_and_the_workers_page() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let worker = support::start_worker(&db, support::config(&["e2e"]));
    let id = insert(
        &db.pool,
        "(command, queue) values (array['sleep', '30'], 'e2e')",
    )
    .await;
    support::wait_for(&db.pool, id, &["running"], crate::browser::PATIENCE).await;
    let (worker_id, name): (uuid::Uuid, String) = sqlx::query_as(
        "select w.id, w.name from sked.workers w join sked.tasks t on t.worker_id = w.id
          where t.id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, &format!("/tasks/{id}"), &admin).await;
    let on_task = "dl.kv .worker-name";
    b.wait_js(
        "the task page names the worker",
        &format!(
            "document.querySelector('{on_task}')?.textContent === {}",
            serde_json::json!(name)
        ),
    )
    .await;
    assert_eq!(
        b.js(&format!("document.querySelector('{on_task}').title"))
            .await,
        worker_id.to_string(),
        "its id is the title"
    );
    b.wait_js(
        "the attempts name it alike",
        &format!(
            "document.querySelector('table.attempts .worker-name')?.textContent === {}",
            serde_json::json!(name)
        ),
    )
    .await;
    b.screenshot("task-worker-name").await;
    b.wait(on_task).await.click().await.unwrap();
    let row = format!("tr[data-worker-id='{worker_id}'] td:first-child");
    b.wait(&row).await;
    assert_eq!(
        text_of(&b, &row).await,
        name,
        "the Workers page shows the same name"
    );
    b.screenshot("workers-worker-name").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_says_the_time_zone_its_times_are_in() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    // Created at a known instant: 2026-12-01 12:00:00 UTC, 13:00:00 in Paris (winter time).
    let id = insert(
        &db.pool,
        "(command, queue, created_at, next_run_at) values
           (array['true'], 'nowhere', '2026-12-01 12:00:00+00', '2026-12-01 12:00:00+00')",
    )
    .await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    b.goto(&server.url).await;
    b.set_time_zone("Europe/Paris").await;
    open_signed_in(&b, &server, &format!("/tasks/{id}"), &admin).await;
    b.wait("[data-zone='Europe/Paris']").await;
    let zone = text_of(&b, ".top .zone").await;
    assert_eq!(
        zone, "times in Europe/Paris (UTC+01:00)",
        "the top bar says which zone times are in"
    );
    b.wait("dl.kv time").await;
    assert_eq!(
        text_of(&b, "dl.kv time").await,
        "2026-12-01 13:00:00",
        "and the times are in that zone"
    );
    b.screenshot("task-time-zone").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_phone_every_page_is_reachable_from_the_navigation() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let Ok(b) = Browser::start(390, 844, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/", &admin).await;
    // Every link of the navigation lies wholly on screen, without scrolling anything.
    let links = b
        .js(
            "Array.from(document.querySelectorAll('nav.nav a')).map(a => {
               const r = a.getBoundingClientRect();
               return [a.textContent, r.left >= 0 && r.right <= window.innerWidth
                                      && r.top >= 0 && r.bottom <= window.innerHeight];
             })",
        )
        .await;
    let links = links.as_array().expect("the navigation's links");
    let names: Vec<&str> = links.iter().map(|l| l[0].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "Overview",
            "History",
            "Tasks",
            "Workflows",
            "Schedules",
            "Services",
            "Workers",
            "Queues",
            "Submit"
        ]
    );
    for link in links {
        assert_eq!(link[1], true, "{} is on screen at 390 px", link[0]);
    }
    assert!(
        b.js("document.documentElement.scrollWidth <= window.innerWidth")
            .await
            .as_bool()
            .unwrap(),
        "the page does not scroll sideways"
    );
    b.screenshot("nav-phone").await;
    // The last ones open their pages with a tap.
    for (name, path) in [
        ("Workers", "/workers"),
        ("Queues", "/queues"),
        ("Submit", "/submit"),
    ] {
        b.client
            .find(fantoccini::Locator::LinkText(name))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        b.wait_js(
            &format!("{name} opens"),
            &format!("location.pathname === '{path}'"),
        )
        .await;
        b.wait(&format!("nav.nav a[aria-current=page][href='{path}']"))
            .await;
    }
    b.screenshot("nav-phone-submit").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
}

/// The ids of the rows the task list shows.
async fn listed(b: &Browser) -> Vec<String> {
    let ids = b
        .js("Array.from(document.querySelectorAll('table.task-list tr[data-task-id]')).map(r => r.dataset.taskId)")
        .await;
    let mut ids: Vec<String> = ids
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_overview_card_opens_the_list_of_exactly_what_it_counts() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let mut due = Vec::new();
    for _ in 0..2 {
        due.push(
            insert(
                &db.pool,
                "(command, queue) values (array['true'], 'nowhere')",
            )
            .await,
        );
    }
    let mut delayed = Vec::new();
    for _ in 0..3 {
        delayed.push(
            insert(
                &db.pool,
                "(command, queue, next_run_at) values (array['true'], 'nowhere', now() + interval '1 hour')",
            )
            .await,
        );
    }
    let failed = "(command, state, attempt, started_at, finished_at, error) values
                    (array['false'], 'failed', 1, now() - interval '{ago}', now() - interval '{ago}', 'boom')";
    let old_failure = insert(&db.pool, &failed.replace("{ago}", "2 hours")).await;
    let mut recent_failures = Vec::new();
    for _ in 0..2 {
        recent_failures.push(insert(&db.pool, &failed.replace("{ago}", "1 minute")).await);
    }
    let sorted = |ids: &[uuid::Uuid]| {
        let mut ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        ids.sort();
        ids
    };

    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/", &admin).await;
    for (card, count, ids, says) in [
        ("waiting_due", "2", sorted(&due), "due now"),
        ("delayed", "3", sorted(&delayed), "due later (delayed)"),
        (
            "failed_last_hour",
            "2",
            sorted(&recent_failures),
            "finished since",
        ),
    ] {
        let css = format!("a.card[data-card={card}]");
        b.wait_js(
            &format!("the {card} card counts"),
            &format!("document.querySelector('{css} .num')?.textContent === '{count}'"),
        )
        .await;
        b.wait(&css).await.click().await.unwrap();
        b.wait("[data-times]").await;
        b.wait_js(
            &format!("the {card} list has its rows"),
            &format!(
                "document.querySelectorAll('table.task-list tr[data-task-id]').length === {count}"
            ),
        )
        .await;
        assert_eq!(listed(&b).await, ids, "{card} opens the tasks it counts");
        assert!(
            text_of(&b, "[data-times]").await.contains(says),
            "the list says it is limited: {says}"
        );
        b.screenshot(&format!("overview-card-{card}")).await;
        b.client.back().await.unwrap();
        b.wait("a.card[data-card=running]").await;
    }
    assert!(
        !sorted(&recent_failures).contains(&old_failure.to_string()),
        "the failure of two hours ago is not in the last hour's list"
    );

    // The filters over REST: the delayed tasks, and the failures since a time.
    let http = reqwest::Client::new();
    let get = async |query: &str| -> serde_json::Value {
        http.get(format!("{}/api/v1/tasks?view=summary&{query}", server.url))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    };
    let ids = |page: serde_json::Value| -> Vec<String> {
        let mut ids: Vec<String> = page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(get("due=later").await), sorted(&delayed));
    assert_eq!(ids(get("due=now&state=waiting").await), sorted(&due));
    let hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    assert_eq!(
        ids(get(&format!("finished_after={}", urlencode(&hour_ago))).await),
        sorted(&recent_failures)
    );
    let (status, body) = {
        let r = http
            .get(format!("{}/api/v1/tasks?due=soon", server.url))
            .bearer_auth(&admin)
            .send()
            .await
            .unwrap();
        (r.status(), r.text().await.unwrap())
    };
    assert_eq!(status, 400, "an unknown due is refused: {body}");
    assert_quiet_console(b.console_errors().await);
    b.close().await;
}

fn urlencode(s: &str) -> String {
    s.replace('+', "%2B").replace(':', "%3A")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_and_a_sharded_task_show_that_they_run_as_their_copies_and_shards() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    let worker = support::start_worker(&db, support::config(&["default"]));
    let service: uuid::Uuid = sqlx::query_scalar(
        "select sked.task_submit(kind => 'service', command => array['sleep', '300'], replicas => 2)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let sharded: uuid::Uuid =
        sqlx::query_scalar("select sked.task_submit(command => array['true'], shards => 3)")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    support::wait_for(&db.pool, sharded, &["succeeded"], crate::browser::PATIENCE).await;
    assert_eq!(support::state(&db.pool, service).await, "blocked");

    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, &format!("/tasks/{service}"), &admin).await;
    b.wait(".task-head [data-shown-state=active]").await;
    let attempts = "dd[data-field=attempts]";
    b.wait(attempts).await;
    assert_eq!(
        text_of(&b, attempts).await,
        "none of its own: it runs as its 2 copies",
        "a service has no attempts of its own"
    );
    assert!(
        text_of(&b, "[data-parent-log]")
            .await
            .contains("each copy has its own log"),
        "the log says where the output is"
    );
    assert!(
        !b.exists(".waiting-reason").await,
        "a service is not said to wait for its copies"
    );
    assert!(
        !b.exists(".task-head [data-state=blocked]:not([data-shown-state])")
            .await,
        "the service is not shown as blocked"
    );
    b.screenshot("task-service-parent").await;

    b.goto(&format!("{}/tasks/{sharded}", server.url)).await;
    b.wait(".task-head [data-state=succeeded]").await;
    b.wait_js(
        "the shards' states are counted",
        "document.querySelector('[data-shard-tally]')?.textContent === ' · 3 succeeded'",
    )
    .await;
    assert_eq!(
        text_of(&b, attempts).await,
        "none of its own: it ran as its 3 shards",
        "a sharded task has no attempts of its own"
    );
    assert!(
        text_of(&b, "[data-parent-log]")
            .await
            .contains("each shard has its own log"),
    );
    b.screenshot("task-sharded-parent").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_shows_each_lines_time_searches_and_downloads_the_whole_log() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let alice = token_for(&db, "alice", Role::User).await;
    let worker = support::start_worker(&db, support::config(&["e2e"]));
    let id = insert(
        &db.pool,
        "(owner, command, queue) values
           ('alice', array['sh', '-c', 'echo alpha; sleep 1.2; echo beta; echo gamma >&2'], 'e2e')",
    )
    .await;
    support::wait_for(&db.pool, id, &["succeeded"], crate::browser::PATIENCE).await;
    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    // The page's downloads are caught: the blob's text and the file's name.
    b.goto(&server.url).await;
    open_signed_in(&b, &server, &format!("/tasks/{id}"), &alice).await;
    b.js("(() => {
            const create = URL.createObjectURL;
            URL.createObjectURL = blob => { blob.text().then(t => window.__skedDownload = t); return create(blob); };
            HTMLAnchorElement.prototype.click = function () { window.__skedDownloadName = this.download; };
            return true;
          })()")
        .await;
    let log = format!("pre.log[data-log='{id}']");
    b.wait_js(
        "the log is read",
        &format!("document.querySelector(\"{log}\").textContent.includes('gamma')"),
    )
    .await;

    // Each line starts with the time its chunk was written, in the browser's zone (UTC here).
    let times = b
        .js(&format!(
            "Array.from(document.querySelectorAll(\"{log} .ts\")).map(e => e.textContent)"
        ))
        .await;
    let times: Vec<String> = times
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(times.len(), 3, "one time per line: {times:?}");
    let first: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select min(at) from sked.task_logs where task_id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        times[0],
        first.format("%H:%M:%S%.3f").to_string(),
        "the first line's time is its chunk's"
    );
    assert!(
        times[1] > times[0],
        "beta was written 1.2 s after alpha: {times:?}"
    );
    b.screenshot("task-log-times").await;

    // A search shows the matching lines only, and counts them.
    let search = b.wait("input[name=log-search]").await;
    search.send_keys("BET").await.unwrap();
    b.wait_js(
        "the search counts",
        "document.querySelector('[data-log-matches]')?.textContent === '1 matching line'",
    )
    .await;
    let shown = text_of(&b, &log).await;
    assert!(
        shown.contains("beta") && !shown.contains("alpha") && !shown.contains("gamma"),
        "only the matching line shows: {shown:?}"
    );
    b.screenshot("task-log-search").await;
    search.clear().await.unwrap();
    b.js("document.querySelector('input[name=log-search]').dispatchEvent(new Event('input', {bubbles: true}))")
        .await;
    b.wait_js(
        "the whole log is back",
        &format!("document.querySelector(\"{log}\").textContent.includes('alpha')"),
    )
    .await;

    // Download: the whole log through the API with the token, saved from a blob.
    b.wait("[data-action=download-log]")
        .await
        .click()
        .await
        .unwrap();
    b.wait_js(
        "the download is offered",
        "typeof window.__skedDownload === 'string'",
    )
    .await;
    let text = b.js("window.__skedDownload").await;
    let text = text.as_str().unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(lines, ["alpha", "beta", "gamma"], "the whole log: {text:?}");
    assert_eq!(
        b.js("window.__skedDownloadName").await,
        format!("task-{id}.log")
    );
    assert_quiet_console(b.console_errors().await);
    b.close().await;
    worker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_list_counts_what_it_filters_and_filters_by_workflow_schedule_and_time() {
    let db = TestDb::new().await;
    let server = Server::start(&db).await;
    let admin = token_for(&db, "ops", Role::Admin).await;
    // Old tasks (submitted two days ago by the time in their ids) and new ones.
    for i in 0..3 {
        insert(
            &db.pool,
            &format!(
                "(id, command, queue) values (encode(set_bit(set_bit(overlay(\
                 uuid_send(gen_random_uuid()) placing substring(int8send((extract(epoch from \
                 now() - interval '2 days') * 1000)::bigint) from 3) from 1 for 6), 52, 1), 53, \
                 1), 'hex')::uuid, array['old', '{i}'], 'mail')"
            ),
        )
        .await;
    }
    let mut new = Vec::new();
    for i in 0..2 {
        new.push(
            insert(
                &db.pool,
                &format!("(command, queue) values (array['new', '{i}'], 'mail')"),
            )
            .await
            .to_string(),
        );
    }
    new.sort();
    let workflow: uuid::Uuid = sqlx::query_scalar("select sked.workflow_submit($1, 'ops')")
        .bind(serde_json::json!({"tasks": [
            {"name": "a", "command": ["true"]},
            {"name": "b", "command": ["true"], "depends_on": ["a"]},
        ]}))
        .fetch_one(&db.pool)
        .await
        .unwrap();

    let Ok(b) = Browser::start(1280, 900, false).await else {
        return;
    };
    open_signed_in(&b, &server, "/tasks", &admin).await;
    b.goto(&format!("{}/tasks?queue=mail", server.url)).await;
    b.wait_js(
        "the count of queue mail",
        "document.querySelector('[data-count]')?.textContent === '5 tasks'",
    )
    .await;
    // The last 24 hours: the two new tasks, counted and listed.
    b.js(
        "(s => { s.value = '86400'; s.dispatchEvent(new Event('change', {bubbles: true})); \
         return true; })(document.querySelector('select[name=created_after]'))",
    )
    .await;
    b.wait_js(
        "the count of the last 24 hours",
        "document.querySelector('[data-count]')?.textContent === '2 tasks'",
    )
    .await;
    b.wait_js(
        "the list of the last 24 hours",
        "document.querySelectorAll('table.task-list tr[data-task-id]').length === 2",
    )
    .await;
    assert_eq!(
        listed(&b).await,
        new,
        "only the tasks submitted in the last day"
    );
    assert!(
        b.js("location.search")
            .await
            .as_str()
            .unwrap()
            .contains("created_after="),
        "the address keeps the range"
    );
    b.screenshot("tasks-count-and-time-range").await;

    // A workflow's page links to its tasks in the list.
    b.goto(&format!("{}/workflows/{workflow}", server.url))
        .await;
    b.wait("a[data-action=in-task-list]")
        .await
        .click()
        .await
        .unwrap();
    b.wait("[data-of]").await;
    b.wait_js(
        "the workflow's tasks",
        "document.querySelectorAll('table.task-list tr[data-task-id]').length === 2 \
         && document.querySelector('[data-count]')?.textContent === '2 tasks'",
    )
    .await;
    assert!(
        text_of(&b, "[data-of]")
            .await
            .starts_with("Tasks of workflow")
    );
    b.screenshot("tasks-of-a-workflow").await;
    assert_quiet_console(b.console_errors().await);
    b.close().await;
}
