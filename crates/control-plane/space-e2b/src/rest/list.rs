//! `GET /v2/sandboxes`: its query as the SDKs send it, and the page cursor.
//!
//! Both SDKs send `metadata` as **one** parameter holding a URL-encoded `k=v&k2=v2`, `state`
//! comma-joined (`running,paused`), `limit` and `nextToken` (not the spec's
//! `paginationLimit`/`paginationNextToken`). The next page's token goes back in the
//! `x-next-token` header; it is an opaque keyset cursor over (creation time, id), newest
//! first, so pages stay consistent while sandboxes come and go.

use std::collections::BTreeMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use space_core::SandboxId;

use super::E2bState;

/// Default page size (the Python SDK's).
pub const DEFAULT_LIMIT: usize = 100;
/// Largest page.
pub const MAX_LIMIT: usize = 1000;
/// Most metadata pairs a filter may name.
pub const MAX_METADATA_FILTERS: usize = 64;

/// A parsed list query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Every pair must match the sandbox's metadata.
    pub metadata: BTreeMap<String, String>,
    /// Only these states; empty: both.
    pub states: Vec<E2bState>,
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

    /// Whether a sandbox created at `created_at_ms` with `id` comes after the cursor in the
    /// list's order (newest first, then by id).
    pub fn precedes(&self, created_at_ms: i64, id: &SandboxId) -> bool {
        (created_at_ms, id.as_str()) < (self.created_at_ms, self.id.as_str())
    }
}

/// Parses the query string's pairs (already URL-decoded once, as the web framework does).
/// Errors name the parameter, for a `400`.
pub fn parse(pairs: &[(String, String)]) -> Result<ListQuery, String> {
    let mut q = ListQuery {
        metadata: BTreeMap::new(),
        states: Vec::new(),
        limit: DEFAULT_LIMIT,
        after: None,
    };
    for (key, value) in pairs {
        match key.as_str() {
            "metadata" => {
                for (k, v) in form_urlencoded::parse(value.as_bytes()) {
                    if k.is_empty() {
                        return Err("metadata: an empty key".into());
                    }
                    q.metadata.insert(k.into_owned(), v.into_owned());
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
            // Filters the SDKs may send that narrow nothing here yet are refused rather
            // than ignored, so a caller never gets more than it asked for.
            other => return Err(format!("{other}: not supported")),
        }
    }
    Ok(q)
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
        let q = parse(&pairs(&[
            ("metadata", "user=alice&env=a%26b"),
            ("state", "running,paused"),
            ("limit", "10"),
        ]))
        .unwrap();
        assert_eq!(q.metadata["user"], "alice");
        assert_eq!(q.metadata["env"], "a&b");
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
            pairs(&[("template", "base")]),
        ] {
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
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
        assert!(c.precedes(999, &older));
        assert!(c.precedes(1_000, &same_time_lower));
        assert!(
            !c.precedes(1_000, &c.id),
            "the cursor's own sandbox is not repeated"
        );
        assert!(!c.precedes(1_001, &older));
    }
}
