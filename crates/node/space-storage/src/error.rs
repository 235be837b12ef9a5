//! The one error type of the store: every variant names the path and the operation that failed.

use std::io;
use std::path::PathBuf;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A filesystem call failed.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What we were doing, e.g. "create directory".
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// An external tool (mkfs.btrfs, mount, losetup) could not be started.
    #[error("cannot run {program}: {source} (is it installed?)")]
    Spawn {
        /// The program.
        program: String,
        /// The OS error.
        source: io::Error,
    },
    /// An external tool ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// How it exited.
        status: String,
        /// The end of its error output.
        stderr: String,
    },
    /// FICLONE failed: the two files are not on one reflink-capable filesystem. Disks are never copied instead.
    #[error("cannot reflink {src} to {dst}: {source} (both must be on the same btrfs filesystem; SPACE does not fall back to copying disks)")]
    Reflink {
        /// The file cloned from.
        src: PathBuf,
        /// The file cloned to.
        dst: PathBuf,
        /// The OS error (EXDEV: different filesystems; EOPNOTSUPP/EINVAL: no reflink support).
        source: io::Error,
    },
    /// Something other than our store image is mounted where the store goes.
    #[error("{mount_point} is already a mount point ({fstype} from {source_dev}), not the store image {image}; unmount it or choose another data directory")]
    ForeignMount {
        /// Where the store would be mounted.
        mount_point: PathBuf,
        /// The filesystem type found there.
        fstype: String,
        /// The device found there.
        source_dev: String,
        /// The store image.
        image: PathBuf,
    },
    /// The store image is attached to a loop device that is mounted somewhere else.
    #[error("store image {image} is in use through {loop_device}, mounted at {mounted_at}; unmount it first")]
    ImageInUse {
        /// The store image.
        image: PathBuf,
        /// The loop device it is attached to.
        loop_device: String,
        /// Where that loop device is mounted.
        mounted_at: PathBuf,
    },
    /// The store is busy and cannot be unmounted.
    #[error("cannot unmount store {mount_point}: it is busy (files are open or VMs are running from it); stop them first")]
    Busy {
        /// The store's mount point.
        mount_point: PathBuf,
    },
    /// A digest is not lowercase hex (it becomes a directory name, so it is checked).
    #[error("invalid digest {0:?}: expected 16 to 128 lowercase hex digits")]
    InvalidDigest(String),
    /// A template name does not match `[a-z0-9][a-z0-9_-]{{0,62}}`.
    #[error("invalid template name {0:?}: expected [a-z0-9][a-z0-9_-]{{0,62}}")]
    InvalidName(String),
    /// A metadata file could not be read or written as JSON.
    #[error("corrupt metadata {path}: {source}")]
    Metadata {
        /// The metadata file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// A build returned metadata for another digest than the one it was asked to build.
    #[error("build of {expected} returned metadata for digest {got}")]
    DigestMismatch {
        /// The digest asked for.
        expected: String,
        /// The digest in the returned metadata.
        got: String,
    },
    /// An installed file is not what its metadata says (its SHA-256 differs).
    #[error("{what}: its content's SHA-256 is {got}, its metadata says {expected}")]
    ContentMismatch {
        /// What was installed.
        what: String,
        /// The digest its metadata records.
        expected: String,
        /// The digest of what arrived.
        got: String,
    },
    /// The sandbox already has a root disk; it is never overwritten.
    #[error("sandbox disk {0} already exists; remove the sandbox directory first")]
    DiskExists(PathBuf),
    /// Something asked for does not exist.
    #[error("{what} {name:?} not found in {dir}")]
    NotFound {
        /// What kind of thing, e.g. "template".
        what: &'static str,
        /// Its name or digest.
        name: String,
        /// Where we looked.
        dir: PathBuf,
    },
    /// A directory to delete still has filesystems mounted below it; deleting it could reach into them.
    #[error("refusing to delete {path}: {mount} is still mounted below it")]
    MountedBelow {
        /// The directory.
        path: PathBuf,
        /// The mount that could not be unmounted.
        mount: PathBuf,
    },
    /// A snapshot with this id already exists (committed or being taken).
    #[error("snapshot {0} already exists")]
    SnapshotExists(PathBuf),
    /// A snapshot cannot be committed as asked: wrong id or sandbox, or its disk is missing.
    #[error("cannot commit snapshot {dir}: {reason}")]
    InvalidSnapshot {
        /// The snapshot's (pending) directory.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A snapshot label, schedule or retention policy was refused.
    #[error(transparent)]
    Snapshot(#[from] space_core::SnapshotError),
    /// A guest ext4 image could not be read (corrupt, truncated, unsupported, or beyond the
    /// reader's bounds). The image is never mounted; this comes from the userspace reader.
    #[error("cannot read the ext4 filesystem in {image}: {message}")]
    Ext4 {
        /// The disk image.
        image: PathBuf,
        /// What went wrong.
        message: String,
    },
}

impl StorageError {
    /// Shorthand for [`StorageError::Io`].
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StorageError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Attaches "what we were doing, to which path" to an `io::Result`.
pub(crate) trait IoContext<T> {
    /// Maps the error to [`StorageError::Io`].
    fn ctx(self, action: &'static str, path: &std::path::Path) -> Result<T, StorageError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, action: &'static str, path: &std::path::Path) -> Result<T, StorageError> {
        self.map_err(|e| StorageError::io(action, path, e))
    }
}
