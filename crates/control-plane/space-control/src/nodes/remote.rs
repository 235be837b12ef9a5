//! [`RemoteNode`]: [`NodeApi`] over the network, as a client of a node agent (the node
//! protocol of `space_node_proto::wire`, HTTP/2 over mutual TLS).
//!
//! One HTTP/2 connection per node carries every call, the event stream and the guest relay
//! of all its sandboxes; it is opened on first use and again after it breaks. Everything
//! read from the node is bounded (the guest client's transport: frame, header and body
//! limits, timeouts, keep-alive). A node that cannot be reached, or answers out of protocol,
//! is [`NodeCallError::Unavailable`]: the one call fails, nothing else.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use rustls::pki_types::ServerName;
use serde::de::DeserializeOwned;
use space_core::egress::EgressPolicy;
use space_core::metrics::SandboxMetric;
use space_core::template::{CachedTemplate, TemplateBuildStatus, TemplateInfo};
use space_core::{LifecycleEntry, SandboxId, SnapshotDiff, SnapshotId, SnapshotInfo, TenantId};
use space_guest_client::{ready_of, ClientOptions, GuestClient, GuestError, NodeConnection};
use space_node_proto::template::{BuildTemplate, CacheRemoval};
use space_node_proto::wire::{
    guest_prefix, GuestReady, NodeRequest, SecretString, WireEvent, WireReply, CALL_PATH,
    EVENTS_PATH, MAX_EVENT_LINE, MAX_REPLY_BODY,
};
use space_secrets::secret::SecretValue;
use space_secrets::{AuditEvent, AuditFilter, Credential, CredentialId};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use super::{
    CreateFromSnapshot, CreateSandbox, EventFeed, EventNotice, FetchSnapshot, NodeApi,
    NodeCallError, NodeResult, NodeStatus, PauseCause, PoolShape, ResumeSandbox, SandboxView,
    SnapshotHere, SnapshotOrigin, SnapshotRequest, SnapshotTaken, StopCause, StoreSnapshot,
    StoredSnapshot, SuspendSandbox,
};

/// Longest wait for a TCP connection and TLS handshake with a node agent.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a query (a listing, a status) may take.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest a lifecycle operation may take (a create that builds a memory image, a
/// checkpoint of a large memory under TCG).
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// Longest a suspend or a resume through object storage may take (a whole snapshot's
/// memory and disk changes go up or come down).
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// Where a node agent is and how to reach it.
#[derive(Clone)]
pub struct NodeAddress {
    /// The node's name.
    pub name: String,
    /// `host:port` of its agent.
    pub addr: String,
    /// The name its certificate must hold (the cluster CA issues node certificates for
    /// `space_node_proto::identity::node_dns_name`).
    pub server_name: ServerName<'static>,
    /// The control plane's client identity and the cluster CA.
    pub tls: Arc<rustls::ClientConfig>,
}

/// A node reached over the network.
pub struct RemoteNode {
    address: NodeAddress,
    conn: Mutex<Option<NodeConnection>>,
}

impl RemoteNode {
    /// A node at `address`; nothing is dialled until the first call.
    pub fn new(address: NodeAddress) -> RemoteNode {
        RemoteNode {
            address,
            conn: Mutex::new(None),
        }
    }

    /// Node `name` of the cluster, whose agent listens at `addr` (`host:port`), dialled
    /// with `tls` and expected to prove it is that node (its certificate's DNS name).
    pub fn for_node(
        name: &str,
        addr: &str,
        tls: Arc<rustls::ClientConfig>,
    ) -> Result<RemoteNode, space_node_proto::identity::IdentityError> {
        space_node_proto::identity::check_node_name(name)?;
        let server_name = ServerName::try_from(space_node_proto::identity::node_dns_name(name))
            .map_err(|e| space_node_proto::identity::IdentityError::Malformed(e.to_string()))?;
        Ok(RemoteNode::new(NodeAddress {
            name: name.to_owned(),
            addr: addr.to_owned(),
            server_name,
            tls,
        }))
    }

