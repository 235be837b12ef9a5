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
    /// Ready warm-pool members per template digest.
    pub pool_ready: BTreeMap<String, u32>,
}
