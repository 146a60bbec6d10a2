//! Background upkeep: what keeps the database in shape without a request asking for it, run
//! by one loop per process ([`Upkeep::run`]). The duties ([`Duty`]):
//!
//! | duty | SQL | run by | every |
//! |---|---|---|---|
//! | rescue | `sked.tasks_rescue` | workers | their poll interval, at most 1 s |
//! | reconcile services | `sked.services_reconcile` | workers | their poll interval, at most 1 s |
//! | fire schedules | `sked.schedules_fire` | servers, workers (unless `--fire-schedules false`) | until the next tick, at most 1 s (10 s while no schedule is active); at once on `sked_schedules` |
//! | prune schedule runs | `sked.schedule_runs_prune` | those that fire | 60 s |
//! | prune live events | `sked.events_prune` | servers | 10 s |
//! | prune finished tasks | `sked.tasks_prune_expired`, then `sked.idempotency_keys_prune` | servers | 60 s (at once again after a run that stopped with more to do) |
//! | prune artifacts | `sked.artifacts_prune` | servers | 10 min |
//! | fold finishes | `sked.finishes_fold`, then `sked.finish_rollups_prune` | servers, workers | 5 s (at once again after a full batch) |
//!
//! How long finished tasks are kept is a setting of the database (`sked.retention_settings`,
//! overridden per queue in `sked.queues`), so every server prunes by the same rule; both
//! prunes delete nothing while retention is off there (see `sql/retention.sql`).
//!
//! Any number of processes may run any duty at once, because each is fenced in Postgres:
//! rescue, reconcile and firing lock what they change with `SKIP LOCKED` (and a tick's
//! `schedule_runs` row is its claim), the two prunes of runs and events delete what is
//! deletable whoever deletes it first, the prune of finished tasks runs batch by batch under
//! an advisory lock, artifacts are locked with `SKIP LOCKED`, and the fold of finishes runs
//! under a transaction-scoped advisory lock that the other folders skip (the prune after it
//! deletes what is deletable whoever deletes it first). Each batch of the two
//! retention prunes is one short transaction; a run is a loop of batches.
//!
//! Workers that serve the same queues share the duties any process may run: a worker's
//! upkeep told how many live workers share its queues ([`Upkeep::shared_by`], from each
//! heartbeat) runs the rescue, the reconcile, the fold of finishes and the prune of schedule
//! runs that many times less often, and looks for due ticks at most that many times
//! `max_sleep` apart (a tick known to be due sooner is fired on time), each wait drawn
//! from 0.5 to 1.5 times that so the workers take turns. The cluster then runs each duty
//! about as often as one worker alone would, and what idle workers cost the database does
//! not grow with their number.
//!
//! A rescue or a reconcile that took long waits up to ten times as long before its next run
//! ([`RUN_SPACING`]), at most its limit. Each duty runs in a tokio task of its own, one run at a time, so a
//! slow duty never delays another: a tick fires on time while a prune deletes. A run that
//! fails, outlasts its limit or panics is logged, and the duty runs again at its next time;
//! nothing a duty does ends the loop. The loop ends when its token is cancelled, dropping the runs in flight (each is
//! one transaction at a time, rolled back).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::Rng;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{schedule, service, worker};

/// Recorded live-event changes (`sked.event_outbox`) are deleted this long after they were
/// recorded: a server's hub that fell further behind sees a gap and has its clients resync.
pub const EVENTS_KEEP: Duration = Duration::from_secs(60);

/// How often recorded live-event changes older than [`EVENTS_KEEP`] are deleted.
const PRUNE_EVENTS_EVERY: Duration = Duration::from_secs(10);

/// How often schedules' runs are trimmed to their `history_limit`.
const PRUNE_RUNS_EVERY: Duration = Duration::from_secs(60);

/// How often the deltas of finishing statements are folded into the rollups of finishes
/// (and the rollups past their keeping deleted): the deltas a reader adds stay few.
const FOLD_FINISHES_EVERY: Duration = Duration::from_secs(5);

