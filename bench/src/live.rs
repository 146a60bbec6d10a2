//! W15, live events at scale: a real `sked-server` process (its usual 16-connection pool,
//! and the live events' pool of their own).
//!
//! 1. **Memory per idle websocket**: the server's resident memory (`VmRSS`) with one client
//!    connected, then with `--w15-clients` more idle clients (authenticated, greeted, sent
//!    nothing), divided by their number; then again 13 s after they all left (the hub lets go
//!    of its registration 10 s after its last client), which says what the process keeps.
//! 2. **Live-event latency under load**: as many clients again, each reading what it gets,
//!    and one that times the events; a `sked-worker` draining; `--w15-rest-clients` HTTP
//!    clients asking for task searches and the overview back to back (more than the
//!    server's pool serves at once: requests wait for its connections); and
//!    `--w15-inserts-per-sec` single-row `INSERT`s a second by SQL for `--w15-secs` seconds.
//!    A task's latency is the moment the timing client first reads it in a `tasks` frame
//!    minus the moment its `INSERT` returned (committed).

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use sked_types::events::ServerEvent;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use uuid::Uuid;

use crate::config::Config;
use crate::pg::{self, BenchDb};
use crate::process::WorkerProcess;
use crate::report::{Sample, Target, percentile};

const W: &str = "W15";
/// Target of the resident memory one idle websocket costs the server, in KB.
const IDLE_KB_TARGET: f64 = 32.0;
/// Target of the 99th percentile of the live events' latency under load, in ms.
const P99_TARGET_MS: f64 = 250.0;
/// Clients connected at once while the idle ones are opened.
const CONNECT_AT_ONCE: usize = 50;
/// Worker slots of the draining worker.
const WORKER_CONCURRENCY: usize = 32;

type Ws = WebSocketStream<TcpStream>;

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    let server_bin = cfg.worker_bin.with_file_name("sked-server");
    if !server_bin.is_file() {
        bail!(
            "{} not found: build it with `cargo build --release --bin sked-server`",
            server_bin.display()
        );
    }
    pg::with_db(&cfg.database_url, "w15", async |db| {
        let token =
            sked_db::token::create(&db.pool, "bench", sked_db::token::Role::Admin, "w15").await?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut server = tokio::process::Command::new(&server_bin)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", &db.url)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", server_bin.display()))?;
        let pid = server.id().context("the server's pid")?;
        let result = measure(cfg, db, pid, port, &token).await;
        let _ = server.kill().await;
        result
    })
    .await
}

