//! The control plane's view of nodes: every node is reached through [`NodeApi`], whether it
//! runs in this process (the single-machine default, [`local::LocalNode`]) or on another
//! machine; [`Nodes`] is the set of them, by name.
//!
//! Invariant: nothing above this module sees node internals (its store, credential
//! manager, VMM pids or VM names). A node is the source of truth for the live state of its
//! sandboxes; the control plane keeps desired state and placements in its database and asks
//! the node named by a sandbox's row.

pub mod local;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use space_core::egress::{EgressCeiling, EgressPolicy};
use space_core::metrics::SandboxMetric;
use space_core::template::TemplateInfo;
use space_core::{
    LifecycleEntry, NodeCapacity, Resources, SandboxId, SnapshotDiff, SnapshotId, SnapshotInfo,
    TenantId,
};
use space_guest_client::GuestClient;
pub use space_node_proto::{
    CreateFromSnapshot, CreateSandbox, NodeCallError, NodeStatus, PauseCause, PoolShape,
    SandboxSettings, SandboxView, SnapshotOrigin, SnapshotOwner, SnapshotRequest, SnapshotTaken,
    StopCause, VmOrigin,
};
use space_secrets::secret::SecretValue;
use space_secrets::{AuditEvent, AuditFilter, Credential, CredentialId};

use crate::scheduler::{self, NoPlacement, NodeState, NodeView, PlacementRequest};

const NO_CAPACITY: NodeCapacity = NodeCapacity {
    vcpus: 0,
    memory_mib: 0,
    disk_mib: 0,
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
    /// The operator's ceiling on egress policies, as this node enforces it.
    fn egress_ceiling(&self) -> &EgressCeiling;
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
    /// Deletes a sandbox and everything of it (its persistent snapshots excepted).
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

    // Snapshots.
    /// A sandbox's snapshots, oldest first.
    async fn snapshots(&self, id: &SandboxId) -> NodeResult<Vec<SnapshotInfo>>;
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
    /// What the warm pool holds.
    async fn pool_status(&self) -> NodeResult<Vec<PoolShape>>;

    // Credentials (values go in, never come out).
    /// Every credential the node holds (metadata only).
    async fn credentials(&self) -> NodeResult<Vec<Credential>>;
    /// Creates or replaces a credential.
    async fn put_credential(&self, credential: Credential, value: SecretValue) -> NodeResult<()>;
    /// Deletes a credential.
    async fn delete_credential(&self, id: &CredentialId) -> NodeResult<()>;
    /// The node's credential decisions matching `filter`, newest first.
    async fn audit(&self, filter: AuditFilter) -> NodeResult<Vec<AuditEvent>>;
}

/// The nodes the control plane places sandboxes on, by name. Cheap to clone.
#[derive(Clone)]
pub struct Nodes {
    by_name: Arc<BTreeMap<String, Arc<dyn NodeApi>>>,
}

impl Nodes {
    /// The set of exactly one node (the single-machine default).
    pub fn single(node: Arc<dyn NodeApi>) -> Nodes {
        Nodes {
            by_name: Arc::new(BTreeMap::from([(node.name().to_owned(), node)])),
        }
    }

    /// The node called `name`; a name no node has is `node_unavailable` (its node left).
    pub fn get(&self, name: &str) -> NodeResult<&Arc<dyn NodeApi>> {
        self.by_name
            .get(name)
            .ok_or_else(|| NodeCallError::Unavailable {
                node: name.to_owned(),
                reason: "no such node is registered".into(),
            })
    }

    /// Every node, by name.
    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn NodeApi>> {
        self.by_name.values()
    }

    /// The node a new sandbox of `resources` from the template `template_digest` goes to,
    /// by the scheduler's rules over what each node reports now; `excluded` names nodes
    /// that already failed this create. A node that cannot say is left out (as lost).
    pub async fn place(
        &self,
        resources: Resources,
        template_digest: &str,
        excluded: &[String],
    ) -> Result<Arc<dyn NodeApi>, NoPlacement> {
        let statuses = futures::future::join_all(self.all().map(|n| async move {
            let status = n.status().await;
            (n, status)
        }))
        .await;
        let mut views = Vec::with_capacity(statuses.len());
        for (node, status) in statuses {
            match status {
                Ok(status) => views.push(NodeView {
                    name: node.name().to_owned(),
                    state: NodeState::Ready,
                    status,
                }),
                Err(e) => {
                    tracing::warn!(node = node.name(), error = %e, "node status unavailable; not placing there");
                    views.push(NodeView {
                        name: node.name().to_owned(),
                        state: NodeState::Lost,
                        status: NodeStatus {
                            capacity: NO_CAPACITY,
                            used: NO_CAPACITY,
                            sandboxes: 0,
                            memory_images: Default::default(),
                            pool_ready: Default::default(),
                        },
                    });
                }
            }
        }
        let req = PlacementRequest {
            resources,
            template_digest,
            excluded,
        };
        let placement = scheduler::place(&views, &req)?;
        tracing::debug!(node = %placement.node, locality = ?placement.locality, "placed");
        self.by_name
            .get(&placement.node)
            .cloned()
            .ok_or(NoPlacement::NoNodes)
    }

    /// The template called `name`, from the first node that has it.
    pub async fn template(&self, name: &str) -> NodeResult<TemplateInfo> {
        let mut last = NodeCallError::TemplateNotFound {
            template: name.to_owned(),
        };
        for node in self.all() {
            match node.template(name).await {
                Ok(t) => return Ok(t),
                Err(e @ NodeCallError::TemplateNotFound { .. }) => last = e,
                Err(e) => {
                    tracing::warn!(node = node.name(), error = %e, "template lookup failed");
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Any one node, for what every node answers alike (the operator's egress ceiling, the
    /// templates every node is given).
    pub fn any(&self) -> NodeResult<&Arc<dyn NodeApi>> {
        self.all().next().ok_or_else(|| NodeCallError::Unavailable {
            node: String::new(),
            reason: "no node is registered".into(),
        })
    }

    // Credentials are held by every node (its gateways inject them): written to each, read
    // from any. (They move to the control plane's database with the many-nodes work.)

    /// Every credential (metadata only).
    pub async fn credentials(&self) -> NodeResult<Vec<Credential>> {
        self.any()?.credentials().await
    }

    /// Creates or replaces a credential on every node.
    pub async fn put_credential(
        &self,
        credential: &Credential,
        value: &SecretValue,
    ) -> NodeResult<()> {
        for node in self.all() {
            let copy = SecretValue::new(value.expose().to_owned()).map_err(|e| {
                NodeCallError::refused(space_core::ErrorCode::InvalidRequest, e.to_string())
            })?;
            node.put_credential(credential.clone(), copy).await?;
        }
        Ok(())
    }

    /// Deletes a credential from every node.
    pub async fn delete_credential(&self, id: &CredentialId) -> NodeResult<()> {
        for node in self.all() {
            node.delete_credential(id).await?;
        }
        Ok(())
    }

    /// Credential decisions matching `filter` on every node, newest first.
    pub async fn audit(&self, filter: &AuditFilter) -> NodeResult<Vec<AuditEvent>> {
        let mut events = Vec::new();
        for node in self.all() {
            events.extend(node.audit(filter.clone()).await?);
        }
        events.sort_by_key(|e| std::cmp::Reverse(e.ts_ms));
        events.truncate(filter.limit);
        Ok(events)
    }
}