/// How often finished tasks past their retention are deleted.
const PRUNE_TASKS_EVERY: Duration = Duration::from_secs(60);

/// Finished tasks one batch (one transaction) of the prune examines, in the order they
/// finished: it deletes those of them past their retention.
pub const PRUNE_TASKS_BATCH: i32 = 1000;

/// How often stored artifacts nothing refers to are deleted.
const PRUNE_ARTIFACTS_EVERY: Duration = Duration::from_secs(600);

/// Artifacts one batch of their collection examines.
pub const PRUNE_ARTIFACTS_BATCH: i32 = 500;

/// A run of a prune stops starting batches after this long, and the duty runs again at once,
/// so that a run that has millions of rows to delete ends well within [`RUN_LIMIT`].
const PRUNE_RUN_BUDGET: Duration = Duration::from_secs(30);

/// A run of a duty without a limit of its own is given up after this long.
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// A rescue or a reconcile waits at least this many times as long as its last run took (at
/// most its limit), so that one whose scan grew (the entries of finished tasks pile up in an
/// index while an old snapshot is open and vacuum can remove none) takes a small part of a
/// connection's time.
const RUN_SPACING: u32 = 10;

/// With no active schedule, the firing duty sleeps this many times its `max_sleep`: writing a
/// schedule wakes it at once (`sked_schedules`, and every reconnect of its listener), so the
/// look is only the safety net, which an idle process need not pay for every second.
const NO_SCHEDULE_SLEEPS: u32 = 10;

/// How the cron firing duty runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FiringConfig {
    /// Fire ticks due within this much from now.
    pub horizon: Duration,
    /// Sleep at most this long between looks.
    pub max_sleep: Duration,
    /// Schedules handled per statement.
    pub batch: i32,
}

impl Default for FiringConfig {
    fn default() -> Self {
        FiringConfig {
            horizon: Duration::from_millis(100),
            max_sleep: Duration::from_secs(1),
            batch: 1000,
        }
    }
}

/// One duty of background upkeep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Duty {
    /// Tasks whose lease expired go back to their queue, or fail (`sked.tasks_rescue`), every
    /// `every`; a run is given up after `limit`.
    Rescue { every: Duration, limit: Duration },
    /// Services' copies are scaled and rolled over (`sked.services_reconcile`), every
    /// `every`; a run is given up after `limit`.
    ReconcileServices { every: Duration, limit: Duration },
    /// Due cron ticks fire (`sked.schedules_fire`): the duty sleeps until the next tick is
    /// due on the database clock (at most `max_sleep`), wakes at once when a schedule changes
    /// (`sked_schedules`), and fires `horizon` ahead, so that occurrences wait in the queue
    /// with `next_run_at` = the tick and workers start them on time.
    FireSchedules(FiringConfig),
    /// Each schedule's runs are trimmed to its newest `history_limit`
    /// (`sked.schedule_runs_prune`), every minute.
    PruneScheduleRuns,
    /// Recorded live-event changes older than [`EVENTS_KEEP`] are deleted
    /// (`sked.events_prune`), every 10 s.
    PruneEvents,
    /// Finished tasks past their retention (the database's setting, or their queue's) are
    /// deleted, with their attempts, logs and edges (`sked.tasks_prune_expired`), in batches
    /// of [`PRUNE_TASKS_BATCH`], every minute.
    PruneTasks,
    /// Stored artifacts that no task or schedule refers to, older than their grace period,
    /// are deleted (`sked.artifacts_prune`), every 10 minutes.
    PruneArtifacts,
    /// The deltas that finishing statements wrote are folded into the rollups of finishes
    /// (`sked.finishes_fold`, [`crate::history::FOLD_BATCH`] at a time), and rollup rows past
    /// their keeping deleted (`sked.finish_rollups_prune`), every 5 s.
    FoldFinishes,
}

