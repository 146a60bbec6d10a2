//! W9, the dashboard's commit→DOM latency: a real `sked-server` process (with the embedded
//! dashboard), a headless Chromium showing the task list, and `--w9-changes` state changes
//! (default 200) committed by SQL: tasks inserted (`waiting`) and cancelled (`cancelled`),
//! one change every 100–300 ms. A MutationObserver in the page stamps the moment each row
//! shows each state (`Date.now()`, the same clock as this process); a change's latency is that
//! moment minus the moment its transaction committed here. Needs `chromium` and `chromedriver`
//! on the PATH (or `SKED_CHROMIUM` and `SKED_CHROMEDRIVER`) and a built dashboard
//! (`cargo xtask web` before building the server).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use fantoccini::{ClientBuilder, Locator};
use rand::Rng;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::config::Config;
use crate::pg;
use crate::report::{Sample, Target};

const W: &str = "W9";
const P99_TARGET_MS: f64 = 1000.0;

/// Stamps `window.__seen["<id> <state>"]` the first time a row shows a state.
const OBSERVER: &str = r#"
window.__seen = {};
const stamp = () => {
  const now = Date.now();
  for (const row of document.querySelectorAll('tr[data-task-id]')) {
    const key = row.dataset.taskId + ' ' + row.dataset.state;
    if (!(key in window.__seen)) window.__seen[key] = now;
  }
};
new MutationObserver(stamp).observe(document.body,
  { subtree: true, childList: true, attributes: true, attributeFilter: ['data-state'] });
stamp();
return true;
"#;

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    let server_bin = cfg.worker_bin.with_file_name("sked-server");
    if !server_bin.is_file() {
        bail!(
            "{} not found: build it with `cargo xtask web && cargo build --release --bin sked-server`",
            server_bin.display()
        );
    }
    let chromium = tool(
        "SKED_CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
    )?;
    let driver_bin = tool("SKED_CHROMEDRIVER", &["chromedriver"])?;
    pg::with_db(&cfg.database_url, "w9", async |db| {
        let token =
            sked_db::token::create(&db.pool, "bench", sked_db::token::Role::Admin, "w9").await?;
        let port = free_port()?;
        let mut server = tokio::process::Command::new(&server_bin)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", &db.url)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", server_bin.display()))?;
        let driver_port = free_port()?;
        let mut driver = tokio::process::Command::new(&driver_bin)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", driver_bin.display()))?;
        let profile =
            std::env::temp_dir().join(format!("sked-bench-chromium-{}", Uuid::new_v4().simple()));
        let result = measure(
            cfg,
            &db.pool,
            port,
            driver_port,
            &chromium,
            &profile,
            &token,
        )
        .await;
        let _ = driver.kill().await;
        let _ = server.kill().await;
        let _ = std::fs::remove_dir_all(&profile);
        result
    })
    .await
}

async fn measure(
    cfg: &Config,
    pool: &sqlx::PgPool,
    port: u16,
    driver_port: u16,
    chromium: &Path,
    profile: &Path,
    token: &str,
) -> Result<Vec<Sample>> {
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--no-first-run",
                     format!("--user-data-dir={}", profile.display()), "--window-size=1280,900"],
        },
    });
    let Value::Object(caps) = caps else {
        unreachable!()
    };
    let webdriver = format!("http://127.0.0.1:{driver_port}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let client = loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(caps.clone())
            .connect(&webdriver)
            .await
        {
            Ok(c) => break c,
            Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => bail!("connecting to chromedriver: {e}"),
        }
    };
    let outcome = async {
        client.goto(&format!("http://127.0.0.1:{port}/tasks#token={token}")).await?;
        wait_for(&client, "[data-live=live]").await?;
        // The list has loaded (an empty one says so) once nothing is marked loading.
        wait_for(&client, "main.page").await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while client
            .find(Locator::Css("main.page .loading"))
            .await
            .is_ok()
        {
            if tokio::time::Instant::now() > deadline {
                bail!("the task list kept loading");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        client.execute(OBSERVER, vec![]).await?;

        // (id, state, commit time in ms since the epoch)
        let mut changes: Vec<(Uuid, &str, f64)> = Vec::with_capacity(cfg.w9_changes);
        let mut pending: Option<Uuid> = None;
        while changes.len() < cfg.w9_changes {
            let pause = rand::rng().random_range(100..=300);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            match pending.take() {
                None => {
                    let id: Uuid = sqlx::query_scalar(
                        "insert into sked.tasks (command, queue) values (array['true'], 'w9') returning id",
                    )
                    .fetch_one(pool)
                    .await?;
                    changes.push((id, "waiting", now_ms()));
                    pending = Some(id);
                }
                Some(id) => {
                    sqlx::query("select sked.task_cancel($1)").bind(id).execute(pool).await?;
                    changes.push((id, "cancelled", now_ms()));
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let seen = client.execute("return window.__seen;", vec![]).await?;
        Ok::<_, anyhow::Error>((changes, seen))
    }
    .await;
    let _ = client.close().await;
    let (changes, seen) = outcome?;

    let mut latencies: Vec<f64> = Vec::new();
    let mut missing = 0usize;
    for (id, state, committed) in &changes {
        match seen.get(format!("{id} {state}")).and_then(Value::as_f64) {
            Some(shown) => latencies.push((shown - committed).max(0.0)),
            None => missing += 1,
        }
    }
    if latencies.is_empty() {
        bail!("the page showed none of the {} changes", changes.len());
    }
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize];
    Ok(vec![
        Sample::new(
            W,
            "state changes committed",
            "count",
            changes.len() as f64,
            None,
        ),
        Sample::new(
            W,
            "changes never shown",
            "count",
            missing as f64,
            Target::at_most(0.0),
        ),
        Sample::new(W, "commit→DOM p50", "ms", pct(0.50), None),
        Sample::new(W, "commit→DOM p90", "ms", pct(0.90), None),
        Sample::new(
            W,
            "commit→DOM p99",
            "ms",
            pct(0.99),
            Target::at_most(P99_TARGET_MS),
        ),
        Sample::new(W, "commit→DOM max", "ms", pct(1.0), None),
    ])
}

async fn wait_for(client: &fantoccini::Client, css: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while client.find(Locator::Css(css)).await.is_err() {
        if tokio::time::Instant::now() > deadline {
            bail!("the dashboard never showed {css:?} (is the dashboard built into sked-server?)");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn now_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

fn tool(var: &str, names: &[&str]) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
        .with_context(|| format!("W9 needs {} (set {var} or put it on the PATH)", names[0]))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
