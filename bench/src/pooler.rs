//! W18, through a pooler: a PgBouncer in transaction mode in front of the benchmark's
//! PostgreSQL (`--w18-pool-size` server connections). First W2's drain direct and through
//! PgBouncer (the pooled worker with `SKED_DATABASE_POOLER=transaction` and the direct URL for
//! LISTEN), their rates and the pooled one against the direct one; then `--w18-workers`
//! worker processes of `--w18-slots` slots through the pooler without a listen URL (they
//! poll) drain `--w18-tasks` noop tasks queued once all of them registered: the rate, how many
//! workers ran tasks, the server connections on the database, the workers' RSS and what they
//! logged at WARN and ERROR level.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chrono::{DateTime, Utc};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::config::Config;
use crate::drain::{self, Drain};
use crate::pg::{self, BenchDb};
use crate::process::{LogSummary, WorkerProcess};
use crate::report::{Sample, Target};

const W: &str = "W18";

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    let bouncer = PgBouncer::start(cfg).await?;
    let result = measure(cfg, &bouncer).await;
    bouncer.stop().await;
    result
}

async fn measure(cfg: &Config, bouncer: &PgBouncer) -> Result<Vec<Sample>> {
    let mut samples = Vec::new();
    let direct = pg::with_db(&cfg.database_url, "w18", async |db| {
        drain::drain_in(cfg, db, &Drain::noops(W, cfg)).await
    })
    .await?;
    let pooled = pg::with_db(&cfg.database_url, "w18", async |db| {
        let mut d = Drain::noops(W, cfg);
        bouncer.route(&mut d, &db.url)?;
        drain::drain_in(cfg, db, &d).await
    })
    .await?;
    let (direct_rate, pooled_rate) = (direct.rate, pooled.rate);
    eprintln!(
        "  W18: W2 direct {direct_rate:.0} tasks/s, through PgBouncer {pooled_rate:.0} tasks/s"
    );
    for (what, drained) in [("direct", direct), ("pooled", pooled)] {
        for mut s in drained.samples {
            s.metric = format!("W2 {what}: {}", s.metric);
            samples.push(s);
        }
    }
    samples.push(Sample::new(
        W,
        format!(
            "W2 through PgBouncer ({} server connections) against direct",
            cfg.w18_pool_size
        ),
        "%",
        100.0 * pooled_rate / direct_rate,
        Target::at_least(80.0),
    ));
    match pg::with_db(&cfg.database_url, "w18", async |db| {
        many_workers(cfg, bouncer, db).await
    })
    .await
    {
        Ok(many) => samples.extend(many),
        Err(e) => {
            // The error is reported; so are the drains measured before it.
            for s in &samples {
                eprintln!(
                    "  {:<60} {}",
                    s.metric,
                    crate::report::format_value(s.value, s.unit)
                );
            }
            return Err(e.context(format!("{} polling workers", cfg.w18_workers)));
        }
    }
    Ok(samples)
}

