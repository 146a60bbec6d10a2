//! Long polls: `GET /api/v1/tasks/{id}?wait=30s` and `GET /api/v1/workflows/{id}?wait=30s`
//! answer when the task or workflow reaches a final state, or when the wait is over.
//!
//! One LISTEN connection serves every waiter of the process: a waiter subscribes to its id's
//! channel (`sked_db::awaits`), which LISTENs on it unless another waiter already does, then
//! registers the wait in the database (which reads the state), and sleeps until the channel
//! rings or the wait is over. A ring is a notification on the channel, or the connection
//! having dropped (notifications may have been lost); either way the waiter registers again,
//! reading the state again. The connection starts with the first waiter and comes back after
//! it drops; a channel nobody waits on any more is UNLISTENed. Waiting holds no connection of
//! the pool, and the server's shutdown ends every wait (the answer is the current state).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Deserialize;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use utoipa::IntoParams;

use sked_db::awaits::Awaited;

use crate::error::{Error, Result};

/// The longest wait a request may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// How long the server waits at most before it answers a long poll, by default
/// (`sked server --max-wait`): less than the 60 s after which common proxies and load
/// balancers drop a quiet connection. A client that wants longer asks again.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(50);
/// `?wait=` as the OpenAPI document declares it (`openapi.rs` sets it as the parameter's
/// pattern): seconds (`30`, `2.5`, `30s`), milliseconds
/// (`500ms`) or minutes (`2m`, `2.5m`), at most 300 s. [`parse_wait`] reads the same strings.
pub const WAIT_PATTERN: &str = concat!(
    "^(?:0*(?:[0-9]{1,2}|[12][0-9]{2})(?:\\.[0-9]+)?s?",
    "|0*300(?:\\.0+)?s?",
    "|0*(?:[0-9]{1,5}|[12][0-9]{5}|300000)ms",
    "|0*(?:[0-4](?:\\.[0-9]+)?|5(?:\\.0+)?)m)$"
);

/// Reads a `?wait=` value ([`WAIT_PATTERN`]): a number, then `ms`, `s`, `m` or nothing
/// (seconds); at most [`MAX_WAIT`].
pub fn parse_wait(text: &str) -> std::result::Result<Duration, String> {
    let expected = || {
        format!(
            "wait must be a duration of at most {} seconds like 30, 2.5, 30s, 500ms or 2m, got {text:?}",
            MAX_WAIT.as_secs()
        )
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (number, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || fraction.is_some_and(|f| !digits(f)) {
        return Err(expected());
    }
    let value: f64 = number.parse().map_err(|_| expected())?;
    let secs = match unit {
        "" | "s" => value,
        "ms" if fraction.is_none() => value / 1000.0,
        "m" => value * 60.0,
        _ => return Err(expected()),
    };
    if secs > MAX_WAIT.as_secs_f64() {
        return Err(expected());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// How long past its end a wait's registration holds in the database.
const REGISTRATION_MARGIN: Duration = Duration::from_secs(5);

/// The waiters of one process. Cheap to clone.
#[derive(Clone)]
pub struct Awaits {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    stop: CancellationToken,
    /// The longest this server waits before it answers.
    max_wait: Duration,
    channels: Mutex<HashMap<String, Channel>>,
    /// The listening task's commands; it starts with the first subscription.
    commands: OnceLock<mpsc::UnboundedSender<Command>>,
}

struct Channel {
    waiters: usize,
    rung: watch::Sender<u64>,
}

enum Command {
    Listen(String, oneshot::Sender<std::result::Result<(), String>>),
    Unlisten(String),
}

impl std::fmt::Debug for Awaits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let channels = self.inner.channels.lock().unwrap().len();
        f.debug_struct("Awaits")
            .field("channels", &channels)
            .finish()
    }
}

impl Awaits {
    /// Waiters over `pool` that answer after at most `max_wait`, all ended when `stop` is
    /// cancelled.
    pub fn new(pool: PgPool, max_wait: Duration, stop: CancellationToken) -> Awaits {
        Awaits {
            inner: Arc::new(Inner {
                pool,
                stop,
                max_wait,
                channels: Mutex::new(HashMap::new()),
                commands: OnceLock::new(),
            }),
        }
    }

    /// Waits up to `wait` (at most the server's longest) for `what` to reach a final state;
    /// returns at once when it is in one. `Ok(false)` when the wait ended first (or the
    /// server is stopping), `Err` not found when it does not exist.
    pub async fn wait(&self, what: Awaited, wait: Duration) -> Result<bool> {
        let deadline = Instant::now() + wait.min(self.inner.max_wait);
        let mut subscription = self.subscribe(what.channel()).await?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let registered = what
                .register(sked_db::on(&self.inner.pool), left + REGISTRATION_MARGIN)
                .await?
                .ok_or_else(|| match what {
                    Awaited::Task(_) => Error::not_found_task(),
                    Awaited::Workflow(_) => Error::not_found_workflow(),
                })?;
            if registered.finished {
                return Ok(true);
            }
            tokio::select! {
                _ = subscription.rung.changed() => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(false),
                _ = self.inner.stop.cancelled() => return Ok(false),
            }
        }
    }

    /// Rings on `channel` from the moment this returns (its LISTEN is in effect) until the
    /// subscription is dropped.
    async fn subscribe(&self, channel: String) -> Result<Subscription> {
        let rung = {
            let mut channels = self.inner.channels.lock().unwrap();
            let c = channels.entry(channel.clone()).or_insert_with(|| Channel {
                waiters: 0,
                rung: watch::channel(0).0,
            });
            c.waiters += 1;
            c.rung.subscribe()
        };
        // From here on, dropping the subscription gives the channel back.
        let subscription = Subscription {
            inner: self.inner.clone(),
            channel,
            rung,
        };
        // Answered once the channel is listened on: by this command, or by the one of the
        // waiter that asked first, queued before it.
        let (ack, acked) = oneshot::channel();
        self.commands()
            .send(Command::Listen(subscription.channel.clone(), ack))
            .ok();
        match acked.await {
            Ok(Ok(())) => Ok(subscription),
            Ok(Err(e)) => Err(unavailable(e)),
            Err(_) => Err(unavailable("the LISTEN connection ended".into())),
        }
    }

    fn commands(&self) -> &mpsc::UnboundedSender<Command> {
        self.inner.commands.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(listen(self.inner.clone(), rx));
            tx
        })
    }
}

