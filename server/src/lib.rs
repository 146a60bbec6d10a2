//! The sked REST API server (axum), under `/api/v1`.
//!
//! The server is stateless: every request reads and writes Postgres through `sked_db`, so any
//! number of servers can run side by side. [`router`] builds the whole API over a pool (tests
//! drive it with `tower::ServiceExt::oneshot`); [`serve`] checks the schema and serves it.
//!
//! - `tasks` — submit, list, read, logs, cancel, retry and resubmit.
//! - `spawn` — a running task adds a workflow to its own, with its task token.
//! - `bulk` — retry or cancel every task a listing's filters select.
//! - `workflows` — submit, list, read, cancel and re-run DAG workflows.
//! - `schedules` — create, list, read, change, pause, resume, run and delete cron schedules,
//!   and preview cron expressions.
//! - `services` — list and read long-running services with their copies; change one (a
//!   rolling update, or scaling).
//! - `system` — the overview, workers, queues, the caller (`me`) and health.
//! - `queues` — pause, resume and limit a queue (admin tokens only).
//! - `quotas` — the task rows one request may create, and one owner per minute.
//! - `openapi` — every route of the API and its OpenAPI 3 document, from one declaration.
//! - `events` — live events over a websocket (`/api/v1/events`): one `LISTEN` per process,
//!   coalesced and filtered per client.
//! - `web` — the dashboard's files (every other `GET`), embedded in the binary.
//! - `replica` — reads that tolerate staleness on a streaming replica
//!   (`--read-database-url`) while it is within `--read-max-staleness` of the primary.
//! - `extract` — the caller's token and body/query/path extractors that fail as API errors;
//!   a JSON body is read into its type as its schema reads it (`sked_types::strict`).
//! - `shown` — the body of every answer that carries a task's environment (a task, a service,
//!   a schedule's template), which masks secret values on its way out.
//! - `error` — the one error type, rendered to HTTP in one place.
//!
//! Every endpoint but `GET /api/v1/health` and `GET /api/v1/openapi.json` needs
//! `Authorization: Bearer <token>`. Errors have the body [`sked_types::ApiError`] with a stable
//! `code`: `unauthorized`, `forbidden`, `not_found`, `invalid_request`, `too_large`,
//! `quota_exceeded`, `rejected`, `conflict`, `already_finished`, `not_finished`,
//! `method_not_allowed`, `unavailable` or `internal`.

mod alerts;
mod awaits;
mod bulk;
mod coalesce;
mod definitions;
mod error;
mod events;
mod extract;
mod openapi;
mod queues;
mod quotas;
mod replica;
mod schedules;
mod services;
mod shown;
mod spawn;
mod system;
mod tasks;
mod web;
mod workflows;

use std::net::SocketAddr;
use std::sync::Arc;

use awaits::Awaits;
use axum::Router;
use axum::handler::Handler;
use axum::routing::get;
use sked_db::upkeep::{Duty, FiringConfig, Upkeep};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tower_http::compression::CompressionLayer;
use tower_http::trace::{DefaultMakeSpan, TraceLayer};

pub use error::Error;
pub use events::pool::{
    DEFAULT_POOL_SIZE as DEFAULT_EVENTS_POOL_SIZE, MIN_POOL_SIZE as MIN_EVENTS_POOL_SIZE,
};
pub use events::{EventsConfig, Hub};
pub use openapi::document as openapi_document;
pub use quotas::{
    DEFAULT_MAX_ROWS_PER_OWNER_PER_MINUTE, DEFAULT_MAX_ROWS_PER_REQUEST,
    MAX_ROWS_PER_OWNER_PER_MINUTE, Quotas,
};
pub use replica::{DEFAULT_MAX_STALENESS, ReadReplica};
pub use tasks::{MAX_BATCH, MAX_PAGE};

