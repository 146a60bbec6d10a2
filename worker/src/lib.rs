//! The sked worker: claims tasks from Postgres and runs them.
//!
//! One main loop (`Worker::run`, a single `select!`) owns claiming: it claims in batches up to
//! its free slots whenever something may be due — a notification on `sked_tasks`, a slot
//! freed while the queue was saturated, the poll timer (the truth when notifications are
//! lost), or the due time of the next delayed task. Each claimed attempt runs in its own
//! tokio task (`executor`); results go to the batching `completer`; output goes to the `logs`
//! writer. The `heartbeat` service renews all leases with one statement and stops attempts
//! whose cancel was requested or whose lease was lost; the `LeaseGuard` stops an attempt whose
//! lease could not be renewed before that lease ends. The worker's background upkeep
//! ([`upkeep`], run by `sked_db::upkeep`) rescues tasks of dead workers, reconciles services
//! and fires cron ticks.

pub mod artifact;
pub mod capacity;
pub mod completer;
pub mod config;
pub mod confined;
pub mod executor;
pub mod heartbeat;
pub mod isolation;
pub mod logs;
pub mod narrow;
pub mod process;
pub mod runner;
pub mod sanitize;
pub mod service;
pub mod spawn;
pub mod webhook;

pub use config::{WorkerArgs, WorkerConfig};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use sked_db::upkeep::{Duty, FiringConfig, Upkeep};
use sked_db::worker::{Position, Registration};
use sked_types::TaskKind;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use uuid::Uuid;

use runner::{Context, StopReason, Stopper};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Db(#[from] sked_db::DbError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Limits, users or task directories cannot be set up as configured.
    #[error("{0}")]
    Setup(String),
}

/// One attempt of a task: the task's id and the attempt's number. The worker keys every
/// attempt by both, so an attempt never stands for an older or newer one of the same task
/// (a task this worker lost and then claimed again, say).
pub type AttemptKey = (Uuid, i32);

/// An attempt this worker holds, from its claim until its result is written.
#[derive(Debug)]
pub struct Attempt {
    pub stopper: Arc<Stopper>,
    /// When the statement that last set the attempt's lease (its claim, then each renewal
    /// the database accepted) was sent: the lease lasts at least until this instant plus the
    /// lease duration, because the database counts it from its own later `now()`.
    pub renewed: Instant,
    /// The attempt's run has ended; its result waits to be written, and its lease is still
    /// renewed so that the result is not refused.
    pub ended: bool,
}

/// The attempts this worker holds. The main loop inserts an entry at the claim, the attempt
/// marks it ended when its run ends, and `Slots::release` removes it once its result is
/// written (or given up); the heartbeat and the lease guard only update `renewed` and stop
/// attempts.
pub type Running = Arc<Mutex<HashMap<AttemptKey, Attempt>>>;

/// The worker's slots and capacity: an attempt holds one slot, and the CPU and memory its
/// task requested, from its claim until its result is written, so a worker never has more
/// than `concurrency` attempts running or waiting to be written, never holds more than its
/// capacity, and claims never outrun the database's acknowledgements.
#[derive(Debug, Default)]
pub struct Slots {
    held: std::sync::Mutex<Held>,
    /// The attempts holding the slots that have started (a claimed attempt enters it when it
    /// is spawned); releasing a slot removes its attempt.
    running: Running,
    /// Set when a released attempt had requested CPU or memory: a task that did not fit may
    /// fit now.
    freed_capacity: std::sync::atomic::AtomicBool,
    /// Notified whenever slots are released.
    pub released: Notify,
}

#[derive(Debug, Default)]
struct Held {
    slots: usize,
    cpu_millis: u64,
    memory_mb: u64,
    /// The requests of the held attempts that have any.
    requests: HashMap<AttemptKey, (u64, u64)>,
    /// The held attempts of preemptible tasks not yet chosen to make room.
    preemptible: HashMap<AttemptKey, Preemptible>,
    /// Counts claims, to order attempts by their start.
    claims: u64,
}

/// A held attempt that may be stopped to make room for a copy of a service.
#[derive(Debug, Clone, Copy)]
struct Preemptible {
    priority: i32,
    /// When it was claimed, in the order of this worker's claims.
    claimed: u64,
    cpu_millis: u64,
    memory_mb: u64,
}

impl Slots {
    pub fn held(&self) -> usize {
        self.held.lock().expect("slots").slots
    }

    /// The CPU millicores and memory MB the held attempts requested.
    pub fn held_capacity(&self) -> (u64, u64) {
        let held = self.held.lock().expect("slots");
        (held.cpu_millis, held.memory_mb)
    }

