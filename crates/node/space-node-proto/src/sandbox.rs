//! A sandbox as the control plane sees it, and the requests that make one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use space_core::egress::EgressPolicy;
use space_core::sandbox::{CrashPolicy, ResourcesRequest};
use space_core::{Resources, SandboxId, SandboxState, SnapshotId, SnapshotSchedule, TenantId};
use space_secrets::ProjectId;

/// Why a sandbox is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseCause {
    /// A client asked; only a client resumes it.
    User,
    /// It was idle longer than its `auto_pause` timeout; the next call that needs the guest
    /// resumes it.
    Idle,
    /// Its timeout passed (the control plane's reconciler paused it); with the sandbox's
    /// `auto_resume` the next call that needs the guest resumes it.
    Timeout,
    /// Its node was cut off from the control plane long enough to be declared lost, and
    /// the sandbox is restored elsewhere then: the node paused it itself, so the two never
    /// run at once, and resumes it once back, if it is still its own.
    CutOff,
}

/// Why a sandbox is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopCause {
    /// A client asked; only a client starts it.
    User,
    /// Its timeout passed (the control plane's reconciler stopped it); with the sandbox's
    /// `auto_resume` the next call that needs the guest starts it.
    Timeout,
}

/// How the sandbox's current VM came to be.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum VmOrigin {
    /// Booted from the template's kernel and disk.
    #[default]
    Boot,
    /// Restored from the template's memory image (a warm pool member or a pool miss).
    TemplateImage {
        /// Taken ready from the warm pool.
        pooled: bool,
    },
    /// Restored from a checkpoint of this or another sandbox.
    Checkpoint {
        /// The sandbox the checkpoint belongs to.
        sandbox: SandboxId,
        /// The checkpoint (absent for a fork's transient checkpoint).
        snapshot: Option<SnapshotId>,
    },
}

/// A sandbox as its node reports it to the control plane: its live state and what it was
/// given, without how the node runs it (no VMM pid, VM name, crash bookkeeping or
/// environment values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxView {
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
    /// Why it failed.
    pub failure_reason: Option<String>,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
    /// Create request to daemon ready, ms.
    pub create_latency_ms: Option<u64>,
    /// How the current VM came to be.
    pub origin: VmOrigin,
    /// What to do when the VMM dies.
    pub on_crash: CrashPolicy,
    /// Idle time after which the sandbox is paused.
    pub auto_pause_secs: Option<u64>,
    /// Set while pausing or paused.
    pub paused_by: Option<PauseCause>,
    /// Set while stopping or stopped.
    pub stopped_by: Option<StopCause>,
    /// The owner (`None` only for sandboxes from before records carried it).
    pub tenant: Option<TenantId>,
    /// The project within the tenant.
    pub project: Option<ProjectId>,
    /// What may leave the sandbox.
    pub egress: EgressPolicy,
}

/// What a create gives a new sandbox beside what it starts from (a template or a
/// snapshot). What is left unset comes from there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSettings {
    /// Environment for every process, added to (or replacing) the inherited one.
    pub env: BTreeMap<String, String>,
    /// What to do when the VMM dies.
    pub on_crash: CrashPolicy,
    /// Pause the sandbox after this long without activity; `None` = never.
    pub auto_pause_secs: Option<u64>,
    /// Automatic snapshots; `None` = the default schedule.
    pub snapshots: Option<SnapshotSchedule>,
    /// The owner (credential scopes and audit entries name it); from a snapshot, it must be
    /// the snapshot's.
    pub tenant: TenantId,
    /// The project within the tenant (credential scopes); `None` = the inherited one.
    pub project: Option<ProjectId>,
    /// What may leave the sandbox; `None` = the inherited policy.
    pub egress: Option<EgressPolicy>,
    /// Its tenant has a customer key: every artifact the node keeps at rest for it
    /// (checkpoints' saved state, stored snapshots) is sealed under the tenant's artifact key,
    /// which the control plane lends the node; without the key those operations fail, and
    /// nothing is written in plaintext instead.
    #[serde(default)]
    pub seal_at_rest: bool,
}

impl SandboxSettings {
    /// Settings for `tenant` that give nothing beyond what the sandbox inherits.
    pub fn new(tenant: TenantId) -> SandboxSettings {
        SandboxSettings {
            env: BTreeMap::new(),
            on_crash: CrashPolicy::default(),
            auto_pause_secs: None,
            snapshots: None,
            tenant,
            project: None,
            egress: None,
            seal_at_rest: false,
        }
    }
}

/// A create request as the node sees it (already authorised and validated by the control
/// plane).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSandbox {
    /// Chosen by the control plane.
    pub id: SandboxId,
    /// Template name.
    pub template: String,
    /// The build of the template the control plane resolved the name to; a node that lacks
    /// it fetches it from the object store. `None`: whatever the name means on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_digest: Option<String>,
    /// Missing fields come from the template's defaults.
    pub resources: ResourcesRequest,
    /// What it is given beside the template; the egress policy defaults to the node's.
    pub settings: SandboxSettings,
}

/// A create from a snapshot as the node sees it (authorised and validated by the control
/// plane): template and resources are the snapshot's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateFromSnapshot {
    /// Chosen by the control plane.
    pub id: SandboxId,
    /// The snapshot.
    pub snapshot: SnapshotId,
    /// The live sandbox the snapshot is one of; `None`: a persistent snapshot whose sandbox
    /// was deleted.
    pub source: Option<SandboxId>,
    /// What it is given beside the snapshot: environment, project and egress policy default
    /// to the snapshot's, and the tenant must be the snapshot's.
    pub settings: SandboxSettings,
}

/// What a node's warm pool holds for one template shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolShape {
    /// Template name.
    pub template: String,
    /// Template digest.
    pub template_digest: String,
    /// The shape's resources.
    pub resources: Resources,
    /// Members ready to be taken.
    pub ready: usize,
    /// Members being made.
    pub filling: usize,
    /// How many it keeps ready.
    pub target: usize,
}
