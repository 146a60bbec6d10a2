//! The websocket of one client of the live events: authentication, then the pump that
//! writes the frames the hub queued for it, pings it, closes the socket once the hub found
//! its token revoked or expired (the hub checks every client's token every few seconds, in
//! one statement), and closes it when the hub stops.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, header};
use axum::response::Response;
use futures::SinkExt;
use sked_db::token::{Principal, Refusal};
use sked_types::events::{CLOSE_TOO_SLOW, CLOSE_UNAUTHORIZED, ClientMessage, ServerEvent};
use tokio::time::Instant;

use super::{EventsConfig, Hub, LAGGED, Shared, Subscription, frame};
use crate::AppState;
use crate::error::Error;

/// The read buffer of each socket: what a client sends fits in it (a longer frame grows it).
const READ_BUFFER_SIZE: usize = 4 * 1024;
/// The largest frame or message a client may send (its `auth` frame holds a token); a longer
/// one ends its socket.
const MAX_CLIENT_MESSAGE: usize = 16 * 1024;
/// Close code when the server shuts down (the standard "going away").
const CLOSE_GOING_AWAY: u16 = 1001;
/// Close code when the database could not check the token (the standard "internal error").
const CLOSE_INTERNAL: u16 = 1011;

/// `GET /api/v1/events`: upgrades to a websocket of live events (protocol in
/// `sked_types::events`). The token comes from the `Authorization: Bearer` header, else from
/// the first frame; a refused token closes the socket with code 4401 and a reason.
pub(crate) async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, Error> {
    let Some(hub) = state.events.clone() else {
        return Err(Error::NotFound(
            "live events are served only by a running server".to_owned(),
        ));
    };
    let upgrade = upgrade
        .map_err(|r| Error::InvalidRequest(r.body_text()))?
        // The websocket layer's read buffer is allocated and zeroed whole for every socket
        // (128 KiB by default); a client sends only its `auth` frame and pongs.
        .read_buffer_size(READ_BUFFER_SIZE)
        .max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE);
    let token = bearer(&headers);
    Ok(upgrade.on_upgrade(move |socket| client(socket, hub, token)))
}

/// The token of an `Authorization: Bearer` header: `None` without the header, an error for a
/// malformed one.
fn bearer(headers: &HeaderMap) -> Option<Result<String, &'static str>> {
    let value = headers.get(header::AUTHORIZATION)?;
    Some(
        value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim().to_owned())
            .filter(|token| !token.is_empty())
            .ok_or("malformed Authorization header (expected `Bearer <token>`)"),
    )
}

async fn client(mut socket: WebSocket, hub: Hub, token: Option<Result<String, &'static str>>) {
    let (token, principal) = match authenticate(&mut socket, &hub, token).await {
        Ok(authenticated) => authenticated,
        Err((code, reason)) => {
            close(&mut socket, code, reason, CLOSE_WAIT).await;
            return;
        }
    };
    let subscription = hub.subscribe(principal.clone(), &token);
    pump(socket, &hub.shared, principal, subscription).await;
}

/// What a client whose token is refused is told in the close frame.
pub(super) fn refusal_reason(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::UnknownOrRevoked => "unknown or revoked token",
        Refusal::Expired(_) => "the token expired",
    }
}

/// Who the client is: the header's token, else the one of its first frame within the auth
/// timeout, with the token. On failure, the close code and reason.
async fn authenticate(
    socket: &mut WebSocket,
    hub: &Hub,
    token: Option<Result<String, &'static str>>,
) -> Result<(String, Principal), (u16, &'static str)> {
    let token = match token {
        Some(header) => header.map_err(|reason| (CLOSE_UNAUTHORIZED, reason))?,
        None => first_frame_token(socket, hub.shared.config.auth_timeout).await?,
    };
    match sked_db::token::check(&hub.shared.pool, &token).await {
        Ok(Ok(principal)) => Ok((token, principal)),
        Ok(Err(refusal)) => Err((CLOSE_UNAUTHORIZED, refusal_reason(&refusal))),
        Err(e) => {
            tracing::warn!(error = %e, "live events: checking a client's token failed");
            Err((CLOSE_INTERNAL, "the database is unavailable"))
        }
    }
}

async fn first_frame_token(
    socket: &mut WebSocket,
    timeout: Duration,
) -> Result<String, (u16, &'static str)> {
    let deadline = Instant::now() + timeout;
    loop {
        let received = tokio::time::timeout_at(deadline, socket.recv())
            .await
            .map_err(|_| (CLOSE_UNAUTHORIZED, "no auth frame in time"))?;
        match received {
            // Pings are answered by the websocket layer; wait for the real first frame.
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Text(text))) => {
                return match serde_json::from_str::<ClientMessage>(&text) {
                    Ok(ClientMessage::Auth { token }) => Ok(token),
                    Err(_) => Err((
                        CLOSE_UNAUTHORIZED,
                        "expected {\"type\":\"auth\",\"token\":…} as the first frame",
                    )),
                };
            }
            Some(Ok(_)) => {
                return Err((
                    CLOSE_UNAUTHORIZED,
                    "expected {\"type\":\"auth\",\"token\":…} as the first frame",
                ));
            }
            Some(Err(_)) | None => return Err((CLOSE_UNAUTHORIZED, "closed before auth")),
        }
    }
}

