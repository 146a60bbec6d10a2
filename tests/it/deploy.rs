//! The deployment files of `deploy/` (`docs/deploy.md`): the systemd units pass
//! `systemd-analyze verify` with their `ExecStart` pointed at the binaries just built; a
//! worker unit's `TimeoutStopSec` outlasts its graceful shutdown, and it lets the worker
//! finish its tasks (SIGTERM to the worker alone); the hardening every unit must keep; the
//! template is the worker unit plus its instance's lines; the capabilities of the run-as
//! drop-in are enough for a root worker, without new privileges, to run tasks as `nobody`
//! end to end, as does the unit's own user with no capabilities; the server unit's command
//! serves as a user of systemd's dynamic range with no capabilities; the variables
//! `sked.env.example` and the Containerfile set are ones the binaries read; the
//! Containerfile's images run as a non-root user and hold only the binaries; and the binaries
//! connect to PostgreSQL over TLS when the URL's `sslmode` asks.
//!
//! `systemd-analyze` runs offline here (`--man=no --generators=no`, no systemd as PID 1
//! needed). Where it is missing the test says so and returns, except in CI (`CI` set), where
//! `.ci/run` installs Debian's `systemd` package and its absence fails the test.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sked_db::testing::TestDb;
use uuid::Uuid;

use crate::support::{insert, process_alive, wait_for};

const SECS: Duration = Duration::from_secs(1);

/// The repository's `deploy/` folder.
fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

/// The binaries a unit or image may run, and where the build put them.
const BINARIES: [(&str, &str); 3] = [
    ("sked", env!("CARGO_BIN_EXE_sked")),
    ("sked-server", env!("CARGO_BIN_EXE_sked-server")),
    ("sked-worker", env!("CARGO_BIN_EXE_sked-worker")),
];

/// Where the units expect the binaries.
const INSTALLED: &str = "/usr/local/bin";

/// A unit file (or drop-in) as `systemd` reads it: `(section, key, value)` in order, comments
/// and blank lines left out.
fn directives(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("a unit line is key=value: {line:?}"));
        out.push((
            section.clone(),
            key.trim().to_owned(),
            value.trim().to_owned(),
        ));
    }
    out
}

/// The last value of `key` in `[Service]` (the one systemd keeps for a single-valued key).
fn service_value<'a>(unit: &'a [(String, String, String)], key: &str) -> Option<&'a str> {
    unit.iter()
        .rev()
        .find(|(s, k, _)| s == "Service" && k == key)
        .map(|(_, _, v)| v.as_str())
}

/// The unit files shipped in `deploy/systemd/`, by file name.
fn units() -> BTreeMap<String, String> {
    let dir = deploy_dir().join("systemd");
    let mut units = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("deploy/systemd/") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.ends_with(".service") {
            units.insert(name, std::fs::read_to_string(&path).unwrap());
        }
    }
    for expected in [
        "sked-server.service",
        "sked-worker.service",
        "sked-worker@.service",
    ] {
        assert!(
            units.contains_key(expected),
            "deploy/systemd/ ships {expected}"
        );
    }
    units
}

/// The run-as drop-in.
fn run_as_drop_in() -> String {
    std::fs::read_to_string(deploy_dir().join("systemd/sked-worker.service.d/run-as.conf"))
        .expect("deploy/systemd/sked-worker.service.d/run-as.conf")
}

/// A systemd time span in seconds: `60`, `60s`, `1min 30s`, `500ms`.
fn seconds(span: &str) -> f64 {
    let mut total = 0.0;
    for part in span.split_whitespace() {
        let digits = part
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(part.len());
        let (number, unit) = part.split_at(digits);
        let number: f64 = number
            .parse()
            .unwrap_or_else(|_| panic!("a time span: {span:?}"));
        total += number
            * match unit {
                "" | "s" | "sec" => 1.0,
                "ms" | "msec" => 0.001,
                "m" | "min" => 60.0,
                "h" | "hr" => 3600.0,
                other => panic!("a time span's unit: {other:?} in {span:?}"),
            };
    }
    total
}