/// Command-line flags of `sked-server` (and of the server inside `sked dev`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long, env = "SKED_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The most task rows one request may create: tasks, their shards and the copies of
    /// services (a schedule's: per tick). A request over it is refused (413) and writes
    /// nothing.
    #[arg(long, env = "SKED_MAX_ROWS_PER_REQUEST", default_value_t = DEFAULT_MAX_ROWS_PER_REQUEST,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_rows_per_request: u64,
    /// The most task rows the owner of a user token may create through the API per minute,
    /// over every server (one bucket per owner in the database: up to this many at once,
    /// refilled at this many per minute). A request it cannot cover now is refused (429,
    /// with Retry-After) and writes nothing; one larger than it, always (413). Admin tokens
    /// are exempt. 0: no limit.
    #[arg(long, env = "SKED_MAX_ROWS_PER_OWNER_PER_MINUTE",
          default_value_t = DEFAULT_MAX_ROWS_PER_OWNER_PER_MINUTE,
          value_parser = clap::value_parser!(u64).range(0..=MAX_ROWS_PER_OWNER_PER_MINUTE))]
    pub max_rows_per_owner_per_minute: u64,
    /// The longest the server holds a read that waits for a final state (`GET
    /// /api/v1/tasks/{id}?wait=30s`) before it answers with the state then: seconds or a
    /// duration (`50s`, `2m`), at most 300 s. Keep it under the idle timeout of proxies in
    /// front of the server (often 60 s).
    #[arg(long, env = "SKED_MAX_WAIT", default_value = "50s", value_parser = parse_max_wait)]
    pub max_wait: std::time::Duration,
    /// The most queues `/metrics` names, those with the most unfinished tasks; the others
    /// are added up under `queue="_other"` (queue names are chosen by submitters: this
    /// bounds what one scrape, and Prometheus, holds).
    #[arg(long, env = "SKED_METRICS_MAX_QUEUES", default_value_t = sked_db::metrics::DEFAULT_MAX_QUEUES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub metrics_max_queues: usize,
    /// Connections the live events (`/api/v1/events`) hold beside the server's pool: the
    /// hub's `LISTEN` connection, its reads of what changed and its clients' token checks.
    /// Requests that keep every connection of the server's pool busy never delay them.
    #[arg(long, env = "SKED_EVENTS_POOL_SIZE", default_value_t = DEFAULT_EVENTS_POOL_SIZE,
          value_parser = clap::value_parser!(u32).range(i64::from(MIN_EVENTS_POOL_SIZE)..=64))]
    pub events_pool_size: u32,
    /// A streaming replica of the database (a PostgreSQL hot standby) for the reads that
    /// tolerate staleness: task listings and counts, the overview, the history, log chunks,
    /// workflow and schedule listings and the workers. They go there while it is at most
    /// `--read-max-staleness` behind the primary, else to the primary. Writes, a task read
    /// by id, long polls and token checks always use the primary (`docs/operations.md`,
    /// "Read replica").
    #[arg(
        long,
        env = "SKED_READ_DATABASE_URL",
        value_name = "URL",
        hide_env_values = true
    )]
    pub read_database_url: Option<String>,
    /// The most the read replica may lag behind the primary for reads to go to it: seconds
    /// or a duration (`5s`, `1m`), from 1 s to an hour. Measured every second on the replica.
    #[arg(long, env = "SKED_READ_MAX_STALENESS", default_value = "5s",
          value_parser = replica::parse_max_staleness)]
    pub read_max_staleness: std::time::Duration,
    /// Replaced by the retention stored in the database, which every server applies
    /// (`sked retention set`, README.md "Retention"); the flag is refused with a message
    /// saying so, so that a server started with it does not run with a retention it did not
    /// ask for.
    #[arg(long = "retention-days", env = "SKED_RETENTION_DAYS", value_name = "DAYS",
          hide = true, value_parser = retention_days_replaced)]
    pub retention_days: Option<std::convert::Infallible>,
}

