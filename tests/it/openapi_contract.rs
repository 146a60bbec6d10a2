//! The API against its own OpenAPI document: Schemathesis generates requests from the
//! document served at `/api/v1/openapi.json` (valid ones, and ones that break it), sends them
//! to a real server on a fresh database with an admin token, and checks every answer against
//! the document, with every check it has: its status code and headers are declared, its body
//! matches the declared schema, no 5xx, every request the document allows is accepted and
//! every request that breaks it is refused, and, following the document's links (its own and
//! those Schemathesis infers), what was created can be read and what was deleted is gone.
//!
//! A request the document allows may still be refused where what exists decides (404, 409),
//! and, on the operations `openapi_contract.toml` names, for the rules it names: those a JSON
//! Schema cannot state, such as a relation between two fields or a workflow's graph.
//!
//! Needs `schemathesis` (`SKED_SCHEMATHESIS`, set by `cargo xtask test`, else on the PATH);
//! `SKED_SCHEMATHESIS_TESTS=skip` leaves this test out.

use std::process::Stdio;
use std::time::{Duration, Instant};

use sked_db::testing::TestDb;
use sked_db::token::Role;
use tokio_util::sync::CancellationToken;

/// Test cases per operation and phase: enough to reach every declared status and boundary,
/// few enough for the run to take a couple of minutes on two cores.
const MAX_EXAMPLES: &str = "25";
/// A fixed seed: a failure reproduces with the same command.
const SEED: &str = "1";
/// Schemathesis's settings: the statuses a valid request may also get on the operations whose
/// rules JSON Schema cannot state, each with its rules.
const CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/it/openapi_contract.toml"
);

/// The Schemathesis program, or `None` (with a message) when `SKED_SCHEMATHESIS_TESTS=skip`.
fn schemathesis() -> Option<String> {
    if std::env::var("SKED_SCHEMATHESIS_TESTS").is_ok_and(|v| v == "skip") {
        eprintln!("SKED_SCHEMATHESIS_TESTS=skip: the OpenAPI contract test does not run");
        return None;
    }
    let found = std::env::var("SKED_SCHEMATHESIS")
        .ok()
        .filter(|p| !p.is_empty())
        .or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|dir| dir.join("schemathesis"))
                .find(|p| p.is_file())
                .map(|p| p.display().to_string())
        });
    match found {
        Some(program) => Some(program),
        None => panic!(
            "the OpenAPI contract test needs Schemathesis: `python3 -m pip install \
             schemathesis` (with CI set, `cargo xtask test` installs it itself into \
             target/schemathesis), or set SKED_SCHEMATHESIS_TESTS=skip"
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_keeps_its_openapi_contract() {
    let Some(program) = schemathesis() else {
        return;
    };
    let db = TestDb::new().await;
    let admin = sked_db::token::create(&db.pool, "root", Role::Admin, "schemathesis")
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/api/v1/openapi.json",
        listener.local_addr().unwrap()
    );
    let shutdown = CancellationToken::new();
    // Its tasks wait for a worker that never comes: a long poll of one (`?wait=`) answers
    // after 100 ms, not the 50 s of the default, which is longer than a request may take.
    let quotas = sked_server::Quotas {
        max_wait: Duration::from_millis(100),
        ..sked_server::Quotas::default()
    };
    let server = tokio::spawn(sked_server::serve_configured(
        db.pool.clone(),
        listener,
        shutdown.clone(),
        sked_server::EventsConfig::default(),
        quotas,
        sked_server::upkeep(&db.pool),
    ));

    let args = [
        "--config-file",
        CONFIG,
        "run",
        url.as_str(),
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        MAX_EXAMPLES,
        "--seed",
        SEED,
        // One worker: Hypothesis's caches are shared by schemathesis's worker threads without
        // a lock, and two workers once ended a run in an internal KeyError (a "Runtime Error"
        // of the tool, every generated case having passed).
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--header",
        &format!("Authorization: Bearer {admin}"),
    ];
    let shown: Vec<&str> = args
        .iter()
        .map(|a| {
            if a.starts_with("Authorization") {
                "Authorization: Bearer <admin token>"
            } else {
                a
            }
        })
        .collect();
    eprintln!("running {program} {}", shown.join(" "));
    let started = Instant::now();
    let run = tokio::process::Command::new(&program)
        .args(args)
        .env("NO_COLOR", "1")
        // Schemathesis keeps its state (`.schemathesis/`) in its working directory.
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("schemathesis ends within 10 minutes")
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!(
        "{report}\nschemathesis took {:.0} s",
        started.elapsed().as_secs_f64()
    );

    shutdown.cancel();
    server.await.unwrap().unwrap();
    assert!(
        output.status.success(),
        "every answer of the API keeps its OpenAPI document (schemathesis exited with {}; its \
         report is above)",
        output.status
    );
    // The summary's "N generated, M passed, …": every case generated passed. Its warnings
    // (an operation it could not reach, or whose valid requests were mostly refused) are in
    // the report above.
    let (generated, passed) = report
        .lines()
        .find_map(|line| {
            let (generated, rest) = line.trim().split_once(" generated, ")?;
            let passed = rest.split(' ').next()?;
            Some((generated.parse::<u64>().ok()?, passed.parse::<u64>().ok()?))
        })
        .expect("schemathesis's summary counts the test cases");
    // Every operation of the document was tested: "Selected: N/N" and "Tested: N".
    let operations = report
        .lines()
        .find_map(|line| line.trim().strip_prefix("Selected: ")?.split_once('/'))
        .map(|(_, total)| total.trim().to_owned())
        .expect("schemathesis's summary counts the operations");
    assert!(
        generated > 1000
            && passed == generated
            && report.contains(&format!("Tested: {operations}")),
        "schemathesis tested every operation and every case passed: {generated} generated, \
         {passed} passed"
    );
}
