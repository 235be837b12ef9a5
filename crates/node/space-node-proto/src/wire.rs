//! The node protocol on the wire: HTTP/2 over mutual TLS between the control plane (client)
//! and a node agent (server).
//!
//! | Route | Body | Answer |
//! |---|---|---|
//! | `POST /node/v1/call` | a [`NodeRequest`] (JSON, at most [`MAX_CALL_BODY`]) | a [`WireReply`] of the request's answer type |
//! | `GET /node/v1/events` | – | NDJSON of [`WireEvent`], as they happen |
//! | `* /node/v1/sandboxes/{id}/guest/<route>` | the guest route's | the guest's answer, relayed |
//!
//! The path names the protocol version ([`crate::PROTOCOL_VERSION`]): a peer of another
//! version finds no route (404). A call's answer is `200` with a [`WireReply`] whether the node did it or
//! refused it: a non-2xx answer means the protocol itself failed (a bad request, the wrong
//! version, the wrong peer).

use serde::{Deserialize, Serialize};
use space_core::egress::EgressPolicy;
use space_core::{LifecycleEntry, SandboxId, SnapshotId, TenantId};
use space_secrets::{AuditFilter, Credential, CredentialId};

use crate::{
    CreateFromSnapshot, CreateSandbox, FetchSnapshot, NodeCallError, PauseCause, ResumeSandbox,
    SnapshotRequest, StopCause, StoreSnapshot, SuspendSandbox,
};

/// The typed calls' route.
pub const CALL_PATH: &str = "/node/v1/call";
/// The lifecycle event stream's route.
pub const EVENTS_PATH: &str = "/node/v1/events";
/// The guest relay's route (axum syntax), `id` and `route` captured.
pub const GUEST_ROUTE: &str = "/node/v1/sandboxes/{id}/guest/{*route}";
/// Largest call body a node accepts.
pub const MAX_CALL_BODY: usize = 1024 * 1024;
/// Largest call answer the control plane reads (a listing of every sandbox of a node).
pub const MAX_REPLY_BODY: usize = 16 * 1024 * 1024;
/// Longest line of the event stream.
pub const MAX_EVENT_LINE: usize = 64 * 1024;

/// The guest relay's prefix for one sandbox: the guest route follows it.
pub fn guest_prefix(id: &SandboxId) -> String {
    format!("/node/v1/sandboxes/{id}/guest")
}

/// A credential's value on its way to a node: redacted in every formatting.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretString(pub String);

impl std::fmt::Debug for SecretString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One typed call: a method of [`crate::api::NodeApi`] and its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum NodeRequest {
    /// → `NodeStatus`
    Status,
    /// → `()`
    CheckEgressPolicy { policy: EgressPolicy },
    /// → `Option<SandboxView>`
    Sandbox { id: SandboxId },
    /// → `Vec<SandboxView>`
    Sandboxes,
    /// → `SandboxView`
    CreateSandbox { req: CreateSandbox },
    /// → `SandboxView`
    CreateFromSnapshot { req: CreateFromSnapshot },
    /// → `Vec<SandboxView>`
    Fork {
        parent: SandboxId,
        children: Vec<SandboxId>,
        from: Option<SnapshotId>,
    },
    /// → `SandboxView`
    Pause { id: SandboxId, cause: PauseCause },
    /// → `SandboxView`
    Resume { id: SandboxId },
    /// → `SandboxView`
    Stop { id: SandboxId, cause: StopCause },
    /// → `SandboxView`
    Start { id: SandboxId },
    /// → `SandboxView`
    Rollback { id: SandboxId, to: SnapshotId },
    /// → `()`
    Delete { id: SandboxId },
    /// → `bool`
    WakeTimedOut { id: SandboxId },
    /// → [`GuestReady`]: the guest is reachable through the relay.
    Guest { id: SandboxId },
    /// → `BTreeMap<String, String>`
    ProcessEnv { id: SandboxId },
    /// → `String`
    ConsoleTail { id: SandboxId, max_bytes: usize },
    /// → `Vec<LifecycleEntry>`
    Events { id: SandboxId },
    /// → `Vec<SandboxMetric>`
    Metrics { id: SandboxId },
    /// → `SandboxView`
    SetEgressPolicy { id: SandboxId, policy: EgressPolicy },
    /// → `()`
    SetDefaultConnections { limit: Option<u64> },
    /// → `()`
    SetTenantConnections {
        tenant: TenantId,
        limit: Option<Option<u64>>,
    },
    /// → `Vec<SnapshotInfo>`
    Snapshots { id: SandboxId },
    /// → `Vec<SnapshotInfo>`
    TenantSnapshots { tenant: TenantId },
    /// → `StoredSnapshot`
    Suspend { req: SuspendSandbox },
    /// → `SandboxView`
    AbortSuspend { id: SandboxId },
    /// → `SandboxView`
    ResumeSuspended { req: ResumeSandbox },
    /// → `StoredSnapshot`
    StoreSnapshot { req: StoreSnapshot },
    /// → `SnapshotHere`
    FetchSnapshot { req: FetchSnapshot },
    /// → `()`
    CredentialsSynced { revision: u64 },
    /// → `SnapshotTaken`
    TakeSnapshot { id: SandboxId, req: SnapshotRequest },
    /// → `()`
    DeleteSnapshot { id: SandboxId, snapshot: SnapshotId },
    /// → `SnapshotDiff`
    DiffSnapshots {
        id: SandboxId,
        from: SnapshotId,
        to: SnapshotId,
        limit: usize,
    },
    /// → `Option<(SnapshotInfo, SnapshotOrigin)>`
    SnapshotOrigin { id: SandboxId, snapshot: SnapshotId },
    /// → `Vec<(SnapshotInfo, SnapshotOrigin)>`
    PersistentSnapshots,
    /// → `Option<(SnapshotInfo, SnapshotOrigin)>`
    PersistentSnapshot { snapshot: SnapshotId },
    /// → `()`
    DeletePersistentSnapshot { snapshot: SnapshotId },
    /// → `Vec<TemplateInfo>`
    Templates,
    /// → `TemplateBuildStatus`
    StartTemplateBuild { req: crate::template::BuildTemplate },
    /// → `TemplateBuildStatus`
    TemplateBuild { id: String, logs_from: u64 },
    /// → `bool`
    DeleteTemplate { name: String },
    /// → `Vec<CachedTemplate>`
    CachedTemplates,
    /// → `CacheRemoval`
    RemoveCachedTemplate {
        digest: String,
        unused_since_ms: i64,
    },
    /// → `TemplateInfo`
    Template { name: String },
    /// → `Vec<PoolShape>`
    PoolStatus,
    /// → `Vec<Credential>`
    Credentials,
    /// → `()`
    PutCredential {
        credential: Credential,
        value: SecretString,
    },
    /// → `()`
    DeleteCredential { id: CredentialId },
    /// → `()`
    LendArtifactKey {
        tenant: TenantId,
        /// The key, hex.
        key: SecretString,
        valid_for_ms: u64,
    },
    /// → `()`
    WithdrawArtifactKey { tenant: TenantId },
    /// → `Vec<AuditEvent>`
    Audit { filter: WireAuditFilter },
}

