//! The sked schema and its SQL contract, and typed Rust calls into it.
//!
//! Tables come from `migrations/` (embedded with `sqlx::migrate!`); the functions and views
//! that form the public SQL contract come from `sql/` and are re-applied on every migrate.
//! Servers and workers call [`check_schema`] at start and refuse to run against a database
//! whose schema is older or newer than the one compiled into them.

pub mod alert;
pub mod awaits;
pub mod bulk;
pub mod definition;
pub mod error;
pub mod history;
pub mod hosts;
pub mod listen;
pub mod listing;
pub mod metrics;
pub mod overview;
pub mod pooler;
pub mod queue;
pub mod quota;
pub mod retention;
pub mod schedule;
pub mod service;
pub mod task;
pub mod task_token;
pub mod text;
pub mod token;
pub mod upkeep;
pub mod worker;
pub mod workflow;

#[cfg(feature = "testing")]
pub mod testing;

pub use error::{DbError, Result};
pub use pooler::{begin, on};

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, Row};
use std::time::Duration;

/// The migrations compiled into this binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// The SQL contract, applied in this order after the migrations.
pub const CONTRACT: &[(&str, &str)] = &[
    ("sql/states.sql", include_str!("../../sql/states.sql")),
    ("sql/tasks.sql", include_str!("../../sql/tasks.sql")),
    ("sql/queues.sql", include_str!("../../sql/queues.sql")),
    // Before workers.sql: the claim's SQL functions use its shard rules.
    ("sql/shards.sql", include_str!("../../sql/shards.sql")),
    ("sql/workers.sql", include_str!("../../sql/workers.sql")),
    ("sql/workflows.sql", include_str!("../../sql/workflows.sql")),
    (
        "sql/definitions.sql",
        include_str!("../../sql/definitions.sql"),
    ),
    (
        "sql/subworkflows.sql",
        include_str!("../../sql/subworkflows.sql"),
    ),
    ("sql/services.sql", include_str!("../../sql/services.sql")),
    ("sql/schedules.sql", include_str!("../../sql/schedules.sql")),
    ("sql/alerts.sql", include_str!("../../sql/alerts.sql")),
    ("sql/retention.sql", include_str!("../../sql/retention.sql")),
    // Before overview.sql: the overview reads the rollups of finishes.
    ("sql/finishes.sql", include_str!("../../sql/finishes.sql")),
    ("sql/overview.sql", include_str!("../../sql/overview.sql")),
    ("sql/views.sql", include_str!("../../sql/views.sql")),
    ("sql/listing.sql", include_str!("../../sql/listing.sql")),
    ("sql/events.sql", include_str!("../../sql/events.sql")),
    ("sql/worker_io.sql", include_str!("../../sql/worker_io.sql")),
    ("sql/quotas.sql", include_str!("../../sql/quotas.sql")),
    ("sql/awaits.sql", include_str!("../../sql/awaits.sql")),
    // Last: it sets the rights of every function above (see the file's opening comment).
    ("sql/roles.sql", include_str!("../../sql/roles.sql")),
];

/// Advisory lock key held while migrating, so concurrent `sked migrate` runs queue up.
const MIGRATE_LOCK: i64 = 0x736b_6564_6d69_6772; // "skedmigr"

/// The newest migration version this binary knows.
pub fn expected_schema_version() -> i64 {
    MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0)
}

/// Connects a pool to `url`. The application name shows in `pg_stat_activity`. Behind a
/// transaction-mode pooler ([`pooler`]) each checkout of the pool is one transaction.
pub async fn connect(url: &str, app: &str, max_connections: u32) -> Result<PgPool> {
    let members = hosts::Members::parse(url)?
        .map_options(|o| pooler::connection_options(o.application_name(app)));
    let (pool, _) = pooler::pool_options(
        members.options(0),
        max_connections,
        None,
        members.read_write(),
    );
    members.pool(pool).await
}

