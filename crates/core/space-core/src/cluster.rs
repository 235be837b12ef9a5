//! The cluster as the operator's API shows it: nodes and the tokens that join them.

use serde::{Deserialize, Serialize};

use crate::{ErrorCode, NodeCapacity, SandboxId, SandboxState};

/// Whether a node takes new sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Heartbeating, and open to new sandboxes.
    Ready,
    /// Heartbeating, but closed to new sandboxes by the operator.
    Cordoned,
    /// Missed its heartbeats: its sandboxes are `lost` until it rejoins and is reconciled.
    Lost,
}

/// A node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeInfo {
    /// Its name.
    pub name: String,
    /// `host:port` of its agent.
    pub address: String,
    /// Ready, cordoned or lost.
    pub state: NodeState,
    /// Bumped each time it is declared lost or joins again.
    pub generation: u64,
    /// What it may give to sandboxes (its last heartbeat's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<NodeCapacity>,
    /// What its sandboxes hold (its last heartbeat's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<NodeCapacity>,
    /// Sandboxes it holds (its last heartbeat's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<u32>,
    /// ms since the Unix epoch.
    pub joined_at_ms: i64,
    /// Its last heartbeat, ms since the Unix epoch.
    pub heartbeat_at_ms: i64,
}

/// `GET /v1/nodes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeList {
    /// By name.
    pub nodes: Vec<NodeInfo>,
}

/// `POST /v1/nodes/{name}/drain`: what a drain did. The node stays cordoned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DrainReport {
    /// The node drained.
    pub node: String,
    /// The sandboxes that moved, and where.
    pub moved: Vec<DrainedSandbox>,
    /// The sandboxes that did not, and why (each one where it was, or suspended if only
    /// its resume failed).
    pub failed: Vec<DrainFailure>,
}

/// A sandbox a drain moved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DrainedSandbox {
    /// The sandbox (its id does not change).
    pub id: SandboxId,
    /// The node it runs on now.
    pub node: String,
    /// Its state there: what it was before (running, or paused).
    pub state: SandboxState,
}

/// A sandbox a drain did not move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DrainFailure {
    /// The sandbox.
    pub id: SandboxId,
    /// Its state now.
    pub state: SandboxState,
    /// Why, machine-readable.
    pub code: ErrorCode,
    /// Why, for a human.
    pub message: String,
}

/// `POST /v1/nodes/join-tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateJoinTokenRequest {
    /// How long it may be used, seconds (default an hour, at most a week).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
}

/// A join token just made: the token itself is shown this once.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JoinTokenCreated {
    /// Names it (not secret).
    pub id: String,
    /// What `space node join --token` takes: it joins one node, once.
    pub token: String,
    /// It cannot be used after this, ms since the Unix epoch.
    pub expires_at_ms: i64,
}

impl std::fmt::Debug for JoinTokenCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinTokenCreated")
            .field("id", &self.id)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}
