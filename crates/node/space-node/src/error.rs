//! Errors of node operations, each with its machine-readable code.

use space_core::{ErrorBody, ErrorCode, SandboxId};
use space_guest_client::GuestError;

use crate::node_manager::NodeManagerError;

/// Why a node operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No such sandbox on this node.
    #[error("sandbox {0} not found")]
    SandboxNotFound(SandboxId),
    /// No such template.
    #[error("template '{0}' not found")]
    TemplateNotFound(String),
    /// The request is invalid.
    #[error("{0}")]
    Invalid(String),
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
            NodeError::Lifecycle(_) => ErrorCode::Conflict,
            NodeError::Capacity(space_core::ResourcesError::OutOfRange { .. }) => {
                ErrorCode::InvalidRequest
            }
            NodeError::Capacity(_) => ErrorCode::InsufficientCapacity,
            NodeError::SandboxFailed(_) => ErrorCode::SandboxFailed,
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
