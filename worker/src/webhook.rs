//! The delivery of an alert (`docs/operations.md`, "Alerts"): a `webhook` task, inserted by
//! sked when a task's `notify` names an alert target, has the input `{"target": NAME,
//! "event": EVENT}`. The worker POSTs EVENT as JSON to the target's URL, signed with the
//! target's secret; a 2xx answer delivers it, anything else (another status, no answer within
//! the timeout, a refused connection, a target that no longer exists) fails the attempt,
//! which is retried with backoff like any task's, up to the target's `max_attempts`.
//!
//! Headers: `X-Sked-Event` (e.g. `task.failed`), `X-Sked-Delivery` (the webhook task's id,
//! the same on every attempt: a receiver drops what it has seen), `X-Sked-Attempt`,
//! `X-Sked-Timestamp` (Unix seconds) and `X-Sked-Signature: sha256=HEX`, the HMAC-SHA256 under
//! the secret of `TIMESTAMP.BODY`. Redirects are not followed.

use std::sync::LazyLock;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use sked_db::worker::Claimed;
use tokio_util::sync::CancellationToken;

use crate::process::Ended;
use crate::runner::Context;

/// A delivery's timeout when its task sets none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of a refusing answer's body kept in the attempt's error.
const ERROR_BODY_BYTES: usize = 512;

static CLIENT: LazyLock<reqwest::Client> = LazyLock::new(|| {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .user_agent(concat!("sked/", env!("CARGO_PKG_VERSION")))
        .build()
        .expect("an HTTP client")
});

/// The signature of a body sent at `timestamp` (Unix seconds) under `secret`:
/// `sha256=` and the hex HMAC-SHA256 of `TIMESTAMP.BODY`.
pub fn signature(secret: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes a key of any size");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// Delivers the event of a `webhook` task; an error is the attempt's failure.
pub async fn deliver(
    ctx: &Context,
    task: &Claimed,
    timeout: Option<Duration>,
    stop: &CancellationToken,
) -> Result<Ended, String> {
    let input = task
        .input
        .as_ref()
        .ok_or("a webhook task has the input {\"target\": NAME, \"event\": EVENT}")?;
    let target = input
        .get("target")
        .and_then(|t| t.as_str())
        .ok_or("a webhook task's input names its target")?;
    let event = input
        .get("event")
        .ok_or("a webhook task's input holds its event")?;
    let (url, secret) = sked_db::alert::for_delivery(&ctx.pool, target)
        .await
        .map_err(|e| format!("reading the alert target {target}: {e}"))?
        .ok_or_else(|| format!("no alert target is named {target} (it was deleted?)"))?;
    let body = serde_json::to_vec(event).map_err(|e| e.to_string())?;
    let timestamp = chrono::Utc::now().timestamp();
    let request = CLIENT
        .post(&url)
        .timeout(timeout.unwrap_or(DEFAULT_TIMEOUT))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(
            "X-Sked-Event",
            event.get("event").and_then(|e| e.as_str()).unwrap_or(""),
        )
        .header("X-Sked-Delivery", task.id.to_string())
        .header("X-Sked-Attempt", task.attempt.to_string())
        .header("X-Sked-Timestamp", timestamp.to_string())
        .header("X-Sked-Signature", signature(&secret, timestamp, &body))
        .body(body);
    let sent = async {
        let mut response = request.send().await.map_err(|e| {
            // The URL is the operator's; say where, without a query string.
            let at = url.split(['?', '#']).next().unwrap_or(&url);
            if e.is_timeout() {
                format!("the webhook {target} ({at}) did not answer in time")
            } else {
                format!(
                    "the webhook {target} ({at}) could not be reached: {}",
                    error_chain(&e)
                )
            }
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(Ended::Exited(success()));
        }
        let mut said = Vec::new();
        while said.len() < ERROR_BODY_BYTES {
            match response.chunk().await {
                Ok(Some(chunk)) => said.extend_from_slice(&chunk),
                _ => break,
            }
        }
        said.truncate(ERROR_BODY_BYTES);
        Err(format!(
            "the webhook {target} answered {status}: {}",
            crate::sanitize::text(&String::from_utf8_lossy(&said))
        ))
    };
    tokio::select! {
        result = sent => result,
        _ = stop.cancelled() => Ok(Ended::Stopped),
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn success() -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    std::process::ExitStatus::from_raw(0)
}

#[cfg(test)]
mod tests {
    use super::signature;

    #[test]
    fn the_signature_is_the_hmac_of_the_timestamp_and_the_body() {
        // tests/it/alerts.rs checks it against HMAC computed by hand from SHA-256.
        let s = signature(
            "0123456789abcdef",
            1_700_000_000,
            b"{\"event\":\"task.failed\"}",
        );
        assert!(s.starts_with("sha256="));
        assert_eq!(s.len(), "sha256=".len() + 64);
        assert_ne!(
            s,
            signature(
                "0123456789abcdeg",
                1_700_000_000,
                b"{\"event\":\"task.failed\"}"
            ),
            "another secret, another signature"
        );
        assert_ne!(
            s,
            signature(
                "0123456789abcdef",
                1_700_000_001,
                b"{\"event\":\"task.failed\"}"
            ),
            "another time, another signature"
        );
    }
}