    /// Takes a slot for each claimed task, and the capacity it requested.
    fn take(&self, tasks: &[sked_db::worker::Claimed]) {
        let mut held = self.held.lock().expect("slots");
        held.slots += tasks.len();
        busy_slots(held.slots);
        held.claims += 1;
        let claimed = held.claims;
        for t in tasks {
            let cpu = t.cpu_millis.unwrap_or(0).max(0) as u64;
            let mem = t.memory_mb.unwrap_or(0).max(0) as u64;
            if t.cpu_millis.is_some() || t.memory_mb.is_some() {
                held.cpu_millis += cpu;
                held.memory_mb += mem;
                held.requests.insert((t.id, t.attempt), (cpu, mem));
            }
            if t.preemptible {
                let p = Preemptible {
                    priority: t.priority,
                    claimed,
                    cpu_millis: cpu,
                    memory_mb: mem,
                };
                held.preemptible.insert((t.id, t.attempt), p);
            }
        }
    }

    /// True while the worker runs a preemptible attempt not yet chosen to make room.
    fn has_preemptible(&self) -> bool {
        !self.held.lock().expect("slots").preemptible.is_empty()
    }

    /// The CPU and memory a copy of a service could have here if every preemptible attempt
    /// stopped: the free capacity plus what those attempts hold, in the dimensions the worker
    /// advertises (`None`: unbounded).
    fn reclaimable(&self, capacity: capacity::Capacity) -> sked_db::worker::Free {
        let held = self.held.lock().expect("slots");
        let (cpu, mem) = held
            .preemptible
            .values()
            .fold((0, 0), |(c, m), p| (c + p.cpu_millis, m + p.memory_mb));
        sked_db::worker::Free {
            cpu_millis: capacity
                .cpu_millis
                .map(|c| (c as u64).saturating_sub(held.cpu_millis.saturating_sub(cpu)) as i32),
            memory_mb: capacity
                .memory_mb
                .map(|m| (m as u64).saturating_sub(held.memory_mb.saturating_sub(mem)) as i32),
        }
    }

    /// Chooses the preemptible attempts to stop so that `copy` fits in a slot and in the
    /// capacity: as few as needed, lowest priority first, then the most recently claimed.
    /// They are no longer offered for later copies. `None` (and nothing chosen) when even
    /// all of them would not make room.
    fn make_room(
        &self,
        copy: &sked_db::worker::Claimed,
        concurrency: usize,
        capacity: capacity::Capacity,
    ) -> Option<Vec<AttemptKey>> {
        let mut held = self.held.lock().expect("slots");
        let mut candidates: Vec<(AttemptKey, Preemptible)> =
            held.preemptible.iter().map(|(id, p)| (*id, *p)).collect();
        candidates.sort_by_key(|(_, p)| (p.priority, std::cmp::Reverse(p.claimed)));
        let want_cpu = copy.cpu_millis.unwrap_or(0).max(0) as u64;
        let want_mem = copy.memory_mb.unwrap_or(0).max(0) as u64;
        let (mut slots, mut cpu, mut mem) = (held.slots, held.cpu_millis, held.memory_mb);
        let fits = |slots: usize, cpu: u64, mem: u64| {
            slots < concurrency
                && capacity
                    .cpu_millis
                    .is_none_or(|c| cpu + want_cpu <= c as u64)
                && capacity
                    .memory_mb
                    .is_none_or(|m| mem + want_mem <= m as u64)
        };
        let mut chosen = Vec::new();
        let mut candidates = candidates.into_iter();
        while !fits(slots, cpu, mem) {
            let (id, p) = candidates.next()?;
            slots -= 1;
            cpu -= p.cpu_millis;
            mem -= p.memory_mb;
            chosen.push(id);
        }
        for id in &chosen {
            held.preemptible.remove(id);
        }
        Some(chosen)
    }

    /// Releases the slots (and capacity) of these attempts, and forgets them: their leases
    /// are no longer renewed.
    pub fn release(&self, attempts: impl IntoIterator<Item = AttemptKey>) {
        let mut freed = false;
        let attempts: Vec<AttemptKey> = attempts.into_iter().collect();
        {
            let mut held = self.held.lock().expect("slots");
            for key in &attempts {
                held.slots = held.slots.saturating_sub(1);
                held.preemptible.remove(key);
                if let Some((cpu, mem)) = held.requests.remove(key) {
                    held.cpu_millis -= cpu;
                    held.memory_mb -= mem;
                    freed = true;
                }
            }
            busy_slots(held.slots);
        }
        {
            let mut running = self.running.lock().expect("running map");
            for key in &attempts {
                running.remove(key);
            }
        }
        if freed {
            self.freed_capacity
                .store(true, std::sync::atomic::Ordering::Release);
        }
        self.released.notify_one();
    }

    /// True once after attempts that requested CPU or memory released it.
    fn take_freed_capacity(&self) -> bool {
        self.freed_capacity
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    }
}

fn busy_slots(held: usize) {
    sked_db::metrics::metrics()
        .worker_slots_busy
        .set(i64::try_from(held).unwrap_or(i64::MAX));
}

/// A claim's size, and how late each task it took started (its due time to the claim).
fn observe_claim(claim: &sked_db::worker::Claim) {
    let metrics = sked_db::metrics::metrics();
    if claim.tasks.is_empty() {
        return;
    }
    metrics.claim_batch_size.observe(claim.tasks.len() as f64);
    for task in &claim.tasks {
        if let Some(due) = task.next_run_at {
            let late = (claim.at - due).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6;
            metrics
                .task_lateness
                .get_or_create(&sked_db::metrics::QueueLabel {
                    queue: task.queue.clone(),
                })
                .observe(late.max(0.0));
        }
    }
}