fn unavailable(why: String) -> Error {
    Error::Unavailable(sked_db::error::DbError::Config(why))
}

/// `?wait=`: how long a read may wait for a final state.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WaitParams {
    /// Wait up to this long for a final state before answering: seconds (`30`, `2.5`,
    /// `30s`), milliseconds (`500ms`) or minutes (`2m`), at most 300 s. The answer comes as
    /// soon as the state is final (at once when it already is); else when the wait is over,
    /// or sooner, after the server's `--max-wait` (50 s by default), with the state then: ask
    /// again to wait longer. Absent: answer at once.
    #[param(value_type = Option<String>, example = "30s")]
    wait: Option<String>,
}

impl WaitParams {
    /// The wait asked for, if any.
    pub fn duration(&self) -> Result<Option<Duration>> {
        self.wait
            .as_deref()
            .map(parse_wait)
            .transpose()
            .map_err(Error::InvalidRequest)
    }
}

struct Subscription {
    inner: Arc<Inner>,
    channel: String,
    rung: watch::Receiver<u64>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = self.inner.channels.lock().unwrap();
        if let Some(c) = channels.get_mut(&self.channel) {
            c.waiters -= 1;
            if c.waiters == 0 {
                channels.remove(&self.channel);
                if let Some(commands) = self.inner.commands.get() {
                    commands
                        .send(Command::Unlisten(std::mem::take(&mut self.channel)))
                        .ok();
                }
            }
        }
    }
}

impl Inner {
    /// Rings `channel`, or every channel when `None`.
    fn ring(&self, channel: Option<&str>) {
        let channels = self.channels.lock().unwrap();
        match channel {
            Some(name) => {
                if let Some(c) = channels.get(name) {
                    c.rung.send_modify(|n| *n += 1);
                }
            }
            None => {
                for c in channels.values() {
                    c.rung.send_modify(|n| *n += 1);
                }
            }
        }
    }

    fn wanted(&self, channel: &str) -> bool {
        self.channels.lock().unwrap().contains_key(channel)
    }
}

