//! The audit log: who used which credential, where, and what was decided.
//!
//! An append-only JSON-lines file, one [`AuditEvent`] per line, opened with `O_APPEND` (mode
//! 0600) so each line is written in one `write` at the end of the file. Lines are bounded
//! ([`MAX_AUDIT_LINE_LEN`]): the path and the reason are truncated to their own bounds first.
//! Events name credentials by id and name only; values never reach this module.
//!
//! Event kinds: `resolve` (a credential was granted for a request), `inject` (its value went
//! into the request) and `deny` (the request was refused; the credential concerned, if any).
//! A line:
//!
//! ```json
//! {"ts_ms":1700000000000,"event":"deny","tenant":"tnt-…","sandbox":"sbx-…","credential_id":"crd-…","credential_name":"github","host":"api.github.com","method":"GET","path":"/user","decision":"deny","reason":"credential expired at 1690000000000 ms"}
//! ```
//!
//! When the file would grow past its rotation size it is renamed to `<path>.1` (replacing the
//! previous one) and a new file is started: at most two files, bounded disk. Lines are not
//! fsynced one by one (that would put a disk flush on every request); a crash may lose the
//! last few.
//!
//! [`AuditLog::query`] reads the current file then the previous one, newest line first,
//! each bounded by the rotation size, and skips lines it cannot parse (a torn last line after a
//! crash). A query that races a rotation may see a few lines twice or miss a few.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use space_core::id::{SandboxId, TenantId};

use crate::fsutil;
use crate::model::{CredentialId, CredentialName};

/// Longest audit line, newline included.
pub const MAX_AUDIT_LINE_LEN: usize = 8 * 1024;
/// Longest path recorded (longer paths are cut at a character boundary).
pub const MAX_AUDIT_PATH_LEN: usize = 1024;
/// Longest reason recorded.
pub const MAX_AUDIT_REASON_LEN: usize = 512;
/// Longest method recorded.
pub const MAX_AUDIT_METHOD_LEN: usize = 32;
/// Rotation size unless configured otherwise.
pub const DEFAULT_AUDIT_ROTATE_BYTES: u64 = 16 * 1024 * 1024;
/// Smallest rotation size that may be configured.
pub const MIN_AUDIT_ROTATE_BYTES: u64 = 64 * 1024;
/// Largest rotation size that may be configured (a query reads up to two files this size).
pub const MAX_AUDIT_ROTATE_BYTES: u64 = 256 * 1024 * 1024;
/// Most events one query returns.
pub const MAX_AUDIT_QUERY_LIMIT: usize = 1000;
/// Suffix of the previous (rotated) file.
pub const ROTATED_SUFFIX: &str = ".1";

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditKind {
    /// A credential was granted for a request.
    Resolve,
    /// A credential's value was injected into a request.
    Inject,
    /// A request was refused.
    Deny,
}

/// The decision recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditDecision {
    /// The request went on.
    Allow,
    /// The request was refused.
    Deny,
}

/// One line of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// When, milliseconds since the Unix epoch.
    pub ts_ms: i64,
    /// What happened.
    pub event: AuditKind,
    /// The sandbox's tenant.
    pub tenant: TenantId,
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The credential concerned, if any.
    pub credential_id: Option<CredentialId>,
    /// Its name.
    pub credential_name: Option<CredentialName>,
    /// Upstream host.
    pub host: String,
    /// Request method.
    pub method: String,
    /// Request path (no query; truncated to [`MAX_AUDIT_PATH_LEN`]).
    pub path: String,
    /// Allowed or denied.
    pub decision: AuditDecision,
    /// Why it was denied (truncated to [`MAX_AUDIT_REASON_LEN`]).
    pub reason: Option<String>,
}

/// Which events a query wants. Unset fields match everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only this tenant's events.
    pub tenant: Option<TenantId>,
    /// Only this sandbox's events.
    pub sandbox: Option<SandboxId>,
    /// Only this credential's events.
    pub credential: Option<CredentialId>,
    /// Only events at or after this instant.
    pub since_ms: Option<i64>,
    /// At most this many events (capped at [`MAX_AUDIT_QUERY_LIMIT`]).
    pub limit: usize,
}

impl AuditFilter {
    fn accepts(&self, e: &AuditEvent) -> bool {
        self.tenant.as_ref().is_none_or(|t| &e.tenant == t)
            && self.sandbox.as_ref().is_none_or(|s| &e.sandbox == s)
            && self
                .credential
                .as_ref()
                .is_none_or(|c| e.credential_id.as_ref() == Some(c))
            && self.since_ms.is_none_or(|t| e.ts_ms >= t)
    }
}