/// Marks an attempt's run as ended when dropped: from then on the lease guard has no
/// process to stop, and the heartbeat renews its lease until the completer has written its
/// result. An attempt that panicked sends no result, so its slot, capacity and entry are
/// released here; its task comes back when its lease expires.
struct RunEnded(AttemptKey, Arc<Slots>);

impl Drop for RunEnded {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.1.release([self.0]);
        } else if let Ok(mut running) = self.1.running.lock()
            && let Some(attempt) = running.get_mut(&self.0)
        {
            attempt.ended = true;
        }
    }
}

/// Most tasks claimed by one statement.
const MAX_CLAIM: usize = 1000;

/// Longest a worker with free slots defers a claim to gather a batch.
const CLAIM_WINDOW: Duration = Duration::from_millis(5);

/// A claim from the front of the queue that takes less than this is made every time.
const CHEAP_CLAIM: Duration = Duration::from_millis(5);

/// Otherwise claims from the front are spaced so that they take at most one part in this of
/// the worker's time, and the claims between them start from a position.
const FRONT_CLAIM_SPACING: u32 = 20;

/// Where a worker of one queue starts its claims ("Positions" at `sked.tasks_claim`): from
/// the front of the queue while a claim from there costs little, as it does when vacuum
/// keeps up; when one costs more (the entries of claimed tasks pile up in the claim index
/// while an old snapshot is open), from the position of the last task taken, with a claim
/// from the front at least every [`FRONT_CLAIM_SPACING`] times as long as one takes, which
/// finds what a claim from a position passes over (a more urgent task it does find).
struct Positions {
    /// Whether the worker claims from one queue, the only claims that take a position.
    enabled: bool,
    /// The position of the last task taken.
    last: Option<Position>,
    /// The next claim from the front is not made before this.
    front_at: Instant,
    /// A claim from a position took fewer tasks than it asked for: what it passed over may
    /// be due, so a claim from the front is wished for at `front_at`.
    front_wanted: bool,
}

impl Positions {
    fn new(queues: usize) -> Positions {
        Positions {
            enabled: queues == 1,
            last: None,
            front_at: Instant::now(),
            front_wanted: false,
        }
    }

    /// The position the next claim starts after; `None`: from the front.
    fn start(&self) -> Option<Position> {
        self.last
            .filter(|_| self.enabled && Instant::now() < self.front_at)
    }

    /// Learns from a claim that started at `start`, took `took` and asked for more than it
    /// got when `short`, whose last task was at `last`.
    fn claimed(
        &mut self,
        start: Option<Position>,
        took: Duration,
        short: bool,
        last: Option<Position>,
    ) {
        if !self.enabled {
            return;
        }
        self.last = last.or(self.last);
        if start.is_some() {
            self.front_wanted |= short;
        } else {
            self.front_wanted = false;
            self.front_at = Instant::now()
                + if took < CHEAP_CLAIM {
                    Duration::ZERO
                } else {
                    took * FRONT_CLAIM_SPACING
                };
        }
    }

    /// When a claim from the front is wished for.
    fn front_due(&self) -> Option<Instant> {
        self.front_wanted.then_some(self.front_at)
    }
}

/// When the main loop claims: what it has learnt from the last claim and the timers.
struct Pace {
    /// Something may be due: a notification, a freed slot, the poll, a due time.
    want_claim: bool,
    /// The last claim filled every slot it asked for: more may be due right now.
    saturated: bool,
    /// When the next delayed task (or rate-limited start) is due, asked after a claim that
    /// did not fill its slots.
    next_due: Option<Instant>,
    /// `next_due` is the database's answer since which nothing has woken the worker: a claim
    /// of the poll that took nothing leaves it as it is instead of asking again (a task that
    /// became due sooner came with a notification, which clears this).
    due_known: bool,
    next_poll: Instant,
    /// Claims wait until a quarter of the slots is free (`batch`), or at most CLAIM_WINDOW
    /// after the first wish to claim: a busy worker claims in batches, not one task per slot.
    claim_at: Option<Instant>,
    batch: usize,
    /// Set at each poll: look for a copy of a service to make room for.
    want_preempt: bool,
    /// A claim failed: it may have taken tasks whose answer never arrived.
    lost_claim: Option<String>,
    positions: Positions,
}

impl Pace {
    fn new(poll: Duration, concurrency: usize, queues: usize) -> Pace {
        Pace {
            want_claim: true,
            saturated: false,
            next_due: None,
            due_known: false,
            next_poll: Instant::now() + poll,
            claim_at: None,
            batch: (concurrency / 4).clamp(1, MAX_CLAIM / 4),
            want_preempt: false,
            lost_claim: None,
            positions: Positions::new(queues),
        }
    }

