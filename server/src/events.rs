//! Live events: `GET /api/v1/events`, a websocket that tells the dashboard what changed.
//!
//! The statement triggers of `sql/events.sql` record what each statement changed in
//! `sked.event_outbox` (tasks, tasks with new logs, workflows, schedules by id; workers), one
//! row per statement, numbered per slot of `sked.event_changes` so that a reader finds every
//! committed row after the last one it saw. They record nothing while no server has clients.
//! Each server process runs one [`Hub`]:
//!
//! - **The hub service** ([`Hub::run`]) reads what was recorded every batch window
//!   ([`BATCH_WINDOW_MS`]) while it has clients, resolves a batch with one query per kind
//!   (tasks and tasks with new logs into [`TaskSummary`] rows with their owners, workflows
//!   and schedules into their owners), and queues for each client the frames its token may
//!   see: an admin everything, a user its owner's; worker events go to everyone. With no
//!   client connected it runs no query.
//! - **The gate** (`gate`): while the hub has clients it keeps a row in
//!   `sked.event_listeners`, without which the triggers record nothing, so the hot path pays
//!   for recording only while someone watches.
//! - **A client pump** (`client`, one task per websocket) authenticates the client, sends
//!   `hello` once the gate is open, then writes the frames queued for it, pings it, and closes
//!   the socket when the hub stops or finds the client's token no longer valid (it checks the
//!   tokens of all its clients in one statement every [`EventsConfig::token_recheck`]).
//!
//! - **The hint listener** ([`hints`]): while clients are connected, one `LISTEN` connection
//!   on the channels writers already notify (`sked_tasks` for new and requeued tasks,
//!   `sked_cancel`, `sked_schedules`). A notification is a hint: the hub reads at once instead
//!   of at the end of its window, so a submitted task reaches the dashboard in milliseconds.
//!   The recorded rows stay the truth; a lost notification costs at most one window.
//!
//! Why claims and finishes record a row rather than NOTIFY: a NOTIFY holds a cluster-wide
//! lock from before its transaction's commit record is flushed until the commit ends, so
//! claims and finishes that notify commit one after the other; recording a row takes no lock
//! another writer waits for (see `migrations/20261201000004_events_outbox.sql` and
//! `docs/events.md`). Submissions already notify workers, so listening to them costs writers
//! nothing.
//!
//! A slow client never slows the hub or the other clients: each client has a bounded queue
//! ([`EventsConfig::client_buffer`] frames). When it is full the hub drops that client's
//! frames and flags it, and its pump sends one [`ServerEvent::Resync`] as soon as the queue is
//! empty again. A client whose socket accepts nothing for [`EventsConfig::send_timeout`] is
//! disconnected: it is sent `resync` and a close frame (code 4408), which it gets if it reads
//! within [`EventsConfig::close_timeout`]. Every client also gets `Resync` when a statement changed too many rows to
//! name them, or deleted rows (at most once a second), when recorded changes were lost (pruned
//! before the hub read them, or a crash), and when a batch could not be resolved. Every
//! server's background upkeep (`sked_db::upkeep`) deletes recorded changes a minute old,
//! whether or not it has clients.

mod client;
mod gate;
pub(crate) mod pool;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::ws::Utf8Bytes;
use chrono::{DateTime, Utc};
use sked_db::text::Text;
use sked_db::token::Principal;
use sked_types::events::{
    AUTH_TIMEOUT_SECS, BATCH_WINDOW_MS, ServerEvent, TaskSummary, argv_preview,
};
use sked_types::{TaskKind, TaskState};
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub(crate) use client::events;
use gate::Gate;

/// Reasons of [`ServerEvent::Resync`].
const TOO_MANY: &str = "too many changes at once";
const LOST: &str = "some changes could not be read in time";
const UNREADABLE: &str = "the server could not read the changes";
const LAGGED: &str = "this client read too slowly; events were dropped";
const LATE_OPEN: &str =
    "changes made while live events were being switched on may have been missed";

/// Seconds between two checks of a connected client's token.
const TOKEN_RECHECK_SECS: u64 = 5;

