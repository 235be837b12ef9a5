//! [`NodeApi`]: everything the control plane asks of a node, as one trait. The node
//! implements it in-process (`space_node::Node`, the single-machine default); the control
//! plane's remote client implements it over the network, calling the node agent, which
//! serves it for its `Node`. Both sides see the same types, so a remote node's answers
//! read exactly like a local one's.

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures::stream::BoxStream;
use space_core::egress::EgressPolicy;
use space_core::metrics::SandboxMetric;
use space_core::template::{CachedTemplate, TemplateBuildStatus, TemplateInfo};
use space_core::{LifecycleEntry, SandboxId, SnapshotDiff, SnapshotId, SnapshotInfo, TenantId};
use space_guest_client::GuestClient;
use space_secrets::secret::SecretValue;
use space_secrets::{AuditEvent, AuditFilter, Credential, CredentialId};

use crate::template::BuildTemplate;
use crate::{
    CreateFromSnapshot, CreateSandbox, FetchSnapshot, NodeCallError, NodeStatus, PauseCause,
    PoolShape, ResumeSandbox, SandboxView, SnapshotHere, SnapshotOrigin, SnapshotRequest,
    SnapshotTaken, StopCause, StoreSnapshot, StoredSnapshot, SuspendSandbox,
};

/// Result of a node call.
pub type NodeResult<T> = Result<T, NodeCallError>;

/// What a follower of a node's lifecycle events receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventNotice {
    /// A transition of one of the node's sandboxes.
    Entry(LifecycleEntry),
    /// Entries went by that this follower missed (it was too slow): re-read the log.
    Lagged,
}

/// Every lifecycle transition on a node from the moment of subscribing; ends when the node
/// goes away.
pub type EventFeed = BoxStream<'static, EventNotice>;