    /// Whether to claim now with `free` slots: once a batch is free or the window since the
    /// first wish is over (which it starts). A claim it allows ends the wish.
    fn claim_now(&mut self, free: usize) -> bool {
        let window_over = self.claim_at.is_some_and(|at| at <= Instant::now());
        if free < self.batch && !window_over {
            self.claim_at
                .get_or_insert_with(|| Instant::now() + CLAIM_WINDOW);
            return false;
        }
        self.want_claim = false;
        self.claim_at = None;
        true
    }

    /// When the loop must wake up at the latest: the poll, the next due time, the end of the
    /// claim window.
    fn wake_at(&self) -> Instant {
        [self.next_due, self.claim_at, self.positions.front_due()]
            .into_iter()
            .flatten()
            .fold(self.next_poll, Instant::min)
    }

    /// The wake-up time has come: the poll (a claim, a look for room for a service's copy,
    /// and the next poll after `poll`) or a due time (a claim).
    fn timer(&mut self, poll: Duration) {
        let now = Instant::now();
        if self.next_poll <= now {
            self.want_claim = true;
            self.want_preempt = true;
            self.next_poll = now + poll;
        }
        if self.next_due.is_some_and(|due| due <= now) {
            self.want_claim = true;
            self.next_due = None;
            self.due_known = false;
        }
        if self.positions.front_due().is_some_and(|due| due <= now) {
            // The next claim, whenever a slot lets it, starts from the front.
            self.want_claim = true;
            self.positions.front_wanted = false;
        }
        // The claim window's end needs nothing more: the claim is still wished for.
    }
}

/// Runs a worker until `shutdown` is cancelled, then stops claiming, lets running tasks
/// finish within the grace period, kills and hands back the rest, and deregisters.
pub async fn run(
    pool: PgPool,
    config: WorkerConfig,
    shutdown: CancellationToken,
) -> Result<(), WorkerError> {
    run_with(pool, config, shutdown, Upkeep::new()).await
}

/// [`run`], with the duties of `also` (another part of this process's, each over its own
/// pool) in the worker's upkeep loop, so that the process runs one.
pub async fn run_with(
    pool: PgPool,
    config: WorkerConfig,
    shutdown: CancellationToken,
    also: Upkeep,
) -> Result<(), WorkerError> {
    sked_db::check_schema(&pool).await?;
    forbid_inspection();
    let worker = Worker::start(pool, config, also).await?;
    let span = worker.span.clone();
    worker.run(shutdown).instrument(span).await
}

/// The worker's duties of background upkeep (`sked_db::upkeep`), over `pool`: the rescue of
/// expired leases and the reconcile of services every poll interval (at most a second; a run
/// given up after a third of the lease), the fold of finishes into their rollups
/// (`sql/finishes.sql`) every 5 s, and, unless `--fire-schedules false`, cron firing and the
/// trimming of schedules' runs.
pub fn upkeep(pool: &PgPool, config: &WorkerConfig) -> Upkeep {
    let every = config.poll_interval.min(Duration::from_secs(1));
    let limit = config.lease / 3;
    let upkeep = Upkeep::new()
        .with(Duty::Rescue { every, limit }, pool)
        .with(Duty::ReconcileServices { every, limit }, pool)
        .with(Duty::FoldFinishes, pool);
    if config.fire_schedules {
        upkeep
            .with(Duty::FireSchedules(FiringConfig::default()), pool)
            .with(Duty::PruneScheduleRuns, pool)
    } else {
        upkeep
    }
}

/// Makes this process non-dumpable: a task running as the worker's own user (a worker not
/// running as root) can then neither read `/proc/<worker>/environ`, `mem` or `fd/`, where the
/// database URL and its password are, nor attach to the worker with ptrace. The tasks
/// themselves are dumpable again: `execve` resets the flag.
fn forbid_inspection() {
    // SAFETY: PR_SET_DUMPABLE takes plain integers and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(),
            "could not make the worker non-dumpable: tasks running as its user may read its environment");
    }
}

struct Worker {
    id: Uuid,
    pool: PgPool,
    config: WorkerConfig,
    ctx: Arc<Context>,
    running: Running,
    wake: Arc<Notify>,
    done: tokio::sync::mpsc::UnboundedSender<sked_db::worker::Finished>,
    slots: Arc<Slots>,
    completer: tokio::task::JoinHandle<()>,
    logs: tokio::task::JoinHandle<()>,
    services_stop: CancellationToken,
    services: Vec<tokio::task::JoinHandle<()>>,
    /// `worker{worker=<name>}`: the span of everything the worker logs outside attempts.
    span: tracing::Span,
    /// The worker's name, a field of each attempt's span.
    name: String,
    /// How many live workers serve a queue of this one, itself included (from each
    /// heartbeat): they share the poll, which each makes that many times less often.
    peers: Arc<std::sync::atomic::AtomicUsize>,
}

