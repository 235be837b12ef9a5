//! Bounds both ends of the channel enforce. The guest is hostile: the host applies these to
//! everything it reads, and a peer that exceeds them fails its own sandbox, nothing else.

/// Longest handshake line, newline included.
pub const MAX_HANDSHAKE_LINE: usize = 256;
/// Bytes the host discards while waiting for `SPACE-READY` before giving up.
pub const MAX_HANDSHAKE_DISCARD: usize = 64 * 1024;
/// HTTP/2 frame payload (the protocol minimum, 16 KiB).
pub const MAX_FRAME_SIZE: u32 = 16 * 1024;
/// HTTP/2 header list, either direction.
pub const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
/// Concurrent HTTP/2 streams the guest accepts.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;
/// Per-stream flow-control window.
pub const STREAM_WINDOW: u32 = 256 * 1024;
/// Connection flow-control window. Must be many stream windows wide: HTTP/2 returns
/// connection window only as data is read, so a few streams nobody reads (an unread process
/// output, stdin to a process that does not read it) would otherwise stall every call on the
/// channel, health checks included.
pub const CONNECTION_WINDOW: u32 = 64 * STREAM_WINDOW;
/// Largest JSON request or response body.
pub const MAX_JSON_BODY: usize = 1024 * 1024;
/// Bytes of output events a process keeps for clients that (re)connect later.
pub const OUTPUT_REPLAY_BYTES: usize = 1024 * 1024;
/// Bytes of a process's requested environment its listing shows (names and values); the
/// variables past it are left out, so a listing stays bounded whatever processes were
/// started with.
pub const MAX_LISTED_ENV_BYTES: usize = 8 * 1024;
/// Finished processes whose status and output are kept for late readers.
pub const MAX_FINISHED_PROCESSES: usize = 256;
/// Processes that may run at once.
pub const MAX_RUNNING_PROCESSES: usize = 1024;
/// HTTP/2 keep-alive ping interval, seconds; a guest that does not answer within
/// [`KEEPALIVE_TIMEOUT_SECS`] is considered gone.
pub const KEEPALIVE_INTERVAL_SECS: u64 = 10;
/// See [`KEEPALIVE_INTERVAL_SECS`].
pub const KEEPALIVE_TIMEOUT_SECS: u64 = 20;
/// Longest hostname the node may set.
pub const MAX_HOSTNAME: usize = 64;
/// Shortest auto-thaw timeout of `POST /v1/fs/freeze`, milliseconds.
pub const MIN_FREEZE_TIMEOUT_MS: u32 = 1;
/// Longest auto-thaw timeout of `POST /v1/fs/freeze`, milliseconds: a host that dies
/// mid-snapshot leaves the guest's disks frozen at most this long.
pub const MAX_FREEZE_TIMEOUT_MS: u32 = 30_000;
/// How long `POST /v1/workload/freeze` waits for the workload cgroup to report frozen.
pub const WORKLOAD_FREEZE_WAIT_MS: u64 = 2_000;
/// Fewest bytes of host entropy `POST /v1/identity` accepts (decoded).
pub const MIN_IDENTITY_ENTROPY: usize = 32;
/// Most bytes of host entropy `POST /v1/identity` accepts (decoded).
pub const MAX_IDENTITY_ENTROPY: usize = 512;
/// Latest wall clock the node may set, ms since the Unix epoch (9999-12-31T23:59:59.999Z).
pub const MAX_TIME_UNIX_MS: i64 = 253_402_300_799_999;

/// Largest `GuestConfig::trusted_ca_pem` (a CA certificate is about 600 bytes to 2 KiB).
pub const MAX_TRUSTED_CA_PEM: usize = 8 * 1024;

/// Directories one watch stream (`GET /v1/files/watch`) watches at most: a recursive watch
/// of a bigger tree is refused (429), and a subdirectory created beyond it is not watched
/// (the stream reports `overflow`).
pub const MAX_WATCHED_DIRS: usize = 4096;
/// Watch streams open at once in one guest (each holds an inotify instance; the kernel
/// allows root 128 by default).
pub const MAX_WATCH_STREAMS: usize = 32;
/// Events one watch stream queues for a reader that does not keep up; further changes are
/// dropped and the stream reports `overflow` once there is room again.
pub const MAX_WATCH_QUEUE: usize = 1024;
/// Longest NDJSON line of a watch stream (an event with two paths of at most 4 KiB each,
/// JSON-escaped).
pub const MAX_WATCH_LINE: usize = 64 * 1024;

/// TCP connections into the guest (`POST /v1/ports/{port}/connect`) open at once.
pub const MAX_PORT_CONNECTIONS: usize = 128;
/// How long the daemon waits for a guest port to accept a connection (a listener whose
/// backlog is full drops the SYN rather than refusing it), milliseconds.
pub const PORT_CONNECT_TIMEOUT_MS: u64 = 5_000;
