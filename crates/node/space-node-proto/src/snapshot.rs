//! Snapshots as the control plane asks for and sees them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use space_core::{Resources, SandboxId, SnapshotKind, TenantId};

/// What the control plane adds to a persistent snapshot: whose it is, and the labels the
/// sandbox had when it was taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotOwner {
    /// The sandbox's tenant.
    pub tenant: TenantId,
    /// The sandbox's labels.
    pub labels: BTreeMap<String, String>,
}

/// A client's request for a snapshot of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRequest {
    /// Disk only, or memory, device state and disk.
    pub kind: SnapshotKind,
    /// Free text (the node checks it again).
    pub label: Option<String>,
    /// Keep it past its sandbox, owned so; `None`: it goes with its sandbox.
    pub persistent: Option<SnapshotOwner>,
}

pub use space_core::sandbox::SnapshotTaken;

/// The sandbox a snapshot was taken of, as the control plane may see it: what a create
/// from the snapshot inherits, without the secrets the node keeps with it (environment
/// values, the sandbox CA's key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotOrigin {
    /// The sandbox.
    pub sandbox_id: SandboxId,
    /// Its owner; `None` only for a live sandbox from before records carried it.
    pub tenant: Option<TenantId>,
    /// Template name.
    pub template: String,
    /// The template digest the sandbox was created from.
    pub template_digest: String,
    /// Its resources (a checkpoint restores only into the same memory size).
    pub resources: Resources,
    /// The names of its environment variables.
    pub env_keys: Vec<String>,
    /// Its labels (empty for a live sandbox's snapshot that is not persistent: the control
    /// plane has them).
    pub labels: BTreeMap<String, String>,
}