impl Worker {
    async fn start(
        pool: PgPool,
        config: WorkerConfig,
        also: Upkeep,
    ) -> Result<Worker, WorkerError> {
        let id = Uuid::new_v4();
        let host = hostname::get()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".into());
        let pid = std::process::id() as i32;
        let config = config.checked().map_err(WorkerError::Setup)?;
        let registration = Registration {
            id,
            name: config
                .name
                .clone()
                .unwrap_or_else(|| format!("{host}:{pid}")),
            host,
            pid,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            queues: config.queues.clone(),
            labels: config.labels.clone(),
            concurrency: config.concurrency as i32,
            lease: config.lease,
            cpu_millis: config.capacity.cpu_millis.map(|c| c as i32),
            memory_mb: config.capacity.memory_mb.map(|m| m as i32),
        };
        // Limits, task directories, users: set up (and logged) before the worker registers.
        let runtime = isolation::Runtime::start(config.isolation.clone(), &config.work_dir, id)
            .map_err(WorkerError::Setup)?;
        let artifacts =
            artifact::Artifacts::start(pool.clone(), &config.work_dir, config.artifacts.clone())
                .map_err(WorkerError::Setup)?;
        // Tasks reach the API with their attempt's token, minted from the key loaded once.
        let spawn = match &config.api_url {
            Some(url) => Some(runner::SpawnApi {
                url: url.clone(),
                key: sked_db::task_token::load(sked_db::on(&pool)).await?,
            }),
            None => None,
        };
        sked_db::worker::register(&pool, &registration).await?;
        sked_db::metrics::metrics()
            .worker_slots
            .set(i64::try_from(config.concurrency).unwrap_or(i64::MAX));
        tracing::info!(worker_id = %id, worker = %registration.name, queues = ?config.queues,
            concurrency = config.concurrency, cpu_millis = ?config.capacity.cpu_millis,
            memory_mb = ?config.capacity.memory_mb, "worker started");

        let span = tracing::info_span!("worker", worker = %registration.name);
        let name = registration.name.clone();
        // The writers' and services' tasks log in the worker's span.
        let _in_span = span.enter();
        let (logs_handle, logs_writer) = logs::start(pool.clone(), config.log_flush);
        let slots = Arc::new(Slots::default());
        let (done, completer) = completer::start(pool.clone(), slots.clone());
        let ctx = Arc::new(Context {
            pool: pool.clone(),
            logs: logs_handle,
            artifacts,
            runtime,
            kill_grace: config.kill_grace,
            tail_bytes: config.tail_bytes,
            spawn,
        });
        let running = slots.running.clone();
        let wake = Arc::new(Notify::new());
        let cancel_check = Arc::new(Notify::new());
        let services_stop = CancellationToken::new();
        let peers = Arc::new(std::sync::atomic::AtomicUsize::new(1));
        let hb = heartbeat::Heartbeat {
            pool: pool.clone(),
            registration,
            running: running.clone(),
            peers: peers.clone(),
            wake_when_due: (!sked_db::listen::possible()).then(|| wake.clone()),
        };
        // One loop for the background upkeep of this process: the worker's duties, and those
        // of other parts of the process (`also`). Rescued tasks and new copies wake the claim.
        // The workers that share this one's queues share the duties too.
        let upkeep = upkeep(&pool, &config)
            .waking(wake.clone())
            .and(also)
            .shared_by(peers.clone());
        let services = vec![
            tokio::spawn(
                heartbeat::listen(
                    pool.clone(),
                    config.queues.clone(),
                    wake.clone(),
                    cancel_check.clone(),
                    running.clone(),
                    services_stop.clone(),
                )
                .in_current_span(),
            ),
            tokio::spawn(
                hb.run(cancel_check, services_stop.clone())
                    .in_current_span(),
            ),
            tokio::spawn(
                heartbeat::LeaseGuard {
                    running: running.clone(),
                    lease: config.lease,
                    stop_before: config.stop_before_lease_end(),
                }
                .run(services_stop.clone())
                .in_current_span(),
            ),
            tokio::spawn(upkeep.run(services_stop.clone()).in_current_span()),
        ];
        drop(_in_span);
        Ok(Worker {
            id,
            pool,
            config,
            ctx,
            running,
            wake,
            done,
            slots,
            completer,
            logs: logs_writer,
            services_stop,
            services,
            span,
            name,
            peers,
        })
    }