/// The value of `--flag N` (or `--flag=N`) in an ExecStart line.
fn flag(exec_start: &str, flag: &str) -> Option<f64> {
    let words: Vec<&str> = exec_start.split_whitespace().collect();
    words.iter().enumerate().find_map(|(i, w)| {
        let value = if *w == flag {
            words.get(i + 1).copied()
        } else {
            w.strip_prefix(flag).and_then(|r| r.strip_prefix('='))
        }?;
        Some(value.parse().expect("a number of seconds"))
    })
}

/// `systemd-analyze`, or why the test cannot run (outside CI only).
fn systemd_analyze() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("systemd-analyze"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
        assert!(
            !ci,
            "CI must verify the systemd units: .ci/run installs Debian's systemd package \
             when systemd-analyze is missing"
        );
        eprintln!(
            "SKIPPED: systemd-analyze is not on the PATH, so the units are not verified \
             (apt-get install systemd)"
        );
    }
    found
}

#[test]
fn the_units_pass_systemd_analyze_verify() {
    let Some(analyze) = systemd_analyze() else {
        return;
    };
    // Copies whose ExecStart runs the binaries this build made (verify checks that the
    // command exists and is executable), with the drop-in beside both worker units.
    let dir = TempDir::new("sked-units");
    let mut rewritten = 0;
    for (name, text) in units() {
        let mut copy = String::new();
        for line in text.lines() {
            let mut line = line.to_owned();
            if line.starts_with("ExecStart=") {
                for (bin, built) in BINARIES {
                    let installed = format!("ExecStart={INSTALLED}/{bin} ");
                    let bare = format!("ExecStart={INSTALLED}/{bin}");
                    if line.starts_with(&installed) || line == bare {
                        line = line.replacen(&format!("{INSTALLED}/{bin}"), built, 1);
                        rewritten += 1;
                    }
                }
            }
            copy.push_str(&line);
            copy.push('\n');
        }
        std::fs::write(dir.join(&name), copy).unwrap();
    }
    assert_eq!(
        rewritten, 3,
        "each unit's ExecStart runs an installed sked binary"
    );
    for drop_ins in ["sked-worker.service.d", "sked-worker@.service.d"] {
        std::fs::create_dir(dir.join(drop_ins)).unwrap();
        std::fs::write(dir.join(drop_ins).join("run-as.conf"), run_as_drop_in()).unwrap();
    }
    // The template is verified as an instance, so that its specifiers resolve.
    let verified = [
        "sked-server.service",
        "sked-worker.service",
        "sked-worker@reports.service",
    ];
    let out = std::process::Command::new(&analyze)
        .args(["verify", "--man=no", "--generators=no"])
        .args(verified.iter().map(|u| dir.join(u)))
        .output()
        .expect("running systemd-analyze verify");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("systemd-analyze verify said:\n{said}");
    // Lines about other units of the host are not ours to judge; every line about these
    // units is a warning or an error.
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| {
            l.contains(&*dir.to_string_lossy())
                || ["sked-server", "sked-worker", "run-as.conf"]
                    .iter()
                    .any(|u| l.contains(u))
        })
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify accepts the units without a word ({}): {ours:#?}",
        out.status
    );
}

