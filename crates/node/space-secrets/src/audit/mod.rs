//! The credential decision log: who used which credential, where, and what was decided.
//!
//! One log per tenant, one file per UTC day, JSON lines (one [`AuditEvent`] each) written in
//! one `write` at the end of the file (`O_APPEND`, mode 0600; see [`day_files`]). Nothing a
//! guest does can remove history, its tenant's or another's:
//! - a day's file is removed only once it is older than the retention
//!   ([`AuditLimits::retention_days`], the same as the action log's),
//! - a tenant's day is capped ([`AuditLimits::tenant_daily_bytes`]); past it, that tenant's
//!   credentialed requests are refused (the log fails closed, [`AuditError::TenantDayFull`])
//!   until the next day, and no other tenant notices,
//! - repeated denials of one sandbox are collapsed ([`collapse`]): the first of each kind in
//!   a window is written, the rest are counted into one line when the window ends.
//!
//! Lines are bounded ([`MAX_AUDIT_LINE_LEN`]): the path and the reason are truncated to
//! their own bounds first. Events name credentials by id and name only; values never reach
//! this module. Event kinds: `resolve` (a credential was granted for a request), `inject`
//! (its value went into the request) and `deny` (the request was refused; the credential
//! concerned, if any). A line:
//!
//! ```json
//! {"ts_ms":1700000000000,"event":"deny","tenant":"tnt-…","sandbox":"sbx-…","credential_id":"crd-…","credential_name":"github","host":"api.github.com","method":"GET","path":"/user","decision":"deny","reason":"credential expired at 1690000000000 ms"}
//! ```
//!
//! and a collapsed one adds `"repeated":41,"first_ms":…` (41 more such denials, from
//! `first_ms` to `ts_ms`). Lines are not fsynced one by one (that would put a disk flush on
//! every request); a crash may lose the last few.
//!
//! [`AuditLog::query`] reads a tenant's days newest first, each file backwards in bounded
//! chunks, and skips lines it cannot parse (a torn last line after a crash).

pub mod collapse;
mod day_files;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use space_core::id::{SandboxId, TenantId};

use crate::model::{CredentialId, CredentialName};
use crate::{fsutil, lock};
use collapse::Collapser;
use day_files::DayFiles;

/// Longest audit line, newline included.
pub const MAX_AUDIT_LINE_LEN: usize = 8 * 1024;
/// Longest path recorded (longer paths are cut at a character boundary).
pub const MAX_AUDIT_PATH_LEN: usize = 1024;
/// Longest reason recorded.
pub const MAX_AUDIT_REASON_LEN: usize = 512;
/// Longest method recorded.
pub const MAX_AUDIT_METHOD_LEN: usize = 32;
/// Most events one query returns.
pub const MAX_AUDIT_QUERY_LIMIT: usize = 1000;

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
    /// When, milliseconds since the Unix epoch (for a collapsed line: the last one's).
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
    /// A collapsed line ([`collapse`]): how many more denials like the first of its kind
    /// it stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeated: Option<u64>,
    /// A collapsed line: when the first of them was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_ms: Option<i64>,
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

/// The log's bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditLimits {
    /// Days a day's file is kept after it ends.
    pub retention_days: u64,
    /// Bytes one tenant's log may grow by in one UTC day.
    pub tenant_daily_bytes: u64,
    /// How long a sandbox's repeated denials are counted before their line is written.
    pub collapse_window: Duration,
    /// Kinds of denial a sandbox gets written one by one in a window.
    pub distinct_denials: usize,
}

impl Default for AuditLimits {
    fn default() -> Self {
        AuditLimits {
            retention_days: 365,
            tenant_daily_bytes: 256 * 1024 * 1024,
            collapse_window: Duration::from_secs(60),
            distinct_denials: 16,
        }
    }
}

/// Why the audit log failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// A file operation failed.
    #[error("audit log {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An event could not be serialised.
    #[error("audit event cannot be serialised: {0}")]
    Serialize(String),
    /// The tenant's log reached its bytes for the day.
    #[error("the tenant's credential audit log is full for today ({limit} bytes)")]
    TenantDayFull {
        /// [`AuditLimits::tenant_daily_bytes`].
        limit: u64,
    },
    /// An event's time is outside the calendar.
    #[error("event time (day {0}) is outside the calendar")]
    Clock(i64),
    /// Bad limits.
    #[error("bad audit log limits: {0}")]
    Limits(&'static str),
}

