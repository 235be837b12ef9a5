//! Connect error codes and bodies. A unary error is a non-200 status with the body
//! `{"code": "not_found", "message": "…"}`; a streaming error travels in the end-of-stream
//! envelope as `{"error": {"code": …, "message": …}}` after an HTTP 200. The E2B SDKs turn
//! the codes into their exceptions (`docs/e2b-compat.md`, section 4), and read some
//! messages ("was not found", "port is not open"), so callers choose messages with care.

use serde::{Deserialize, Serialize};

/// A Connect error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// The call was cancelled.
    Canceled,
    /// Unknown error.
    Unknown,
    /// The request is invalid whatever the system's state.
    InvalidArgument,
    /// The deadline expired.
    DeadlineExceeded,
    /// Something requested was not found.
    NotFound,
    /// Something to create exists already.
    AlreadyExists,
    /// The caller may not do this.
    PermissionDenied,
    /// A limit or quota was reached.
    ResourceExhausted,
    /// The system is not in a state for this.
    FailedPrecondition,
    /// Aborted (a conflict).
    Aborted,
    /// Out of range.
    OutOfRange,
    /// Not implemented.
    Unimplemented,
    /// Internal error.
    Internal,
    /// The service (here: the sandbox) is unavailable.
    Unavailable,
    /// Data lost.
    DataLoss,
    /// No valid credentials.
    Unauthenticated,
}

impl Code {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (Connect's table).
    pub fn http_status(self) -> u16 {
        match self {
            Code::Canceled => 499,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::Unauthenticated => 401,
        }
    }
}

/// An error to send: code and message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct ConnectError {
    /// The code.
    pub code: Code,
    /// What went wrong, for people (and the SDKs' few message checks).
    pub message: String,
}

/// The end-of-stream JSON.
#[derive(Serialize)]
struct EndOfStream<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a ConnectError>,
}

impl ConnectError {
    /// An error with `code`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    /// The body of a unary error response (sent with [`Code::http_status`]).
    pub fn unary_body(&self) -> Vec<u8> {
        // Serialising a struct of a string and an enum cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The payload of the end-of-stream envelope of a stream that ends with `result`.
    pub fn end_of_stream(result: Result<(), &ConnectError>) -> Vec<u8> {
        serde_json::to_vec(&EndOfStream {
            error: result.err(),
        })
        .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_connects_names_and_statuses() {
        let all = [
            (Code::Canceled, "canceled", 499),
            (Code::Unknown, "unknown", 500),
            (Code::InvalidArgument, "invalid_argument", 400),
            (Code::DeadlineExceeded, "deadline_exceeded", 504),
            (Code::NotFound, "not_found", 404),
            (Code::AlreadyExists, "already_exists", 409),
            (Code::PermissionDenied, "permission_denied", 403),
            (Code::ResourceExhausted, "resource_exhausted", 429),
            (Code::FailedPrecondition, "failed_precondition", 400),
            (Code::Aborted, "aborted", 409),
            (Code::OutOfRange, "out_of_range", 400),
            (Code::Unimplemented, "unimplemented", 501),
            (Code::Internal, "internal", 500),
            (Code::Unavailable, "unavailable", 503),
            (Code::DataLoss, "data_loss", 500),
            (Code::Unauthenticated, "unauthenticated", 401),
        ];
        for (code, name, status) in all {
            assert_eq!(code.as_str(), name);
            assert_eq!(code.http_status(), status, "{name}");
            // serde's name is the wire name too.
            assert_eq!(serde_json::to_value(code).unwrap(), name);
        }
    }

    #[test]
    fn bodies_are_what_the_sdks_parse() {
        let e = ConnectError::new(Code::NotFound, "process with pid 7 was not found");
        let unary: serde_json::Value = serde_json::from_slice(&e.unary_body()).unwrap();
        assert_eq!(
            unary,
            serde_json::json!({"code": "not_found", "message": "process with pid 7 was not found"})
        );
        let end: serde_json::Value =
            serde_json::from_slice(&ConnectError::end_of_stream(Err(&e))).unwrap();
        assert_eq!(end["error"]["code"], "not_found");
        assert_eq!(ConnectError::end_of_stream(Ok(())), b"{}");
    }
}
