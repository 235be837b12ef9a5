//! Node storage: the btrfs store, template images, sandbox disks (reflinks).
//!
//! - [`Store`]: the store under a data directory — native btrfs, or a sparse btrfs image
//!   loop-mounted there when the data directory is on another filesystem; sandbox disks are
//!   FICLONE reflinks of template images (O(1), no data copied).
//! - [`TemplateStore`] and [`KernelStore`]: content-addressed artifacts, both built on
//!   [`CasDir`], whose `build_or_wait` builds each digest once across threads and processes.
//! - [`reflink`], [`is_btrfs`]: the filesystem primitives, for other crates too.

mod cas;
pub mod cmd;
mod error;
mod fsops;
mod kernels;
mod loopback;
pub mod mountinfo;
mod store;
mod templates;

pub use cas::{validate_digest, Artifact, CasDir};
pub use error::StorageError;
pub use fsops::{copy_sparse, is_btrfs, reflink, reflink_or_copy, write_atomic, FileLock};
pub use kernels::{KernelBundleInfo, KernelMeta, KernelStore, INITRAMFS_FILE, VMLINUZ_FILE};
pub use loopback::MIN_IMAGE_SIZE;
pub use store::{Store, StoreBacking, SANDBOX_DISK_FILE};
pub use templates::{TemplateStore, IMAGE_FILE};