/// [`AuditFilter`] on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireAuditFilter {
    /// Only this tenant's decisions.
    pub tenant: Option<TenantId>,
    /// Only this sandbox's.
    pub sandbox: Option<SandboxId>,
    /// Only this credential's.
    pub credential: Option<CredentialId>,
    /// Only decisions at or after this time (ms since the Unix epoch).
    pub since_ms: Option<i64>,
    /// At most this many.
    pub limit: usize,
}

impl From<&AuditFilter> for WireAuditFilter {
    fn from(f: &AuditFilter) -> Self {
        WireAuditFilter {
            tenant: f.tenant.clone(),
            sandbox: f.sandbox.clone(),
            credential: f.credential.clone(),
            since_ms: f.since_ms,
            limit: f.limit,
        }
    }
}

impl From<WireAuditFilter> for AuditFilter {
    fn from(f: WireAuditFilter) -> Self {
        AuditFilter {
            tenant: f.tenant,
            sandbox: f.sandbox,
            credential: f.credential,
            since_ms: f.since_ms,
            limit: f.limit,
        }
    }
}

/// The answer to a call: what it returns, or why the node did not do it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireReply<T> {
    /// Done.
    Ok(T),
    /// Refused or failed.
    Err(NodeCallError),
}

/// What `Guest` answers: the daemon is up and reachable through the relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestReady {
    /// The guest protocol version the daemon speaks.
    pub version: u32,
    /// Random id chosen at guest boot.
    pub boot_id: String,
    /// The daemon's version.
    pub daemon_version: String,
}

/// One line of the event stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireEvent {
    /// A transition.
    Entry(LifecycleEntry),
    /// The stream fell behind and entries were dropped: re-read the logs.
    Lagged,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_tagged_and_round_trip() {
        let id = SandboxId::generate();
        let req = NodeRequest::Pause {
            id: id.clone(),
            cause: PauseCause::Timeout,
        };
        let json = serde_json::to_value(&req).unwrap();
        assert_eq!(json["call"], "pause");
        assert_eq!(json["cause"], "timeout");
        assert_eq!(serde_json::from_value::<NodeRequest>(json).unwrap(), req);
        assert!(serde_json::from_str::<NodeRequest>(r#"{"call":"format_disk"}"#).is_err());
    }

    #[test]
    fn replies_carry_the_answer_or_the_error() {
        let ok: WireReply<bool> = serde_json::from_str(r#"{"ok":true}"#).unwrap();
        assert_eq!(ok, WireReply::Ok(true));
        let err: WireReply<bool> =
            serde_json::from_str(r#"{"err":{"kind":"template_not_found","template":"x"}}"#)
                .unwrap();
        assert!(matches!(
            err,
            WireReply::Err(NodeCallError::TemplateNotFound { .. })
        ));
    }

    #[test]
    fn a_credential_value_never_prints() {
        let s = SecretString("hunter2".into());
        assert_eq!(format!("{s:?}"), "<redacted>");
    }
}