/// Everything the control plane asks of a node. Ids and values in requests have been
/// authorised and validated by the control plane; the node checks them again.
#[async_trait]
pub trait NodeApi: Send + Sync + 'static {
    /// The node's name (what a sandbox row's `node` holds).
    fn name(&self) -> &str;
    /// Whether `policy` lies within the operator's egress ceiling as this node enforces it
    /// (refused with `egress_beyond_ceiling`, naming the rule, if not).
    async fn check_egress_policy(&self, policy: &EgressPolicy) -> NodeResult<()>;
    /// What the node reports of itself (capacity, use, warmth per template).
    async fn status(&self) -> NodeResult<NodeStatus>;

    // Sandboxes.
    /// A sandbox's view, `None` if the node has no record of it.
    async fn sandbox(&self, id: &SandboxId) -> NodeResult<Option<SandboxView>>;
    /// Every sandbox the node has a record of.
    async fn sandboxes(&self) -> NodeResult<Vec<SandboxView>>;
    /// Creates a sandbox from a template; returns once its daemon is ready.
    async fn create_sandbox(&self, req: CreateSandbox) -> NodeResult<SandboxView>;
    /// Creates a sandbox from a snapshot.
    async fn create_from_snapshot(&self, req: CreateFromSnapshot) -> NodeResult<SandboxView>;
    /// Forks `parent` (now, or from its checkpoint `from`) into `children`.
    async fn fork(
        &self,
        parent: &SandboxId,
        children: &[SandboxId],
        from: Option<&SnapshotId>,
    ) -> NodeResult<Vec<SandboxView>>;
    /// Pauses a running sandbox.
    async fn pause(&self, id: &SandboxId, cause: PauseCause) -> NodeResult<SandboxView>;
    /// Resumes a paused sandbox.
    async fn resume(&self, id: &SandboxId) -> NodeResult<SandboxView>;
    /// Stops a sandbox (disk kept).
    async fn stop(&self, id: &SandboxId, cause: StopCause) -> NodeResult<SandboxView>;
    /// Starts a stopped sandbox.
    async fn start(&self, id: &SandboxId) -> NodeResult<SandboxView>;
    /// Takes a sandbox back to one of its snapshots.
    async fn rollback(&self, id: &SandboxId, to: &SnapshotId) -> NodeResult<SandboxView>;
    /// Deletes a sandbox and everything of it (its persistent snapshots excepted); one that
    /// is gone already is no error (a delete is idempotent).
    async fn delete(&self, id: &SandboxId) -> NodeResult<()>;
    /// Resumes (or starts) a sandbox its timeout paused (or stopped); whether it did.
    async fn wake_timed_out(&self, id: &SandboxId) -> NodeResult<bool>;
    /// The channel to a sandbox's daemon; one that idleness paused is resumed first.
    async fn guest(&self, id: &SandboxId) -> NodeResult<GuestClient>;
    /// What the node adds to every process's environment (credential placeholders).
    async fn process_env(&self, id: &SandboxId) -> NodeResult<BTreeMap<String, String>>;
    /// The end of the sandbox's serial console, at most `max_bytes`.
    async fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> NodeResult<String>;
    /// The sandbox's lifecycle log, oldest first.
    async fn events(&self, id: &SandboxId) -> NodeResult<Vec<LifecycleEntry>>;
    /// Lifecycle transitions of every sandbox of the node from now on.
    async fn subscribe_events(&self) -> NodeResult<EventFeed>;
    /// The sandbox's resource samples.
    async fn metrics(&self, id: &SandboxId) -> NodeResult<Vec<SandboxMetric>>;
    /// Replaces a sandbox's egress policy, live.
    async fn set_egress_policy(
        &self,
        id: &SandboxId,
        policy: EgressPolicy,
    ) -> NodeResult<SandboxView>;
    /// The cap on open egress connections of a tenant without one of its own.
    async fn set_default_connections(&self, limit: Option<u64>) -> NodeResult<()>;
    /// A tenant's own cap on open egress connections (`None`: back to the default).
    async fn set_tenant_connections(
        &self,
        tenant: &TenantId,
        limit: Option<Option<u64>>,
    ) -> NodeResult<()>;

    // Suspend and resume through object storage.
    /// Suspends a running or paused sandbox: its VM paused, a full snapshot taken and its
    /// artifacts uploaded; the sandbox stays `suspending` (its VM paused) until the control
    /// plane, having committed the snapshot, deletes it here, or gives up and aborts.
    async fn suspend(&self, req: SuspendSandbox) -> NodeResult<StoredSnapshot>;
    /// Gives up a suspend: the sandbox runs again as it was.
    async fn abort_suspend(&self, id: &SandboxId) -> NodeResult<SandboxView>;
    /// Restores a suspended sandbox here, under its own id, from its stored snapshot.
    async fn resume_suspended(&self, req: ResumeSandbox) -> NodeResult<SandboxView>;

    /// Uploads one of a sandbox's committed snapshots to object storage (the sandbox runs
    /// on; only its files are read).
    async fn store_snapshot(&self, req: StoreSnapshot) -> NodeResult<StoredSnapshot>;
    /// Makes a stored snapshot present on this node (downloaded and verified unless it is
    /// here already; concurrent fetches of one wait for one download), to create sandboxes
    /// from.
    async fn fetch_snapshot(&self, req: FetchSnapshot) -> NodeResult<SnapshotHere>;

    // Snapshots.
    /// A sandbox's snapshots, oldest first.
    async fn snapshots(&self, id: &SandboxId) -> NodeResult<Vec<SnapshotInfo>>;
    /// Every snapshot on this node of `tenant`'s: of its sandboxes here, and its persistent
    /// ones whose sandbox was deleted (one call per node for a tenant-wide listing).
    async fn tenant_snapshots(&self, tenant: &TenantId) -> NodeResult<Vec<SnapshotInfo>>;
    /// Takes a snapshot of a sandbox.
    async fn take_snapshot(
        &self,
        id: &SandboxId,
        req: SnapshotRequest,
    ) -> NodeResult<SnapshotTaken>;
    /// Deletes one of a sandbox's snapshots.
    async fn delete_snapshot(&self, id: &SandboxId, snap: &SnapshotId) -> NodeResult<()>;
    /// What changed between two of a sandbox's disk states.
    async fn diff_snapshots(
        &self,
        id: &SandboxId,
        from: &SnapshotId,
        to: &SnapshotId,
        limit: usize,
    ) -> NodeResult<SnapshotDiff>;
    /// One of a live sandbox's snapshots with where it came from, `None` if it has no such.
    async fn snapshot_origin(
        &self,
        id: &SandboxId,
        snap: &SnapshotId,
    ) -> NodeResult<Option<(SnapshotInfo, SnapshotOrigin)>>;
    /// The persistent snapshots whose sandbox was deleted.
    async fn persistent_snapshots(&self) -> NodeResult<Vec<(SnapshotInfo, SnapshotOrigin)>>;
    /// One persistent snapshot whose sandbox was deleted.
    async fn persistent_snapshot(
        &self,
        snap: &SnapshotId,
    ) -> NodeResult<Option<(SnapshotInfo, SnapshotOrigin)>>;
    /// Deletes a persistent snapshot whose sandbox was deleted.
    async fn delete_persistent_snapshot(&self, snap: &SnapshotId) -> NodeResult<()>;

    // Templates and the warm pool.
    /// The templates the node has.
    async fn templates(&self) -> NodeResult<Vec<TemplateInfo>>;
    /// One template.
    async fn template(&self, name: &str) -> NodeResult<TemplateInfo>;
    /// Starts building a template from a registry image; returns at once (the build goes
    /// on without its caller: follow it with [`NodeApi::template_build`]).
    async fn start_template_build(&self, req: BuildTemplate) -> NodeResult<TemplateBuildStatus>;
    /// A build started here, with its log lines from index `logs_from`.
    async fn template_build(&self, id: &str, logs_from: u64) -> NodeResult<TemplateBuildStatus>;
    /// Removes template name `name` here (the template with it unless another name points
    /// there), and from the object store's names; whether the name was known.
    async fn delete_template(&self, name: &str) -> NodeResult<bool>;
    /// The node's template cache: templates no name points at here.
    async fn cached_templates(&self) -> NodeResult<Vec<CachedTemplate>>;
    /// Removes cached template `digest` (its image, memory images and warm sandboxes) unless
    /// it was needed at or after `unused_since_ms` or a build runs on the node.
    async fn remove_cached_template(
        &self,
        digest: &str,
        unused_since_ms: i64,
    ) -> NodeResult<crate::template::CacheRemoval>;
    /// Stores an archive of files for build steps' `COPY`, named by its SHA-256 (hex) and
    /// checked against it; one stored before is kept. Returns its size.
    async fn put_build_files(
        &self,
        sha256: &str,
        body: BoxStream<'static, Result<bytes::Bytes, std::io::Error>>,
    ) -> NodeResult<u64>;
    /// Whether the node has the archive of files `sha256`.
    async fn has_build_files(&self, sha256: &str) -> NodeResult<bool>;
    /// What the warm pool holds.
    async fn pool_status(&self) -> NodeResult<Vec<PoolShape>>;

    // Credentials (values go in, never come out).
    /// Every credential the node holds (metadata only).
    async fn credentials(&self) -> NodeResult<Vec<Credential>>;
    /// Creates or replaces a credential.
    async fn put_credential(&self, credential: Credential, value: SecretValue) -> NodeResult<()>;
    /// Deletes a credential.
    async fn delete_credential(&self, id: &CredentialId) -> NodeResult<()>;
    /// Lends the node `tenant`'s artifact key for `valid_for` (at most an hour; a renewal
    /// replaces the loan): what the node keeps at rest for the tenant's sandboxes sealed at
    /// rest is sealed under keys derived from it.
    async fn lend_artifact_key(
        &self,
        tenant: &TenantId,
        key: &space_envelope::DataKey,
        valid_for: std::time::Duration,
    ) -> NodeResult<()>;
    /// Withdraws `tenant`'s artifact key from the node (its customer key was revoked).
    async fn withdraw_artifact_key(&self, tenant: &TenantId) -> NodeResult<()>;
    /// Records that this node's credentials are the control plane's catalog at `revision`
    /// (reported in its status from now on, until it restarts).
    async fn credentials_synced(&self, revision: u64) -> NodeResult<()>;
    /// The node's credential decisions matching `filter`, newest first.
    async fn audit(&self, filter: AuditFilter) -> NodeResult<Vec<AuditEvent>>;
}