#[test]
fn the_units_keep_their_hardening_and_take_settings_from_the_environment_file() {
    for (name, text) in units() {
        let unit = directives(&text);
        for (key, value) in [
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
            ("NoNewPrivileges", "yes"),
            ("Restart", "on-failure"),
            ("KillSignal", "SIGTERM"),
            ("CapabilityBoundingSet", ""),
        ] {
            assert_eq!(
                service_value(&unit, key),
                Some(value),
                "{name} sets {key}={value}"
            );
        }
        assert!(
            service_value(&unit, "RestartSec").is_some_and(|s| seconds(s) >= 1.0),
            "{name} waits before a restart (RestartSec)"
        );
        let files: Vec<&str> = unit
            .iter()
            .filter(|(s, k, _)| s == "Service" && k == "EnvironmentFile")
            .map(|(_, _, v)| v.as_str())
            .collect();
        assert_eq!(
            files.first(),
            Some(&"/etc/sked/sked.env"),
            "{name} reads /etc/sked/sked.env first, and requires it"
        );
        for (_, key, value) in &unit {
            assert!(
                !value.contains("DATABASE_URL") && !value.contains("postgres://"),
                "{name}: the database's URL is never in a unit, only in /etc/sked ({key}={value})"
            );
        }
        let user = service_value(&unit, "User");
        let dynamic = service_value(&unit, "DynamicUser") == Some("yes");
        assert!(
            dynamic || user.is_some_and(|u| u != "root" && u != "0"),
            "{name} runs as a user of its own, not root"
        );
    }
    let drop_in = directives(&run_as_drop_in());
    assert_eq!(service_value(&drop_in, "User"), Some("root"));
    for key in [
        "NoNewPrivileges",
        "ProtectSystem",
        "ProtectHome",
        "PrivateTmp",
    ] {
        assert_eq!(
            service_value(&drop_in, key),
            None,
            "the run-as drop-in keeps the unit's {key}"
        );
    }
}

#[test]
fn a_worker_unit_outlasts_the_workers_graceful_shutdown() {
    for (name, text) in units().into_iter().filter(|(n, _)| n.contains("worker")) {
        let unit = directives(&text);
        let exec = service_value(&unit, "ExecStart").unwrap();
        let grace = flag(exec, "--shutdown-grace-secs").unwrap_or_else(|| {
            panic!("{name} gives --shutdown-grace-secs, which TimeoutStopSec is counted from")
        });
        let kill_grace = flag(exec, "--kill-grace-secs")
            .unwrap_or_else(|| panic!("{name} gives --kill-grace-secs"));
        let timeout = seconds(service_value(&unit, "TimeoutStopSec").expect("TimeoutStopSec"));
        // The grace, then the tasks' kill grace, then the services' processes' (stopped after
        // the tasks' results), and 10 s to write results and deregister.
        let needed = grace + 2.0 * kill_grace + 10.0;
        assert!(
            timeout >= needed && timeout > grace,
            "{name}: TimeoutStopSec={timeout} s must exceed --shutdown-grace-secs {grace} + twice \
             --kill-grace-secs {kill_grace} + 10 s for the results, {needed} s"
        );
        assert_eq!(
            service_value(&unit, "KillMode"),
            Some("mixed"),
            "{name}: SIGTERM goes to the worker alone, which stops its own tasks after the \
             grace; the rest of the control group gets SIGKILL once the worker is gone"
        );
    }
}

#[test]
fn the_worker_template_is_the_worker_unit_with_its_instance() {
    let units = units();
    let plain = directives(&units["sked-worker.service"]);
    let template = directives(&units["sked-worker@.service"]);
    let instance_lines: Vec<_> = template
        .iter()
        .filter(|(_, _, v)| v.contains("%i"))
        .collect();
    assert!(
        instance_lines
            .iter()
            .any(|(_, k, v)| k == "EnvironmentFile" && v == "-/etc/sked/worker-%i.env"),
        "an instance reads its own settings: {instance_lines:?}"
    );
    let without_instance = |unit: &[(String, String, String)]| -> Vec<(String, String, String)> {
        unit.iter()
            .filter(|(_, k, v)| !v.contains("%i") && k != "Description")
            .cloned()
            .collect()
    };
    assert_eq!(
        without_instance(&template),
        without_instance(&plain),
        "sked-worker@.service is sked-worker.service line for line, but for its instance's lines"
    );
}

