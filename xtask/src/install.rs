//! What the test tools need from the machine: finding a program on the PATH, and installing
//! Debian packages (only as root with CI set; the callers decide).

use std::path::PathBuf;

/// The first file named `name` in a directory of the PATH.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// `apt-get update`, then `apt-get install` of `packages`, saying first that `what` is
/// missing.
pub(crate) fn apt_install(what: &str, packages: &[&str]) -> Result<(), String> {
    println!(
        "xtask: CI is set and {what} is missing: apt-get install -y {}",
        packages.join(" ")
    );
    let install: Vec<&str> = ["install", "-y", "-qq"]
        .into_iter()
        .chain(packages.iter().copied())
        .collect();
    for args in [&["update", "-qq"][..], &install[..]] {
        let status = std::process::Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("running apt-get: {e}"))?;
        if !status.success() {
            return Err(format!("`apt-get {}` failed ({status})", args.join(" ")));
        }
    }
    Ok(())
}
