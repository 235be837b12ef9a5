//! The protocol between the node (host) and `spaced` (guest) over the private channel.
//!
//! The channel is a byte stream: a virtio-serial port under QEMU, a vsock connection under
//! Firecracker, a Unix socket in development. On it:
//!
//! 1. **Handshake** (text lines, see [`handshake`]): the host sends `SPACE-HELLO`, the guest
//!    answers `SPACE-READY`. This resynchronises a stream that may hold stale bytes from an
//!    earlier host connection (a virtio-serial port outlives host reconnects) and carries the
//!    protocol version.
//! 2. **HTTP/2** with prior knowledge: the guest is the server, the host the client. HTTP/2
//!    gives multiplexing, per-stream flow control (one chatty process cannot starve another)
//!    and bounded frames; the limits both sides configure are in [`limits`]. The routes are in
//!    [`routes`]; bodies are the JSON types of `space-core` and of this crate; every error is a
//!    status code plus a `space_core::ErrorBody`.
//!
//! Architecture invariant: the guest listens on no network socket; this protocol is the only
//! way into the guest for the platform.

pub mod handshake;
pub mod limits;
pub mod routes;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The protocol version spoken after the handshake. Bumped on incompatible route changes.
pub const PROTOCOL_VERSION: u32 = 1;

/// Name of the virtio-serial port (`/sys/class/virtio-ports/vport*/name`).
pub const VIRTIO_SERIAL_PORT_NAME: &str = "space.agent";

/// vsock port the daemon listens on under Firecracker (guest side, CID any).
pub const VSOCK_PORT: u32 = 1024;

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Daemon version (crate version).
    pub version: String,
    /// Random id chosen at boot; changes when the guest reboots.
    pub boot_id: String,
    /// Milliseconds since the daemon started.
    pub uptime_ms: u64,
    /// Processes currently running.
    pub processes: u32,
}

/// `POST /v1/configure`: what the node tells a freshly booted guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestConfig {
    /// Hostname to set.
    pub hostname: String,
    /// Environment every process gets (below the process's own env).
    pub env: BTreeMap<String, String>,
    /// User processes and file operations run as when a request names none.
    pub default_user: String,
    /// Grow the root filesystem to fill its block device.
    pub resize_root: bool,
    /// Host wall clock, ms since the Unix epoch; the guest sets its clock from it.
    pub time_unix_ms: i64,
}