/// How the live events run. The defaults are the server's; tests shrink them.
#[derive(Debug, Clone)]
pub struct EventsConfig {
    /// Connections of the hub's own pool ([`pool::DEFAULT_POOL_SIZE`], at least
    /// [`pool::MIN_POOL_SIZE`]), beside the server's: what the hub reads, its `LISTEN`
    /// connection and its clients' token checks never wait for the requests that hold the
    /// server's pool.
    pub pool_size: u32,
    /// Frames queued for one client; beyond that its events are dropped and it gets a
    /// `resync` once it has caught up.
    pub client_buffer: usize,
    /// The hub reads what changed this often, and sends it as one batch.
    pub batch_window: Duration,
    /// A batch naming more tasks than this (changed or with new logs) is sent as `resync`.
    pub max_tasks_per_batch: usize,
    /// Time a client has to send its `auth` frame when the upgrade carried no token.
    pub auth_timeout: Duration,
    /// The server pings every client this often; a client silent for two intervals is
    /// dropped.
    pub ping_interval: Duration,
    /// A client whose socket accepts nothing for this long is disconnected: it is sent
    /// `resync` and a close frame (4408), which it gets if it reads them within
    /// `close_timeout`.
    pub send_timeout: Duration,
    /// How long a client being disconnected has to take its last frames and answer the close
    /// frame before its connection is dropped.
    pub close_timeout: Duration,
    /// This server's row in `sked.event_listeners` expires this long after its last
    /// refresh (it is refreshed every third of it while clients are connected).
    pub listener_ttl: Duration,
    /// The row is deleted this long after the last client left, so that a page reload does
    /// not switch the triggers off and on.
    pub linger: Duration,
    /// Each client's token is checked again this often; a token revoked or expired since
    /// closes its socket (code 4401).
    pub token_recheck: Duration,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            pool_size: pool::DEFAULT_POOL_SIZE,
            client_buffer: 64,
            batch_window: Duration::from_millis(BATCH_WINDOW_MS),
            max_tasks_per_batch: 1000,
            auth_timeout: Duration::from_secs(AUTH_TIMEOUT_SECS),
            ping_interval: Duration::from_secs(20),
            send_timeout: Duration::from_secs(30),
            close_timeout: Duration::from_secs(10),
            listener_ttl: Duration::from_secs(60),
            linger: Duration::from_secs(10),
            token_recheck: Duration::from_secs(TOKEN_RECHECK_SECS),
        }
    }
}

/// The live events of one server process: the registry of connected clients, shared by the
/// websocket handlers, and the service that feeds them ([`Hub::run`]).
#[derive(Debug, Clone)]
pub struct Hub {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    pool: PgPool,
    config: EventsConfig,
    /// Cancelled when the hub stops; every pump then closes its socket.
    stop: CancellationToken,
    clients: Mutex<HashMap<u64, Client>>,
    next_id: AtomicU64,
    /// Woken when a client comes or goes.
    clients_changed: Notify,
    /// True while the hub listens and the triggers notify: a new client is greeted once it
    /// is, so that `hello` means "from now on you hear of every change".
    ready: watch::Sender<bool>,
    /// Woken by the hint listener when a writer notified: read what changed now.
    hint: Notify,
}

/// What the hub holds of one connected client.
#[derive(Debug, Clone)]
struct Client {
    principal: Principal,
    /// Checked again every [`EventsConfig::token_recheck`], for all clients at once.
    token: Arc<str>,
    frames: mpsc::Sender<Utf8Bytes>,
    signals: Arc<Signals>,
}

/// What the hub tells a client's pump besides its frames.
#[derive(Debug, Default)]
struct Signals {
    /// Set when the hub dropped frames for the client because its queue was full: the pump
    /// sends `resync` once the queue is empty.
    dropped: AtomicBool,
    /// Set when the client's token was revoked or expired since it connected: the pump
    /// closes the socket (4401) with this reason.
    refused: Mutex<Option<&'static str>>,
    wake: Notify,
}

/// A client's end of the hub: its queue of frames. Dropping it unregisters the client.
struct Subscription {
    id: u64,
    shared: Arc<Shared>,
    frames: mpsc::Receiver<Utf8Bytes>,
    signals: Arc<Signals>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shared.clients().remove(&self.id);
        self.shared.clients_changed.notify_one();
    }
}

impl Shared {
    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Client>> {
        self.clients.lock().expect("events client registry")
    }
}

