//! The E2B control API's authentication: `X-API-Key: <key>` (what both SDKs send, with no
//! prefix), or SPACE's own `Authorization: Bearer <key>`. The key is checked against the
//! same hashed key table as `/v1`, and the caller's tenant is put into the request as
//! SPACE's [`Caller`], so every handler and the idempotency middleware are scoped by it.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use space_control::api::auth::bearer_token;
use space_control::service::Caller;

use super::error::RestError;
use crate::state::E2bState;

/// The header the E2B SDKs carry the API key in.
pub const API_KEY_HEADER: &str = "x-api-key";

/// The API key a request carries: `X-API-Key`, else `Authorization: Bearer`.
pub fn api_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(API_KEY_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .or_else(|| bearer_token(headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok())))
}

/// Middleware: 401 unless the request carries a valid, unrevoked key.
pub async fn require_api_key(
    State(st): State<E2bState>,
    mut req: Request,
    next: Next,
) -> Result<Response, RestError> {
    let key = api_key(req.headers())
        .ok_or_else(|| RestError::unauthenticated("missing API key: send 'X-API-Key: <key>'"))?;
    let (tenant, key_id) = st
        .app
        .db
        .authenticate_key(key)
        .await
        .map_err(|e| RestError::from(space_control::api::error::ApiError::from(e)))?
        .ok_or_else(|| RestError::unauthenticated("unknown or revoked API key"))?;
    req.extensions_mut().insert(Caller {
        id: tenant.id,
        name: tenant.name,
        key_id,
    });
    Ok(next.run(req).await)
}