/// Reads `--max-wait`: a positive duration of at most [`awaits::MAX_WAIT`].
fn parse_max_wait(s: &str) -> Result<std::time::Duration, String> {
    let secs = sked_types::duration::parse_duration(s, "--max-wait", f64::MIN_POSITIVE)?;
    if secs > awaits::MAX_WAIT.as_secs_f64() {
        return Err(format!(
            "--max-wait must be at most {} seconds, got {s}",
            awaits::MAX_WAIT.as_secs()
        ));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// Refuses `--retention-days`, saying what replaced it.
fn retention_days_replaced(_: &str) -> Result<std::convert::Infallible, String> {
    Err(
        "--retention-days (SKED_RETENTION_DAYS) is replaced by the retention stored in the \
         database, which every server applies: finished tasks are kept 7 days and failed ones \
         30 days by default; change it with `sked retention set --keep 30d`, or per queue with \
         `sked queue retention NAME --keep 30d`, and drop the flag"
            .to_owned(),
    )
}

impl ServerArgs {
    /// The quotas these flags set.
    pub fn quotas(&self) -> Quotas {
        Quotas {
            max_rows_per_request: self.max_rows_per_request,
            max_rows_per_owner_per_minute: self.max_rows_per_owner_per_minute,
            max_wait: self.max_wait,
            metrics_max_queues: self.metrics_max_queues,
            reads: ReadReplica {
                url: self.read_database_url.clone(),
                max_staleness: self.read_max_staleness,
            },
        }
    }

    /// The live events these flags set.
    pub fn events(&self) -> EventsConfig {
        EventsConfig {
            pool_size: self.events_pool_size,
            ..EventsConfig::default()
        }
    }
}

/// What every handler shares: the pool, and the hub of live events (the server keeps no
/// state of its own: the hub only relays what the database announces).
#[derive(Debug, Clone)]
pub struct AppState {
    pub pool: PgPool,
    /// `None` in a router without a running hub, which refuses `/api/v1/events`.
    pub(crate) events: Option<Hub>,
    pub(crate) quotas: Quotas,
    /// The long polls of reads that wait for a final state.
    pub(crate) awaits: Awaits,
    /// The overviews and histories being read, which identical requests share.
    pub(crate) overviews: Arc<coalesce::Coalesce<sked_types::Overview>>,
    pub(crate) histories: Arc<coalesce::Coalesce<sked_types::History>>,
    /// The read replica, when the server has one (`replica.rs`).
    pub(crate) reads: replica::Reads,
}

impl AppState {
    /// Runs `read`, a read that tolerates staleness, on the read replica while it is within
    /// `--read-max-staleness` of the primary, else on the primary; the one place that
    /// chooses (`replica.rs`). A read that fails on the replica with an error of the
    /// database's, not of the request's, runs again on the primary.
    pub(crate) async fn read<T, F, Fut>(&self, read: F) -> error::Result<T>
    where
        F: Fn(PgPool) -> Fut,
        Fut: std::future::Future<Output = error::Result<T>>,
    {
        let Some(replica) = self.reads.replica() else {
            return read(self.pool.clone()).await;
        };
        match read(replica.pool.clone()).await {
            Err(Error::Internal(e)) => {
                replica.failed(&e);
                read(self.pool.clone()).await
            }
            answer => answer,
        }
    }
}

/// The API router over a pool, without live events (those need [`serve`], which runs their
/// hub).
pub fn router(pool: PgPool) -> Router {
    router_with_events(pool, None)
}

/// The API router over a pool, with live events from `events` when given.
pub fn router_with_events(pool: PgPool, events: Option<Hub>) -> Router {
    router_with(pool, events, Quotas::default())
}

/// The API router over a pool, with live events from `events` when given and `quotas`.
pub fn router_with(pool: PgPool, events: Option<Hub>, quotas: Quotas) -> Router {
    router_stopping(
        pool,
        events,
        quotas,
        replica::Reads::default(),
        CancellationToken::new(),
    )
}

/// [`router_with`] whose long polls end when `stop` is cancelled.
fn router_stopping(
    pool: PgPool,
    events: Option<Hub>,
    quotas: Quotas,
    reads: replica::Reads,
    stop: CancellationToken,
) -> Router {
    let (api, _) = openapi::api().split_for_parts();
    let awaits = Awaits::new(pool.clone(), quotas.max_wait, stop);
    api
        // Live events are a websocket, which OpenAPI 3 does not describe.
        .route("/api/v1/events", get(events::events))
        .method_not_allowed_fallback(method_not_allowed)
        // The dashboard's files, gzipped for browsers that accept it (the .wasm shrinks 3×).
        .fallback(web::serve.layer(CompressionLayer::new()))
        // A span per request at `info` (method, URI, version), so that what a request logs
        // names it and `--otlp-endpoint` exports it.
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().level(tracing::Level::INFO)),
        )
        .with_state(AppState {
            pool,
            events,
            quotas,
            awaits,
            overviews: Arc::default(),
            histories: Arc::default(),
            reads,
        })
}

