//! Machine-readable error codes shared by the API, the node and the guest protocol.
//!
//! An error that reaches a client is always `{ "code": "...", "message": "..." }` with an
//! HTTP status derived from the code, so the same failure reads the same at every layer.

use std::fmt;

use serde::{Deserialize, Serialize};

/// At most `max_chars` characters of `text`, for quoting input in an error message: what a
/// client or a guest sent is echoed bounded, never whole.
pub fn excerpt(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

/// What went wrong, as a stable string a program can match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed (bad JSON, bad field, bad id).
    InvalidRequest,
    /// A path in a file or process request is not acceptable.
    InvalidPath,
    /// The user a process or file request names does not exist in the sandbox.
    UnknownUser,
    /// An egress policy reaches what the operator's egress ceiling forbids (loopback,
    /// private and metadata addresses, the node's own addresses, unless granted).
    EgressBeyondCeiling,
    /// No API key, or an unknown one.
    Unauthenticated,
    /// The key is valid but may not do this.
    Forbidden,
    /// The sandbox, template, process or file does not exist (or is not yours).
    NotFound,
    /// The operation is not allowed in the resource's current state.
    Conflict,
    /// The target already exists.
    AlreadyExists,
    /// The body is larger than allowed.
    PayloadTooLarge,
    /// The node cannot fit the requested resources.
    InsufficientCapacity,
    /// Permission denied inside the sandbox.
    PermissionDenied,
    /// The program to execute does not exist or cannot be executed.
    ExecFailed,
    /// The operation took too long.
    Timeout,
    /// The sandbox is broken (VM gone, daemon unreachable or misbehaving).
    SandboxFailed,
    /// Nothing in the sandbox accepts connections on the port asked for.
    PortClosed,
    /// Too many requests or streams at once.
    TooManyRequests,
    /// The API key is over its request rate, or the tenant runs its most expensive
    /// operations of a kind at once: retry after the response's `Retry-After`.
    RateLimited,
    /// The tenant's quota does not allow it (the message names the limit).
    QuotaExceeded,
    /// An `Idempotency-Key` was reused for a different request.
    IdempotencyKeyReused,
    /// The node that holds the sandbox cannot be reached (or is lost): retry later.
    NodeUnavailable,
    /// A node spoke with a generation it no longer has (it was declared lost, or joined
    /// again, since): it must rejoin before it is heard.
    NodeFenced,
    /// A stored snapshot (in object storage) is damaged: an artifact is missing, or does not
    /// match the size or digest recorded when it was written. Nothing was restored from it.
    SnapshotCorrupt,
    /// Object storage failed or could not be reached (after retries): retry later.
    StorageUnavailable,
    /// The tenant's customer key cannot be used: its owner revoked, disabled or destroyed
    /// it, or withdrew SPACE's access (the message names the customer key, never key
    /// material). What it protects can be neither started, resumed, restored nor decrypted.
    KeyUnavailable,
    /// The key service holding the tenant's customer key could not be reached (after
    /// retries): retry later. Nothing was written in plaintext meanwhile.
    KeyServiceUnavailable,
    /// A bug or an unexpected failure on the platform side.
    Internal,
}

impl ErrorCode {
    /// The HTTP status for this code.
    pub fn http_status(self) -> u16 {
        use ErrorCode::*;
        match self {
            InvalidRequest | InvalidPath | UnknownUser | EgressBeyondCeiling => 400,
            Unauthenticated => 401,
            Forbidden | PermissionDenied | QuotaExceeded | KeyUnavailable => 403,
            NotFound => 404,
            Conflict | AlreadyExists | NodeFenced => 409,
            PayloadTooLarge => 413,
            ExecFailed | IdempotencyKeyReused => 422,
            TooManyRequests | RateLimited => 429,
            InsufficientCapacity => 507,
            Timeout => 504,
            SandboxFailed | PortClosed | SnapshotCorrupt => 502,
            NodeUnavailable | StorageUnavailable | KeyServiceUnavailable => 503,
            Internal => 500,
        }
    }

    /// The snake_case name, as serialised.
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            InvalidRequest => "invalid_request",
            InvalidPath => "invalid_path",
            UnknownUser => "unknown_user",
            EgressBeyondCeiling => "egress_beyond_ceiling",
            Unauthenticated => "unauthenticated",
            Forbidden => "forbidden",
            NotFound => "not_found",
            Conflict => "conflict",
            AlreadyExists => "already_exists",
            PayloadTooLarge => "payload_too_large",
            InsufficientCapacity => "insufficient_capacity",
            PermissionDenied => "permission_denied",
            ExecFailed => "exec_failed",
            Timeout => "timeout",
            SandboxFailed => "sandbox_failed",
            PortClosed => "port_closed",
            TooManyRequests => "too_many_requests",
            RateLimited => "rate_limited",
            QuotaExceeded => "quota_exceeded",
            IdempotencyKeyReused => "idempotency_key_reused",
            NodeUnavailable => "node_unavailable",
            NodeFenced => "node_fenced",
            SnapshotCorrupt => "snapshot_corrupt",
            StorageUnavailable => "storage_unavailable",
            KeyUnavailable => "key_unavailable",
            KeyServiceUnavailable => "key_service_unavailable",
            Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The body of every error response: at the API, and from the guest daemon to the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[error("{code}: {message}")]
pub struct ErrorBody {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// Human-readable explanation.
    pub message: String,
}

/// Longest error message accepted from an untrusted peer; longer ones are cut.
pub const MAX_ERROR_MESSAGE: usize = 1024;

impl ErrorBody {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// Cuts the message to [`MAX_ERROR_MESSAGE`] bytes (at a char boundary) and strips
    /// control characters: used on errors that came from a guest.
    pub fn sanitised(mut self) -> Self {
        let cut = crate::text::prefix_at_char_boundary(&self.message, MAX_ERROR_MESSAGE).len();
        self.message.truncate(cut);
        self.message.retain(|c| !c.is_control());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_as_snake_case() {
        let body = ErrorBody::new(ErrorCode::InsufficientCapacity, "x");
        let json = serde_json::to_string(&body).unwrap();
        assert_eq!(json, r#"{"code":"insufficient_capacity","message":"x"}"#);
    }

    #[test]
    fn port_closed_is_a_bad_gateway() {
        assert_eq!(ErrorCode::PortClosed.http_status(), 502);
        assert_eq!(
            serde_json::to_string(&ErrorCode::PortClosed).unwrap(),
            format!("\"{}\"", ErrorCode::PortClosed.as_str())
        );
    }

    #[test]
    fn sanitise_bounds_messages() {
        let body = ErrorBody::new(ErrorCode::Internal, "é".repeat(2000) + "\n\x1b").sanitised();
        assert!(body.message.len() <= MAX_ERROR_MESSAGE);
        assert!(!body.message.contains('\n'));
    }
}
