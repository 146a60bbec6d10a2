//! Extractors whose failures are API errors: the caller's token, and JSON bodies, query
//! strings and path segments that reject with a JSON body instead of axum's plain text.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use sked_db::token::Principal;

use crate::AppState;
use crate::error::Error;

/// The principal of the request's `Authorization: Bearer <token>`.
#[derive(Debug, Clone)]
pub struct Auth(pub Principal);

impl FromRequestParts<AppState> for Auth {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or(Error::Unauthorized(
                "missing Authorization header (expected `Bearer <token>`)".into(),
            ))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| !token.is_empty())
            .ok_or(Error::Unauthorized(
                "malformed Authorization header (expected `Bearer <token>`)".into(),
            ))?;
        match sked_db::token::check(&state.pool, token).await? {
            Ok(principal) => Ok(Auth(principal)),
            Err(refusal) => Err(Error::Unauthorized(refusal.message().into())),
        }
    }
}

/// A JSON body; malformed JSON and unknown fields are `invalid_request`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json<T>(pub T);

impl<T, S> FromRequest<S> for Json<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request(req: Request, state: &S) -> Result<Self, Error> {
        let axum::Json(value) = axum::Json::<T>::from_request(req, state).await?;
        Ok(Json(value))
    }
}

/// A query string; unparseable values are `invalid_request`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Query<T>(pub T);

impl<T, S> FromRequestParts<S> for Query<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Query(value))
    }
}

/// Path parameters; a malformed id is `invalid_request`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Error> {
        let axum::extract::Path(value) =
            axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(Path(value))
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
