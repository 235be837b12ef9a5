//! A node as it describes itself: what placement decides from.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use space_core::NodeCapacity;

/// What a node reports of itself (in every heartbeat, and on request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// What it may give to sandboxes in all.
    pub capacity: NodeCapacity,
    /// What its sandboxes hold now.
    pub used: NodeCapacity,
    /// How many sandboxes it holds (not deleted).
    pub sandboxes: u32,
    /// Templates (by digest) whose memory image it has.
    pub memory_images: BTreeSet<String>,
    /// Templates (by digest) it has (a node that lacks one fetches it from the object
    /// store first).
    #[serde(default)]
    pub templates: BTreeSet<String>,
    /// Templates and kernel bundles it fetched from the object store since it started.
    #[serde(default)]
    pub templates_fetched: u64,
    /// Ready warm-pool members per template digest.
    pub pool_ready: BTreeMap<String, u32>,
    /// The revision of the control plane's credential catalog its credentials were last
    /// synced to (0: never, since it started): the control plane syncs a node that is
    /// behind.
    #[serde(default)]
    pub credentials_revision: u64,
}
