//! Calls to the REST API (`/api/v1`) with the signed-in token.
//!
//! The token lives in `localStorage` (`sked.token`) so that a reload keeps the session; signing
//! out removes it. Every error of the API has a JSON body `{code, message}`; [`ApiError`]
//! keeps it, and a 401 signs the user out.

use leptos::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

const TOKEN_KEY: &str = "sked.token";

/// An error from the API, or from the network.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status, 0 when the request did not reach the server.
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl ApiError {
    fn network(e: impl std::fmt::Display) -> Self {
        ApiError {
            status: 0,
            code: "network".into(),
            message: format!("the server cannot be reached ({e})"),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

fn storage() -> Option<web_sys::Storage> {
    web_sys::window()?.local_storage().ok()?
}

pub fn stored_token() -> Option<String> {
    storage()?
        .get_item(TOKEN_KEY)
        .ok()?
        .filter(|t| !t.is_empty())
}

pub fn store_token(token: Option<&str>) {
    if let Some(s) = storage() {
        let _ = match token {
            Some(t) => s.set_item(TOKEN_KEY, t),
            None => s.remove_item(TOKEN_KEY),
        };
    }
}

/// The signed-in session, provided as context by the app: `None` until signed in.
#[derive(Clone, Copy)]
pub struct Session {
    pub token: RwSignal<Option<String>>,
    pub me: RwSignal<Option<sked_types::Me>>,
}

impl Session {
    pub fn is_admin(&self) -> bool {
        self.me
            .with_untracked(|m| m.as_ref().is_some_and(|m| m.role == "admin"))
    }

    pub fn sign_out(&self) {
        store_token(None);
        self.token.set(None);
        self.me.set(None);
    }
}

pub fn session() -> Session {
    expect_context::<Session>()
}

thread_local! {
    /// The app's session, for calls made where no reactive owner is current (the body of a
    /// `spawn_local` future), where `use_context` finds nothing.
    static SESSION: std::cell::Cell<Option<Session>> = const { std::cell::Cell::new(None) };
}

/// Makes `session` the one API calls use wherever they run; the app calls it once.
pub fn set_session(session: Session) {
    SESSION.with(|s| s.set(Some(session)));
}

fn current_session() -> Option<Session> {
    use_context::<Session>().or_else(|| SESSION.with(std::cell::Cell::get))
}

fn token() -> Option<String> {
    current_session()
        .and_then(|s| s.token.try_get_untracked().flatten())
        .or_else(stored_token)
}

async fn send<T: DeserializeOwned>(request: gloo_net::http::Request) -> ApiResult<T> {
    let response = request.send().await.map_err(ApiError::network)?;
    let status = response.status();
    if (200..300).contains(&status) {
        return response.json::<T>().await.map_err(|e| ApiError {
            status,
            code: "decode".into(),
            message: format!("unexpected answer from the server: {e}"),
        });
    }
    let body: Option<sked_types::ApiError> = response.json().await.ok();
    let (code, message) = match body {
        Some(b) => (b.code, b.message),
        None => ("http".into(), format!("the server answered {status}")),
    };
    if status == 401
        && let Some(s) = current_session()
    {
        s.sign_out();
    }
    Err(ApiError {
        status,
        code,
        message,
    })
}

fn with_auth(
    builder: gloo_net::http::RequestBuilder,
    token: Option<&str>,
) -> gloo_net::http::RequestBuilder {
    match token {
        Some(t) => builder.header("Authorization", &format!("Bearer {t}")),
        None => builder,
    }
}

/// A request to `/api/v1{path}` with the signed-in token; `method` is `Request::get`,
/// `Request::post`…
fn request(
    method: fn(&str) -> gloo_net::http::RequestBuilder,
    path: &str,
) -> gloo_net::http::RequestBuilder {
    with_auth(method(&format!("/api/v1{path}")), token().as_deref())
}

/// `GET /api/v1{path}` (path includes any query string).
pub async fn get<T: DeserializeOwned>(path: &str) -> ApiResult<T> {
    let request = request(gloo_net::http::Request::get, path)
        .build()
        .map_err(ApiError::network)?;
    send(request).await
}

/// `GET /api/v1/me` with a token that is not signed in yet.
pub async fn me_with(token: &str) -> ApiResult<sked_types::Me> {
    let request = with_auth(gloo_net::http::Request::get("/api/v1/me"), Some(token))
        .build()
        .map_err(ApiError::network)?;
    send(request).await
}

/// `POST /api/v1{path}` with a JSON body.
pub async fn post<B: Serialize, T: DeserializeOwned>(path: &str, body: &B) -> ApiResult<T> {
    let request = request(gloo_net::http::Request::post, path)
        .json(body)
        .map_err(ApiError::network)?;
    send(request).await
}

/// `PATCH /api/v1{path}` with a JSON body.
pub async fn patch<B: Serialize, T: DeserializeOwned>(path: &str, body: &B) -> ApiResult<T> {
    let request = request(gloo_net::http::Request::patch, path)
        .json(body)
        .map_err(ApiError::network)?;
    send(request).await
}

/// `POST /api/v1{path}` without a body.
pub async fn post_empty<T: DeserializeOwned>(path: &str) -> ApiResult<T> {
    post(path, &serde_json::json!({})).await
}

/// `DELETE /api/v1{path}`.
pub async fn delete<T: DeserializeOwned>(path: &str) -> ApiResult<T> {
    let request = request(gloo_net::http::Request::delete, path)
        .build()
        .map_err(ApiError::network)?;
    send(request).await
}

/// `encodeURIComponent`.
pub fn enc(s: &str) -> String {
    String::from(js_sys::encode_uri_component(s))
}
