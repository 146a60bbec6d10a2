//! API tokens: random secrets of which only the SHA-256 is stored.

use rand::RngCore;
use sha2::{Digest, Sha256};
use sqlx::PgPool;

use crate::{DbError, Result};

/// A token's role: a `User` sees and acts on its owner's tasks, an `Admin` on all tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Admin,
    User,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::User => "user",
        }
    }

    pub fn parse(s: &str) -> Result<Role> {
        match s {
            "admin" => Ok(Role::Admin),
            "user" => Ok(Role::User),
            other => Err(DbError::InvalidInput(format!(
                "unknown role {other:?} (expected admin or user)"
            ))),
        }
    }
}

/// Who a valid token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub owner: String,
    pub role: Role,
}

impl Principal {
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// May this principal see and act on a task of `owner`?
    pub fn may_access(&self, owner: &str) -> bool {
        self.is_admin() || self.owner == owner
    }
}

fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Creates a token that never expires and returns its secret, which is shown once and never
/// stored.
pub async fn create(pool: &PgPool, owner: &str, role: Role, name: &str) -> Result<String> {
    create_expiring(pool, owner, role, name, None).await
}

/// Creates a token that expires `expires_in` from now on the database clock (never when
/// `None`) and returns its secret, which is shown once and never stored.
pub async fn create_expiring(
    pool: &PgPool,
    owner: &str,
    role: Role,
    name: &str,
    expires_in: Option<std::time::Duration>,
) -> Result<String> {
    let expires_in = expires_in
        .map(|d| {
            chrono::Duration::from_std(d)
                .ok()
                .filter(|d| *d > chrono::Duration::zero())
                .ok_or_else(|| {
                    DbError::InvalidInput(format!(
                        "a token's lifetime must be positive and finite, got {d:?}"
                    ))
                })
        })
        .transpose()?;
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    let token = format!("sked_{}", hex::encode(bytes));
    sqlx::query(
        "insert into sked.api_tokens (token_sha256, owner, role, name, expires_at)
         values ($1, $2, $3, $4, now() + $5)",
    )
    .bind(digest(&token))
    .bind(owner)
    .bind(role.as_str())
    .bind(name)
    .bind(expires_in)
    .execute(crate::on(pool))
    .await?;
    Ok(token)
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No token has this secret, or it was revoked.
    UnknownOrRevoked,
    /// The token expired at this time.
    Expired(chrono::DateTime<chrono::Utc>),
}

impl Refusal {
    /// The sentence an API client is told.
    pub fn message(&self) -> String {
        match self {
            Refusal::UnknownOrRevoked => "unknown or revoked token".to_owned(),
            Refusal::Expired(at) => format!(
                "the token expired at {} (create a new one with `sked token create`)",
                at.format("%Y-%m-%d %H:%M:%S UTC")
            ),
        }
    }
}

/// The principal of a token, or why it is refused (unknown, revoked, or expired on the
/// database clock).
pub async fn check(pool: &PgPool, token: &str) -> Result<std::result::Result<Principal, Refusal>> {
    // A task token is no API token, whatever the table holds (`crate::task_token`).
    if crate::task_token::is_task_token(token) {
        return Ok(Err(Refusal::UnknownOrRevoked));
    }
    type Row = (String, String, Option<chrono::DateTime<chrono::Utc>>, bool);
    let row: Option<Row> = sqlx::query_as(
        "select owner, role, expires_at, coalesce(expires_at <= now(), false) from sked.api_tokens
          where token_sha256 = $1 and revoked_at is null",
    )
    .bind(digest(token))
    .fetch_optional(crate::on(pool))
    .await?;
    Ok(match row {
        None => Err(Refusal::UnknownOrRevoked),
        Some((_, _, Some(at), true)) => Err(Refusal::Expired(at)),
        Some((owner, role, _, _)) => Ok(Principal {
            owner,
            role: Role::parse(&role)?,
        }),
    })
}

/// Checks many tokens in one statement (the live events check their clients' tokens so):
/// for each of `tokens`, in order, `Ok(())` while it is valid, else why it is refused.
pub async fn check_many(
    pool: &PgPool,
    tokens: &[&str],
) -> Result<Vec<std::result::Result<(), Refusal>>> {
    let digests: Vec<Vec<u8>> = tokens.iter().map(|t| digest(t)).collect();
    type Row = (Vec<u8>, Option<chrono::DateTime<chrono::Utc>>, bool);
    let rows: Vec<Row> = sqlx::query_as(
        "select token_sha256, expires_at, coalesce(expires_at <= now(), false)
           from sked.api_tokens
          where token_sha256 = any($1) and revoked_at is null",
    )
    .bind(&digests)
    .fetch_all(crate::on(pool))
    .await?;
    let found: std::collections::HashMap<Vec<u8>, (Option<chrono::DateTime<chrono::Utc>>, bool)> =
        rows.into_iter()
            .map(|(d, at, expired)| (d, (at, expired)))
            .collect();
    Ok(digests
        .iter()
        .map(|d| match found.get(d) {
            None => Err(Refusal::UnknownOrRevoked),
            Some((Some(at), true)) => Err(Refusal::Expired(*at)),
            Some(_) => Ok(()),
        })
        .collect())
}

/// The principal of a token, or `None` when the token is unknown, revoked or expired.
pub async fn authenticate(pool: &PgPool, token: &str) -> Result<Option<Principal>> {
    Ok(check(pool, token).await?.ok())
}

/// True when at least one admin token exists.
pub async fn admin_exists(pool: &PgPool) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "select exists (select 1 from sked.api_tokens
                         where role = 'admin' and revoked_at is null
                           and (expires_at is null or expires_at > now()))",
    )
    .fetch_one(crate::on(pool))
    .await?)
}

/// A token as listed: never its secret.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TokenInfo {
    pub id: uuid::Uuid,
    pub owner: String,
    pub role: String,
    pub name: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Every token, oldest first.
pub async fn list(pool: &PgPool) -> Result<Vec<TokenInfo>> {
    Ok(sqlx::query_as(
        "select id, owner, role, name, created_at, revoked_at, expires_at
           from sked.api_tokens order by created_at",
    )
    .fetch_all(crate::on(pool))
    .await?)
}

/// Revokes a token by id; false when no unrevoked token has that id. A revoked token is
/// refused from the next request on.
pub async fn revoke(pool: &PgPool, id: uuid::Uuid) -> Result<bool> {
    let done = sqlx::query(
        "update sked.api_tokens set revoked_at = now() where id = $1 and revoked_at is null",
    )
    .bind(id)
    .execute(crate::on(pool))
    .await?;
    Ok(done.rows_affected() == 1)
}
