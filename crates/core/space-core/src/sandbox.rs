//! Sandboxes as the API shows them: the create request and the sandbox description.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::id::{SandboxId, SnapshotId};
use crate::lifecycle::LifecycleEntry;
use crate::lifecycle::SandboxState;
use crate::resources::Resources;
use crate::snapshot::{SnapshotInfo, SnapshotKind};

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
    /// Template name, e.g. `base`; required unless `snapshot` is given.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub template: String,
    /// Create the sandbox from this snapshot (one of the caller's, listed by
    /// `GET /v1/snapshots`; its sandbox may have been deleted since) instead of from a
    /// template: a checkpoint brings back its memory and processes (made unique: fresh RNG
    /// seed, hostname, clock), a disk snapshot boots on a copy-on-write copy of its disk.
    /// Template and resources are the snapshot's; `env` and `labels` are added to (or
    /// replace) the snapshot's; its egress policy and project apply unless given here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub snapshot: Option<SnapshotId>,
    /// Resources; defaults from the template (not allowed with `snapshot`).
    #[serde(default)]
    pub resources: ResourcesRequest,
    /// Environment variables every process in the sandbox gets.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels to find the sandbox by (`GET /v1/sandboxes?label=k=v`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Its timeout: after this many seconds `on_timeout` happens; default 3600. Running
    /// again (a resume or start) gives it this long once more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// What happens when the timeout passes: `delete` (default), `pause` (memory kept) or
    /// `stop` (disk kept). A paused or stopped sandbox is left as it is.
    #[serde(default)]
    pub on_timeout: TimeoutAction,
    /// Whether the next call that needs the guest (exec, files, …) resumes a sandbox its
    /// timeout paused, or starts one its timeout stopped; default false (such a sandbox then
    /// answers `409` until a client resumes or starts it).
    #[serde(default)]
    pub auto_resume: bool,
    /// What the node does if the sandbox's VMM dies; default `restore`.
    #[serde(default)]
    pub on_crash: CrashPolicy,
    /// What happens if its node is lost: `fail` (default: it shows `lost` until the node
    /// returns) or `restore` (from its last stored checkpoint, on another node; needs an
    /// object store).
    #[serde(default)]
    pub on_node_loss: OnNodeLoss,
    /// With `on_node_loss: restore`: seconds between the checkpoints stored in object
    /// storage (default [`DEFAULT_STORED_CHECKPOINT_SECS`], at least
    /// [`MIN_STORED_CHECKPOINT_SECS`]); the guest pauses only for each checkpoint's final
    /// pass (it runs on while the checkpoint is uploaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval_secs: Option<u64>,
    /// Where its persistent snapshots are kept: `node` (default: on the node that took
    /// them) or `object_store` (uploaded there too: new sandboxes are created from them on
    /// any node, also once that node is gone; needs an object store).
    #[serde(default)]
    pub snapshot_storage: SnapshotStorage,
    /// Pause the sandbox after this many seconds without activity (processes using CPU,
    /// disk or network I/O, API calls); the next call that needs it resumes it. Default: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_secs: Option<u64>,
    /// Automatic disk snapshots and checkpoints; default: disk every minute, checkpoint every
    /// 15 minutes, retention decaying by tier over a week.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<crate::SnapshotSchedule>,
    /// What may leave the sandbox; default: the tenant's default policy, else the node's
    /// (mode `none`: no network). Changed later with `PUT /v1/sandboxes/{id}/egress-policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::EgressPolicy>,
    /// Project within the tenant (`[a-z0-9][a-z0-9_-]*`, at most 64): credentials scoped to
    /// the project apply to the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Which of the sandbox's ports host routes (`{port}-{id}.{domain}`) serve without a
    /// credential: `"none"` (default: every request needs the sandbox's traffic token or an
    /// API key of its tenant), `{"only": [8000, …]}` or `"all"`.
    #[serde(default, skip_serializing_if = "PublicPorts::is_none")]
    pub public_ports: PublicPorts,
}

/// Most ports one `public_ports` list names.
pub const MAX_PUBLIC_PORTS: usize = 64;

/// Which of a sandbox's ports are public: served by host routes to whoever reaches the
/// server, with no credential. JSON: `"none"`, `"all"` or `{"only": [8000, 8080]}`
/// (1..=65535, at most [`MAX_PUBLIC_PORTS`], no repeats).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case", try_from = "PublicPortsWire")]
pub enum PublicPorts {
    /// Every port needs a credential.
    #[default]
    None,
    /// These ports are public; the others need a credential.
    Only(Vec<u16>),
    /// Every port is public.
    All,
}

