//! The quota per owner on task rows created through the REST API (`sql/quotas.sql`): a token
//! bucket per owner in `sked.owner_quota`, shared by every server.

use sqlx::PgExecutor;

use crate::{DbError, Result};

/// `sked.owner_quota_take`: takes `rows` task rows from `owner`'s bucket, which fills at
/// `per_minute` rows per minute up to `per_minute`, at the database's `now()`. Run it in the
/// transaction that inserts the rows, before inserting them: the bucket's row stays locked
/// until that transaction ends, and a rollback gives the rows back.
///
/// Answers 0 when the rows were taken, else the seconds until the bucket holds them (nothing
/// was taken): infinite when `rows` is more than `per_minute`.
pub async fn take(db: impl PgExecutor<'_>, owner: &str, rows: u64, per_minute: u64) -> Result<f64> {
    let rows = i64::try_from(rows).map_err(|_| DbError::InvalidInput(format!("{rows} rows")))?;
    let per_minute = i64::try_from(per_minute)
        .map_err(|_| DbError::InvalidInput(format!("{per_minute} rows per minute")))?;
    Ok(
        sqlx::query_scalar("select sked.owner_quota_take($1, $2, $3)")
            .bind(owner)
            .bind(rows)
            .bind(per_minute)
            .fetch_one(db)
            .await?,
    )
}
