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
use std::sync::{Arc, RwLock};

use space_core::template::TemplateInfo;
use space_core::Resources;
pub use space_node_proto::api::{EventFeed, EventNotice, NodeApi, NodeResult};
pub use space_node_proto::{
    CreateFromSnapshot, CreateSandbox, FetchSnapshot, NodeCallError, NodeStatus, PauseCause,
    PoolShape, ResumeSandbox, SandboxSettings, SandboxView, SnapshotHere, SnapshotOrigin,
    SnapshotOwner, SnapshotRequest, SnapshotTaken, StopCause, StoreSnapshot, StoredArtifact,
    StoredSettings, StoredSnapshot, SuspendSandbox, VmOrigin,
};
use space_secrets::{AuditEvent, AuditFilter};

use crate::db::{NodeLiveness, NodeRow};
use crate::scheduler::{self, NoPlacement, NodeState, NodeView, PlacementRequest};

/// One member of the set.
#[derive(Clone)]
struct Member {
    api: Arc<dyn NodeApi>,
    state: NodeState,
    /// Where its agent is (remote nodes only): a new address is a new client.
    address: Option<String>,
}

/// How the control plane dials node agents (its client identity and the cluster CA).
pub type NodeDialer = Arc<rustls::ClientConfig>;

/// The nodes the control plane places sandboxes on, by name. Cheap to clone; every clone
/// sees the same membership.
///
/// Two shapes: [`Nodes::single`], the one in-process node of the single-machine default
/// (always ready, no membership rows), and [`Nodes::cluster`], the nodes of the database's
/// `nodes` table, kept current by [`Nodes::refresh`] (each replica refreshes its own copy
/// every few seconds: the database is the truth).
#[derive(Clone)]
pub struct Nodes {
    members: Arc<RwLock<BTreeMap<String, Member>>>,
    /// `Some` for a cluster: how new members are dialled.
    dialer: Option<NodeDialer>,
}

impl Nodes {
    /// The set of exactly one node (the single-machine default).
    pub fn single(node: Arc<dyn NodeApi>) -> Nodes {
        let member = Member {
            api: node.clone(),
            state: NodeState::Ready,
            address: None,
        };
        Nodes {
            members: Arc::new(RwLock::new(BTreeMap::from([(
                node.name().to_owned(),
                member,
            )]))),
            dialer: None,
        }
    }

    /// The nodes of a cluster, none until the first [`Nodes::refresh`].
    pub fn cluster(dialer: NodeDialer) -> Nodes {
        Nodes {
            members: Default::default(),
            dialer: Some(dialer),
        }
    }

