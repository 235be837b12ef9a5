//! [`NodeApi`] for the node in this process (the single-machine default): calls
//! `space_node::Node` directly and turns its records and errors into what the control plane
//! may see. The one place the control plane touches `space_node` types.

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures::StreamExt;
use space_core::egress::{EgressCeiling, EgressPolicy};
use space_core::metrics::SandboxMetric;
use space_core::snapshot::SnapshotTrigger;
use space_core::template::TemplateInfo;
use space_core::{
    ErrorCode, LifecycleEntry, SandboxId, SnapshotDiff, SnapshotId, SnapshotInfo, SnapshotKind,
    TenantId,
};
use space_guest_client::GuestClient;
use space_node::{GuestError, Node, NodeError};
use space_secrets::secret::SecretValue;
use space_secrets::{AuditEvent, AuditFilter, Credential, CredentialId, ManagerError};
use tokio::sync::broadcast;

use super::{
    CreateFromSnapshot, CreateSandbox, EventFeed, EventNotice, NodeApi, NodeCallError, NodeResult,
    NodeStatus, PauseCause, PoolShape, SandboxView, SnapshotOrigin, SnapshotRequest, SnapshotTaken,
    StopCause,
};

/// The node running in this process.
#[derive(Clone)]
pub struct LocalNode {
    node: Node,
}

impl LocalNode {
    /// Wraps the node.
    pub fn new(node: Node) -> LocalNode {
        LocalNode { node }
    }

    /// The node itself (for the server's composition and for tests of node internals).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Runs blocking node work (file reads) off the async threads.
    async fn blocking<T, F>(&self, f: F) -> NodeResult<T>
    where
        T: Send + 'static,
        F: FnOnce(Node) -> Result<T, NodeError> + Send + 'static,
    {
        let node = self.node.clone();
        tokio::task::spawn_blocking(move || f(node))
            .await
            .map_err(|e| NodeCallError::Internal {
                detail: format!("node task: {e}"),
            })?
            .map_err(call_error)
    }
}

/// A node error as the control plane may see it: what a caller tells apart stays apart,
/// a guest's message is bounded and cleaned, node internals become `Internal`.
pub fn call_error(e: NodeError) -> NodeCallError {
    match e {
        NodeError::SandboxNotFound(sandbox) => NodeCallError::SandboxNotFound { sandbox },
        NodeError::SnapshotNotFound(snapshot) => NodeCallError::SnapshotNotFound { snapshot },
        NodeError::TemplateNotFound(template) => NodeCallError::TemplateNotFound { template },
        NodeError::Guest(g) => guest_error(&g),
        e @ (NodeError::NodeManager(_) | NodeError::Internal(_)) => NodeCallError::Internal {
            detail: e.to_string(),
        },
        other => NodeCallError::Refused { body: other.body() },
    }
}

/// A guest's error (its message came from the guest: bounded and cleaned).
pub fn guest_error(g: &GuestError) -> NodeCallError {
    NodeCallError::Refused {
        body: g.to_error_body().sanitised(),
    }
}

/// A credential manager's error; backend errors never carry a value (space-secrets'
/// invariant), but they name files: internal.
fn credential_error(e: ManagerError) -> NodeCallError {
    let code = match &e {
        ManagerError::Invalid(_) | ManagerError::Value(_) => ErrorCode::InvalidRequest,
        ManagerError::Duplicate { .. } => ErrorCode::AlreadyExists,
        ManagerError::NotFound(_) => ErrorCode::NotFound,
        ManagerError::TooMany => ErrorCode::Conflict,
        ManagerError::Backend(_) => {
            return NodeCallError::Internal {
                detail: e.to_string(),
            }
        }
    };
    let message = match &e {
        ManagerError::NotFound(id) => format!("credential {id} not found"),
        other => other.to_string(),
    };
    NodeCallError::refused(code, message)
}

fn views(records: Vec<space_node::SandboxRecord>) -> Vec<SandboxView> {
    records
        .iter()
        .map(space_node::SandboxRecord::view)
        .collect()
}

fn with_origins(
    list: Vec<(SnapshotInfo, space_node::SnapshotSource)>,
) -> Vec<(SnapshotInfo, SnapshotOrigin)> {
    list.into_iter().map(|(i, s)| (i, s.origin())).collect()
}

#[async_trait]
impl NodeApi for LocalNode {
    fn name(&self) -> &str {
        self.node.name()
    }

    fn egress_ceiling(&self) -> &EgressCeiling {
        self.node.egress_ceiling()
    }

    async fn status(&self) -> NodeResult<NodeStatus> {
        self.node.status().await.map_err(call_error)
    }