impl Duty {
    /// The duty's name in logs.
    pub fn name(&self) -> &'static str {
        match self {
            Duty::Rescue { .. } => "rescue",
            Duty::ReconcileServices { .. } => "reconcile services",
            Duty::FireSchedules(_) => "fire schedules",
            Duty::PruneScheduleRuns => "prune schedule runs",
            Duty::PruneEvents => "prune live events",
            Duty::PruneTasks => "prune finished tasks",
            Duty::PruneArtifacts => "prune artifacts",
            Duty::FoldFinishes => "fold finishes",
        }
    }

    /// This duty as one of `peers` processes that share it run it: the rescue's and the
    /// reconcile's interval, and the firing's longest sleep, `peers` times as long.
    fn shared(self, peers: u32) -> Duty {
        match self {
            Duty::Rescue { every, limit } => Duty::Rescue {
                every: every * peers,
                limit,
            },
            Duty::ReconcileServices { every, limit } => Duty::ReconcileServices {
                every: every * peers,
                limit,
            },
            Duty::FireSchedules(firing) => Duty::FireSchedules(FiringConfig {
                max_sleep: firing.max_sleep * peers,
                ..firing
            }),
            other => other,
        }
    }

    /// The wait after a run of this duty (as [`Duty::shared`] made it) when `peers` processes
    /// share it: the fold's and the prune's fixed interval `peers` times as long, and every
    /// wait drawn from half to one and a half times itself, so that the processes take turns
    /// (the firing's from half to once: a tick may be due right after it). A wait shorter than
    /// the duty's interval (a tick due sooner, a batch to go on with) is kept as it is.
    fn shared_wait(&self, wait: Duration, peers: u32) -> Duration {
        if peers <= 1 || wait < self.every() {
            return wait;
        }
        let (wait, most) = match self {
            Duty::FoldFinishes | Duty::PruneScheduleRuns => (wait * peers, 1.5),
            Duty::FireSchedules(_) => (wait, 1.0),
            _ => (wait, 1.5),
        };
        wait.mul_f64(rand::rng().random_range(0.5..most))
    }

    /// Whether `other` is the same duty, whatever its settings.
    fn same_as(&self, other: &Duty) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }

    /// The time between the end of a run and the start of the next (a failed one too).
    fn every(&self) -> Duration {
        match self {
            Duty::Rescue { every, .. } | Duty::ReconcileServices { every, .. } => *every,
            Duty::FireSchedules(firing) => firing.max_sleep,
            Duty::PruneScheduleRuns => PRUNE_RUNS_EVERY,
            Duty::PruneEvents => PRUNE_EVENTS_EVERY,
            Duty::PruneTasks => PRUNE_TASKS_EVERY,
            Duty::PruneArtifacts => PRUNE_ARTIFACTS_EVERY,
            Duty::FoldFinishes => FOLD_FINISHES_EVERY,
        }
    }

    /// The least time between the end of a run that took `took` and the next run: never
    /// more than the run's limit (a third of the lease), so a lease still expires into a
    /// rescue within a lease and a half.
    fn spacing(&self, took: Duration) -> Duration {
        match self {
            Duty::Rescue { limit, .. } | Duty::ReconcileServices { limit, .. } => {
                (took * RUN_SPACING).min(*limit)
            }
            _ => Duration::ZERO,
        }
    }

    /// How long one run may take before it is given up.
    fn limit(&self) -> Duration {
        match self {
            Duty::Rescue { limit, .. } | Duty::ReconcileServices { limit, .. } => *limit,
            _ => RUN_LIMIT,
        }
    }

    /// Runs the duty once over `pool`.
    async fn run_once(self, pool: &PgPool) -> crate::Result<Ran> {
        let mut ran = Ran {
            next: self.every(),
            claimable: false,
        };
        match self {
            Duty::Rescue { .. } => {
                let rescued = worker::rescue(pool).await?;
                for (id, state) in &rescued {
                    tracing::warn!(%id, %state, "rescued a task whose worker stopped renewing its lease");
                }
                ran.claimable = !rescued.is_empty();
            }
            Duty::ReconcileServices { .. } => {
                let done = service::reconcile(pool).await?;
                for (service, action, copy) in &done {
                    tracing::info!(%service, %action, %copy, "reconciled a service");
                }
                ran.claimable = !done.is_empty();
            }
            Duty::FireSchedules(firing) => ran.next = fire_due(pool, &firing).await?,
            Duty::PruneScheduleRuns => {
                schedule::prune_runs(pool).await?;
            }
            Duty::PruneEvents => {
                prune_events(pool, EVENTS_KEEP).await?;
            }
            Duty::PruneTasks => {
                let (deleted, done) = prune_expired_tasks(pool, PRUNE_RUN_BUDGET).await?;
                if deleted > 0 {
                    tracing::info!(
                        tasks = deleted,
                        "pruned finished tasks past their retention"
                    );
                }
                let keys = prune_forgotten_keys(pool).await?;
                if keys > 0 {
                    tracing::info!(keys, "pruned idempotency keys past their window");
                }
                if !done || keys >= PRUNE_KEYS_BATCH {
                    ran.next = Duration::ZERO;
                }
            }
            Duty::PruneArtifacts => {
                let (deleted, done) = prune_artifacts(pool, PRUNE_RUN_BUDGET).await?;
                if deleted > 0 {
                    tracing::info!(artifacts = deleted, "pruned artifacts nothing refers to");
                }
                if !done {
                    ran.next = Duration::ZERO;
                }
            }
            Duty::FoldFinishes => {
                let folded = crate::history::fold(pool, crate::history::FOLD_BATCH).await?;
                crate::history::prune(pool, None).await?;
                if folded >= crate::history::FOLD_BATCH {
                    ran.next = Duration::ZERO;
                }
            }
        }
        Ok(ran)
    }
}