    async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let mut tasks: JoinSet<()> = JoinSet::new();
        let mut pace = Pace::new(
            self.jittered_poll(),
            self.config.concurrency,
            self.config.queues.len(),
        );
        loop {
            if std::mem::take(&mut pace.want_preempt) && self.slots.has_preemptible() {
                self.preempt(&mut tasks).await;
            }
            if self.claim_if_due(&mut pace, &mut tasks).await {
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(joined) = tasks.join_next(), if !tasks.is_empty() => {
                    self.reap(joined);
                    // Reap every other ended attempt too: each holds its task row until then.
                    while let Some(joined) = tasks.try_join_next() {
                        self.reap(joined);
                    }
                }
                _ = self.slots.released.notified() => {
                    // Freed CPU or memory may let a task fit that did not.
                    pace.want_claim |= pace.saturated | self.slots.take_freed_capacity();
                }
                _ = self.wake.notified() => {
                    pace.want_claim = true;
                    pace.due_known = false;
                }
                _ = tokio::time::sleep_until(pace.wake_at()) => pace.timer(self.jittered_poll()),
            }
        }
        self.shut_down(tasks).await
    }

    /// Claims when the pace says so and a slot is free: first settles a claim whose answer
    /// was lost, then claims up to the free slots (in batches: see [`Pace`]). True when it
    /// should be asked again at once (the claim filled what it asked for, or took tasks with
    /// requests or copies of services, which a claim takes alone or as a prefix).
    async fn claim_if_due(&self, pace: &mut Pace, tasks: &mut JoinSet<()>) -> bool {
        let free = self.config.concurrency.saturating_sub(self.slots.held());
        if !pace.want_claim || free == 0 {
            return false;
        }
        if let Some(error) = &pace.lost_claim {
            // Settled before the next claim, at the claims' pace.
            if self.hand_back_lost(error).await {
                pace.lost_claim = None;
            } else {
                pace.want_claim = false;
                return false;
            }
        }
        if !pace.claim_now(free) {
            return false;
        }
        let asked = free.min(MAX_CLAIM);
        let sent = Instant::now();
        let start = pace.positions.start();
        match sked_db::worker::claim_after(
            &self.pool,
            self.id,
            &self.config.queues,
            &self.config.labels,
            asked as i32,
            self.config.lease,
            self.free_capacity(),
            start,
        )
        .await
        {
            Ok(claim) => {
                pace.positions.claimed(
                    start,
                    sent.elapsed(),
                    claim.tasks.len() < asked,
                    claim.last,
                );
                // A claim that took tasks with requests may have stopped at the first one
                // that overflowed the free capacity (the claim takes a prefix): claim again
                // at once with what is left. A claim that took copies of services took them
                // alone (services first): claim again at once for the other tasks.
                let took_requests = claim.tasks.iter().any(|t| {
                    t.cpu_millis.is_some() || t.memory_mb.is_some() || t.kind == TaskKind::Service
                });
                pace.saturated = claim.tasks.len() == asked || took_requests;
                observe_claim(&claim);
                self.slots.take(&claim.tasks);
                let took_none = claim.tasks.is_empty();
                for row in claim.tasks {
                    self.spawn(tasks, row, sent, Vec::new());
                }
                if pace.saturated {
                    pace.want_claim = self.slots.held() < self.config.concurrency;
                    pace.next_due = None;
                    pace.due_known = false;
                } else if !(took_none && pace.due_known) {
                    (pace.next_due, pace.due_known) = match self.next_due(claim.at).await {
                        Ok(due) => (due, true),
                        Err(()) => (None, false),
                    };
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "claiming failed; retrying at the next poll");
                pace.lost_claim = Some(e.to_string());
                pace.saturated = false;
                pace.due_known = false;
            }
        }
        pace.want_claim
    }

    /// Services first: claims a copy of a service that no worker had room for, when stopping
    /// some of this worker's preemptible attempts makes room (`sked.copies_claim_preempting`),
    /// stops them and starts the copy once they have ended.
    async fn preempt(&self, tasks: &mut JoinSet<()>) {
        let reclaimable = self.slots.reclaimable(self.config.capacity);
        let sent = Instant::now();
        let copy = match sked_db::worker::claim_copy_preempting(
            &self.pool,
            self.id,
            &self.config.queues,
            &self.config.labels,
            self.config.lease,
            reclaimable,
        )
        .await
        {
            Ok(Some(copy)) => copy,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "looking for a copy of a service to make room for failed");
                return;
            }
        };
        let victims = self
            .slots
            .make_room(&copy, self.config.concurrency, self.config.capacity);
        self.slots.take(std::slice::from_ref(&copy));
        let Some(victims) = victims else {
            // The attempts it counted on ended meanwhile and others took their place: hand
            // the copy back, uncharged, for a worker with room.
            tracing::info!(copy = %copy.id, "no room for the copy of a service after all; handing it back");
            let _ = self.done.send(sked_db::worker::Finished::handed_back(
                copy.id,
                copy.attempt,
                "the worker had no room for it after all".to_owned(),
            ));
            return;
        };
        {
            let running = self.running.lock().expect("running map");
            for key in &victims {
                if let Some(attempt) = running.get(key) {
                    attempt.stopper.stop(StopReason::Preempted(copy.id));
                }
            }
        }
        tracing::info!(copy = %copy.id, stopped = ?victims,
            "preempting tasks to make room for a copy of a service");
        self.spawn(tasks, copy, sent, victims);
    }

    /// After a claim that failed: the claim may have taken tasks for this worker whose answer
    /// never arrived (the connection broke after the commit, or the claim timed out). Every
    /// attempt this worker started is in its running map from its claim until its result is
    /// written, so the database's other attempts for it are the lost claim's: they are handed
    /// back uncharged ('interrupted') and wait again, instead of waiting for their leases to
    /// expire and being charged as lost. True once settled; false when the database could
    /// not be asked, to try again before the next claim.
    async fn hand_back_lost(&self, claim_error: &str) -> bool {
        let theirs = match sked_db::worker::attempts_of(&self.pool, self.id).await {
            Ok(attempts) => attempts,
            Err(e) => {
                tracing::warn!(error = %e, "asking which tasks a failed claim took failed; asking again before the next claim");
                return false;
            }
        };
        let lost: Vec<sked_db::worker::Finished> = {
            let running = self.running.lock().expect("running map");
            theirs
                .into_iter()
                .filter(|key| !running.contains_key(key))
                .map(|(id, attempt)| {
                    sked_db::worker::Finished::handed_back(
                        id,
                        attempt,
                        format!("the answer to the claim that took it was lost ({claim_error})"),
                    )
                })
                .collect()
        };
        if lost.is_empty() {
            return true;
        }
        // Written here, not by the completer: these attempts hold no slot to release.
        match sked_db::worker::finish(&self.pool, &lost).await {
            Ok(_) => {
                let ids: Vec<Uuid> = lost.iter().map(|f| f.id).collect();
                tracing::warn!(tasks = ?ids, "handed back the tasks a claim took whose answer was lost");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "handing back the tasks of a lost claim failed; trying again before the next claim");
                false
            }
        }
    }

    /// Runs a claimed attempt in its own task; it starts once the attempts in `after` (those
    /// stopped to make room for it) have ended, or after the kill grace period and 10 s more.
    /// `claim_sent` is when the claim that took it was sent: its lease runs from then.
    fn spawn(
        &self,
        tasks: &mut JoinSet<()>,
        row: sked_db::worker::Claimed,
        claim_sent: Instant,
        after: Vec<AttemptKey>,
    ) {
        let stopper = Arc::new(Stopper::default());
        let key = (row.id, row.attempt);
        self.running.lock().expect("running map").insert(
            key,
            Attempt {
                stopper: stopper.clone(),
                renewed: claim_sent,
                ended: false,
            },
        );
        let ctx = self.ctx.clone();
        let done = self.done.clone();
        let running = self.running.clone();
        let slots = self.slots.clone();
        let kill_grace = self.config.kill_grace;
        // An attempt's span stands alone (it names its worker): exported as a trace
        // (`--otlp-endpoint`), each attempt is one, rather than a part of the worker's life.
        // It ends with the attempt's outcome, an error's status for a failure or a timeout.
        let span = tracing::info_span!(parent: None, "task", task_id = %row.id,
            attempt = row.attempt, queue = %row.queue, worker = %self.name,
            outcome = tracing::field::Empty, "otel.status_code" = tracing::field::Empty);
        tasks.spawn(
            async move {
                if !after.is_empty() {
                    let deadline = Instant::now() + kill_grace + Duration::from_secs(10);
                    while Instant::now() < deadline
                        && after.iter().any(|key| {
                            running
                                .lock()
                                .expect("running map")
                                .get(key)
                                .is_some_and(|a| !a.ended)
                        })
                    {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                // Marks the run ended when the attempt ends, even by a panic; the result is
                // then the completer's.
                let ended = RunEnded(key, slots);
                tracing::debug!("attempt started");
                let started = Instant::now();
                let finished = executor::execute(&ctx, &row, stopper).await;
                drop(ended);
                let span = tracing::Span::current();
                span.record("outcome", finished.outcome.as_str());
                if matches!(
                    finished.outcome,
                    sked_db::worker::Outcome::Failed | sked_db::worker::Outcome::TimedOut
                ) {
                    span.record("otel.status_code", "ERROR");
                }
                sked_db::metrics::metrics().attempt_ended(
                    &row.queue,
                    finished.outcome.as_str(),
                    started.elapsed().as_secs_f64(),
                );
                let _ = done.send(finished);
            }
            .instrument(span),
        );
    }

    fn reap(&self, joined: Result<(), tokio::task::JoinError>) {
        if let Err(e) = joined {
            // A panic in an attempt is a bug; its task comes back when its lease expires. It
            // sent no result; its slot was released as it unwound (`RunEnded`).
            tracing::error!(error = %e, "an attempt's task panicked");
        }
    }

    /// The CPU and memory not held by running attempts, in the dimensions the worker
    /// advertises (`None`: unbounded).
    fn free_capacity(&self) -> sked_db::worker::Free {
        let (cpu, mem) = self.slots.held_capacity();
        let capacity = self.config.capacity;
        sked_db::worker::Free {
            cpu_millis: capacity
                .cpu_millis
                .map(|c| (c as u64).saturating_sub(cpu) as i32),
            memory_mb: capacity
                .memory_mb
                .map(|m| (m as u64).saturating_sub(mem) as i32),
        }
    }

    /// When to claim next for delayed tasks: when the earliest task due from the last claim's
    /// time on (`claimed_at`, on the database clock) is due. The wait is measured on the
    /// database clock and counted from the answer's arrival, so the wake-up is late by the
    /// answer's way back and the timer's millisecond, and never early. A task that became due
    /// between the claim and this question is due at once. Tasks due before the claim that it
    /// did not take (another worker's, labels this worker lacks) are left to the poll, which
    /// keeps a worker from spinning on them. `None` when nothing is scheduled.
    /// `Err` when the database could not be asked.
    async fn next_due(
        &self,
        claimed_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<Instant>, ()> {
        match sked_db::worker::next_due_from(&self.pool, &self.config.queues, claimed_at).await {
            Ok(Some(secs)) => Ok(Duration::try_from_secs_f64(secs.clamp(0.0, 86_400.0))
                .ok()
                .map(|wait| Instant::now() + wait)),
            Ok(None) => Ok(None),
            Err(e) => {
                tracing::warn!(error = %e, "reading the next due time failed");
                Err(())
            }
        }
    }

    /// The time until the next poll: the poll interval times the number of live workers that
    /// share this one's queues (each polls that many times less often, so together they poll
    /// about once an interval, and an idle worker's polls cost less as workers are added),
    /// drawn from 0.9 to 1.1 times that alone, and from 0.5 to 1.5 times that when shared,
    /// so that the workers take turns.
    fn jittered_poll(&self) -> Duration {
        let peers = self
            .peers
            .load(std::sync::atomic::Ordering::Relaxed)
            .clamp(1, u32::MAX as usize) as u32;
        let spread = if peers > 1 { 0.5..1.5 } else { 0.9..1.1 };
        (self.config.poll_interval * peers).mul_f64(rand::rng().random_range(spread))
    }

    async fn shut_down(self, mut tasks: JoinSet<()>) -> Result<(), WorkerError> {
        tracing::info!(running = tasks.len(), grace = ?self.config.shutdown_grace,
            "shutting down: no more claims; waiting for running tasks");
        if let Err(e) = sked_db::worker::mark_stopping(&self.pool, self.id).await {
            tracing::warn!(error = %e, "could not mark the worker as stopping");
        }
        let deadline = Instant::now() + self.config.shutdown_grace;
        while !tasks.is_empty() {
            tokio::select! {
                Some(joined) = tasks.join_next() => self.reap(joined),
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        if !tasks.is_empty() {
            tracing::info!(
                running = tasks.len(),
                "grace period over: stopping and handing back the remaining tasks"
            );
            for attempt in self.running.lock().expect("running map").values() {
                attempt.stopper.stop(StopReason::Shutdown);
            }
            while let Some(joined) = tasks.join_next().await {
                self.reap(joined);
            }
        }
        let Worker {
            id,
            pool,
            ctx,
            done,
            completer,
            logs,
            services_stop,
            services,
            ..
        } = self;
        drop(done);
        let _ = completer.await;
        drop(ctx);
        let _ = logs.await;
        services_stop.cancel();
        for s in services {
            let _ = s.await;
        }
        sked_db::worker::deregister(&pool, id).await?;
        tracing::info!(worker_id = %id, "worker stopped");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(id: u128) -> Position {
        Position {
            priority: 0,
            next_run_at: chrono::DateTime::UNIX_EPOCH,
            id: uuid::Uuid::from_u128(id),
        }
    }

    #[test]
    fn claims_start_from_the_front_while_that_is_cheap() {
        let mut p = Positions::new(1);
        assert_eq!(p.start(), None, "the first claim starts from the front");
        p.claimed(None, Duration::from_millis(1), false, Some(at(1)));
        assert_eq!(
            p.start(),
            None,
            "a cheap claim from the front is made every time"
        );
        assert_eq!(p.front_due(), None);
    }

    #[test]
    fn after_a_costly_claim_from_the_front_claims_start_from_the_last_position() {
        let mut p = Positions::new(1);
        p.claimed(None, Duration::from_millis(50), false, Some(at(1)));
        assert_eq!(
            p.start(),
            Some(at(1)),
            "the next claims start after the last task taken"
        );
        assert!(
            p.front_at >= Instant::now() + Duration::from_millis(900),
            "the next claim from the front comes twenty times its cost later"
        );
        p.claimed(Some(at(1)), Duration::from_millis(1), false, Some(at(2)));
        assert_eq!(
            p.start(),
            Some(at(2)),
            "the position moves on with each claim"
        );
        assert_eq!(
            p.front_due(),
            None,
            "a claim that took what it asked wishes for nothing"
        );
        p.claimed(Some(at(2)), Duration::from_millis(1), true, None);
        assert_eq!(
            p.start(),
            Some(at(2)),
            "a claim that took nothing keeps the position"
        );
        assert_eq!(
            p.front_due(),
            Some(p.front_at),
            "a short claim from a position wishes for a claim from the front, at its time"
        );
        p.front_at = Instant::now();
        assert_eq!(
            p.start(),
            None,
            "once its time has come, the claim starts from the front"
        );
        p.claimed(None, Duration::from_millis(1), true, None);
        assert_eq!(p.start(), None);
        assert_eq!(
            p.front_due(),
            None,
            "the claim from the front ends the wish"
        );
    }

    #[test]
    fn workers_of_several_queues_always_claim_from_the_front() {
        let mut p = Positions::new(2);
        p.claimed(None, Duration::from_secs(1), false, Some(at(1)));
        assert_eq!(p.start(), None);
        assert_eq!(p.front_due(), None);
    }
}
