//! The gate of the live events: this server's row in `sked.event_listeners`, without which the
//! event triggers of `sql/events.sql` send nothing.
//!
//! The hub opens the gate when its first client comes, keeps the row fresh while clients stay
//! (it expires `ttl` after the last refresh, so the row of a server that died goes away), and
//! closes it `linger` after the last client left (a page reload does not close and reopen it).
//!
//! Opening has a race: a transaction whose trigger looked for rows just before ours was
//! written sends nothing, and if it commits after a new client fetched what it shows, that
//! client never hears of its changes. So the gate opens in two steps: it writes the row, then
//! waits until every transaction of the database that held a transaction id or a snapshot at
//! that moment has ended (`sked.events_running`, `sked.events_ended`); only then are clients
//! greeted. If that takes longer than [`OPEN_WAIT`] (a long transaction), clients are greeted
//! anyway and get a `resync` once those transactions have ended.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::types::PgInterval;
use tokio::time::Instant;
use uuid::Uuid;

/// Longest wait for older transactions before clients are greeted anyway.
pub(super) const OPEN_WAIT: Duration = Duration::from_secs(2);
/// Interval between looks at older transactions while opening.
const OPEN_POLL: Duration = Duration::from_millis(10);
/// Retry interval after a failed statement.
const RETRY: Duration = Duration::from_secs(1);

#[derive(Debug)]
enum State {
    /// No row: the triggers send nothing (unless another server has clients).
    Closed {
        /// The row was lost while clients were connected (a refresh failed): they were
        /// greeted, and get a `resync` once the gate is open again.
        reopening: bool,
    },
    /// The row is written; transactions that may have missed it are still running.
    Opening {
        running: Vec<String>,
        since: Instant,
        refreshed: Instant,
        /// Clients were greeted before those transactions ended: they get a `resync` then.
        greeted: bool,
    },
    /// The row is written and every transaction that could have missed it has ended.
    Open {
        refreshed: Instant,
        /// When the last client left.
        idle_since: Option<Instant>,
    },
}

/// What a step of the gate asks of the hub.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Step {
    /// New clients may be greeted (they hear of every change from now on).
    pub greet: bool,
    /// Clients greeted earlier may have missed changes: they must `resync`.
    pub resync: bool,
    /// When to step again (`None`: only when the number of clients changes).
    pub next: Option<Duration>,
}

#[derive(Debug)]
pub(super) struct Gate {
    /// This server's row; chosen by the database when the gate first opens.
    id: Option<Uuid>,
    state: State,
    ttl: Duration,
    linger: Duration,
}

impl Gate {
    pub(super) fn new(ttl: Duration, linger: Duration) -> Gate {
        Gate {
            id: None,
            state: State::Closed { reopening: false },
            ttl,
            linger,
        }
    }

