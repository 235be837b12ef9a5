//! The SPACE domain, without I/O.
//!
//! Everything the three layers (control plane, node services, sandbox) must agree on lives
//! here: typed ids, sandbox resources, the lifecycle state machine (one transition table),
//! machine-readable error codes, and the process/file types that travel from the API through
//! the node to the guest daemon unchanged.
//!
//! Architecture invariant: this crate performs no I/O and depends on no runtime. It is
//! shared by the guest daemon, so it must stay small.

pub mod audit;
pub mod build_steps;
pub mod cluster;
pub mod egress;
pub mod error;
pub mod files;
pub mod id;
pub mod lifecycle;
pub mod mac;
pub mod metrics;
pub mod process;
pub mod quota;
pub mod resources;
pub mod sandbox;
pub mod snapshot;
pub mod template;
pub mod text;

pub use error::{ErrorBody, ErrorCode};
pub use id::{IdError, SandboxId, SnapshotId, TenantId};
pub use lifecycle::{LifecycleEntry, LifecycleError, SandboxEvent, SandboxState};
pub use resources::{NodeCapacity, Resources, ResourcesError};
pub use snapshot::{
    FileChange, FileChangeKind, RetentionPolicy, RetentionTier, SnapshotDiff, SnapshotError,
    SnapshotInfo, SnapshotKind, SnapshotSchedule, SnapshotTrigger,
};
