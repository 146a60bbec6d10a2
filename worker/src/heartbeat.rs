//! The worker's background services: the heartbeat (leases, cancel requests), the lease
//! guard and the notification listener. Claims and results stay correct without the heartbeat
//! and the listener because every transition is fenced; the lease guard is what keeps two
//! copies of a task from running at once. The rescue of dead workers' tasks and the other
//! duties of background upkeep run in the loop of `sked_db::upkeep`.
//!
//! A lease is held locally. Each attempt's lease lasts at least until the sending of the
//! statement that last set it (its claim, then each renewal the database accepted) plus the
//! lease duration, since the database counts the lease from its own later `now()`. When
//! renewals fail (the database is unreachable, or answers too late), the lease guard stops the
//! attempt the kill grace plus a margin before that instant: SIGTERM, the grace, SIGKILL of the
//! group, so its processes are gone before any worker may rescue the task. A renewal the
//! database refuses (the lease expired, or the task is no longer this attempt's) stops the
//! attempt at once. Attempts whose result waits to be written are renewed with the running
//! ones, so a result held back by an unreachable database is not refused once it gets through.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sked_db::listen::Heard;
use sked_db::worker::Registration;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::runner::StopReason;
use crate::{AttemptKey, Running};

/// How often running attempts are checked for cancel requests (besides notifications).
const CANCEL_POLL: Duration = Duration::from_secs(1);

/// How soon a failed renewal is tried again (at most every third of the lease).
const RENEW_RETRY: Duration = Duration::from_secs(1);

pub struct Heartbeat {
    pub pool: PgPool,
    pub registration: Registration,
    pub running: Running,
    /// How many live workers serve a queue of this one (itself included), as the last
    /// heartbeat answered: they share the claim's poll and the background upkeep.
    pub peers: Arc<AtomicUsize>,
    /// Woken when a task of this worker's queues is due before the next heartbeat: set for a
    /// worker that cannot `LISTEN` (behind a transaction-mode pooler without a direct URL),
    /// which would otherwise find a backlog only at its share of the poll.
    pub wake_when_due: Option<Arc<Notify>>,
}

impl Heartbeat {
    /// How often leases are renewed: every third of the lease.
    fn every(&self) -> Duration {
        self.registration.lease / 3
    }