/// The listening task: carries out the commands in order and rings the channels.
async fn listen(inner: Arc<Inner>, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut backoff = Duration::from_millis(100);
    'connect: loop {
        let connected = async {
            let mut listener =
                PgListener::connect_with(&sked_db::pooler::listen_pool(&inner.pool)?).await?;
            let wanted: HashSet<String> = inner.channels.lock().unwrap().keys().cloned().collect();
            listener
                .listen_all(wanted.iter().map(String::as_str))
                .await?;
            Ok::<_, sqlx::Error>((listener, wanted))
        };
        // The channels this connection listens on.
        let (mut listener, mut listening) = tokio::select! {
            _ = inner.stop.cancelled() => return,
            l = connected => match l {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "awaits: cannot LISTEN; trying again");
                    // Waiters asking meanwhile get the error; those waiting get a ring when
                    // the connection is back.
                    let until = Instant::now() + backoff;
                    loop {
                        tokio::select! {
                            _ = inner.stop.cancelled() => return,
                            _ = tokio::time::sleep_until(until) => break,
                            c = commands.recv() => match c {
                                None => return,
                                Some(Command::Listen(_, ack)) => {
                                    ack.send(Err(format!("cannot LISTEN: {e}"))).ok();
                                }
                                Some(Command::Unlisten(_)) => {}
                            },
                        }
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue 'connect;
                }
            },
        };
        backoff = Duration::from_millis(100);
        // Whatever was announced while no connection listened is read again by the waiters.
        inner.ring(None);
        loop {
            tokio::select! {
                _ = inner.stop.cancelled() => return,
                c = commands.recv() => match c {
                    None => return,
                    Some(Command::Listen(channel, ack)) => {
                        let done = if listening.contains(&channel) {
                            Ok(())
                        } else {
                            listener.listen(&channel).await.map(|()| {
                                listening.insert(channel);
                            })
                        };
                        match done {
                            Ok(()) => { ack.send(Ok(())).ok(); }
                            Err(e) => {
                                ack.send(Err(format!("cannot LISTEN: {e}"))).ok();
                                continue 'connect;
                            }
                        }
                    }
                    Some(Command::Unlisten(channel)) => {
                        if listening.contains(&channel) && !inner.wanted(&channel) {
                            if let Err(e) = listener.unlisten(&channel).await {
                                tracing::debug!(error = %e, "awaits: UNLISTEN failed; connecting again");
                                continue 'connect;
                            }
                            listening.remove(&channel);
                        }
                    }
                },
                n = listener.try_recv() => match n {
                    Ok(Some(n)) => inner.ring(Some(n.channel())),
                    // The connection dropped and was made again (listening on the same
                    // channels): what was announced in between is lost.
                    Ok(None) => inner.ring(None),
                    Err(e) => {
                        tracing::debug!(error = %e, "awaits: LISTEN connection lost");
                        continue 'connect;
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_read_as_the_document_declares_them() {
        let ok = [
            ("0", 0.0),
            ("30", 30.0),
            ("2.5", 2.5),
            ("30s", 30.0),
            ("300", 300.0),
            ("300.000s", 300.0),
            ("0300", 300.0),
            ("299.999", 299.999),
            ("500ms", 0.5),
            ("300000ms", 300.0),
            ("2m", 120.0),
            ("2.5m", 150.0),
            ("5m", 300.0),
            ("5.0m", 300.0),
        ];
        for (text, secs) in ok {
            assert_eq!(
                parse_wait(text),
                Ok(Duration::from_secs_f64(secs)),
                "{text}"
            );
        }
        for bad in [
            "", "s", "-1", "301", "300.5", "300001ms", "1.5ms", "5.1m", "6m", "1h", "1m30s", " 30",
            "30 s", ".5", "5.", "1e3", "NaN", "inf", "30S", "0x10",
        ] {
            let err = parse_wait(bad).expect_err(bad);
            assert!(err.starts_with("wait must be"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_parser_accepts_exactly_what_the_pattern_matches() {
        let pattern = regex::Regex::new(WAIT_PATTERN).unwrap();
        let alphabet = ['0', '1', '2', '3', '5', '9', '.', 'm', 's'];
        let mut text = String::new();
        let mut checked = 0;
        // Every string of up to six of these characters.
        fn each(text: &mut String, alphabet: &[char], left: usize, check: &mut dyn FnMut(&str)) {
            check(text);
            if left == 0 {
                return;
            }
            for &c in alphabet {
                text.push(c);
                each(text, alphabet, left - 1, check);
                text.pop();
            }
        }
        each(&mut text, &alphabet, 6, &mut |t| {
            checked += 1;
            assert_eq!(pattern.is_match(t), parse_wait(t).is_ok(), "{t:?}");
        });
        assert!(checked > 500_000);
    }
}
