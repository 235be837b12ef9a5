//! Snapshots as the control plane asks for and sees them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use space_core::{Resources, SandboxId, SnapshotId, SnapshotKind, TenantId};

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

/// A suspend as a node carries it out: the control plane chose the snapshot's id (its row
/// tracks the upload from before the node starts) and says whose the snapshot is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuspendSandbox {
    /// The sandbox.
    pub id: SandboxId,
    /// The id of the full snapshot the suspend takes.
    pub snapshot: SnapshotId,
    /// Whose it is (the snapshot outlives the sandbox's presence on any node).
    pub owner: SnapshotOwner,
}

/// An upload of one of a sandbox's snapshots (taken on this node, committed) to object
/// storage; the sandbox runs on meanwhile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreSnapshot {
    /// The sandbox.
    pub id: SandboxId,
    /// Its snapshot.
    pub snapshot: SnapshotId,
    /// Whose it is (for a snapshot that carries no owner of its own).
    pub owner: SnapshotOwner,
}

/// A download of a stored snapshot onto this node, to create sandboxes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchSnapshot {
    /// The stored snapshot.
    pub stored: StoredSnapshot,
    /// Whose it is: the tenant must be the snapshot's.
    pub tenant: TenantId,
}

/// Where a fetched snapshot is on the node: what a create from it names as its source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotHere {
    /// The live sandbox on this node it is a snapshot of (it was here already, among that
    /// sandbox's); `None`: among the persistent snapshots whose sandbox is gone.
    pub live_sandbox: Option<SandboxId>,
}

/// The artifacts of a stored snapshot, by name.
pub mod artifacts {
    /// The VM's device state and RAM (QEMU's stream), zstd.
    pub const MEMORY: &str = "memory.zst";
    /// The disk's changes against the template's image (`space_storage::delta`), zstd.
    pub const DISK: &str = "disk.delta.zst";
    /// What a sandbox restored from it needs (template, resources, policy, env, CA, labels).
    pub const SOURCE: &str = "source.json";
    /// The snapshot's own description.
    pub const META: &str = "meta.json";
    /// Every artifact a stored checkpoint has (a disk snapshot has no `MEMORY`).
    pub const ALL: [&str; 4] = [MEMORY, DISK, SOURCE, META];
}

/// One object of a stored snapshot: what reading it back must match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredArtifact {
    /// What it is (`memory.zst`, `disk.delta.zst`, `source.json`, `meta.json`).
    pub name: String,
    /// Its key in the object store.
    pub key: String,
    /// Its length in bytes.
    pub size: u64,
    /// SHA-256 of its bytes, lowercase hex.
    pub sha256: String,
    /// Sealed under its tenant's artifact key, as `snapshots/<snapshot>/<name>` (a tenant
    /// with a customer key): only a node lent that key reads it.
    #[serde(default)]
    pub sealed: bool,
}

/// What a stored snapshot is in object storage (a suspend's, a stored checkpoint, a
/// persistent snapshot kept there), and what a restore on any node needs to know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSnapshot {
    /// The snapshot.
    pub snapshot: SnapshotId,
    /// The sandbox it is of.
    pub sandbox_id: SandboxId,
    /// Its template (name and digest: the disk delta is against that template's image).
    pub template: String,
    /// The template's digest.
    pub template_digest: String,
    /// Its resources (a checkpoint restores only into the same memory size).
    pub resources: Resources,
    /// Every artifact, each verified when read back.
    pub artifacts: Vec<StoredArtifact>,
    /// What the sandbox had beside its snapshot's source, to give it again at resume.
    pub settings: StoredSettings,
    /// Bytes of guest RAM and device state before compression.
    pub memory_bytes: u64,
    /// Disk blocks (64 KiB) that differ from the template (0 for a disk sealed at rest,
    /// whose delta was written, and its blocks counted, when the snapshot was taken).
    pub disk_changed_blocks: u64,
    /// A suspend's: the sandbox's lifecycle log until then (its newest
    /// [`MAX_STORED_HISTORY`] entries), which goes on on the node that resumes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<space_core::LifecycleEntry>,
}

/// Most lifecycle entries a suspend carries over to the resuming node.
pub const MAX_STORED_HISTORY: usize = 256;

/// What a suspended sandbox keeps of its node record's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSettings {
    /// What its node does if its VMM dies.
    #[serde(default)]
    pub on_crash: space_core::sandbox::CrashPolicy,
    /// Idle time before it is paused.
    #[serde(default)]
    pub auto_pause_secs: Option<u64>,
    /// Its snapshot schedule.
    #[serde(default)]
    pub snapshots: Option<space_core::SnapshotSchedule>,
}

/// A resume of a suspended sandbox on this node: the same id, from the stored snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumeSandbox {
    /// The stored snapshot (its artifacts are downloaded unless this node has it already).
    pub suspended: StoredSnapshot,
    /// Whose it is: the tenant must be the snapshot's.
    pub tenant: TenantId,
    /// Seal the resumed sandbox's artifacts at rest under its tenant's key (see
    /// [`crate::SandboxSettings::seal_at_rest`]).
    #[serde(default)]
    pub seal_at_rest: bool,
}