/// The capabilities the run-as drop-in keeps, as `setpriv` names them (`setuid`, …).
fn run_as_capabilities() -> Vec<String> {
    let drop_in = directives(&run_as_drop_in());
    let caps: Vec<String> = service_value(&drop_in, "CapabilityBoundingSet")
        .expect("the run-as drop-in sets CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| {
            c.strip_prefix("CAP_")
                .unwrap_or_else(|| panic!("a capability's name: {c}"))
                .to_ascii_lowercase()
        })
        .collect();
    assert!(!caps.is_empty());
    caps
}

/// A task's state, error and JSON output.
async fn outcome(
    pool: &sqlx::PgPool,
    id: Uuid,
) -> (String, Option<String>, Option<serde_json::Value>) {
    sqlx::query_as("select state, error, output from sked.tasks where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .expect("reading a task")
}

/// Who the worker runs as, as systemd would start it, through `setpriv`.
enum RunAs {
    /// `sked-worker.service`: a user of its own (`nobody` stands for `sked`), no capabilities.
    OwnUser,
    /// With the run-as drop-in: root, with the drop-in's capabilities only.
    RootWithDropIn,
}

/// The worker unit's `ExecStart` (its work dir made first as systemd makes a
/// `CacheDirectory`: the unit's mode, owned by the worker's user) with the unit's umask and
/// no new privileges:
/// tasks run as `nobody`, the worker reads what they leave, removes their directories
/// (read-only and sticky parts included), kills what they leave running, and on SIGTERM lets
/// a running task finish and stops cleanly within the unit's `TimeoutStopSec`.
async fn run_like_the_unit(run_as: RunAs) {
    let unit = directives(&units()["sked-worker.service"]);
    let exec = service_value(&unit, "ExecStart").unwrap();
    let cache = TempDir::new("sked-cache");
    // The unit's own arguments, %C (the cache directories' root) resolved.
    let args: Vec<String> = exec
        .split_whitespace()
        .skip(1)
        .map(|w| w.replace("%C", &cache.to_string_lossy()))
        .collect();
    let work = cache.join("sked-worker");
    assert!(
        args.iter().any(|a| Path::new(a) == work),
        "the unit's work dir is in its CacheDirectory: {exec}"
    );
    let mode = service_value(&unit, "CacheDirectoryMode")
        .map(|v| u32::from_str_radix(v, 8).expect("an octal mode"))
        .expect("CacheDirectoryMode");
    std::fs::create_dir(&work).unwrap();
    std::fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
    let mut setpriv = tokio::process::Command::new("setpriv");
    let umask = service_value(&unit, "UMask")
        .map(|v| libc::mode_t::from_str_radix(v, 8).expect("an octal umask"))
        .expect("UMask");
    // SAFETY: umask is async-signal-safe and touches no memory.
    unsafe {
        setpriv.pre_exec(move || {
            libc::umask(umask);
            Ok(())
        });
    }
    setpriv.args(["--no-new-privs", "--inh-caps=-all"]);
    match run_as {
        RunAs::OwnUser => {
            std::os::unix::fs::chown(&work, Some(65534), Some(65534)).unwrap();
            setpriv.args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--bounding-set=-all",
            ]);
        }
        RunAs::RootWithDropIn => {
            let bounding = std::iter::once("-all".to_owned())
                .chain(run_as_capabilities().iter().map(|c| format!("+{c}")))
                .collect::<Vec<_>>()
                .join(",");
            setpriv.arg(format!("--bounding-set={bounding}"));
        }
    }
    let db = TestDb::new().await;
    let queue = format!("deploy-{}", Uuid::new_v4().simple());
    let mut worker = setpriv
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_sked-worker"))
        .args(&args)
        .env_clear()
        .env("DATABASE_URL", &db.url)
        .env("PATH", sked_worker::isolation::DEFAULT_PATH)
        .env("SKED_QUEUES", &queue)
        .env("SKED_POLL_SECS", "0.2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting sked-worker through setpriv (util-linux)");

    // Its output through $SKED_OUTPUT, in a directory only the task's user may enter.
    let who = insert(
        &db.pool,
        &format!(
            "(queue, command) values ('{queue}', array['sh', '-c', \
             'printf ''{{\"uid\": %s, \"groups\": \"%s\"}}'' \"$(id -u)\" \"$(id -G)\" > \"$SKED_OUTPUT\"'])"
        ),
    )
    .await;
    // Read-only and sticky directories left behind, and a process left running.
    let leaves = insert(
        &db.pool,
        &format!(
            "(queue, command) values ('{queue}', array['sh', '-c', \
             'mkdir -p kept/deeper sticky && touch kept/deeper/file sticky/file && \
              chmod 1777 sticky && chmod 500 kept/deeper kept; \
              sleep 300 >/dev/null 2>&1 & echo \"{{\\\"pid\\\": $!}}\"'])"
        ),
    )
    .await;
    for id in [who, leaves] {
        let state = wait_for(&db.pool, id, &["succeeded", "failed"], 30 * SECS).await;
        let (_, error, _) = outcome(&db.pool, id).await;
        assert_eq!(
            state, "succeeded",
            "the worker, with the unit's rights only, runs the task: {error:?}"
        );
    }
    // The worker runs as the unit says (seen by the kernel, not by what setpriv was asked).
    let worker_pid = worker.id().expect("the worker's pid");
    let status = std::fs::read_to_string(format!("/proc/{worker_pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let (uid, bounding) = match run_as {
        RunAs::OwnUser => ("65534", 0),
        RunAs::RootWithDropIn => ("0", run_as_capabilities().len() as u32),
    };
    assert_eq!(field("Uid:"), [uid; 4], "the worker's uids: {status}");
    assert_eq!(field("NoNewPrivs:"), ["1"], "no new privileges: {status}");
    let capbnd = u64::from_str_radix(field("CapBnd:")[0], 16).unwrap();
    assert_eq!(
        capbnd.count_ones(),
        bounding,
        "the worker's bounding set has the unit's capabilities only: {status}"
    );
    let (_, _, output) = outcome(&db.pool, who).await;
    assert_eq!(
        output,
        Some(serde_json::json!({"uid": 65534, "groups": "65534"})),
        "the task ran as nobody, without other groups, and the worker read its output"
    );
    let (_, _, output) = outcome(&db.pool, leaves).await;
    let pid = output
        .as_ref()
        .and_then(|o| o["pid"].as_i64())
        .expect("the task printed the pid it left running") as i32;
    let deadline = tokio::time::Instant::now() + 10 * SECS;
    while process_alive(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the process {pid} the task left running (as nobody) is killed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let tasks = work.join("tasks");
    let deadline = tokio::time::Instant::now() + 10 * SECS;
    loop {
        let left: Vec<PathBuf> = std::fs::read_dir(&tasks)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .flat_map(|d| std::fs::read_dir(d.path()).unwrap())
            .map(|e| e.unwrap().path())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tasks' directories are removed, read-only and sticky parts included: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // SIGTERM to the worker alone (KillMode=mixed) while a task runs: the task finishes.
    let running = insert(
        &db.pool,
        &format!(
            "(queue, command) values ('{queue}', array['sh', '-c', \
             'sleep 2; echo ''{{\"finished\": true}}'''])"
        ),
    )
    .await;
    wait_for(&db.pool, running, &["running"], 30 * SECS).await;
    let timeout = seconds(service_value(&unit, "TimeoutStopSec").unwrap());
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(worker_pid as i32, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs_f64(timeout), worker.wait())
        .await
        .unwrap_or_else(|_| panic!("the worker stops within TimeoutStopSec ({timeout} s)"))
        .unwrap();
    let mut stderr = String::new();
    if let Some(mut pipe) = worker.stderr.take() {
        use tokio::io::AsyncReadExt;
        pipe.read_to_string(&mut stderr).await.unwrap();
    }
    assert!(
        status.success(),
        "the worker stops cleanly on SIGTERM ({status:?}, signal {:?}): {stderr}",
        status.signal()
    );
    assert_eq!(
        outcome(&db.pool, running).await,
        (
            "succeeded".to_owned(),
            None,
            Some(serde_json::json!({"finished": true}))
        ),
        "a task running at SIGTERM finishes within the shutdown grace"
    );
}

#[tokio::test]
async fn the_worker_unit_runs_as_its_own_user_without_capabilities() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: starting the worker as another user needs root; this is not");
        return;
    }
    run_like_the_unit(RunAs::OwnUser).await;
}

