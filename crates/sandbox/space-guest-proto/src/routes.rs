//! The HTTP/2 routes the daemon serves. One constant per route, used by both ends.
//!
//! | method | path | request | response |
//! |---|---|---|---|
//! | GET | `/v1/health` | – | [`crate::Health`] |
//! | POST | `/v1/configure` | [`crate::GuestConfig`] | 204 |
//! | POST | `/v1/processes` | `ProcessSpec` | 201 `ProcessInfo` |
//! | GET | `/v1/processes` | – | `Vec<ProcessInfo>` |
//! | GET | `/v1/processes/{id}` | – | `ProcessInfo` |
//! | GET | `/v1/processes/{id}/output?after=SEQ` | – | NDJSON stream of `OutputEvent`, ends after `exit` |
//! | POST | `/v1/processes/{id}/stdin?close=BOOL` | raw bytes, streamed | 204 |
//! | POST | `/v1/processes/{id}/signal` | `SignalRequest` | 204 |
//! | POST | `/v1/processes/{id}/resize` | `PtySize` | 204 (409 if not a pty) |
//! | GET | `/v1/files?path=P&user=U` | – | raw bytes, streamed; header [`FILE_SIZE_HEADER`] |
//! | PUT | `/v1/files?path=P&user=U&mode=OCTAL` | raw bytes, streamed | `FileStat` (atomic replace, parents created) |
//! | DELETE | `/v1/files?path=P&user=U&recursive=BOOL` | – | 204 |
//! | GET | `/v1/files/stat?path=P&user=U` | – | `FileStat` (lstat) |
//! | GET | `/v1/files/list?path=P&user=U&depth=N` | – | `FileList` |
//! | POST | `/v1/files/mkdir` | `MkdirRequest` | `FileStat` |
//! | POST | `/v1/files/rename` | `RenameRequest` | 204 |
//!
//! Relative paths resolve against the acting user's home. File operations run with the
//! acting user's file-system uid and gid, so they see exactly what that user may see.

/// Health check.
pub const HEALTH: &str = "/v1/health";
/// Configure a freshly booted guest.
pub const CONFIGURE: &str = "/v1/configure";
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
/// Response header with the size of a file being read.
pub const FILE_SIZE_HEADER: &str = "x-space-file-size";
/// Content type of output streams.
pub const NDJSON: &str = "application/x-ndjson";

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