    async fn sandbox(&self, id: &SandboxId) -> NodeResult<Option<SandboxView>> {
        Ok(self.node.sandbox(id).map(|r| r.view()))
    }

    async fn sandboxes(&self) -> NodeResult<Vec<SandboxView>> {
        Ok(views(self.node.sandboxes()))
    }

    async fn create_sandbox(&self, req: CreateSandbox) -> NodeResult<SandboxView> {
        let record = self.node.create_sandbox(req).await.map_err(call_error)?;
        Ok(record.view())
    }

    async fn create_from_snapshot(&self, req: CreateFromSnapshot) -> NodeResult<SandboxView> {
        let record = self
            .node
            .create_sandbox_from_snapshot(req)
            .await
            .map_err(call_error)?;
        Ok(record.view())
    }

    async fn fork(
        &self,
        parent: &SandboxId,
        children: &[SandboxId],
        from: Option<&SnapshotId>,
    ) -> NodeResult<Vec<SandboxView>> {
        let records = self
            .node
            .fork(parent, children, from)
            .await
            .map_err(call_error)?;
        Ok(views(records))
    }

    async fn pause(&self, id: &SandboxId, cause: PauseCause) -> NodeResult<SandboxView> {
        let r = self
            .node
            .pause_sandbox(id, cause)
            .await
            .map_err(call_error)?;
        Ok(r.view())
    }

    async fn resume(&self, id: &SandboxId) -> NodeResult<SandboxView> {
        let r = self.node.resume_sandbox(id).await.map_err(call_error)?;
        Ok(r.view())
    }

    async fn stop(&self, id: &SandboxId, cause: StopCause) -> NodeResult<SandboxView> {
        let r = self
            .node
            .stop_sandbox(id, cause)
            .await
            .map_err(call_error)?;
        Ok(r.view())
    }

    async fn start(&self, id: &SandboxId) -> NodeResult<SandboxView> {
        let r = self.node.start_sandbox(id).await.map_err(call_error)?;
        Ok(r.view())
    }

    async fn rollback(&self, id: &SandboxId, to: &SnapshotId) -> NodeResult<SandboxView> {
        let r = self.node.rollback(id, to).await.map_err(call_error)?;
        Ok(r.view())
    }

    async fn delete(&self, id: &SandboxId) -> NodeResult<()> {
        self.node.delete_sandbox(id).await.map_err(call_error)
    }

    async fn wake_timed_out(&self, id: &SandboxId) -> NodeResult<bool> {
        self.node.wake_timed_out(id).await.map_err(call_error)
    }

    async fn guest(&self, id: &SandboxId) -> NodeResult<GuestClient> {
        self.node.guest_waking(id).await.map_err(call_error)
    }

    async fn process_env(&self, id: &SandboxId) -> NodeResult<BTreeMap<String, String>> {
        self.node.process_env(id).map_err(call_error)
    }

    async fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> NodeResult<String> {
        let id = id.clone();
        self.blocking(move |node| node.console_tail(&id, max_bytes))
            .await
    }

    async fn events(&self, id: &SandboxId) -> NodeResult<Vec<LifecycleEntry>> {
        self.node.events(id).map_err(call_error)
    }