/// Connects a pool for work that needs sessions of its own (migrations, `CREATE INDEX
/// CONCURRENTLY`), named `what` in the error: to `url`, or to the direct listen URL when `url`
/// leads to a transaction-mode pooler ([`pooler::session_url`]).
pub async fn connect_session(
    url: &str,
    app: &str,
    max_connections: u32,
    what: &str,
) -> Result<PgPool> {
    let members = hosts::Members::parse(pooler::session_url(url, what)?)?
        .map_options(|o| o.application_name(app));
    let mut pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10));
    if members.read_write() {
        pool = pool.after_connect(|conn, _meta| Box::pin(hosts::refuse_standby(conn)));
    }
    members.pool(pool).await
}

/// The group roles of the SQL contract (`sql/roles.sql`, `docs/security.md`): a process may
/// act as the one of its part instead of its login role ([`connect_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRole {
    /// `sked_worker`: the worker's functions only.
    Worker,
    /// `sked_server`: what the REST API needs.
    Server,
}

impl GroupRole {
    /// The role's name in PostgreSQL.
    pub fn name(self) -> &'static str {
        match self {
            GroupRole::Worker => "sked_worker",
            GroupRole::Server => "sked_server",
        }
    }
}

/// Connects a pool as [`connect`] does, whose connections act as `role` (`SET ROLE` on each
/// new connection) when the login role may (it is a member of `role`, or a superuser): a
/// worker or server started with a broader login then holds only its part's rights. Answers
/// whether it does; a login that may not keeps its own rights.
pub async fn connect_as(
    url: &str,
    app: &str,
    max_connections: u32,
    role: GroupRole,
) -> Result<(PgPool, bool)> {
    let members = hosts::Members::parse(url)?
        .map_options(|o| pooler::connection_options(o.application_name(app)));
    let mut probe = members.connect(Duration::from_secs(10)).await?;
    // The simple protocol (no prepared statement), which a transaction-mode pooler passes
    // whole. The name is one of the contract's own. CASE keeps pg_has_role from being asked
    // about a role that does not exist.
    let may: bool = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "select case when exists (select 1 from pg_roles where rolname = '{0}')
                     then pg_has_role(current_user, '{0}', 'MEMBER') else false end",
        role.name()
    )))
    .fetch_one(&mut probe)
    .await?
    .try_get(0)?;
    probe.close().await.ok();
    // Behind a transaction-mode pooler a role set for a session would pass to other clients:
    // the process keeps its login's rights there.
    let may = may && !pooler::transaction_mode();
    let (pool, _) = pooler::pool_options(
        members.options(0),
        max_connections,
        may.then_some(role),
        members.read_write(),
    );
    Ok((members.pool(pool).await?, may))
}

/// Applies the migrations and then the SQL contract, under an advisory lock.
pub async fn migrate(pool: &PgPool) -> Result<()> {
    let mut conn = pool.acquire().await?;
    conn.execute(sqlx::query("select pg_advisory_lock($1)").bind(MIGRATE_LOCK))
        .await?;
    let result = async {
        MIGRATOR.run(&mut *conn).await?;
        let mut tx = conn.begin().await?;
        // `drop … if exists` of a contract function that is already gone is not news.
        tx.execute("set local client_min_messages = warning")
            .await?;
        for (name, sql) in CONTRACT {
            tx.execute(sqlx::raw_sql(*sql))
                .await
                .map_err(|e| DbError::Config(format!("applying {name}: {e}")))?;
        }
        tx.commit().await?;
        Ok::<_, DbError>(())
    }
    .await;
    conn.execute(sqlx::query("select pg_advisory_unlock($1)").bind(MIGRATE_LOCK))
        .await?;
    result
}

/// The newest migration applied to the database (0 when none).
pub async fn schema_version(pool: &PgPool) -> Result<i64> {
    let exists: bool = sqlx::query_scalar("select to_regclass('_sqlx_migrations') is not null")
        .fetch_one(on(pool))
        .await?;
    if !exists {
        return Ok(0);
    }
    let version: Option<i64> =
        sqlx::query_scalar("select max(version) from _sqlx_migrations where success")
            .fetch_one(on(pool))
            .await?;
    Ok(version.unwrap_or(0))
}

/// Fails with [`DbError::SchemaMismatch`] unless the database has exactly the migrations
/// compiled into this binary.
pub async fn check_schema(pool: &PgPool) -> Result<()> {
    let found = schema_version(pool).await?;
    let expected = expected_schema_version();
    if found != expected {
        return Err(DbError::SchemaMismatch { found, expected });
    }
    Ok(())
}
