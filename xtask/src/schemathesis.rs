//! Schemathesis, which the OpenAPI contract test (`tests/it/openapi_contract.rs`) runs
//! against the API.

use std::path::{Path, PathBuf};

/// The version installed when it is missing: the one the contract test is known to pass with.
pub const VERSION: &str = "4.32.5";

/// What the tests get in their environment: `SKED_SCHEMATHESIS`, or
/// `SKED_SCHEMATHESIS_TESTS=skip`.
pub enum Schemathesis {
    Found(PathBuf),
    Skipped,
}

impl Schemathesis {
    pub fn export(&self, command: &mut tokio::process::Command) {
        match self {
            Schemathesis::Found(program) => {
                println!(
                    "xtask: the OpenAPI contract test uses {}",
                    program.display()
                );
                command.env("SKED_SCHEMATHESIS", program);
            }
            Schemathesis::Skipped => {
                println!(
                    "xtask: SKED_SCHEMATHESIS_TESTS=skip: the OpenAPI contract test is left out"
                );
                command.env("SKED_SCHEMATHESIS_TESTS", "skip");
            }
        }
    }
}

/// Finds `schemathesis`: in the virtual environment under `target_dir` that this installs,
/// else on the PATH. When it is missing and CI is set, installs [`VERSION`] into that
/// environment (`python3 -m venv`, then pip).
pub fn find_or_install(target_dir: &Path) -> Result<Schemathesis, String> {
    if std::env::var("SKED_SCHEMATHESIS_TESTS").is_ok_and(|v| v == "skip") {
        return Ok(Schemathesis::Skipped);
    }
    let venv = target_dir.join("schemathesis");
    let installed = venv.join("bin").join("schemathesis");
    if let Some(found) = installed
        .is_file()
        .then(|| installed.clone())
        .or_else(|| crate::install::on_path("schemathesis"))
    {
        return Ok(Schemathesis::Found(found));
    }
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    if !ci {
        return Err(format!(
            "the OpenAPI contract test needs Schemathesis, and none was found.\n  \
             `python3 -m pip install schemathesis=={VERSION}` (with CI set, `cargo xtask test` \
             installs it itself into {}).\n  Or set SKED_SCHEMATHESIS_TESTS=skip to leave that \
             test out.",
            venv.display()
        ));
    }
    println!(
        "xtask: CI is set and schemathesis is missing: installing schemathesis=={VERSION} into {}",
        venv.display()
    );
    run(
        "python3",
        &["-m", "venv", &venv.display().to_string()],
        "python3 -m venv (on Debian: apt-get install python3-venv)",
    )?;
    let pip = venv.join("bin").join("pip");
    run(
        &pip.display().to_string(),
        &["install", "--quiet", &format!("schemathesis=={VERSION}")],
        "pip install schemathesis",
    )?;
    if installed.is_file() {
        Ok(Schemathesis::Found(installed))
    } else {
        Err(format!(
            "{} is missing after installing",
            installed.display()
        ))
    }
}

fn run(program: &str, args: &[&str], what: &str) -> Result<(), String> {
    let status = std::process::Command::new(program)
        .args(args)
        .status()
        .map_err(|e| format!("running {what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}
