//! Node services: everything one machine does for its sandboxes.
//!
//! - [`Node`] is the sandbox manager: it drives each sandbox through the lifecycle table of
//!   `space-core` (persisting every transition in [`records`]), boots VMs, connects to their
//!   daemons, watches them, and re-adopts them after a restart.
//! - [`node_manager`] holds every privileged operation (mounts, disk clones, VMM processes)
//!   behind one interface.
//!
//! Architecture invariants: the node is the source of truth for the live state of its
//! sandboxes; the control plane reaches a guest only through [`Node::guest`]; nothing here
//! performs a privileged operation except through [`node_manager::NodeManager`].

pub mod config;
pub mod error;
pub mod node_manager;
pub mod records;
mod sandbox_manager;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use space_core::sandbox::ResourcesRequest;
use space_core::{Resources, SandboxId, SandboxState};

pub use config::NodeConfig;
pub use error::NodeError;
pub use sandbox_manager::Node;
pub use space_guest_client::{GuestClient, GuestError};

/// A create request as the node sees it (already authorised and validated by the control plane).
#[derive(Debug, Clone)]
pub struct CreateSandbox {
    /// Chosen by the control plane.
    pub id: SandboxId,
    /// Template name.
    pub template: String,
    /// Missing fields come from the template's defaults.
    pub resources: ResourcesRequest,
    /// Environment for every process.
    pub env: BTreeMap<String, String>,
}

/// A sandbox as the node knows it (persisted on every transition).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// Id.
    pub id: SandboxId,
    /// Template name.
    pub template: String,
    /// Template digest.
    pub template_digest: String,
    /// Resources held.
    pub resources: Resources,
    /// Lifecycle state.
    pub state: SandboxState,
    /// Why it failed (with the tail of the serial console when the VM died).
    pub failure_reason: Option<String>,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
    /// Create request to daemon ready, ms.
    pub create_latency_ms: Option<u64>,
    /// VMM process id while it runs.
    pub vmm_pid: Option<u32>,
}
