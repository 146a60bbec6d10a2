//! The worker's background services: the heartbeat (leases, cancel requests, rescue of dead
//! workers' tasks) and the notification listener. Both only make the worker faster or keep
//! it honest; claims stay correct without them because every transition is fenced.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sked_db::worker::Registration;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::Running;
use crate::executor::StopReason;

/// How often running attempts are checked for cancel requests (besides notifications).
const CANCEL_POLL: Duration = Duration::from_secs(1);

pub struct Heartbeat {
    pub pool: PgPool,
    pub registration: Registration,
    pub running: Running,
    /// Woken when rescued tasks became claimable.
    pub wake: Arc<Notify>,
    pub poll_interval: Duration,
}

impl Heartbeat {
    /// Renews leases every third of the lease, checks for cancel requests every second (and
    /// when `cancel_check` is notified), and rescues expired leases and reconciles services
    /// every poll interval (at least once a second), until `stop`.
    pub async fn run(self, cancel_check: Arc<Notify>, stop: CancellationToken) {
        let mut renew = tokio::time::interval(self.registration.lease / 3);
        let mut cancels = tokio::time::interval(CANCEL_POLL);
        let mut rescue = tokio::time::interval(self.poll_interval.min(Duration::from_secs(1)));
        for t in [&mut renew, &mut cancels, &mut rescue] {
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = renew.tick() => self.renew_once().await,
                _ = cancels.tick() => self.check_cancels_once().await,
                _ = cancel_check.notified() => self.check_cancels_once().await,
                _ = rescue.tick() => self.rescue_once().await,
            }
        }
    }

    fn held(&self) -> Vec<(Uuid, i32)> {
        self.running
            .lock()
            .expect("running map")
            .iter()
            .map(|(id, (attempt, _))| (*id, *attempt))
            .collect()
    }

    /// Stops the attempt if it still runs here; false when it has ended meanwhile (an
    /// attempt leaves the running map before its result is written, so an attempt missing
    /// from the database but still in the map really lost its lease).
    fn stop(&self, id: Uuid, attempt: i32, reason: StopReason) -> bool {
        match self.running.lock().expect("running map").get(&id) {
            Some((a, stopper)) if *a == attempt => {
                stopper.stop(reason);
                true
            }
            _ => false,
        }
    }

    /// Refreshes the registry row and renews every held lease with one statement; stops
    /// attempts whose lease is gone or whose cancel was requested.
    pub async fn renew_once(&self) {
        match sked_db::worker::touch(&self.pool, self.registration.id).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!("the worker's registry row was gone; registering again");
                if let Err(e) = sked_db::worker::register(&self.pool, &self.registration).await {
                    tracing::warn!(error = %e, "registering again failed");
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
        let held = self.held();
        if held.is_empty() {
            return;
        }
        match sked_db::worker::renew_leases(
            &self.pool,
            self.registration.id,
            &held,
            self.registration.lease,
        )
        .await
        {
            Ok(kept) => {
                let kept_ids: HashSet<(Uuid, i32)> = kept.iter().map(|k| (k.0, k.1)).collect();
                for (id, attempt) in held {
                    if !kept_ids.contains(&(id, attempt))
                        && self.stop(id, attempt, StopReason::LeaseLost)
                    {
                        tracing::warn!(%id, attempt, "lost the lease: stopping the attempt");
                    }
                }
                for (id, attempt, cancel) in kept {
                    if cancel {
                        self.stop(id, attempt, StopReason::Cancel);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "renewing leases failed"),
        }
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
                    self.stop(id, attempt, StopReason::Cancel);
                }
            }
            Err(e) => tracing::warn!(error = %e, "checking cancel requests failed"),
        }
    }

    pub async fn rescue_once(&self) {
        match sked_db::worker::rescue(&self.pool).await {
            Ok(rescued) if !rescued.is_empty() => {
                for (id, state) in &rescued {
                    tracing::warn!(%id, %state, "rescued a task whose worker stopped renewing its lease");
                }
                self.wake.notify_one();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "rescuing expired leases failed"),
        }
        // Services' copies are scaled and rolled over by the same tick (docs/services.md).
        match sked_db::service::reconcile(&self.pool).await {
            Ok(done) => {
                for (service, action, copy) in &done {
                    tracing::info!(%service, %action, %copy, "reconciled a service");
                }
                if !done.is_empty() {
                    self.wake.notify_one();
                }
            }
            Err(e) => tracing::warn!(error = %e, "reconciling services failed"),
        }
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
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut listener = match connect(&pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "LISTEN connection failed; polling until it is back");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        wake.notify_one();
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => return,
                r = listener.try_recv() => r,
            };
            match received {
                Ok(Some(n)) => match n.channel() {
                    "sked_tasks"
                        if (n.payload().is_empty()
                            || n.payload().split(',').any(|q| ours.contains(q))) =>
                    {
                        wake.notify_one();
                    }
                    // One task id, or several separated by commas (a workflow's cancel).
                    "sked_cancel" => {
                        let running = running.lock().expect("running map");
                        if n.payload()
                            .split(',')
                            .filter_map(|id| id.parse::<Uuid>().ok())
                            .any(|id| running.contains_key(&id))
                        {
                            cancel_check.notify_one();
                        }
                    }
                    _ => {}
                },
                // The connection dropped; the next try_recv reconnects.
                Ok(None) => wake.notify_one(),
                Err(e) => {
                    tracing::warn!(error = %e, "LISTEN connection lost");
                    break;
                }
            }
        }
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen_all(["sked_tasks", "sked_cancel"]).await?;
    Ok(listener)
}
