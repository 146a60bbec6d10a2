//! Reads that tolerate staleness, served from a streaming replica of the database
//! (`--read-database-url`) while it is at most `--read-max-staleness` behind the primary.
//!
//! A background task asks the replica every second (and when the last answer runs out)
//! how far behind it is: 0 when it has
//! replayed all the WAL it received (`pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()`,
//! caught up even when the primary is idle), else the age of the last transaction it replayed
//! (`now() - pg_last_xact_replay_timestamp()`). It also checks that the replica is one
//! (`pg_is_in_recovery()`) and has the schema this server was built for. From a check that
//! measured a lag `L`, the replica serves reads until `max_staleness - L` after that check
//! began, so an answer is never older than the bound by the replica's own measure, even when
//! a check is late. Past it, when the replica does not answer, or is not a replica, reads go
//! to the primary, and they come back with the next check that finds the replica within the
//! bound. Handlers never query to decide: the decision is one atomic (`Reads::replica`).
//!
//! A read that fails on the replica with anything but the request's own error (a connection
//! lost, a query cancelled by a conflict with recovery) runs again on the primary, and the
//! replica serves nothing until its next good check.
//!
//! Which reads may be stale is decided in the handlers, each through `AppState::read`
//! (`docs/operations.md`, "Read replica"): listings, counts, the overview, the history,
//! log chunks and the workers. Writes, what a caller reads right after its own write (a
//! task, a workflow or a schedule by id, long polls, idempotency lookups), token checks and
//! live events use the primary only.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Executor, Row};
use tokio_util::sync::CancellationToken;

/// `--read-max-staleness` by default.
pub const DEFAULT_MAX_STALENESS: Duration = Duration::from_secs(5);
/// How often the replica's lag is measured.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);
/// The shortest time between checks, when a replica is about to pass the bound.
const MIN_CHECK_EVERY: Duration = Duration::from_millis(100);
/// The longest a check may take; a replica that answers slower serves nothing.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the server sends reads that tolerate staleness (`--read-database-url`,
/// `--read-max-staleness`).
#[derive(Clone, PartialEq, Eq)]
pub struct ReadReplica {
    /// The replica's URL; `None`: every read goes to the primary.
    pub url: Option<String>,
    /// The most a read served by the replica may lag behind the primary.
    pub max_staleness: Duration,
}

impl Default for ReadReplica {
    fn default() -> Self {
        ReadReplica {
            url: None,
            max_staleness: DEFAULT_MAX_STALENESS,
        }
    }
}

impl std::fmt::Debug for ReadReplica {
    // The URL may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadReplica")
            .field("url", &self.url.as_ref().map(|_| "…"))
            .field("max_staleness", &self.max_staleness)
            .finish()
    }
}

