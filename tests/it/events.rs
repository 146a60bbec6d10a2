//! Tests of the live events (`GET /api/v1/events`): a real server over a fresh database,
//! websocket clients, and changes made by plain SQL and by a real worker.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::json;
use sked_db::testing::TestDb;
use sked_db::token::Role;
use sked_server::EventsConfig;
use sked_types::TaskState;
use sked_types::events::{CLOSE_TOO_SLOW, CLOSE_UNAUTHORIZED, ServerEvent};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{config, insert, start_worker};

/// A server (`sked_server::serve_with`) over a fresh database, with tokens for `alice` and
/// `bob` (users) and `root` (an admin).
struct Server {
    db: TestDb,
    addr: SocketAddr,
    alice: String,
    bob: String,
    admin: String,
    stop: CancellationToken,
    handle: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    async fn start() -> Server {
        Server::start_with(EventsConfig::default(), None).await
    }

    /// `send_buffer` sets the kernel's send buffer of the server's sockets (accepted sockets
    /// inherit it from the listening one), so that a client that stops reading blocks the
    /// server's writes after a few kilobytes.
    async fn start_with(events: EventsConfig, send_buffer: Option<u32>) -> Server {
        Server::start_on(TestDb::new().await, None, events, send_buffer).await
    }

    async fn start_on(
        db: TestDb,
        pool: Option<sqlx::PgPool>,
        events: EventsConfig,
        send_buffer: Option<u32>,
    ) -> Server {
        let token = |owner: &'static str, role| {
            let pool = db.pool.clone();
            async move {
                sked_db::token::create(&pool, owner, role, "test")
                    .await
                    .unwrap()
            }
        };
        let alice = token("alice", Role::User).await;
        let bob = token("bob", Role::User).await;
        let admin = token("root", Role::Admin).await;
        let socket = TcpSocket::new_v4().unwrap();
        if let Some(size) = send_buffer {
            socket.set_send_buffer_size(size).unwrap();
        }
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(64).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let handle = tokio::spawn(sked_server::serve_with(
            pool.unwrap_or_else(|| db.pool.clone()),
            listener,
            stop.clone(),
            events,
        ));
        Server {
            db,
            addr,
            alice,
            bob,
            admin,
            stop,
            handle: Some(handle),
        }
    }

    /// A client that sent `token` in the `Authorization` header.
    async fn connect(&self, token: &str) -> Client {
        Client::connect(self.addr, Some(token), None).await
    }

    /// A client authenticated by the header that has read the `hello` frame.
    async fn connect_hello(&self, token: &str) -> Client {
        let mut client = self.connect(token).await;
        let hello = client.next(Duration::from_secs(5)).await;
        assert!(
            matches!(hello, Some(ServerEvent::Hello { .. })),
            "an authenticated client is greeted first, got {hello:?}"
        );
        client
    }

    /// Stops the server and waits until `serve_with` has returned.
    async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(handle) = self.handle.take() {
            tokio::time::timeout(Duration::from_secs(10), handle)
                .await
                .expect("the server stops within 10 s")
                .expect("server task")
                .expect("the server ran");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A websocket client of `/api/v1/events`.
struct Client {
    ws: WebSocketStream<TcpStream>,
}

impl Client {
    /// Connects with an optional header token; `recv_buffer` shrinks the kernel's receive
    /// buffer of the client's socket.
    async fn connect(addr: SocketAddr, token: Option<&str>, recv_buffer: Option<u32>) -> Client {
        let socket = TcpSocket::new_v4().unwrap();
        if let Some(size) = recv_buffer {
            socket.set_recv_buffer_size(size).unwrap();
        }
        let stream = socket.connect(addr).await.unwrap();
        let mut request = format!("ws://{addr}/api/v1/events")
            .into_client_request()
            .unwrap();
        if let Some(token) = token {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let (ws, _) = tokio_tungstenite::client_async(request, stream)
            .await
            .expect("the websocket upgrade succeeds");
        Client { ws }
    }

    async fn send_json(&mut self, value: serde_json::Value) {
        self.ws
            .send(Message::text(value.to_string()))
            .await
            .unwrap();
    }

    /// The next event within `within`, skipping pings and pongs; `None` on timeout. Panics
    /// when the server closes the socket.
    async fn next(&mut self, within: Duration) -> Option<ServerEvent> {
        let deadline = Instant::now() + within;
        loop {
            let message = match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return None,
                Ok(message) => message,
            };
            match message {
                Some(Ok(Message::Text(text))) => {
                    return Some(
                        serde_json::from_str(&text)
                            .unwrap_or_else(|e| panic!("a server event, got {text}: {e}")),
                    );
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                other => panic!("expected an event, got {other:?}"),
            }
        }
    }

    /// Reads events until one satisfies `wanted`; panics after `within` naming `what`.
    /// Returns that event and every event read before it.
    async fn until(
        &mut self,
        within: Duration,
        what: &str,
        mut wanted: impl FnMut(&ServerEvent) -> bool,
    ) -> (ServerEvent, Vec<ServerEvent>) {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(event) if wanted(&event) => return (event, seen),
                Some(event) => seen.push(event),
                None => panic!("{what} should arrive within {within:?}; got only {seen:?}"),
            }
        }
    }

    /// Every event that arrives within `within`.
    async fn drain(&mut self, within: Duration) -> Vec<ServerEvent> {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        while let Some(event) = self
            .next(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            seen.push(event);
        }
        seen
    }

    /// Waits for the server's close frame: its code and reason.
    async fn closed(&mut self, within: Duration) -> (u16, String) {
        let deadline = Instant::now() + within;
        loop {
            let message = tokio::time::timeout_at(deadline, self.ws.next())
                .await
                .unwrap_or_else(|_| panic!("the server should close the socket within {within:?}"));
            match message {
                Some(Ok(Message::Close(Some(frame)))) => {
                    return (u16::from(frame.code), frame.reason.to_string());
                }
                Some(Ok(Message::Close(None))) | None | Some(Err(_)) => {
                    panic!("the server should close with a code and a reason, got {message:?}")
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(other)) => panic!("expected the close frame, got {other:?}"),
            }
        }
    }
}