    /// The node could not be reached: the request was not sent.
    fn unavailable(&self, reason: impl std::fmt::Display) -> NodeCallError {
        NodeCallError::Unavailable {
            node: self.address.name.clone(),
            reason: reason.to_string(),
            sent: false,
        }
    }

    /// The open connection, or a new one.
    async fn connection(&self) -> NodeResult<NodeConnection> {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(conn.clone());
        }
        let conn = tokio::time::timeout(CONNECT_TIMEOUT, self.dial())
            .await
            .map_err(|_| self.unavailable(format!("no connection within {CONNECT_TIMEOUT:?}")))??;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    async fn dial(&self) -> NodeResult<NodeConnection> {
        let a = &self.address;
        let tcp = TcpStream::connect(&a.addr)
            .await
            .map_err(|e| self.unavailable(format!("connecting to {}: {e}", a.addr)))?;
        let _ = tcp.set_nodelay(true);
        let tls = tokio_rustls::TlsConnector::from(a.tls.clone())
            .connect(a.server_name.clone(), tcp)
            .await
            .map_err(|e| self.unavailable(format!("TLS with {}: {e}", a.addr)))?;
        NodeConnection::start(tls, ClientOptions::default())
            .await
            .map_err(|e| self.unavailable(e))
    }

    /// One typed call.
    async fn call<T: DeserializeOwned + Send + 'static>(&self, req: NodeRequest) -> NodeResult<T> {
        let timeout = timeout_of(&req);
        let body = serde_json::to_vec(&req).map_err(|e| NodeCallError::Internal {
            detail: format!("encoding a node call: {e}"),
        })?;
        let conn = self.connection().await?;
        let reply: WireReply<T> = conn
            .post_json(CALL_PATH, Bytes::from(body), MAX_REPLY_BODY, timeout)
            .await
            .map_err(|e| self.call_failed(e))?;
        match reply {
            WireReply::Ok(v) => Ok(v),
            WireReply::Err(e) => Err(e),
        }
    }

    fn call_failed(&self, e: GuestError) -> NodeCallError {
        match e {
            // The agent refused the request itself (its ErrorBody): the protocol worked.
            GuestError::Remote { body, .. } if body.code.http_status() < 500 => {
                NodeCallError::Refused { body }
            }
            // Sent, but no answer in protocol: the node may have acted on it.
            other => NodeCallError::Unavailable {
                node: self.address.name.clone(),
                reason: other.to_string(),
                sent: true,
            },
        }
    }
}

/// Files for build steps' `COPY` reach remote nodes through the object store only (the
/// node protocol carries no bulk uploads).
fn no_build_files() -> NodeCallError {
    NodeCallError::refused(
        space_core::ErrorCode::InvalidRequest,
        "files for COPY reach a cluster's nodes through the object store, and this control plane has none (`--object-store`)",
    )
}

/// How long a call may take: operations that boot, save or restore VMs get long.
fn timeout_of(req: &NodeRequest) -> Duration {
    match req {
        NodeRequest::CreateSandbox { .. }
        | NodeRequest::CreateFromSnapshot { .. }
        | NodeRequest::Fork { .. }
        | NodeRequest::Pause { .. }
        | NodeRequest::Resume { .. }
        | NodeRequest::Stop { .. }
        | NodeRequest::Start { .. }
        | NodeRequest::Rollback { .. }
        | NodeRequest::Delete { .. }
        | NodeRequest::WakeTimedOut { .. }
        | NodeRequest::Guest { .. }
        | NodeRequest::TakeSnapshot { .. }
        | NodeRequest::DiffSnapshots { .. }
        | NodeRequest::AbortSuspend { .. } => OPERATION_TIMEOUT,
        // Uploads and downloads of a whole snapshot: memory and disk.
        NodeRequest::Suspend { .. }
        | NodeRequest::ResumeSuspended { .. }
        | NodeRequest::StoreSnapshot { .. }
        | NodeRequest::FetchSnapshot { .. } => TRANSFER_TIMEOUT,
        _ => QUERY_TIMEOUT,
    }
}

#[async_trait]
impl NodeApi for RemoteNode {
    fn name(&self) -> &str {
        &self.address.name
    }