impl Hub {
    /// A hub over `pool` (its own connections: see [`EventsConfig::pool_size`]) that stops
    /// when `stop` is cancelled. It does nothing until [`Hub::run`] runs.
    pub fn new(pool: PgPool, config: EventsConfig, stop: CancellationToken) -> Hub {
        Hub {
            shared: Arc::new(Shared {
                pool,
                config,
                stop,
                clients: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                clients_changed: Notify::new(),
                ready: watch::Sender::new(false),
                hint: Notify::new(),
            }),
        }
    }

    /// Stops the hub: the service returns and every client's socket is closed.
    pub fn stop(&self) {
        self.shared.stop.cancel();
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.shared.clients().len()
    }

    fn subscribe(&self, principal: Principal, token: &str) -> Subscription {
        let (tx, rx) = mpsc::channel(self.shared.config.client_buffer.max(1));
        let signals = Arc::new(Signals::default());
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared.clients().insert(
            id,
            Client {
                principal,
                token: token.into(),
                frames: tx,
                signals: signals.clone(),
            },
        );
        self.shared.clients_changed.notify_one();
        Subscription {
            id,
            shared: self.shared.clone(),
            frames: rx,
            signals,
        }
    }

    /// The hub service, until the hub stops: keeps the gate open while clients are connected,
    /// reads what the database recorded every batch window, and sends it to the clients
    /// connected then. One `select!`, read top to bottom.
    pub async fn run(self) {
        let shared = &self.shared;
        let config = &shared.config;
        let mut gate = Gate::new(config.listener_ttl, config.linger);
        // Whether clients may be greeted, and when to step the gate next.
        let mut gate_greets = false;
        let mut gate_due: Option<Instant> = None;
        // The counters of sked.event_changes last read, by slot (`None` while the gate greets
        // nobody), and when to read again.
        let mut seen: Option<Vec<i64>> = None;
        let mut read_due = Instant::now();
        let mut read_failing = false;
        let mut last_bulk_resync: Option<Instant> = None;
        let mut last_read = Instant::now();
        let mut batch = Batch::default();
        let hint_listener = tokio::spawn(hints(shared.clone()));
        let mut recheck =
            tokio::time::interval_at(Instant::now() + config.token_recheck, config.token_recheck);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            shared
                .ready
                .send_if_modified(|ready| replace_if(ready, gate_greets));
            tokio::select! {
                _ = shared.stop.cancelled() => break,
                // A client came or went: the gate may open or start to linger.
                _ = shared.clients_changed.notified() => {
                    gate_due = Some(Instant::now());
                }
                _ = sleep_until(gate_due), if gate_due.is_some() => {
                    let step = gate.step(&shared.pool, self.clients()).await;
                    gate_due = step.next.map(|d| Instant::now() + d);
                    if step.resync {
                        batch.resync(LATE_OPEN);
                    }
                    // Read where the counters stand before greeting anyone: from there on,
                    // every change is read.
                    if !step.greet {
                        if seen.take().is_some() && self.clients() == 0 {
                            release_freed_memory();
                        }
                    } else if seen.is_none() {
                        match counters(&shared.pool).await {
                            Ok(now) => seen = Some(now),
                            Err(e) => {
                                tracing::warn!(error = %e, "live events: reading the change counters failed; retrying");
                                gate_due = Some(Instant::now() + Duration::from_secs(1));
                            }
                        }
                    }
                    gate_greets = step.greet && seen.is_some();
                }
                _ = recheck.tick(), if self.clients() > 0 => self.recheck_tokens().await,
                // A writer notified: read soon, but not more often than every HINT_GAP, so a
                // stream of submissions coalesces into batches.
                _ = shared.hint.notified(), if seen.is_some() => {
                    read_due = read_due.min((last_read + HINT_GAP).max(Instant::now()));
                }
                _ = tokio::time::sleep_until(read_due), if seen.is_some() && self.clients() > 0 => {
                    last_read = Instant::now();
                    read_due = last_read + config.batch_window;
                    let Some(counters) = seen.as_mut() else { continue };
                    match read(&shared.pool, counters, &mut batch, config.max_tasks_per_batch).await {
                        Ok(()) => read_failing = false,
                        Err(e) => {
                            // Nothing is lost: the next read starts where this one would have.
                            if !read_failing {
                                tracing::warn!(error = %e, "live events: reading what changed failed; retrying");
                            }
                            read_failing = true;
                            continue;
                        }
                    }
                    // Bulk changes in a row (a drain claiming hundreds of tasks at a time)
                    // make one `resync` a second, not one a window: the batch waits.
                    if batch.resync == Some(TOO_MANY) {
                        if last_bulk_resync.is_some_and(|last| last.elapsed() < BULK_RESYNC_GAP) {
                            continue;
                        }
                        last_bulk_resync = Some(Instant::now());
                    }
                    self.run_once(std::mem::take(&mut batch)).await;
                }
            }
        }
        // Dropping the queues ends every pump, which closes its socket; the triggers stop
        // recording for this server.
        shared.ready.send_replace(false);
        shared.clients().clear();
        hint_listener.abort();
        gate.close(&shared.pool).await;
    }

    /// Sends one batch to the clients connected now: resolves it from the database (unless
    /// nobody is connected or it is a `resync`) and queues each client its frames.
    async fn run_once(&self, batch: Batch) {
        let clients: Vec<(u64, Client)> = self
            .shared
            .clients()
            .iter()
            .map(|(id, c)| (*id, c.clone()))
            .collect();
        if clients.is_empty() || batch.is_empty() {
            return;
        }
        let resolved = match batch.resync {
            Some(reason) => Err(reason),
            None => self.resolve(&batch).await.map_err(|e| {
                tracing::warn!(error = %e, "live events: reading the changes failed; clients resync");
                UNREADABLE
            }),
        };
        let resolved = match resolved {
            Ok(resolved) => resolved,
            Err(reason) => {
                let frame = [frame(&ServerEvent::Resync {
                    reason: reason.to_owned(),
                })];
                for (id, client) in &clients {
                    self.queue(*id, client, &frame);
                }
                return;
            }
        };
        // Frames are built once per audience: all admins share theirs, each owner's users
        // share theirs.
        let mut frames: HashMap<Option<&str>, Vec<Utf8Bytes>> = HashMap::new();
        for (id, client) in &clients {
            let audience =
                (!client.principal.is_admin()).then_some(client.principal.owner.as_str());
            let frames = frames
                .entry(audience)
                .or_insert_with(|| resolved.frames(audience));
            self.queue(*id, client, frames);
        }
    }

    /// Queues frames for one client without waiting: a full queue drops them and flags the
    /// client for a `resync`; a closed one unregisters it.
    fn queue(&self, id: u64, client: &Client, frames: &[Utf8Bytes]) {
        for frame in frames {
            match client.frames.try_send(frame.clone()) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    client.signals.dropped.store(true, Ordering::SeqCst);
                    client.signals.wake.notify_one();
                    return;
                }
                Err(TrySendError::Closed(_)) => {
                    self.shared.clients().remove(&id);
                    return;
                }
            }
        }
    }

    /// Checks the tokens of the connected clients again, in one statement: the pump of a
    /// client whose token was revoked or expired since closes its socket (4401). A database
    /// that does not answer keeps the clients connected: the next check decides.
    async fn recheck_tokens(&self) {
        let clients: Vec<(Arc<str>, Arc<Signals>)> = self
            .shared
            .clients()
            .values()
            .map(|c| (c.token.clone(), c.signals.clone()))
            .collect();
        let mut tokens: Vec<&str> = clients.iter().map(|(token, _)| &**token).collect();
        tokens.sort_unstable();
        tokens.dedup();
        let verdicts = match sked_db::token::check_many(&self.shared.pool, &tokens).await {
            Ok(verdicts) => verdicts,
            Err(e) => {
                tracing::warn!(error = %e, "live events: checking the clients' tokens failed");
                return;
            }
        };
        let refused: HashMap<&str, &'static str> = tokens
            .iter()
            .zip(verdicts)
            .filter_map(|(token, verdict)| Some((*token, client::refusal_reason(&verdict.err()?))))
            .collect();
        for (token, signals) in &clients {
            if let Some(reason) = refused.get(&**token) {
                *signals.refused.lock().expect("client signals") = Some(reason);
                signals.wake.notify_one();
            }
        }
    }

    /// Reads what a batch names: one query for the tasks (changed or with new logs), one for
    /// the workflows' owners, one for the schedules' owners. Rows deleted meanwhile are left
    /// out.
    async fn resolve(&self, batch: &Batch) -> Result<Resolved, sqlx::Error> {
        let pool = &self.shared.pool;
        let mut resolved = Resolved {
            workers: batch.workers,
            ..Resolved::default()
        };
        if !batch.tasks.is_empty() || !batch.logs.is_empty() {
            let ids: Vec<Uuid> = batch.tasks.union(&batch.logs).copied().collect();
            let rows: Vec<SummaryRow> = sqlx::query_as("select * from sked.tasks_summary($1)")
                .bind(&ids)
                .fetch_all(sked_db::on(pool))
                .await?;
            for row in rows {
                if batch.logs.contains(&row.id) {
                    resolved.logs.push((row.id, row.owner.clone()));
                }
                if batch.tasks.contains(&row.id) {
                    resolved.tasks.push(row.into_summary());
                }
            }
        }
        if !batch.workflows.is_empty() {
            resolved.workflows = owners(pool, "sked.workflows", &batch.workflows).await?;
        }
        if !batch.schedules.is_empty() {
            resolved.schedules = owners(pool, "sked.schedules", &batch.schedules).await?;
        }
        Ok(resolved)
    }
}

