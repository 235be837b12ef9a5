//! The control plane's view of nodes: every node is reached through [`NodeApi`], whether it
//! runs in this process (the single-machine default: `space_guest_client::Node` itself) or on
//! another machine ([`remote::RemoteNode`], a client of its node agent); [`Nodes`] is the
//! set of them, by name.
//!
//! Invariant: nothing above this module sees node internals (its store, credential
//! manager, VMM pids or VM names). A node is the source of truth for the live state of its
//! sandboxes; the control plane keeps desired state and placements in its database and asks
//! the node named by a sandbox's row.

pub mod remote;

use std::collections::BTreeMap;
use std::sync::Arc;

use space_core::template::TemplateInfo;
use space_core::{NodeCapacity, Resources};
pub use space_node_proto::api::{EventFeed, EventNotice, NodeApi, NodeResult};
pub use space_node_proto::{
    CreateFromSnapshot, CreateSandbox, NodeCallError, NodeStatus, PauseCause, PoolShape,
    SandboxSettings, SandboxView, SnapshotOrigin, SnapshotOwner, SnapshotRequest, SnapshotTaken,
    StopCause, VmOrigin,
};
use space_secrets::secret::SecretValue;
use space_secrets::{AuditEvent, AuditFilter, Credential, CredentialId};

const NO_CAPACITY: NodeCapacity = NodeCapacity {
    vcpus: 0,
    memory_mib: 0,
    disk_mib: 0,
};

use crate::scheduler::{self, NoPlacement, NodeState, NodeView, PlacementRequest};

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