async fn measure(
    cfg: &Config,
    db: &BenchDb,
    pid: u32,
    port: u16,
    token: &str,
) -> Result<Vec<Sample>> {
    let base = format!("http://127.0.0.1:{port}/api/v1");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    wait_healthy(&http, &base).await?;
    let n = cfg.w15_clients;

    // 1. Memory per idle websocket. The first client opens the hub's gate and pool: those
    // are paid once, not per client.
    let first = connect(port, token).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_kb(pid)?;
    let idle = connect_many(port, token, n).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let with_idle = rss_kb(pid)?;
    let per_client = (with_idle - before) / n as f64;
    eprintln!(
        "  RSS {:.1} MB with one client, {:.1} MB with {n} more idle: {per_client:.1} KB each",
        before / 1024.0,
        with_idle / 1024.0
    );
    drop(idle);
    drop(first);
    tokio::time::sleep(Duration::from_secs(13)).await;
    let after_left = rss_kb(pid)?;
    eprintln!("  RSS {:.1} MB 13 s after they left", after_left / 1024.0);

    // 2. Latency under load.
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let resyncs = Arc::new(AtomicU64::new(0));
    let timer = {
        let mut ws = connect(port, token).await?;
        let (seen, resyncs, stop) = (seen.clone(), resyncs.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(Some(Ok(message))) =
                    tokio::time::timeout(Duration::from_millis(200), ws.next()).await
                else {
                    continue;
                };
                let Message::Text(text) = message else {
                    continue;
                };
                let now = Instant::now();
                match serde_json::from_str::<ServerEvent>(&text) {
                    Ok(ServerEvent::Tasks { tasks }) => {
                        let mut seen = seen.lock().expect("seen");
                        for task in tasks {
                            seen.entry(task.id).or_insert(now);
                        }
                    }
                    Ok(ServerEvent::Resync { .. }) => {
                        resyncs.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        })
    };
    let readers: Vec<_> = connect_many(port, token, n)
        .await?
        .into_iter()
        .map(|mut ws| {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(None | Some(Err(_))) =
                        tokio::time::timeout(Duration::from_millis(200), ws.next()).await
                    {
                        break;
                    }
                }
            })
        })
        .collect();
    let worker = WorkerProcess::spawn(&cfg.worker_bin, &db.url, WORKER_CONCURRENCY)?;
    let rest_done = Arc::new(AtomicU64::new(0));
    let rest_failed = Arc::new(AtomicU64::new(0));
    let rest: Vec<_> = (0..cfg.w15_rest_clients)
        .map(|i| {
            let (http, stop, done, failed) = (
                http.clone(),
                stop.clone(),
                rest_done.clone(),
                rest_failed.clone(),
            );
            let paths = [format!("{base}/tasks?q=c-{i}"), format!("{base}/overview")];
            let token = token.to_owned();
            tokio::spawn(async move {
                for path in paths.iter().cycle() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let ok = match http.get(path).bearer_auth(&token).send().await {
                        Ok(r) => r.status().is_success(),
                        Err(_) => false,
                    };
                    if ok { &done } else { &failed }.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // Let the load settle before timing anything.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let inserts = db.pool("w15-inserts", 32).await?;
    let committed: Arc<Mutex<Vec<(Uuid, Instant)>>> = Arc::default();
    let insert_failed = Arc::new(AtomicU64::new(0));
    let rest_before = rest_done.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(
        1.0 / cfg.w15_inserts_per_sec as f64,
    ));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut writes = Vec::new();
    while started.elapsed() < cfg.w15_duration {
        tick.tick().await;
        let (pool, committed, failed) = (inserts.clone(), committed.clone(), insert_failed.clone());
        writes.push(tokio::spawn(async move {
            let id: Result<Uuid, _> =
                sqlx::query_scalar("insert into sked.tasks (kind) values ('noop') returning id")
                    .fetch_one(&pool)
                    .await;
            match id {
                Ok(id) => committed
                    .lock()
                    .expect("committed")
                    .push((id, Instant::now())),
                Err(_) => {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for write in writes {
        let _ = write.await;
    }
    let load_secs = started.elapsed().as_secs_f64();
    let rest_rate = (rest_done.load(Ordering::Relaxed) - rest_before) as f64 / load_secs;
    // Stragglers.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for task in rest {
        let _ = task.await;
    }
    let _ = timer.await;
    for reader in readers {
        let _ = reader.await;
    }
    let worker_log = worker.stop().await?;
    if worker_log.errors > 0 {
        eprintln!("  the worker logged {} errors", worker_log.errors);
    }
    inserts.close().await;

    let committed = committed.lock().expect("committed").clone();
    let seen = seen.lock().expect("seen").clone();
    let mut ms: Vec<f64> = Vec::with_capacity(committed.len());
    let mut missing = 0usize;
    for (id, at) in &committed {
        match seen.get(id) {
            Some(seen) => ms.push(seen.saturating_duration_since(*at).as_secs_f64() * 1000.0),
            None => missing += 1,
        }
    }
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| percentile(&ms, p);
    eprintln!(
        "  {} inserts ({:.0}/s, {} failed), REST {rest_rate:.0} requests/s ({} failed), \
         latency p50 {:.1} ms p99 {:.1} ms, {missing} never seen, {} resyncs",
        committed.len(),
        committed.len() as f64 / load_secs,
        insert_failed.load(Ordering::Relaxed),
        rest_failed.load(Ordering::Relaxed),
        pct(0.5),
        pct(0.99),
        resyncs.load(Ordering::Relaxed),
    );
    Ok(vec![
        Sample::new(
            W,
            format!("RSS per idle websocket ({n} clients)"),
            "KB",
            per_client,
            Target::at_most(IDLE_KB_TARGET),
        ),
        Sample::new(
            W,
            "RSS kept 13 s after they left (over one client)",
            "MB",
            (after_left - before) / 1024.0,
            None,
        ),
        Sample::new(
            W,
            "SQL inserts under load",
            "tasks/s",
            committed.len() as f64 / load_secs,
            None,
        ),
        Sample::new(W, "REST requests under load", "requests/s", rest_rate, None),
        Sample::new(W, "live event latency under load p50", "ms", pct(0.5), None),
        Sample::new(W, "live event latency under load p90", "ms", pct(0.9), None),
        Sample::new(
            W,
            "live event latency under load p99",
            "ms",
            pct(0.99),
            Target::at_most(P99_TARGET_MS),
        ),
        Sample::new(W, "live event latency under load max", "ms", pct(1.0), None),
        Sample::new(
            W,
            "tasks never seen (a resync covers them)",
            "count",
            missing as f64,
            None,
        ),
        Sample::new(
            W,
            "resyncs",
            "count",
            resyncs.load(Ordering::Relaxed) as f64,
            None,
        ),
    ])
}

async fn wait_healthy(http: &reqwest::Client, base: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = http.get(format!("{base}/health")).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("sked-server did not answer {base}/health within 20 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A websocket client of the live events, authenticated by its header, that has read its
/// `hello`.
async fn connect(port: u16, token: &str) -> Result<Ws> {
    let mut request = format!("ws://127.0.0.1:{port}/api/v1/events").into_client_request()?;
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {token}").parse()?);
    let (mut ws, _) = tokio::time::timeout(Duration::from_secs(30), async {
        let stream = TcpStream::connect(("127.0.0.1", port)).await?;
        anyhow::Ok(tokio_tungstenite::client_async(request, stream).await?)
    })
    .await
    .context("connecting a websocket client: timed out")??;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let message = tokio::time::timeout_at(deadline, ws.next())
            .await
            .context("no hello within 30 s")?;
        match message {
            Some(Ok(Message::Text(text))) => {
                let event: ServerEvent = serde_json::from_str(&text)?;
                if matches!(event, ServerEvent::Hello { .. }) {
                    return Ok(ws);
                }
                bail!("expected hello first, got {text}");
            }
            Some(Ok(_)) => continue,
            other => bail!("the websocket ended before its hello: {other:?}"),
        }
    }
}

/// `n` clients, [`CONNECT_AT_ONCE`] at a time.
async fn connect_many(port: u16, token: &str, n: usize) -> Result<Vec<Ws>> {
    let mut clients = Vec::with_capacity(n);
    while clients.len() < n {
        let batch = CONNECT_AT_ONCE.min(n - clients.len());
        let connected = futures::future::join_all((0..batch).map(|_| connect(port, token))).await;
        for ws in connected {
            clients.push(ws?);
        }
    }
    Ok(clients)
}

/// `VmRSS` of process `pid`, in KB.
fn rss_kb(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))
}