/// Why a run of a duty did not complete.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Db(crate::DbError),
    #[error("given up after {:.3} s", .0.as_secs_f64())]
    TooLong(Duration),
    #[error("panicked: {0}")]
    Panicked(String),
}

/// What a run of a duty leaves for the loop.
struct Ran {
    /// Time until the next run.
    next: Duration,
    /// The run made tasks claimable (rescued them, or made copies of services).
    claimable: bool,
}

/// The duties one process runs, each over its own pool, and whom to tell when one made tasks
/// claimable. A process runs each duty once: a duty added again is left out, whatever its
/// settings, so a process hosting a server and a worker (`sked dev`) merges theirs.
#[derive(Debug, Default)]
pub struct Upkeep {
    duties: Vec<(Duty, PgPool)>,
    claimable: Option<Arc<Notify>>,
    /// How many live processes share the duties (see the module's documentation).
    peers: Option<Arc<AtomicUsize>>,
}

impl Upkeep {
    /// No duty.
    pub fn new() -> Upkeep {
        Upkeep::default()
    }

    /// Adds `duty`, run over `pool` (unless the same duty was added already).
    pub fn with(mut self, duty: Duty, pool: &PgPool) -> Upkeep {
        if !self.duties.iter().any(|(d, _)| d.same_as(&duty)) {
            self.duties.push((duty, pool.clone()));
        }
        self
    }

    /// Adds the duties of `other` that are not here yet, each with its own pool.
    pub fn and(mut self, other: Upkeep) -> Upkeep {
        for (duty, pool) in other.duties {
            self = self.with(duty, &pool);
        }
        self.claimable = self.claimable.or(other.claimable);
        self.peers = self.peers.or(other.peers);
        self
    }

    /// Shares the duties with the other live processes that run them: `peers` holds how many
    /// there are, this one included (a worker's heartbeat keeps it up to date). The duties
    /// then run that many times less often (see the module's documentation).
    pub fn shared_by(mut self, peers: Arc<AtomicUsize>) -> Upkeep {
        self.peers = Some(peers);
        self
    }