#[tokio::test]
async fn the_run_as_drop_in_keeps_what_a_root_worker_needs() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: a worker that runs tasks as other users runs as root; this is not");
        return;
    }
    run_like_the_unit(RunAs::RootWithDropIn).await;
}

/// The server unit's `ExecStart` as a user systemd would make for it (`DynamicUser=yes`: an
/// unused uid from systemd's dynamic range), with no capabilities, the unit's umask and no
/// new privileges: it serves the API, then stops cleanly on SIGTERM within `TimeoutStopSec`.
#[tokio::test]
async fn the_server_unit_serves_as_a_dynamic_user_without_capabilities() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: starting the server as another user needs root; this is not");
        return;
    }
    const DYNAMIC_UID: u32 = 61_999;
    let unit = directives(&units()["sked-server.service"]);
    assert_eq!(service_value(&unit, "DynamicUser"), Some("yes"));
    let exec = service_value(&unit, "ExecStart").unwrap();
    let program = exec.split_whitespace().next().unwrap();
    assert_eq!(program, format!("{INSTALLED}/sked-server"), "{exec}");
    let umask = service_value(&unit, "UMask")
        .map(|v| libc::mode_t::from_str_radix(v, 8).expect("an octal umask"))
        .expect("UMask");
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let db = TestDb::new().await;
    let mut setpriv = tokio::process::Command::new("setpriv");
    // SAFETY: umask is async-signal-safe and touches no memory.
    unsafe {
        setpriv.pre_exec(move || {
            libc::umask(umask);
            Ok(())
        });
    }
    let mut server = setpriv
        .args(["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"])
        .arg(format!("--reuid={DYNAMIC_UID}"))
        .arg(format!("--regid={DYNAMIC_UID}"))
        .args(["--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_sked-server"))
        .args(exec.split_whitespace().skip(1))
        .env_clear()
        .env("DATABASE_URL", &db.url)
        .env("SKED_LISTEN", addr.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("starting sked-server through setpriv (util-linux)");

    let deadline = tokio::time::Instant::now() + 20 * SECS;
    let answer = loop {
        if let Ok(mut conn) = tokio::net::TcpStream::connect(addr).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            conn.write_all(b"GET /api/v1/health HTTP/1.0\r\nHost: sked\r\n\r\n")
                .await
                .unwrap();
            let mut answer = String::new();
            conn.read_to_string(&mut answer).await.unwrap();
            break answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sked-server listens on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "the server, as its unit runs it, answers its health check: {answer}"
    );
    let pid = server.id().expect("the server's pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.contains(&DYNAMIC_UID.to_string()))
            && status.lines().any(|l| l == "CapBnd:\t0000000000000000")
            && status.lines().any(|l| l == "NoNewPrivs:\t1"),
        "the server runs as its user, with no capabilities and no new privileges: {status}"
    );
    let timeout = seconds(service_value(&unit, "TimeoutStopSec").unwrap());
    // SAFETY: kill has no memory preconditions; the pid is our child's.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    let status = tokio::time::timeout(Duration::from_secs_f64(timeout), server.wait())
        .await
        .unwrap_or_else(|_| panic!("the server stops within TimeoutStopSec ({timeout} s)"))
        .unwrap();
    let mut stderr = String::new();
    if let Some(mut pipe) = server.stderr.take() {
        use tokio::io::AsyncReadExt;
        pipe.read_to_string(&mut stderr).await.unwrap();
    }
    assert!(
        status.success(),
        "the server stops cleanly on SIGTERM ({status:?}): {stderr}"
    );
}

