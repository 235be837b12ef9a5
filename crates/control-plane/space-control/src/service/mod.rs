//! The operations behind every API surface: plain async functions over [`AppState`], the
//! [`Caller`] and typed requests, returning typed results or an [`ApiError`].
//!
//! SPACE's own `/v1` handlers (`crate::api`) and the E2B surface (`space-e2b`) both call
//! these; neither calls the other's handlers. Nothing here knows HTTP: no extractors, no
//! status codes, no bodies. A surface parses its request, calls one function, and renders
//! the answer (or the error) its own way.
//!
//! - [`sandboxes`]: create (from a template or a snapshot), get, list, delete, timeout,
//!   token revocation, console; the steps every new sandbox goes through.
//! - [`lifecycle`]: pause, resume, stop, start, rollback, fork, the event log.
//! - [`snapshots`]: a sandbox's snapshots and the tenant's, diffs, finding one by id.
//! - [`credentials`]: the credential catalog, and syncing nodes' copies with it.
//! - [`customer_keys`]: tenants' own keys at the operator's key services, the data keys
//!   wrapped under them, rotation, and the gate every start and restore passes.
//! - [`egress`]: a sandbox's and a tenant's egress policy.
//! - [`metrics`]: a sandbox's resource samples.
//! - [`suspend`]: suspend to object storage, resume on any node, and collecting what no
//!   sandbox needs any more.
//! - [`template_scope`]: whose a template name is, and what a caller's name means.
//! - [`templates`]: templates as objects: list, get, build from a registry image (followed
//!   from any replica), delete unless in use.
//! - [`build_files`]: the archives build steps' `COPY` reads, in the object store (or on
//!   the node).
//! - [`drain`]: moving every sandbox off a node (the operator's).
//! - [`node_loss`]: stored checkpoints of restorable sandboxes, and restoring those of a
//!   lost node elsewhere (the leader's).
//!
//! [`AppState`]: crate::AppState
//! [`ApiError`]: crate::api::error::ApiError

pub mod build_files;
pub mod credentials;
pub mod customer_keys;
pub mod drain;
pub mod egress;
pub mod lifecycle;
pub mod metrics;
pub mod node_loss;
pub mod sandboxes;
pub mod snapshots;
pub mod suspend;
pub mod template_scope;
pub mod templates;

use space_core::TenantId;

use crate::api::error::ApiError;

/// Who is asking: the tenant an API key authenticated, and the key (for the action log).
/// Every operation is scoped to its tenant.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Tenant id.
    pub id: TenantId,
    /// Tenant name.
    pub name: String,
    /// The id of the API key it authenticated with (for the action log).
    pub key_id: String,
}

impl Caller {
    /// Whether this is the operator's tenant (`default`, made at the first start).
    pub fn is_operator(&self) -> bool {
        self.name == crate::bootstrap::DEFAULT_TENANT
    }

    /// Refuses (`403 forbidden`) unless this is the operator's tenant (`default`, made at
    /// the first start): what shows node-wide state is for the operator only.
    pub fn require_operator(&self) -> Result<(), ApiError> {
        if self.is_operator() {
            Ok(())
        } else {
            Err(ApiError::new(
                space_core::ErrorCode::Forbidden,
                format!(
                    "this shows node-wide state: only the operator's tenant ({}) may see it",
                    crate::bootstrap::DEFAULT_TENANT
                ),
            ))
        }
    }
}
