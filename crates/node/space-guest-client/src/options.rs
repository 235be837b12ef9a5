//! Tunables of a guest connection: timeouts per kind of call, keep-alive, windows.
//!
//! Defaults come from `space_guest_proto::limits`; tests shrink the keep-alive to see a dead
//! guest quickly.

use std::time::Duration;

use space_guest_proto::limits;

/// Largest JSON response accepted from listings (`list`, `list_processes`), which may
/// legitimately exceed `MAX_JSON_BODY`: 10 000 entries of a few hundred bytes each.
pub const MAX_LISTING_BODY: usize = 16 * 1024 * 1024;

/// Largest error body read from the guest (an `ErrorBody` message is cut to 1 KiB anyway).
pub const MAX_ERROR_BODY: usize = 64 * 1024;

/// How a [`crate::GuestClient`] talks to its guest.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Whole-call limit for JSON calls (health, configure, start, stat, ...).
    pub json_timeout: Duration,
    /// For streaming calls (output, file read, stdin, file write): the limit until the
    /// response headers arrive; for uploads, the limit from the end of the body to the
    /// response. The stream itself has no overall limit; keep-alive catches a dead guest.
    pub stream_open_timeout: Duration,
    /// Interval between HTTP/2 PINGs.
    pub keepalive_interval: Duration,
    /// A PING unanswered this long ends the connection.
    pub keepalive_timeout: Duration,
    /// Receive window per stream: the most a guest can make us buffer on one stream.
    pub stream_window: u32,
    /// Receive window of the whole connection: the most a guest can make us buffer in all.
    pub connection_window: u32,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            json_timeout: Duration::from_secs(30),
            stream_open_timeout: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(limits::KEEPALIVE_INTERVAL_SECS),
            keepalive_timeout: Duration::from_secs(limits::KEEPALIVE_TIMEOUT_SECS),
            stream_window: limits::STREAM_WINDOW,
            connection_window: limits::CONNECTION_WINDOW,
        }
    }
}