/// [`PublicPorts`] as sent, before validation.
#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum PublicPortsWire {
    None,
    Only(Vec<u16>),
    All,
}

impl TryFrom<PublicPortsWire> for PublicPorts {
    type Error = String;

    fn try_from(w: PublicPortsWire) -> Result<PublicPorts, String> {
        Ok(match w {
            PublicPortsWire::None => PublicPorts::None,
            PublicPortsWire::All => PublicPorts::All,
            PublicPortsWire::Only(mut ports) => {
                let listed = ports.len();
                if listed > MAX_PUBLIC_PORTS {
                    return Err(format!(
                        "public_ports: at most {MAX_PUBLIC_PORTS} ports, got {listed}"
                    ));
                }
                if ports.contains(&0) {
                    return Err("public_ports: a port is 1..=65535".into());
                }
                ports.sort_unstable();
                ports.dedup();
                if ports.len() != listed {
                    return Err("public_ports: a port is listed twice".into());
                }
                PublicPorts::Only(ports)
            }
        })
    }
}

impl PublicPorts {
    /// Whether `port` is public.
    pub fn allows(&self, port: u16) -> bool {
        match self {
            PublicPorts::None => false,
            PublicPorts::Only(ports) => ports.contains(&port),
            PublicPorts::All => true,
        }
    }

    /// Whether no port is public (the default).
    pub fn is_none(&self) -> bool {
        matches!(self, PublicPorts::None)
    }
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

/// Default seconds between a restorable sandbox's stored checkpoints.
pub const DEFAULT_STORED_CHECKPOINT_SECS: u64 = 300;
/// Fewest seconds between a sandbox's stored checkpoints.
pub const MIN_STORED_CHECKPOINT_SECS: u64 = 10;
/// Most seconds between a sandbox's stored checkpoints.
pub const MAX_STORED_CHECKPOINT_SECS: u64 = 7 * 24 * 3600;

/// Where a sandbox's persistent snapshots are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SnapshotStorage {
    /// On the node that took them: sandboxes made from one are made there.
    #[default]
    Node,
    /// On that node and in object storage (the snapshot call returns once it is stored):
    /// sandboxes made from one are made on any node, also once the one that took it is gone.
    ObjectStore,
}

/// What happens to a sandbox when its node is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnNodeLoss {
    /// It shows `lost` until its node returns.
    #[default]
    Fail,
    /// It is restored on another node from its last checkpoint stored in object storage
    /// (what it did since is lost); its old node, when it returns, drops its copy.
    Restore,
}

/// What happens to a sandbox when its timeout passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TimeoutAction {
    /// It is deleted.
    #[default]
    Delete,
    /// A running sandbox is paused (`paused_by: timeout`); memory and processes are kept.
    Pause,
    /// A running sandbox is stopped (`stopped_by: timeout`); only its disk is kept.
    Stop,
}

impl TimeoutAction {
    /// Every action.
    pub const ALL: [TimeoutAction; 3] = [
        TimeoutAction::Delete,
        TimeoutAction::Pause,
        TimeoutAction::Stop,
    ];

