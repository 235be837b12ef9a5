//! Repeated denials of one sandbox, collapsed (pure logic, no I/O): a guest that makes the
//! gateway refuse it in a loop must not fill its tenant's log, nor bury what came before.
//!
//! Per sandbox, a window opens at its first denial and lasts [`Collapser::new`]'s `window`.
//! In it, the first denial of each kind (credential, host, method, path, reason) is written
//! as it happens, up to `distinct` kinds; every further one is counted. When the window ends
//! (noticed at the next event or query), one line per kind that was counted says how many
//! more there were (`repeated`, from `first_ms` to `ts_ms`), and one line counts the denials
//! of kinds past `distinct`. A sandbox therefore writes at most `2 × distinct + 1` denial
//! lines per window, whatever it sends.

use std::collections::HashMap;
use std::time::Duration;

use space_core::id::{SandboxId, TenantId};

use super::{AuditEvent, AuditKind};
use crate::model::CredentialId;

/// What makes two denials "the same".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct DenialKind {
    credential: Option<CredentialId>,
    host: String,
    method: String,
    path: String,
    reason: Option<String>,
}

impl DenialKind {
    fn of(e: &AuditEvent) -> Self {
        DenialKind {
            credential: e.credential_id.clone(),
            host: e.host.clone(),
            method: e.method.clone(),
            path: e.path.clone(),
            reason: e.reason.clone(),
        }
    }
}

/// Denials counted, not yet written.
#[derive(Debug)]
struct Counted {
    /// The line the summary is made from.
    template: AuditEvent,
    count: u64,
    first_ms: i64,
    last_ms: i64,
}

impl Counted {
    fn new(template: AuditEvent) -> Self {
        let ts = template.ts_ms;
        Counted {
            template,
            count: 0,
            first_ms: ts,
            last_ms: ts,
        }
    }

    fn add(&mut self, ts_ms: i64) {
        if self.count == 0 {
            self.first_ms = ts_ms;
        }
        self.count += 1;
        self.last_ms = self.last_ms.max(ts_ms);
    }

    fn summary(self) -> Option<AuditEvent> {
        (self.count > 0).then_some(AuditEvent {
            ts_ms: self.last_ms,
            repeated: Some(self.count),
            first_ms: Some(self.first_ms),
            ..self.template
        })
    }
}

/// One sandbox's open window.
#[derive(Debug)]
struct Window {
    tenant: TenantId,
    ends_ms: i64,
    kinds: HashMap<DenialKind, Counted>,
    /// Denials of kinds past the window's `distinct`.
    other: Option<Counted>,
}

impl Window {
    fn close(self) -> Vec<AuditEvent> {
        let mut out: Vec<AuditEvent> = self
            .kinds
            .into_values()
            .filter_map(Counted::summary)
            .chain(self.other.and_then(Counted::summary))
            .collect();
        out.sort_by_key(|e| e.ts_ms);
        out
    }
}

/// Reason of the line that counts denials of kinds past the per-window bound.
pub const OTHER_DENIALS: &str =
    "denials of more kinds than are logged one by one in a window (counted here)";

/// The open windows of every sandbox (see the module doc).
#[derive(Debug)]
pub struct Collapser {
    window_ms: i64,
    distinct: usize,
    windows: HashMap<SandboxId, Window>,
    /// The earliest end of an open window (nothing to flush before it).
    next_end_ms: Option<i64>,
}

impl Collapser {
    /// Windows of `window`, `distinct` kinds written one by one in each (at least one).
    pub fn new(window: Duration, distinct: usize) -> Self {
        Collapser {
            window_ms: i64::try_from(window.as_millis()).unwrap_or(i64::MAX).max(1),
            distinct: distinct.max(1),
            windows: HashMap::new(),
            next_end_ms: None,
        }
    }

    /// Windows open now.
    pub fn open_windows(&self) -> usize {
        self.windows.len()
    }

    /// Takes a denial: what to write now, in order (the summaries of a window of its
    /// sandbox that has ended, then the denial itself if it is the first of its kind).
    /// Events that are not denials are returned as they are.
    pub fn offer(&mut self, e: &AuditEvent) -> Vec<AuditEvent> {
        if e.event != AuditKind::Deny {
            return vec![e.clone()];
        }
        let mut out = Vec::new();
        if self
            .windows
            .get(&e.sandbox)
            .is_some_and(|w| e.ts_ms >= w.ends_ms)
        {
            if let Some(w) = self.windows.remove(&e.sandbox) {
                out.extend(w.close());
            }
        }
        let ends_ms = e.ts_ms.saturating_add(self.window_ms);
        let window = self
            .windows
            .entry(e.sandbox.clone())
            .or_insert_with(|| Window {
                tenant: e.tenant.clone(),
                ends_ms,
                kinds: HashMap::new(),
                other: None,
            });
        let ends = window.ends_ms;
        let kind = DenialKind::of(e);
        if let Some(counted) = window.kinds.get_mut(&kind) {
            counted.add(e.ts_ms);
        } else if window.kinds.len() < self.distinct {
            window.kinds.insert(kind, Counted::new(e.clone()));
            out.push(e.clone());
        } else {
            window
                .other
                .get_or_insert_with(|| {
                    Counted::new(AuditEvent {
                        credential_id: None,
                        credential_name: None,
                        host: "*".into(),
                        method: "*".into(),
                        path: "*".into(),
                        reason: Some(OTHER_DENIALS.into()),
                        ..e.clone()
                    })
                })
                .add(e.ts_ms);
        }
        self.next_end_ms = Some(self.next_end_ms.map_or(ends, |n| n.min(ends)));
        out
    }

