//! The thin clients' own test suites (`clients/python`, `clients/typescript`), which
//! `tests/it/clients.rs` runs against a real database and worker: this installs what they
//! need, as cargo fetches crates, when it is missing or out of date.
//!
//! - Python: a virtual environment in `<target dir>/clients-python` with the client installed
//!   editable and its test extra (`pip install -e 'clients/python[test]'`), whose interpreter
//!   the tests get as `SKED_CLIENT_PYTHON`.
//! - TypeScript: `npm ci` in `clients/typescript` (its `package-lock.json`), with the npm the
//!   tests get as `SKED_CLIENT_NPM`.
//!
//! `SKED_CLIENT_TESTS=skip` leaves both out.

use std::path::{Path, PathBuf};
use std::process::Command;

pub enum Clients {
    Found { python: PathBuf, npm: PathBuf },
    Skipped,
}

impl Clients {
    pub fn export(&self, command: &mut tokio::process::Command) {
        match self {
            Clients::Found { python, npm } => {
                println!(
                    "xtask: the clients' tests use {} and {}",
                    python.display(),
                    npm.display()
                );
                command
                    .env("SKED_CLIENT_PYTHON", python)
                    .env("SKED_CLIENT_NPM", npm);
            }
            Clients::Skipped => {
                println!("xtask: SKED_CLIENT_TESTS=skip: the clients' tests are left out");
                command.env("SKED_CLIENT_TESTS", "skip");
            }
        }
    }
}

/// Makes both clients' test environments ready.
pub fn find_or_install(workspace: &Path, target_dir: &Path) -> Result<Clients, String> {
    if std::env::var("SKED_CLIENT_TESTS").is_ok_and(|v| v == "skip") {
        return Ok(Clients::Skipped);
    }
    let python = python(workspace, target_dir)?;
    let npm = typescript(workspace)?;
    Ok(Clients::Found { python, npm })
}

fn python(workspace: &Path, target_dir: &Path) -> Result<PathBuf, String> {
    let client = workspace.join("clients").join("python");
    let venv = target_dir.join("clients-python");
    let interpreter = venv.join("bin").join("python");
    // Installed by this, from this pyproject.toml: the stamp is a copy of it.
    let stamp = venv.join("sked-client.pyproject.toml");
    let project = std::fs::read(client.join("pyproject.toml"))
        .map_err(|e| format!("reading clients/python/pyproject.toml: {e}"))?;
    if interpreter.is_file() && std::fs::read(&stamp).is_ok_and(|s| s == project) {
        return Ok(interpreter);
    }
    println!(
        "xtask: installing the Python client and its test tools into {}",
        venv.display()
    );
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        "python3 -m venv (on Debian: apt-get install python3-venv)",
    )?;
    run(
        Command::new(venv.join("bin").join("pip"))
            .args(["install", "--quiet", "--editable"])
            .arg(format!("{}[test]", client.display())),
        "pip install -e clients/python[test]",
    )?;
    std::fs::write(&stamp, project).map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(interpreter)
}

fn typescript(workspace: &Path) -> Result<PathBuf, String> {
    let client = workspace.join("clients").join("typescript");
    let npm = crate::install::on_path("npm").ok_or_else(|| {
        "the TypeScript client's tests need Node.js 20 or later with npm (on Debian: apt-get \
         install nodejs npm), or set SKED_CLIENT_TESTS=skip to leave the clients' tests out"
            .to_owned()
    })?;
    // `npm ci` leaves a copy of the lock file it installed in node_modules.
    let lock = std::fs::read(client.join("package-lock.json"))
        .map_err(|e| format!("reading clients/typescript/package-lock.json: {e}"))?;
    let installed = client.join("node_modules").join(".package-lock.json");
    let current = std::fs::read(&installed).is_ok_and(|copy| same_packages(&copy, &lock));
    if !current {
        println!("xtask: installing the TypeScript client's packages (npm ci)");
        run(
            Command::new(&npm)
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(&client),
            "npm ci in clients/typescript",
        )?;
    }
    Ok(npm)
}

/// Whether the lock file npm keeps in node_modules names the packages of `lock`: the
/// `packages` entries but the root one, which it leaves out.
fn same_packages(installed: &[u8], lock: &[u8]) -> bool {
    let parse = |bytes: &[u8]| serde_json::from_slice::<serde_json::Value>(bytes).ok();
    let (Some(installed), Some(lock)) = (parse(installed), parse(lock)) else {
        return false;
    };
    let packages = |v: &serde_json::Value| {
        v["packages"].as_object().map(|m| {
            m.iter()
                .filter(|(name, _)| !name.is_empty())
                .map(|(name, p)| (name.clone(), p["version"].clone()))
                .collect::<Vec<_>>()
        })
    };
    packages(&installed).is_some() && packages(&installed) == packages(&lock)
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let status = command
        .status()
        .map_err(|e| format!("running {what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}