/// Writes the client's frames until it leaves, stops answering, is stuck, or the hub stops.
async fn pump(
    mut socket: WebSocket,
    shared: &Shared,
    principal: Principal,
    mut subscription: Subscription,
) {
    let config = &shared.config;
    // Greet the client once the hub listens and the triggers notify (at once, unless this is
    // the server's first client since a while, or its connection was lost). If that takes
    // too long, greet it anyway: it gets `resync` when both are back.
    let mut ready = shared.ready.subscribe();
    let stopped = tokio::select! {
        _ = shared.stop.cancelled() => true,
        _ = tokio::time::timeout(config.send_timeout, async {
            let _ = ready.wait_for(|ready| *ready).await;
        }) => false,
    };
    if stopped {
        close(&mut socket, CLOSE_GOING_AWAY, SHUTTING_DOWN, CLOSE_WAIT).await;
        return;
    }
    let hello = frame(&ServerEvent::Hello {
        owner: principal.owner.clone(),
        role: principal.role.as_str().to_owned(),
    });
    if !send(&mut socket, Message::Text(hello), config).await {
        return;
    }
    let mut ping =
        tokio::time::interval_at(Instant::now() + config.ping_interval, config.ping_interval);
    let mut last_heard = Instant::now();
    loop {
        let message = tokio::select! {
            _ = shared.stop.cancelled() => {
                close(&mut socket, CLOSE_GOING_AWAY, SHUTTING_DOWN, CLOSE_WAIT).await;
                return;
            }
            frame = subscription.frames.recv() => match frame {
                Some(text) => Some(Message::Text(text)),
                None => {
                    close(&mut socket, CLOSE_GOING_AWAY, SHUTTING_DOWN, CLOSE_WAIT).await;
                    return;
                }
            },
            _ = subscription.signals.wake.notified() => {
                // The hub found the token revoked or expired.
                let refused = subscription.signals.refused.lock().expect("client signals").take();
                if let Some(reason) = refused {
                    tracing::info!(owner = %principal.owner, reason, "live events: closing the socket of a token no longer valid");
                    close(&mut socket, CLOSE_UNAUTHORIZED, reason, CLOSE_WAIT).await;
                    return;
                }
                None
            }
            received = socket.recv() => match received {
                // Answer the client's close frame (queued by the websocket layer) and go.
                Some(Ok(Message::Close(_))) => {
                    let _ = tokio::time::timeout(CLOSE_WAIT, socket.flush()).await;
                    return;
                }
                Some(Err(_)) | None => return,
                // Pongs, and pings (which the websocket layer answers); other frames are
                // ignored.
                Some(Ok(_)) => {
                    last_heard = Instant::now();
                    None
                }
            },
            _ = ping.tick() => {
                if last_heard.elapsed() > 2 * config.ping_interval {
                    tracing::debug!(owner = %principal.owner, "live events: dropping a client that stopped answering pings");
                    close(&mut socket, CLOSE_TOO_SLOW, NO_PONG, config.close_timeout).await;
                    return;
                }
                Some(Message::Ping(Bytes::new()))
            }
        };
        if let Some(message) = message
            && !send(&mut socket, message, config).await
        {
            return;
        }
        // Frames were dropped while the queue was full; now that it is empty, tell the
        // client to refetch.
        if subscription.frames.is_empty()
            && subscription.signals.dropped.swap(false, Ordering::SeqCst)
        {
            let resync = frame(&ServerEvent::Resync {
                reason: LAGGED.to_owned(),
            });
            if !send(&mut socket, Message::Text(resync), config).await {
                return;
            }
        }
    }
}

/// Reason of the close frame when the server shuts down.
const SHUTTING_DOWN: &str = "the server is shutting down";
/// Reason of the close frame of a client whose socket accepted nothing for the send timeout.
const STUCK: &str = "this client read too slowly";
/// Reason of the close frame of a client that answered no ping.
const NO_PONG: &str = "this client read too slowly: it answered no ping";
/// How long a client closed for another reason than its slowness has to take the close frame
/// and answer it.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Writes one message; false when the client is gone, or when its socket accepted nothing
/// for the send timeout: then it is sent `resync` and a close frame (4408), which it gets if
/// it reads them within the close timeout, and the socket is dropped.
async fn send(socket: &mut WebSocket, message: Message, config: &EventsConfig) -> bool {
    match tokio::time::timeout(config.send_timeout, socket.send(message)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "live events: a client went away");
            false
        }
        Err(_) => {
            tracing::info!(
                timeout_secs = config.send_timeout.as_secs_f64(),
                "live events: disconnecting a client that read nothing"
            );
            // The frame in flight stays queued in the socket; `resync` and the close frame
            // follow it, so a client that reads again learns what happened.
            let resync = frame(&ServerEvent::Resync {
                reason: LAGGED.to_owned(),
            });
            let deadline = Instant::now() + config.close_timeout;
            if let Ok(Ok(())) =
                tokio::time::timeout_at(deadline, socket.send(Message::Text(resync))).await
            {
                close(
                    socket,
                    CLOSE_TOO_SLOW,
                    STUCK,
                    deadline.saturating_duration_since(Instant::now()),
                )
                .await;
            }
            false
        }
    }
}

/// Closes the socket with `code` and `reason`: sends the close frame, then reads what the
/// client sends until it answers with its own, all within `within`. Reading to the end
/// matters: a socket dropped with unread bytes makes the kernel reset the connection, and
/// the client may then never see the close frame.
async fn close(socket: &mut WebSocket, code: u16, reason: &'static str, within: Duration) {
    let frame = CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    };
    let _ = tokio::time::timeout(within, async {
        if socket.send(Message::Close(Some(frame))).await.is_err() {
            return;
        }
        while let Some(Ok(message)) = socket.recv().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}
