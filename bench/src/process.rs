//! The real `sked-worker` process under test, and what /proc tells about it and about
//! PostgreSQL: resident memory, CPU time, machine load.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use sqlx::PgPool;
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// Fails with the build command when the worker binary is missing.
pub fn check_worker_bin(path: &Path) -> Result<()> {
    if !path.is_file() {
        bail!(
            "the worker binary {} does not exist; build it with \
             `cargo build --release --bin sked-worker` (or pass --worker-bin PATH)",
            path.display()
        );
    }
    Ok(())
}

/// A running `sked-worker` on one database. Stop it with [`WorkerProcess::stop`]; dropping it
/// instead kills it with SIGKILL.
pub struct WorkerProcess {
    child: Child,
    pid: u32,
    work_dir: PathBuf,
    log: PathBuf,
}

/// What the worker logged at WARN and ERROR level while it ran.
#[derive(Debug, Default)]
pub struct LogSummary {
    pub warnings: usize,
    pub errors: usize,
    /// The log file, kept when it holds warnings or errors.
    pub path: Option<PathBuf>,
    /// The first warning or error line.
    pub first: Option<String>,
}

impl WorkerProcess {
    /// Starts `bin` on `db_url` with `concurrency` slots. The worker logs warnings and errors
    /// to a file next to its scratch directory, both private to this run.
    pub fn spawn(bin: &Path, db_url: &str, concurrency: usize) -> Result<WorkerProcess> {
        Self::spawn_with(bin, db_url, concurrency, &[])
    }

    /// [`WorkerProcess::spawn`] with more flags.
    pub fn spawn_with(
        bin: &Path,
        db_url: &str,
        concurrency: usize,
        flags: &[&str],
    ) -> Result<WorkerProcess> {
        Self::spawn_env(bin, db_url, concurrency, flags, &[])
    }

    /// [`WorkerProcess::spawn_with`] with more environment variables (a pooler's settings).
    pub fn spawn_env(
        bin: &Path,
        db_url: &str,
        concurrency: usize,
        flags: &[&str],
        env: &[(String, String)],
    ) -> Result<WorkerProcess> {
        check_worker_bin(bin)?;
        let work_dir = std::env::temp_dir().join(format!(
            "sked-bench-worker-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        let log = work_dir.with_extension("log");
        let log_file = std::fs::File::create(&log)
            .with_context(|| format!("creating the worker log {}", log.display()))?;
        let child = Command::new(bin)
            .arg("--concurrency")
            .arg(concurrency.to_string())
            .arg("--work-dir")
            .arg(&work_dir)
            .arg("--shutdown-grace-secs")
            .arg("10")
            .args(flags)
            .env("DATABASE_URL", db_url)
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("the worker exited at once")?;
        Ok(WorkerProcess {
            child,
            pid,
            work_dir,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Fails when the worker has exited (it should run until it is stopped).
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("the worker exited early with {status}");
        }
        Ok(())
    }

    /// Waits until the worker has registered in sked.workers.
    pub async fn wait_registered(&mut self, pool: &PgPool, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let found: bool =
                sqlx::query_scalar("select exists (select 1 from sked.workers where pid = $1)")
                    .bind(self.pid as i32)
                    .fetch_one(pool)
                    .await?;
            if found {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the worker did not register within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A field of /proc/<pid>/status in MB (`VmRSS`, `VmHWM`).
    pub fn memory_mb(&self, field: &str) -> Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .with_context(|| format!("no {field} in /proc/{}/status", self.pid))?;
        Ok(kb / 1024.0)
    }

    /// SIGTERM, then waits for a graceful exit (SIGKILL after 30 s); returns a summary of
    /// the worker's log.
    pub async fn stop(mut self) -> Result<LogSummary> {
        let result = async {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
            }
            match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
                Ok(status) => {
                    let status = status?;
                    if !status.success() {
                        bail!("the worker exited with {status} after SIGTERM");
                    }
                    Ok(())
                }
                Err(_) => {
                    self.child.kill().await.ok();
                    bail!("the worker did not exit within 30 s of SIGTERM; killed it")
                }
            }
        }
        .await;
        std::fs::remove_dir_all(&self.work_dir).ok();
        let summary = summarize_log(&self.log);
        if summary.path.is_none() {
            std::fs::remove_file(&self.log).ok();
        }
        result.map(|()| summary)
    }
}

fn summarize_log(path: &Path) -> LogSummary {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut s = LogSummary::default();
    for line in text.lines() {
        let warn = line.contains(" WARN ");
        let error = line.contains(" ERROR ");
        s.warnings += usize::from(warn);
        s.errors += usize::from(error);
        if (warn || error) && s.first.is_none() {
            s.first = Some(line.to_owned());
        }
    }
    if s.warnings + s.errors > 0 {
        s.path = Some(path.to_owned());
    }
    s
}

impl LogSummary {
    /// Info samples of the warning and error counts; mentions the log on stderr.
    pub fn samples(&self, workload: &'static str) -> Vec<crate::report::Sample> {
        if let (Some(path), Some(first)) = (&self.path, &self.first) {
            eprintln!(
                "  {workload}: the worker logged {} warnings and {} errors ({}); the first:\n    {first}",
                self.warnings,
                self.errors,
                path.display()
            );
        }
        vec![
            crate::report::Sample::new(
                workload,
                "worker log: WARN lines",
                "lines",
                self.warnings as f64,
                None,
            ),
            crate::report::Sample::new(
                workload,
                "worker log: ERROR lines",
                "lines",
                self.errors as f64,
                None,
            ),
        ]
    }
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// User plus system CPU seconds of a process, or `None` when it is gone.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start with the state (field 3);
    // utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

/// CPU seconds of PostgreSQL processes: (backends of database `db`, all of them), by pid.
fn postgres_cpu(db: &str) -> Vec<(u32, bool, f64)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "postgres" {
            continue;
        }
        // A backend's title is "postgres: [<cluster>:] <user> <database> <client> <activity>".
        let title = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let title = String::from_utf8_lossy(&title);
        let ours = title.split_whitespace().any(|t| t == db);
        if let Some(cpu) = cpu_secs(pid) {
            out.push((pid, ours, cpu));
        }
    }
    out
}

/// Machine-wide (busy, total) CPU seconds from /proc/stat.
fn machine_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return (0.0, 0.0);
    };
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: f64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
    ((total - idle) / clock_ticks(), total / clock_ticks())
}

