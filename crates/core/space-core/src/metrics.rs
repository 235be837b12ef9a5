//! Resource use of a sandbox over time, as the node samples it and the API returns it.

use serde::{Deserialize, Serialize};

/// One sample of a sandbox's resource use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxMetric {
    /// When it was taken, ms since the Unix epoch (the node's clock).
    pub timestamp_ms: i64,
    /// vCPUs online in the guest.
    pub cpu_count: u32,
    /// Share of all vCPUs busy since the previous sample (since boot for the first), 0-100.
    pub cpu_used_pct: f64,
    /// Guest memory, bytes.
    pub mem_total: u64,
    /// Memory in use (total less what is available), bytes.
    pub mem_used: u64,
    /// Page cache, bytes (part of what is available).
    pub mem_cache: u64,
    /// Size of the root file system, bytes.
    pub disk_total: u64,
    /// Bytes in use on it.
    pub disk_used: u64,
}

/// The samples of one sandbox, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxMetrics {
    /// Samples, oldest first.
    pub metrics: Vec<SandboxMetric>,
}