/// Why the audit log failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// A file operation failed.
    #[error("audit log {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// An event could not be serialised.
    #[error("audit event cannot be serialised: {0}")]
    Serialize(String),
    /// A bad configuration.
    #[error("audit log rotation size must be between {MIN_AUDIT_ROTATE_BYTES} and {MAX_AUDIT_ROTATE_BYTES} bytes")]
    RotateSize,
}

struct Current {
    file: File,
    len: u64,
}

/// The audit log (see the module doc). Shareable across threads.
pub struct AuditLog {
    path: PathBuf,
    rotate_bytes: u64,
    current: Mutex<Current>,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("path", &self.path)
            .field("rotate_bytes", &self.rotate_bytes)
            .finish()
    }
}

fn open_append(path: &Path) -> io::Result<(File, u64)> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(fsutil::PRIVATE_FILE_MODE)
        .open(path)?;
    let len = file.metadata()?.len();
    Ok((file, len))
}

/// Cuts `s` to at most `max` bytes at a character boundary.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

impl AuditLog {
    /// Opens (creating, mode 0600, with its directory) the log at `path`, rotating at
    /// [`DEFAULT_AUDIT_ROTATE_BYTES`].
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, AuditError> {
        Self::open_with_rotation(path, DEFAULT_AUDIT_ROTATE_BYTES)
    }

    /// Opens the log rotating at `rotate_bytes`.
    pub fn open_with_rotation(
        path: impl Into<PathBuf>,
        rotate_bytes: u64,
    ) -> Result<Self, AuditError> {
        if !(MIN_AUDIT_ROTATE_BYTES..=MAX_AUDIT_ROTATE_BYTES).contains(&rotate_bytes) {
            return Err(AuditError::RotateSize);
        }
        let path = path.into();
        let io_err = |source| AuditError::Io {
            path: path.clone(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fsutil::ensure_private_dir(dir).map_err(io_err)?;
        }
        let (file, len) = open_append(&path).map_err(io_err)?;
        Ok(Self {
            rotate_bytes,
            current: Mutex::new(Current { file, len }),
            path,
        })
    }

    /// The current file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The previous (rotated) file.
    pub fn previous_path(&self) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(ROTATED_SUFFIX);
        PathBuf::from(p)
    }

    /// The line for `event`: bounded fields, one JSON object, a newline.
    pub fn encode(event: &AuditEvent) -> Result<Vec<u8>, AuditError> {
        let mut e = event.clone();
        truncate(&mut e.path, MAX_AUDIT_PATH_LEN);
        truncate(&mut e.method, MAX_AUDIT_METHOD_LEN);
        if let Some(r) = e.reason.as_mut() {
            truncate(r, MAX_AUDIT_REASON_LEN);
        }
        let mut line =
            serde_json::to_vec(&e).map_err(|err| AuditError::Serialize(err.to_string()))?;
        if line.len() >= MAX_AUDIT_LINE_LEN {
            // Escaping can only expand what we bounded above by a small factor; if that still
            // overflows, drop the free-text fields rather than the event.
            e.path = "[too long]".into();
            e.reason = e.reason.map(|_| "[too long]".into());
            line = serde_json::to_vec(&e).map_err(|err| AuditError::Serialize(err.to_string()))?;
        }
        line.push(b'\n');
        Ok(line)
    }

    /// Appends one event (rotating first if the file would pass its size).
    pub fn append(&self, event: &AuditEvent) -> Result<(), AuditError> {
        let line = Self::encode(event)?;
        let io_err = |source| AuditError::Io {
            path: self.path.clone(),
            source,
        };
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.len > 0 && current.len + line.len() as u64 > self.rotate_bytes {
            fs::rename(&self.path, self.previous_path()).map_err(io_err)?;
            let (file, len) = open_append(&self.path).map_err(io_err)?;
            *current = Current { file, len };
            tracing::info!(path = %self.path.display(), "audit log rotated");
        }
        current.file.write_all(&line).map_err(io_err)?;
        current.len += line.len() as u64;
        Ok(())
    }

