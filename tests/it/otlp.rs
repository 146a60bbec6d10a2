//! `--otlp-endpoint`: real `sked-worker` and `sked-server` binaries export their spans over
//! OTLP/HTTP (protobuf) to a receiver served here, which decodes them: one trace per attempt
//! with its task, attempt, queue, worker and outcome, the server's requests, the service's
//! name, everything batched and sent by the graceful shutdown; a bad URL stops a binary at
//! start.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use prost::Message;
use sked_db::testing::TestDb;
use tokio::process::Command;

use crate::support::{insert, stop, wait_for};

/// A span as received: its service's name and its attributes as text.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    status: Option<i32>,
    attributes: HashMap<String, String>,
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn attributes(kvs: &[KeyValue]) -> HashMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

/// An OTLP/HTTP receiver of traces on 127.0.0.1: its base URL, and the spans it decoded.
async fn receiver() -> (String, Arc<Mutex<Vec<Received>>>) {
    let spans: Arc<Mutex<Vec<Received>>> = Arc::default();
    let store = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                assert_eq!(
                    headers
                        .get(axum::http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok()),
                    Some("application/x-protobuf"),
                    "OTLP/HTTP in protobuf"
                );
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                let mut store = store.lock().unwrap();
                for resource_spans in request.resource_spans {
                    let resource = resource_spans
                        .resource
                        .map(|r| attributes(&r.attributes))
                        .unwrap_or_default();
                    let service = resource.get("service.name").cloned().unwrap_or_default();
                    for scope in resource_spans.scope_spans {
                        for span in scope.spans {
                            store.push(Received {
                                service: service.clone(),
                                name: span.name,
                                trace_id: span.trace_id,
                                parent_span_id: span.parent_span_id,
                                status: span.status.map(|s| s.code),
                                attributes: attributes(&span.attributes),
                            });
                        }
                    }
                }
                // An empty ExportTraceServiceResponse: everything was accepted.
                (
                    [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), spans)
}

#[tokio::test]
async fn a_worker_exports_a_trace_per_attempt_with_its_task_and_outcome() {
    let db = TestDb::new().await;
    let (endpoint, spans) = receiver().await;
    let ok = insert(&db.pool, "(queue, command) values ('oq', array['true'])").await;
    let failing = insert(
        &db.pool,
        "(queue, command, max_attempts, backoff_base) values
         ('oq', array['sh','-c','exit 3'], 2, '100 ms')",
    )
    .await;
    let other = insert(
        &db.pool,
        "(queue, command) values ('elsewhere', array['true'])",
    )
    .await;
    let work = std::env::temp_dir().join(format!("sked-otlp-{}", uuid::Uuid::new_v4()));
    let worker = Command::new(env!("CARGO_BIN_EXE_sked-worker"))
        .args(["--name", "w-otlp", "--queues", "oq", "--poll-secs", "0.2"])
        .arg("--work-dir")
        .arg(&work)
        .args(["--otlp-endpoint", &endpoint])
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "info")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start sked-worker");
    let within = Duration::from_secs(30);
    assert_eq!(
        wait_for(&db.pool, ok, &["succeeded"], within).await,
        "succeeded"
    );
    assert_eq!(
        wait_for(&db.pool, failing, &["failed"], within).await,
        "failed"
    );
    // The batch is sent every 5 s; the graceful shutdown sends what is left.
    let (status, stderr) = stop(worker).await;
    let _ = std::fs::remove_dir_all(&work);
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(
        stderr.contains("exporting traces over OTLP"),
        "the worker says where its traces go:\n{stderr}"
    );

    let spans = spans.lock().unwrap().clone();
    let attempts: Vec<&Received> = spans.iter().filter(|s| s.name == "task").collect();
    let find = |task: uuid::Uuid, attempt: u32| {
        let found: Vec<&&Received> = attempts
            .iter()
            .filter(|s| {
                s.attributes.get("task_id") == Some(&task.to_string())
                    && s.attributes.get("attempt") == Some(&attempt.to_string())
            })
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one span for attempt {attempt} of {task}: {attempts:#?}\n{stderr}"
        );
        *found[0]
    };
    for (task, attempt, outcome) in [
        (ok, 1, "succeeded"),
        (failing, 1, "failed"),
        (failing, 2, "failed"),
    ] {
        let span = find(task, attempt);
        assert_eq!(span.attributes["queue"], "oq", "{span:?}");
        assert_eq!(span.attributes["worker"], "w-otlp", "{span:?}");
        assert_eq!(span.attributes["outcome"], outcome, "{span:?}");
        assert_eq!(span.service, "sked-worker", "the binary's name: {span:?}");
        assert!(
            span.parent_span_id.is_empty(),
            "an attempt is a trace of its own: {span:?}"
        );
        let error = outcome == "failed";
        assert_eq!(
            span.status == Some(StatusCode::Error as i32),
            error,
            "a failed attempt's span has an error's status: {span:?}"
        );
    }
    assert_eq!(
        attempts.len(),
        3,
        "three attempts, three spans: {attempts:#?}"
    );
    let traces: std::collections::HashSet<&Vec<u8>> =
        attempts.iter().map(|s| &s.trace_id).collect();
    assert_eq!(traces.len(), 3, "one trace per attempt");
    assert!(
        !spans.iter().any(|s| s.name == "worker"),
        "the worker's own span, as long as its life, is not exported"
    );
    assert!(
        !spans
            .iter()
            .any(|s| s.attributes.get("task_id") == Some(&other.to_string())),
        "nothing of a task the worker did not run"
    );
}

#[tokio::test]
async fn the_server_exports_its_requests_and_a_bad_endpoint_stops_a_binary_at_start() {
    let db = TestDb::new().await;
    let (endpoint, spans) = receiver().await;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let server = Command::new(env!("CARGO_BIN_EXE_sked-server"))
        .args(["--listen", &addr.to_string()])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_SERVICE_NAME", "sked-api-eu")
        .env("DATABASE_URL", &db.url)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start sked-server");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the server listens");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = reqwest::get(format!("http://{addr}/api/v1/tasks?limit=1"))
        .await
        .unwrap();
    assert_eq!(answer.status(), 401, "no token");
    let (status, stderr) = stop(server).await;
    assert!(status.success(), "{status:?}\n{stderr}");
    let spans = spans.lock().unwrap().clone();
    let request = spans
        .iter()
        .find(|s| s.name == "request")
        .unwrap_or_else(|| panic!("the request's span is exported: {spans:#?}\n{stderr}"));
    assert_eq!(request.attributes["method"], "GET", "{request:?}");
    assert_eq!(
        request.attributes["uri"], "/api/v1/tasks?limit=1",
        "{request:?}"
    );
    assert_eq!(
        request.service, "sked-api-eu",
        "OTEL_SERVICE_NAME names the service: {request:?}"
    );

    for (bad, reason) in [("localhost:4318", "scheme"), ("http://", "empty host")] {
        let refused = Command::new(env!("CARGO_BIN_EXE_sked-worker"))
            .args(["--otlp-endpoint", bad])
            .env("DATABASE_URL", &db.url)
            .output()
            .await
            .unwrap();
        assert_eq!(refused.status.code(), Some(1), "{refused:?}");
        let message = String::from_utf8_lossy(&refused.stderr);
        assert!(
            message.contains("--otlp-endpoint")
                && message.contains(bad)
                && message.contains(reason)
                && message.contains("http://localhost:4318"),
            "the error names the flag, the value, what is wrong and an example: {message}"
        );
        let workers: i64 = sqlx::query_scalar("select count(*) from sked.workers")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(workers, 0, "refused before it registers");
    }
}
