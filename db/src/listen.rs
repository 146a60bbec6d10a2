//! `LISTEN` for as long as a process runs: one connection that comes back after it drops.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgListener, PgNotification};
use tokio_util::sync::CancellationToken;

/// What a listening connection hands on.
pub enum Heard {
    /// A notification on one of the channels.
    Notification(PgNotification),
    /// The connection was made, made again, or dropped: notifications sent meanwhile are
    /// lost, so whatever they would have said may have happened.
    MaybeMissed,
}

/// Whether this process can `LISTEN`: not behind a transaction-mode pooler without a direct
/// URL ([`crate::pooler`]). A process that cannot polls instead.
pub fn possible() -> bool {
    crate::pooler::require_session("LISTEN").is_ok()
}

/// Listens on `channels` until `stop`, passing each notification to `heard`, and
/// [`Heard::MaybeMissed`] after every (re)connect and drop. A connection that cannot be made
/// is tried again with backoff (100 ms doubling to 10 s); `what` names the listener in the
/// logs. Behind a transaction-mode pooler without a direct URL for `LISTEN`
/// ([`crate::pooler`]) it does not listen: it says so once and waits for `stop`.
pub async fn listen(
    pool: &PgPool,
    channels: &[&str],
    what: &str,
    stop: &CancellationToken,
    mut heard: impl FnMut(Heard),
) {
    if let Err(e) = crate::pooler::require_session("LISTEN") {
        // Behind a transaction-mode pooler without a direct URL: the caller polls.
        tracing::info!("{what}: not listening ({e}); polling instead");
        stop.cancelled().await;
        return;
    }
    let mut backoff = Duration::from_millis(100);
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&crate::pooler::listen_pool(pool)?).await?;
            listener.listen_all(channels.iter().copied()).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            _ = stop.cancelled() => return,
            l = connected => match l {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "{what}: cannot LISTEN; polling until it is back");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(100);
        heard(Heard::MaybeMissed);
        loop {
            let received = tokio::select! {
                _ = stop.cancelled() => return,
                r = listener.try_recv() => r,
            };
            match received {
                Ok(Some(n)) => heard(Heard::Notification(n)),
                // The connection dropped; the next try_recv reconnects.
                Ok(None) => heard(Heard::MaybeMissed),
                Err(e) => {
                    tracing::warn!(error = %e, "{what}: lost the LISTEN connection");
                    break;
                }
            }
        }
    }
}