    /// Events matching `filter`, newest first (see the module doc).
    pub fn query(&self, filter: &AuditFilter) -> Result<Vec<AuditEvent>, AuditError> {
        let limit = filter.limit.min(MAX_AUDIT_QUERY_LIMIT);
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        for path in [self.path.clone(), self.previous_path()] {
            let bytes = match self.read_tail(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(source) => return Err(AuditError::Io { path, source }),
            };
            for line in bytes.split(|&b| b == b'\n').rev() {
                if line.is_empty() {
                    continue;
                }
                let Ok(event) = serde_json::from_slice::<AuditEvent>(line) else {
                    continue;
                };
                if filter.accepts(&event) {
                    out.push(event);
                    if out.len() == limit {
                        return Ok(out);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The last (rotation size + one line) bytes of `path`, starting at a line boundary.
    fn read_tail(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        let max = self.rotate_bytes + MAX_AUDIT_LINE_LEN as u64;
        let start = len.saturating_sub(max);
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        file.take(max).read_to_end(&mut bytes)?;
        if start > 0 {
            // Drop the partial first line.
            let cut = bytes
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |i| i + 1);
            bytes.drain(..cut);
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(ts_ms: i64, sandbox: &SandboxId, credential: Option<&CredentialId>) -> AuditEvent {
        AuditEvent {
            ts_ms,
            event: AuditKind::Inject,
            tenant: "tnt-aaaaaaaaaaaa".parse().unwrap(),
            sandbox: sandbox.clone(),
            credential_id: credential.cloned(),
            credential_name: Some("github".parse().unwrap()),
            host: "api.github.com".into(),
            method: "GET".into(),
            path: "/user".into(),
            decision: AuditDecision::Allow,
            reason: None,
        }
    }

    #[test]
    fn append_then_query_newest_first_with_filters() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path().join("audit/secrets.jsonl")).unwrap();
        let s1 = SandboxId::generate();
        let s2 = SandboxId::generate();
        let c1 = CredentialId::generate();
        for ts in 0..10 {
            let sandbox = if ts % 2 == 0 { &s1 } else { &s2 };
            log.append(&event(ts, sandbox, Some(&c1))).unwrap();
        }
        log.append(&event(10, &s1, None)).unwrap();

        let all = log
            .query(&AuditFilter {
                limit: 100,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(all.len(), 11);
        assert_eq!(all[0].ts_ms, 10);
        assert_eq!(all[10].ts_ms, 0);

        let only = log
            .query(&AuditFilter {
                sandbox: Some(s2.clone()),
                credential: Some(c1.clone()),
                since_ms: Some(4),
                limit: 2,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(only.iter().map(|e| e.ts_ms).collect::<Vec<_>>(), vec![9, 7]);
        assert!(log
            .query(&AuditFilter {
                limit: 0,
                ..Default::default()
            })
            .unwrap()
            .is_empty());

        // One JSON object per line, private file.
        let text = fs::read_to_string(log.path()).unwrap();
        assert_eq!(text.lines().count(), 11);
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            for key in [
                "ts_ms",
                "tenant",
                "sandbox",
                "credential_id",
                "credential_name",
                "host",
                "method",
                "path",
                "decision",
                "reason",
            ] {
                assert!(v.get(key).is_some(), "{key} missing in {line}");
            }
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(log.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn lines_are_bounded() {
        let mut e = event(0, &SandboxId::generate(), None);
        e.path = format!("/{}", "é".repeat(MAX_AUDIT_PATH_LEN));
        e.reason = Some("\u{1}".repeat(10 * MAX_AUDIT_REASON_LEN));
        e.method = "X".repeat(1000);
        let line = AuditLog::encode(&e).unwrap();
        assert!(line.len() <= MAX_AUDIT_LINE_LEN);
        let back: AuditEvent = serde_json::from_slice(&line).unwrap();
        assert!(back.path.len() <= MAX_AUDIT_PATH_LEN);
        assert_eq!(back.method.len(), MAX_AUDIT_METHOD_LEN);
    }

    #[test]
    fn rotation_keeps_one_previous_file_and_queries_span_both() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open_with_rotation(&path, MIN_AUDIT_ROTATE_BYTES).unwrap();
        let s = SandboxId::generate();
        let line_len = AuditLog::encode(&event(0, &s, None)).unwrap().len() as u64;
        let per_file = MIN_AUDIT_ROTATE_BYTES / line_len;
        let total = per_file * 2 + 5;
        for ts in 0..total as i64 {
            log.append(&event(ts, &s, None)).unwrap();
        }
        assert!(fs::metadata(&path).unwrap().len() <= MIN_AUDIT_ROTATE_BYTES);
        assert!(fs::metadata(log.previous_path()).unwrap().len() <= MIN_AUDIT_ROTATE_BYTES);
        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, vec!["audit.jsonl", "audit.jsonl.1"]);
        let got = log
            .query(&AuditFilter {
                limit: MAX_AUDIT_QUERY_LIMIT * 10,
                ..Default::default()
            })
            .unwrap();
        let lines_in = |p: &Path| fs::read_to_string(p).unwrap().lines().count();
        let kept = lines_in(&path) + lines_in(&log.previous_path());
        assert!(kept < total as usize);
        assert_eq!(got.len(), kept.min(MAX_AUDIT_QUERY_LIMIT));
        assert_eq!(got[0].ts_ms, total as i64 - 1);
        assert!(got.windows(2).all(|w| w[0].ts_ms > w[1].ts_ms));
    }

    #[test]
    fn torn_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&path).unwrap();
        log.append(&event(1, &SandboxId::generate(), None)).unwrap();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"ts_ms\":2,\"event\":").unwrap();
        let got = log
            .query(&AuditFilter {
                limit: 10,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(got.len(), 1);
    }
}