    /// Notifies `claimable` whenever a rescue or a reconcile made tasks claimable, so that a
    /// worker in this process claims them without waiting for its poll or a notification.
    pub fn waking(mut self, claimable: Arc<Notify>) -> Upkeep {
        self.claimable = Some(claimable);
        self
    }

    /// The duties, in the order they were added.
    pub fn duties(&self) -> impl Iterator<Item = &Duty> {
        self.duties.iter().map(|(d, _)| d)
    }

    /// Runs every duty on its own schedule until `stop` is cancelled. Each duty runs within
    /// its first second, then again its interval after each run ends (firing: when the next
    /// tick is due, or at once when a schedule changed).
    pub async fn run(self, stop: CancellationToken) {
        let Upkeep {
            duties,
            claimable,
            peers,
        } = self;
        let peers = move || {
            peers.as_ref().map_or(1, |p| {
                u32::try_from(p.load(Ordering::Relaxed).max(1)).unwrap_or(u32::MAX)
            })
        };
        if duties.is_empty() {
            return;
        }
        // The firing duty wakes on `sked_schedules`, through a LISTEN connection of its own.
        let firing = duties
            .iter()
            .position(|(d, _)| matches!(d, Duty::FireSchedules(_)));
        let schedules_changed = Arc::new(Notify::new());
        let listener = firing.map(|i| {
            tokio::spawn(listen_schedules(
                duties[i].1.clone(),
                schedules_changed.clone(),
                stop.clone(),
            ))
        });
        // When each duty runs next; `None` while it runs. The first runs are spread over
        // the first second (or the duty's interval, if shorter), so that they seldom
        // overlap: each run at once takes a connection of its own, and a pool keeps every
        // connection it opened.
        let start = Instant::now();
        let mut due: Vec<Option<Instant>> = duties
            .iter()
            .map(|(duty, _)| {
                let spread = duty.every().min(Duration::from_secs(1));
                Some(start + spread.mul_f64(rand::rng().random_range(0.0..1.0)))
            })
            .collect();
        // A schedule changed while the firing duty ran: it runs again at once.
        let mut fire_again = false;
        let mut runs: JoinSet<Result<Ran, Failure>> = JoinSet::new();
        // The duty of each run in flight, and when it started.
        let mut running: HashMap<tokio::task::Id, (usize, Instant)> = HashMap::new();
        loop {
            let now = Instant::now();
            for (i, (duty, pool)) in duties.iter().enumerate() {
                if due[i].is_some_and(|at| at <= now) {
                    due[i] = None;
                    let duty = duty.shared(peers());
                    let (pool, limit) = (pool.clone(), duty.limit());
                    let run = runs.spawn(async move {
                        match tokio::time::timeout(limit, duty.run_once(&pool)).await {
                            Ok(ran) => ran.map_err(Failure::Db),
                            Err(_) => Err(Failure::TooLong(limit)),
                        }
                    });
                    running.insert(run.id(), (i, now));
                }
            }
            let next = due.iter().flatten().min().copied();
            tokio::select! {
                _ = stop.cancelled() => break,
                Some(joined) = runs.join_next_with_id() => {
                    let (id, ran) = match joined {
                        Ok((id, ran)) => (id, ran),
                        Err(e) => (e.id(), Err(Failure::Panicked(e.to_string()))),
                    };
                    let Some((i, started)) = running.remove(&id) else { continue };
                    let peers = peers();
                    let duty = &duties[i].0.shared(peers);
                    let spacing = duty.spacing(started.elapsed());
                    let wait = match ran {
                        Ok(ran) => {
                            if ran.claimable && let Some(c) = &claimable {
                                c.notify_one();
                            }
                            ran.next
                        }
                        Err(failure) => {
                            tracing::warn!(duty = duty.name(), error = %failure,
                                "an upkeep duty failed; it runs again at its next time");
                            duty.every()
                        }
                    };
                    let wait = if Some(i) == firing && std::mem::take(&mut fire_again) {
                        Duration::ZERO
                    } else {
                        duty.shared_wait(wait.max(spacing), peers)
                    };
                    due[i] = Some(Instant::now() + wait);
                }
                _ = schedules_changed.notified(), if firing.is_some() => {
                    if let Some(i) = firing {
                        match due[i] {
                            Some(_) => due[i] = Some(Instant::now()),
                            None => fire_again = true,
                        }
                    }
                }
                _ = tokio::time::sleep_until(next.unwrap_or(now)), if next.is_some() => {}
            }
        }
        runs.shutdown().await;
        if let Some(listener) = listener {
            listener.abort();
            let _ = listener.await;
        }
    }
}

