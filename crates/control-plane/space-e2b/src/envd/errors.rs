//! SPACE's errors as envd's: Connect codes for the RPCs, `{"code": <status>, "message"}`
//! bodies for `/files` and `/health`, and the proxy-style 502 for a sandbox that is not
//! there. The SDKs read a few messages: "was not found" means the sandbox is not running,
//! "port is not open" that nothing listens (`docs/e2b-compat.md`, section 3.2).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use space_control::api::error::ApiError;
use space_core::ErrorCode;

use super::access::AccessError;
use crate::connect::{Code, ConnectError};
use crate::rest::E2bError;

/// The Connect code of a SPACE error.
pub fn code_of(code: ErrorCode) -> Code {
    match code {
        ErrorCode::NotFound => Code::NotFound,
        ErrorCode::AlreadyExists => Code::AlreadyExists,
        ErrorCode::InvalidRequest
        | ErrorCode::InvalidPath
        | ErrorCode::ExecFailed
        | ErrorCode::EgressBeyondCeiling => Code::InvalidArgument,
        ErrorCode::PermissionDenied | ErrorCode::Forbidden | ErrorCode::KeyUnavailable => {
            Code::PermissionDenied
        }
        ErrorCode::QuotaExceeded | ErrorCode::RateLimited => Code::ResourceExhausted,
        ErrorCode::Conflict | ErrorCode::NodeFenced => Code::FailedPrecondition,
        ErrorCode::PayloadTooLarge
        | ErrorCode::TooManyRequests
        | ErrorCode::InsufficientCapacity => Code::ResourceExhausted,
        ErrorCode::Timeout => Code::DeadlineExceeded,
        // envd authenticates the user a request names: an unknown one is 401 there.
        ErrorCode::Unauthenticated | ErrorCode::UnknownUser => Code::Unauthenticated,
        // "…port is not open": the SDKs read that text.
        ErrorCode::SandboxFailed
        | ErrorCode::PortClosed
        | ErrorCode::NodeUnavailable
        | ErrorCode::StorageUnavailable
        | ErrorCode::KeyServiceUnavailable => Code::Unavailable,
        ErrorCode::SnapshotCorrupt => Code::DataLoss,
        ErrorCode::IdempotencyKeyReused | ErrorCode::Internal => Code::Internal,
    }
}

/// A SPACE error from an operation in the guest, as a Connect error.
pub fn connect_error(e: ApiError) -> ConnectError {
    ConnectError::new(code_of(e.body.code), e.body.message)
}

/// A failure to reach the guest at all (the sandbox is gone, paused by a client, or
/// broken), worded so the SDKs tell "not running" from other failures.
pub fn unreachable(e: ApiError) -> ConnectError {
    match e.body.code {
        ErrorCode::NotFound | ErrorCode::Conflict => ConnectError::new(
            Code::Unavailable,
            format!("{}: the sandbox was not found running", e.body.message),
        ),
        _ => connect_error(e),
    }
}

impl From<AccessError> for ConnectError {
    fn from(e: AccessError) -> Self {
        let code = match e {
            AccessError::SandboxNotFound(_) => Code::Unavailable,
            AccessError::Unauthenticated(_) | AccessError::BadUser => Code::Unauthenticated,
            AccessError::Internal => Code::Internal,
        };
        ConnectError::new(code, e.to_string())
    }
}

/// An HTTP error of envd's plain routes (`/files`, `/health`): `{"code": status, ...}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError(pub E2bError);

impl HttpError {
    /// `status` with `message`.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        HttpError(E2bError {
            code: status,
            message: message.into(),
        })
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.0)).into_response()
    }
}

impl From<ApiError> for HttpError {
    /// A SPACE error as an envd HTTP error (507 stays 507: the SDKs raise "not enough
    /// space"; a sandbox a client paused is the proxy's 502).
    fn from(e: ApiError) -> Self {
        let status = match e.body.code {
            ErrorCode::Conflict if e.body.message.contains("paused") => 502,
            ErrorCode::UnknownUser => 401,
            other => other.http_status(),
        };
        HttpError::new(status, e.body.message)
    }
}

/// An HTTP error response of envd's plain routes.
pub fn http_error(status: u16, message: impl Into<String>) -> Response {
    HttpError::new(status, message).into_response()
}

/// What E2B's proxy answers for a sandbox that is not there (any envd route).
pub fn sandbox_not_found_response(what: &str) -> Response {
    http_error(502, format!("sandbox named by {what} was not found"))
}

/// An access failure on a plain route.
pub fn http_access_error(e: AccessError) -> Response {
    match e {
        AccessError::SandboxNotFound(_) => http_error(502, e.to_string()),
        AccessError::Unauthenticated(_) | AccessError::BadUser => http_error(401, e.to_string()),
        AccessError::Internal => http_error(500, e.to_string()),
    }
}

/// An access failure on an RPC: the proxy's 502 for a missing sandbox (what the SDKs probe
/// for), Connect's unary error shape otherwise (streaming clients read it too, since it
/// comes before any message).
pub fn rpc_access_error(e: AccessError) -> Response {
    match e {
        AccessError::SandboxNotFound(_) => http_error(502, e.to_string()),
        other => ConnectError::from(other).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_errors_map_to_the_codes_the_sdks_expect() {
        assert_eq!(code_of(ErrorCode::NotFound), Code::NotFound);
        assert_eq!(code_of(ErrorCode::InvalidPath), Code::InvalidArgument);
        assert_eq!(code_of(ErrorCode::PayloadTooLarge), Code::ResourceExhausted);
        let e = unreachable(ApiError::new(ErrorCode::Conflict, "sandbox x is paused"));
        assert_eq!(e.code, Code::Unavailable);
        assert!(e.message.contains("was not found"));
        let gone = ConnectError::from(AccessError::SandboxNotFound("sbx-x".into()));
        assert!(gone.message.contains("was not found"));
        assert_eq!(rpc_access_error(AccessError::BadUser).status(), 401);
        assert_eq!(
            rpc_access_error(AccessError::SandboxNotFound("x".into())).status(),
            502
        );
    }
}