/// The state of task `id` in a `tasks` event, if the event names it.
fn task_state(event: &ServerEvent, id: Uuid) -> Option<TaskState> {
    match event {
        ServerEvent::Tasks { tasks } => tasks.iter().find(|t| t.id == id).map(|t| t.state),
        _ => None,
    }
}

/// Every id an event names (tasks, their workflows and parents, logs, workflows, schedules).
fn ids(event: &ServerEvent) -> Vec<Uuid> {
    match event {
        ServerEvent::Tasks { tasks } => tasks
            .iter()
            .flat_map(|t| [Some(t.id), t.workflow_id, t.shard_of])
            .flatten()
            .collect(),
        ServerEvent::Logs { tasks } => tasks.clone(),
        ServerEvent::Workflows { ids } | ServerEvent::Schedules { ids } => ids.clone(),
        _ => vec![],
    }
}

const SECS_5: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_refused_token_closes_the_socket_with_4401_and_a_reason() {
    let server = Server::start_with(
        EventsConfig {
            auth_timeout: Duration::from_millis(300),
            ..EventsConfig::default()
        },
        None,
    )
    .await;

    // An unknown token in the header.
    let mut client = Client::connect(server.addr, Some("sked_unknown"), None).await;
    let (code, reason) = client.closed(SECS_5).await;
    assert_eq!(
        code, CLOSE_UNAUTHORIZED,
        "an unknown header token closes with 4401"
    );
    assert!(
        reason.contains("unknown"),
        "the reason says why: {reason:?}"
    );

    // An unknown token in the first frame.
    let mut client = Client::connect(server.addr, None, None).await;
    client
        .send_json(json!({"type": "auth", "token": "sked_unknown"}))
        .await;
    let (code, _) = client.closed(SECS_5).await;
    assert_eq!(
        code, CLOSE_UNAUTHORIZED,
        "an unknown first-frame token closes with 4401"
    );

    // A first frame that is not an auth frame.
    let mut client = Client::connect(server.addr, None, None).await;
    client.send_json(json!({"hello": "there"})).await;
    let (code, reason) = client.closed(SECS_5).await;
    assert_eq!(code, CLOSE_UNAUTHORIZED);
    assert!(
        reason.contains("auth"),
        "the reason names the auth frame: {reason:?}"
    );

    // No frame at all within the auth timeout.
    let mut client = Client::connect(server.addr, None, None).await;
    let started = Instant::now();
    let (code, _) = client.closed(SECS_5).await;
    assert_eq!(
        code, CLOSE_UNAUTHORIZED,
        "a silent client is closed with 4401"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "a client has the auth timeout to send its token"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_client_authenticates_by_header_or_by_its_first_frame_and_is_closed_on_shutdown() {
    let server = Server::start().await;

    let mut alice = server.connect(&server.alice).await;
    assert_eq!(
        alice.next(SECS_5).await,
        Some(ServerEvent::Hello {
            owner: "alice".into(),
            role: "user".into()
        })
    );

    let mut admin = Client::connect(server.addr, None, None).await;
    admin
        .send_json(json!({"type": "auth", "token": server.admin}))
        .await;
    assert_eq!(
        admin.next(SECS_5).await,
        Some(ServerEvent::Hello {
            owner: "root".into(),
            role: "admin".into()
        })
    );

    // The server answers pings.
    admin
        .ws
        .send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    let pong = tokio::time::timeout(SECS_5, async {
        loop {
            match admin.ws.next().await {
                Some(Ok(Message::Pong(payload))) => return payload,
                Some(Ok(_)) => continue,
                other => panic!("expected a pong, got {other:?}"),
            }
        }
    })
    .await
    .expect("the server answers a ping within 5 s");
    assert_eq!(&pong[..], b"are you there");

    // Stopping the server closes every client's socket with 1001 (going away).
    server.stop.cancel();
    assert_eq!(alice.closed(SECS_5).await.0, 1001);
    assert_eq!(admin.closed(SECS_5).await.0, 1001);
    server.shutdown().await;
}

#[tokio::test]
async fn a_task_inserted_by_sql_arrives_waiting_then_running_with_logs_then_succeeded() {
    let server = Server::start().await;
    let mut alice = server.connect_hello(&server.alice).await;
    let pool = &server.db.pool;

    let inserted = Instant::now();
    let id = insert(
        pool,
        "(owner, queue, command) values ('alice', 'ev', '{sh,-c,echo hello; sleep 1}')",
    )
    .await;
    let (event, _) = alice
        .until(SECS_5, "the inserted task, waiting", |e| {
            task_state(e, id) == Some(TaskState::Waiting)
        })
        .await;
    let latency = inserted.elapsed();
    assert!(
        latency < Duration::from_secs(2),
        "an insert reaches the client within a batch window plus a query, took {latency:?}"
    );
    let ServerEvent::Tasks { tasks } = event else {
        unreachable!()
    };
    let summary = tasks.iter().find(|t| t.id == id).unwrap();
    assert_eq!(summary.owner, "alice");
    assert_eq!(summary.queue, "ev");
    assert_eq!(summary.argv, ["sh", "-c", "echo hello; sleep 1"]);

    let worker = start_worker(&server.db, config(&["ev"]));
    alice
        .until(Duration::from_secs(10), "the task, running", |e| {
            task_state(e, id) == Some(TaskState::Running)
        })
        .await;
    let mut logs = false;
    let (_, before) = alice
        .until(Duration::from_secs(10), "the task, succeeded", |e| {
            logs |= matches!(e, ServerEvent::Logs { tasks } if tasks.contains(&id));
            task_state(e, id) == Some(TaskState::Succeeded)
        })
        .await;
    assert!(
        logs,
        "the line the task printed while it ran makes a logs event before it ends: {before:?}"
    );
    worker.shutdown().await;
    server.shutdown().await;
}

/// A submission notifies workers on `sked_tasks`; the hub listens there too and reads at
/// once instead of at the end of its window, while finishes (which do not notify) wait for
/// the window.
#[tokio::test]
async fn a_submission_arrives_at_once_by_its_notification_and_a_finish_with_the_window() {
    let window = Duration::from_secs(3);
    let server = Server::start_with(
        EventsConfig {
            batch_window: window,
            ..EventsConfig::default()
        },
        None,
    )
    .await;
    let mut alice = server.connect_hello(&server.alice).await;
    let pool = &server.db.pool;
    let submit = || {
        insert(
            pool,
            "(owner, queue, command) values ('alice', 'hint', '{true}')",
        )
    };

    // The first one may race the LISTEN connection's start; it arrives within a window.
    let first = submit().await;
    alice
        .until(window * 2, "the first task", |e| {
            task_state(e, first) == Some(TaskState::Waiting)
        })
        .await;
    for _ in 0..5 {
        let id = submit().await;
        let submitted = Instant::now();
        alice
            .until(window, "a task submitted once the hub listens", |e| {
                task_state(e, id) == Some(TaskState::Waiting)
            })
            .await;
        let latency = submitted.elapsed();
        assert!(
            latency < window / 3,
            "a notified submission is read before its window ends ({window:?}), took {latency:?}"
        );
    }

    // A change that does not notify (here a plain UPDATE asking for a cancel) is read with
    // the window.
    let changed = Instant::now();
    sqlx::query("update sked.tasks set cancel_requested_at = now() where id = $1")
        .bind(first)
        .execute(pool)
        .await
        .unwrap();
    alice
        .until(
            window * 2,
            "the updated task",
            |e| matches!(e, ServerEvent::Tasks { tasks } if tasks.iter().any(|t| t.id == first)),
        )
        .await;
    assert!(
        changed.elapsed() <= window + Duration::from_secs(1),
        "an update is read at the next window at the latest, took {:?}",
        changed.elapsed()
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_user_never_receives_another_owners_task_workflow_or_schedule() {
    let server = Server::start().await;
    let mut alice = server.connect_hello(&server.alice).await;
    let mut bob = server.connect_hello(&server.bob).await;
    let mut admin = server.connect_hello(&server.admin).await;
    let pool = &server.db.pool;

    let bobs_task = insert(pool, "(owner, kind) values ('bob', 'noop')").await;
    let bobs_workflow: Uuid = sqlx::query_scalar("select sked.workflow_submit($1, 'bob')")
        .bind(json!({"name": "etl", "tasks": [
            {"name": "extract", "kind": "noop"},
            {"name": "load", "kind": "noop", "depends_on": ["extract"]}]}))
        .fetch_one(pool)
        .await
        .unwrap();
    let bobs_schedule: Uuid = sqlx::query_scalar(
        "insert into sked.schedules (owner, name, cron, task)
         values ('bob', 'nightly', '0 0 1 1 *', '{\"kind\": \"noop\"}') returning id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query(
        "insert into sked.task_logs (task_id, attempt, stream, data) values ($1, 1, 'stdout', 'x')",
    )
    .bind(bobs_task)
    .execute(pool)
    .await
    .unwrap();
    let alices_task = insert(pool, "(owner, kind) values ('alice', 'noop')").await;
    let bobs: HashSet<Uuid> = sqlx::query_scalar::<_, Uuid>(
        "select id from sked.tasks where owner = 'bob' union all select $1 union all select $2",
    )
    .bind(bobs_workflow)
    .bind(bobs_schedule)
    .fetch_all(pool)
    .await
    .unwrap()
    .into_iter()
    .collect();

    // Alice hears of her own task, which was inserted last; then nothing more comes.
    let (_, mut seen) = alice
        .until(SECS_5, "alice's task", |e| {
            task_state(e, alices_task).is_some()
        })
        .await;
    seen.extend(alice.drain(Duration::from_millis(500)).await);
    for event in &seen {
        assert!(
            ids(event).iter().all(|id| !bobs.contains(id)),
            "a user token never receives another owner's rows, got {event:?}"
        );
    }

    // Bob and the admin hear of bob's task, workflow, schedule and logs; the admin also of
    // alice's task, and bob not.
    for (client, who) in [(&mut bob, "bob"), (&mut admin, "the admin")] {
        let (mut task, mut workflow, mut schedule, mut logs) = (false, false, false, false);
        let mut alices = false;
        client
            .until(
                SECS_5,
                &format!("{who}: bob's task, workflow, schedule and logs"),
                |e| {
                    task |= task_state(e, bobs_task).is_some();
                    alices |= task_state(e, alices_task).is_some();
                    match e {
                        ServerEvent::Workflows { ids } => workflow |= ids.contains(&bobs_workflow),
                        ServerEvent::Schedules { ids } => schedule |= ids.contains(&bobs_schedule),
                        ServerEvent::Logs { tasks } => logs |= tasks.contains(&bobs_task),
                        _ => {}
                    }
                    task && workflow && schedule && logs && (alices || who == "bob")
                },
            )
            .await;
        assert!(!(alices && who == "bob"), "bob never hears of alice's task");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_statement_changing_more_tasks_than_a_notification_names_makes_a_resync() {
    let server = Server::start().await;
    let mut admin = server.connect_hello(&server.admin).await;
    let pool = &server.db.pool;

    sqlx::query("insert into sked.tasks (kind) select 'noop' from generate_series(1, 200)")
        .execute(pool)
        .await
        .unwrap();
    let (event, seen) = admin
        .until(SECS_5, "a resync", |e| {
            matches!(e, ServerEvent::Resync { .. })
        })
        .await;
    assert!(seen.is_empty(), "only the resync is sent: {seen:?}");
    let ServerEvent::Resync { reason } = event else {
        unreachable!()
    };
    assert!(reason.contains("too many"), "{reason}");
    let first = Instant::now();

    // Another bulk statement right away: its resync comes a second after the first, not a
    // batch window after the statement.
    sqlx::query("insert into sked.tasks (kind) select 'noop' from generate_series(1, 200)")
        .execute(pool)
        .await
        .unwrap();
    admin
        .until(SECS_5, "a second resync", |e| {
            matches!(e, ServerEvent::Resync { .. })
        })
        .await;
    let gap = first.elapsed();
    assert!(
        gap >= Duration::from_millis(900),
        "bulk resyncs come at most once a second, the second came after {gap:?}"
    );

    // A statement naming few tasks is told task by task again.
    let id = insert(pool, "(kind) values ('noop')").await;
    admin
        .until(SECS_5, "the next task", |e| task_state(e, id).is_some())
        .await;

    // Deleted tasks cannot be looked up: a deletion asks for a refetch too.
    sqlx::query("delete from sked.tasks where id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    admin
        .until(SECS_5, "a resync after a deletion", |e| {
            matches!(e, ServerEvent::Resync { .. })
        })
        .await;
    server.shutdown().await;
}

#[tokio::test]
async fn a_stuck_client_gets_a_resync_and_never_delays_the_others() {
    // A queue of two frames per client, and kernel buffers of a few kilobytes, so that a
    // client that does not read blocks the server's writes after one frame.
    let server = Server::start_with(
        EventsConfig {
            client_buffer: 2,
            send_timeout: Duration::from_secs(30),
            ..EventsConfig::default()
        },
        Some(4096),
    )
    .await;
    let mut stuck = Client::connect(server.addr, Some(&server.admin), Some(4096)).await;
    assert!(matches!(
        stuck.next(SECS_5).await,
        Some(ServerEvent::Hello { .. })
    ));
    let mut reader = server.connect_hello(&server.admin).await;
    let pool = &server.db.pool;

    // Eight statements of 100 tasks with long arguments (frames of about 150 KB), each in a
    // batch of its own. The stuck client reads none of them.
    let long = "x".repeat(1000);
    let mut slowest = Duration::ZERO;
    for round in 0..8 {
        let started = Instant::now();
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "insert into sked.tasks (kind, args) select 'noop', array[$1, g::text]
               from generate_series(1, 100) g returning id",
        )
        .bind(&long)
        .fetch_all(pool)
        .await
        .unwrap();
        let mut missing: HashSet<Uuid> = ids.into_iter().collect();
        reader
            .until(SECS_5, &format!("the tasks of round {round}"), |e| {
                if let ServerEvent::Tasks { tasks } = e {
                    for t in tasks {
                        missing.remove(&t.id);
                    }
                }
                missing.is_empty()
            })
            .await;
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        slowest < Duration::from_secs(2),
        "a stuck client never delays the others: the slowest round took {slowest:?}"
    );

    // Once the stuck client reads again, it gets the frames that were queued, then a resync
    // for the ones that were dropped.
    let (event, _) = stuck
        .until(
            Duration::from_secs(10),
            "a resync for the stuck client",
            |e| matches!(e, ServerEvent::Resync { .. }),
        )
        .await;
    let ServerEvent::Resync { reason } = event else {
        unreachable!()
    };
    assert!(reason.contains("too slowly"), "{reason}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_client_that_reads_nothing_gets_a_resync_and_a_close_frame_and_never_delays_the_others() {
    // Kernel buffers of a few kilobytes, a queue of two frames, and a second for a stuck
    // socket: the client below is disconnected about a second after the flood begins.
    let server = Server::start_with(
        EventsConfig {
            client_buffer: 2,
            send_timeout: Duration::from_secs(1),
            close_timeout: Duration::from_secs(30),
            ..EventsConfig::default()
        },
        Some(4096),
    )
    .await;
    let mut stuck = Client::connect(server.addr, Some(&server.admin), Some(4096)).await;
    assert!(matches!(
        stuck.next(SECS_5).await,
        Some(ServerEvent::Hello { .. })
    ));
    let mut reader = server.connect_hello(&server.admin).await;
    let pool = &server.db.pool;

    // A flood of frames of about 150 KB that the stuck client does not read, for longer
    // than the server waits for its socket.
    let long = "x".repeat(1000);
    let mut slowest = Duration::ZERO;
    let flood = Instant::now();
    let mut round = 0;
    while round < 8 || flood.elapsed() < Duration::from_secs(3) {
        let started = Instant::now();
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "insert into sked.tasks (kind, args) select 'noop', array[$1, g::text]
               from generate_series(1, 100) g returning id",
        )
        .bind(&long)
        .fetch_all(pool)
        .await
        .unwrap();
        let mut missing: HashSet<Uuid> = ids.into_iter().collect();
        reader
            .until(SECS_5, &format!("the tasks of round {round}"), |e| {
                if let ServerEvent::Tasks { tasks } = e {
                    for t in tasks {
                        missing.remove(&t.id);
                    }
                }
                missing.is_empty()
            })
            .await;
        slowest = slowest.max(started.elapsed());
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        slowest < Duration::from_secs(2),
        "a client that reads nothing never delays the others: the slowest round took {slowest:?}"
    );

    // Now it reads: what was in flight, then `resync`, then a close frame saying why.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut resynced = false;
    let (code, reason) = loop {
        let message = tokio::time::timeout_at(deadline, stuck.ws.next())
            .await
            .expect("the stuck client's socket is closed within 20 s");
        match message {
            Some(Ok(Message::Text(text))) => {
                let event: ServerEvent = serde_json::from_str(&text).unwrap();
                if let ServerEvent::Resync { reason } = event {
                    assert!(reason.contains("too slowly"), "{reason}");
                    resynced = true;
                }
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            Some(Ok(Message::Close(Some(frame)))) => {
                break (u16::from(frame.code), frame.reason.to_string());
            }
            other => panic!(
                "a client disconnected for reading too slowly gets a close frame with a code, \
                 got {other:?}"
            ),
        }
    };
    assert!(
        resynced,
        "the stuck client is told to resync before its socket is closed"
    );
    assert_eq!(
        code, CLOSE_TOO_SLOW,
        "a client that read too slowly is closed with 4408 ({reason})"
    );
    assert!(reason.contains("too slowly"), "{reason}");

    // The others are still served at once.
    let id = insert(pool, "(kind) values ('noop')").await;
    reader
        .until(SECS_5, "a task after the stuck client left", |e| {
            task_state(e, id).is_some()
        })
        .await;
    server.shutdown().await;
}

#[tokio::test]
async fn every_client_resyncs_when_recorded_changes_are_missing() {
    let server = Server::start().await;
    let mut alice = server.connect_hello(&server.alice).await;
    let pool = &server.db.pool;

    // A counter moves without its row (as when rows were pruned before the hub read them, or
    // a crash emptied the unlogged table): the hub cannot tell what changed.
    sqlx::query("update sked.event_changes set n = n + 1 where slot = 63")
        .execute(pool)
        .await
        .unwrap();
    let (event, _) = alice
        .until(SECS_5, "a resync", |e| {
            matches!(e, ServerEvent::Resync { .. })
        })
        .await;
    let ServerEvent::Resync { reason } = event else {
        unreachable!()
    };
    assert!(reason.contains("could not be read"), "{reason}");

    // Changes are read again from there on.
    let id = insert(pool, "(owner, kind) values ('alice', 'noop')").await;
    alice
        .until(SECS_5, "a task after the gap", |e| {
            task_state(e, id).is_some()
        })
        .await;
    server.shutdown().await;
}

/// Calls of `sked.tasks_summary` counted by PostgreSQL's statistics, after waiting long
/// enough for the server's backends to have reported theirs.
async fn summary_calls(pool: &sqlx::PgPool) -> i64 {
    tokio::time::sleep(Duration::from_millis(2500)).await;
    sqlx::query_scalar(
        "select coalesce(sum(calls), 0)::bigint from pg_stat_user_functions
          where schemaname = 'sked' and funcname = 'tasks_summary'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_hub_queries_nothing_while_no_client_is_connected() {
    // The server gets a pool of its own, opened after function statistics were switched on.
    let db = TestDb::new().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "alter database {} set track_functions = 'all'",
        db.name
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let pool = sked_db::connect(&db.url, "sked-events-test", 4)
        .await
        .unwrap();
    let server = Server::start_on(db, Some(pool.clone()), EventsConfig::default(), None).await;
    // The hub listens from the start (a first client is greeted once it does).
    server.connect_hello(&server.admin).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = summary_calls(&pool).await;

    for _ in 0..5 {
        insert(&server.db.pool, "(kind) values ('noop')").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        summary_calls(&pool).await,
        before,
        "with no client connected, notifications cause no query"
    );

    // With a client, the same change is looked up (and counted).
    let mut admin = server.connect_hello(&server.admin).await;
    let id = insert(&server.db.pool, "(kind) values ('noop')").await;
    admin
        .until(SECS_5, "the task", |e| task_state(e, id).is_some())
        .await;
    assert!(
        summary_calls(&pool).await > before,
        "a connected client's batch is looked up with sked.tasks_summary"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn live_events_never_wait_for_the_servers_pool() {
    // The server's pool has two connections (its upkeep's LISTEN connection takes one), and
    // the test holds every one it can get (as requests saturating the database hold them)
    // for the rest of the test: the hub reads through connections of its own.
    let db = TestDb::new().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&db.url)
        .await
        .unwrap();
    let server = Server::start_on(db, Some(pool.clone()), EventsConfig::default(), None).await;
    // Let the server start (it checks the schema through its pool) before taking it all.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut held = Vec::new();
    while let Ok(conn) = tokio::time::timeout(Duration::from_millis(500), pool.acquire()).await {
        held.push(conn.unwrap());
    }
    assert_eq!(
        (pool.size(), pool.num_idle()),
        (2, 0),
        "every connection of the server's pool is taken"
    );

    let started = Instant::now();
    let mut admin = server.connect_hello(&server.admin).await;
    let id = insert(&server.db.pool, "(kind) values ('noop')").await;
    admin
        .until(SECS_5, "the task", |e| task_state(e, id).is_some())
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "with every connection of the server's pool taken, a client is greeted and hears of \
         a new task at once (the pool's acquire timeout is 10 s): took {:?}",
        started.elapsed()
    );
    drop(held);
    server.shutdown().await;
}

/// The changes recorded in `sked.event_outbox`, as `kind` and the number of ids.
async fn recorded(pool: &sqlx::PgPool) -> Vec<(String, Option<i32>)> {
    sqlx::query_as("select kind, cardinality(ids) from sked.event_outbox order by at, slot, n")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn listener_rows(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sked.event_listeners where expires_at > now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_triggers_record_changes_only_while_a_server_has_clients() {
    let server = Server::start_with(
        EventsConfig {
            linger: Duration::from_millis(300),
            ..EventsConfig::default()
        },
        None,
    )
    .await;
    let pool = &server.db.pool;

    insert(pool, "(kind) values ('noop')").await;
    assert_eq!(
        recorded(pool).await,
        [],
        "without clients the triggers record nothing"
    );
    assert_eq!(listener_rows(pool).await, 0);

    let mut admin = server.connect_hello(&server.admin).await;
    assert_eq!(
        listener_rows(pool).await,
        1,
        "a server with clients has its row"
    );
    let id = insert(pool, "(kind) values ('noop')").await;
    // One row per statement: the insert, then a claim of both tasks.
    sqlx::query("select sked.tasks_claim(gen_random_uuid(), '{default}', '{}', 10, '30 seconds')")
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(
        recorded(pool).await,
        [("t".to_owned(), Some(1)), ("t".to_owned(), Some(2))],
        "with a client, the insert and the claim are recorded"
    );
    let (_, _) = admin
        .until(SECS_5, "the running task", |e| {
            task_state(e, id) == Some(TaskState::Running)
        })
        .await;

    // The last client leaves: after the linger the row is deleted and the triggers record
    // nothing again.
    drop(admin);
    let deadline = Instant::now() + SECS_5;
    while listener_rows(pool).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the row goes a linger after the last client left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = recorded(pool).await.len();
    insert(pool, "(kind) values ('noop')").await;
    assert_eq!(
        recorded(pool).await.len(),
        before,
        "after the linger the triggers record nothing"
    );
    server.shutdown().await;
}

/// A statement on a table with event triggers, and what it records while a server has
/// clients (`docs/events.md`).
enum Step {
    /// `Names(kind, sql)`: run with `{n}` = 150, then 151, it records `kind` naming the 150
    /// rows it changed, then naming none.
    Names(&'static str, &'static str),
    /// Records these changes: kind and number of ids (`None`: no ids).
    Records(&'static str, &'static [(&'static str, Option<i32>)]),
}

/// Every trigger of the live events, in an order where each statement finds the rows it
/// changes.
const EVERY_TRIGGER: &[Step] = &[
    Step::Names(
        "t",
        "insert into sked.tasks (kind) select 'noop' from generate_series(1, {n})",
    ),
    Step::Records(
        "insert into sked.tasks (kind) select 'noop' where false",
        &[],
    ),
    Step::Records("update sked.tasks set priority = priority + 1", &[]),
    Step::Names(
        "t",
        "select sked.tasks_claim(gen_random_uuid(), '{default}', '{}', {n}, '30 seconds')",
    ),
    Step::Records(
        "select sked.tasks_claim(gen_random_uuid(), '{default}', '{}', 10, '30 seconds')",
        &[],
    ),
    Step::Records(
        "update sked.tasks set cancel_requested_at = now()
          where id in (select id from sked.tasks order by id limit 3)",
        &[("t", Some(3))],
    ),
    Step::Names(
        "l",
        "insert into sked.task_logs (task_id, attempt, stream, data)
         select t.id, 1, 'stdout', 'x'
           from (select id from sked.tasks order by id limit {n}) t, generate_series(1, 2)",
    ),
    Step::Records("delete from sked.task_logs", &[]),
    Step::Records("delete from sked.tasks where false", &[]),
    Step::Records(
        "delete from sked.tasks where id = (select id from sked.tasks order by id limit 1)",
        &[("t", None)],
    ),
    Step::Names(
        "f",
        "insert into sked.workflows (name) select 'w{n}' from generate_series(1, {n})",
    ),
    Step::Records("update sked.workflows set name = name || '!'", &[]),
    Step::Names(
        "f",
        "update sked.workflows set state = 'cancelled', finished_at = now()
          where name = 'w{n}!'",
    ),
    Step::Records(
        "delete from sked.workflows where id = (select id from sked.workflows order by id limit 1)",
        &[("f", None)],
    ),
    Step::Names(
        "s",
        "insert into sked.schedules (name, cron, task)
         select 's{n}-' || g, '* * * * *', '{\"kind\": \"noop\"}' from generate_series(1, {n}) g",
    ),
    Step::Names(
        "s",
        "update sked.schedules set history_limit = 5 where name like 's{n}-%'",
    ),
    Step::Names(
        "s",
        "insert into sked.schedule_runs (schedule_id, fire_at, outcome)
         select s.id, now() + g * interval '1 minute', 'skipped'
           from sked.schedules s, generate_series(1, 2) g where s.name like 's{n}-%'",
    ),
    Step::Records("delete from sked.schedule_runs", &[]),
    Step::Records(
        "delete from sked.schedules where id = (select id from sked.schedules order by id limit 1)",
        &[("s", None)],
    ),
    Step::Records(
        "insert into sked.workers (id, name, host, version, queues, concurrency, lease)
         select gen_random_uuid(), 'w', 'h', 'v', '{default}', 1, '30 seconds'
           from generate_series(1, 2)",
        &[("w", None)],
    ),
    Step::Records("update sked.workers set heartbeat_at = now()", &[]),
    Step::Records(
        "update sked.workers set stopping_at = now()
          where id = (select id from sked.workers order by id limit 1)",
        &[("w", None)],
    ),
    Step::Records(
        "delete from sked.workers where id = (select id from sked.workers order by id limit 1)",
        &[("w", None)],
    ),
    Step::Records("delete from sked.workers where false", &[]),
    Step::Records("truncate sked.tasks cascade", &[("t", None)]),
];

/// What a run of [`EVERY_TRIGGER`] records: per statement run, the statement and its
/// changes as [`recorded`] gives them.
type Recorded = Vec<(String, Vec<(String, Option<i32>)>)>;

/// What [`EVERY_TRIGGER`] records while a server has clients.
fn every_trigger_records() -> Recorded {
    let mut all = Vec::new();
    for step in EVERY_TRIGGER {
        match step {
            Step::Names(kind, sql) => {
                all.push((
                    sql.replace("{n}", "150"),
                    vec![(kind.to_string(), Some(150))],
                ));
                all.push((sql.replace("{n}", "151"), vec![(kind.to_string(), None)]));
            }
            Step::Records(sql, changes) => {
                let changes = changes.iter().map(|(k, n)| (k.to_string(), *n)).collect();
                all.push((sql.to_string(), changes));
            }
        }
    }
    all
}

/// Runs every statement of [`EVERY_TRIGGER`] on emptied tables and returns what each one
/// recorded, emptying the outbox after each.
async fn record_every_trigger(pool: &sqlx::PgPool) -> Recorded {
    sqlx::raw_sql(
        "delete from sked.task_logs; delete from sked.schedule_runs; delete from sked.tasks;
         delete from sked.workflows; delete from sked.schedules; delete from sked.workers;
         delete from sked.event_outbox;",
    )
    .execute(pool)
    .await
    .unwrap();
    let mut all = Vec::new();
    for (sql, _) in every_trigger_records() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        all.push((sql, recorded(pool).await));
        sqlx::query("delete from sked.event_outbox")
            .execute(pool)
            .await
            .unwrap();
    }
    all
}

#[tokio::test]
async fn every_trigger_records_nothing_without_a_listener_and_names_at_most_150_rows() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let nothing: Recorded = every_trigger_records()
        .into_iter()
        .map(|(sql, _)| (sql, Vec::new()))
        .collect();

    assert_eq!(
        record_every_trigger(pool).await,
        nothing,
        "without a row in sked.event_listeners no trigger records anything"
    );

    sqlx::query(
        "insert into sked.event_listeners (id, expires_at)
         values (gen_random_uuid(), now() - interval '1 second')",
    )
    .execute(pool)
    .await
    .unwrap();
    assert_eq!(
        record_every_trigger(pool).await,
        nothing,
        "an expired row in sked.event_listeners is no listener"
    );

    sqlx::query("select sked.events_listen(gen_random_uuid(), '1 hour')")
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(
        record_every_trigger(pool).await,
        every_trigger_records(),
        "with a listener, one row per statement that changed rows, naming at most 150 ids"
    );
}

#[tokio::test]
async fn the_first_client_is_greeted_after_transactions_that_could_not_announce_their_changes() {
    let server = Server::start().await;
    let pool = &server.db.pool;

    // A transaction inserts a task while no server has clients: its trigger sends nothing.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("insert into sked.tasks (kind) values ('noop')")
        .execute(&mut *tx)
        .await
        .unwrap();
    // A client comes. If it were greeted now, it could fetch before that transaction
    // commits and never hear of its task: it is greeted once the transaction has ended.
    let mut admin = server.connect(&server.admin).await;
    assert_eq!(
        admin.next(Duration::from_millis(800)).await,
        None,
        "no hello while an older transaction may still commit"
    );
    tx.commit().await.unwrap();
    let committed = Instant::now();
    assert!(matches!(
        admin.next(SECS_5).await,
        Some(ServerEvent::Hello { .. })
    ));
    assert!(
        committed.elapsed() < Duration::from_secs(1),
        "the hello follows the commit, took {:?}",
        committed.elapsed()
    );

    // A transaction that stays open longer than the hub waits: the client is greeted, then
    // told to resync when the transaction has ended.
    let server = {
        drop(admin);
        server.shutdown().await;
        Server::start().await
    };
    let pool = &server.db.pool;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("insert into sked.tasks (kind) values ('noop')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut admin = server.connect(&server.admin).await;
    assert!(
        matches!(admin.next(SECS_5).await, Some(ServerEvent::Hello { .. })),
        "a client is greeted after at most a few seconds"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.commit().await.unwrap();
    let (event, _) = admin
        .until(SECS_5, "a resync after the old transaction", |e| {
            matches!(e, ServerEvent::Resync { .. })
        })
        .await;
    let ServerEvent::Resync { reason } = event else {
        unreachable!()
    };
    assert!(reason.contains("switched on"), "{reason}");
    server.shutdown().await;
}
