//! Running sked's long-lived processes: the API server, the worker, and `sked dev` (both in one
//! process, with a private PostgreSQL when no `DATABASE_URL` is given). Shared by the `sked`,
//! `sked-server` and `sked-worker` binaries, whose `main` parses flags and calls in here.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

use sked_db::token::{self, Role};
use sked_db::{DbError, GroupRole};
use sked_server::ServerArgs;
use sked_worker::{WorkerArgs, WorkerConfig, WorkerError};
use sqlx::PgPool;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::embedded_pg::{Cluster, PgBinaries, PgError};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Config(String),
    #[error("{context}")]
    Db {
        context: &'static str,
        #[source]
        source: DbError,
    },
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the worker stopped")]
    Worker(#[source] WorkerError),
    #[error("the private PostgreSQL cluster")]
    Postgres(#[source] PgError),
    #[error("the {0} task panicked")]
    Panicked(&'static str),
}

fn db(context: &'static str) -> impl FnOnce(DbError) -> RunError {
    move |source| RunError::Db { context, source }
}

/// `DATABASE_URL`, required.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL of the sked database.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    #[command(flatten)]
    pub pooling: PoolingArgs,
}

/// What the database URL leads to (see docs/scaling.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Pooler {
    /// PostgreSQL itself, or a pooler in session mode.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer's `pool_mode = transaction`).
    Transaction,
}

/// How sked reaches PostgreSQL through a connection pooler.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PoolingArgs {
    /// What the database URL leads to: `none` (PostgreSQL, or a session-mode pooler) or
    /// `transaction` (a transaction-mode pooler such as PgBouncer with pool_mode = transaction).
    #[arg(long, env = "SKED_DATABASE_POOLER", value_enum, default_value_t = Pooler::None)]
    pub database_pooler: Pooler,
    /// A direct URL of the same database (not through the pooler), for LISTEN and for what
    /// needs a session (migrations, the search index). Required by the server and `sked dev`
    /// with --database-pooler transaction; a worker without it polls instead of listening.
    #[arg(long, env = "SKED_LISTEN_DATABASE_URL", hide_env_values = true)]
    pub listen_database_url: Option<String>,
}

impl PoolingArgs {
    /// Sets how this process reaches PostgreSQL ([`sked_db::pooler::configure`]); `listens`:
    /// whether it needs `LISTEN` (a long-lived process), which a transaction-mode pooler
    /// cannot carry, so the direct URL is then required.
    pub fn configure(&self, listens: bool) -> Result<(), RunError> {
        sked_db::pooler::configure(sked_db::pooler::Pooling {
            transaction: self.database_pooler == Pooler::Transaction,
            listen_url: self.listen_database_url.clone(),
        })
        .map_err(|e| RunError::Config(e.to_string()))?;
        if listens {
            sked_db::pooler::require_session("LISTEN (the worker's wake-ups, live events, awaits)")
                .map_err(|e| RunError::Config(e.to_string()))?;
        }
        Ok(())
    }
}

/// Flags of `sked server` and `sked-server`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerCommand {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// Flags of `sked worker` and `sked-worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerCommand {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub worker: WorkerArgs,
    /// Serve this worker's Prometheus metrics on http://ADDR/metrics (no token: bind it to an
    /// address only your monitoring reaches; see docs/operations.md).
    #[arg(long, env = "SKED_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

/// Flags of `sked dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevCommand {
    /// Use this PostgreSQL instead of a private cluster (it is migrated on start).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    #[command(flatten)]
    pub pooling: PoolingArgs,
    /// Data directory of the private PostgreSQL cluster (used when DATABASE_URL is unset).
    #[arg(long, default_value = ".sked/postgres")]
    pub data_dir: PathBuf,
    /// Folder of the PostgreSQL server binaries (default: found on PATH or in the usual places).
    #[arg(long, env = "SKED_PG_BIN")]
    pub pg_bin: Option<PathBuf>,
    #[command(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    pub worker: WorkerArgs,
}