/// The variables a binary reads, as its `--help` names them (`[env: SKED_QUEUES=…]`).
fn variables_read_by(binary: &str) -> Vec<String> {
    let out = std::process::Command::new(binary)
        .arg("--help")
        .output()
        .expect("running --help");
    assert!(out.status.success(), "{binary} --help");
    String::from_utf8_lossy(&out.stdout)
        .split("[env: ")
        .skip(1)
        .map(|rest| rest.split(['=', ']']).next().unwrap().to_owned())
        .collect()
}

#[test]
fn the_environment_file_and_the_images_name_only_variables_the_binaries_read() {
    let server = variables_read_by(env!("CARGO_BIN_EXE_sked-server"));
    let worker = variables_read_by(env!("CARGO_BIN_EXE_sked-worker"));
    assert!(
        server.contains(&"SKED_LISTEN".to_owned()) && worker.contains(&"SKED_QUEUES".to_owned())
    );
    // Every `NAME=` of sked.env.example, set or commented out.
    let example = std::fs::read_to_string(deploy_dir().join("systemd/sked.env.example")).unwrap();
    let mut named = Vec::new();
    for line in example.lines() {
        let line = line.trim_start_matches('#');
        if let Some((name, _)) = line.split_once('=')
            && !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            named.push(("sked.env.example", name.to_owned()));
        }
    }
    assert!(
        named.len() > 10,
        "sked.env.example names the settings: {named:?}"
    );
    let containerfile = std::fs::read_to_string(deploy_dir().join("Containerfile")).unwrap();
    for line in containerfile.lines() {
        if let Some(vars) = line.strip_prefix("ENV ") {
            for pair in vars.split_whitespace() {
                let (name, _) = pair.split_once('=').expect("ENV NAME=value");
                named.push(("Containerfile", name.to_owned()));
            }
        }
    }
    for (file, name) in named {
        // RUST_LOG is the log filter every binary reads (tracing's EnvFilter), not a flag.
        assert!(
            name == "RUST_LOG" || server.contains(&name) || worker.contains(&name),
            "{file} names {name}, which neither sked-server nor sked-worker reads"
        );
    }
}

