//! Prometheus metrics: `sked-server`'s `/metrics` (admin tokens) and `sked-worker
//! --metrics-listen`, scraped by a real Prometheus server after known work; the cap on the
//! queues one scrape names; the schedule tick counters, which never go down.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sked_db::testing::TestDb;
use sked_db::token::Role;
use sqlx::PgPool;
use tokio::process::{Child, Command};

use crate::support::tool;

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

async fn until_listening(addr: SocketAddr, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} did not listen on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_server(db: &TestDb, args: &[&str]) -> (Child, SocketAddr) {
    let addr = free_addr();
    let child = Command::new(env!("CARGO_BIN_EXE_sked-server"))
        .args(["--listen", &addr.to_string()])
        .args(args)
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .expect("start sked-server");
    until_listening(addr, "sked-server").await;
    (child, addr)
}

async fn start_worker(db: &TestDb, queues: &str, metrics: SocketAddr) -> Child {
    let work = std::env::temp_dir().join(format!("sked-metrics-{}", uuid::Uuid::new_v4()));
    let child = Command::new(env!("CARGO_BIN_EXE_sked-worker"))
        .args([
            "--queues",
            queues,
            "--concurrency",
            "4",
            "--poll-secs",
            "0.2",
        ])
        .args(["--metrics-listen", &metrics.to_string()])
        .arg("--work-dir")
        .arg(&work)
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .expect("start sked-worker");
    until_listening(metrics, "the worker's metrics").await;
    child
}

/// GET `url` with an optional bearer token: the status and the body.
async fn get(url: &str, token: Option<&str>) -> (u16, String, Option<String>) {
    let mut request = reqwest::Client::new().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("an answer");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, response.text().await.unwrap(), content_type)
}

/// The samples of a text in the Prometheus format: `name{labels}` → value, checking each
/// line's shape.
fn samples(text: &str) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("a sample line is `series value`: {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("a sample's value is a number: {line:?}"));
        out.insert(series.to_owned(), value);
    }
    out
}

/// Submits `n` tasks of `queue` running `command` once, due in `delay_secs`.
async fn submit(pool: &PgPool, queue: &str, command: &str, n: usize, delay_secs: f64) {
    for _ in 0..n {
        sqlx::query(
            "insert into sked.tasks (queue, command, max_attempts, next_run_at)
             values ($1, array[$2], 1, now() + make_interval(secs => $3))",
        )
        .bind(queue)
        .bind(command)
        .bind(delay_secs)
        .execute(pool)
        .await
        .unwrap();
    }
}

