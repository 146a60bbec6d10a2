//! The headless Chromium and chromedriver the dashboard's end-to-end tests drive.

use std::path::{Path, PathBuf};

use crate::install::on_path;

/// What the tests get in their environment: `SKED_CHROMIUM` and `SKED_CHROMEDRIVER`, or
/// `SKED_BROWSER_TESTS=skip`.
pub enum Browser {
    Found { chromium: PathBuf, driver: PathBuf },
    Skipped,
}

impl Browser {
    pub fn export(&self, command: &mut tokio::process::Command) {
        match self {
            Browser::Found { chromium, driver } => {
                println!(
                    "xtask: browser tests use {} with {}",
                    chromium.display(),
                    driver.display()
                );
                command
                    .env("SKED_CHROMIUM", chromium)
                    .env("SKED_CHROMEDRIVER", driver);
            }
            Browser::Skipped => {
                println!("xtask: SKED_BROWSER_TESTS=skip: the browser tests are left out");
                command.env("SKED_BROWSER_TESTS", "skip");
            }
        }
    }
}

const CHROMIUMS: [&str; 3] = ["chromium", "chromium-browser", "google-chrome"];
const DRIVERS: [&str; 1] = ["chromedriver"];

/// Finds the browser and its driver, installing the Debian packages when they are missing
/// and this is a CI run as root.
pub fn find_or_install() -> Result<Browser, String> {
    if std::env::var("SKED_BROWSER_TESTS").is_ok_and(|v| v == "skip") {
        return Ok(Browser::Skipped);
    }
    if let Some(found) = find() {
        return Ok(found);
    }
    let debian = Path::new("/etc/debian_version").exists();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    if !(debian && root && ci) {
        return Err(format!(
            "the dashboard's browser tests need Chromium and chromedriver on the PATH, and \
             none was found.\n  {}\n  Or set SKED_BROWSER_TESTS=skip to leave those tests out.",
            if debian {
                "On this machine: `sudo apt-get install -y chromium chromium-driver` (as root \
                 with CI set, `cargo xtask test` runs it itself)."
            } else {
                "Install Chromium (or Chrome) and the matching chromedriver."
            }
        ));
    }
    crate::install::apt_install("Chromium", &["chromium", "chromium-driver"])?;
    find().ok_or_else(|| "chromium and chromedriver are still not on the PATH".to_owned())
}

fn find() -> Option<Browser> {
    let chromium = CHROMIUMS.iter().find_map(|n| on_path(n))?;
    let driver = DRIVERS.iter().find_map(|n| on_path(n))?;
    Some(Browser::Found { chromium, driver })
}