    /// Opens, keeps or closes the gate for `clients` connected clients. Runs no statement
    /// while the gate is closed and nobody is connected.
    pub(super) async fn step(&mut self, pool: &PgPool, clients: usize) -> Step {
        let refresh_every = self.ttl / 3;
        match &mut self.state {
            State::Closed { .. } if clients == 0 => {
                self.state = State::Closed { reopening: false };
                Step::default()
            }
            State::Closed { reopening } => {
                let greeted = *reopening;
                match self.open(pool).await {
                    Ok(running) => {
                        let now = Instant::now();
                        self.state = State::Opening {
                            running,
                            since: now,
                            refreshed: now,
                            greeted,
                        };
                        Step {
                            greet: greeted,
                            resync: false,
                            next: Some(Duration::ZERO),
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "live events: registering this server's clients failed; retrying");
                        Step {
                            greet: greeted,
                            resync: false,
                            next: Some(RETRY),
                        }
                    }
                }
            }
            State::Opening {
                running,
                since,
                refreshed,
                greeted,
            } => {
                if refreshed.elapsed() >= refresh_every
                    && let Some(id) = self.id
                {
                    match listen(pool, id, self.ttl).await {
                        Ok(()) => *refreshed = Instant::now(),
                        Err(e) => {
                            tracing::warn!(error = %e, "live events: refreshing this server's registration failed")
                        }
                    }
                }
                let ended: Result<bool, sqlx::Error> =
                    sqlx::query_scalar("select sked.events_ended($1)")
                        .bind(&*running)
                        .fetch_one(sked_db::on(pool))
                        .await;
                match ended {
                    Ok(true) => {
                        let resync = *greeted;
                        self.state = State::Open {
                            refreshed: *refreshed,
                            idle_since: None,
                        };
                        Step {
                            greet: true,
                            resync,
                            next: Some(Duration::ZERO),
                        }
                    }
                    Ok(false) => {
                        if since.elapsed() >= OPEN_WAIT && !*greeted {
                            *greeted = true;
                            tracing::info!(
                                "live events: greeting clients before older transactions ended; they resync when those have"
                            );
                        }
                        Step {
                            greet: *greeted,
                            resync: false,
                            next: Some(if *greeted { OPEN_POLL * 10 } else { OPEN_POLL }),
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "live events: looking for older transactions failed; retrying");
                        Step {
                            greet: *greeted,
                            resync: false,
                            next: Some(RETRY),
                        }
                    }
                }
            }
            State::Open {
                refreshed,
                idle_since,
            } => {
                if clients > 0 {
                    *idle_since = None;
                } else {
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.linger {
                        self.close(pool).await;
                        return Step::default();
                    }
                }
                if refreshed.elapsed() >= refresh_every {
                    let Some(id) = self.id else {
                        unreachable!("an open gate has a row")
                    };
                    if let Err(e) = listen(pool, id, self.ttl).await {
                        // The row may expire before the next try: open again from scratch, and
                        // have the clients resync once it is open.
                        tracing::warn!(error = %e, "live events: refreshing this server's registration failed; reopening");
                        self.state = State::Closed { reopening: true };
                        return Step {
                            greet: true,
                            resync: false,
                            next: Some(RETRY),
                        };
                    }
                    *refreshed = Instant::now();
                }
                let mut next = refresh_every.saturating_sub(refreshed.elapsed());
                if let Some(since) = idle_since {
                    next = next.min(self.linger.saturating_sub(since.elapsed()));
                }
                Step {
                    greet: true,
                    resync: false,
                    next: Some(next),
                }
            }
        }
    }

    /// Writes the row, then names the transactions that may have looked before it was there.
    async fn open(&mut self, pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
        let id = match self.id {
            Some(id) => id,
            None => {
                let id: Uuid = sqlx::query_scalar("select gen_random_uuid()")
                    .fetch_one(sked_db::on(pool))
                    .await?;
                *self.id.insert(id)
            }
        };
        listen(pool, id, self.ttl).await?;
        sqlx::query_scalar("select sked.events_running()")
            .fetch_one(sked_db::on(pool))
            .await
    }

    /// Deletes the row (best effort: it expires anyway).
    pub(super) async fn close(&mut self, pool: &PgPool) {
        if matches!(self.state, State::Closed { .. }) {
            return;
        }
        self.state = State::Closed { reopening: false };
        let Some(id) = self.id else { return };
        let deleted = tokio::time::timeout(
            Duration::from_secs(2),
            sqlx::query("select sked.events_unlisten($1)")
                .bind(id)
                .execute(sked_db::on(pool)),
        )
        .await;
        if !matches!(deleted, Ok(Ok(_))) {
            tracing::warn!("live events: could not delete this server's registration; it expires");
        }
    }
}

async fn listen(pool: &PgPool, id: Uuid, ttl: Duration) -> Result<(), sqlx::Error> {
    let ttl = PgInterval::try_from(ttl).unwrap_or(PgInterval {
        months: 0,
        days: 0,
        microseconds: 60_000_000,
    });
    sqlx::query("select sked.events_listen($1, $2)")
        .bind(id)
        .bind(ttl)
        .execute(sked_db::on(pool))
        .await?;
    Ok(())
}