    async fn subscribe_events(&self) -> NodeResult<EventFeed> {
        let rx = self.node.subscribe_events();
        let feed = futures::stream::unfold(rx, |mut rx| async move {
            match rx.recv().await {
                Ok(entry) => Some((EventNotice::Entry(entry), rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => Some((EventNotice::Lagged, rx)),
                Err(broadcast::error::RecvError::Closed) => None,
            }
        });
        Ok(feed.boxed())
    }

    async fn metrics(&self, id: &SandboxId) -> NodeResult<Vec<SandboxMetric>> {
        self.node.metrics(id).map_err(call_error)
    }

    async fn set_egress_policy(
        &self,
        id: &SandboxId,
        policy: EgressPolicy,
    ) -> NodeResult<SandboxView> {
        let r = self
            .node
            .set_egress_policy(id, policy)
            .map_err(call_error)?;
        Ok(r.view())
    }

    async fn set_default_connections(&self, limit: Option<u64>) -> NodeResult<()> {
        self.node.set_default_tenant_connections(limit);
        Ok(())
    }

    async fn set_tenant_connections(
        &self,
        tenant: &TenantId,
        limit: Option<Option<u64>>,
    ) -> NodeResult<()> {
        self.node.set_tenant_connections(tenant, limit);
        Ok(())
    }

    async fn snapshots(&self, id: &SandboxId) -> NodeResult<Vec<SnapshotInfo>> {
        self.node.snapshots(id).await.map_err(call_error)
    }

    async fn take_snapshot(
        &self,
        id: &SandboxId,
        req: SnapshotRequest,
    ) -> NodeResult<SnapshotTaken> {
        match req.kind {
            SnapshotKind::Disk => self
                .node
                .snapshot_disk(id, req.label, SnapshotTrigger::Manual, req.persistent)
                .await
                .map(|snapshot| SnapshotTaken {
                    snapshot,
                    guest_pause_ms: None,
                }),
            SnapshotKind::Checkpoint => self
                .node
                .checkpoint(id, req.label, SnapshotTrigger::Manual, req.persistent)
                .await
                .map(|t| SnapshotTaken {
                    snapshot: t.info,
                    guest_pause_ms: t
                        .guest_pause
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                }),
        }
        .map_err(call_error)
    }

    async fn delete_snapshot(&self, id: &SandboxId, snap: &SnapshotId) -> NodeResult<()> {
        self.node
            .delete_snapshot(id, snap)
            .await
            .map_err(call_error)
    }

    async fn diff_snapshots(
        &self,
        id: &SandboxId,
        from: &SnapshotId,
        to: &SnapshotId,
        limit: usize,
    ) -> NodeResult<SnapshotDiff> {
        self.node
            .diff_snapshots(id, from, to, limit)
            .await
            .map_err(call_error)
    }

    async fn snapshot_origin(
        &self,
        id: &SandboxId,
        snap: &SnapshotId,
    ) -> NodeResult<Option<(SnapshotInfo, SnapshotOrigin)>> {
        let found = self
            .node
            .snapshot_source(id, snap)
            .await
            .map_err(call_error)?;
        Ok(found.map(|(i, s)| (i, s.origin())))
    }

    async fn persistent_snapshots(&self) -> NodeResult<Vec<(SnapshotInfo, SnapshotOrigin)>> {
        let list = self.node.persistent_snapshots().await.map_err(call_error)?;
        Ok(with_origins(list))
    }

    async fn persistent_snapshot(
        &self,
        snap: &SnapshotId,
    ) -> NodeResult<Option<(SnapshotInfo, SnapshotOrigin)>> {
        let found = self
            .node
            .persistent_snapshot(snap)
            .await
            .map_err(call_error)?;
        Ok(found.map(|(i, s)| (i, s.origin())))
    }

    async fn delete_persistent_snapshot(&self, snap: &SnapshotId) -> NodeResult<()> {
        self.node
            .delete_persistent_snapshot(snap)
            .await
            .map_err(call_error)
    }

    async fn templates(&self) -> NodeResult<Vec<TemplateInfo>> {
        self.blocking(|node| node.templates()).await
    }

    async fn template(&self, name: &str) -> NodeResult<TemplateInfo> {
        let name = name.to_owned();
        self.blocking(move |node| node.template(&name)).await
    }

    async fn pool_status(&self) -> NodeResult<Vec<PoolShape>> {
        Ok(self.node.pool_status())
    }

    async fn credentials(&self) -> NodeResult<Vec<Credential>> {
        Ok(self.node.credentials().list())
    }

    async fn put_credential(&self, credential: Credential, value: SecretValue) -> NodeResult<()> {
        self.node
            .credentials()
            .put(credential, value)
            .await
            .map_err(credential_error)
    }

    async fn delete_credential(&self, id: &CredentialId) -> NodeResult<()> {
        self.node
            .credentials()
            .delete(id)
            .await
            .map_err(credential_error)
    }

    async fn audit(&self, filter: AuditFilter) -> NodeResult<Vec<AuditEvent>> {
        self.blocking(move |node| node.audit(&filter)).await
    }
}

#[cfg(test)]
mod tests {
    use space_core::SandboxState;

    use super::*;

    #[test]
    fn node_internals_do_not_reach_clients() {
        let e = call_error(NodeError::Internal("/var/lib/space/store/x: EIO".into()));
        assert_eq!(e.code(), ErrorCode::Internal);
        let e = call_error(NodeError::WrongState {
            action: "take a disk snapshot of",
            state: SandboxState::Stopped,
        });
        assert_eq!(e.code(), ErrorCode::Conflict);
        let id = SandboxId::generate();
        assert!(call_error(NodeError::SandboxNotFound(id)).is_sandbox_not_found());
    }

    #[test]
    fn credential_errors_keep_their_codes() {
        let id = CredentialId::generate();
        let e = credential_error(ManagerError::NotFound(id.clone()));
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert!(
            e.to_string()
                .contains(&format!("credential {id} not found")),
            "{e}"
        );
        assert_eq!(
            credential_error(ManagerError::TooMany).code(),
            ErrorCode::Conflict
        );
    }
}
