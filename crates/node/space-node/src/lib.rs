//! Node services: everything one machine does for its sandboxes.
//!
//! - [`Node`] is the sandbox manager: it drives each sandbox through the lifecycle table of
//!   `space-core` (persisting every transition in [`records`]), boots VMs, connects to their
//!   daemons, watches them, and re-adopts them after a restart.
//! - Every privileged operation (mounts, disk clones, namespaces, VMM processes) it asks of
//!   the node manager (`space_node_manager::NodeManager`): `space node-manager` over its
//!   socket when [`NodeConfig::node_manager`] names one, else in this process.
//!
//! Architecture invariants: the node is the source of truth for the live state of its
//! sandboxes; the control plane reaches a guest only through [`Node::guest`]; nothing here
//! performs a privileged operation except through the node manager.

mod api;
mod coalesce;
pub mod config;
mod create;
mod credentials;
pub mod error;
mod events;
pub mod fork;
mod from_snapshot;
mod gateway;
mod guest_run;
pub mod image;
pub mod metrics;
pub mod network;
mod ops;
mod packing;
pub mod persistent;
mod pool;
pub mod published;
pub mod records;
pub mod recovery;
mod sandbox_ca;
mod sandbox_manager;
pub mod scheduler;
mod sealed_disks;
pub mod sealing;
mod settings;
pub mod snapshots;
pub mod stored;
pub mod suspend;
mod template_builds;
mod template_cache;
mod template_start;
mod template_steps;
mod vm_start;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use space_core::egress::EgressPolicy;
pub use space_core::sandbox::CrashPolicy;
use space_core::{Resources, SandboxId, SandboxState, SnapshotId, TenantId};
pub use space_secrets::ProjectId;

pub use config::NodeConfig;
pub use error::NodeError;
pub use persistent::{SnapshotOwner, SnapshotSource};
pub use sandbox_manager::Node;
pub use space_guest_client::{GuestClient, GuestError, PortStream};
pub use space_node_proto::{
    CreateFromSnapshot, CreateSandbox, NodeStatus, PauseCause, PoolShape, SandboxSettings,
    SandboxView, StopCause, VmOrigin,
};

/// A sandbox as the node knows it (persisted on every transition).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// Id.
    pub id: SandboxId,
    /// Template name.
    pub template: String,
    /// Template digest.
    pub template_digest: String,
    /// Resources held.
    pub resources: Resources,
    /// Lifecycle state.
    pub state: SandboxState,
    /// Why it failed (with the tail of the serial console when the VM died).
    pub failure_reason: Option<String>,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
    /// Create request to daemon ready, ms.
    pub create_latency_ms: Option<u64>,
    /// VMM process id while it runs.
    pub vmm_pid: Option<u32>,
    /// Name of the VM backing the sandbox (its run directory); `None` = the sandbox id.
    #[serde(default)]
    pub vm_name: Option<String>,
    /// How the current VM came to be.
    #[serde(default)]
    pub origin: VmOrigin,
    /// Environment for every process (kept to configure the guest again after a cold start).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// What to do when the VMM dies.
    #[serde(default)]
    pub on_crash: CrashPolicy,
    /// Idle time after which the sandbox is paused.
    #[serde(default)]
    pub auto_pause_secs: Option<u64>,
    /// Set while pausing or paused (so a pause a restart interrupted finishes with its cause).
    #[serde(default)]
    pub paused_by: Option<PauseCause>,
    /// Set while stopping or stopped.
    #[serde(default)]
    pub stopped_by: Option<StopCause>,
    /// The snapshot a rollback in progress goes back to.
    #[serde(default)]
    pub rollback_to: Option<SnapshotId>,
    /// Automatic snapshots.
    #[serde(default)]
    pub snapshots: space_core::SnapshotSchedule,
    /// When the VMM died and was restored, ms since the Unix epoch (most recent last, at
    /// most [`recovery::MAX_CRASH_RESTORES`] kept): a sandbox that keeps crashing is failed.
    #[serde(default)]
    pub crash_restores_ms: Vec<i64>,
    /// The owner; `None` only for sandboxes made before records carried it (their gateway
    /// injects no credentials).
    #[serde(default)]
    pub tenant: Option<TenantId>,
    /// The project within the tenant.
    #[serde(default)]
    pub project: Option<ProjectId>,
    /// What may leave the sandbox (enforced by its gateway; changed live).
    #[serde(default)]
    pub egress: EgressPolicy,
    /// Its artifacts at rest are sealed under its tenant's key (see [`crate::sealing`]).
    #[serde(default)]
    pub seal_at_rest: bool,
    /// The sandboxes its memory came from, nearest first (a fork's parent and the parent's
    /// own, a checkpoint's sandbox; at most [`MAX_INHERITED_FROM`]): processes it inherited
    /// hold their credential placeholders, which its gateway takes for its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherited_from: Vec<SandboxId>,
    /// The template build this sandbox runs the steps of (a builder): the node's own, never
    /// shown to the control plane, deleted with its build or at the next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_build: Option<String>,
}

/// How many generations of memory a sandbox's gateway recognises placeholders of.
pub const MAX_INHERITED_FROM: usize = 8;

impl SandboxRecord {
    /// A record in `state` with defaults for everything but identity and shape.
    pub fn new(
        id: SandboxId,
        template: String,
        template_digest: String,
        resources: Resources,
        state: SandboxState,
    ) -> SandboxRecord {
        SandboxRecord {
            id,
            template,
            template_digest,
            resources,
            state,
            failure_reason: None,
            created_at_ms: 0,
            create_latency_ms: None,
            vmm_pid: None,
            vm_name: None,
            origin: VmOrigin::Boot,
            env: BTreeMap::new(),
            on_crash: CrashPolicy::default(),
            auto_pause_secs: None,
            paused_by: None,
            stopped_by: None,
            rollback_to: None,
            snapshots: space_core::SnapshotSchedule::default(),
            crash_restores_ms: Vec::new(),
            tenant: None,
            project: None,
            egress: EgressPolicy::default(),
            seal_at_rest: false,
            inherited_from: Vec::new(),
            template_build: None,
        }
    }

    /// Name of the VM (and of its run directory) backing the sandbox.
    pub fn vm_name(&self) -> &str {
        self.vm_name.as_deref().unwrap_or(self.id.as_str())
    }

    /// What the control plane sees of it.
    pub fn view(&self) -> SandboxView {
        SandboxView {
            id: self.id.clone(),
            template: self.template.clone(),
            template_digest: self.template_digest.clone(),
            resources: self.resources,
            state: self.state,
            failure_reason: self.failure_reason.clone(),
            created_at_ms: self.created_at_ms,
            create_latency_ms: self.create_latency_ms,
            origin: self.origin.clone(),
            on_crash: self.on_crash,
            auto_pause_secs: self.auto_pause_secs,
            paused_by: self.paused_by,
            stopped_by: self.stopped_by,
            tenant: self.tenant.clone(),
            project: self.project.clone(),
            egress: self.egress.clone(),
        }
    }
}
