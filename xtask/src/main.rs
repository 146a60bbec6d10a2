//! `cargo xtask`: project tasks that take more than one cargo command.
//!
//! - `cargo xtask web` builds the dashboard into `web/dist` ([`web`]), which the server embeds.
//! - `cargo xtask dev [-- <sked dev arguments>]` builds the dashboard, then runs
//!   `cargo run --release --bin sked -- dev`: sked with its dashboard, in one command.
//! - `cargo xtask test [-- <cargo test arguments>]` runs the whole test suite on a fresh
//!   machine, described below.
//!
//! The test suite includes end-to-end tests of the dashboard in a headless Chromium driven
//! through chromedriver: `test` builds the dashboard first, and finds `chromium` and
//! `chromedriver` on the PATH; when they are missing on Debian as root with `CI` set, it
//! installs the `chromium` and `chromium-driver` packages. `SKED_BROWSER_TESTS=skip` leaves
//! the browser tests out (they then say so instead of running).
//!
//! The worker's sandbox tests run tasks through bubblewrap: `test` finds `bwrap` on the PATH
//! and installs the `bubblewrap` package the same way when it is missing; when it cannot have
//! a `bwrap` that works here, it prints why and sets `SKED_SANDBOX_TESTS=skip` (which also
//! leaves them out when set by hand).
//!
//! The OpenAPI contract test runs Schemathesis against the API: `test` finds `schemathesis`
//! in `<target dir>/schemathesis` (a Python virtual environment) or on the PATH; when it is
//! missing with `CI` set, it installs the pinned version there (`python3 -m venv`, pip).
//! `SKED_SCHEMATHESIS_TESTS=skip` leaves that test out.
//!
//! The thin clients' own tests (`clients/python`, `clients/typescript`) run under
//! `tests/it/clients.rs`: `test` installs what they need when it is missing or out of date, a
//! virtual environment in `<target dir>/clients-python` and `npm ci` in `clients/typescript`
//! (`clients.rs`); `SKED_CLIENT_TESTS=skip` leaves them out.
//!
//! The tests need a PostgreSQL server on which user `postgres` may create databases; this
//! picks one, in this order:
//!
//! 1. the server in `DATABASE_URL`, when that is set;
//! 2. the server at `127.0.0.1:5432`, when it lets user `postgres` in without a password;
//! 3. a private cluster under `<target dir>/sked-test-pg`, made from the PostgreSQL server
//!    binaries installed on this machine (the code of `sked dev`, [`sked::embedded_pg`]),
//!    started before the tests and stopped after them.
//!
//! Then it runs `cargo test --workspace <arguments>` with `DATABASE_URL` naming that server,
//! and exits with its status. When no server answers and no server binaries are installed,
//! it says how to install them; on Debian as root with `CI` set, it installs them itself.
//!
//! `SKED_XTASK_FORCE_PRIVATE_PG=1` always takes the private cluster (ignoring `DATABASE_URL`
//! and the server at 5432): a way to check that path on a machine that has a server.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

mod browser;
mod clients;
mod install;
mod sandbox;
mod schemathesis;
mod web;

use sked::embedded_pg::{Cluster, PgBinaries, PgError};
use sqlx::{ConnectOptions, Connection};

/// The server tried when `DATABASE_URL` is not set.
const LOCAL_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// How long the probe of [`LOCAL_URL`] may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

const USAGE: &str = "\
usage: cargo xtask web [--dev]
       cargo xtask dev [-- <sked dev arguments>]
       cargo xtask test [-- <cargo test arguments>]

web:  builds the dashboard into web/dist (the server embeds it); --dev builds it unoptimized,
      which is quicker while changing it.