/// A notification makes the hub read at once, but no sooner than this after its last read.
const HINT_GAP: Duration = Duration::from_millis(25);

/// The channels writers notify that hint at a change the dashboard shows.
const HINT_CHANNELS: [&str; 3] = ["sked_tasks", "sked_cancel", "sked_schedules"];

/// The hint listener: while the hub greets clients, one `LISTEN` connection on
/// [`HINT_CHANNELS`]; each notification wakes the hub. Reconnects with backoff; while it is
/// down the hub reads every window as it always does, so nothing is missed, only later.
async fn hints(shared: Arc<Shared>) {
    let mut ready = shared.ready.subscribe();
    let mut backoff = Duration::from_millis(200);
    loop {
        tokio::select! {
            _ = shared.stop.cancelled() => return,
            r = ready.wait_for(|ready| *ready) => if r.is_err() { return },
        }
        let mut listener = match listen(&shared.pool).await {
            Ok(listener) => listener,
            Err(e) => {
                tracing::debug!(error = %e, "live events: LISTEN failed; reading every window");
                tokio::select! {
                    _ = shared.stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        loop {
            tokio::select! {
                _ = shared.stop.cancelled() => return,
                // The last client left: close the connection until one comes.
                r = ready.wait_for(|ready| !*ready) => {
                    if r.is_err() { return }
                    break;
                }
                n = listener.try_recv() => match n {
                    Ok(Some(_)) => shared.hint.notify_one(),
                    // The connection dropped and was reopened: notifications in between are
                    // lost, which the next window's read makes good.
                    Ok(None) => shared.hint.notify_one(),
                    Err(e) => {
                        tracing::debug!(error = %e, "live events: LISTEN connection lost");
                        break;
                    }
                },
            }
        }
    }
}

async fn listen(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen_all(HINT_CHANNELS).await?;
    Ok(listener)
}

/// Hands the memory its departed clients used back to the system, when the hub stops
/// listening after its last client left. glibc's malloc keeps what is freed in its arenas
/// (one per thread), so without this a server that had a thousand dashboards open would stay
/// at that size after they closed.
fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only gives free pages of malloc's own arenas back to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// At most one `resync` for too many changes per this interval.
const BULK_RESYNC_GAP: Duration = Duration::from_secs(1);

/// Sleeps until `at` (a `select!` branch guarded by `at.is_some()`).
async fn sleep_until(at: Option<Instant>) {
    tokio::time::sleep_until(at.unwrap_or_else(Instant::now)).await;
}

/// Sets `value` to `new`; true when it changed.
fn replace_if(value: &mut bool, new: bool) -> bool {
    std::mem::replace(value, new) != new
}

/// Where the counters of sked.event_changes stand, by slot.
async fn counters(pool: &PgPool) -> Result<Vec<i64>, sqlx::Error> {
    let rows: Vec<(i32, i64)> = sqlx::query_as("select slot, n from sked.event_changes")
        .fetch_all(sked_db::on(pool))
        .await?;
    let mut counters = Vec::new();
    for (slot, n) in rows {
        let slot = usize::try_from(slot).unwrap_or_default();
        if counters.len() <= slot {
            counters.resize(slot + 1, 0);
        }
        counters[slot] = n;
    }
    Ok(counters)
}

/// Adds to `batch` what was recorded after `seen` (`sked.events_read`), and moves `seen` to
/// the counters read with it. A slot with fewer rows than its counter moved lost some: the
/// batch becomes a `resync`.
async fn read(
    pool: &PgPool,
    seen: &mut Vec<i64>,
    batch: &mut Batch,
    max_tasks: usize,
) -> Result<(), sqlx::Error> {
    type Row = (i32, i64, Option<String>, Option<Vec<Uuid>>);
    let rows: Vec<Row> = sqlx::query_as("select slot, n, kind, ids from sked.events_read($1)")
        .bind(&*seen)
        .fetch_all(sked_db::on(pool))
        .await?;
    let mut now = seen.clone();
    let mut found: HashMap<usize, i64> = HashMap::new();
    for (slot, n, kind, ids) in rows {
        let slot = usize::try_from(slot).unwrap_or_default();
        match kind {
            None => {
                if now.len() <= slot {
                    now.resize(slot + 1, 0);
                }
                now[slot] = n;
            }
            Some(kind) => {
                *found.entry(slot).or_default() += 1;
                batch.add(&kind, ids, max_tasks);
            }
        }
    }
    for (slot, &n) in now.iter().enumerate() {
        let before = seen.get(slot).copied().unwrap_or(0);
        let expected = n - before;
        if expected < 0 || found.get(&slot).copied().unwrap_or(0) < expected {
            batch.resync(LOST);
        }
    }
    *seen = now;
    Ok(())
}

/// The owners of rows of `table` (workflows or schedules) by id.
async fn owners(
    pool: &PgPool,
    table: &'static str,
    ids: &BTreeSet<Uuid>,
) -> Result<Vec<(Uuid, String)>, sqlx::Error> {
    let ids: Vec<Uuid> = ids.iter().copied().collect();
    let sql = format!("select id, owner from {table} where id = any($1)");
    sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(&ids)
        .fetch_all(sked_db::on(pool))
        .await
}

/// What the notifications of one batch window named.
#[derive(Debug, Default)]
struct Batch {
    tasks: BTreeSet<Uuid>,
    logs: BTreeSet<Uuid>,
    workflows: BTreeSet<Uuid>,
    schedules: BTreeSet<Uuid>,
    workers: bool,
    /// Set when the batch cannot be told event by event: every client gets `resync`.
    resync: Option<&'static str>,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.resync.is_none()
            && !self.workers
            && self.tasks.is_empty()
            && self.logs.is_empty()
            && self.workflows.is_empty()
            && self.schedules.is_empty()
    }

    fn resync(&mut self, reason: &'static str) {
        self.resync.get_or_insert(reason);
    }

    /// Adds one recorded change (`sql/events.sql`): its kind and ids, or no ids when the
    /// statement changed too many rows to name them. Unknown kinds are ignored, so that a newer
    /// schema can record more.
    fn add(&mut self, kind: &str, ids: Option<Vec<Uuid>>, max_tasks: usize) {
        if self.resync.is_some() {
            return;
        }
        if kind == "w" {
            self.workers = true;
            return;
        }
        let set = match kind {
            "t" => &mut self.tasks,
            "l" => &mut self.logs,
            "f" => &mut self.workflows,
            "s" => &mut self.schedules,
            _ => {
                tracing::debug!(kind, "live events: ignoring an unknown kind of change");
                return;
            }
        };
        match ids {
            Some(ids) => set.extend(ids),
            None => self.resync = Some(TOO_MANY),
        }
        if self.tasks.len() + self.logs.len() > max_tasks {
            self.resync = Some(TOO_MANY);
        }
    }
}

/// A batch as read from the database.
#[derive(Debug, Default)]
struct Resolved {
    tasks: Vec<TaskSummary>,
    /// Tasks with new log chunks, with their owners.
    logs: Vec<(Uuid, String)>,
    workflows: Vec<(Uuid, String)>,
    schedules: Vec<(Uuid, String)>,
    workers: bool,
}

impl Resolved {
    /// The frames for one audience: every owner's rows (`None`, an admin) or one owner's.
    fn frames(&self, owner: Option<&str>) -> Vec<Utf8Bytes> {
        let sees = |o: &str| owner.is_none_or(|me| me == o);
        let owned = |rows: &[(Uuid, String)]| -> Vec<Uuid> {
            rows.iter()
                .filter(|(_, o)| sees(o))
                .map(|(id, _)| *id)
                .collect()
        };
        let mut frames = Vec::new();
        let tasks: Vec<TaskSummary> = self
            .tasks
            .iter()
            .filter(|t| sees(&t.owner))
            .cloned()
            .collect();
        if !tasks.is_empty() {
            frames.push(frame(&ServerEvent::Tasks { tasks }));
        }
        let tasks = owned(&self.logs);
        if !tasks.is_empty() {
            frames.push(frame(&ServerEvent::Logs { tasks }));
        }
        let ids = owned(&self.workflows);
        if !ids.is_empty() {
            frames.push(frame(&ServerEvent::Workflows { ids }));
        }
        let ids = owned(&self.schedules);
        if !ids.is_empty() {
            frames.push(frame(&ServerEvent::Schedules { ids }));
        }
        if self.workers {
            frames.push(frame(&ServerEvent::Workers));
        }
        frames
    }
}

fn frame(event: &ServerEvent) -> Utf8Bytes {
    serde_json::to_string(event)
        .expect("server events serialize")
        .into()
}

/// A row of `sked.tasks_summary`.
#[derive(Debug, sqlx::FromRow)]
struct SummaryRow {
    id: Uuid,
    owner: String,
    queue: String,
    priority: i32,
    #[sqlx(try_from = "Text<TaskKind>")]
    kind: TaskKind,
    argv: Vec<String>,
    #[sqlx(try_from = "Text<TaskState>")]
    state: TaskState,
    attempt: i32,
    max_attempts: i32,
    next_run_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    exit_code: Option<i32>,
    worker_id: Option<Uuid>,
    cancel_requested: bool,
    workflow_id: Option<Uuid>,
    name: Option<String>,
    shard_of: Option<Uuid>,
}

impl SummaryRow {
    fn into_summary(self) -> TaskSummary {
        let (argv, argv_cut, argv_bytes) = argv_preview(self.argv);
        TaskSummary {
            state: self.state,
            id: self.id,
            owner: self.owner,
            queue: self.queue,
            priority: self.priority,
            kind: self.kind,
            argv,
            argv_cut,
            argv_bytes,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            next_run_at: self.next_run_at,
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            exit_code: self.exit_code,
            worker_id: self.worker_id,
            cancel_requested: self.cancel_requested,
            workflow_id: self.workflow_id,
            name: self.name,
            shard_of: self.shard_of,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    #[test]
    fn recorded_changes_fill_a_batch() {
        let mut b = Batch::default();
        b.add("t", Some(vec![id(1), id(2)]), 1000);
        b.add("l", Some(vec![id(1)]), 1000);
        b.add("f", Some(vec![id(3)]), 1000);
        b.add("s", Some(vec![id(4)]), 1000);
        b.add("w", None, 1000);
        b.add("x", Some(vec![id(5)]), 1000);
        assert_eq!(b.tasks, BTreeSet::from([id(1), id(2)]));
        assert_eq!(b.logs, BTreeSet::from([id(1)]));
        assert_eq!(b.workflows, BTreeSet::from([id(3)]));
        assert_eq!(b.schedules, BTreeSet::from([id(4)]));
        assert!(b.workers);
        assert_eq!(b.resync, None, "unknown kinds are ignored");
    }

    #[test]
    fn a_change_without_ids_or_too_many_tasks_make_a_resync() {
        let mut b = Batch::default();
        b.add("s", None, 1000);
        assert_eq!(b.resync, Some(TOO_MANY));
        let mut b = Batch::default();
        b.add("t", Some((0..3).map(id).collect()), 2);
        assert_eq!(b.resync, Some(TOO_MANY), "3 tasks exceed a limit of 2");
    }

    #[test]
    fn a_user_sees_only_its_owners_rows() {
        let resolved = Resolved {
            logs: vec![(id(1), "alice".into()), (id(2), "bob".into())],
            schedules: vec![(id(3), "bob".into())],
            workers: true,
            ..Resolved::default()
        };
        let text = |frames: Vec<Utf8Bytes>| -> Vec<String> {
            frames.iter().map(|f| f.as_str().to_owned()).collect()
        };
        let alice = text(resolved.frames(Some("alice")));
        assert_eq!(alice.len(), 2, "logs and workers: {alice:?}");
        assert!(alice[0].contains(&id(1).to_string()) && !alice[0].contains(&id(2).to_string()));
        let admin = text(resolved.frames(None));
        assert_eq!(admin.len(), 3, "logs, schedules and workers: {admin:?}");
    }
}
