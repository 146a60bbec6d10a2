//! Extractors whose failures are API errors: the caller's token, and JSON bodies, query
//! strings and path segments that reject with a JSON body instead of axum's plain text, and
//! refuse U+0000, which PostgreSQL cannot store.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{Uri, header};
use serde::de::DeserializeOwned;
use sked_db::task_token;
use sked_db::token::Principal;

use crate::AppState;
use crate::error::Error;

/// The principal of the request's `Authorization: Bearer <token>`. A task token (`skt_…`,
/// what a worker gives a running task) is refused here, before any lookup of API tokens: it
/// may only spawn ([`TaskAuth`]).
#[derive(Debug, Clone)]
pub struct Auth(pub Principal);

impl FromRequestParts<AppState> for Auth {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let token = bearer(parts)?;
        if task_token::is_task_token(token) {
            return Err(Error::Forbidden(TASK_TOKEN_ONLY_SPAWNS.to_owned()));
        }
        match sked_db::token::check(&state.pool, token).await? {
            Ok(principal) => Ok(Auth(principal)),
            Err(refusal) => Err(Error::Unauthorized(refusal.message().into())),
        }
    }
}

/// What a task token is told on any route but the spawn.
pub(crate) const TASK_TOKEN_ONLY_SPAWNS: &str = "a task token (the SKED_TOKEN a worker gives a running task) may only spawn work into its \
     own task's workflow: POST /api/v1/tasks/{its task id}/spawn (`sked spawn`); every other \
     request needs an API token";

/// The attempt of the request's task token (`Authorization: Bearer skt_…`), its MAC checked
/// under the cluster's key (`sked_db::task_token`). Whether that attempt still runs is for the
/// database to say, in the transaction that acts on it. An API token is refused (403): only a
/// task may act with its token.
#[derive(Debug, Clone, Copy)]
pub struct TaskAuth(pub task_token::TaskToken);

impl FromRequestParts<AppState> for TaskAuth {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let token = bearer(parts)?;
        if !task_token::is_task_token(token) {
            return Err(Error::Forbidden(
                "only a task token may spawn: the SKED_TOKEN a worker started with --api-url \
                 gives a running task (`sked spawn` in the task reads it); API tokens submit \
                 workflows with POST /api/v1/workflows"
                    .to_owned(),
            ));
        }
        let key = task_token::load(sked_db::on(&state.pool)).await?;
        key.verify(token)
            .map(TaskAuth)
            .map_err(|refusal| Error::Unauthorized(refusal.message().into()))
    }
}

/// The token of `Authorization: Bearer <token>`.
fn bearer(parts: &Parts) -> Result<&str, Error> {
    let value = parts
        .headers
        .get(header::AUTHORIZATION)
        .ok_or(Error::Unauthorized(
            "missing Authorization header (expected `Bearer <token>`)".into(),
        ))?;
    value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
        .ok_or(Error::Unauthorized(
            "malformed Authorization header (expected `Bearer <token>`)".into(),
        ))
}

/// A JSON body; malformed JSON, unknown fields, and an array where an object is expected
/// (at any depth: see [`sked_types::strict`]) are `invalid_request`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let axum::Json(value) = axum::Json::<serde_json::Value>::from_request(req, state).await?;
        if holds_nul(&value) {
            return Err(nul_refused("strings of the body"));
        }
        sked_types::strict::from_value(value)
            .map(Json)
            .map_err(|e| {
                Error::InvalidRequest(format!(
                    "Failed to deserialize the JSON body into the target type: {e}"
                ))
            })
    }
}

/// Declares an extractor of the request's parts that refuses U+0000 (`%00`) in its part of
/// the URI, then reads that part as axum's extractor of the same name does, its rejections
/// turned into API errors.
macro_rules! nul_free_parts {
    ($(#[$meta:meta])* $name:ident, $part:expr, $what:literal) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $name<T>(pub T);

        impl<T, S> FromRequestParts<S> for $name<T>
        where
            T: DeserializeOwned + Send,
            S: Send + Sync,
        {
            type Rejection = Error;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
                let part: fn(&Uri) -> Option<&str> = $part;
                if part(&parts.uri).is_some_and(|p| p.contains("%00")) {
                    return Err(nul_refused($what));
                }
                let axum::extract::$name(value) =
                    axum::extract::$name::<T>::from_request_parts(parts, state).await?;
                Ok($name(value))
            }
        }
    };
}

nul_free_parts!(
    /// A query string; unparseable values are `invalid_request`.
    Query,
    Uri::query,
    "query parameters"
);

nul_free_parts!(
    /// Path parameters; a malformed id is `invalid_request`.
    Path,
    |uri| Some(uri.path()),
    "path segments"
);

/// PostgreSQL's text and jsonb cannot hold U+0000, so no request may: bodies, query strings
/// and paths holding it are refused here, before any handler (the OpenAPI document says so
/// of every free string).
fn nul_refused(what: &str) -> Error {
    Error::InvalidRequest(format!(
        "{what} must not contain the NUL character (U+0000)"
    ))
}

/// Whether a string or a key of `value`, at any depth, holds U+0000.
fn holds_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(holds_nul),
        serde_json::Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

/// Refuses a user token that names another owner for what it asks (`"submit tasks"`, …); an
/// admin may act for anyone, and no owner named means the token's own.
pub(crate) fn may_act_for(
    principal: &Principal,
    owner: Option<&str>,
    what: &str,
) -> Result<(), Error> {
    match owner {
        Some(owner) if !principal.may_access(owner) => Err(Error::Forbidden(format!(
            "a user token may {what} for its own owner {:?} only",
            principal.owner
        ))),
        _ => Ok(()),
    }
}

/// The owner a listing of `what` (`"tasks"`, …) is limited to: the one asked for (a user token
/// may name only its own), else the token's own, or none (all) for an admin.
pub(crate) fn listing_owner(
    principal: &Principal,
    asked: Option<String>,
    what: &str,
) -> Result<Option<String>, Error> {
    match asked.filter(|o| !o.is_empty()) {
        Some(owner) if !principal.may_access(&owner) => Err(Error::Forbidden(format!(
            "a user token may list the {what} of its own owner {:?} only",
            principal.owner
        ))),
        Some(owner) => Ok(Some(owner)),
        None if principal.is_admin() => Ok(None),
        None => Ok(Some(principal.owner.clone())),
    }
}
