//! API errors: every failure leaves the server as an `ErrorBody` with the status of its code.
//!
//! Node, guest and database errors are mapped here, in one place, so a failure reads the
//! same whichever handler hit it. Internal details (SQL, file paths) are logged, not sent.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use space_core::{ErrorBody, ErrorCode, SandboxId};
use space_guest_client::GuestError;
use space_node_proto::NodeCallError;

use crate::db::DbError;

/// An error response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status (normally `body.code.http_status()`).
    pub status: StatusCode,
    /// What the client sees.
    pub body: ErrorBody,
    /// When to retry (`Retry-After`, whole seconds, at least 1), for `429`s.
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    /// An error whose status follows from its code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let status =
            StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self {
            status,
            body: ErrorBody::new(code, message),
            retry_after: None,
        }
    }

    /// 429 `rate_limited`, to be retried after `wait`.
    pub fn rate_limited(message: impl Into<String>, wait: std::time::Duration) -> Self {
        Self {
            retry_after: Some(wait),
            ..Self::new(ErrorCode::RateLimited, message)
        }
    }

    /// 400 `invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    /// 400 `invalid_path`.
    pub fn invalid_path(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidPath, message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    /// 404 for a sandbox that is missing, deleted or another tenant's (indistinguishable).
    pub fn sandbox_not_found(id: &SandboxId) -> Self {
        Self::not_found(format!("sandbox {id} not found"))
    }

    /// 404 for a snapshot that is missing or another tenant's (indistinguishable).
    pub fn snapshot_not_found(id: &space_core::SnapshotId) -> Self {
        Self::not_found(format!("snapshot {id} not found"))
    }

    /// 413 `payload_too_large`.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::PayloadTooLarge, message)
    }

    /// 401 `unauthenticated`.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthenticated, message)
    }

    /// 500 `internal`, with the detail logged rather than sent.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        Self::new(ErrorCode::Internal, "internal error (see the server log)")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.body.code;
        let mut response = if code == ErrorCode::PayloadTooLarge {
            // The rest of the body was not read: the connection cannot carry another
            // request, and a client that pooled it would fail its next call.
            (
                self.status,
                [(axum::http::header::CONNECTION, "close")],
                Json(self.body),
            )
                .into_response()
        } else {
            (self.status, Json(self.body)).into_response()
        };
        if let Some(wait) = self.retry_after {
            // Whole seconds (RFC 9110), rounded up: never "retry now" while still limited.
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.max(1).into());
        }
        // For the layers above (the action log records the code).
        response.extensions_mut().insert(code);
        response
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Invalid(m) => ApiError::invalid(m),
            DbError::NotFound(m) => ApiError::not_found(format!("{m} not found")),
            DbError::AlreadyExists(m) => {
                ApiError::new(ErrorCode::AlreadyExists, format!("{m} already exists"))
            }
            other => ApiError::internal(other),
        }
    }
}

impl From<NodeCallError> for ApiError {
    fn from(e: NodeCallError) -> Self {
        match e {
            NodeCallError::Internal { .. } => ApiError::internal(&e),
            NodeCallError::Unavailable {
                ref node,
                ref reason,
                ..
            } => {
                // The reason may name addresses and certificates: logged, not sent.
                tracing::warn!(node, reason, "node unavailable");
                ApiError::new(
                    ErrorCode::NodeUnavailable,
                    format!("the sandbox's node ({node}) cannot be reached now; retry later"),
                )
            }
            NodeCallError::Refused { body } => ApiError::new(body.code, body.message),
            other => ApiError::new(other.code(), other.to_string()),
        }
    }
}

impl From<GuestError> for ApiError {
    fn from(e: GuestError) -> Self {
        // The message came from (or through) the guest: bound and clean it.
        let body = e.to_error_body().sanitised();
        ApiError::new(body.code, body.message)
    }
}

impl From<crate::scheduler::NoPlacement> for ApiError {
    fn from(e: crate::scheduler::NoPlacement) -> Self {
        ApiError::new(e.code(), e.to_string())
    }
}

/// Handler result.
pub type ApiResult<T> = Result<T, ApiError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_follows_code() {
        assert_eq!(ApiError::invalid("x").status, StatusCode::BAD_REQUEST);
        assert_eq!(
            ApiError::new(ErrorCode::InsufficientCapacity, "x")
                .status
                .as_u16(),
            507
        );
        assert_eq!(
            ApiError::from(NodeCallError::TemplateNotFound {
                template: "t".into()
            })
            .body
            .message,
            "template 't' not found"
        );
    }

    #[test]
    fn internal_errors_hide_details() {
        let e = ApiError::from(DbError::Corrupt {
            table: "t",
            reason: "secret detail".into(),
        });
        assert_eq!(e.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!e.body.message.contains("secret"));
    }
}