    /// Whether this is a cluster's set (membership from the database).
    pub fn is_cluster(&self) -> bool {
        self.dialer.is_some()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Member>> {
        // A panic while holding the lock leaves a map that is still whole: carry on.
        self.members.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes the set the nodes of `rows` (a cluster only): new nodes get a client, a node
    /// whose address changed a new one, removed nodes are dropped, and every node takes
    /// the state its row says (lost before cordoned before ready).
    pub fn refresh(&self, rows: &[NodeRow]) {
        let Some(dialer) = &self.dialer else {
            return;
        };
        let mut members = self.members.write().unwrap_or_else(|p| p.into_inner());
        let mut next = BTreeMap::new();
        for row in rows {
            let state = match (row.liveness, row.cordoned) {
                (NodeLiveness::Lost, _) => NodeState::Lost,
                (NodeLiveness::Ready, true) => NodeState::Cordoned,
                (NodeLiveness::Ready, false) => NodeState::Ready,
            };
            let api = match members.get(&row.name) {
                Some(m) if m.address.as_deref() == Some(row.address.as_str()) => m.api.clone(),
                _ => match remote::RemoteNode::for_node(&row.name, &row.address, dialer.clone()) {
                    Ok(node) => Arc::new(node) as Arc<dyn NodeApi>,
                    Err(e) => {
                        tracing::warn!(node = %row.name, error = %e, "cannot address node; leaving it out");
                        continue;
                    }
                },
            };
            next.insert(
                row.name.clone(),
                Member {
                    api,
                    state,
                    address: Some(row.address.clone()),
                },
            );
        }
        *members = next;
    }

    /// The node called `name`, to call; a lost node or a name no node has is
    /// `node_unavailable`.
    pub fn get(&self, name: &str) -> NodeResult<Arc<dyn NodeApi>> {
        let unavailable = |reason: &str| NodeCallError::Unavailable {
            node: name.to_owned(),
            reason: reason.to_owned(),
            sent: false,
        };
        match self.read().get(name) {
            None => Err(unavailable("no such node is registered")),
            Some(m) if m.state == NodeState::Lost => Err(unavailable(
                "the node is lost (it missed its heartbeats); its sandboxes are back when it rejoins",
            )),
            Some(m) => Ok(m.api.clone()),
        }
    }

    /// The node called `name` whatever its state (the rejoin reconciles a lost node).
    pub fn get_any_state(&self, name: &str) -> Option<Arc<dyn NodeApi>> {
        self.read().get(name).map(|m| m.api.clone())
    }

    /// The state of node `name`, if it is a member.
    pub fn state(&self, name: &str) -> Option<NodeState> {
        self.read().get(name).map(|m| m.state)
    }

    /// Every node that can be called (not lost), by name.
    pub fn all(&self) -> Vec<Arc<dyn NodeApi>> {
        self.read()
            .values()
            .filter(|m| m.state != NodeState::Lost)
            .map(|m| m.api.clone())
            .collect()
    }

    /// The names of the lost nodes (not called until they rejoin).
    pub fn lost(&self) -> Vec<String> {
        self.read()
            .iter()
            .filter(|(_, m)| m.state == NodeState::Lost)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The node a new sandbox of `resources` from the template `template_digest` goes to,
    /// by the scheduler's rules over what each ready node reports now; `excluded` names
    /// nodes that already failed this create. A ready node that cannot say is left out
    /// (as lost); cordoned and lost nodes are not asked.
    pub async fn place(
        &self,
        resources: Resources,
        template_digest: &str,
        excluded: &[String],
    ) -> Result<Arc<dyn NodeApi>, NoPlacement> {
        let members: Vec<(String, Member)> = self
            .read()
            .iter()
            .map(|(n, m)| (n.clone(), m.clone()))
            .collect();
        let statuses = futures::future::join_all(members.iter().map(|(_, m)| async move {
            match m.state {
                NodeState::Ready => Some(m.api.status().await),
                NodeState::Cordoned | NodeState::Lost => None,
            }
        }))
        .await;
        let mut views = Vec::with_capacity(statuses.len());
        for ((name, member), status) in members.iter().zip(statuses) {
            let (state, status) = match status {
                Some(Ok(status)) => (NodeState::Ready, Some(status)),
                Some(Err(e)) => {
                    tracing::warn!(node = %name, error = %e, "node status unavailable; not placing there");
                    (NodeState::Lost, None)
                }
                None => (member.state, None),
            };
            views.push(NodeView {
                name: name.clone(),
                state,
                status,
            });
        }
        let req = PlacementRequest {
            resources,
            template_digest,
            excluded,
        };
        let placement = scheduler::place(&views, &req)?;
        tracing::debug!(node = %placement.node, locality = ?placement.locality, "placed");
        members
            .into_iter()
            .find(|(n, _)| *n == placement.node)
            .map(|(_, m)| m.api)
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

    /// The node template builds go to: the first ready (not cordoned) node by name, so
    /// builds stay on one node while it is ready and find their step cache there again.
    pub fn for_builds(&self) -> NodeResult<Arc<dyn NodeApi>> {
        self.read()
            .values()
            .find(|m| m.state == NodeState::Ready)
            .map(|m| m.api.clone())
            .ok_or_else(|| NodeCallError::Unavailable {
                node: String::new(),
                reason: "no node is ready for a build".into(),
                sent: false,
            })
    }

    /// Any one node, for what every node answers alike (the operator's egress ceiling, the
    /// templates every node is given).
    pub fn any(&self) -> NodeResult<Arc<dyn NodeApi>> {
        self.all()
            .into_iter()
            .next()
            .ok_or_else(|| NodeCallError::Unavailable {
                node: String::new(),
                reason: "no node is registered".into(),
                sent: false,
            })
    }

    // Credentials are desired state in the control plane's catalog; each node holds the
    // copies its gateways inject (`service::credentials` syncs them).

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
