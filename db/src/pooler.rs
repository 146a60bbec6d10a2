//! Reaching PostgreSQL through a transaction-mode connection pooler (PgBouncer's
//! `pool_mode = transaction`), where each transaction may run on another server connection.
//!
//! What a pooler of that mode breaks, and what sked does about each:
//!
//! - **Prepared statements.** sqlx prepares every query with arguments, parsing in one round
//!   trip and binding in the next: outside a transaction the pooler may send the two to
//!   different server connections. So behind such a pooler every statement sked runs on a
//!   pool runs in a transaction of its own ([`on`]), committed before the call returns, and
//!   every transaction ([`on`], [`begin`]) starts with `DEALLOCATE ALL`: the statements sqlx
//!   names (its statement cache is off, so it never reuses a name) die with the transaction's
//!   use of the server connection, and never meet another client's.
//! - **Session state.** A process cannot take its group role (`sked_worker`, `sked_server`)
//!   for a session: behind such a pooler it has its login's rights, so give each part a login
//!   of its own role (docs/security.md).
//! - **`LISTEN`** needs a session: it goes to the direct URL of the same database
//!   (`--listen-database-url`), and so do migrations and `CREATE INDEX CONCURRENTLY`
//!   ([`session_url`]).
//!
//! The mode is chosen once per process ([`configure`]), from the flags of the `sked` binaries;
//! without it, [`on`] and [`begin`] are the pool's own calls.

use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use futures::TryStreamExt as _;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use sqlx::postgres::{
    PgConnectOptions, PgPool, PgPoolOptions, PgQueryResult, PgRow, PgStatement, PgTypeInfo,
};
use sqlx::{Either, Execute, Executor, Postgres, SqlStr, Transaction};

use crate::{DbError, GroupRole, Result};

/// How a process reaches PostgreSQL.
#[derive(Debug, Clone, Default)]
pub struct Pooling {
    /// Its URL leads to a transaction-mode pooler.
    pub transaction: bool,
    /// A direct URL of the same database: `LISTEN`, migrations, concurrent index builds.
    pub listen_url: Option<String>,
}

static POOLING: OnceLock<Pooling> = OnceLock::new();

/// Sets how this process reaches PostgreSQL, before its first connection. Fails on a listen
/// URL that does not parse, and when called a second time with another setting.
pub fn configure(pooling: Pooling) -> Result<()> {
    if let Some(url) = &pooling.listen_url {
        PgConnectOptions::from_str(url)
            .map_err(|e| DbError::Config(format!("invalid listen database URL: {e}")))?;
    }
    let set = POOLING.get_or_init(|| pooling.clone());
    if set.transaction != pooling.transaction || set.listen_url != pooling.listen_url {
        return Err(DbError::Config(
            "the database pooling of this process is already set".into(),
        ));
    }
    Ok(())
}

/// How this process reaches PostgreSQL (direct, unless [`configure`]d otherwise).
pub fn pooling() -> &'static Pooling {
    POOLING.get_or_init(Pooling::default)
}

/// Whether this process's URL leads to a transaction-mode pooler.
pub fn transaction_mode() -> bool {
    pooling().transaction
}

/// Fails, naming `what`, when this process goes through a transaction-mode pooler and has no
/// direct URL for what needs a session.
pub fn require_session(what: &str) -> Result<()> {
    let p = pooling();
    if p.transaction && p.listen_url.is_none() {
        return Err(DbError::Config(format!(
            "{what} needs a database session, which a transaction-mode pooler does not keep: \
             give a direct URL of the same database with --listen-database-url \
             (SKED_LISTEN_DATABASE_URL)"
        )));
    }
    Ok(())
}

/// The URL for work that needs a session of its own (migrations, `CREATE INDEX
/// CONCURRENTLY`, advisory locks held across transactions): `url` itself when it is direct,
/// the listen URL behind a transaction-mode pooler, else a [`DbError::Config`] naming `what`.
pub fn session_url<'a>(url: &'a str, what: &str) -> Result<&'a str> {
    require_session(what)?;
    let p = pooling();
    match (&p.listen_url, p.transaction) {
        (Some(direct), true) => Ok(direct.as_str()),
        _ => Ok(url),
    }
}

/// Connect options for a session on the database of `pool`: the listen URL's behind a
/// transaction-mode pooler (with `pool`'s application name), else `pool`'s own.
pub fn direct_options(pool: &PgPool) -> Result<PgConnectOptions> {
    let own = pool.connect_options();
    let p = pooling();
    if !p.transaction {
        return Ok((*own).clone());
    }
    require_session("LISTEN")?;
    let url = p.listen_url.as_deref().unwrap_or_default();
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| DbError::Config(format!("invalid listen database URL: {e}")))?;
    Ok(match own.get_application_name() {
        Some(name) => options.application_name(name),
        None => options,
    })
}

