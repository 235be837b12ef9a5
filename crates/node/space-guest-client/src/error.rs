//! What can go wrong talking to a guest, and how low-level failures map onto it.
//!
//! The split matters to the sandbox manager: a [`GuestError::Remote`] or
//! [`GuestError::Local`] is an ordinary failed request; a channel fault
//! ([`GuestError::Protocol`], [`GuestError::Disconnected`]) means the sandbox's daemon is
//! gone or hostile and the sandbox should be failed (or the channel reconnected).

use space_core::{ErrorBody, ErrorCode};

/// A failed call to the guest daemon.
#[derive(thiserror::Error, Debug, Clone)]
pub enum GuestError {
    /// The guest answered with an error (status + ErrorBody, sanitised). Not a fault of the channel.
    #[error("guest answered {status}: {body}")]
    Remote {
        /// HTTP status the guest sent.
        status: u16,
        /// The guest's error, message cut and stripped of control characters.
        body: ErrorBody,
    },
    /// The request was refused on this side before it reached the guest (invalid path,
    /// user name or process spec; oversize request), or the caller's own request body
    /// stream failed. Not a fault of the channel.
    #[error("request refused before reaching the guest: {0}")]
    Local(ErrorBody),
    /// The guest broke the protocol (garbage, oversize, bad JSON, bad handshake): the sandbox should be failed.
    #[error("guest broke the protocol: {0}")]
    Protocol(String),
    /// The channel is gone (EOF, connection task ended, socket missing, keep-alive unanswered).
    #[error("guest channel disconnected: {0}")]
    Disconnected(String),
    /// A deadline passed.
    #[error("timed out: {0}")]
    Timeout(String),
}

impl GuestError {
    /// The API error code this failure surfaces as.
    pub fn code(&self) -> ErrorCode {
        match self {
            GuestError::Remote { body, .. } | GuestError::Local(body) => body.code,
            GuestError::Protocol(_) | GuestError::Disconnected(_) => ErrorCode::SandboxFailed,
            GuestError::Timeout(_) => ErrorCode::Timeout,
        }
    }

    /// True when the channel itself is broken ([`GuestError::Protocol`] or
    /// [`GuestError::Disconnected`]): further calls on this client will fail too.
    pub fn is_channel_fault(&self) -> bool {
        matches!(self, GuestError::Protocol(_) | GuestError::Disconnected(_))
    }

    /// The error as an API error body (code plus a message fit for a client).
    pub fn to_error_body(&self) -> ErrorBody {
        match self {
            GuestError::Remote { body, .. } | GuestError::Local(body) => body.clone(),
            other => ErrorBody::new(other.code(), other.to_string()),
        }
    }

    /// A [`GuestError::Local`] with this code.
    pub(crate) fn local(code: ErrorCode, message: impl Into<String>) -> Self {
        GuestError::Local(ErrorBody::new(code, message))
    }

    /// A [`GuestError::Protocol`] whose text may carry guest-controlled bytes.
    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        GuestError::Protocol(sanitise(message.into()))
    }
}

/// Bounds and cleans text that may contain guest-controlled bytes (serde messages quote
/// the offending input), so it is safe to log and to return to an API client.
pub(crate) fn sanitise(message: String) -> String {
    ErrorBody::new(ErrorCode::Internal, message)
        .sanitised()
        .message
}

/// The error code a bare HTTP status stands for, used when a guest error response has no
/// parsable [`ErrorBody`].
pub(crate) fn code_for_status(status: u16) -> ErrorCode {
    match status {
        400 => ErrorCode::InvalidRequest,
        401 => ErrorCode::Unauthenticated,
        403 => ErrorCode::PermissionDenied,
        404 => ErrorCode::NotFound,
        409 => ErrorCode::Conflict,
        413 => ErrorCode::PayloadTooLarge,
        422 => ErrorCode::ExecFailed,
        429 => ErrorCode::TooManyRequests,
        504 => ErrorCode::Timeout,
        _ => ErrorCode::Internal,
    }
}

/// Maps an HTTP/2 error, seen by one request or by the connection, onto a [`GuestError`].
pub(crate) fn from_h2(err: h2::Error) -> GuestError {
    if let Some(io) = err.get_io() {
        return GuestError::Disconnected(sanitise(format!("channel I/O: {io}")));
    }
    let reason = err.reason();
    if err.is_go_away() {
        if err.is_library() {
            // h2 itself closed the connection because the guest violated HTTP/2 (garbage
            // instead of frames, oversize frames, flow-control violations, floods).
            return GuestError::protocol(format!("HTTP/2 violation: {err}"));
        }
        return match reason {
            Some(h2::Reason::NO_ERROR) | None => {
                GuestError::Disconnected("the guest closed the connection (GOAWAY)".into())
            }
            Some(r) => {
                GuestError::Disconnected(format!("the guest closed the connection (GOAWAY {r:?})"))
            }
        };
    }
    if err.is_reset() {
        if err.is_library() {
            // h2 reset the stream because the guest's response on it was malformed
            // (oversize headers, bad pseudo headers, content-length mismatch).
            return GuestError::protocol(format!("malformed response: {err}"));
        }
        // The guest reset this one stream: a failed request, the channel is fine.
        let (status, code) = match reason {
            Some(h2::Reason::REFUSED_STREAM) => (429, ErrorCode::TooManyRequests),
            _ => (500, ErrorCode::Internal),
        };
        return GuestError::Remote {
            status,
            body: ErrorBody::new(code, format!("the guest reset the request stream ({err})"))
                .sanitised(),
        };
    }
    if let Some(r) = reason {
        // A bare reason: h2 reports connection errors this way to streams that were open.
        if r == h2::Reason::NO_ERROR {
            return GuestError::Disconnected("the connection was closed".into());
        }
        return GuestError::protocol(format!("HTTP/2 error: {err}"));
    }
    // User errors: the stream or connection is no longer usable (e.g. it was closed).
    GuestError::Disconnected(sanitise(format!("HTTP/2 channel unusable: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_faults() {
        let remote = GuestError::Remote {
            status: 404,
            body: ErrorBody::new(ErrorCode::NotFound, "x"),
        };
        assert_eq!(remote.code(), ErrorCode::NotFound);
        assert!(!remote.is_channel_fault());
        assert_eq!(
            GuestError::Protocol("x".into()).code(),
            ErrorCode::SandboxFailed
        );
        assert!(GuestError::Protocol("x".into()).is_channel_fault());
        assert!(GuestError::Disconnected("x".into()).is_channel_fault());
        assert_eq!(GuestError::Timeout("x".into()).code(), ErrorCode::Timeout);
        assert!(!GuestError::Timeout("x".into()).is_channel_fault());
        assert_eq!(
            GuestError::local(ErrorCode::InvalidPath, "p").code(),
            ErrorCode::InvalidPath
        );
    }

    #[test]
    fn guest_text_is_bounded() {
        let e = GuestError::protocol(format!("bad \u{1b}[31m{}", "x".repeat(10_000)));
        let GuestError::Protocol(msg) = e else {
            panic!()
        };
        assert!(msg.len() <= space_core::error::MAX_ERROR_MESSAGE);
        assert!(!msg.contains('\u{1b}'));
    }

    #[test]
    fn h2_classification() {
        let proto = h2::Error::from(h2::Reason::PROTOCOL_ERROR);
        assert!(matches!(from_h2(proto), GuestError::Protocol(_)));
    }
}