/// A token cancelled by the first SIGINT or SIGTERM; a second one exits at once.
pub fn shutdown_on_signal() -> Result<CancellationToken, RunError> {
    let io = |source| RunError::Io {
        context: "installing the signal handlers".into(),
        source,
    };
    let mut term = signal(SignalKind::terminate()).map_err(io)?;
    let mut int = signal(SignalKind::interrupt()).map_err(io)?;
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => info!("SIGTERM received, shutting down"),
            _ = int.recv() => info!("SIGINT received, shutting down"),
        }
        cancel.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        eprintln!("second signal received: exiting without a clean shutdown");
        std::process::exit(130);
    });
    Ok(token)
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, RunError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Io {
            context: format!("listening on {addr} (choose another address with --listen)"),
            source,
        })
}

/// Where `sked dev` keeps its task directories and artifact cache, under the current
/// directory, next to its PostgreSQL cluster in `.sked/postgres`.
pub const DEV_WORK_DIR: &str = ".sked/work";

/// How many ports after a busy one `sked dev` tries.
const DEV_PORT_TRIES: u16 = 20;

/// `sked dev`'s listener: `addr`, else the first free one of the next [`DEV_PORT_TRIES`]
/// ports, so that two users (or two projects) can run `sked dev` on one host.
async fn bind_dev(addr: SocketAddr) -> Result<tokio::net::TcpListener, RunError> {
    let first = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => return Ok(listener),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && addr.port() != 0 => e,
        Err(source) => {
            return Err(RunError::Io {
                context: format!("listening on {addr} (choose another address with --listen)"),
                source,
            });
        }
    };
    for step in 1..=DEV_PORT_TRIES {
        let Some(port) = addr.port().checked_add(step) else {
            break;
        };
        let next = SocketAddr::new(addr.ip(), port);
        if let Ok(listener) = tokio::net::TcpListener::bind(next).await {
            return Ok(listener);
        }
    }
    Err(RunError::Io {
        context: format!(
            "listening on {addr}: it and the next {DEV_PORT_TRIES} ports are busy \
             (choose another address with --listen)"
        ),
        source: first,
    })
}

/// A pool whose connections act as `role` when the login role may (see
/// [`sked_db::connect_as`]): servers and workers hold only their part's rights by default.
async fn connect_as(url: &str, app: &str, max: u32, role: GroupRole) -> Result<PgPool, RunError> {
    let (pool, narrowed) = sked_db::connect_as(url, app, max, role)
        .await
        .map_err(db("connecting to the database"))?;
    if narrowed {
        info!(role = role.name(), "acting as the database role");
    } else if sked_db::pooler::transaction_mode() {
        info!(
            role = role.name(),
            "behind a transaction-mode pooler: running with the login's own rights (give this process a login of the database role; see docs/security.md)"
        );
    } else {
        warn!(
            role = role.name(),
            "the login role is not a member of the database role: running with the login's own rights (see docs/security.md)"
        );
    }
    Ok(pool)
}

/// A worker's connections: 10 for itself (its two LISTEN connections, for wake-ups and for
/// the firing duty, and its loops that use the database at once: the claim, the completer,
/// lease renewals, cancel checks, the log writer and the upkeep duties, which overlap now and
/// then), and one more for every 8 slots up to 64, for what tasks ask of it themselves
/// (artifacts, services' copies, webhook targets), which waits for one otherwise.
/// The pool hands its idle connections out in turn, so every connection it ever opened stays
/// open and prepares each statement once more: a pool larger than the worker uses costs the
/// database backends and statements for nothing.
fn worker_pool_size(config: &WorkerConfig) -> u32 {
    10 + u32::try_from(config.concurrency.min(64) / 8).unwrap_or(8)
}

/// The API server until SIGINT/SIGTERM.
pub async fn run_server(cmd: ServerCommand) -> Result<(), RunError> {
    cmd.db.pooling.configure(true)?;
    let shutdown = shutdown_on_signal()?;
    let pool = connect_as(&cmd.db.database_url, "sked-server", 16, GroupRole::Server).await?;
    sked_db::check_schema(&pool)
        .await
        .map_err(db("checking the database schema"))?;
    let listener = bind(cmd.server.listen).await?;
    info!(addr = %cmd.server.listen, "API listening");
    let served = sked_server::serve_configured(
        pool.clone(),
        listener,
        shutdown,
        cmd.server.events(),
        cmd.server.quotas(),
        sked_server::upkeep(&pool),
    )
    .await;
    pool.close().await;
    served.map_err(|source| RunError::Io {
        context: "serving the API".into(),
        source,
    })
}

