//! The daemon's error type: a `space_core::ErrorBody` that renders as a JSON response with
//! the status its code prescribes, plus the mapping from OS errors to error codes.

use std::io;
use std::path::Path;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use space_core::{ErrorBody, ErrorCode};

/// An error returned by a route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ApiError(pub ErrorBody);

impl ApiError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError(ErrorBody::new(code, message))
    }

    /// 400 invalid_request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    /// 500 internal.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// The error code.
    pub fn code(&self) -> ErrorCode {
        self.0.code
    }

    /// An OS error during `op` on `path`, mapped to the code a client can act on.
    pub fn io(op: &str, path: &Path, e: &io::Error) -> Self {
        Self::new(
            code_for_io(e),
            format!("{op} {}: {}", path.display(), describe(e)),
        )
    }
}

/// The error code for an OS error.
pub fn code_for_io(e: &io::Error) -> ErrorCode {
    match e.raw_os_error() {
        Some(libc::ENOENT) => ErrorCode::NotFound,
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => ErrorCode::PermissionDenied,
        Some(libc::EEXIST) => ErrorCode::AlreadyExists,
        Some(libc::ENOTEMPTY | libc::EXDEV | libc::EBUSY | libc::ETXTBSY) => ErrorCode::Conflict,
        Some(libc::EISDIR | libc::ENOTDIR | libc::ENAMETOOLONG | libc::ELOOP | libc::EINVAL) => {
            ErrorCode::InvalidPath
        }
        Some(libc::ENOSPC | libc::EDQUOT) => ErrorCode::InsufficientCapacity,
        _ => ErrorCode::Internal,
    }
}

/// A human description of an OS error, with clearer words for the common path errors.
fn describe(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EISDIR) => "is a directory".into(),
        Some(libc::ENOTDIR) => "not a directory (a path component is a file)".into(),
        Some(libc::ENOENT) => "no such file or directory".into(),
        Some(libc::EACCES | libc::EPERM) => "permission denied".into(),
        Some(libc::EEXIST) => "already exists".into(),
        Some(libc::ENOTEMPTY) => "directory not empty".into(),
        Some(libc::ENOSPC) => "no space left on device".into(),
        Some(libc::EXDEV) => "cannot move across file systems".into(),
        _ => e.to_string(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.0.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.0)).into_response()
    }
}

impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> Self {
        ApiError::internal(format!("worker task failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_os_errors() {
        let c = |n| code_for_io(&io::Error::from_raw_os_error(n));
        assert_eq!(c(libc::ENOENT), ErrorCode::NotFound);
        assert_eq!(c(libc::EACCES), ErrorCode::PermissionDenied);
        assert_eq!(c(libc::EEXIST), ErrorCode::AlreadyExists);
        assert_eq!(c(libc::EISDIR), ErrorCode::InvalidPath);
        assert_eq!(c(libc::EIO), ErrorCode::Internal);
        let e = ApiError::io(
            "open",
            Path::new("/x"),
            &io::Error::from_raw_os_error(libc::ENOTDIR),
        );
        assert_eq!(
            e.0.message,
            "open /x: not a directory (a path component is a file)"
        );
    }
}
