//! The cluster's retention (`sked.retention_settings`, `sql/retention.sql`): how long finished
//! tasks are kept where their queue sets nothing, and whether retention is on at all. A
//! queue's own retention is one of its controls (`queue::set_limits`); the prunes are duties
//! of the background upkeep (`upkeep.rs`).

use chrono::{DateTime, Utc};
use sked_types::{Retention, RetentionChange};
use sqlx::PgPool;

use crate::Result;

/// The columns of the settings an answer shows.
const SETTINGS: &str = "enabled, extract(epoch from retention)::float8,
                        extract(epoch from keep_failed)::float8,
                        extract(epoch from sked.artifact_grace())::float8,
                        extract(epoch from keep_keys)::float8, updated_at";

type Row = (bool, f64, f64, f64, f64, DateTime<Utc>);

fn settings(row: Row) -> Retention {
    let (
        enabled,
        retention_secs,
        keep_failed_secs,
        artifact_grace_secs,
        keep_keys_secs,
        updated_at,
    ) = row;
    Retention {
        enabled,
        retention_secs,
        keep_failed_secs,
        artifact_grace_secs,
        keep_keys_secs,
        updated_at,
    }
}

/// The cluster's retention (its one row, which a trigger keeps from being deleted).
pub async fn get(pool: &PgPool) -> Result<Retention> {
    let sql = format!("select {SETTINGS} from sked.retention_settings");
    let row: Row = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .fetch_one(crate::on(pool))
        .await?;
    Ok(settings(row))
}

/// Changes the settings given in `change` (absent: unchanged), see `sked.retention_set`.
pub async fn set(pool: &PgPool, change: &RetentionChange) -> Result<Retention> {
    let sql = format!(
        "select {SETTINGS} from sked.retention_set($1, $2 * interval '1 second',
                                                   $3 * interval '1 second',
                                                   $4 * interval '1 second')"
    );
    let row: Row = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(change.enabled)
        .bind(change.retention_secs)
        .bind(change.keep_failed_secs)
        .bind(change.keep_keys_secs)
        .fetch_one(crate::on(pool))
        .await?;
    Ok(settings(row))
}