async fn until_finished(pool: &PgPool, queue: &str, n: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done: i64 = sqlx::query_scalar(
            "select count(*) from sked.tasks where queue = $1 and finished_at is not null",
        )
        .bind(queue)
        .fetch_one(pool)
        .await
        .unwrap();
        if done == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{n} tasks of {queue} finish"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Known work: 3 tasks of `mq` succeed and 2 fail, run by the worker; `idle` (no worker) has
/// 4 due tasks and 1 delayed.
async fn known_work(pool: &PgPool) {
    submit(pool, "idle", "true", 4, 0.0).await;
    submit(pool, "idle", "true", 1, 3600.0).await;
    submit(pool, "mq", "true", 3, 0.0).await;
    submit(pool, "mq", "false", 2, 0.0).await;
    until_finished(pool, "mq", 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_and_a_worker_are_scraped_by_prometheus_after_known_work() {
    let Some(prometheus) = tool("prometheus", "apt-get install prometheus") else {
        return;
    };
    let db = TestDb::new().await;
    let admin = sked_db::token::create(&db.pool, "root", Role::Admin, "prometheus")
        .await
        .unwrap();
    let (_server, server) = start_server(&db, &[]).await;
    let worker_metrics = free_addr();
    let mut worker = start_worker(&db, "mq", worker_metrics).await;
    known_work(&db.pool).await;
    // Slots are released once the results are written; let the worker's writes settle.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let dir = tempdir("prometheus");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - '{rules}'\n\
             scrape_configs:\n\
             \x20 - job_name: sked-server\n\
             \x20   authorization:\n\
             \x20     credentials: {admin}\n\
             \x20   static_configs:\n\
             \x20     - targets: ['{server}']\n\
             \x20 - job_name: sked-worker\n\
             \x20   static_configs:\n\
             \x20     - targets: ['{worker_metrics}']\n",
            rules = Path::new(ALERT_RULES).canonicalize().unwrap().display(),
        ),
    )
    .unwrap();
    let web = free_addr();
    let mut prom = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={web}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("start prometheus");
    until_listening(web, "prometheus").await;

    // Each query, once Prometheus has scraped what the work left.
    let expect: &[(&str, f64)] = &[
        ("up{job='sked-server'}", 1.0),
        ("up{job='sked-worker'}", 1.0),
        ("sked_tasks{queue='idle',state='waiting'}", 5.0),
        ("sked_tasks_due{queue='idle'}", 4.0),
        ("sked_workers_alive", 1.0),
        (
            "sked_attempts_total{job='sked-worker',queue='mq',outcome='succeeded'}",
            3.0,
        ),
        (
            "sked_attempts_total{job='sked-worker',queue='mq',outcome='failed'}",
            2.0,
        ),
        (
            "sked_attempt_duration_seconds_count{job='sked-worker',queue='mq',outcome='succeeded'}",
            3.0,
        ),
        (
            "sked_task_lateness_seconds_count{job='sked-worker',queue='mq'}",
            5.0,
        ),
        ("sked_claim_batch_size_sum{job='sked-worker'}", 5.0),
        ("sked_worker_slots{job='sked-worker'}", 4.0),
        ("sked_worker_slots_busy{job='sked-worker'}", 0.0),
        ("sked_lease_renewal_failures_total{job='sked-worker'}", 0.0),
        ("sked_schedule_ticks_total{outcome='fired'}", 0.0),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for (query, want) in expect {
        loop {
            let got = query_one(web, query).await;
            if got == Some(*want) {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
                let (_, text, _) = get(&format!("http://{server}/metrics"), Some(&admin)).await;
                panic!(
                    "Prometheus answers {query} = {want}, got {got:?}\nserver's /metrics:\n{text}\nprometheus log:\n{log}"
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    // The oldest due task of `idle` has waited since it was submitted.
    let oldest = query_one(web, "sked_queue_oldest_due_seconds{queue='idle'}")
        .await
        .expect("the oldest due task's age");
    assert!(oldest > 0.0, "the oldest due task has waited: {oldest}");

    // The sample alert rules load and evaluate on these series without an error.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let rules = rule_health(web).await;
        if rules.len() == alert_rule_count() && rules.iter().all(|(_, health)| health == "ok") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "every sample alert rule evaluates: {rules:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let _ = prom.kill().await;
    let _ = worker.kill().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sample alert rules (`docs/operations.md`).
const ALERT_RULES: &str = "deploy/prometheus/sked-alerts.yml";
/// The sample Grafana dashboard.
const GRAFANA: &str = "deploy/grafana/sked.json";

fn alert_rule_count() -> usize {
    std::fs::read_to_string(ALERT_RULES)
        .unwrap()
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count()
}

/// (name, health) of every rule Prometheus has evaluated (health `unknown` before its first
/// evaluation, `err` when it failed).
async fn rule_health(web: SocketAddr) -> Vec<(String, String)> {
    let Ok(answer) = reqwest::get(format!("http://{web}/api/v1/rules")).await else {
        return vec![];
    };
    let answer: Value = answer.json().await.unwrap_or(Value::Null);
    let mut out = vec![];
    for group in answer["data"]["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            out.push((
                rule["name"].as_str().unwrap_or_default().to_owned(),
                format!(
                    "{}{}",
                    rule["health"].as_str().unwrap_or_default(),
                    rule["lastError"]
                        .as_str()
                        .filter(|e| !e.is_empty())
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                ),
            ));
        }
    }
    out
}

/// The value of an instant query that answers one series, or `None`.
async fn query_one(web: SocketAddr, query: &str) -> Option<f64> {
    let url = format!("http://{web}/api/v1/query");
    let answer: Value = reqwest::Client::new()
        .get(url)
        .query(&[("query", query)])
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    let result = answer["data"]["result"].as_array()?;
    if result.len() != 1 {
        return None;
    }
    result[0]["value"][1].as_str()?.parse().ok()
}

fn tempdir(what: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sked-{what}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_for_admins_and_name_at_most_the_cap_of_queues() {
    let db = TestDb::new().await;
    let admin = sked_db::token::create(&db.pool, "root", Role::Admin, "metrics")
        .await
        .unwrap();
    let alice = sked_db::token::create(&db.pool, "alice", Role::User, "metrics")
        .await
        .unwrap();
    let (_server, server) = start_server(&db, &["--metrics-max-queues", "2"]).await;
    let url = format!("http://{server}/metrics");

    let (status, body, _) = get(&url, None).await;
    assert_eq!(status, 401, "no token, no metrics: {body}");
    let (status, body, _) = get(&url, Some(&alice)).await;
    assert_eq!(
        status, 403,
        "a user token may not count every owner's tasks: {body}"
    );
    let error: Value = serde_json::from_str(&body).expect("a JSON error");
    assert_eq!(error["code"], "forbidden");

    // Five queues, each with its own number of tasks; owners choose queue names, so only the
    // two largest are named and the other three are added up.
    for (queue, n) in [("q1", 1), ("q2", 2), ("q3", 3), ("q4", 4), ("q5", 5)] {
        submit(&db.pool, queue, "true", n, 0.0).await;
    }
    let (status, text, content_type) = get(&url, Some(&admin)).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        content_type.as_deref(),
        Some(sked_db::metrics::CONTENT_TYPE)
    );
    let s = samples(&text);
    let waiting = |q: &str| s.get(&format!("sked_tasks{{queue=\"{q}\",state=\"waiting\"}}"));
    assert_eq!(waiting("q5"), Some(&5.0));
    assert_eq!(waiting("q4"), Some(&4.0));
    assert_eq!(waiting("_other"), Some(&6.0), "q1 + q2 + q3");
    for q in ["q1", "q2", "q3"] {
        assert_eq!(waiting(q), None, "{q} is added up, not named");
    }
    let queues: std::collections::HashSet<&str> = s
        .keys()
        .filter_map(|k| k.strip_prefix("sked_tasks{queue=\""))
        .filter_map(|k| k.split('"').next())
        .collect();
    assert_eq!(queues.len(), 3, "two queues and the others: {queues:?}");
    if let Some(promtool) = tool("promtool", "apt-get install prometheus") {
        check_with_promtool(&promtool, &text).await;
    }
}

/// `promtool check metrics` reads the text as Prometheus does and lints it.
async fn check_with_promtool(promtool: &Path, text: &str) {
    use tokio::io::AsyncWriteExt;
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics accepts the text:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn ticks(pool: &PgPool) -> HashMap<String, i64> {
    sqlx::query_as::<_, (String, i64)>("select outcome, ticks from sked.schedule_ticks")
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

#[tokio::test]
async fn schedule_ticks_are_counted_per_outcome_and_never_go_down() {
    let db = TestDb::new().await;
    // Every minute, overlap skip: the first tick fires, the next ones are skipped while its
    // occurrence waits (no worker).
    sqlx::query(
        "select sked.schedule_create(name => 'every-minute', cron => '* * * * *',
                                     overlap_policy => 'skip', task => '{\"kind\": \"noop\"}',
                                     history_limit => 3, p_now => '2026-06-01T10:00:30Z')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // Hourly with misfire skip, created long before it is next looked at: its missed ticks
    // count as missed.
    sqlx::query(
        "select sked.schedule_create(name => 'hourly', cron => '0 * * * *',
                                     misfire_policy => 'skip', task => '{\"kind\": \"noop\"}',
                                     p_now => '2026-06-01T05:30:00Z')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let fire = |at: String| {
        let pool = db.pool.clone();
        async move {
            sqlx::query("select sked.schedules_fire(p_now => $1::timestamptz)")
                .bind(at)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    for minute in 1..=5 {
        fire(format!("2026-06-01T10:{minute:02}:00Z")).await;
    }
    let counted = ticks(&db.pool).await;
    assert_eq!(counted["fired"], 1, "{counted:?}");
    assert_eq!(counted["skipped"], 4, "{counted:?}");
    // Hourly ticks 06:00 … 10:00 passed before it was first looked at (10:01).
    assert_eq!(counted["missed"], 5, "{counted:?}");

    // Firing the same instant again handles nothing new: no tick counts twice.
    fire("2026-06-01T10:05:00Z".to_owned()).await;
    assert_eq!(ticks(&db.pool).await, counted, "a tick counts once");

    // Runs are trimmed to the history limit; the counters stay.
    let deleted: i32 = sqlx::query_scalar("select sked.schedule_runs_prune()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(deleted > 0, "runs were trimmed");
    assert_eq!(
        ticks(&db.pool).await,
        counted,
        "the counters never go down when runs are trimmed"
    );
}

/// The families sked exports, as `# TYPE` lines name them, read from a scrape's text after
/// one observation of every family of the process.
fn exported_families() -> std::collections::HashSet<String> {
    let m = sked_db::metrics::metrics();
    m.attempt_ended("q", "succeeded", 0.1);
    m.task_lateness
        .get_or_create(&sked_db::metrics::QueueLabel { queue: "q".into() })
        .observe(0.1);
    m.claim_batch_size.observe(1.0);
    let scrape = sked_db::metrics::Scrape {
        queues: vec![sked_db::metrics::QueueGauges {
            queue: "q".into(),
            ..Default::default()
        }],
        workers_alive: 1,
        workers_registered: 1,
        schedule_ticks: vec![("fired".into(), 1)],
    };
    sked_db::metrics::encode(Some(&scrape))
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect()
}

/// The `sked_*` series a PromQL expression reads, each as the family exporting it.
fn families_read(expr: &str) -> Vec<String> {
    let re = regex::Regex::new(r"sked_[a-z_]+").unwrap();
    re.find_iter(expr)
        .map(|m| {
            let name = m.as_str();
            ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name)
                .to_owned()
        })
        .collect()
}

#[test]
fn the_sample_alert_rules_and_grafana_dashboard_read_only_what_sked_exports() {
    let exported = exported_families();
    let rules = std::fs::read_to_string(ALERT_RULES).unwrap();
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(GRAFANA).unwrap())
        .expect("the Grafana dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "a panel per family worth seeing");
    let mut exprs: Vec<String> = vec![];
    for panel in panels {
        for target in panel["targets"].as_array().expect("a panel has targets") {
            exprs.push(target["expr"].as_str().expect("a target's expr").to_owned());
        }
    }
    let mut unused = exported.clone();
    // (where, what it reads): each panel's query, and the rule file.
    let readers = exprs
        .iter()
        .map(|e| (e.as_str(), e.as_str()))
        .chain(std::iter::once((ALERT_RULES, rules.as_str())));
    for (place, text) in readers {
        for family in families_read(text) {
            assert!(
                exported.contains(&family),
                "{family} (read by {place}) is a family sked exports: {exported:?}"
            );
            unused.remove(&family);
        }
    }
    assert!(
        unused.is_empty(),
        "every family is on the dashboard or in a rule: {unused:?} is in neither"
    );
    let Some(promtool) = tool("promtool", "apt-get install prometheus") else {
        return;
    };
    let check = |path: &Path| {
        let out = std::process::Command::new(&promtool)
            .args(["check", "rules"])
            .arg(path)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool check rules {}:\n{}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    check(Path::new(ALERT_RULES));
    // The dashboard's queries are valid PromQL: as recording rules, with Grafana's interval
    // variable at a value.
    let dir = tempdir("grafana");
    let records: String = exprs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            format!(
                "      - record: sked:panel_{i}\n        expr: {}\n",
                serde_json::to_string(&e.replace("$__rate_interval", "5m")).unwrap()
            )
        })
        .collect();
    let file = dir.join("panels.yml");
    std::fs::write(
        &file,
        format!("groups:\n  - name: panels\n    rules:\n{records}"),
    )
    .unwrap();
    check(&file);
    let _ = std::fs::remove_dir_all(&dir);
}
