//! The HTTP/2 routes the daemon serves. One constant per route, used by both ends.
//!
//! | method | path | request | response |
//! |---|---|---|---|
//! | GET | `/v1/health` | – | [`crate::Health`] |
//! | POST | `/v1/configure` | [`crate::GuestConfig`] | 204 |
//! | POST | `/v1/identity` | [`crate::IdentityRequest`] | 204 (reseed RNG, hostname, clock) |
//! | POST | `/v1/fs/freeze` | [`crate::FreezeRequest`] | 204 once frozen (409 `conflict` if frozen by someone else) |
//! | POST | `/v1/fs/thaw` | – | 204 (also when not frozen) |
//! | POST | `/v1/workload/freeze` | – | 204 once the workload cgroup is frozen (504 after 2 s; 409 without a workload cgroup) |
//! | POST | `/v1/workload/thaw` | – | 204 |
//! | GET | `/v1/activity` | – | [`crate::Activity`] |
//! | GET | `/v1/metrics` | – | [`crate::GuestMetrics`] |
//! | POST | `/v1/processes` | `ProcessSpec` | 201 `ProcessInfo` |
//! | GET | `/v1/processes` | – | `Vec<ProcessInfo>` |
//! | GET | `/v1/processes/{id}` | – | `ProcessInfo` |
//! | GET | `/v1/processes/{id}/output?after=SEQ` | – | NDJSON stream of `OutputEvent`, ends after `exit` |
//! | GET | `/v1/processes/{id}/output?live=true` | – | the same, from now on: `started`, then only later events (an exited process: `started`, `exit`) |
//! | POST | `/v1/processes/{id}/stdin?close=BOOL` | raw bytes, streamed | 204 |
//! | POST | `/v1/processes/{id}/signal` | `SignalRequest` | 204 |
//! | POST | `/v1/processes/{id}/resize` | `PtySize` | 204 (409 if not a pty) |
//! | GET | `/v1/files?path=P&user=U` | – | raw bytes, streamed; header [`FILE_SIZE_HEADER`] |
//! | PUT | `/v1/files?path=P&user=U&mode=OCTAL&metadata=JSON` | raw bytes, streamed | `FileStat` (atomic replace, parents created; metadata kept as `user.space.meta.*` xattrs) |
//! | DELETE | `/v1/files?path=P&user=U&recursive=BOOL` | – | 204 |
//! | GET | `/v1/files/stat?path=P&user=U` | – | `FileStat` (lstat) |
//! | GET | `/v1/files/list?path=P&user=U&depth=N` | – | `FileList` |
//! | POST | `/v1/files/mkdir` | `MkdirRequest` | `FileStat` |
//! | POST | `/v1/files/rename` | `RenameRequest` | 204 |
//! | GET | `/v1/files/watch?path=P&user=U&recursive=BOOL` | – | NDJSON stream of `WatchEvent`, `started` first (errors before the stream) |
//! | POST | `/v1/ports/{port}/connect` | bytes for the connection, streamed | 200 once connected, then the connection's bytes, streamed (502 `port_closed`) |
//!
//! `/v1/fs/freeze` freezes every writable file system on a virtio disk, in mount order, and
//! thaws them by itself after `timeout_ms` unless `/v1/fs/thaw` comes first; a freeze while
//! this daemon already holds one re-arms the timer. Every process the daemon starts runs in
//! the workload cgroup (`/sys/fs/cgroup/workload`), which `/v1/workload/freeze` freezes as a
//! whole; while it is frozen, starting a process answers 409.
//!
//! `/v1/ports/{port}/connect` is one TCP connection to a server inside the guest, carried
//! full duplex on one HTTP/2 stream: the daemon connects to `127.0.0.1:{port}` (then
//! `[::1]:{port}` if refused); the request body is what the host sends on the connection
//! (its end half-closes the connection's write side), the response body what the server
//! sends (it ends when the server closes). The daemon still listens on no network socket: it
//! only connects, to loopback. Nothing listening answers 502 `port_closed` with a message
//! containing "port is not open". At most [`crate::limits::MAX_PORT_CONNECTIONS`] at once.
//!
//! Relative paths resolve against the acting user's home. File operations run with the
//! acting user's file-system uid and gid, so they see exactly what that user may see.
//!
//! `/v1/files/watch` places its inotify watches as the acting user (one per directory,
//! subdirectories too with `recursive`, including those created later), then streams
//! `started` and the changes; it ends after reporting the removal (or move) of the watched
//! directory itself. Its bounds are [`crate::limits::MAX_WATCHED_DIRS`],
//! [`crate::limits::MAX_WATCH_STREAMS`] and [`crate::limits::MAX_WATCH_QUEUE`].