/// A worker until SIGINT/SIGTERM, then its graceful shutdown.
pub async fn run_worker(cmd: WorkerCommand) -> Result<(), RunError> {
    let config = cmd.worker.into_config().map_err(RunError::Config)?;
    // A worker listens only to be woken sooner than its next poll: behind a transaction-mode
    // pooler without a direct URL, it polls (one direct connection per worker adds up).
    cmd.db.pooling.configure(false)?;
    let shutdown = shutdown_on_signal()?;
    let pool = connect_as(
        &cmd.db.database_url,
        "sked-worker",
        worker_pool_size(&config),
        GroupRole::Worker,
    )
    .await?;
    sked_db::check_schema(&pool)
        .await
        .map_err(db("checking the database schema"))?;
    // Metrics are served until the worker has stopped, through its graceful shutdown.
    let metrics_stop = CancellationToken::new();
    let metrics = match cmd.metrics_listen {
        Some(addr) => Some(serve_worker_metrics(addr, metrics_stop.clone()).await?),
        None => None,
    };
    let result = sked_worker::run(pool.clone(), config, shutdown).await;
    metrics_stop.cancel();
    if let Some(metrics) = metrics
        && tokio::time::timeout(std::time::Duration::from_secs(5), metrics)
            .await
            .is_err()
    {
        warn!("the metrics endpoint did not stop within 5 s");
    }
    pool.close().await;
    result.map_err(RunError::Worker)
}

/// The worker's `/metrics` on `addr` (`--metrics-listen`), until `stop`.
async fn serve_worker_metrics(
    addr: SocketAddr,
    stop: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, RunError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Io {
            context: format!(
                "serving metrics on {addr} (choose another address with --metrics-listen)"
            ),
            source,
        })?;
    info!(addr = %listener.local_addr().unwrap_or(addr), "serving metrics on /metrics");
    let router = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    sked_db::metrics::CONTENT_TYPE,
                )],
                sked_db::metrics::encode(None),
            )
        }),
    );
    Ok(tokio::spawn(async move {
        let served = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            warn!(error = %e, "serving metrics failed");
        }
    }))
}