dev:  builds the dashboard, then runs `cargo run --release --bin sked -- dev`.
test: builds the dashboard, then runs `cargo test` against a PostgreSQL: DATABASE_URL when
      set, else the server at 127.0.0.1:5432 (user postgres, no password), else a private
      cluster under target/sked-test-pg. SKED_XTASK_FORCE_PRIVATE_PG=1 always uses the
      private cluster. Browser tests need chromium and chromedriver (installed on Debian as
      root when CI is set); SKED_BROWSER_TESTS=skip leaves them out. Sandbox tests need
      bubblewrap (installed the same way; skipped, saying why, when it cannot be had);
      SKED_SANDBOX_TESTS=skip leaves them out. The OpenAPI contract test needs schemathesis
      (installed into target/schemathesis when CI is set); SKED_SCHEMATHESIS_TESTS=skip
      leaves it out. The clients' tests need python3 (with venv) and npm: their packages
      are installed into target/clients-python and clients/typescript/node_modules;
      SKED_CLIENT_TESTS=skip leaves them out.";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    match args.next().as_deref().and_then(|a| a.to_str()) {
        Some(task @ ("test" | "dev" | "web")) => {
            let mut rest: Vec<OsString> = args.collect();
            if rest.first().is_some_and(|a| a == "--") {
                rest.remove(0);
            }
            // `cargo xtask web --dev`: the quick, unoptimized build of the dashboard.
            let dev_build = task == "web" && rest.first().is_some_and(|a| a == "--dev");
            if let Err(e) = web::build(&workspace_root(), &target_dir(), dev_build) {
                eprintln!("xtask: {e}");
                return ExitCode::FAILURE;
            }
            match task {
                "test" => test(rest).await,
                "dev" => dev(rest),
                _ => ExitCode::SUCCESS,
            }
        }
        Some("help" | "-h" | "--help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        other => {
            if let Some(task) = other {
                eprintln!("xtask: unknown task {task:?}");
            }
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// Where the tests' database comes from.
enum Database {
    Given(String),
    Local,
    Private(Cluster),
}

/// `cargo run --release --bin sked -- dev <args>`, in the foreground.
fn dev(args: Vec<OsString>) -> ExitCode {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command
        .args(["run", "--release", "--bin", "sked", "--", "dev"])
        .args(&args)
        .current_dir(workspace_root());
    clear_cargo_run_env(&mut command);
    // Ctrl-C reaches `sked dev` too, which stops cleanly; this process just waits for it.
    ctrlc_ignored();
    match command.status() {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => ExitCode::from(u8::try_from(s.code().unwrap_or(1)).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: cannot run cargo run: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Ignores SIGINT in this process (its children still get it from the terminal).
fn ctrlc_ignored() {
    // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
}

async fn test(cargo_args: Vec<OsString>) -> ExitCode {
    let browser = match browser::find_or_install() {
        Ok(b) => b,
        Err(message) => {
            eprintln!("xtask: {message}");
            return ExitCode::FAILURE;
        }
    };
    let sandbox = sandbox::find_or_install();
    let schemathesis = match schemathesis::find_or_install(&target_dir()) {
        Ok(s) => s,
        Err(message) => {
            eprintln!("xtask: {message}");
            return ExitCode::FAILURE;
        }
    };
    let clients = match clients::find_or_install(&workspace_root(), &target_dir()) {
        Ok(c) => c,
        Err(message) => {
            eprintln!("xtask: {message}");
            return ExitCode::FAILURE;
        }
    };
    let database = match choose_database().await {
        Ok(d) => d,
        Err(message) => {
            eprintln!("xtask: {message}");
            return ExitCode::FAILURE;
        }
    };
    let url = match &database {
        Database::Given(url) => {
            println!("xtask: tests use DATABASE_URL ({})", redact(url));
            url.clone()
        }
        Database::Local => {
            println!("xtask: tests use the PostgreSQL server at {LOCAL_URL}");
            LOCAL_URL.to_owned()
        }
        Database::Private(cluster) => {
            let url = cluster.url("postgres");
            let how = if cluster.reused {
                "already running"
            } else {
                "started"
            };
            println!(
                "xtask: tests use a private PostgreSQL cluster ({how}) in {} at {url}",
                cluster.data_dir.display()
            );
            for note in &cluster.notes {
                println!("xtask: note: {note}");
            }
            url
        }
    };

    // Ctrl-C reaches cargo and the tests too; this process waits for them to end and then
    // stops the private cluster instead of dying first.
    tokio::spawn(async {
        while tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("xtask: interrupted; waiting for cargo test to stop");
        }
    });

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = tokio::process::Command::new(cargo);
    // Every crate; the dashboard's unit tests (its pure logic: graph layout, parsing of the
    // submit form) run natively.
    command
        .arg("test")
        .arg("--workspace")
        .args(&cargo_args)
        .env("DATABASE_URL", &url)
        .current_dir(workspace_root());
    browser.export(&mut command);
    sandbox.export(&mut command);
    schemathesis.export(&mut command);
    clients.export(&mut command);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(name);
        }
    }
    let status = run_counting(command).await;

    if let Database::Private(cluster) = &database {
        println!(
            "xtask: stopping the private PostgreSQL cluster in {}",
            cluster.data_dir.display()
        );
        if let Err(e) = cluster.stop().await {
            eprintln!("xtask: stopping the private cluster failed: {e}");
        }
    }

    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            let code = s.code().or(s.signal().map(|sig| 128 + sig)).unwrap_or(1);
            ExitCode::from(u8::try_from(code).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("xtask: cannot run cargo test: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn choose_database() -> Result<Database, String> {
    let forced = std::env::var_os("SKED_XTASK_FORCE_PRIVATE_PG").is_some_and(|v| v == "1");
    if forced {
        println!("xtask: SKED_XTASK_FORCE_PRIVATE_PG=1: using a private cluster");
    } else {
        if let Some(url) = std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()) {
            return Ok(Database::Given(url));
        }
        match probe_local().await {
            Ok(()) => return Ok(Database::Local),
            Err(why) => println!("xtask: no usable PostgreSQL at {LOCAL_URL} ({why})"),
        }
    }
    let bins = match PgBinaries::find(std::env::var_os("PATH").as_deref()) {
        Ok(bins) => bins,
        Err(e @ PgError::NotInstalled { .. }) => {
            install_postgres(&e)?;
            PgBinaries::find(std::env::var_os("PATH").as_deref()).map_err(|e| e.to_string())?
        }
        Err(e) => return Err(e.to_string()),
    };
    let dir = target_dir().join("sked-test-pg");
    println!(
        "xtask: starting a private PostgreSQL cluster in {} (server binaries in {})",
        dir.display(),
        bins.dir.display()
    );
    let cluster = Cluster::start(&bins, &dir)
        .await
        .map_err(|e| format!("starting the private PostgreSQL cluster: {e}"))?;
    Ok(Database::Private(cluster))
}

/// Succeeds when user `postgres` can log in to [`LOCAL_URL`] without a password.
async fn probe_local() -> Result<(), String> {
    let options: sqlx::postgres::PgConnectOptions =
        LOCAL_URL.parse().map_err(|e: sqlx::Error| e.to_string())?;
    let options = options.application_name("sked-xtask");
    match tokio::time::timeout(PROBE_TIMEOUT, options.connect()).await {
        Ok(Ok(conn)) => {
            conn.close().await.ok();
            Ok(())
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// Installs the PostgreSQL server with apt-get on Debian/Ubuntu as root when `CI` is set;
/// otherwise fails with instructions.
fn install_postgres(not_found: &PgError) -> Result<(), String> {
    let debian = Path::new("/etc/debian_version").exists();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    if !(debian && root && ci) {
        return Err(how_to_install(not_found, debian));
    }
    install::apt_install("the PostgreSQL server", &["postgresql"])
}

/// The message when no server answers and no server binaries are installed.
fn how_to_install(not_found: &PgError, debian: bool) -> String {
    let hint = if debian {
        "\n  On this machine: `sudo apt-get install -y postgresql` (as root with CI set, \
         `cargo xtask test` runs it itself)."
    } else {
        ""
    };
    format!("the tests need PostgreSQL, and none answers at {LOCAL_URL}.\n  {not_found}{hint}")
}

/// Removes the variables `cargo run` set for this process from a child's environment: build
/// scripts that read them (ring's reads CARGO_MANIFEST_DIR) would see a change and rebuild
/// every time.
fn clear_cargo_run_env(command: &mut std::process::Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(name);
        }
    }
}

/// True for the variables `cargo run` sets to describe the package it runs.
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
        )
}

/// The workspace root (the parent of this crate's folder).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (relative to the workspace root) or `target`.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => workspace_root().join(dir),
        None => workspace_root().join("target"),
    }
}