    /// The summaries of every window that has ended by `now_ms`, oldest first.
    pub fn flush_ended(&mut self, now_ms: i64) -> Vec<AuditEvent> {
        if self.next_end_ms.is_none_or(|end| now_ms < end) {
            return Vec::new();
        }
        self.flush_where(|w| now_ms >= w.ends_ms)
    }

    /// The summaries of every open window of `tenant` (all tenants: `None`), ended or not,
    /// oldest first: a query shows every denial counted so far.
    pub fn flush_tenant(&mut self, tenant: Option<&TenantId>) -> Vec<AuditEvent> {
        self.flush_where(|w| tenant.is_none_or(|t| &w.tenant == t))
    }

    fn flush_where(&mut self, ends: impl Fn(&Window) -> bool) -> Vec<AuditEvent> {
        let ended: Vec<SandboxId> = self
            .windows
            .iter()
            .filter(|(_, w)| ends(w))
            .map(|(id, _)| id.clone())
            .collect();
        let mut out: Vec<AuditEvent> = ended
            .iter()
            .filter_map(|id| self.windows.remove(id))
            .flat_map(Window::close)
            .collect();
        out.sort_by_key(|e| e.ts_ms);
        self.next_end_ms = self.windows.values().map(|w| w.ends_ms).min();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::AuditDecision;

    fn denial(sandbox: &SandboxId, ts_ms: i64, path: &str) -> AuditEvent {
        AuditEvent {
            ts_ms,
            event: AuditKind::Deny,
            tenant: "tnt-aaaaaaaaaaaa".parse().unwrap(),
            sandbox: sandbox.clone(),
            credential_id: None,
            credential_name: None,
            host: "api.example.com".into(),
            method: "GET".into(),
            path: path.into(),
            decision: AuditDecision::Deny,
            reason: Some("placeholder in a header its rule does not name".into()),
            repeated: None,
            first_ms: None,
        }
    }

    #[test]
    fn the_first_of_a_kind_is_written_and_the_rest_counted_into_one_line() {
        let mut c = Collapser::new(Duration::from_secs(60), 4);
        let s = SandboxId::generate();
        assert_eq!(c.offer(&denial(&s, 1_000, "/a")).len(), 1);
        for ts in 1_001..1_101 {
            assert!(c.offer(&denial(&s, ts, "/a")).is_empty());
        }
        assert!(c.flush_ended(60_999).is_empty(), "the window is still open");
        let summary = c.flush_ended(61_000);
        assert_eq!(summary.len(), 1);
        assert_eq!(
            (summary[0].repeated, summary[0].first_ms, summary[0].ts_ms),
            (Some(100), Some(1_001), 1_100)
        );
        assert_eq!(c.open_windows(), 0);
        // A new window: the same denial is written again.
        assert_eq!(c.offer(&denial(&s, 70_000, "/a")).len(), 1);
    }

    #[test]
    fn a_sandbox_writes_a_bounded_number_of_lines_whatever_it_sends() {
        let mut c = Collapser::new(Duration::from_secs(60), 4);
        let s = SandboxId::generate();
        let mut written = 0;
        for i in 0..10_000i64 {
            written += c.offer(&denial(&s, i, &format!("/{i}"))).len();
        }
        assert_eq!(written, 4, "four kinds one by one");
        // The next denial after the window closes it: its summaries come first.
        let out = c.offer(&denial(&s, 60_000, "/new"));
        let other: Vec<_> = out
            .iter()
            .filter(|e| e.reason.as_deref() == Some(OTHER_DENIALS))
            .collect();
        assert_eq!(other.len(), 1);
        assert_eq!(other[0].repeated, Some(9_996));
        assert_eq!(other[0].path, "*");
        assert_eq!(out.last().unwrap().path, "/new");
        assert!(out.last().unwrap().repeated.is_none());
    }

    #[test]
    fn sandboxes_and_allowed_events_are_apart() {
        let mut c = Collapser::new(Duration::from_secs(60), 1);
        let (a, b) = (SandboxId::generate(), SandboxId::generate());
        assert_eq!(c.offer(&denial(&a, 0, "/")).len(), 1);
        assert_eq!(c.offer(&denial(&b, 0, "/")).len(), 1, "another sandbox");
        let mut allowed = denial(&a, 1, "/");
        allowed.event = AuditKind::Inject;
        allowed.decision = AuditDecision::Allow;
        for _ in 0..3 {
            assert_eq!(c.offer(&allowed).len(), 1, "never collapsed");
        }
        assert!(c.offer(&denial(&a, 2, "/")).is_empty());
        // A query flushes the tenant's windows before they end.
        let flushed = c.flush_tenant(Some(&allowed.tenant));
        assert_eq!(flushed.len(), 1);
        assert_eq!(flushed[0].sandbox, a);
        assert_eq!(c.open_windows(), 0);
    }
}
