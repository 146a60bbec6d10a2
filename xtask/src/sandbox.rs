//! Bubblewrap (`bwrap`), the sandbox the worker's sandbox-wrapper tests run tasks through.

use std::path::{Path, PathBuf};

use crate::install::on_path;

/// What the tests get in their environment: `SKED_BWRAP`, or `SKED_SANDBOX_TESTS=skip` with
/// the reason printed.
pub enum Sandbox {
    Found(PathBuf),
    Skipped(String),
}

impl Sandbox {
    pub fn export(&self, command: &mut tokio::process::Command) {
        match self {
            Sandbox::Found(bwrap) => {
                println!("xtask: sandbox tests use {}", bwrap.display());
                command.env("SKED_BWRAP", bwrap);
            }
            Sandbox::Skipped(reason) => {
                println!("xtask: the sandbox tests are left out: {reason}");
                command.env("SKED_SANDBOX_TESTS", "skip");
            }
        }
    }
}

/// Finds `bwrap`, installing the Debian package when it is missing and this is a CI run as
/// root (as for Chromium); skips the sandbox tests, saying why, when it cannot have one that
/// works.
pub fn find_or_install() -> Sandbox {
    if std::env::var("SKED_SANDBOX_TESTS").is_ok_and(|v| v == "skip") {
        return Sandbox::Skipped("SKED_SANDBOX_TESTS=skip".to_owned());
    }
    let bwrap = match on_path("bwrap") {
        Some(found) => found,
        None => match install() {
            Ok(found) => found,
            Err(reason) => return Sandbox::Skipped(reason),
        },
    };
    // User namespaces may be disabled (or a container may forbid them): try it once, as the
    // tests' worker runs it: as `nobody` when this runs as root.
    let mut check = std::process::Command::new(&bwrap);
    check
        .args(["--ro-bind", "/", "/", "--unshare-all", "true"])
        .stderr(std::process::Stdio::piped());
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::process::CommandExt;
        check.uid(65534).gid(65534);
    }
    let works = check.output();
    match works {
        Ok(out) if out.status.success() => Sandbox::Found(bwrap),
        Ok(out) => Sandbox::Skipped(format!(
            "{} cannot make a sandbox here ({}): {}",
            bwrap.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Sandbox::Skipped(format!("running {}: {e}", bwrap.display())),
    }
}

fn install() -> Result<PathBuf, String> {
    let debian = Path::new("/etc/debian_version").exists();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    if !(debian && root && ci) {
        return Err(format!(
            "bubblewrap (`bwrap`) is not on the PATH; {}",
            if debian {
                "`sudo apt-get install -y bubblewrap` (as root with CI set, `cargo xtask test` \
                 runs it itself)"
            } else {
                "install bubblewrap to run them"
            }
        ));
    }
    crate::install::apt_install("bwrap", &["bubblewrap"])?;
    on_path("bwrap").ok_or_else(|| "bwrap is still not on the PATH after installing".to_owned())
}
