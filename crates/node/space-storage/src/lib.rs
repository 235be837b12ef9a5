//! Node storage: the btrfs store, template images, sandbox disks (reflinks).
//!
//! - [`Store`]: the store under a data directory — native btrfs, or a sparse btrfs image
//!   loop-mounted there when the data directory is on another filesystem; sandbox disks are
//!   FICLONE reflinks of template images (O(1), no data copied).
//! - [`TemplateStore`] and [`KernelStore`]: content-addressed artifacts, both built on
//!   [`CasDir`], whose `build_or_wait` builds each digest once across threads and processes.
//! - [`reflink`], [`is_btrfs`]: the filesystem primitives, for other crates too.
//! - Snapshots of a sandbox under `<sandbox dir>/snapshots/`: [`Store::begin_snapshot`] →
//!   [`PendingSnapshot`] → commit (atomic rename), listing with [`exclusive_bytes`] measured
//!   by FIEMAP, and [`diff_disk_images`], a file-level diff of two guest ext4 images read in
//!   userspace (never mounted). Persistent snapshots move to `<root>/snapshots/` when their
//!   sandbox is deleted ([`Store::persist_snapshot`]).
//! - [`delta`]: a sandbox disk as the blocks it changed from its template (what a suspended
//!   sandbox's snapshot stores), and rebuilding it on a reflink of the template.

mod cas;
pub mod cmd;
pub mod delta;
mod error;
mod ext4diff;
mod extents;
mod fsops;
mod kernels;
mod loopback;
pub mod mountinfo;
mod snapshots;
mod store;
mod templates;

pub use cas::{validate_digest, Artifact, CasDir};
pub use error::StorageError;
pub use ext4diff::{
    diff_disk_images, MAX_DIFF_DEPTH, MAX_DIFF_DURATION, MAX_DIFF_ENTRIES, MAX_DIFF_NAME_BYTES,
    MAX_DIFF_READ_BYTES,
};
pub use extents::{exclusive_bytes, extent_usage, identical_ranges, ExtentUsage};
pub use fsops::{
    copy_sparse, is_btrfs, reflink, reflink_or_copy, sha256_of, write_atomic, FileLock,
};
pub use kernels::{KernelBundleInfo, KernelMeta, KernelStore, INITRAMFS_FILE, VMLINUZ_FILE};
pub use loopback::MIN_IMAGE_SIZE;
pub use snapshots::{
    read_snapshot_source, PendingSnapshot, SnapshotDisk, SnapshotPaths, SnapshotSizes,
    MAX_SNAPSHOT_SOURCE_BYTES, PERSISTENT_SNAPSHOTS_DIR, SNAPSHOTS_DIR, SNAPSHOT_DISK_FILE,
    SNAPSHOT_MEMORY_FILE, SNAPSHOT_META_FILE, SNAPSHOT_SEALED_DISK_FILE, SNAPSHOT_SOURCE_FILE,
    SNAPSHOT_STATE_FILE,
};
pub use store::{ExistingDisk, Store, StoreBacking, INCOMING_DIR, SANDBOX_DISK_FILE};
pub use templates::{TemplateStore, IMAGE_FILE};
