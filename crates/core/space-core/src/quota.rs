//! Per-tenant quotas and request rates (issue 12, item 5): what one tenant may hold at once
//! (sandboxes, vCPUs, memory, snapshot bytes, credentials, concurrent diffs, open egress
//! connections) and how fast
//! each of its API keys may call. The operator sets defaults for every tenant
//! (`space server --default-quota FILE`, or the embedded [`TenantQuota::embedded_default`]);
//! a tenant's own quota, set through the admin API, overrides them field by field.
//!
//! The checks are pure ([`QuotaUsage::admit`]); the control plane feeds them what the tenant
//! holds and what a request would add, and answers `403 quota_exceeded` naming the limit.

use serde::{Deserialize, Serialize};

/// Limits, each optional (absent: the operator's default; absent there too: unlimited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TenantQuota {
    /// Sandboxes that exist at once (running, paused or stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sandboxes: Option<u64>,
    /// vCPUs of those sandboxes, summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_vcpus: Option<u64>,
    /// Memory of those sandboxes, MiB, summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory_mib: Option<u64>,
    /// Bytes of the tenant's snapshots and checkpoints on the store (their logical size,
    /// counted when a snapshot is taken, from the size it will have).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_snapshot_bytes: Option<u64>,
    /// Credentials stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_credentials: Option<u64>,
    /// Snapshot diffs computed at once (each reads two disks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_diffs: Option<u64>,
    /// Egress connections its sandboxes hold open at once, on each node (the gateway
    /// refuses more; each sandbox also has its own cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u64>,
    /// Requests per second each API key may make (sustained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_sec: Option<u64>,
    /// Requests an API key may make at once above that rate (the bucket's size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_burst: Option<u64>,
}

/// Which limit a request would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum QuotaLimit {
    /// [`TenantQuota::max_sandboxes`].
    Sandboxes,
    /// [`TenantQuota::max_vcpus`].
    Vcpus,
    /// [`TenantQuota::max_memory_mib`].
    MemoryMib,
    /// [`TenantQuota::max_snapshot_bytes`].
    SnapshotBytes,
    /// [`TenantQuota::max_credentials`].
    Credentials,
    /// [`TenantQuota::max_concurrent_diffs`].
    ConcurrentDiffs,
}

impl QuotaLimit {
    /// The field's name in a [`TenantQuota`].
    pub fn field(self) -> &'static str {
        match self {
            QuotaLimit::Sandboxes => "max_sandboxes",
            QuotaLimit::Vcpus => "max_vcpus",
            QuotaLimit::MemoryMib => "max_memory_mib",
            QuotaLimit::SnapshotBytes => "max_snapshot_bytes",
            QuotaLimit::Credentials => "max_credentials",
            QuotaLimit::ConcurrentDiffs => "max_concurrent_diffs",
        }
    }
}

/// A request that would pass a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the tenant's quota {} is {max}; {used} in use, and this asks for {asked} more", .limit.field())]
pub struct QuotaExceeded {
    /// Which limit.
    pub limit: QuotaLimit,
    /// Its value.
    pub max: u64,
    /// What the tenant holds.
    pub used: u64,
    /// What the request adds.
    pub asked: u64,
}

impl TenantQuota {
    /// The operator's defaults when none are configured: generous for one node, but a
    /// bound on every resource a tenant can take.
    pub fn embedded_default() -> TenantQuota {
        TenantQuota {
            max_sandboxes: Some(100),
            max_vcpus: Some(200),
            max_memory_mib: Some(256 * 1024),
            max_snapshot_bytes: Some(1024 * 1024 * 1024 * 1024),
            max_credentials: Some(1000),
            max_concurrent_diffs: Some(4),
            max_connections: Some(2048),
            requests_per_sec: Some(1000),
            request_burst: Some(2000),
        }
    }

    /// This quota's fields, each falling back to `defaults`'.
    pub fn over(self, defaults: &TenantQuota) -> TenantQuota {
        TenantQuota {
            max_sandboxes: self.max_sandboxes.or(defaults.max_sandboxes),
            max_vcpus: self.max_vcpus.or(defaults.max_vcpus),
            max_memory_mib: self.max_memory_mib.or(defaults.max_memory_mib),
            max_snapshot_bytes: self.max_snapshot_bytes.or(defaults.max_snapshot_bytes),
            max_credentials: self.max_credentials.or(defaults.max_credentials),
            max_concurrent_diffs: self.max_concurrent_diffs.or(defaults.max_concurrent_diffs),
            max_connections: self.max_connections.or(defaults.max_connections),
            requests_per_sec: self.requests_per_sec.or(defaults.requests_per_sec),
            request_burst: self.request_burst.or(defaults.request_burst),
        }
    }

