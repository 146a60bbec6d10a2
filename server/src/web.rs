//! The dashboard's files (`web/`, built by `cargo xtask web`), embedded in the binary.
//!
//! Every `GET` outside `/api/` is answered here: a file of the bundle when one has that path,
//! else `index.html`, so that the dashboard's own paths (`/tasks/…`) load the app, which then
//! routes in the browser. Files are revalidated on each load (`no-cache` with an `ETag`), so
//! a new server version is picked up without stale scripts.

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use rust_embed::Embed;

use crate::Error;

#[derive(Embed)]
#[folder = "$SKED_WEB_DIST"]
struct Assets;

/// Whether this build embeds the real dashboard (not the placeholder page).
pub fn built() -> bool {
    Assets::get("sked-web.js").is_some()
}

pub async fn serve(method: Method, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    if path == "/api" || path.starts_with("/api/") {
        return Error::NotFound("no such endpoint".to_owned()).into_response();
    }
    if method != Method::GET && method != Method::HEAD {
        return Error::MethodNotAllowed.into_response();
    }
    let name = path.trim_start_matches('/');
    let (name, file) = match Assets::get(name) {
        Some(file) if !name.is_empty() => (name, file),
        _ => match Assets::get("index.html") {
            Some(file) => ("index.html", file),
            None => return StatusCode::NOT_FOUND.into_response(),
        },
    };
    let etag = format!("\"{}\"", hex(&file.metadata.sha256_hash()[..12]));
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mime = mime_for(name);
        (
            [(header::CONTENT_TYPE, HeaderValue::from_static(mime))],
            file.data.into_owned(),
        )
            .into_response()
    };
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

fn mime_for(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("json") => "application/json",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        _ => "application/octet-stream",
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
