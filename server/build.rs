//! Points the embedded dashboard (`src/web.rs`) at its files: `web/dist`, written by
//! `cargo xtask web`, or, when the dashboard has not been built, a page that says how to build
//! it, so that a plain `cargo build` always works.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let web = manifest.parent().unwrap().join("web");
    let dist = web.join("dist");
    // `web/dist` is replaced as a whole by `cargo xtask web`; watching `web/` notices both
    // its creation and its replacement.
    println!("cargo:rerun-if-changed={}", web.display());
    if dist.is_dir() {
        println!("cargo:rerun-if-changed={}", dist.display());
    }
    let dir = if dist.join("index.html").is_file() {
        dist
    } else {
        let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join("web-placeholder");
        write_placeholder(&out);
        out
    };
    println!("cargo:rustc-env=SKED_WEB_DIST={}", dir.display());
}

fn write_placeholder(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("index.html"),
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"color-scheme\" content=\"light dark\"><title>sked</title></head>\n\
         <body><h1>sked</h1><p>This server was built without its dashboard. Build it with \
         <code>cargo xtask web</code> and build the server again (<code>cargo xtask dev</code> \
         does both). The REST API is at <a href=\"/api/v1/openapi.json\">/api/v1</a>.</p>\
         </body></html>\n",
    )
    .unwrap();
}
