//! Task tokens: what a running attempt shows the API to add work to its own workflow
//! (`POST /api/v1/tasks/{id}/spawn`, `sked spawn`).
//!
//! A token is `skt_<task id, 32 hex digits>_<attempt>_<HMAC-SHA256, 64 hex digits>`: the MAC of
//! the task's id and the attempt's number under the cluster's key (`sked.task_token_key`, one
//! row, made by the migration from random bytes; read by the worker and the server roles
//! only). A worker loads the key once at start and mints each attempt's token in memory, so a
//! claim writes nothing for it; the server checks the MAC in constant time. A token says only
//! which attempt it was minted for: whether that attempt still runs is decided by the
//! database, in the transaction that spawns (`sked.task_spawn`), so the token of an attempt
//! that ended spawns nothing. A token is not an API token: it opens no other route.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::{DbError, Result};

/// What every task token starts with (API tokens start with `sked_`).
pub const PREFIX: &str = "skt_";

/// The bytes of a key.
const KEY_BYTES: usize = 32;

/// What the MAC covers before the task and attempt: a token of this kind and version only.
const DOMAIN: &[u8] = b"sked task token v1\0";

/// Whether `token` is a task token by its form (not whether it is valid): such a token is
/// never looked up as an API token.
pub fn is_task_token(token: &str) -> bool {
    token.starts_with(PREFIX)
}

/// The cluster's key of task tokens.
#[derive(Clone)]
pub struct TokenKey([u8; KEY_BYTES]);

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

/// The attempt a valid token was minted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskToken {
    pub task: Uuid,
    pub attempt: i32,
}

/// Why a token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not of the form `skt_<task>_<attempt>_<mac>`.
    Malformed,
    /// Of the form, but its MAC is not the one of its task and attempt under this key.
    Forged,
}

impl Refusal {
    /// The sentence an API client is told.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Malformed => {
                "malformed task token (expected skt_<task id>_<attempt>_<mac>, as a worker gives \
                 a running task in SKED_TOKEN)"
            }
            Refusal::Forged => "invalid task token: it was not minted for this task and attempt",
        }
    }
}

impl TokenKey {
    /// A key of exactly 32 bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<TokenKey> {
        let key: [u8; KEY_BYTES] = bytes.try_into().map_err(|_| {
            DbError::Config(format!(
                "the task token key must be {KEY_BYTES} bytes, it is {}",
                bytes.len()
            ))
        })?;
        Ok(TokenKey(key))
    }

    fn mac(&self, task: Uuid, attempt: i32) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any size");
        mac.update(DOMAIN);
        mac.update(task.as_bytes());
        mac.update(&attempt.to_be_bytes());
        mac
    }

    /// The token of `attempt` of `task`.
    pub fn mint(&self, task: Uuid, attempt: i32) -> String {
        let mac = self.mac(task, attempt).finalize().into_bytes();
        format!(
            "{PREFIX}{}_{attempt}_{}",
            task.as_simple(),
            hex::encode(mac)
        )
    }

    /// The attempt `token` was minted for under this key, or why it is refused. Only the
    /// form [`TokenKey::mint`] writes is read (lowercase hex, an attempt without a sign or
    /// leading zeros); the MAC is compared in constant time.
    pub fn verify(&self, token: &str) -> std::result::Result<TaskToken, Refusal> {
        let (task, attempt, mac) = parse(token).ok_or(Refusal::Malformed)?;
        self.mac(task, attempt)
            .verify_slice(&mac)
            .map_err(|_| Refusal::Forged)?;
        Ok(TaskToken { task, attempt })
    }
}