/// Fires what is due; returns how long to sleep before looking again.
async fn fire_due(pool: &PgPool, config: &FiringConfig) -> crate::Result<Duration> {
    let handled = schedule::fire(pool, config.horizon, config.batch).await?;
    if handled >= config.batch {
        return Ok(Duration::ZERO);
    }
    let due = schedule::next_due(pool).await?;
    Ok(match due {
        // No active schedule: a schedule written wakes the duty (`sked_schedules`).
        None => config.max_sleep * NO_SCHEDULE_SLEEPS,
        Some(secs) => {
            // Wake when the next tick enters the horizon.
            let secs = secs - config.horizon.as_secs_f64();
            if secs <= 0.0 {
                // Due but locked by another firing process, or queued behind a running
                // occurrence: look again shortly rather than spin.
                Duration::from_millis(if handled > 0 { 0 } else { 20 })
            } else {
                Duration::try_from_secs_f64(secs)
                    .unwrap_or(config.max_sleep)
                    .min(config.max_sleep)
            }
        }
    })
}

/// Listens on `sked_schedules` and notifies `changed` for each notification, and after every
/// (re)connect (notifications sent meanwhile are lost), until `stop`. The firing duty polls
/// anyway: a lost notification costs latency only.
async fn listen_schedules(pool: PgPool, changed: Arc<Notify>, stop: CancellationToken) {
    crate::listen::listen(&pool, &["sked_schedules"], "upkeep", &stop, |_| {
        changed.notify_one()
    })
    .await
}

/// Deletes live-event changes recorded more than `keep` ago (`sked.events_prune`); returns
/// how many.
pub async fn prune_events(pool: &PgPool, keep: Duration) -> crate::Result<i32> {
    Ok(
        sqlx::query_scalar("select sked.events_prune(now() - $1::interval)")
            .bind(worker::pg_interval(keep))
            .fetch_one(crate::on(pool))
            .await?,
    )
}

/// The pause after a batch of a prune that took `batch`: as long again, so that a prune with
/// millions of rows to delete takes at most half of its connection's time and leaves the rest
/// of the database's to the hot path (`bench/README.md`, W13).
pub fn pause_after(batch: Duration) -> Duration {
    batch
}

/// One run of the prune of finished tasks: batches of `sked.tasks_prune_expired` from the
/// oldest finished task on, until no task is old enough for any retention or `budget` has
/// passed (see [`in_batches`]). Returns the tasks deleted and whether the run got to the end
/// (false: there may be more to delete).
pub async fn prune_expired_tasks(pool: &PgPool, budget: Duration) -> crate::Result<(i64, bool)> {
    in_batches(budget, |after| {
        prune_tasks_batch(pool, after, PRUNE_TASKS_BATCH, None)
    })
    .await
}

