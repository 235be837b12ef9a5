//! Authentication: `Authorization: Bearer <api key>` on every `/v1` request.
//!
//! The middleware resolves the key to its tenant and stores it in the request; handlers take
//! [`Caller`] to scope everything they touch. Keys are never logged.

use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;

use super::error::ApiError;
use super::AppState;
use crate::service::Caller;

/// Middleware: 401 unless the request carries a valid, unrevoked key.
pub async fn require_api_key(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let key = bearer_token(
        req.headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
    .ok_or_else(|| {
        ApiError::unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
    })?;
    let (tenant, key_id) = state
        .db
        .authenticate_key(key)
        .await?
        .ok_or_else(|| ApiError::unauthenticated("unknown or revoked API key"))?;
    req.extensions_mut().insert(Caller {
        id: tenant.id,
        name: tenant.name,
        key_id,
    });
    Ok(next.run(req).await)
}

/// The token of a `Bearer` authorization header.
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let header = header?.trim();
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        // Only missing if a route escaped the middleware: refuse rather than serve unscoped.
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| ApiError::unauthenticated("missing API key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_bearer_headers() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(None), None);
    }
}