    async fn check_egress_policy(&self, policy: &EgressPolicy) -> NodeResult<()> {
        self.call(NodeRequest::CheckEgressPolicy {
            policy: policy.clone(),
        })
        .await
    }

    async fn status(&self) -> NodeResult<NodeStatus> {
        self.call(NodeRequest::Status).await
    }

    async fn sandbox(&self, id: &SandboxId) -> NodeResult<Option<SandboxView>> {
        self.call(NodeRequest::Sandbox { id: id.clone() }).await
    }

    async fn sandboxes(&self) -> NodeResult<Vec<SandboxView>> {
        self.call(NodeRequest::Sandboxes).await
    }

    async fn create_sandbox(&self, req: CreateSandbox) -> NodeResult<SandboxView> {
        self.call(NodeRequest::CreateSandbox { req }).await
    }

    async fn create_from_snapshot(&self, req: CreateFromSnapshot) -> NodeResult<SandboxView> {
        self.call(NodeRequest::CreateFromSnapshot { req }).await
    }

    async fn fork(
        &self,
        parent: &SandboxId,
        children: &[SandboxId],
        from: Option<&SnapshotId>,
    ) -> NodeResult<Vec<SandboxView>> {
        self.call(NodeRequest::Fork {
            parent: parent.clone(),
            children: children.to_vec(),
            from: from.cloned(),
        })
        .await
    }

    async fn pause(&self, id: &SandboxId, cause: PauseCause) -> NodeResult<SandboxView> {
        self.call(NodeRequest::Pause {
            id: id.clone(),
            cause,
        })
        .await
    }

    async fn resume(&self, id: &SandboxId) -> NodeResult<SandboxView> {
        self.call(NodeRequest::Resume { id: id.clone() }).await
    }

    async fn stop(&self, id: &SandboxId, cause: StopCause) -> NodeResult<SandboxView> {
        self.call(NodeRequest::Stop {
            id: id.clone(),
            cause,
        })
        .await
    }

    async fn start(&self, id: &SandboxId) -> NodeResult<SandboxView> {
        self.call(NodeRequest::Start { id: id.clone() }).await
    }

    async fn rollback(&self, id: &SandboxId, to: &SnapshotId) -> NodeResult<SandboxView> {
        self.call(NodeRequest::Rollback {
            id: id.clone(),
            to: to.clone(),
        })
        .await
    }

    async fn delete(&self, id: &SandboxId) -> NodeResult<()> {
        self.call(NodeRequest::Delete { id: id.clone() }).await
    }

    async fn wake_timed_out(&self, id: &SandboxId) -> NodeResult<bool> {
        self.call(NodeRequest::WakeTimedOut { id: id.clone() })
            .await
    }

    async fn guest(&self, id: &SandboxId) -> NodeResult<GuestClient> {
        let ready: GuestReady = self.call(NodeRequest::Guest { id: id.clone() }).await?;
        let conn = self.connection().await?;
        Ok(conn.guest(
            guest_prefix(id),
            ready_of(ready.version, ready.boot_id, ready.daemon_version),
        ))
    }

    async fn process_env(&self, id: &SandboxId) -> NodeResult<BTreeMap<String, String>> {
        self.call(NodeRequest::ProcessEnv { id: id.clone() }).await
    }

    async fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> NodeResult<String> {
        self.call(NodeRequest::ConsoleTail {
            id: id.clone(),
            max_bytes,
        })
        .await
    }

    async fn events(&self, id: &SandboxId) -> NodeResult<Vec<LifecycleEntry>> {
        self.call(NodeRequest::Events { id: id.clone() }).await
    }

    async fn subscribe_events(&self) -> NodeResult<EventFeed> {
        let conn = self.connection().await?;
        let lines = conn
            .ndjson::<WireEvent>(EVENTS_PATH, MAX_EVENT_LINE)
            .await
            .map_err(|e| self.unavailable(e))?;
        let node = self.address.name.clone();
        // A broken stream ends the feed (its followers then re-read the log).
        let feed = lines
            .take_while(move |line| {
                if let Err(e) = line {
                    tracing::warn!(node = %node, error = %e, "node event stream ended");
                }
                std::future::ready(line.is_ok())
            })
            .filter_map(|line| {
                std::future::ready(match line {
                    Ok(WireEvent::Entry(entry)) => Some(EventNotice::Entry(entry)),
                    Ok(WireEvent::Lagged) => Some(EventNotice::Lagged),
                    Err(_) => None,
                })
            });
        Ok(feed.boxed())
    }