    /// The snake_case name, as serialised and stored.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeoutAction::Delete => "delete",
            TimeoutAction::Pause => "pause",
            TimeoutAction::Stop => "stop",
        }
    }

    /// Parses the name produced by [`TimeoutAction::as_str`].
    pub fn parse(s: &str) -> Option<TimeoutAction> {
        Self::ALL.into_iter().find(|a| a.as_str() == s)
    }
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
    /// Seconds from now until the sandbox's timeout action (`on_timeout`); also the
    /// timeout it gets again each time it runs again.
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
    /// When its timeout passes (its `on_timeout` action happens), ms since the Unix epoch.
    /// In the past while `timed_out_at_ms` is set.
    pub expires_at_ms: i64,
    /// Its timeout, seconds: `expires_at_ms` is set this far ahead whenever it runs again.
    #[serde(default)]
    pub timeout_secs: u64,
    /// What happens when the timeout passes.
    #[serde(default)]
    pub on_timeout: TimeoutAction,
    /// Whether the next call that needs the guest resumes (or starts) it after its timeout
    /// paused (or stopped) it.
    #[serde(default)]
    pub auto_resume: bool,
    /// What happens if its node is lost.
    #[serde(default)]
    pub on_node_loss: OnNodeLoss,
    /// Where its persistent snapshots are kept.
    #[serde(default)]
    pub snapshot_storage: SnapshotStorage,
    /// When its last checkpoint in object storage was stored (`on_node_loss: restore`), ms
    /// since the Unix epoch: what a restore after a lost node brings back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_checkpoint_at_ms: Option<i64>,
    /// Ports host routes serve without a credential.
    #[serde(default, skip_serializing_if = "PublicPorts::is_none")]
    pub public_ports: PublicPorts,
    /// When its timeout paused or stopped it (or found it paused or stopped), ms since the
    /// Unix epoch: until it runs again it has no deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timed_out_at_ms: Option<i64>,
    /// Time from the create request to the daemon reporting ready, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_latency_ms: Option<u64>,
    /// Why it failed, for `failed` sandboxes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    /// Who paused it, for `paused` sandboxes: a client (only a client resumes it),
    /// idleness (the next call that needs the guest resumes it) or its timeout (resumed by
    /// the next such call with `auto_resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<PausedBy>,
    /// Who stopped it, for `stopped` sandboxes: a client, or its timeout (started by the
    /// next call that needs the guest with `auto_resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<StoppedBy>,
    /// How its current VM came to be (booted, restored from the template's memory image,
    /// restored from a checkpoint); absent while it has no VM record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<SandboxOrigin>,
    /// The sandbox it was forked from, for forks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<SandboxId>,
    /// The snapshot it was created from, for sandboxes created from one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub from_snapshot: Option<SnapshotId>,
    /// What the node does if its VMM dies.
    #[serde(default)]
    pub on_crash: CrashPolicy,
    /// Idle time after which it is paused; absent = never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_pause_secs: Option<u64>,
    /// Project within the tenant, if it was created in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// What may leave it (absent while its node has no record of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::egress::EgressPolicy>,
}

/// Why a sandbox is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PausedBy {
    /// A client paused it (`POST /v1/sandboxes/{id}/pause`); only `resume` wakes it.
    User,
    /// It was idle longer than `auto_pause_secs`; the next call that needs it resumes it.
    Idle,
    /// Its timeout passed (`on_timeout: pause`); with `auto_resume` the next call that
    /// needs it resumes it, otherwise only `resume` does.
    Timeout,
    /// Its node lost the control plane (`on_node_loss: restore`): paused by the node so that
    /// the copy restored elsewhere never runs beside it; resumed when the node is back, if
    /// it was not restored elsewhere meanwhile.
    CutOff,
}

/// Why a sandbox is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StoppedBy {
    /// A client stopped it (`POST /v1/sandboxes/{id}/stop`); only `start` boots it.
    User,
    /// Its timeout passed (`on_timeout: stop`); with `auto_resume` the next call that needs
    /// it starts it, otherwise only `start` does.
    Timeout,
}

/// How a sandbox's current VM came to be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SandboxOrigin {
    /// Booted from the template's kernel and disk (also after `start` or a rollback to a
    /// disk snapshot).
    Boot,
    /// Restored from the template's memory image.
    TemplateImage {
        /// Taken ready from the warm pool.
        pooled: bool,
    },
    /// Restored from a checkpoint: of another sandbox for a fork, of itself after a
    /// rollback or a crash restore.
    Checkpoint {
        /// The sandbox the checkpoint belongs to.
        sandbox_id: SandboxId,
        /// The checkpoint (absent for the transient checkpoint of a fork of a running
        /// sandbox, deleted once the children run).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
        snapshot_id: Option<SnapshotId>,
    },
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxList {
    /// Sandboxes, newest first.
    pub sandboxes: Vec<SandboxInfo>,
}

/// Most sandboxes one fork makes.
pub const MAX_FORK_COUNT: u32 = 16;

/// `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    /// `disk` (default: the guest file systems are frozen for an instant, the VM keeps
    /// running) or `checkpoint` (memory, device state and disk; the guest pauses briefly).
    #[serde(default = "default_snapshot_kind")]
    pub kind: SnapshotKind,
    /// Free text, 1 to 128 printable characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Keep it until it is deleted, also after the sandbox is deleted (with what a new
    /// sandbox needs: template, resources, env, egress policy, labels, the sandbox's CA),
    /// and never thin it by retention; default false (it goes with its sandbox). A
    /// persistent checkpoint is taken with the workload frozen for the save, so sandboxes
    /// created from it run none of it before they are made unique.
    #[serde(default)]
    pub persistent: bool,
}

impl Default for CreateSnapshotRequest {
    /// A disk snapshot, without label, that goes with its sandbox.
    fn default() -> Self {
        CreateSnapshotRequest {
            kind: default_snapshot_kind(),
            label: None,
            persistent: false,
        }
    }
}

fn default_snapshot_kind() -> SnapshotKind {
    SnapshotKind::Disk
}