/// Health check.
pub const HEALTH: &str = "/v1/health";
/// Configure a freshly booted guest.
pub const CONFIGURE: &str = "/v1/configure";
/// Restore uniqueness after a snapshot restore or fork: RNG, hostname, clock.
pub const IDENTITY: &str = "/v1/identity";
/// Freeze the disk file systems (FIFREEZE), with an auto-thaw timeout.
pub const FS_FREEZE: &str = "/v1/fs/freeze";
/// Thaw what `FS_FREEZE` froze (FITHAW).
pub const FS_THAW: &str = "/v1/fs/thaw";
/// Freeze the workload cgroup (every process the daemon started).
pub const WORKLOAD_FREEZE: &str = "/v1/workload/freeze";
/// Thaw the workload cgroup.
pub const WORKLOAD_THAW: &str = "/v1/workload/thaw";
/// Activity counters, for idleness.
pub const ACTIVITY: &str = "/v1/activity";
/// CPU, memory and disk use, for the node's metrics sampler.
pub const METRICS: &str = "/v1/metrics";
/// Routes that are the platform's own housekeeping, not the sandbox's use: requests to
/// them do not count in `Activity::api_requests`. Freeze and thaw are here because the
/// snapshot scheduler calls them every minute, and metrics because the sampler calls them
/// every few seconds, which would otherwise keep every sandbox "busy" forever.
pub const NOT_ACTIVITY: &[&str] = &[
    HEALTH,
    ACTIVITY,
    METRICS,
    CONFIGURE,
    IDENTITY,
    FS_FREEZE,
    FS_THAW,
    WORKLOAD_FREEZE,
    WORKLOAD_THAW,
];
/// Start (POST) or list (GET) processes.
pub const PROCESSES: &str = "/v1/processes";
/// File content: read (GET), write (PUT), remove (DELETE).
pub const FILES: &str = "/v1/files";
/// File metadata.
pub const FILES_STAT: &str = "/v1/files/stat";
/// Directory listing.
pub const FILES_LIST: &str = "/v1/files/list";
/// mkdir -p.
pub const FILES_MKDIR: &str = "/v1/files/mkdir";
/// Rename.
pub const FILES_RENAME: &str = "/v1/files/rename";
/// Watch a directory (NDJSON stream of `WatchEvent`).
pub const FILES_WATCH: &str = "/v1/files/watch";
/// Unpack a tar archive (PUT body) under a directory.
pub const FILES_ARCHIVE: &str = "/v1/files/archive";
/// Response header with the size of a file being read.
pub const FILE_SIZE_HEADER: &str = "x-space-file-size";
/// Content type of output streams.
pub const NDJSON: &str = "application/x-ndjson";

/// `/v1/ports/{port}/connect`.
pub fn port_connect(port: u16) -> String {
    format!("/v1/ports/{port}/connect")
}

/// `/v1/processes/{id}`.
pub fn process(id: u64) -> String {
    format!("{PROCESSES}/{id}")
}

/// `/v1/processes/{id}/output`.
pub fn process_output(id: u64) -> String {
    format!("{PROCESSES}/{id}/output")
}

/// `/v1/processes/{id}/stdin`.
pub fn process_stdin(id: u64) -> String {
    format!("{PROCESSES}/{id}/stdin")
}

/// `/v1/processes/{id}/signal`.
pub fn process_signal(id: u64) -> String {
    format!("{PROCESSES}/{id}/signal")
}

/// `/v1/processes/{id}/resize`.
pub fn process_resize(id: u64) -> String {
    format!("{PROCESSES}/{id}/resize")
}
