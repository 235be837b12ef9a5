//! The action log: every control-plane action of a tenant (issue 12, item 6), one record per
//! action, in a hash chain per tenant so that an edited, removed or inserted record is
//! detectable by anyone who reads the log ([`verify`]), the `space audit verify` client
//! included, without trusting the server that stores it.
//!
//! Record `n` carries `hash = SHA-256(prev_hash, the record's fields)` (each field
//! length-prefixed), where `prev_hash` is record `n-1`'s hash — or, for the first record
//! kept, the [`AuditAnchor`] left by the records that aged out, or [`GENESIS_HASH`].
//! Sequence numbers are dense: a gap is a removal.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The `prev_hash` of a tenant's very first record: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One action, as the log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditRecord {
    /// Position in the tenant's chain, from 1, without gaps.
    pub seq: i64,
    /// When, ms since the Unix epoch.
    pub ts_ms: i64,
    /// The API key that acted (its id, never the key); absent for the operator's CLI and
    /// the platform's own actions (the reconciler's timeouts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_id: Option<String>,
    /// What was done: the method and route (`POST /v1/sandboxes/{id}/pause`), or a name
    /// for actions outside the API (`api_key.create`, `sandbox.timeout`).
    pub action: String,
    /// What it was done to: the request's path (`/v1/sandboxes/sbx-…/pause`) or the id
    /// it made (a create's `Location`).
    pub target: String,
    /// `ok`, or the error code the action failed with.
    pub outcome: String,
    /// The HTTP status answered (0 outside the API).
    pub status: u16,
    /// The previous record's hash.
    pub prev_hash: String,
    /// This record's hash.
    pub hash: String,
}

/// Where the kept part of a chain starts when older records aged out: the last removed
/// record's position and hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditAnchor {
    /// The last removed record's `seq`.
    pub seq: i64,
    /// Its hash.
    pub hash: String,
}

/// The hash of a record with these fields after `prev_hash`, in `tenant`'s chain.
#[allow(clippy::too_many_arguments)]
pub fn chain_hash(
    prev_hash: &str,
    tenant: &str,
    seq: i64,
    ts_ms: i64,
    api_key_id: Option<&str>,
    action: &str,
    target: &str,
    outcome: &str,
    status: u16,
) -> String {
    let mut h = Sha256::new();
    let seq = seq.to_be_bytes();
    let ts = ts_ms.to_be_bytes();
    let status = status.to_be_bytes();
    let fields: [&[u8]; 9] = [
        b"space-audit/v1",
        prev_hash.as_bytes(),
        tenant.as_bytes(),
        &seq,
        &ts,
        // Absent and empty differ.
        api_key_id.map_or(b"\x00-" as &[u8], str::as_bytes),
        action.as_bytes(),
        target.as_bytes(),
        outcome.as_bytes(),
    ];
    for f in fields {
        h.update((f.len() as u64).to_be_bytes());
        h.update(f);
    }
    h.update(status);
    hex::encode(h.finalize())
}

impl AuditRecord {
    /// The hash this record should carry in `tenant`'s chain.
    pub fn expected_hash(&self, tenant: &str) -> String {
        chain_hash(
            &self.prev_hash,
            tenant,
            self.seq,
            self.ts_ms,
            self.api_key_id.as_deref(),
            &self.action,
            &self.target,
            &self.outcome,
            self.status,
        )
    }
}

/// Why a chain does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    /// A record's position is not the one after the previous record's.
    #[error("record {found} follows record {after}: records in between are missing or reordered")]
    Gap {
        /// The previous position.
        after: i64,
        /// The position found.
        found: i64,
    },
    /// A record does not name the previous record's hash.
    #[error("record {seq} does not follow the hash of the record before it")]
    Broken {
        /// The record.
        seq: i64,
    },
    /// A record's hash is not the hash of its fields: it was edited.
    #[error("record {seq} was altered: its hash does not match its fields")]
    Altered {
        /// The record.
        seq: i64,
    },
}

/// Checks `records` (in order) as `tenant`'s chain from `anchor` (`None`: from the first
/// record ever); returns how many were checked.
pub fn verify<'a>(
    tenant: &str,
    anchor: Option<&AuditAnchor>,
    records: impl IntoIterator<Item = &'a AuditRecord>,
) -> Result<u64, ChainError> {
    let (mut seq, mut hash) = match anchor {
        Some(a) => (a.seq, a.hash.clone()),
        None => (0, GENESIS_HASH.to_owned()),
    };
    let mut n = 0;
    for r in records {
        if r.seq != seq + 1 {
            return Err(ChainError::Gap {
                after: seq,
                found: r.seq,
            });
        }
        if r.prev_hash != hash {
            return Err(ChainError::Broken { seq: r.seq });
        }
        if r.expected_hash(tenant) != r.hash {
            return Err(ChainError::Altered { seq: r.seq });
        }
        seq = r.seq;
        hash = r.hash.clone();
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(tenant: &str, n: i64) -> Vec<AuditRecord> {
        let mut prev = GENESIS_HASH.to_owned();
        (1..=n)
            .map(|seq| {
                let mut r = AuditRecord {
                    seq,
                    ts_ms: 1_000 + seq,
                    api_key_id: (seq % 2 == 0).then(|| "key-1".to_owned()),
                    action: "POST /v1/sandboxes".into(),
                    target: format!("/v1/sandboxes/sbx-{seq}"),
                    outcome: "ok".into(),
                    status: 201,
                    prev_hash: prev.clone(),
                    hash: String::new(),
                };
                r.hash = r.expected_hash(tenant);
                prev = r.hash.clone();
                r
            })
            .collect()
    }

    #[test]
    fn an_intact_chain_verifies_and_any_change_is_caught() {
        let records = chain("tnt-a", 5);
        assert_eq!(verify("tnt-a", None, &records), Ok(5));
        // Another tenant's chain is not this one's.
        assert_eq!(
            verify("tnt-b", None, &records),
            Err(ChainError::Altered { seq: 1 })
        );

        let mut edited = records.clone();
        edited[2].outcome = "forbidden".into();
        assert_eq!(
            verify("tnt-a", None, &edited),
            Err(ChainError::Altered { seq: 3 })
        );
        // Rehashing the edited record breaks the next link instead.
        edited[2].hash = edited[2].expected_hash("tnt-a");
        assert_eq!(
            verify("tnt-a", None, &edited),
            Err(ChainError::Broken { seq: 4 })
        );

        let mut removed = records.clone();
        removed.remove(1);
        assert_eq!(
            verify("tnt-a", None, &removed),
            Err(ChainError::Gap { after: 1, found: 3 })
        );
        // The last record removed: only an anchor or a count the reader knows would tell;
        // what is left still verifies.
        assert_eq!(verify("tnt-a", None, &records[..4]), Ok(4));
    }

    #[test]
    fn a_chain_whose_head_aged_out_verifies_from_its_anchor() {
        let records = chain("tnt-a", 6);
        let anchor = AuditAnchor {
            seq: 2,
            hash: records[1].hash.clone(),
        };
        assert_eq!(verify("tnt-a", Some(&anchor), &records[2..]), Ok(4));
        assert!(verify("tnt-a", None, &records[2..]).is_err());
    }

    #[test]
    fn absent_and_empty_key_ids_hash_differently() {
        let a = chain_hash(GENESIS_HASH, "t", 1, 1, None, "a", "b", "ok", 200);
        let b = chain_hash(GENESIS_HASH, "t", 1, 1, Some(""), "a", "b", "ok", 200);
        assert_ne!(a, b);
    }
}
