//! Live updates: the websocket `/api/v1/events`, with reconnection and a polling fallback.
//!
//! Pages react to the signals of [`Live`]: a batch of changed tasks, tasks with new log
//! lines, changed workflows and schedules, worker changes, and `resync`, which asks every
//! page to refetch what it shows. `resync` is bumped when the server says events were lost,
//! after every reconnection (events may have been missed while away), and, while the
//! websocket cannot be used, every [`POLL_SECS`] seconds: polling is the fallback. Pages
//! follow them with [`Live::on_change`], [`Live::on_tasks`] and [`Live::on_ids`].

use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use gloo_net::websocket::{Message, WebSocketError, futures::WebSocket};
use leptos::prelude::*;
use leptos::task::spawn_local;
use sked_types::events::{CLOSE_UNAUTHORIZED, ClientMessage, ServerEvent, TaskSummary};
use uuid::Uuid;

use crate::api::Session;

/// Seconds between refreshes while the websocket is unavailable.
pub const POLL_SECS: u32 = 5;
/// Failed connections in a row after which the page polls (it keeps retrying the websocket).
const FAILURES_BEFORE_POLLING: u32 = 2;
const MAX_BACKOFF_MS: f64 = 15_000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveStatus {
    Connecting,
    Live,
    Polling,
}

#[derive(Clone, Copy)]
pub struct Live {
    pub status: RwSignal<LiveStatus>,
    pub tasks: RwSignal<Arc<Vec<TaskSummary>>>,
    pub logs: RwSignal<Arc<Vec<Uuid>>>,
    pub workflows: RwSignal<Arc<Vec<Uuid>>>,
    pub schedules: RwSignal<Arc<Vec<Uuid>>>,
    pub workers: RwSignal<u64>,
    pub resync: RwSignal<u64>,
}

pub fn live() -> Live {
    expect_context::<Live>()
}

impl Live {
    pub fn new() -> Self {
        Live {
            status: RwSignal::new(LiveStatus::Connecting),
            tasks: RwSignal::new(Arc::new(Vec::new())),
            logs: RwSignal::new(Arc::new(Vec::new())),
            workflows: RwSignal::new(Arc::new(Vec::new())),
            schedules: RwSignal::new(Arc::new(Vec::new())),
            workers: RwSignal::new(0),
            resync: RwSignal::new(0),
        }
    }

    /// Calls `then` after every change of the signals `read` reads (not when they are first
    /// read): `live.on_change(|l| l.resync.track(), refetch)`.
    pub fn on_change(self, read: impl Fn(Live) + 'static, then: impl Fn() + 'static) {
        Effect::watch(move || read(self), move |_, _, _| then(), false);
    }

    /// Calls `then` with every batch of changed tasks.
    pub fn on_tasks(self, then: impl Fn(&[TaskSummary]) + 'static) {
        Effect::watch(
            move || self.tasks.get(),
            move |batch, _, _| then(batch),
            false,
        );
    }

    /// Calls `then` with every list of ids that `ids` names: the changed workflows or
    /// schedules, or the tasks with new log lines.
    pub fn on_ids(
        self,
        ids: fn(Live) -> RwSignal<Arc<Vec<Uuid>>>,
        then: impl Fn(&[Uuid]) + 'static,
    ) {
        Effect::watch(
            move || ids(self).get(),
            move |changed, _, _| then(changed),
            false,
        );
    }

    fn bump_resync(&self) {
        self.resync.update(|n| *n += 1);
    }

    fn apply(&self, event: ServerEvent) {
        match event {
            ServerEvent::Hello { .. } => {}
            ServerEvent::Tasks { tasks } => self.tasks.set(Arc::new(tasks)),
            ServerEvent::Logs { tasks } => self.logs.set(Arc::new(tasks)),
            ServerEvent::Workflows { ids } => self.workflows.set(Arc::new(ids)),
            ServerEvent::Schedules { ids } => self.schedules.set(Arc::new(ids)),
            ServerEvent::Workers => self.workers.update(|n| *n += 1),
            ServerEvent::Resync { .. } => self.bump_resync(),
        }
    }

    /// Runs the connection while `token` stays the session's token.
    pub fn start(self, session: Session, token: String) {
        spawn_local(async move {
            let mut failures: u32 = 0;
            let mut first = true;
            loop {
                if session.token.get_untracked().as_deref() != Some(token.as_str()) {
                    return;
                }
                match self.connect_once(&token, first).await {
                    Outcome::Unauthorized => {
                        session.sign_out();
                        return;
                    }
                    Outcome::WasLive => failures = 0,
                    Outcome::Failed => failures += 1,
                }
                first = false;
                if failures >= FAILURES_BEFORE_POLLING {
                    self.status.set(LiveStatus::Polling);
                } else {
                    self.status.set(LiveStatus::Connecting);
                }
                // Backoff with jitter; while polling, refresh the pages meanwhile.
                let backoff = (500.0 * 2f64.powi(failures.min(10) as i32)).min(MAX_BACKOFF_MS);
                let wait = backoff * (0.5 + js_sys::Math::random() / 2.0);
                let mut waited = 0.0;
                while waited < wait {
                    let step = (wait - waited).min(f64::from(POLL_SECS) * 1000.0);
                    gloo_timers::future::sleep(std::time::Duration::from_millis(step as u64)).await;
                    waited += step;
                    if self.status.get_untracked() == LiveStatus::Polling {
                        self.bump_resync();
                    }
                }
            }
        });
    }

    async fn connect_once(&self, token: &str, first: bool) -> Outcome {
        let Some(url) = events_url() else {
            return Outcome::Failed;
        };
        let Ok(ws) = WebSocket::open(&url) else {
            return Outcome::Failed;
        };
        let (mut sink, mut stream) = ws.split();
        let auth = ClientMessage::Auth {
            token: token.to_owned(),
        };
        let Ok(text) = serde_json::to_string(&auth) else {
            return Outcome::Failed;
        };
        if sink.send(Message::Text(text)).await.is_err() {
            return Outcome::Failed;
        }
        let mut live = false;
        let mut polling_while_connected = self.status.get_untracked() == LiveStatus::Polling;
        loop {
            let item = stream.next().await;
            match item {
                Some(Ok(Message::Text(text))) => {
                    let Ok(event) = serde_json::from_str::<ServerEvent>(&text) else {
                        continue;
                    };
                    if matches!(event, ServerEvent::Hello { .. }) {
                        live = true;
                        self.status.set(LiveStatus::Live);
                        // Events may have been missed since the page loaded or was last live.
                        if !first || polling_while_connected {
                            self.bump_resync();
                            polling_while_connected = false;
                        }
                    }
                    self.apply(event);
                }
                Some(Ok(Message::Bytes(_))) => {}
                Some(Err(WebSocketError::ConnectionClose(close))) => {
                    if close.code == CLOSE_UNAUTHORIZED {
                        return Outcome::Unauthorized;
                    }
                    break;
                }
                Some(Err(_)) | None => break,
            }
        }
        if live {
            Outcome::WasLive
        } else {
            Outcome::Failed
        }
    }
}

impl Default for Live {
    fn default() -> Self {
        Self::new()
    }
}

enum Outcome {
    Unauthorized,
    WasLive,
    Failed,
}

fn events_url() -> Option<String> {
    let location = web_sys::window()?.location();
    let scheme = if location.protocol().ok()? == "https:" {
        "wss"
    } else {
        "ws"
    };
    Some(format!(
        "{scheme}://{}/api/v1/events",
        location.host().ok()?
    ))
}