/// The URL with its password, if any, replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_missing_server_message_says_how_to_install_it() {
        let not_found = PgError::NotInstalled {
            searched: "/usr/lib/postgresql/*/bin".into(),
        };
        let text = how_to_install(&not_found, true);
        assert!(text.contains("apt-get install"), "{text}");
        assert!(text.contains("DATABASE_URL"), "{text}");
        assert!(text.contains("127.0.0.1:5432"), "{text}");
    }

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact("postgres://u:secret@h:5/db"),
            "postgres://u:***@h:5/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres:///db"), "postgres:///db");
    }
}

/// Runs `cargo test`, passing its output through, and prints one closing line with the
/// totals of every test binary's `test result:` line (`tests: N passed, M failed, K
/// ignored`), so the last word on the run is the whole suite, not its last binary.
async fn run_counting(
    mut command: tokio::process::Command,
) -> std::io::Result<std::process::ExitStatus> {
    use tokio::io::{AsyncBufReadExt, BufReader};
    command.stdout(std::process::Stdio::piped());
    let mut child = command.spawn()?;
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut totals = Totals::default();
    while let Some(line) = lines.next_line().await? {
        println!("{line}");
        totals.add(&line);
    }
    let status = child.wait().await?;
    println!(
        "tests: {} passed, {} failed, {} ignored",
        totals.passed, totals.failed, totals.ignored
    );
    Ok(status)
}

/// Sums of the `test result: ok. 3 passed; 0 failed; 1 ignored; …` lines.
#[derive(Debug, Default, PartialEq)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Totals {
    fn add(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(['.', ';']) {
            let mut words = part.split_whitespace();
            if let (Some(n), Some(what)) = (words.next(), words.next()) {
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => self.passed += n,
                    "failed" => self.failed += n,
                    "ignored" => self.ignored += n,
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod totals_tests {
    use super::Totals;

    #[test]
    fn result_lines_add_up() {
        let mut t = Totals::default();
        t.add("test result: ok. 51 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 22.37s");
        t.add("test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s");
        t.add("running 4 tests");
        assert_eq!(
            t,
            Totals {
                passed: 54,
                failed: 1,
                ignored: 2
            }
        );
    }
}