/// Response of `POST /v1/sandboxes/{id}/snapshots`: the snapshot, plus what taking it cost
/// the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotTaken {
    /// The new snapshot (its fields appear at the top level of the JSON object).
    #[serde(flatten)]
    pub snapshot: SnapshotInfo,
    /// For checkpoints: how long the guest's vCPUs were stopped, in ms (the final pass of
    /// the live save). Absent for disk snapshots, which never stop the vCPUs (only writes
    /// wait while the file systems are frozen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_pause_ms: Option<u64>,
}

/// `GET /v1/sandboxes/{id}/snapshots` (oldest first) and `GET /v1/snapshots` (the
/// tenant's, newest first).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotList {
    /// Snapshots.
    pub snapshots: Vec<SnapshotInfo>,
}

/// `POST /v1/sandboxes/{id}/rollback`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    /// One of this sandbox's snapshots: a disk snapshot brings the old disk back (the VM
    /// boots on it); a checkpoint brings back memory and processes too.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub snapshot: SnapshotId,
}

/// `POST /v1/sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many sandboxes, 1 to 16; default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Fork from this checkpoint of the sandbox instead of from the sandbox as it is now
    /// (which must then be running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub snapshot: Option<SnapshotId>,
    /// Labels of the children: the parent's, with these added or replacing.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The children's timeout, seconds; default 3600. What happens when it passes
    /// (`on_timeout`, `auto_resume`) is the parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
}

/// `GET /v1/sandboxes/{id}/events`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EventList {
    /// Lifecycle transitions, oldest first.
    pub events: Vec<LifecycleEntry>,
}

/// What the warm pool holds for one template shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolShape {
    /// Template name.
    pub template: String,
    /// Resources of the pooled VMs.
    pub resources: Resources,
    /// Restored, paused VMs ready to become sandboxes.
    pub ready: usize,
    /// Being made right now.
    pub filling: usize,
    /// How many ready members the pool aims for.
    pub target: usize,
}

/// `GET /v1/pool`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolStatusList {
    /// One entry per template shape creates have asked for.
    pub pools: Vec<PoolShape>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_ports_default_to_none_and_are_validated() {
        let req: CreateSandboxRequest = serde_json::from_str(r#"{"template": "base"}"#).unwrap();
        assert_eq!(req.public_ports, PublicPorts::None);
        assert!(!req.public_ports.allows(8000));
        let parse = |json: &str| serde_json::from_str::<PublicPorts>(json);
        assert_eq!(parse(r#""all""#).unwrap(), PublicPorts::All);
        let only = parse(r#"{"only": [8080, 8000]}"#).unwrap();
        assert_eq!(only, PublicPorts::Only(vec![8000, 8080]));
        assert!(only.allows(8000) && only.allows(8080) && !only.allows(8001));
        for bad in [
            r#"{"only": [0]}"#,
            r#"{"only": [8000, 8000]}"#,
            r#"{"only": [70000]}"#,
            r#""some""#,
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let too_many: Vec<u16> = (1..=65).collect();
        let json = serde_json::json!({ "only": too_many }).to_string();
        assert!(parse(&json).is_err());
        assert_eq!(
            serde_json::to_string(&PublicPorts::All).unwrap(),
            r#""all""#
        );
    }

    #[test]
    fn timeout_actions_are_snake_case_and_default_to_delete() {
        for a in TimeoutAction::ALL {
            assert_eq!(TimeoutAction::parse(a.as_str()), Some(a));
            assert_eq!(
                serde_json::to_string(&a).unwrap(),
                format!("\"{}\"", a.as_str())
            );
        }
        assert_eq!(TimeoutAction::parse("hibernate"), None);
        let req: CreateSandboxRequest = serde_json::from_str(r#"{"template": "base"}"#).unwrap();
        assert_eq!(
            (req.on_timeout, req.auto_resume),
            (TimeoutAction::Delete, false)
        );
        let req: CreateSandboxRequest = serde_json::from_str(
            r#"{"template": "base", "on_timeout": "pause", "auto_resume": true}"#,
        )
        .unwrap();
        assert_eq!(
            (req.on_timeout, req.auto_resume),
            (TimeoutAction::Pause, true)
        );
        assert!(serde_json::from_str::<CreateSandboxRequest>(
            r#"{"template": "base", "on_timeout": "Pause"}"#
        )
        .is_err());
        assert_eq!(
            serde_json::to_string(&PausedBy::Timeout).unwrap(),
            "\"timeout\""
        );
        assert_eq!(
            serde_json::to_string(&StoppedBy::Timeout).unwrap(),
            "\"timeout\""
        );
    }
}