/// Runs `batch` from the start (`None`), then from where each batch says the next starts,
/// each its own transaction and each followed by a pause ([`pause_after`]), until a batch
/// says nothing is left or `budget` has passed. Returns the rows deleted and whether the
/// run got to the end.
async fn in_batches<C, F, Fut>(budget: Duration, mut batch: F) -> crate::Result<(i64, bool)>
where
    F: FnMut(Option<C>) -> Fut,
    Fut: std::future::Future<Output = crate::Result<(i32, Option<C>)>>,
{
    let deadline = Instant::now() + budget;
    let mut after = None;
    let mut deleted = 0;
    loop {
        let started = Instant::now();
        let (n, next) = batch(after).await?;
        deleted += i64::from(n);
        match next {
            None => return Ok((deleted, true)),
            Some(next) => after = Some(next),
        }
        if Instant::now() >= deadline {
            return Ok((deleted, false));
        }
        tokio::time::sleep(pause_after(started.elapsed())).await;
    }
}

/// Idempotency keys one run of the prune of finished tasks deletes at most.
const PRUNE_KEYS_BATCH: i32 = 10_000;

/// Deletes idempotency keys whose window after their task's deletion has passed
/// (`sked.idempotency_keys_prune`), at most [`PRUNE_KEYS_BATCH`]; returns how many.
pub async fn prune_forgotten_keys(pool: &PgPool) -> crate::Result<i32> {
    Ok(sqlx::query_scalar("select sked.idempotency_keys_prune($1)")
        .bind(PRUNE_KEYS_BATCH)
        .fetch_one(crate::on(pool))
        .await?)
}

/// One batch of `sked.tasks_prune_expired`: examines the next `limit` finished tasks after
/// `after` (from the oldest when `None`) at `now` (the database's clock when `None`). Returns
/// the tasks deleted and where the next batch starts, `None` when nothing is left to examine.
pub async fn prune_tasks_batch(
    pool: &PgPool,
    after: Option<DateTime<Utc>>,
    limit: i32,
    now: Option<DateTime<Utc>>,
) -> crate::Result<(i32, Option<DateTime<Utc>>)> {
    Ok(sqlx::query_as(
        "select deleted, examined_to
           from sked.tasks_prune_expired(coalesce($1, '-infinity'::timestamptz), $2,
                                         coalesce($3, now()))",
    )
    .bind(after)
    .bind(limit)
    .bind(now)
    .fetch_one(crate::on(pool))
    .await?)
}

/// One run of the artifacts' collection: batches of `sked.artifacts_prune` from the oldest
/// artifact on, until none is left to examine or `budget` has passed (see [`in_batches`]).
/// Returns the artifacts deleted and whether the run got to the end.
pub async fn prune_artifacts(pool: &PgPool, budget: Duration) -> crate::Result<(i64, bool)> {
    in_batches(budget, |after| {
        prune_artifacts_batch(pool, after, PRUNE_ARTIFACTS_BATCH, None)
    })
    .await
}

/// One batch of `sked.artifacts_prune`: examines the next `limit` artifacts past their grace
/// period after `after` (their `created_at` and SHA-256; from the oldest when `None`) at
/// `now` (the database's clock when `None`). Returns the artifacts deleted and the last one
/// examined, `None` when nothing is left to examine.
pub async fn prune_artifacts_batch(
    pool: &PgPool,
    after: Option<(DateTime<Utc>, String)>,
    limit: i32,
    now: Option<DateTime<Utc>>,
) -> crate::Result<(i32, Option<(DateTime<Utc>, String)>)> {
    let (at, sha256) = after.unzip();
    let (deleted, last_at, last_sha256): (i32, Option<DateTime<Utc>>, Option<String>) =
        sqlx::query_as(
            "select deleted, last_created_at, last_sha256
               from sked.artifacts_prune(coalesce($1, '-infinity'::timestamptz),
                                         coalesce($2, ''), $3, coalesce($4, now()))",
        )
        .bind(at)
        .bind(sha256)
        .bind(limit)
        .bind(now)
        .fetch_one(crate::on(pool))
        .await?;
    Ok((deleted, last_at.zip(last_sha256)))
}
