//! `cargo xtask web`: builds the dashboard (`web/`) into `web/dist`, which `sked-server`
//! embeds (see `server/build.rs`).
//!
//! 1. adds the `wasm32-unknown-unknown` target with rustup when it is missing;
//! 2. `cargo build -p sked-web --target wasm32-unknown-unknown --profile web`;
//! 3. turns the `.wasm` into an ES module and its glue with the wasm-bindgen library (no tool
//!    is downloaded), next to `web/index.html` and `web/style.css`;
//! 4. replaces `web/dist` only when a file changed, so an unchanged dashboard does not make
//!    cargo rebuild the server.

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";
/// The cargo profile of `cargo xtask web`; `--dev` uses cargo's `dev` profile instead
/// (incremental, unoptimized, several MB: quicker while changing the dashboard).
const PROFILE: &str = "web";
/// The files of `web/` copied into the bundle as they are.
const STATIC_FILES: [&str; 2] = ["index.html", "style.css"];

pub fn build(root: &Path, target_dir: &Path, dev: bool) -> Result<(), String> {
    ensure_target()?;
    let profile = if dev { "dev" } else { PROFILE };
    println!(
        "xtask: building the dashboard (cargo build -p sked-web --target {TARGET} --profile {profile})"
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "-p",
            "sked-web",
            "--target",
            TARGET,
            "--profile",
            profile,
        ])
        .current_dir(root);
    crate::clear_cargo_run_env(&mut command);
    let status = command
        .status()
        .map_err(|e| format!("running cargo build for the dashboard: {e}"))?;
    if !status.success() {
        return Err(format!("building the dashboard failed ({status})"));
    }

    let out_dir = if dev { "debug" } else { PROFILE };
    let wasm = target_dir.join(TARGET).join(out_dir).join("sked-web.wasm");
    let web = root.join("web");
    let staging = web.join("dist.new");
    let dist = web.join("dist");
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| format!("removing {staging:?}: {e}"))?;
    }
    let mut bindgen = wasm_bindgen_cli_support::Bindgen::new();
    bindgen
        .input_path(&wasm)
        .web(true)
        .map_err(|e| format!("wasm-bindgen: {e}"))?
        // Without the default module path the generated `init()` cannot find the .wasm.
        .omit_default_module_path(false)
        .typescript(false)
        // Function names are for debuggers; the shipped module leaves them out.
        .remove_name_section(true)
        .remove_producers_section(true)
        .generate(&staging)
        .map_err(|e| format!("wasm-bindgen on {}: {e}", wasm.display()))?;
    for name in STATIC_FILES {
        std::fs::copy(web.join(name), staging.join(name))
            .map_err(|e| format!("copying web/{name}: {e}"))?;
    }
    if same_files(&staging, &dist) {
        std::fs::remove_dir_all(&staging).map_err(|e| format!("removing {staging:?}: {e}"))?;
        println!("xtask: the dashboard in web/dist is up to date");
        return Ok(());
    }
    if dist.exists() {
        std::fs::remove_dir_all(&dist).map_err(|e| format!("removing {dist:?}: {e}"))?;
    }
    std::fs::rename(&staging, &dist).map_err(|e| format!("renaming {staging:?}: {e}"))?;
    let size: u64 = files(&dist)
        .iter()
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "xtask: the dashboard is in web/dist ({} KiB); sked-server embeds it when built",
        size / 1024
    );
    Ok(())
}

/// Adds the wasm target with rustup when the toolchain lacks it.
fn ensure_target() -> Result<(), String> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map_err(|e| format!("the dashboard needs rustup to add the {TARGET} target: {e}"))?;
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == TARGET)
    {
        return Ok(());
    }
    println!("xtask: rustup target add {TARGET}");
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .map_err(|e| format!("running rustup: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`rustup target add {TARGET}` failed ({status})"))
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// True when both folders hold the same file names with the same contents.
fn same_files(a: &Path, b: &Path) -> bool {
    let (fa, fb) = (files(a), files(b));
    fa.len() == fb.len()
        && fa.iter().zip(&fb).all(|(x, y)| {
            x.file_name() == y.file_name()
                && matches!((std::fs::read(x), std::fs::read(y)), (Ok(p), Ok(q)) if p == q)
        })
}