    /// The value of `limit` (`None`: unlimited).
    pub fn limit(&self, limit: QuotaLimit) -> Option<u64> {
        match limit {
            QuotaLimit::Sandboxes => self.max_sandboxes,
            QuotaLimit::Vcpus => self.max_vcpus,
            QuotaLimit::MemoryMib => self.max_memory_mib,
            QuotaLimit::SnapshotBytes => self.max_snapshot_bytes,
            QuotaLimit::Credentials => self.max_credentials,
            QuotaLimit::ConcurrentDiffs => self.max_concurrent_diffs,
        }
    }

    /// Checks what can be checked alone: a rate needs a burst of at least one.
    pub fn validate(&self) -> Result<(), String> {
        if self.requests_per_sec == Some(0) {
            return Err(
                "requests_per_sec must be at least 1 (leave it out for the default)".into(),
            );
        }
        if self.request_burst == Some(0) {
            return Err("request_burst must be at least 1".into());
        }
        if self.max_connections == Some(0) {
            return Err(
                "max_connections must be at least 1 (an egress policy is the way to allow none)"
                    .into(),
            );
        }
        Ok(())
    }
}

/// What a tenant holds, in the units of its limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaUsage {
    /// Sandboxes.
    pub sandboxes: u64,
    /// vCPUs.
    pub vcpus: u64,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Snapshot bytes.
    pub snapshot_bytes: u64,
    /// Credentials.
    pub credentials: u64,
}

impl QuotaUsage {
    /// What `limit` is measured on.
    pub fn used(&self, limit: QuotaLimit) -> u64 {
        match limit {
            QuotaLimit::Sandboxes => self.sandboxes,
            QuotaLimit::Vcpus => self.vcpus,
            QuotaLimit::MemoryMib => self.memory_mib,
            QuotaLimit::SnapshotBytes => self.snapshot_bytes,
            QuotaLimit::Credentials => self.credentials,
            QuotaLimit::ConcurrentDiffs => 0,
        }
    }

    /// Whether adding `asked` of each limit (pairs) stays within `quota`; the first limit
    /// passed otherwise.
    pub fn admit(
        &self,
        quota: &TenantQuota,
        asked: &[(QuotaLimit, u64)],
    ) -> Result<(), QuotaExceeded> {
        for &(limit, asked) in asked {
            let Some(max) = quota.limit(limit) else {
                continue;
            };
            let used = self.used(limit);
            if used.saturating_add(asked) > max {
                return Err(QuotaExceeded {
                    limit,
                    max,
                    used,
                    asked,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_quota_overrides_the_defaults_field_by_field() {
        let defaults = TenantQuota::embedded_default();
        let own = TenantQuota {
            max_sandboxes: Some(2),
            ..Default::default()
        };
        let q = own.over(&defaults);
        assert_eq!(q.max_sandboxes, Some(2));
        assert_eq!(q.max_vcpus, defaults.max_vcpus);
        assert_eq!(
            TenantQuota::default()
                .over(&TenantQuota::default())
                .max_vcpus,
            None
        );
    }

    #[test]
    fn admission_names_the_first_limit_passed() {
        let q = TenantQuota {
            max_sandboxes: Some(2),
            max_vcpus: Some(4),
            ..Default::default()
        };
        let used = QuotaUsage {
            sandboxes: 1,
            vcpus: 3,
            ..Default::default()
        };
        assert_eq!(used.admit(&q, &[(QuotaLimit::Sandboxes, 1)]), Ok(()));
        let e = used
            .admit(&q, &[(QuotaLimit::Sandboxes, 1), (QuotaLimit::Vcpus, 2)])
            .unwrap_err();
        assert_eq!(e.limit, QuotaLimit::Vcpus);
        assert_eq!((e.max, e.used, e.asked), (4, 3, 2));
        assert!(e.to_string().contains("max_vcpus is 4"), "{e}");
        // Unlimited is unlimited.
        assert_eq!(used.admit(&q, &[(QuotaLimit::MemoryMib, u64::MAX)]), Ok(()));
    }

    #[test]
    fn unknown_fields_and_zero_rates_are_refused() {
        assert!(serde_json::from_str::<TenantQuota>(r#"{"max_sandbox": 1}"#).is_err());
        let q: TenantQuota = serde_json::from_str(r#"{"requests_per_sec": 0}"#).unwrap();
        assert!(q.validate().is_err());
    }
}