/// Cuts `s` to at most `max` bytes at a character boundary.
fn truncate(s: &mut String, max: usize) {
    let end = space_core::text::prefix_at_char_boundary(s, max).len();
    s.truncate(end);
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The audit log (see the module doc). Shareable across threads.
pub struct AuditLog {
    dir: PathBuf,
    limits: AuditLimits,
    files: Mutex<DayFiles>,
    denials: Mutex<Collapser>,
    /// The last day the retention was applied for.
    pruned_day: AtomicI64,
}

impl std::fmt::Debug for AuditLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuditLog")
            .field("dir", &self.dir)
            .field("limits", &self.limits)
            .finish()
    }
}

impl AuditLog {
    /// Opens (creating, mode 0700) the log in directory `dir` with the default limits.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, AuditError> {
        Self::open_with(dir, AuditLimits::default())
    }

    /// Opens the log with `limits`, removing days already past the retention.
    pub fn open_with(dir: impl Into<PathBuf>, limits: AuditLimits) -> Result<Self, AuditError> {
        if limits.retention_days == 0 {
            return Err(AuditError::Limits("retention_days must be at least 1"));
        }
        if limits.tenant_daily_bytes < MAX_AUDIT_LINE_LEN as u64 {
            return Err(AuditError::Limits(
                "tenant_daily_bytes must hold at least one line",
            ));
        }
        let dir = dir.into();
        fsutil::ensure_private_dir(&dir).map_err(|source| AuditError::Io {
            path: dir.clone(),
            source,
        })?;
        let log = AuditLog {
            files: Mutex::new(DayFiles::new(dir.clone(), limits.tenant_daily_bytes)),
            denials: Mutex::new(Collapser::new(
                limits.collapse_window,
                limits.distinct_denials,
            )),
            dir,
            limits,
            pruned_day: AtomicI64::new(i64::MIN),
        };
        log.prune(now_ms())?;
        Ok(log)
    }

    /// The directory of the log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The line for `event`: bounded fields, one JSON object, a newline.
    pub fn encode(event: &AuditEvent) -> Result<Vec<u8>, AuditError> {
        let mut e = event.clone();
        truncate(&mut e.path, MAX_AUDIT_PATH_LEN);
        truncate(&mut e.method, MAX_AUDIT_METHOD_LEN);
        truncate(&mut e.host, MAX_AUDIT_PATH_LEN);
        if let Some(r) = e.reason.as_mut() {
            truncate(r, MAX_AUDIT_REASON_LEN);
        }
        let mut line =
            serde_json::to_vec(&e).map_err(|err| AuditError::Serialize(err.to_string()))?;
        if line.len() >= MAX_AUDIT_LINE_LEN {
            // Escaping can only expand what we bounded above by a small factor; if that still
            // overflows, drop the free-text fields rather than the event.
            e.path = "[too long]".into();
            e.host = "[too long]".into();
            e.reason = e.reason.map(|_| "[too long]".into());
            line = serde_json::to_vec(&e).map_err(|err| AuditError::Serialize(err.to_string()))?;
        }
        line.push(b'\n');
        Ok(line)
    }

    /// Records one event: written at once, or for a repeated denial counted (see
    /// [`collapse`]); the lines of collapsed denials whose window ended are written first.
    /// An error means the event is not recorded (callers fail closed).
    pub fn append(&self, event: &AuditEvent) -> Result<(), AuditError> {
        let (ended, now) = {
            let mut denials = lock(&self.denials);
            (denials.flush_ended(event.ts_ms), denials.offer(event))
        };
        self.write_summaries(ended);
        for e in &now {
            self.write(e)?;
        }
        Ok(())
    }

    /// Collapsed lines are the log's own bookkeeping: a failure to write one is logged, and
    /// does not refuse the request at hand.
    fn write_summaries(&self, events: Vec<AuditEvent>) {
        for e in &events {
            if let Err(err) = self.write(e) {
                tracing::error!(sandbox = %e.sandbox, error = %err, "cannot write collapsed denials to the audit log");
            }
        }
    }

    fn write(&self, event: &AuditEvent) -> Result<(), AuditError> {
        let line = Self::encode(event)?;
        lock(&self.files).append(&event.tenant, event.ts_ms, &line)?;
        let day = day_files::day_of(event.ts_ms);
        if self.pruned_day.fetch_max(day, Ordering::Relaxed) < day {
            // A new day: drop the one that just passed the retention.
            if let Err(e) = self.prune(event.ts_ms) {
                tracing::warn!(error = %e, "cannot prune the credential audit log");
            }
        }
        Ok(())
    }

    /// Removes the days that ended more than the retention before `now_ms`.
    fn prune(&self, now_ms: i64) -> Result<(), AuditError> {
        self.pruned_day
            .fetch_max(day_files::day_of(now_ms), Ordering::Relaxed);
        let days = i64::try_from(self.limits.retention_days).unwrap_or(i64::MAX);
        let oldest_kept = day_files::day_of(now_ms).saturating_sub(days);
        let removed =
            day_files::prune(&self.dir, oldest_kept).map_err(|source| AuditError::Io {
                path: self.dir.clone(),
                source,
            })?;
        if removed > 0 {
            tracing::info!(
                removed,
                "credential audit log: days past the retention removed"
            );
        }
        Ok(())
    }

    /// Events matching `filter`, newest first; denials counted so far are written first, so
    /// the answer counts every one (see the module doc).
    pub fn query(&self, filter: &AuditFilter) -> Result<Vec<AuditEvent>, AuditError> {
        let pending = lock(&self.denials).flush_tenant(filter.tenant.as_ref());
        self.write_summaries(pending);
        let limit = filter.limit.min(MAX_AUDIT_QUERY_LIMIT);
        if limit == 0 {
            return Ok(Vec::new());
        }
        let io_err = |path: &Path| {
            let path = path.to_owned();
            move |source| AuditError::Io { path, source }
        };
        let tenants = match &filter.tenant {
            Some(t) => vec![t.clone()],
            None => day_files::tenants(&self.dir).map_err(io_err(&self.dir))?,
        };
        let since_day = filter.since_ms.map(day_files::day_of);
        let mut out = Vec::new();
        for tenant in &tenants {
            let mut of_tenant = Vec::new();
            let days = day_files::tenant_days(&self.dir, tenant).map_err(io_err(&self.dir))?;
            for (day, path) in days {
                if since_day.is_some_and(|s| day < s) || of_tenant.len() == limit {
                    break;
                }
                day_files::lines_backwards(&path, |line| {
                    if let Ok(e) = serde_json::from_slice::<AuditEvent>(line) {
                        if filter.accepts(&e) {
                            of_tenant.push(e);
                        }
                    }
                    if of_tenant.len() == limit {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                })
                .map_err(io_err(&path))?;
            }
            out.append(&mut of_tenant);
        }
        if tenants.len() > 1 {
            out.sort_by_key(|e| std::cmp::Reverse(e.ts_ms));
            out.truncate(limit);
        }
        Ok(out)
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
            repeated: None,
            first_ms: None,
        }
    }

    fn all(log: &AuditLog) -> Vec<AuditEvent> {
        log.query(&AuditFilter {
            limit: MAX_AUDIT_QUERY_LIMIT,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn append_then_query_newest_first_with_filters() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open(dir.path().join("audit/credentials")).unwrap();
        let s1 = SandboxId::generate();
        let s2 = SandboxId::generate();
        let c1 = CredentialId::generate();
        let now = now_ms();
        for i in 0..10 {
            let sandbox = if i % 2 == 0 { &s1 } else { &s2 };
            log.append(&event(now + i, sandbox, Some(&c1))).unwrap();
        }
        log.append(&event(now + 10, &s1, None)).unwrap();

        let got = all(&log);
        assert_eq!(got.len(), 11);
        assert_eq!(got[0].ts_ms, now + 10);
        assert_eq!(got[10].ts_ms, now);

        let only = log
            .query(&AuditFilter {
                sandbox: Some(s2.clone()),
                credential: Some(c1.clone()),
                since_ms: Some(now + 4),
                limit: 2,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            only.iter().map(|e| e.ts_ms - now).collect::<Vec<_>>(),
            vec![9, 7]
        );
        assert!(log
            .query(&AuditFilter {
                limit: 0,
                ..Default::default()
            })
            .unwrap()
            .is_empty());

        // One JSON object per line, in a private file of the tenant's own directory.
        let tenant_dir = log.dir().join("tnt-aaaaaaaaaaaa");
        let files: Vec<_> = std::fs::read_dir(&tenant_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert!(
            !files.is_empty() && files.len() <= 2,
            "one file per day: {files:?}"
        );
        let text: String = files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap())
            .collect();
        assert_eq!(text.lines().count(), 11);
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            for key in [
                "ts_ms",
                "tenant",
                "sandbox",
                "credential_id",
                "host",
                "decision",
            ] {
                assert!(v.get(key).is_some(), "{key} missing in {line}");
            }
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mode = std::fs::metadata(&tenant_dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
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
    fn a_guests_denials_cannot_push_out_history_or_other_tenants() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open_with(
            dir.path(),
            AuditLimits {
                tenant_daily_bytes: 64 * 1024,
                ..AuditLimits::default()
            },
        )
        .unwrap();
        let now = now_ms();
        let noisy = SandboxId::generate();
        let first = event(now, &noisy, None);
        log.append(&first).unwrap();
        let mut other_tenant = event(now, &SandboxId::generate(), None);
        other_tenant.tenant = TenantId::generate();
        log.append(&other_tenant).unwrap();
        // A guest denied in a loop, on ever different paths: a bounded number of lines.
        for i in 0..20_000 {
            let mut d = event(now + 1, &noisy, None);
            d.event = AuditKind::Deny;
            d.decision = AuditDecision::Deny;
            d.path = format!("/{i}");
            d.reason = Some("no credential for this host".into());
            log.append(&d).unwrap();
        }
        let got = all(&log);
        // 16 kinds one by one and one line counting the rest (flushed by the query), the
        // first event, the other tenant's.
        assert_eq!(got.len(), 16 + 1 + 2, "{got:#?}");
        let counted = got.iter().find(|e| e.repeated.is_some()).unwrap();
        assert_eq!(counted.repeated, Some(20_000 - 16));
        assert!(got.contains(&first));
        assert!(got.contains(&other_tenant));
    }

    #[test]
    fn a_full_day_refuses_that_tenant_only() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::open_with(
            dir.path(),
            AuditLimits {
                tenant_daily_bytes: MAX_AUDIT_LINE_LEN as u64,
                ..AuditLimits::default()
            },
        )
        .unwrap();
        let now = now_ms();
        let s = SandboxId::generate();
        let mut n = 0;
        let err = loop {
            match log.append(&event(now, &s, None)) {
                Ok(()) => n += 1,
                Err(e) => break e,
            }
        };
        assert!(n > 0);
        assert!(matches!(err, AuditError::TenantDayFull { .. }), "{err}");
        let mut other = event(now, &s, None);
        other.tenant = TenantId::generate();
        log.append(&other).unwrap();
        assert_eq!(all(&log).len(), n + 1, "nothing already written was lost");
    }

    #[test]
    fn days_past_the_retention_are_removed_and_torn_lines_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let limits = AuditLimits {
            retention_days: 2,
            ..AuditLimits::default()
        };
        let day = 86_400_000;
        let now = now_ms();
        {
            let log = AuditLog::open_with(dir.path(), limits.clone()).unwrap();
            for age in [5, 3, 2, 1, 0] {
                log.append(&event(now - age * day, &SandboxId::generate(), None))
                    .unwrap();
            }
        }
        // A crash mid-line in today's file.
        let tenant_dir = dir.path().join("tnt-aaaaaaaaaaaa");
        let today = tenant_dir.join(format!(
            "{}.jsonl",
            day_files::day_name(day_files::day_of(now)).unwrap()
        ));
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&today)
            .unwrap()
            .write_all(b"{\"ts_ms\":2,\"event\":")
            .unwrap();
        let log = AuditLog::open_with(dir.path(), limits).unwrap();
        let ages: Vec<i64> = all(&log).iter().map(|e| (now - e.ts_ms) / day).collect();
        assert_eq!(ages, vec![0, 1, 2], "older days went at open");
    }
}