    /// Renews leases every third of the lease (a second after a failed renewal, if sooner),
    /// and meanwhile checks for cancel requests every second (and when `cancel_check` is
    /// notified), until `stop`. The renewals run in a loop of their own, so they never wait
    /// behind the cancel checks; each call waits at most a third of the lease for the
    /// database, since over a connection that stopped answering it would otherwise wait for
    /// TCP to give up.
    pub async fn run(self, cancel_check: Arc<Notify>, stop: CancellationToken) {
        let every = self.every();
        let renewals = async {
            loop {
                let started = Instant::now();
                let renewed = tokio::time::timeout(every, self.renew_once())
                    .await
                    .unwrap_or_else(|_| {
                        tracing::warn!(
                            "renewing leases took longer than a third of the lease; trying again"
                        );
                        false
                    });
                if !renewed {
                    sked_db::metrics::metrics().lease_renewal_failures.inc();
                }
                let next = started
                    + if renewed {
                        every
                    } else {
                        every.min(RENEW_RETRY)
                    };
                tokio::time::sleep_until(next).await;
            }
        };
        let cancels = async {
            let mut poll = tokio::time::interval(CANCEL_POLL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = poll.tick() => {}
                    _ = cancel_check.notified() => {}
                }
                bounded(every, "checking cancel requests", self.check_cancels_once()).await;
            }
        };
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = renewals => {}
            _ = cancels => {}
        }
    }

    /// Every attempt held: running, or ended with its result waiting to be written; in the
    /// order of the task ids, the order in which the completer's writes lock the same rows
    /// (see `completer`), so that a renewal and a write never wait for each other in a
    /// deadlock.
    fn held(&self) -> Vec<AttemptKey> {
        let mut held: Vec<AttemptKey> = self
            .running
            .lock()
            .expect("running map")
            .keys()
            .copied()
            .collect();
        held.sort_unstable();
        held
    }

    /// Stops the attempt if its run has not ended; false otherwise (it ended meanwhile, or
    /// its result was written).
    fn stop(&self, key: AttemptKey, reason: StopReason) -> bool {
        match self.running.lock().expect("running map").get(&key) {
            Some(attempt) if !attempt.ended => {
                attempt.stopper.stop(reason);
                true
            }
            _ => false,
        }
    }

    /// Renews every held lease with one statement, then refreshes the registry row (and
    /// learns how many live workers share this one's queues); stops attempts whose renewal
    /// the database refused or whose cancel was requested. True when the leases were renewed
    /// (or none is held).
    pub async fn renew_once(&self) -> bool {
        let renewed = self.renew_leases_once().await;
        // A worker that does not listen asks, in the same statement, how soon a task of its
        // queues is due, and wakes its claim when that is before its next heartbeat.
        let beat: Result<(i32, Option<f64>), sqlx::Error> = sqlx::query_as(
            "select sked.worker_heartbeat($1),
                    case when $2 then sked.tasks_next_due($3) end",
        )
        .bind(self.registration.id)
        .bind(self.wake_when_due.is_some())
        .bind(&self.registration.queues)
        .fetch_one(sked_db::on(&self.pool))
        .await;
        match beat {
            Ok((peers, due_in)) if peers > 0 => {
                self.peers
                    .store(usize::try_from(peers).unwrap_or(1), Ordering::Relaxed);
                if let (Some(wake), Some(secs)) = (&self.wake_when_due, due_in)
                    && secs <= self.every().as_secs_f64()
                {
                    wake.notify_one();
                }
            }
            Ok(_) => {
                self.peers.store(1, Ordering::Relaxed);
                tracing::warn!("the worker's registry row was gone; registering again");
                if let Err(e) = sked_db::worker::register(&self.pool, &self.registration).await {
                    tracing::warn!(error = %e, "registering again failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
        renewed
    }

    /// Renews every held lease with one statement, tried at once up to three times when the
    /// connection fails (after a network outage the pool hands out its dead connections
    /// one by one).
    async fn renew_leases_once(&self) -> bool {
        let held = self.held();
        if held.is_empty() {
            return true;
        }
        let mut tries = 0;
        let (sent, kept) = loop {
            tries += 1;
            // The renewed leases last at least until this instant plus the lease (the
            // database counts them from its own `now()`, later than this).
            let sent = Instant::now();
            match sked_db::worker::renew_leases(
                &self.pool,
                self.registration.id,
                &held,
                self.registration.lease,
            )
            .await
            {
                Ok(kept) => break (sent, kept),
                Err(e) if e.is_transient() && tries < 3 => {
                    tracing::warn!(error = %e, "renewing leases failed; trying again at once");
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing leases failed");
                    return false;
                }
            }
        };
        let kept_keys: HashSet<AttemptKey> = kept.iter().map(|k| (k.0, k.1)).collect();
        {
            let mut running = self.running.lock().expect("running map");
            for key in &kept_keys {
                if let Some(attempt) = running.get_mut(key) {
                    attempt.renewed = attempt.renewed.max(sent);
                }
            }
        }
        for (id, attempt) in held {
            if !kept_keys.contains(&(id, attempt))
                && self.stop((id, attempt), StopReason::LeaseLost)
            {
                tracing::warn!(%id, attempt, "the database refused to renew the lease: stopping the attempt");
            }
        }
        for (id, attempt, cancel) in kept {
            if cancel {
                self.stop((id, attempt), StopReason::Cancel);
            }
        }
        true
    }

    pub async fn check_cancels_once(&self) {
        let held = self.held();
        if held.is_empty() {
            return;
        }
        match sked_db::worker::cancel_requested(&self.pool, &held).await {
            Ok(cancelled) => {
                for (id, attempt) in cancelled {
                    tracing::info!(%id, attempt, "cancel requested: stopping the attempt");
                    self.stop((id, attempt), StopReason::Cancel);
                }
            }
            Err(e) => tracing::warn!(error = %e, "checking cancel requests failed"),
        }
    }
}

/// Runs `f` for at most `limit`, logging when it was given up.
async fn bounded(limit: Duration, what: &str, f: impl std::future::Future<Output = ()>) {
    if tokio::time::timeout(limit, f).await.is_err() {
        tracing::warn!("{what} took longer than a third of the lease; given up");
    }
}

/// Stops every attempt whose lease could not be renewed in time: at the instant its lease
/// surely lasts until (see the module's documentation) minus `stop_before` (the kill grace
/// and the margin), it is stopped as `StopReason::LeaseLost`, so its process group is gone
/// before the lease ends. It reads only the worker's memory, never the database, so no
/// unanswered statement can hold it up.
pub struct LeaseGuard {
    pub running: Running,
    pub lease: Duration,
    pub stop_before: Duration,
}

/// Longest the lease guard sleeps: it notices a newly claimed attempt at most this late.
const GUARD_SLEEP: Duration = Duration::from_millis(100);

impl LeaseGuard {
    pub async fn run(self, stop: CancellationToken) {
        loop {
            let now = Instant::now();
            let next = self
                .run_once(now)
                .map_or(now + GUARD_SLEEP, |at| at.min(now + GUARD_SLEEP));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }

    /// Stops the running attempts due to stop at `now`; returns when the next one is due.
    pub fn run_once(&self, now: Instant) -> Option<Instant> {
        let running = self.running.lock().expect("running map");
        let mut next: Option<Instant> = None;
        for (&(id, attempt), held) in running.iter() {
            if held.ended || held.stopper.reason().is_some() {
                continue;
            }
            let stop_at = (held.renewed + self.lease)
                .checked_sub(self.stop_before)
                .unwrap_or(held.renewed);
            if stop_at <= now {
                tracing::warn!(%id, attempt, since_renewed = ?now - held.renewed,
                    "the lease could not be renewed: stopping the attempt before it ends");
                held.stopper.stop(StopReason::LeaseLost);
            } else {
                next = Some(next.map_or(stop_at, |n| n.min(stop_at)));
            }
        }
        next
    }
}

/// Listens on `sked_tasks` (wakes the claim loop when one of our queues got work) and
/// `sked_cancel` (triggers a cancel check when it names a task we run). Reconnects with
/// backoff; after every (re)connect it wakes the claim loop, since notifications sent while
/// disconnected are lost.
pub async fn listen(
    pool: PgPool,
    queues: Vec<String>,
    wake: Arc<Notify>,
    cancel_check: Arc<Notify>,
    running: Running,
    stop: CancellationToken,
) {
    let ours: HashSet<String> = queues.into_iter().collect();
    let heard = |heard: Heard| {
        let n = match heard {
            Heard::MaybeMissed => return wake.notify_one(),
            Heard::Notification(n) => n,
        };
        match n.channel() {
            "sked_tasks"
                if (n.payload().is_empty() || n.payload().split(',').any(|q| ours.contains(q))) =>
            {
                wake.notify_one();
            }
            // One task id, or several separated by commas (a workflow's cancel).
            "sked_cancel" => {
                let ids: HashSet<Uuid> = n
                    .payload()
                    .split(',')
                    .filter_map(|id| id.parse::<Uuid>().ok())
                    .collect();
                let running = running.lock().expect("running map");
                if running.keys().any(|(id, _)| ids.contains(id)) {
                    cancel_check.notify_one();
                }
            }
            _ => {}
        }
    };
    sked_db::listen::listen(
        &pool,
        &["sked_tasks", "sked_cancel"],
        "worker",
        &stop,
        heard,
    )
    .await
}
