//! [`NodeApi`] for [`Node`]: what the control plane may ask of this node, whether it runs
//! in the control plane's process (the single-machine default) or behind the node agent.
//! Turns records and errors into what the control plane may see: views without node
//! internals, errors without paths.

use std::collections::BTreeMap;

use async_trait::async_trait;
use futures::StreamExt;
use space_core::egress::EgressPolicy;
use space_core::metrics::SandboxMetric;
use space_core::snapshot::SnapshotTrigger;
use space_core::template::{CachedTemplate, TemplateBuildStatus, TemplateInfo};
use space_core::{
    ErrorCode, LifecycleEntry, SandboxId, SandboxState, SnapshotDiff, SnapshotId, SnapshotInfo,
    SnapshotKind, TenantId,
};
use space_guest_client::{GuestClient, GuestError};
use space_node_proto::api::{EventFeed, EventNotice, NodeApi, NodeResult};
use space_node_proto::template::{BuildTemplate, CacheRemoval};
use space_node_proto::{
    CreateFromSnapshot, CreateSandbox, FetchSnapshot, NodeCallError, NodeStatus, PauseCause,
    PoolShape, ResumeSandbox, SandboxView, SnapshotHere, SnapshotOrigin, SnapshotRequest,
    SnapshotTaken, StopCause, StoreSnapshot, StoredSnapshot, SuspendSandbox,
};
use space_secrets::secret::SecretValue;
use space_secrets::{AuditEvent, AuditFilter, Credential, CredentialId, ManagerError};
use tokio::sync::broadcast;

use crate::{Node, NodeError};

/// Runs blocking node work (file reads) off the async threads.
async fn blocking<T, F>(node: &Node, f: F) -> NodeResult<T>
where
    T: Send + 'static,
    F: FnOnce(Node) -> Result<T, NodeError> + Send + 'static,
{
    let node = node.clone();
    tokio::task::spawn_blocking(move || f(node))
        .await
        .map_err(|e| NodeCallError::Internal {
            detail: format!("node task: {e}"),
        })?
        .map_err(call_error)
}