/// `--w18-workers` polling workers through the pooler drain `--w18-tasks` noop tasks.
async fn many_workers(cfg: &Config, bouncer: &PgBouncer, db: &BenchDb) -> Result<Vec<Sample>> {
    let n = cfg.w18_workers;
    let url = bouncer.url(&db.url)?;
    let env = [("SKED_DATABASE_POOLER".to_owned(), "transaction".to_owned())];
    let mut workers = Vec::new();
    let result = async {
        let started = Instant::now();
        for _ in 0..n {
            workers.push(WorkerProcess::spawn_env(
                &cfg.worker_bin,
                &url,
                cfg.w18_slots,
                &[],
                &env,
            )?);
        }
        for w in workers.iter_mut() {
            w.wait_registered(&db.pool, Duration::from_secs(120))
                .await?;
        }
        eprintln!(
            "  W18: {n} workers registered through the pooler in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let since: DateTime<Utc> = sqlx::query_scalar("select now()")
            .fetch_one(&db.pool)
            .await?;
        pg::queue_noops(&db.pool, cfg.w18_tasks).await?;
        let started = Instant::now();
        let mut most_conns = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            for w in workers.iter_mut() {
                w.check_alive()?;
            }
            most_conns = most_conns.max(server_connections(db).await?);
            if pg::all_finished(&db.pool).await? {
                break;
            }
            if started.elapsed() > cfg.timeout {
                bail!(
                    "W18: tasks still unfinished after {:?} (see --timeout-secs)",
                    cfg.timeout
                );
            }
        }
        let wall = started.elapsed().as_secs_f64();
        let mut rss = Vec::new();
        for w in &workers {
            rss.push(w.memory_mb("VmRSS")?);
        }
        rss.sort_by(f64::total_cmp);
        Ok((since, wall, most_conns, rss))
    }
    .await;
    let stopped = futures::future::join_all(workers.into_iter().map(|w| w.stop())).await;
    let (since, wall, most_conns, rss) = result?;
    let mut summary = LogSummary::default();
    for log in stopped {
        let log = log?;
        summary.warnings += log.warnings;
        summary.errors += log.errors;
        summary.path = summary.path.or(log.path);
        summary.first = summary.first.or(log.first);
    }
    let outcome = pg::outcome_since(&db.pool, Some(since)).await?;
    let ran: i64 = sqlx::query_scalar(
        "select count(distinct worker_id) from sked.tasks
          where created_at >= $1 and worker_id is not null",
    )
    .bind(since)
    .fetch_one(&db.pool)
    .await?;
    eprintln!(
        "  W18: {n} workers: {:.0} tasks/s, {ran} ran tasks, at most {most_conns} server \
         connections, RSS {:.1} / {:.1} / {:.1} MB (min / median / max)",
        cfg.w18_tasks as f64 / wall,
        rss[0],
        rss[rss.len() / 2],
        rss[rss.len() - 1]
    );
    let twice = outcome.total - outcome.first_attempt;
    let head = format!(
        "{n} polling workers × {} slots through {} server connections",
        cfg.w18_slots, cfg.w18_pool_size
    );
    let mut out = vec![
        Sample::new(
            W,
            format!("{head}: drain {} noop tasks (wall)", cfg.w18_tasks),
            "tasks/s",
            cfg.w18_tasks as f64 / wall,
            None,
        ),
        Sample::new(
            W,
            "many workers: workers that ran tasks",
            "workers",
            ran as f64,
            None,
        ),
        Sample::new(
            W,
            "many workers: server connections on the database (most seen, without the bench's)",
            "conns",
            most_conns as f64,
            Target::at_most(cfg.w18_pool_size as f64),
        ),
        Sample::new(W, "many workers: RSS (VmRSS), least", "MB", rss[0], None),
        Sample::new(
            W,
            "many workers: RSS (VmRSS), median",
            "MB",
            rss[rss.len() / 2],
            None,
        ),
        Sample::new(
            W,
            "many workers: RSS (VmRSS), most",
            "MB",
            rss[rss.len() - 1],
            None,
        ),
        Sample::new(
            W,
            "many workers: tasks run more than once (attempt > 1)",
            "tasks",
            twice as f64,
            Target::at_most(0.0),
        ),
    ];
    for mut s in summary.samples(W) {
        s.metric = format!("many workers: {}", s.metric);
        s.target = Target::at_most(0.0);
        out.push(s);
    }
    // A task run twice is a sample that misses its target; a task lost or failed is an error.
    let expected = cfg.w18_tasks as i64;
    if outcome.total != expected || outcome.succeeded != expected {
        bail!(
            "correctness check failed: expected {expected} tasks all succeeded, found {} \
             tasks, {} succeeded",
            outcome.total,
            outcome.succeeded
        );
    }
    Ok(out)
}

/// Client backends connected to the benchmark database, but for the benchmark's own pool.
async fn server_connections(db: &BenchDb) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "select count(*) from pg_stat_activity
          where datname = current_database() and backend_type = 'client backend'
            and application_name is distinct from 'sked-bench'",
    )
    .fetch_one(&db.pool)
    .await?)
}