    async fn metrics(&self, id: &SandboxId) -> NodeResult<Vec<SandboxMetric>> {
        self.call(NodeRequest::Metrics { id: id.clone() }).await
    }

    async fn set_egress_policy(
        &self,
        id: &SandboxId,
        policy: EgressPolicy,
    ) -> NodeResult<SandboxView> {
        self.call(NodeRequest::SetEgressPolicy {
            id: id.clone(),
            policy,
        })
        .await
    }

    async fn set_default_connections(&self, limit: Option<u64>) -> NodeResult<()> {
        self.call(NodeRequest::SetDefaultConnections { limit })
            .await
    }

    async fn set_tenant_connections(
        &self,
        tenant: &TenantId,
        limit: Option<Option<u64>>,
    ) -> NodeResult<()> {
        self.call(NodeRequest::SetTenantConnections {
            tenant: tenant.clone(),
            limit,
        })
        .await
    }

    async fn snapshots(&self, id: &SandboxId) -> NodeResult<Vec<SnapshotInfo>> {
        self.call(NodeRequest::Snapshots { id: id.clone() }).await
    }

    async fn suspend(&self, req: SuspendSandbox) -> NodeResult<StoredSnapshot> {
        self.call(NodeRequest::Suspend { req }).await
    }

    async fn abort_suspend(&self, id: &SandboxId) -> NodeResult<SandboxView> {
        self.call(NodeRequest::AbortSuspend { id: id.clone() })
            .await
    }

    async fn resume_suspended(&self, req: ResumeSandbox) -> NodeResult<SandboxView> {
        self.call(NodeRequest::ResumeSuspended { req }).await
    }

    async fn store_snapshot(&self, req: StoreSnapshot) -> NodeResult<StoredSnapshot> {
        self.call(NodeRequest::StoreSnapshot { req }).await
    }

    async fn fetch_snapshot(&self, req: FetchSnapshot) -> NodeResult<SnapshotHere> {
        self.call(NodeRequest::FetchSnapshot { req }).await
    }

    async fn credentials_synced(&self, revision: u64) -> NodeResult<()> {
        self.call(NodeRequest::CredentialsSynced { revision }).await
    }

    async fn tenant_snapshots(&self, tenant: &TenantId) -> NodeResult<Vec<SnapshotInfo>> {
        self.call(NodeRequest::TenantSnapshots {
            tenant: tenant.clone(),
        })
        .await
    }

    async fn take_snapshot(
        &self,
        id: &SandboxId,
        req: SnapshotRequest,
    ) -> NodeResult<SnapshotTaken> {
        self.call(NodeRequest::TakeSnapshot {
            id: id.clone(),
            req,
        })
        .await
    }

    async fn delete_snapshot(&self, id: &SandboxId, snap: &SnapshotId) -> NodeResult<()> {
        self.call(NodeRequest::DeleteSnapshot {
            id: id.clone(),
            snapshot: snap.clone(),
        })
        .await
    }

    async fn diff_snapshots(
        &self,
        id: &SandboxId,
        from: &SnapshotId,
        to: &SnapshotId,
        limit: usize,
    ) -> NodeResult<SnapshotDiff> {
        self.call(NodeRequest::DiffSnapshots {
            id: id.clone(),
            from: from.clone(),
            to: to.clone(),
            limit,
        })
        .await
    }

    async fn snapshot_origin(
        &self,
        id: &SandboxId,
        snap: &SnapshotId,
    ) -> NodeResult<Option<(SnapshotInfo, SnapshotOrigin)>> {
        self.call(NodeRequest::SnapshotOrigin {
            id: id.clone(),
            snapshot: snap.clone(),
        })
        .await
    }