/// CPU counters at one moment; subtract two to see where the time went in between.
pub struct CpuSnapshot {
    at: Instant,
    worker: f64,
    postgres: Vec<(u32, bool, f64)>,
    machine_busy: f64,
}

/// CPU used between two snapshots, in seconds (and average busy cores of the machine).
#[derive(Debug)]
pub struct CpuUse {
    pub worker_secs: f64,
    /// Backends connected to the benchmark database (the worker's, the bench's probe).
    pub postgres_db_secs: f64,
    /// Every PostgreSQL process (also the WAL writer, checkpointer, autovacuum, other
    /// databases' backends).
    pub postgres_all_secs: f64,
    pub machine_busy_cores: f64,
}

/// CPU counters from a start until [`CpuWatch::finish`], with the PostgreSQL processes
/// looked at again every second meanwhile ([`CpuWatch::sight`]): a backend that exits before
/// the end (a pool closing a connection that sat idle) still counts, up to its last sighting.
pub struct CpuWatch {
    start: CpuSnapshot,
    worker_pid: u32,
    db: String,
    /// The last sighting of each PostgreSQL process.
    seen: Vec<(u32, bool, f64)>,
    sighted: Instant,
}

impl CpuWatch {
    pub fn start(worker_pid: u32, db: &str) -> CpuWatch {
        let start = CpuSnapshot::take(worker_pid, db);
        CpuWatch {
            seen: start.postgres.clone(),
            sighted: start.at,
            start,
            worker_pid,
            db: db.to_owned(),
        }
    }

    /// Reads the PostgreSQL processes' CPU again when the last sighting is a second old.
    pub fn sight(&mut self) {
        if self.sighted.elapsed() < Duration::from_secs(1) {
            return;
        }
        for p in postgres_cpu(&self.db) {
            match self.seen.iter_mut().find(|s| s.0 == p.0) {
                Some(s) => *s = p,
                None => self.seen.push(p),
            }
        }
        self.sighted = Instant::now();
    }

    /// The use from the start until now.
    pub fn finish(self) -> CpuUse {
        let mut now = CpuSnapshot::take(self.worker_pid, &self.db);
        for p in self.seen {
            if !now.postgres.iter().any(|q| q.0 == p.0) {
                now.postgres.push(p);
            }
        }
        self.start.until(&now)
    }
}

impl CpuSnapshot {
    pub fn take(worker_pid: u32, db: &str) -> CpuSnapshot {
        CpuSnapshot {
            at: Instant::now(),
            worker: cpu_secs(worker_pid).unwrap_or(0.0),
            postgres: postgres_cpu(db),
            machine_busy: machine_cpu().0,
        }
    }

    /// The use from `self` (earlier) to `later`. A process that started in between counts
    /// in full; one that exited in between is missing (see [`CpuWatch`]).
    pub fn until(&self, later: &CpuSnapshot) -> CpuUse {
        let (mut db, mut all) = (0.0, 0.0);
        for (pid, ours, cpu) in &later.postgres {
            let before = self
                .postgres
                .iter()
                .find(|p| p.0 == *pid)
                .map_or(0.0, |p| p.2);
            let d = (cpu - before).max(0.0);
            all += d;
            if *ours {
                db += d;
            }
        }
        let secs = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        CpuUse {
            worker_secs: later.worker - self.worker,
            postgres_db_secs: db,
            postgres_all_secs: all,
            machine_busy_cores: (later.machine_busy - self.machine_busy) / secs,
        }
    }
}