/// A PgBouncer in transaction mode in front of `--database-url`'s server, on a free port.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    pub async fn start(cfg: &Config) -> Result<PgBouncer> {
        let program = find_on_path("pgbouncer").context(
            "W18 and W17 with --w17-pooler need pgbouncer on PATH (apt-get install pgbouncer, or your system's package)",
        )?;
        let admin =
            PgConnectOptions::from_str(&cfg.database_url).context("parsing the database URL")?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(format!(
            "sked-bench-pgbouncer-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir)?;
        let user = admin.get_username();
        std::fs::write(dir.join("userlist.txt"), format!("\"{user}\" \"\"\n"))?;
        // Each worker's pool holds up to 18 client connections: room for all of them and the
        // drains', so that a worker's pool never waits on PgBouncer refusing a client.
        let max_client_conn = cfg.w18_workers * 20 + 1_000;
        let host = admin.get_host();
        let host = if host.starts_with('/') {
            "127.0.0.1"
        } else {
            host
        };
        std::fs::write(
            dir.join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host={host} port={pg_port}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {auth}\npool_mode = transaction\n\
                 default_pool_size = {pool}\nmax_client_conn = {max_client_conn}\n\
                 server_reset_query =\nlogfile = {log}\n",
                pg_port = admin.get_port(),
                auth = dir.join("userlist.txt").display(),
                pool = cfg.w18_pool_size,
                log = dir.join("pgbouncer.log").display(),
            ),
        )?;
        // PgBouncer refuses to run as root: as root, it runs as the `postgres` user.
        // SAFETY: geteuid has no preconditions.
        let mut command = if unsafe { libc::geteuid() } == 0 {
            // It writes its log in the directory.
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&dir)
                .status()?;
            if !status.success() {
                bail!("chown -R postgres {}: {status}", dir.display());
            }
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let need = max_client_conn as u64 + cfg.w18_pool_size as u64 + 100;
        // SAFETY: only async-signal-safe calls (getrlimit, setrlimit) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                let mut l = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < need {
                    l.rlim_cur = need.min(l.rlim_max);
                    libc::setrlimit(libc::RLIMIT_NOFILE, &l);
                }
                Ok(())
            });
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        let mut bouncer = PgBouncer { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if let Some(status) = bouncer.child.try_wait()? {
                let log =
                    std::fs::read_to_string(bouncer.dir.join("pgbouncer.log")).unwrap_or_default();
                bail!("pgbouncer exited with {status}:\n{log}");
            }
            if Instant::now() > deadline {
                bail!("pgbouncer does not listen on port {port} after 10 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!(
            "  PgBouncer on 127.0.0.1:{port}, transaction mode, default_pool_size {}",
            cfg.w18_pool_size
        );
        Ok(bouncer)
    }

    /// `url` (a database of the benchmark's server) with PgBouncer's address instead.
    fn url(&self, url: &str) -> Result<String> {
        let options = PgConnectOptions::from_str(url)?
            .host("127.0.0.1")
            .port(self.port);
        Ok(options.to_url_lossy().to_string())
    }

    /// The DATABASE_URL and the environment of a worker of the database `url` through this
    /// pooler, with `url` for LISTEN.
    pub fn worker_route(&self, url: &str) -> Result<(String, Vec<(String, String)>)> {
        let env = vec![
            ("SKED_DATABASE_POOLER".into(), "transaction".into()),
            ("SKED_LISTEN_DATABASE_URL".into(), url.to_owned()),
        ];
        Ok((self.url(url)?, env))
    }

    /// Sends the workers of `d` (on the database `url`) through this pooler.
    pub fn route(&self, d: &mut Drain, url: &str) -> Result<()> {
        let (pooled, env) = self.worker_route(url)?;
        (d.worker_url, d.worker_env) = (Some(pooled), env);
        Ok(())
    }

    /// SIGTERM (runuser passes it on), then waits up to 5 s before SIGKILL.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on the pid of our own child, not reaped yet.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
                .await
                .is_err()
            {
                self.child.kill().await.ok();
            }
        }
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: as in `stop`.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        }
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| is_executable(p))
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
