//! `GET /v2/sandboxes`: its query as the SDKs send it, and the page cursor.
//!
//! Both SDKs send `metadata` as **one** parameter holding a URL-encoded `k=v&k2=v2` whose
//! keys and values they percent-encoded once more, `state` comma-joined (`running,paused`),
//! `order` (`asc`|`desc` by start time), `startedAfter` (RFC 3339, inclusive), `template`,
//! `limit` and `nextToken` (not the spec's `paginationLimit`/`paginationNextToken`). The
//! next page's token goes back in the `x-next-token` header; it is an opaque keyset cursor
//! over (creation time, id), so pages stay consistent while sandboxes come and go.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use space_core::SandboxId;

use super::E2bState;

/// Header carrying the next page's token of a list.
pub const NEXT_TOKEN_HEADER: &str = "x-next-token";

/// `items` as a page: JSON, with the next page's token (if there is one) in
/// [`NEXT_TOKEN_HEADER`].
pub fn page_response<T: serde::Serialize>(
    items: Vec<T>,
    next: Option<String>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let mut response = axum::Json(items).into_response();
    if let Some(v) = next.and_then(|t| axum::http::HeaderValue::from_str(&t).ok()) {
        response.headers_mut().insert(NEXT_TOKEN_HEADER, v);
    }
    response
}

/// Default page size (the Python SDK's).
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page.
pub const MAX_LIMIT: usize = 1000;
/// Most metadata pairs a filter may name.
pub const MAX_METADATA_FILTERS: usize = 64;

/// The order of a list, by start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Order {
    /// Oldest first.
    Asc,
    /// Newest first (the default).
    #[default]
    Desc,
}

/// A parsed list query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Every pair must match the sandbox's metadata.
    pub metadata: BTreeMap<String, String>,
    /// Only these states; empty: both.
    pub states: Vec<E2bState>,
    /// Only sandboxes started at or after this time, ms since the Unix epoch.
    pub started_after_ms: Option<i64>,
    /// Only sandboxes of this template.
    pub template: Option<String>,
    /// By start time, ascending or descending.
    pub order: Order,
    /// Page size.
    pub limit: usize,
    /// Continue after this sandbox.
    pub after: Option<Cursor>,
}

/// Where a page ends: the last sandbox's creation time and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// Its creation time, ms since the Unix epoch.
    pub created_at_ms: i64,
    /// Its id.
    pub id: SandboxId,
}

impl Cursor {
    /// The opaque token.
    pub fn encode(&self) -> String {
        URL_SAFE_NO_PAD.encode(format!("{}/{}", self.created_at_ms, self.id))
    }

    /// Reads a token made by [`Cursor::encode`].
    pub fn decode(token: &str) -> Option<Cursor> {
        let raw = URL_SAFE_NO_PAD.decode(token.trim().as_bytes()).ok()?;
        let text = std::str::from_utf8(&raw).ok()?;
        let (ms, id) = text.split_once('/')?;
        Some(Cursor {
            created_at_ms: ms.parse().ok()?,
            id: id.parse().ok()?,
        })
    }

    /// Whether a sandbox created at `created_at_ms` with `id` comes after the cursor in a
    /// list ordered by `order` (by creation time, then by id).
    pub fn precedes(&self, order: Order, created_at_ms: i64, id: &SandboxId) -> bool {
        let item = (created_at_ms, id.as_str());
        let cursor = (self.created_at_ms, self.id.as_str());
        match order {
            Order::Desc => item < cursor,
            Order::Asc => item > cursor,
        }
    }
}

