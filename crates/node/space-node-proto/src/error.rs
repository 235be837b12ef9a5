//! Why a call to a node failed, as the caller must tell it apart.

use serde::{Deserialize, Serialize};
use space_core::{ErrorBody, ErrorCode, SandboxId, SnapshotId};

/// Why a node call failed. Serialised as it is on the wire (`kind` names the variant), so a
/// remote node's refusal reads exactly like a local one's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NodeCallError {
    /// The node has no such sandbox (never had, or deleted it and forgot).
    #[error("sandbox {sandbox} not found")]
    SandboxNotFound {
        /// The sandbox asked for.
        sandbox: SandboxId,
    },
    /// No such snapshot.
    #[error("snapshot {snapshot} not found")]
    SnapshotNotFound {
        /// The snapshot asked for.
        snapshot: SnapshotId,
    },
    /// No such template on the node.
    #[error("template '{template}' not found")]
    TemplateNotFound {
        /// The template asked for.
        template: String,
    },
    /// The node refused or failed the request for a reason its client is told (a wrong
    /// state, no capacity, a guest's error): `body` goes to the client as it is.
    #[error("{body}")]
    Refused {
        /// Code and message for the client.
        body: ErrorBody,
    },
    /// The node failed in a way no client can act on; the detail is for the logs only.
    #[error("node error: {detail}")]
    Internal {
        /// What failed (may name paths; never sent to a client).
        detail: String,
    },
    /// The node could not be reached, answered out of protocol, or is lost.
    #[error("node {node} unavailable: {reason}")]
    Unavailable {
        /// The node's name.
        node: String,
        /// Why.
        reason: String,
        /// The request may have reached the node (and the node may have acted on it):
        /// `false` only when it certainly did not (no connection, or the node is lost), the
        /// one case a create may be retried on another node.
        #[serde(default)]
        sent: bool,
    },
}

impl NodeCallError {
    /// A refusal with this code and message.
    pub fn refused(code: ErrorCode, message: impl Into<String>) -> Self {
        NodeCallError::Refused {
            body: ErrorBody::new(code, message),
        }
    }

    /// The machine-readable code a client gets.
    pub fn code(&self) -> ErrorCode {
        match self {
            NodeCallError::SandboxNotFound { .. }
            | NodeCallError::SnapshotNotFound { .. }
            | NodeCallError::TemplateNotFound { .. } => ErrorCode::NotFound,
            NodeCallError::Refused { body } => body.code,
            NodeCallError::Internal { .. } => ErrorCode::Internal,
            NodeCallError::Unavailable { .. } => ErrorCode::NodeUnavailable,
        }
    }

    /// Whether the node certainly did nothing with the request, so it may go to another
    /// node: it never reached the node, or the node refused it for room (its capacity was
    /// taken since the status placement read).
    pub fn not_acted_on(&self) -> bool {
        match self {
            NodeCallError::Unavailable { sent, .. } => !sent,
            NodeCallError::Refused { body } => body.code == ErrorCode::InsufficientCapacity,
            _ => false,
        }
    }

    /// Whether the node said the sandbox is not there.
    pub fn is_sandbox_not_found(&self) -> bool {
        matches!(self, NodeCallError::SandboxNotFound { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_its_kind() {
        let e = NodeCallError::SandboxNotFound {
            sandbox: SandboxId::generate(),
        };
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.contains(r#""kind":"sandbox_not_found""#), "{json}");
        assert_eq!(serde_json::from_str::<NodeCallError>(&json).unwrap(), e);
        let refused = NodeCallError::refused(ErrorCode::Conflict, "cannot pause a stopped one");
        assert_eq!(refused.code(), ErrorCode::Conflict);
        assert_eq!(refused.to_string(), "conflict: cannot pause a stopped one");
    }

    #[test]
    fn unreachable_nodes_are_503() {
        let e = NodeCallError::Unavailable {
            node: "n2".into(),
            reason: "connection refused".into(),
            sent: false,
        };
        assert!(e.not_acted_on());
        assert_eq!(e.code().http_status(), 503);
    }
}