/// One stage of the Containerfile: its base, its name, and its instructions (a line each,
/// continuations joined).
#[derive(Debug)]
struct Stage {
    from: String,
    name: String,
    instructions: Vec<(String, String)>,
}

fn stages(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        logical.push(std::mem::take(&mut current));
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical {
        let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let word = word.to_ascii_uppercase();
        let rest = rest.trim().to_owned();
        if word == "FROM" {
            let parts: Vec<&str> = rest.split_whitespace().collect();
            let (from, name) = match parts.as_slice() {
                [from, as_, name] if as_.eq_ignore_ascii_case("as") => (*from, *name),
                _ => panic!("every stage is named (FROM image AS name): {line}"),
            };
            stages.push(Stage {
                from: from.to_owned(),
                name: name.to_owned(),
                instructions: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .unwrap_or_else(|| panic!("an instruction before the first FROM: {line}"))
                .instructions
                .push((word, rest));
        }
    }
    stages
}

#[test]
fn the_container_images_run_as_a_user_and_hold_only_the_binaries() {
    let text = std::fs::read_to_string(deploy_dir().join("Containerfile")).unwrap();
    let stages = stages(&text);
    let build = &stages[0];
    assert!(
        stages.len() >= 2 && !stages.iter().skip(1).any(|s| s.from == build.from),
        "the build stage's toolchain image is not a runtime image: {stages:#?}"
    );
    let by_name: BTreeMap<&str, &Stage> = stages.iter().map(|s| (s.name.as_str(), s)).collect();
    // A stage's user: its own last USER, else its base stage's.
    let user_of = |stage: &Stage| -> Option<String> {
        let mut s = stage;
        loop {
            if let Some((_, user)) = s.instructions.iter().rev().find(|(w, _)| w == "USER") {
                return Some(user.clone());
            }
            s = by_name.get(s.from.as_str())?;
        }
    };
    let mut images = Vec::new();
    for stage in &stages[1..] {
        let user = user_of(stage).unwrap_or_else(|| panic!("stage {} sets a USER", stage.name));
        let uid = user.split(':').next().unwrap();
        assert!(
            uid.parse::<u32>().is_ok_and(|u| u != 0),
            "stage {}: a numeric, non-root USER (a name would need the image's passwd to be \
             trusted by the runtime), got {user}",
            stage.name
        );
        for (word, args) in &stage.instructions {
            assert_ne!(word, "ADD", "stage {}: COPY only", stage.name);
            if word != "COPY" {
                continue;
            }
            let parts: Vec<&str> = args.split_whitespace().collect();
            let copied = match parts.as_slice() {
                ["--from=build", from, to] => BINARIES.iter().map(|(bin, _)| *bin).find(|bin| {
                    *from == format!("/out/{bin}") && *to == format!("{INSTALLED}/{bin}")
                }),
                _ => None,
            };
            let bin = copied.unwrap_or_else(|| {
                panic!(
                    "stage {}: a runtime image copies a sked binary from the build stage and \
                     nothing else: COPY {args}",
                    stage.name
                )
            });
            assert_eq!(
                bin, stage.name,
                "the stage named after a binary holds that binary"
            );
            let entrypoint = stage
                .instructions
                .iter()
                .rev()
                .find(|(w, _)| w == "ENTRYPOINT")
                .map(|(_, a)| a.as_str());
            assert_eq!(
                entrypoint,
                Some(format!("[\"{INSTALLED}/{bin}\"]").as_str()),
                "the image of {bin} runs it"
            );
            images.push(bin);
        }
    }
    images.sort();
    assert_eq!(
        images,
        ["sked", "sked-server", "sked-worker"],
        "one image per binary, each with one COPY"
    );
}

/// A fresh directory under the system's temp directory, removed when dropped (also when the
/// test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `url` with the query parameter `sslmode=mode`.
fn with_sslmode(url: &str, mode: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}sslmode={mode}")
}

#[tokio::test]
async fn the_binaries_connect_to_postgresql_over_tls_when_the_url_asks() {
    let db = TestDb::new().await;
    let ssl: String = sqlx::query_scalar("show ssl")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    if ssl != "on" {
        eprintln!("SKIPPED: this PostgreSQL has ssl = off, so TLS cannot be tried");
        return;
    }
    // sslmode=require: encrypted, the certificate not checked (as libpq).
    let url = with_sslmode(&db.url, "require");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked"))
        .arg("migrate")
        .env("DATABASE_URL", &url)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "sked migrate over TLS: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked-server"))
        .args(["--listen", &addr.to_string()])
        .env("DATABASE_URL", &url)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + 30 * SECS;
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the server listens");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (connections, encrypted): (i64, i64) = sqlx::query_as(
        "select count(*), count(*) filter (where s.ssl)
           from pg_stat_activity a join pg_stat_ssl s using (pid)
          where a.datname = current_database() and a.application_name = 'sked-server'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(connections > 0, "the server is connected");
    assert_eq!(
        encrypted, connections,
        "every connection of the server is encrypted"
    );
    let _ = server.kill().await;

    // sslmode=verify-full checks the certificate: this server's is not one a public root
    // signed for 127.0.0.1, and the connection is refused, saying why.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked"))
        .arg("migrate")
        .env("DATABASE_URL", with_sslmode(&db.url, "verify-full"))
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "an unverifiable certificate is refused"
    );
    assert!(
        said.to_lowercase().contains("certificate"),
        "says why: {said}"
    );
}
