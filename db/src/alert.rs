//! Alert targets (`sql/alerts.sql`, `docs/operations.md`): the webhooks notifications are
//! delivered to, defined by admins, and what a worker reads to deliver one.

use chrono::{DateTime, Utc};
use sked_types::AlertTarget;
use sqlx::PgPool;

use crate::Result;

/// Creates or replaces the target `name`.
pub async fn set(
    pool: &PgPool,
    name: &str,
    url: &str,
    secret: &str,
    queue: &str,
    max_attempts: i32,
) -> Result<()> {
    sqlx::query("select sked.alert_target_set($1, $2, $3, $4, $5)")
        .bind(name)
        .bind(url)
        .bind(secret)
        .bind(queue)
        .bind(max_attempts)
        .execute(crate::on(pool))
        .await?;
    Ok(())
}

/// Deletes the target `name`; false when there was none.
pub async fn delete(pool: &PgPool, name: &str) -> Result<bool> {
    Ok(sqlx::query_scalar("select sked.alert_target_delete($1)")
        .bind(name)
        .fetch_one(crate::on(pool))
        .await?)
}

/// Every target, by name, without secrets.
pub async fn list(pool: &PgPool) -> Result<Vec<AlertTarget>> {
    type Row = (String, String, String, i32, DateTime<Utc>, DateTime<Utc>);
    let rows: Vec<Row> = sqlx::query_as(
        "select name, url, queue, max_attempts, created_at, updated_at
           from sked.alert_targets_list()",
    )
    .fetch_all(crate::on(pool))
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(name, url, queue, max_attempts, created_at, updated_at)| AlertTarget {
                name,
                url,
                queue,
                max_attempts,
                created_at,
                updated_at,
            },
        )
        .collect())
}

/// The URL and secret of the target `name`, for a delivery; `None` when it no longer exists.
pub async fn for_delivery(pool: &PgPool, name: &str) -> Result<Option<(String, String)>> {
    Ok(
        sqlx::query_as("select url, secret from sked.alert_target_for_delivery($1)")
            .bind(name)
            .fetch_optional(crate::on(pool))
            .await?,
    )
}

/// Sets the notify of `queue`'s tasks that have none of their own (`None`: none).
pub async fn set_queue_notify(
    pool: &PgPool,
    queue: &str,
    notify: Option<&serde_json::Value>,
) -> Result<()> {
    sqlx::query("select sked.queue_set_notify($1, $2)")
        .bind(queue)
        .bind(notify)
        .execute(crate::on(pool))
        .await?;
    Ok(())
}
