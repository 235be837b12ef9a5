//! Sandboxes as the API shows them: the create request and the sandbox description.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::id::SandboxId;
use crate::lifecycle::SandboxState;
use crate::resources::Resources;

/// Most labels on one sandbox.
pub const MAX_LABELS: usize = 64;
/// Longest label key or value.
pub const MAX_LABEL_LEN: usize = 256;
/// Longest sandbox timeout (TTL): 30 days.
pub const MAX_TIMEOUT_SECS: u64 = 30 * 24 * 3600;

/// Resources in a create request; missing fields come from the template's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ResourcesRequest {
    /// Virtual CPUs.
    pub vcpus: Option<u32>,
    /// Guest memory, MiB.
    pub memory_mib: Option<u32>,
    /// Root disk, MiB.
    pub disk_mib: Option<u32>,
}

impl ResourcesRequest {
    /// Fills missing fields from `defaults`.
    pub fn resolve(&self, defaults: Resources) -> Resources {
        Resources {
            vcpus: self.vcpus.unwrap_or(defaults.vcpus),
            memory_mib: self.memory_mib.unwrap_or(defaults.memory_mib),
            disk_mib: self.disk_mib.unwrap_or(defaults.disk_mib),
        }
    }
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Template name, e.g. `base`.
    pub template: String,
    /// Resources; defaults from the template.
    #[serde(default)]
    pub resources: ResourcesRequest,
    /// Environment variables every process in the sandbox gets.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels to find the sandbox by (`GET /v1/sandboxes?label=k=v`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Delete the sandbox automatically after this many seconds; default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// What the node does if the sandbox's VMM dies; default `restore`.
    #[serde(default)]
    pub on_crash: CrashPolicy,
    /// Pause the sandbox after this many seconds without activity (processes using CPU,
    /// disk or network I/O, API calls); the next call that needs it resumes it. Default: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_secs: Option<u64>,
    /// Automatic disk snapshots and checkpoints; default: disk every minute, checkpoint every
    /// 15 minutes, retention decaying by tier over a week.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<crate::SnapshotSchedule>,
}

/// What the node does when a sandbox's VMM dies unexpectedly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CrashPolicy {
    /// Restore it from its latest checkpoint (or, without one, boot it again on its disk).
    #[default]
    Restore,
    /// Mark it failed.
    Fail,
}

/// Shortest `auto_pause_secs` accepted.
pub const MIN_AUTO_PAUSE_SECS: u64 = 10;

/// Checks labels: count, key charset, lengths.
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!("at most {MAX_LABELS} labels"));
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= MAX_LABEL_LEN
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b));
        if !key_ok {
            return Err(format!(
                "label key {k:?} must be 1-{MAX_LABEL_LEN} of [A-Za-z0-9._-/]"
            ));
        }
        if v.len() > MAX_LABEL_LEN || v.chars().any(char::is_control) {
            return Err(format!(
                "label {k:?}: value must be at most {MAX_LABEL_LEN} printable bytes"
            ));
        }
    }
    Ok(())
}

/// `PUT /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SetTimeoutRequest {
    /// Seconds from now until automatic deletion.
    pub timeout_secs: u64,
}

/// A sandbox, as returned by the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxInfo {
    /// Id.
    pub id: SandboxId,
    /// Template name.
    pub template: String,
    /// Template digest it was created from.
    pub template_digest: String,
    /// Lifecycle state.
    pub state: SandboxState,
    /// Resources it holds.
    pub resources: Resources,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Names of the sandbox environment variables (values are not echoed back).
    pub env_keys: Vec<String>,
    /// Node it runs on.
    pub node: String,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
    /// When it will be deleted automatically, ms since the Unix epoch.
    pub expires_at_ms: i64,
    /// Time from the create request to the daemon reporting ready, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_latency_ms: Option<u64>,
    /// Why it failed, for `failed` sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxList {
    /// Sandboxes, newest first.
    pub sandboxes: Vec<SandboxInfo>,
}