/// `sked dev`: a private PostgreSQL (unless `DATABASE_URL` is set), migrated, with the API
/// server and a worker in this process, until SIGINT/SIGTERM. Then the worker shuts down
/// gracefully, the server stops, and the private cluster is stopped.
pub async fn run_dev(mut cmd: DevCommand, path_var: Option<OsString>) -> Result<(), RunError> {
    if cmd.worker.work_dir.is_none() {
        let here = std::env::current_dir().map_err(|source| RunError::Io {
            context: "reading the current directory".into(),
            source,
        })?;
        cmd.worker.work_dir = Some(here.join(DEV_WORK_DIR));
    }
    let mut config = cmd.worker.into_config().map_err(RunError::Config)?;
    if cmd.database_url.is_some() {
        cmd.pooling.configure(true)?;
    } else if cmd.pooling.database_pooler != Pooler::None
        || cmd.pooling.listen_database_url.is_some()
    {
        return Err(RunError::Config(
            "--database-pooler and --listen-database-url need DATABASE_URL: the private PostgreSQL is reached directly".into(),
        ));
    }
    let shutdown = shutdown_on_signal()?;
    let listener = bind_dev(cmd.server.listen).await?;
    let api = listener
        .local_addr()
        .map(|a| format!("http://{a}"))
        .unwrap_or_else(|_| format!("http://{}", cmd.server.listen));
    let asked = cmd.server.listen.port();
    let taken = listener.local_addr().map(|a| a.port()).unwrap_or(asked);
    let busy_note = (asked != 0 && taken != asked)
        .then(|| format!("port {asked} was busy (another sked dev?): this one listens on {api}"));
    // Tasks spawn through this server (`sked spawn`) unless told of another.
    if config.api_url.is_none() {
        config.api_url = Some(api.clone());
    }
    let listening = Listening {
        listener,
        api,
        busy_note,
    };
    let Some(url) = cmd.database_url.clone() else {
        let bins = match cmd.pg_bin {
            Some(dir) => PgBinaries::at(dir),
            None => PgBinaries::find(path_var.as_deref()),
        }
        .map_err(RunError::Postgres)?;
        println!(
            "Starting a private PostgreSQL for {} (server binaries in {})…",
            cmd.data_dir.display(),
            bins.dir.display()
        );
        let cluster = Cluster::start(&bins, &cmd.data_dir)
            .await
            .map_err(RunError::Postgres)?;
        let result = async {
            cluster
                .ensure_database("sked")
                .await
                .map_err(RunError::Postgres)?;
            let info = ClusterInfo::of(&cluster);
            serve_dev(
                &cluster.url("sked"),
                Some(info),
                listening,
                &cmd.server,
                config,
                shutdown,
            )
            .await
        }
        .await;
        println!("Stopping PostgreSQL ({})…", cluster.data_dir.display());
        let stopped = cluster.stop().await.map_err(RunError::Postgres);
        result?;
        stopped?;
        println!("Stopped.");
        return Ok(());
    };
    serve_dev(&url, None, listening, &cmd.server, config, shutdown).await?;
    println!("Stopped.");
    Ok(())
}

/// What the banner says about a private cluster.
struct ClusterInfo {
    data_dir: PathBuf,
    created: bool,
    reused: bool,
    notes: Vec<String>,
}

impl ClusterInfo {
    fn of(cluster: &Cluster) -> ClusterInfo {
        ClusterInfo {
            data_dir: cluster.data_dir.clone(),
            created: cluster.created,
            reused: cluster.reused,
            notes: cluster.notes.clone(),
        }
    }
}

/// `sked dev`'s listener, the URL it answers on, and a note when its port was busy.
struct Listening {
    listener: tokio::net::TcpListener,
    api: String,
    busy_note: Option<String>,
}

async fn serve_dev(
    url: &str,
    cluster: Option<ClusterInfo>,
    listening: Listening,
    server_args: &ServerArgs,
    config: WorkerConfig,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let quotas = server_args.quotas();
    let events = server_args.events();
    // Migrating needs a session: behind a transaction-mode pooler, the direct URL's.
    let pool = sked_db::connect_session(url, "sked-dev", 4, "migrating the database")
        .await
        .map_err(db("connecting to the database"))?;
    sked_db::migrate(&pool)
        .await
        .map_err(db("migrating the database"))?;
    let version = sked_db::schema_version(&pool)
        .await
        .map_err(db("reading the schema version"))?;
    let new_token = if token::admin_exists(&pool)
        .await
        .map_err(db("looking for an admin token"))?
    {
        None
    } else {
        let secret = token::create(&pool, "admin", Role::Admin, "created by sked dev")
            .await
            .map_err(db("creating an admin token"))?;
        Some(secret)
    };
    let Listening {
        listener,
        api,
        busy_note,
    } = listening;
    print_banner(
        url,
        cluster.as_ref(),
        &api,
        busy_note.as_deref(),
        version,
        new_token.as_deref(),
    );
    // Migrating and the admin token needed the owner; the worker and the server each act as
    // their own role from here.
    pool.close().await;
    let worker_pool = connect_as(
        url,
        "sked-dev-worker",
        worker_pool_size(&config),
        GroupRole::Worker,
    )
    .await?;
    let server_pool = connect_as(url, "sked-dev-server", 12, GroupRole::Server).await?;

    // One loop of background upkeep for the process: the worker's loop also runs the
    // server's duties (over the server's pool), and a duty both have (cron firing) once.
    let server_upkeep = sked_server::upkeep(&server_pool);
    // Each part cancels `shutdown` when it ends, so a part that fails stops the others.
    let worker_stop = CancellationToken::new();
    let server_stop = CancellationToken::new();
    let worker = tokio::spawn({
        let (pool, stop, shutdown) = (worker_pool.clone(), worker_stop.clone(), shutdown.clone());
        async move {
            let result = sked_worker::run_with(pool, config, stop, server_upkeep).await;
            shutdown.cancel();
            result
        }
    });
    let server = tokio::spawn({
        let (pool, stop, shutdown) = (server_pool.clone(), server_stop.clone(), shutdown.clone());
        async move {
            let result = sked_server::serve_configured(
                pool,
                listener,
                stop,
                events,
                quotas,
                sked_db::upkeep::Upkeep::new(),
            )
            .await;
            shutdown.cancel();
            result
        }
    });
    shutdown.cancelled().await;
    println!("Shutting down: the worker finishes its running tasks, then the server stops…");
    worker_stop.cancel();
    let worker_result = match worker.await {
        Ok(r) => r.map_err(RunError::Worker),
        Err(_) => Err(RunError::Panicked("worker")),
    };
    server_stop.cancel();
    let server_result = match server.await {
        Ok(r) => r.map_err(|source| RunError::Io {
            context: "serving the API".into(),
            source,
        }),
        Err(_) => Err(RunError::Panicked("server")),
    };
    worker_pool.close().await;
    server_pool.close().await;
    if let Err(e) = &worker_result {
        warn!(error = %e, "worker");
    }
    worker_result.and(server_result)
}

