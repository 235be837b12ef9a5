//! The node protocol: what crosses between the control plane and a node.
//!
//! The control plane never sees node internals: it gets a [`SandboxView`] (no VMM pid, no
//! VM name, no crash bookkeeping) and a [`SnapshotOrigin`] (the environment's keys, never
//! its values or the sandbox CA's key). Requests name ids and values the control plane has
//! already authorised and validated; the node validates them again, because a node trusts
//! no peer more than it must.
//!
//! Everything here is plain data with serde: the same types are the in-process interface
//! of the single-machine default and the wire format between machines. The
//! [`PROTOCOL_VERSION`] changes whenever a type here changes incompatibly.

pub mod api;
pub mod cluster;
mod error;
pub mod identity;
mod node;
mod sandbox;
pub mod snapshot;
pub mod template;
pub mod wire;

pub use error::NodeCallError;
pub use node::NodeStatus;
pub use sandbox::{
    CreateFromSnapshot, CreateSandbox, PauseCause, PoolShape, SandboxSettings, SandboxView,
    StopCause, VmOrigin,
};
pub use snapshot::{
    FetchSnapshot, ResumeSandbox, SnapshotHere, SnapshotOrigin, SnapshotOwner, SnapshotRequest,
    SnapshotTaken, StoreSnapshot, StoredArtifact, StoredSettings, StoredSnapshot, SuspendSandbox,
};

/// Version of the node protocol spoken by this build. A peer with another version is
/// refused at the first request, with both versions named.
pub const PROTOCOL_VERSION: u32 = 1;