    async fn persistent_snapshots(&self) -> NodeResult<Vec<(SnapshotInfo, SnapshotOrigin)>> {
        self.call(NodeRequest::PersistentSnapshots).await
    }

    async fn persistent_snapshot(
        &self,
        snap: &SnapshotId,
    ) -> NodeResult<Option<(SnapshotInfo, SnapshotOrigin)>> {
        self.call(NodeRequest::PersistentSnapshot {
            snapshot: snap.clone(),
        })
        .await
    }

    async fn delete_persistent_snapshot(&self, snap: &SnapshotId) -> NodeResult<()> {
        self.call(NodeRequest::DeletePersistentSnapshot {
            snapshot: snap.clone(),
        })
        .await
    }

    async fn templates(&self) -> NodeResult<Vec<TemplateInfo>> {
        self.call(NodeRequest::Templates).await
    }

    async fn template(&self, name: &str) -> NodeResult<TemplateInfo> {
        self.call(NodeRequest::Template {
            name: name.to_owned(),
        })
        .await
    }

    async fn start_template_build(&self, req: BuildTemplate) -> NodeResult<TemplateBuildStatus> {
        self.call(NodeRequest::StartTemplateBuild { req }).await
    }

    async fn template_build(&self, id: &str, logs_from: u64) -> NodeResult<TemplateBuildStatus> {
        self.call(NodeRequest::TemplateBuild {
            id: id.to_owned(),
            logs_from,
        })
        .await
    }

    async fn delete_template(&self, name: &str) -> NodeResult<bool> {
        self.call(NodeRequest::DeleteTemplate {
            name: name.to_owned(),
        })
        .await
    }

    async fn cached_templates(&self) -> NodeResult<Vec<CachedTemplate>> {
        self.call(NodeRequest::CachedTemplates).await
    }

    async fn remove_cached_template(
        &self,
        digest: &str,
        unused_since_ms: i64,
    ) -> NodeResult<CacheRemoval> {
        self.call(NodeRequest::RemoveCachedTemplate {
            digest: digest.to_owned(),
            unused_since_ms,
        })
        .await
    }

    // The node protocol carries no request bodies but JSON calls yet: a cluster's builds
    // cannot `COPY` (said so, never pretended).
    async fn put_build_files(
        &self,
        _sha256: &str,
        _body: futures::stream::BoxStream<'static, Result<bytes::Bytes, std::io::Error>>,
    ) -> NodeResult<u64> {
        Err(no_build_files())
    }

    async fn has_build_files(&self, _sha256: &str) -> NodeResult<bool> {
        Err(no_build_files())
    }

    async fn pool_status(&self) -> NodeResult<Vec<PoolShape>> {
        self.call(NodeRequest::PoolStatus).await
    }

    async fn credentials(&self) -> NodeResult<Vec<Credential>> {
        self.call(NodeRequest::Credentials).await
    }

    async fn put_credential(&self, credential: Credential, value: SecretValue) -> NodeResult<()> {
        self.call(NodeRequest::PutCredential {
            credential,
            value: SecretString(value.expose().to_owned()),
        })
        .await
    }

    async fn delete_credential(&self, id: &CredentialId) -> NodeResult<()> {
        self.call(NodeRequest::DeleteCredential { id: id.clone() })
            .await
    }

    async fn lend_artifact_key(
        &self,
        tenant: &TenantId,
        key: &space_envelope::DataKey,
        valid_for: std::time::Duration,
    ) -> NodeResult<()> {
        self.call(NodeRequest::LendArtifactKey {
            tenant: tenant.clone(),
            key: SecretString(hex::encode(key.expose())),
            valid_for_ms: u64::try_from(valid_for.as_millis()).unwrap_or(u64::MAX),
        })
        .await
    }

    async fn withdraw_artifact_key(&self, tenant: &TenantId) -> NodeResult<()> {
        self.call(NodeRequest::WithdrawArtifactKey {
            tenant: tenant.clone(),
        })
        .await
    }

    async fn audit(&self, filter: AuditFilter) -> NodeResult<Vec<AuditEvent>> {
        self.call(NodeRequest::Audit {
            filter: (&filter).into(),
        })
        .await
    }
}
