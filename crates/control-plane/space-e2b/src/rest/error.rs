//! Errors of the E2B REST API: `{"code": <HTTP status>, "message": "…"}` with that status.
//!
//! The handlers call SPACE's own functions and return its [`ApiError`]s; every response
//! of the REST router passes through [`e2b_error_bodies`], which rewrites a SPACE error body
//! (a *string* `code`) into E2B's (an integer: the JS SDK reads `code` from the body, not the
//! status), so one mapping covers handlers, extractors and middleware alike.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use space_control::api::error::ApiError;
use space_core::ErrorBody;

use super::E2bError;

/// Largest error body the rewriter reads (SPACE's are a few hundred bytes).
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Seconds a client is told to wait before retrying a request the node had no room for.
const RETRY_AFTER_SECS: &str = "1";
/// Header that tells the SDKs whether a retry could help (they retry 429/502/503/504 by
/// default).
const SHOULD_RETRY: &str = "should-retry";

/// An E2B error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestError(pub E2bError);

impl RestError {
    /// `status` with `message`.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        RestError(E2bError {
            code: status,
            message: message.into(),
        })
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, message)
    }

    /// 401.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(401, message)
    }
}

impl From<ApiError> for RestError {
    fn from(e: ApiError) -> Self {
        RestError(E2bError::from_native(e.body.code, e.body.message))
    }
}

impl IntoResponse for RestError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, Json(self.0)).into_response();
        let headers = response.headers_mut();
        match status {
            // Capacity comes back: the SDKs retry with a pause.
            StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
            }
            StatusCode::TOO_MANY_REQUESTS => {}
            // A failed create or a broken sandbox is not cured by sending the same request.
            _ => {
                headers.insert(SHOULD_RETRY, HeaderValue::from_static("false"));
            }
        }
        response
    }
}

/// Handler result.
pub type RestResult<T> = Result<T, RestError>;

/// Middleware: turns SPACE error bodies into E2B ones (see the module docs). Other
/// responses pass untouched, streams included.
pub async fn e2b_error_bodies(req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"));
    if response.status().as_u16() < 400 || !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BODY).await else {
        return RestError::new(500, "internal error (see the server log)").into_response();
    };
    match serde_json::from_slice::<ErrorBody>(&bytes) {
        Ok(native) => {
            let mut rewritten =
                RestError(E2bError::from_native(native.code, native.message)).into_response();
            // Keep what the native layer decided about the connection (a 413 closes it).
            for name in [
                axum::http::header::CONNECTION,
                axum::http::header::RETRY_AFTER,
            ] {
                if let Some(v) = parts.headers.remove(&name) {
                    rewritten.headers_mut().insert(name, v);
                }
            }
            rewritten
        }
        Err(_) => {
            parts.headers.remove(CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_core::ErrorCode;

    #[test]
    fn native_errors_become_e2b_statuses() {
        let e = RestError::from(ApiError::new(ErrorCode::InsufficientCapacity, "full"));
        assert_eq!(e.0.code, 503);
        let r = e.into_response();
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()[RETRY_AFTER], RETRY_AFTER_SECS);
        let r = RestError::not_found("x").into_response();
        assert_eq!(r.headers()[SHOULD_RETRY], "false");
    }
}