/// A node error as the control plane may see it: what a caller tells apart stays apart,
/// a guest's message is bounded and cleaned, node internals become `Internal`.
fn call_error(e: NodeError) -> NodeCallError {
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
fn guest_error(g: &GuestError) -> NodeCallError {
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

fn views(records: Vec<crate::SandboxRecord>) -> Vec<SandboxView> {
    records.iter().map(crate::SandboxRecord::view).collect()
}

fn with_origins(
    list: Vec<(SnapshotInfo, crate::SnapshotSource)>,
) -> Vec<(SnapshotInfo, SnapshotOrigin)> {
    list.into_iter().map(|(i, s)| (i, s.origin())).collect()
}

#[async_trait]
impl NodeApi for Node {
    fn name(&self) -> &str {
        self.name()
    }

    async fn check_egress_policy(&self, policy: &EgressPolicy) -> NodeResult<()> {
        self.egress_ceiling()
            .check(policy)
            .map_err(|e| call_error(NodeError::BeyondCeiling(e)))
    }

    async fn status(&self) -> NodeResult<NodeStatus> {
        self.status().await.map_err(call_error)
    }

    async fn sandbox(&self, id: &SandboxId) -> NodeResult<Option<SandboxView>> {
        // A template build's builder is the node's own.
        Ok(self
            .sandbox(id)
            .filter(|r| r.template_build.is_none())
            .map(|r| r.view()))
    }

    async fn sandboxes(&self) -> NodeResult<Vec<SandboxView>> {
        let mut records = self.sandboxes();
        records.retain(|r| r.template_build.is_none());
        Ok(views(records))
    }

    async fn create_sandbox(&self, req: CreateSandbox) -> NodeResult<SandboxView> {
        let record = self.create_sandbox(req).await.map_err(call_error)?;
        Ok(record.view())
    }

    async fn create_from_snapshot(&self, req: CreateFromSnapshot) -> NodeResult<SandboxView> {
        let record = self
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
            .fork(parent, children, from)
            .await
            .map_err(call_error)?;
        Ok(views(records))
    }

    async fn pause(&self, id: &SandboxId, cause: PauseCause) -> NodeResult<SandboxView> {
        let r = self.pause_sandbox(id, cause).await.map_err(call_error)?;
        Ok(r.view())
    }

    async fn resume(&self, id: &SandboxId) -> NodeResult<SandboxView> {
        let r = self.resume_sandbox(id).await.map_err(call_error)?;
        Ok(r.view())
    }

    async fn stop(&self, id: &SandboxId, cause: StopCause) -> NodeResult<SandboxView> {
        let r = self.stop_sandbox(id, cause).await.map_err(call_error)?;
        Ok(r.view())
    }

    async fn start(&self, id: &SandboxId) -> NodeResult<SandboxView> {
        let r = self.start_sandbox(id).await.map_err(call_error)?;
        Ok(r.view())
    }

    async fn rollback(&self, id: &SandboxId, to: &SnapshotId) -> NodeResult<SandboxView> {
        let r = self.rollback(id, to).await.map_err(call_error)?;
        Ok(r.view())
    }

    async fn delete(&self, id: &SandboxId) -> NodeResult<()> {
        match self.delete_sandbox(id).await {
            Ok(()) => Ok(()),
            // Gone already (unknown, or deleted by a concurrent delete between the node's
            // check and its transition): a delete is idempotent.
            Err(NodeError::SandboxNotFound(_)) => Ok(()),
            Err(NodeError::Lifecycle(l)) if l.state == space_core::SandboxState::Deleted => Ok(()),
            Err(e) => Err(call_error(e)),
        }
    }

    async fn wake_timed_out(&self, id: &SandboxId) -> NodeResult<bool> {
        self.wake_timed_out(id).await.map_err(call_error)
    }

    async fn guest(&self, id: &SandboxId) -> NodeResult<GuestClient> {
        self.guest_waking(id).await.map_err(call_error)
    }

    async fn process_env(&self, id: &SandboxId) -> NodeResult<BTreeMap<String, String>> {
        self.process_env(id).map_err(call_error)
    }

    async fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> NodeResult<String> {
        let id = id.clone();
        blocking(self, move |node| node.console_tail(&id, max_bytes)).await
    }

    async fn events(&self, id: &SandboxId) -> NodeResult<Vec<LifecycleEntry>> {
        self.events(id).map_err(call_error)
    }

    async fn subscribe_events(&self) -> NodeResult<EventFeed> {
        let rx = self.subscribe_events();
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
        self.metrics(id).map_err(call_error)
    }

    async fn set_egress_policy(
        &self,
        id: &SandboxId,
        policy: EgressPolicy,
    ) -> NodeResult<SandboxView> {
        let r = self.set_egress_policy(id, policy).map_err(call_error)?;
        Ok(r.view())
    }

    async fn set_default_connections(&self, limit: Option<u64>) -> NodeResult<()> {
        self.set_default_tenant_connections(limit);
        Ok(())
    }

    async fn set_tenant_connections(
        &self,
        tenant: &TenantId,
        limit: Option<Option<u64>>,
    ) -> NodeResult<()> {
        self.set_tenant_connections(tenant, limit);
        Ok(())
    }

    async fn snapshots(&self, id: &SandboxId) -> NodeResult<Vec<SnapshotInfo>> {
        self.snapshots(id).await.map_err(call_error)
    }

    async fn tenant_snapshots(&self, tenant: &TenantId) -> NodeResult<Vec<SnapshotInfo>> {
        let mut found: Vec<SnapshotInfo> = Vec::new();
        let sandboxes = NodeApi::sandboxes(self).await?;
        for view in sandboxes
            .iter()
            .filter(|v| v.tenant.as_ref() == Some(tenant) && v.state != SandboxState::Deleted)
        {
            match self.snapshots(&view.id).await {
                Ok(list) => found.extend(list),
                // Deleted meanwhile (its persistent snapshots are listed below).
                Err(NodeError::SandboxNotFound(_)) => {}
                Err(e) => return Err(call_error(e)),
            }
        }
        for (info, source) in self.persistent_snapshots().await.map_err(call_error)? {
            if source.tenant.as_ref() == Some(tenant) && !found.iter().any(|s| s.id == info.id) {
                found.push(info);
            }
        }
        Ok(found)
    }

    async fn take_snapshot(
        &self,
        id: &SandboxId,
        req: SnapshotRequest,
    ) -> NodeResult<SnapshotTaken> {
        match req.kind {
            SnapshotKind::Disk => self
                .snapshot_disk(id, req.label, SnapshotTrigger::Manual, req.persistent)
                .await
                .map(|snapshot| SnapshotTaken {
                    snapshot,
                    guest_pause_ms: None,
                }),
            SnapshotKind::Checkpoint => self
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
        self.delete_snapshot(id, snap).await.map_err(call_error)
    }

    async fn diff_snapshots(
        &self,
        id: &SandboxId,
        from: &SnapshotId,
        to: &SnapshotId,
        limit: usize,
    ) -> NodeResult<SnapshotDiff> {
        self.diff_snapshots(id, from, to, limit)
            .await
            .map_err(call_error)
    }

    async fn snapshot_origin(
        &self,
        id: &SandboxId,
        snap: &SnapshotId,
    ) -> NodeResult<Option<(SnapshotInfo, SnapshotOrigin)>> {
        let found = self.snapshot_source(id, snap).await.map_err(call_error)?;
        Ok(found.map(|(i, s)| (i, s.origin())))
    }

    async fn persistent_snapshots(&self) -> NodeResult<Vec<(SnapshotInfo, SnapshotOrigin)>> {
        let list = self.persistent_snapshots().await.map_err(call_error)?;
        Ok(with_origins(list))
    }

    async fn persistent_snapshot(
        &self,
        snap: &SnapshotId,
    ) -> NodeResult<Option<(SnapshotInfo, SnapshotOrigin)>> {
        let found = self.persistent_snapshot(snap).await.map_err(call_error)?;
        Ok(found.map(|(i, s)| (i, s.origin())))
    }

    async fn delete_persistent_snapshot(&self, snap: &SnapshotId) -> NodeResult<()> {
        self.delete_persistent_snapshot(snap)
            .await
            .map_err(call_error)
    }

    async fn templates(&self) -> NodeResult<Vec<TemplateInfo>> {
        blocking(self, |node| node.templates()).await
    }

    async fn template(&self, name: &str) -> NodeResult<TemplateInfo> {
        let owned = name.to_owned();
        match blocking(self, move |node| node.template(&owned)).await {
            // Not here: what the name means in the object store (fetched by a create).
            Err(NodeCallError::TemplateNotFound { .. }) => self
                .published_template(name)
                .await
                .map_err(call_error)?
                .ok_or_else(|| NodeCallError::TemplateNotFound {
                    template: name.to_owned(),
                }),
            found => found,
        }
    }

    async fn start_template_build(&self, req: BuildTemplate) -> NodeResult<TemplateBuildStatus> {
        self.start_template_build(req).map_err(call_error)
    }

    async fn template_build(&self, id: &str, logs_from: u64) -> NodeResult<TemplateBuildStatus> {
        Node::template_build(self, id, logs_from).map_err(call_error)
    }

    async fn delete_template(&self, name: &str) -> NodeResult<bool> {
        Node::delete_template(self, name).await.map_err(call_error)
    }

    async fn cached_templates(&self) -> NodeResult<Vec<CachedTemplate>> {
        Node::cached_templates(self).await.map_err(call_error)
    }

    async fn remove_cached_template(
        &self,
        digest: &str,
        unused_since_ms: i64,
    ) -> NodeResult<CacheRemoval> {
        Node::remove_cached_template(self, digest, unused_since_ms)
            .await
            .map_err(call_error)
    }

    async fn put_build_files(
        &self,
        sha256: &str,
        body: futures::stream::BoxStream<'static, Result<bytes::Bytes, std::io::Error>>,
    ) -> NodeResult<u64> {
        self.put_build_files(sha256, body).await.map_err(call_error)
    }

    async fn has_build_files(&self, sha256: &str) -> NodeResult<bool> {
        Ok(self.has_build_files(sha256))
    }

    async fn pool_status(&self) -> NodeResult<Vec<PoolShape>> {
        Ok(self.pool_status())
    }

    async fn credentials(&self) -> NodeResult<Vec<Credential>> {
        Ok(self.credentials().list())
    }

    async fn put_credential(&self, credential: Credential, value: SecretValue) -> NodeResult<()> {
        self.credentials()
            .put(credential, value)
            .await
            .map_err(credential_error)
    }

    async fn delete_credential(&self, id: &CredentialId) -> NodeResult<()> {
        self.credentials()
            .delete(id)
            .await
            .map_err(credential_error)
    }

    async fn lend_artifact_key(
        &self,
        tenant: &TenantId,
        key: &space_envelope::DataKey,
        valid_for: std::time::Duration,
    ) -> NodeResult<()> {
        let awaited = self
            .inner
            .artifact_keys
            .lend(tenant.clone(), key.duplicate(), valid_for)
            .map_err(call_error)?;
        if awaited {
            // The first moment this node can seal what a crash left in plaintext.
            let (node, tenant) = (self.clone(), tenant.clone());
            tokio::spawn(async move { node.seal_leftover_disks(&tenant).await });
        }
        Ok(())
    }

    async fn withdraw_artifact_key(&self, tenant: &TenantId) -> NodeResult<()> {
        if self.inner.artifact_keys.withdraw(tenant) {
            tracing::info!(%tenant, "artifact key withdrawn");
        }
        Ok(())
    }

    async fn suspend(&self, req: SuspendSandbox) -> NodeResult<StoredSnapshot> {
        self.suspend(req).await.map_err(call_error)
    }

    async fn abort_suspend(&self, id: &SandboxId) -> NodeResult<SandboxView> {
        self.abort_suspend(id)
            .await
            .map(|r| r.view())
            .map_err(call_error)
    }

    async fn resume_suspended(&self, req: ResumeSandbox) -> NodeResult<SandboxView> {
        self.resume_suspended(req)
            .await
            .map(|r| r.view())
            .map_err(call_error)
    }

    async fn store_snapshot(&self, req: StoreSnapshot) -> NodeResult<StoredSnapshot> {
        self.store_snapshot(req).await.map_err(call_error)
    }

    async fn fetch_snapshot(&self, req: FetchSnapshot) -> NodeResult<SnapshotHere> {
        self.fetch_snapshot(req).await.map_err(call_error)
    }

    async fn credentials_synced(&self, revision: u64) -> NodeResult<()> {
        self.inner
            .credentials
            .catalog_revision
            .store(revision, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    async fn audit(&self, filter: AuditFilter) -> NodeResult<Vec<AuditEvent>> {
        blocking(self, move |node| node.audit(&filter)).await
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