/// The pool a `LISTEN` connection is taken from: `pool` itself when it is direct, else a
/// one-connection pool on the listen URL (a configuration error without one).
pub fn listen_pool(pool: &PgPool) -> std::result::Result<PgPool, sqlx::Error> {
    if !transaction_mode() {
        return Ok(pool.clone());
    }
    let options = direct_options(pool).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    Ok(PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options))
}

/// Starts a transaction on `pool`, as [`PgPool::begin`] does; behind a transaction-mode pooler
/// it also drops the named statements the server connection holds (module docs).
///
/// The `BEGIN` runs in a task of its own, which finishes it even when the caller stops
/// waiting (a timeout, a dropped future): sqlx counts a transaction only once its `BEGIN` was
/// answered, so a `BEGIN` cut off on its way would go back to the pool as an open transaction
/// nobody knows of, where the next statements on that connection would run uncommitted,
/// holding their locks (and, behind a pooler, a server connection). A transaction that nobody
/// took is rolled back as its connection goes back to the pool.
pub async fn begin(
    pool: &PgPool,
) -> std::result::Result<Transaction<'static, Postgres>, sqlx::Error> {
    begin_with(pool, "begin").await
}

/// Starts a read-only transaction on `pool` whose statements all see one snapshot (`REPEATABLE
/// READ`), as [`begin`] does.
pub async fn begin_snapshot(
    pool: &PgPool,
) -> std::result::Result<Transaction<'static, Postgres>, sqlx::Error> {
    begin_with(pool, "begin isolation level repeatable read, read only").await
}

/// [`begin`] with the `BEGIN` statement `statement`.
async fn begin_with(
    pool: &PgPool,
    statement: &'static str,
) -> std::result::Result<Transaction<'static, Postgres>, sqlx::Error> {
    let pool = pool.clone();
    tokio::spawn(async move {
        if transaction_mode() {
            pool.begin_with(sqlx::AssertSqlSafe(format!("{statement}; deallocate all")))
                .await
        } else {
            pool.begin_with(statement).await
        }
    })
    .await
    .map_err(|_| sqlx::Error::WorkerCrashed)?
}

/// `pool` as an executor of single statements: the pool itself, or behind a transaction-mode
/// pooler each statement in a transaction of its own, committed before its answer is given.
pub fn on(pool: &PgPool) -> On<'_> {
    On(pool)
}

/// See [`on`].
#[derive(Debug, Clone, Copy)]
pub struct On<'p>(&'p PgPool);

impl<'p> Executor<'p> for On<'p> {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, std::result::Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !transaction_mode() {
            return self.0.fetch_many(query);
        }
        let pool = self.0.clone();
        Box::pin(
            futures::stream::once(async move {
                let mut tx = begin(&pool).await?;
                let items: Vec<_> = tx.fetch_many(query).try_collect().await?;
                tx.commit().await?;
                Ok::<_, sqlx::Error>(futures::stream::iter(items.into_iter().map(Ok)))
            })
            .try_flatten(),
        )
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, std::result::Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if !transaction_mode() {
            return self.0.fetch_optional(query);
        }
        let pool = self.0.clone();
        Box::pin(async move {
            let mut tx = begin(&pool).await?;
            let row = tx.fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, std::result::Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        self.0.prepare_with(sql, parameters)
    }

    fn describe<'e>(
        self,
        sql: SqlStr,
    ) -> BoxFuture<'e, std::result::Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        self.0.describe(sql)
    }
}

/// `options` for a connection through this process's pooler: behind a transaction-mode one,
/// without the startup parameter `extra_float_digits` (PgBouncer refuses those it does not
/// know) and without a statement cache (a named statement does not outlive a transaction).
pub(crate) fn connection_options(options: PgConnectOptions) -> PgConnectOptions {
    if transaction_mode() {
        options.statement_cache_capacity(0).extra_float_digits(None)
    } else {
        options
    }
}

/// Options for the connections of a pool: behind a transaction-mode pooler, see
/// [`connection_options`]; else `role` is set once per connection when given. With
/// `read_write` (`target_session_attrs=read-write`), a new connection to a standby is refused
/// first ([`crate::hosts::refuse_standby`]).
pub(crate) fn pool_options(
    options: PgConnectOptions,
    max_connections: u32,
    role: Option<GroupRole>,
    read_write: bool,
) -> (PgPoolOptions, PgConnectOptions) {
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10));
    let role = role.filter(|_| !transaction_mode());
    let pool = if role.is_some() || read_write {
        pool.after_connect(move |conn, _meta| {
            Box::pin(async move {
                if read_write {
                    crate::hosts::refuse_standby(conn).await?;
                }
                if let Some(role) = role {
                    conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                        "set role {}",
                        role.name()
                    ))))
                    .await?;
                }
                Ok(())
            })
        })
    } else {
        pool
    };
    (pool, connection_options(options))
}
