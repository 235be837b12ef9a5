//! Errors of node operations, each with its machine-readable code.

use space_core::{ErrorBody, ErrorCode, SandboxId};
use space_guest_client::GuestError;

use space_node_manager::NodeManagerError;

/// Why a node operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No such sandbox on this node.
    #[error("sandbox {0} not found")]
    SandboxNotFound(SandboxId),
    /// No such template.
    #[error("template '{0}' not found")]
    TemplateNotFound(String),
    /// A sandbox with this id is on the node already (a create sent twice is refused, not
    /// run twice).
    #[error("sandbox {0} already exists")]
    SandboxExists(SandboxId),
    /// The request is invalid.
    #[error("{0}")]
    Invalid(String),
    /// An egress policy reaches beyond the operator's ceiling.
    #[error(transparent)]
    BeyondCeiling(#[from] space_core::egress::BeyondCeiling),
    /// The guest cannot serve requests in this state (e.g. paused by a client, stopped).
    #[error("the sandbox is {0}; its processes and files are reachable only while it runs")]
    NotServing(space_core::SandboxState),
    /// The operation is not possible in the sandbox's state (not a lifecycle transition).
    #[error("cannot {action} a sandbox that is {state}")]
    WrongState {
        /// What was asked, as a verb phrase ("take a disk snapshot of").
        action: &'static str,
        /// The state it is in.
        state: space_core::SandboxState,
    },
    /// No such template build on this node.
    #[error("template build {0} not found")]
    BuildNotFound(String),
    /// No such snapshot of this sandbox.
    #[error("snapshot {0} not found")]
    SnapshotNotFound(space_core::SnapshotId),
    /// The guest would not (or could not in time) freeze its file systems.
    #[error("snapshot refused: {0}")]
    SnapshotRefused(String),
    /// The node's store has no room.
    #[error("{0}")]
    StoreFull(String),
    /// Illegal lifecycle transition.
    #[error(transparent)]
    Lifecycle(#[from] space_core::LifecycleError),
    /// Resources out of bounds or beyond what the node has left.
    #[error(transparent)]
    Capacity(space_core::ResourcesError),
    /// The sandbox broke while the operation ran (VM exited, daemon gone); it is now failed.
    #[error("sandbox failed: {0}")]
    SandboxFailed(String),
    /// The guest failed the request.
    #[error(transparent)]
    Guest(#[from] GuestError),
    /// A privileged operation failed.
    #[error(transparent)]
    NodeManager(#[from] NodeManagerError),
    /// A stored snapshot is damaged (an artifact missing, or not what was recorded).
    #[error("the stored snapshot is damaged: {0}")]
    SnapshotCorrupt(String),
    /// Object storage failed or could not be reached.
    #[error("object storage: {0}")]
    Storage(String),
    /// The template's start command failed or was not ready in time.
    #[error("the template's start command failed: {0}")]
    TemplateStartFailed(String),
    /// A tenant has as many template builds under way as it may.
    #[error("{0}")]
    TooManyBuilds(String),
    /// The sandbox's data at rest is sealed under its tenant's key, which this node does
    /// not hold (not lent yet, expired, or withdrawn because the customer key was revoked).
    #[error("{0}")]
    KeyUnavailable(String),
    /// Anything else.
    #[error("{0}")]
    Internal(String),
}

impl From<space_vmm::VmmError> for NodeError {
    fn from(e: space_vmm::VmmError) -> Self {
        NodeError::NodeManager(NodeManagerError::Vmm(e))
    }
}

impl From<space_storage::StorageError> for NodeError {
    fn from(e: space_storage::StorageError) -> Self {
        NodeError::NodeManager(NodeManagerError::Storage(e))
    }
}

impl NodeError {
    /// The machine-readable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            NodeError::SandboxNotFound(_) | NodeError::TemplateNotFound(_) => ErrorCode::NotFound,
            NodeError::Invalid(_) => ErrorCode::InvalidRequest,
            NodeError::SandboxExists(_) => ErrorCode::AlreadyExists,
            NodeError::SnapshotCorrupt(_) => ErrorCode::SnapshotCorrupt,
            NodeError::KeyUnavailable(_) => ErrorCode::KeyUnavailable,
            NodeError::Storage(_) => ErrorCode::StorageUnavailable,
            NodeError::BeyondCeiling(_) => ErrorCode::EgressBeyondCeiling,
            NodeError::Lifecycle(_)
            | NodeError::NotServing(_)
            | NodeError::WrongState { .. }
            | NodeError::SnapshotRefused(_) => ErrorCode::Conflict,
            NodeError::SnapshotNotFound(_) | NodeError::BuildNotFound(_) => ErrorCode::NotFound,
            NodeError::StoreFull(_) => ErrorCode::InsufficientCapacity,
            NodeError::TooManyBuilds(_) => ErrorCode::QuotaExceeded,
            NodeError::Capacity(space_core::ResourcesError::OutOfRange { .. }) => {
                ErrorCode::InvalidRequest
            }
            NodeError::Capacity(_) => ErrorCode::InsufficientCapacity,
            NodeError::SandboxFailed(_) | NodeError::TemplateStartFailed(_) => {
                ErrorCode::SandboxFailed
            }
            NodeError::Guest(g) => g.code(),
            NodeError::NodeManager(_) | NodeError::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The error body for an API response.
    pub fn body(&self) -> ErrorBody {
        match self {
            NodeError::Guest(GuestError::Remote { body, .. }) => body.clone(),
            other => ErrorBody::new(other.code(), other.to_string()),
        }
    }
}