impl ListQuery {
    /// Whether a sandbox with these properties belongs in the list (the cursor aside).
    pub fn selects(
        &self,
        created_at_ms: i64,
        template: &str,
        labels: &BTreeMap<String, String>,
        state: E2bState,
    ) -> bool {
        (self.states.is_empty() || self.states.contains(&state))
            && self.started_after_ms.is_none_or(|t| created_at_ms >= t)
            && self.template.as_ref().is_none_or(|t| t == template)
            && self.metadata.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// Parses the query string's pairs (already URL-decoded once, as the web framework does).
/// Errors name the parameter, for a `400`.
pub fn parse(pairs: &[(String, String)]) -> Result<ListQuery, String> {
    let mut q = ListQuery {
        metadata: BTreeMap::new(),
        states: Vec::new(),
        started_after_ms: None,
        template: None,
        order: Order::Desc,
        limit: DEFAULT_LIMIT,
        after: None,
    };
    for (key, value) in pairs {
        match key.as_str() {
            "metadata" => {
                for (k, v) in form_urlencoded::parse(value.as_bytes()) {
                    let (k, v) = (unescape(&k)?, unescape(&v)?);
                    if k.is_empty() {
                        return Err("metadata: an empty key".into());
                    }
                    q.metadata.insert(k, v);
                }
                if q.metadata.len() > MAX_METADATA_FILTERS {
                    return Err(format!("metadata: at most {MAX_METADATA_FILTERS} pairs"));
                }
            }
            "state" => {
                for s in value.split(',').filter(|s| !s.is_empty()) {
                    q.states.push(match s {
                        "running" => E2bState::Running,
                        "paused" => E2bState::Paused,
                        other => return Err(format!("state: unknown state {other:?}")),
                    });
                }
            }
            "limit" => {
                q.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|l| (1..=MAX_LIMIT).contains(l))
                    .ok_or_else(|| format!("limit: want 1 to {MAX_LIMIT}"))?;
            }
            "nextToken" => {
                if !value.is_empty() {
                    q.after = Some(
                        Cursor::decode(value).ok_or("nextToken: not a token this server made")?,
                    );
                }
            }
            "order" => {
                q.order = match value.as_str() {
                    "asc" => Order::Asc,
                    "desc" => Order::Desc,
                    other => return Err(format!("order: want asc or desc, got {other:?}")),
                }
            }
            "startedAfter" => {
                q.started_after_ms = Some(
                    crate::timestamp::parse_rfc3339_ms(value)
                        .ok_or("startedAfter: not an RFC 3339 time")?,
                );
            }
            "template" => q.template = Some(value.clone()),
            // Filters this server does not know are refused rather than ignored, so a
            // caller never gets more than it asked for.
            other => return Err(format!("{other}: not supported")),
        }
    }
    Ok(q)
}

/// One more percent-decoding of a metadata key or value.
fn unescape(s: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| "metadata: not UTF-8 once decoded".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn queries_parse_as_the_sdks_send_them() {
        // What the SDKs send for {"user": "alice", "env": "a&b", "a b": "c"}.
        let q = parse(&pairs(&[
            ("metadata", "user=alice&env=a%2526b&a%2520b=c"),
            ("state", "running,paused"),
            ("limit", "10"),
            ("order", "asc"),
            ("startedAfter", "2025-11-29T12:00:00.5+01:00"),
            ("template", "base"),
        ]))
        .unwrap();
        assert_eq!(q.metadata["user"], "alice");
        assert_eq!(q.metadata["env"], "a&b");
        assert_eq!(q.metadata["a b"], "c");
        assert_eq!(q.order, Order::Asc);
        assert_eq!(q.started_after_ms, Some(1_764_414_000_500));
        assert_eq!(q.template.as_deref(), Some("base"));
        assert_eq!(q.states, vec![E2bState::Running, E2bState::Paused]);
        assert_eq!(q.limit, 10);
        let empty = parse(&[]).unwrap();
        assert_eq!(
            (empty.limit, empty.states.len(), empty.after),
            (DEFAULT_LIMIT, 0, None)
        );
        for bad in [
            pairs(&[("limit", "0")]),
            pairs(&[("limit", "100000")]),
            pairs(&[("state", "deleted")]),
            pairs(&[("nextToken", "garbage!")]),
            pairs(&[("metadata", "=v")]),
            pairs(&[("order", "sideways")]),
            pairs(&[("startedAfter", "yesterday")]),
            pairs(&[("owner", "me")]),
        ] {
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn queries_select_by_every_filter() {
        let q = parse(&pairs(&[
            ("metadata", "a=1"),
            ("state", "running"),
            ("startedAfter", "1970-01-01T00:00:01Z"),
            ("template", "base"),
        ]))
        .unwrap();
        let labels: BTreeMap<String, String> = [("a".into(), "1".into())].into();
        assert!(q.selects(1_000, "base", &labels, E2bState::Running));
        assert!(!q.selects(999, "base", &labels, E2bState::Running));
        assert!(!q.selects(1_000, "other", &labels, E2bState::Running));
        assert!(!q.selects(1_000, "base", &BTreeMap::new(), E2bState::Running));
        assert!(!q.selects(1_000, "base", &labels, E2bState::Paused));
    }

    #[test]
    fn cursors_round_trip_and_order_newest_first() {
        let c = Cursor {
            created_at_ms: 1_000,
            id: "sbx-bbbbbbbbbbbbbbbbbbbb".parse().unwrap(),
        };
        assert_eq!(Cursor::decode(&c.encode()), Some(c.clone()));
        let q = parse(&pairs(&[("nextToken", &c.encode())])).unwrap();
        assert_eq!(q.after, Some(c.clone()));
        let older: SandboxId = "sbx-zzzzzzzzzzzzzzzzzzzz".parse().unwrap();
        let same_time_lower: SandboxId = "sbx-aaaaaaaaaaaaaaaaaaaa".parse().unwrap();
        assert!(c.precedes(Order::Desc, 999, &older));
        assert!(c.precedes(Order::Desc, 1_000, &same_time_lower));
        assert!(
            !c.precedes(Order::Desc, 1_000, &c.id),
            "the cursor's own sandbox is not repeated"
        );
        assert!(!c.precedes(Order::Desc, 1_001, &older));
        assert!(c.precedes(Order::Asc, 1_001, &older));
        assert!(!c.precedes(Order::Asc, 1_000, &c.id));
    }
}