/// The parts of a token of the minted form.
fn parse(token: &str) -> Option<(Uuid, i32, Vec<u8>)> {
    let rest = token.strip_prefix(PREFIX)?;
    let mut parts = rest.split('_');
    let (task, attempt, mac) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let lower_hex = |s: &str, len: usize| {
        s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !lower_hex(task, 32) || !lower_hex(mac, 64) {
        return None;
    }
    let digits = !attempt.is_empty()
        && attempt.len() <= 10
        && attempt.bytes().all(|b| b.is_ascii_digit())
        && !attempt.starts_with('0');
    if !digits {
        return None;
    }
    let attempt: i32 = attempt.parse().ok()?;
    let task = Uuid::try_parse(task).ok()?;
    let mac = hex::decode(mac).ok()?;
    Some((task, attempt, mac))
}

/// The cluster's key (`sked.task_token_key`), as a worker loads it at start and the server
/// when it checks a token.
pub async fn load(db: impl PgExecutor<'_>) -> Result<TokenKey> {
    let key: Option<Vec<u8>> = sqlx::query_scalar("select key from sked.task_token_key")
        .fetch_optional(db)
        .await?;
    let key = key.ok_or_else(|| {
        DbError::Config("sked.task_token_key holds no key: run `sked migrate`".to_owned())
    })?;
    TokenKey::from_bytes(&key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> TokenKey {
        TokenKey::from_bytes(&[byte; KEY_BYTES]).unwrap()
    }

    fn task() -> Uuid {
        Uuid::parse_str("0191d2a8-7c1e-7a3b-9f00-123456789abc").unwrap()
    }

    #[test]
    fn a_minted_token_names_its_task_and_attempt() {
        let token = key(7).mint(task(), 3);
        assert!(is_task_token(&token), "{token}");
        assert!(
            token.starts_with("skt_0191d2a87c1e7a3b9f00123456789abc_3_"),
            "{token}"
        );
        assert_eq!(token.len(), PREFIX.len() + 32 + 1 + 1 + 1 + 64);
        assert_eq!(
            key(7).verify(&token),
            Ok(TaskToken {
                task: task(),
                attempt: 3
            })
        );
        assert_eq!(
            key(7).mint(task(), 3),
            token,
            "the same attempt, the same token"
        );
    }

    #[test]
    fn a_forged_mac_is_refused() {
        let token = key(7).mint(task(), 1);
        // Every single changed digit of the MAC.
        let mac_at = token.len() - 64;
        for i in mac_at..token.len() {
            let mut bytes = token.clone().into_bytes();
            bytes[i] = if bytes[i] == b'0' { b'1' } else { b'0' };
            let forged = String::from_utf8(bytes).unwrap();
            assert_eq!(key(7).verify(&forged), Err(Refusal::Forged), "{forged}");
        }
        assert_eq!(
            key(8).verify(&token),
            Err(Refusal::Forged),
            "another cluster's key"
        );
        let zeros = format!("skt_{}_1_{}", task().as_simple(), "0".repeat(64));
        assert_eq!(key(7).verify(&zeros), Err(Refusal::Forged));
    }

    #[test]
    fn a_token_does_not_hold_for_another_attempt_or_task() {
        let token = key(7).mint(task(), 1);
        let mac = &token[token.len() - 64..];
        let other_attempt = format!("skt_{}_2_{mac}", task().as_simple());
        assert_eq!(key(7).verify(&other_attempt), Err(Refusal::Forged));
        let other = Uuid::parse_str("0191d2a8-7c1e-7a3b-9f00-123456789abd").unwrap();
        let other_task = format!("skt_{}_1_{mac}", other.as_simple());
        assert_eq!(key(7).verify(&other_task), Err(Refusal::Forged));
        assert_ne!(key(7).mint(task(), 2), token);
        assert_ne!(key(7).mint(other, 1), token);
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let good = key(7).mint(task(), 12);
        let mac = &good[good.len() - 64..];
        let id = task().as_simple().to_string();
        let hyphenated = task().to_string();
        let cases = [
            String::new(),
            "skt_".to_owned(),
            "sked_0123".to_owned(),
            good.replacen("skt_", "SKT_", 1),
            good.replacen("skt_", "skt", 1),
            format!("{good}_"),
            format!("{good}0"),
            good[..good.len() - 1].to_owned(),
            format!("skt_{id}_12_{}", mac.to_uppercase()),
            format!("skt_{}_12_{mac}", id.to_uppercase()),
            format!("skt_{hyphenated}_12_{mac}"),
            format!("skt_{id}__{mac}"),
            format!("skt_{id}_012_{mac}"),
            format!("skt_{id}_+12_{mac}"),
            format!("skt_{id}_-12_{mac}"),
            format!("skt_{id}_0_{mac}"),
            format!("skt_{id}_99999999999_{mac}"),
            format!("skt_{id}_2147483648_{mac}"),
            format!("skt_{id}_1 2_{mac}"),
            format!("skt_{id}_12_{mac}_x"),
            format!("skt_{id}_12"),
            format!("skt_{id}_12_{}", "g".repeat(64)),
            format!("skt_{id}_12_{mac}\n"),
            format!(" {good}"),
            format!("skt_{id}_١٢_{mac}"),
        ];
        for case in cases {
            assert_eq!(key(7).verify(&case), Err(Refusal::Malformed), "{case:?}");
        }
        assert!(key(7).verify(&good).is_ok());
        let largest = key(7).mint(task(), i32::MAX);
        assert_eq!(key(7).verify(&largest).unwrap().attempt, i32::MAX);
    }

    #[test]
    fn a_key_is_32_bytes_and_never_printed() {
        assert!(TokenKey::from_bytes(&[1; 31]).is_err());
        assert!(TokenKey::from_bytes(&[1; 33]).is_err());
        assert_eq!(format!("{:?}", key(7)), "TokenKey(..)");
    }
}
