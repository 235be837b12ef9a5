//! A sandbox's logs, as E2B serves them, from what SPACE records of a sandbox: its
//! lifecycle log (every transition with its time and details: created, paused, restored
//! after a crash…). `GET /v2/sandboxes/{id}/logs` pages through it by time; the older
//! `GET /sandboxes/{id}/logs` returns the lines and the entries together. Pure mapping
//! ([`entries`]) apart from the handlers.

use axum::extract::{Path, State};
use axum::http::Uri;
use axum::Json;
use serde::Serialize;
use serde_json::{json, Value};
use space_control::service::lifecycle;
use space_control::service::Caller;
use space_core::LifecycleEntry;

use super::error::{RestError, RestResult};
use super::sandboxes::sandbox_id;
use crate::state::E2bState;
use crate::timestamp::rfc3339;

/// Entries a page holds at most (E2B's limit), and by default.
pub const MAX_LOG_LIMIT: usize = 1000;

/// One log entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogEntry {
    /// When, RFC 3339.
    pub timestamp: String,
    /// What happened.
    pub message: String,
    /// `info`, or `warn` for failures and crash restores.
    pub level: &'static str,
    /// The transition's parts.
    pub fields: Value,
}

/// One log line (the older shape).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogLine {
    /// When, RFC 3339.
    pub timestamp: String,
    /// The line.
    pub line: String,
}

/// What to page through: newest or oldest first, from a time, matching a text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogQuery {
    /// Only entries after this time (forward) or before it (backward), ms.
    pub cursor_ms: Option<i64>,
    /// Page size.
    pub limit: usize,
    /// Newest first.
    pub backward: bool,
    /// Only `warn` and worse.
    pub warnings_only: bool,
    /// Only entries whose message contains this.
    pub search: Option<String>,
}

fn level(e: &LifecycleEntry) -> &'static str {
    use space_core::SandboxState;
    let broke = e.to == SandboxState::Failed || e.from == SandboxState::Restoring;
    if broke {
        "warn"
    } else {
        "info"
    }
}

/// The E2B entries of a lifecycle log, selected by `q`.
pub fn entries(log: &[LifecycleEntry], q: &LogQuery) -> Vec<LogEntry> {
    let mut selected: Vec<&LifecycleEntry> = log
        .iter()
        .filter(|e| match (q.cursor_ms, q.backward) {
            (Some(c), false) => e.at_ms > c,
            (Some(c), true) => e.at_ms < c,
            (None, _) => true,
        })
        .collect();
    if q.backward {
        selected.reverse();
    }
    selected
        .into_iter()
        .map(|e| {
            let message = match &e.detail {
                Some(d) => format!("{} → {} ({}): {d}", e.from, e.to, e.event),
                None => format!("{} → {} ({})", e.from, e.to, e.event),
            };
            LogEntry {
                timestamp: rfc3339(e.at_ms),
                level: level(e),
                fields: json!({
                    "event": e.event,
                    "from": e.from,
                    "to": e.to,
                    "detail": e.detail,
                }),
                message,
            }
        })
        .filter(|e| !q.warnings_only || e.level == "warn")
        .filter(|e| {
            q.search
                .as_ref()
                .is_none_or(|s| e.message.contains(s.as_str()))
        })
        .take(q.limit)
        .collect()
}

/// Parses the query of either logs endpoint.
fn parse(uri: &Uri) -> RestResult<LogQuery> {
    let mut q = LogQuery {
        limit: MAX_LOG_LIMIT,
        ..LogQuery::default()
    };
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        let bad = |what: &str| RestError::bad_request(format!("{k}: {what}"));
        match &*k {
            "cursor" | "start" => {
                q.cursor_ms = Some(v.parse().map_err(|_| bad("want ms since the epoch"))?)
            }
            "limit" => {
                q.limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|l| (1..=MAX_LOG_LIMIT).contains(l))
                    .ok_or_else(|| bad(&format!("want 1 to {MAX_LOG_LIMIT}")))?
            }
            "direction" => {
                q.backward = match &*v {
                    "forward" => false,
                    "backward" => true,
                    _ => return Err(bad("want forward or backward")),
                }
            }
            "level" => {
                q.warnings_only = match &*v {
                    "debug" | "info" => false,
                    "warn" | "error" => true,
                    _ => return Err(bad("want debug, info, warn or error")),
                }
            }
            "search" => q.search = Some(v.into_owned()),
            _ => return Err(bad("not supported")),
        }
    }
    Ok(q)
}

async fn lifecycle_log(
    st: &E2bState,
    tenant: Caller,
    raw: &str,
) -> RestResult<Vec<LifecycleEntry>> {
    let id = sandbox_id(raw)?;
    Ok(lifecycle::event_log(&st.app, &tenant.id, &id).await?)
}

/// `GET /v2/sandboxes/{id}/logs`.
pub async fn v2(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    uri: Uri,
) -> RestResult<Json<Value>> {
    let q = parse(&uri)?;
    let log = lifecycle_log(&st, tenant, &raw).await?;
    Ok(Json(json!({ "logs": entries(&log, &q) })))
}

/// `GET /sandboxes/{id}/logs` (deprecated).
pub async fn v1(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    uri: Uri,
) -> RestResult<Json<Value>> {
    let q = parse(&uri)?;
    let log = lifecycle_log(&st, tenant, &raw).await?;
    let entries = entries(&log, &q);
    let lines: Vec<LogLine> = entries
        .iter()
        .map(|e| LogLine {
            timestamp: e.timestamp.clone(),
            line: e.message.clone(),
        })
        .collect();
    Ok(Json(json!({ "logs": lines, "logEntries": entries })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_core::{SandboxEvent, SandboxId, SandboxState};

    fn entry(at_ms: i64, to: SandboxState, detail: Option<&str>) -> LifecycleEntry {
        LifecycleEntry {
            sandbox_id: SandboxId::generate(),
            at_ms,
            event: SandboxEvent::Ready,
            from: SandboxState::Creating,
            to,
            detail: detail.map(str::to_owned),
        }
    }

    #[test]
    fn lifecycle_entries_page_by_time_and_filter() {
        let log = vec![
            entry(1_000, SandboxState::Running, None),
            entry(2_000, SandboxState::Failed, Some("VM exited")),
            entry(3_000, SandboxState::Running, None),
        ];
        let all = entries(
            &log,
            &LogQuery {
                limit: 10,
                ..Default::default()
            },
        );
        assert_eq!(all.len(), 3);
        assert_eq!(all[1].level, "warn");
        assert!(all[1].message.contains("VM exited"));
        let later = entries(
            &log,
            &LogQuery {
                limit: 10,
                cursor_ms: Some(1_000),
                ..Default::default()
            },
        );
        assert_eq!(later.len(), 2);
        let back = entries(
            &log,
            &LogQuery {
                limit: 1,
                cursor_ms: Some(3_000),
                backward: true,
                ..Default::default()
            },
        );
        assert_eq!(back[0].timestamp, rfc3339(2_000));
        let warn = entries(
            &log,
            &LogQuery {
                limit: 10,
                warnings_only: true,
                ..Default::default()
            },
        );
        assert_eq!(warn.len(), 1);
        let found = entries(
            &log,
            &LogQuery {
                limit: 10,
                search: Some("exited".into()),
                ..Default::default()
            },
        );
        assert_eq!(found.len(), 1);
    }
}
