//! The Connect protocol's wire format, as the E2B SDKs speak it (JSON codec, no compression):
//! [`envelope`] framing for streams, and [`error`] codes and bodies.
//!
//! [`server`] reads and writes them over axum.
//!
//! Unary calls are one JSON body each way (errors: a non-200 status and a JSON error body);
//! streaming calls are HTTP 200 with a sequence of envelopes ending in an end-of-stream
//! envelope that carries the error, if any. See <https://connectrpc.com/docs/protocol>.

pub mod envelope;
pub mod error;
pub mod server;

pub use envelope::{Envelope, EnvelopeDecoder, EnvelopeError, MAX_MESSAGE_BYTES};
pub use error::{Code, ConnectError};