async fn method_not_allowed() -> Error {
    Error::MethodNotAllowed
}

/// Serves the API on `listener` until `shutdown` is cancelled, with live events.
///
/// Refuses to start (with an error naming both versions) when the database's schema is not
/// the one this binary was built for.
pub async fn serve(
    pool: PgPool,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_with(pool, listener, shutdown, EventsConfig::default()).await
}

/// [`serve`] with the live events configured by `events`.
pub async fn serve_with(
    pool: PgPool,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
    events: EventsConfig,
) -> std::io::Result<()> {
    let upkeep = upkeep(&pool);
    serve_configured(pool, listener, shutdown, events, Quotas::default(), upkeep).await
}

/// The server's duties of background upkeep (`sked_db::upkeep`), over `pool`: cron firing and
/// the trimming of schedules' runs, the pruning of recorded live events, and retention: the
/// pruning of finished tasks and of artifacts nothing refers to, by the rules stored in the
/// database (`sql/retention.sql`; nothing while retention is off there), and the fold of
/// finishes into their rollups (`sql/finishes.sql`).
pub fn upkeep(pool: &PgPool) -> Upkeep {
    Upkeep::new()
        .with(Duty::FireSchedules(FiringConfig::default()), pool)
        .with(Duty::PruneScheduleRuns, pool)
        .with(Duty::PruneEvents, pool)
        .with(Duty::PruneTasks, pool)
        .with(Duty::PruneArtifacts, pool)
        .with(Duty::FoldFinishes, pool)
}

/// [`serve`] with the live events configured by `events`, the quotas `quotas`, and `upkeep`
/// as the process's loop of background upkeep (usually [`upkeep`]; none when another part of
/// the process runs it).
pub async fn serve_configured(
    pool: PgPool,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
    events: EventsConfig,
    quotas: Quotas,
    upkeep: Upkeep,
) -> std::io::Result<()> {
    sked_db::check_schema(&pool)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    // Reads that tolerate staleness on the read replica, as many connections as the
    // primary's pool, its lag measured in the background until the server stops.
    let reads = replica::Reads::connect(&quotas.reads, pool.options().get_max_connections())
        .map_err(std::io::Error::other)?;
    let reads_stop = shutdown.child_token();
    let reads_watch = tokio::spawn(reads.clone().watch(reads_stop.clone()));
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, dashboard = web::built(), "serving the API");
    }
    // Background upkeep: any number of servers and workers run it; each duty is fenced in
    // the database.
    let upkeep_stop = shutdown.child_token();
    let upkeep = tokio::spawn(upkeep.run(upkeep_stop.clone()));
    // Live events: one LISTEN connection for all the websocket clients of this process, in
    // a pool of the hub's own, so that requests holding every connection of `pool` never
    // delay them. The hub stops with the server, and closes the sockets of its clients.
    let events_pool = events::pool::connect(&pool, events.pool_size)
        .await
        .map_err(|e| std::io::Error::other(format!("the live events' connections: {e}")))?;
    let hub = Hub::new(events_pool.clone(), events, shutdown.child_token());
    let mut hub_service = tokio::spawn(hub.clone().run());
    // Long polls answer at once when the server stops, so that the graceful shutdown, which
    // waits for the requests in flight, does not wait for them.
    let router = router_stopping(
        pool,
        Some(hub.clone()),
        quotas,
        reads.clone(),
        shutdown.child_token(),
    );
    let served = axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    upkeep_stop.cancel();
    hub.stop();
    if tokio::time::timeout(std::time::Duration::from_secs(5), &mut hub_service)
        .await
        .is_err()
    {
        hub_service.abort();
    }
    let _ = upkeep.await;
    let _ = reads_watch.await;
    reads.close().await;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), events_pool.close()).await;
    served
}