fn print_banner(
    url: &str,
    cluster: Option<&ClusterInfo>,
    api: &str,
    busy_note: Option<&str>,
    version: i64,
    new_token: Option<&str>,
) {
    let mut out = String::new();
    out.push_str("\nsked dev is running.\n\n");
    let dashboard = match new_token {
        Some(secret) => format!("{api}/#token={secret}"),
        None => format!("{api}/"),
    };
    out.push_str(&format!("  Dashboard:     {dashboard}\n"));
    out.push_str(&format!("  API:           {api}/api/v1\n"));
    if let Some(note) = busy_note {
        out.push_str(&format!("  Note:          {note}\n"));
    }
    match cluster {
        Some(c) => {
            let state = if c.created {
                "created now"
            } else if c.reused {
                "was already running"
            } else {
                "started"
            };
            out.push_str(&format!("  DATABASE_URL:  {url}\n"));
            out.push_str(&format!(
                "  PostgreSQL:    private cluster in {} ({state}; log: postgres.log there)\n",
                c.data_dir.display()
            ));
            for note in &c.notes {
                out.push_str(&format!("  Note:          {note}\n"));
            }
        }
        None => out.push_str("  DATABASE_URL:  (from the environment)\n"),
    }
    out.push_str(&format!("  Schema:        version {version}\n"));
    let token_hint = match new_token {
        Some(secret) => {
            out.push_str(&format!(
                "  Admin token:   {secret}\n                 (shown only this once: keep it)\n"
            ));
            secret.to_owned()
        }
        None => {
            let db = if cluster.is_some() {
                format!("DATABASE_URL={url} ")
            } else {
                String::new()
            };
            out.push_str(&format!(
                "  Admin token:   one exists already (it was shown when it was created);\n\
                 \x20                create another with: {db}sked token create --owner admin --role admin\n",
            ));
            "<your token>".to_owned()
        }
    };
    let psql_url = if cluster.is_some() {
        url.to_owned()
    } else {
        "$DATABASE_URL".to_owned()
    };
    out.push_str(&format!(
        "\nTry it:\n\
         \x20 export SKED_URL={api} SKED_TOKEN={token_hint}\n\
         \x20 sked submit -- sh -c 'echo hello from sked'\n\
         \x20 sked list\n\
         \x20 curl -H \"Authorization: Bearer $SKED_TOKEN\" $SKED_URL/api/v1/tasks\n\
         \x20 psql {psql_url} -c \"insert into sked.tasks (command) values (array['echo', 'hi'])\"\n\
         \nPress Ctrl-C to stop.\n"
    ));
    print!("{out}");
}