/// Reads `--read-max-staleness`: a duration of at least 1 s and at most an hour.
pub(crate) fn parse_max_staleness(s: &str) -> Result<Duration, String> {
    let secs = sked_types::duration::parse_duration(s, "--read-max-staleness", 1.0)?;
    if secs > 3600.0 {
        return Err(format!(
            "--read-max-staleness must be at most an hour, got {s}"
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The replica of a server, if it has one. Cloned into every request's state.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reads(Option<Arc<Replica>>);

/// A replica's pool and what its last check found.
pub(crate) struct Replica {
    pub(crate) pool: PgPool,
    max_staleness: Duration,
    /// The origin of the milliseconds below.
    origin: Instant,
    /// Milliseconds after `origin` until which the replica serves reads; 0: it does not.
    serves_until: AtomicU64,
    /// The lag the last check measured, in milliseconds; `u64::MAX`: unknown (the check
    /// failed).
    lag_ms: AtomicU64,
}

impl std::fmt::Debug for Replica {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("max_staleness", &self.max_staleness)
            .field("serving", &self.serving())
            .finish()
    }
}

/// What a check of the replica found: its lag, or why it serves nothing.
type Checked = Result<Duration, String>;

impl Reads {
    /// A pool on `config`'s replica with `size` connections, opened as they are needed (a
    /// replica down at start only sends reads to the primary), each acting as `sked_server`
    /// when its login may, as the primary's connections do (`sked_db::connect_as`). `None`
    /// without a URL.
    pub(crate) fn connect(config: &ReadReplica, size: u32) -> Result<Reads, String> {
        let Some(url) = &config.url else {
            return Ok(Reads(None));
        };
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| format!("--read-database-url is not a valid database URL: {e}"))?
            .application_name("sked-server-reads");
        let role = sked_db::GroupRole::Server.name();
        let pool = PgPoolOptions::new()
            .max_connections(size)
            .acquire_timeout(CHECK_TIMEOUT)
            .after_connect(move |conn, _meta| {
                Box::pin(async move {
                    // CASE keeps pg_has_role from being asked about a role that does not
                    // exist.
                    let may: bool = sqlx::query_scalar(
                        "select case when exists (select 1 from pg_roles where rolname = $1)
                                     then pg_has_role(current_user, $1, 'MEMBER') else false end",
                    )
                    .bind(role)
                    .fetch_one(&mut *conn)
                    .await?;
                    if may {
                        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                            "set role {role}"
                        ))))
                        .await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        Ok(Reads(Some(Arc::new(Replica {
            pool,
            max_staleness: config.max_staleness,
            origin: Instant::now(),
            serves_until: AtomicU64::new(0),
            lag_ms: AtomicU64::new(u64::MAX),
        }))))
    }

    /// The replica, when it serves reads now.
    pub(crate) fn replica(&self) -> Option<&Replica> {
        self.0.as_deref().filter(|r| r.serving())
    }

    /// The replica's state for `GET /api/v1/health`; `None` without one.
    pub(crate) fn status(&self) -> Option<sked_types::ReadRouting> {
        let replica = self.0.as_deref()?;
        let lag_ms = replica.lag_ms.load(Ordering::Relaxed);
        Some(sked_types::ReadRouting {
            on_replica: replica.serving(),
            replica_lag_secs: (lag_ms != u64::MAX).then(|| lag_ms as f64 / 1000.0),
            max_staleness_secs: replica.max_staleness.as_secs_f64(),
        })
    }

    /// Measures the replica's lag every [`CHECK_EVERY`] until `stop`; nothing without one.
    pub(crate) async fn watch(self, stop: CancellationToken) {
        let Some(replica) = self.0 else {
            return;
        };
        let mut was: Option<Result<(), String>> = None;
        loop {
            let began = replica.now_ms();
            let checked = tokio::select! {
                checked = replica.check() => checked,
                () = stop.cancelled() => break,
            };
            let now = match &checked {
                Ok(lag) if *lag <= replica.max_staleness => Ok(()),
                Ok(lag) => Err(format!(
                    "it is {:.1} s behind the primary, more than --read-max-staleness ({:.1} s)",
                    lag.as_secs_f64(),
                    replica.max_staleness.as_secs_f64()
                )),
                Err(why) => Err(why.clone()),
            };
            replica.record(&checked, began);
            // One line when the reads change side (and when the reason they stay on the
            // primary changes kind: a lag keeps one message while its figure grows).
            let changed = match (&was, &now) {
                (None, _) => true,
                (Some(Ok(())), Ok(())) => false,
                (Some(Err(_)), Err(_)) => false,
                _ => true,
            };
            if changed {
                match &now {
                    Ok(()) => tracing::info!(
                        lag_secs = checked.as_ref().map(|l| l.as_secs_f64()).unwrap_or(0.0),
                        "reads that tolerate staleness go to the read replica"
                    ),
                    Err(why) => tracing::warn!(
                        reason = %why,
                        "reads that tolerate staleness go to the primary: the read replica \
                         cannot serve them"
                    ),
                }
            }
            was = Some(now);
            // The next check at the latest when the replica stops serving by this one's
            // measure, so that a replica falling behind is told (and logged) then.
            let left = replica
                .serves_until
                .load(Ordering::Relaxed)
                .saturating_sub(replica.now_ms());
            let next = match Duration::from_millis(left) {
                left if left.is_zero() => CHECK_EVERY,
                left => left.clamp(MIN_CHECK_EVERY, CHECK_EVERY),
            };
            tokio::select! {
                () = tokio::time::sleep(next) => {}
                () = stop.cancelled() => break,
            }
        }
    }

    /// Closes the replica's connections (once the server has answered its last request).
    pub(crate) async fn close(&self) {
        if let Some(replica) = &self.0 {
            let _ = tokio::time::timeout(Duration::from_secs(5), replica.pool.close()).await;
        }
    }
}

impl Replica {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Whether the replica serves reads now.
    fn serving(&self) -> bool {
        self.now_ms() < self.serves_until.load(Ordering::Relaxed)
    }

    /// A read on the replica failed: it serves nothing until its next good check.
    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        self.serves_until.store(0, Ordering::Relaxed);
        self.lag_ms.store(u64::MAX, Ordering::Relaxed);
        tracing::warn!(%error, "a read failed on the read replica; it runs on the primary");
    }

    /// Stores what a check begun at `began` found.
    fn record(&self, checked: &Checked, began: u64) {
        match checked {
            Ok(lag) => {
                let lag_ms = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX - 1);
                self.lag_ms.store(lag_ms, Ordering::Relaxed);
                let max_ms = u64::try_from(self.max_staleness.as_millis()).unwrap_or(u64::MAX);
                let until = match max_ms.checked_sub(lag_ms) {
                    Some(left) => began.saturating_add(left),
                    None => 0,
                };
                self.serves_until.store(until, Ordering::Relaxed);
            }
            Err(_) => {
                self.lag_ms.store(u64::MAX, Ordering::Relaxed);
                self.serves_until.store(0, Ordering::Relaxed);
            }
        }
    }

    /// The replica's lag behind the primary, or why it may serve nothing.
    async fn check(&self) -> Checked {
        let query = sqlx::query(
            "select pg_is_in_recovery() as in_recovery,
                    case when pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() then 0::float8
                         else extract(epoch from now() - pg_last_xact_replay_timestamp())::float8
                    end as lag,
                    (select max(version) from _sqlx_migrations where success) as schema",
        )
        .fetch_one(sked_db::on(&self.pool));
        let row = match tokio::time::timeout(CHECK_TIMEOUT, query).await {
            Ok(Ok(row)) => row,
            Ok(Err(e)) => return Err(format!("it does not answer: {e}")),
            Err(_) => {
                return Err(format!(
                    "it did not answer within {} s",
                    CHECK_TIMEOUT.as_secs()
                ));
            }
        };
        let field = |e: sqlx::Error| format!("its answer is unreadable: {e}");
        let in_recovery: bool = row.try_get("in_recovery").map_err(field)?;
        let lag: Option<f64> = row.try_get("lag").map_err(field)?;
        let schema: Option<i64> = row.try_get("schema").map_err(field)?;
        if !in_recovery {
            return Err(
                "it is not in recovery: it is no replica (a promoted one, or a \
                        primary), whose data may differ from the primary's"
                    .to_owned(),
            );
        }
        let expected = sked_db::expected_schema_version();
        if schema != Some(expected) {
            return Err(format!(
                "its schema is version {}, this server's is {expected}",
                schema.unwrap_or(0)
            ));
        }
        match lag {
            Some(lag) => Ok(Duration::from_secs_f64(lag.max(0.0))),
            None => Err(
                "it has replayed no transaction since it started and has not \
                         replayed all it received"
                    .to_owned(),
            ),
        }
    }
}
