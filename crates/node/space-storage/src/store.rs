//! The node's store: a btrfs directory (native, or a loop-mounted image when the data
//! directory is on another filesystem) holding templates, kernel bundles and sandbox disks.

use std::path::{Path, PathBuf};

use space_core::SandboxId;

use crate::error::{IoContext, StorageError};
use crate::fsops::{self, FileLock};
use crate::kernels::KernelStore;
use crate::loopback;
use crate::mountinfo;
use crate::templates::TemplateStore;

/// File name of a sandbox's root disk inside its directory.
pub const SANDBOX_DISK_FILE: &str = "rootfs.ext4";
/// The store's directory of fetched templates and kernel bundles not installed yet.
pub const INCOMING_DIR: &str = "incoming";
const MIB: u64 = 1 << 20;

/// How the store's btrfs is provided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreBacking {
    /// The data directory is on btrfs; the store is a plain directory in it.
    Native,
    /// A sparse btrfs image in the data directory, loop-mounted at the store root.
    LoopImage {
        /// The image file (`<data_dir>/store.btrfs`).
        image: PathBuf,
        /// The loop device it is attached to, e.g. `/dev/loop3`.
        loop_device: String,
    },
}

/// An open store. Cheap to clone; the mount stays until [`Store::unmount`] (it is meant to
/// outlive the process, and reopening finds it).
#[derive(Debug, Clone)]
pub struct Store {
    data_dir: PathBuf,
    root: PathBuf,
    backing: StoreBacking,
}

impl Store {
    /// Opens the store under `data_dir` (created if missing).
    ///
    /// If `data_dir` is on btrfs, the store is `data_dir/store`, a plain directory. Otherwise
    /// it is a btrfs image `data_dir/store.btrfs` (sparse, `loop_size` bytes, created and
    /// formatted if missing) loop-mounted at `data_dir/store`. Idempotent: an existing mount
    /// of that image there is reused, so reopening after a restart is cheap.
    pub fn open(data_dir: &Path, loop_size: u64) -> Result<Store, StorageError> {
        fsops::create_dir_all(data_dir)?;
        let data_dir = data_dir.canonicalize().ctx("resolve", data_dir)?;
        let root = data_dir.join("store");
        // Serialises open/unmount of one data directory between threads and processes.
        let _lock = FileLock::exclusive(&data_dir.join("store.lock"))?;
        let backing = if fsops::is_btrfs(&data_dir)?
            && mountinfo::mount_at(&mountinfo::read()?, &root).is_none()
        {
            fsops::create_dir_all(&root)?;
            tracing::info!(root = %root.display(), "store on native btrfs");
            StoreBacking::Native
        } else {
            let image = data_dir.join("store.btrfs");
            let loop_device = Self::mount_loop(&image, &root, loop_size)?;
            StoreBacking::LoopImage { image, loop_device }
        };
        let store = Store {
            data_dir,
            root,
            backing,
        };
        for dir in [
            store.sandboxes_root(),
            store.templates().dir().to_owned(),
            store.kernels().dir().to_owned(),
        ] {
            fsops::create_dir_all(&dir)?;
        }
        Ok(store)
    }

    /// The store under `data_dir` as another process opened it (the node manager, for the
    /// sandbox manager): nothing is created or mounted; fails unless `data_dir/store` is a
    /// btrfs directory.
    pub fn attach(data_dir: &Path) -> Result<Store, StorageError> {
        let data_dir = data_dir.canonicalize().ctx("resolve", data_dir)?;
        let root = data_dir.join("store");
        if !fsops::is_btrfs(&root)? {
            return Err(StorageError::NotFound {
                what: "btrfs store",
                name: root.display().to_string(),
                dir: data_dir.clone(),
            });
        }
        let backing = match mountinfo::mount_at(&mountinfo::read()?, &root) {
            Some(m) => StoreBacking::LoopImage {
                image: data_dir.join("store.btrfs"),
                loop_device: m.source.clone(),
            },
            None => StoreBacking::Native,
        };
        Ok(Store {
            data_dir,
            root,
            backing,
        })
    }

    /// Makes sure `image` is mounted at `root`; returns its loop device.
    fn mount_loop(image: &Path, root: &Path, loop_size: u64) -> Result<String, StorageError> {
        let mounts = mountinfo::read()?;
        if let Some(m) = mountinfo::mount_at(&mounts, root) {
            if m.fstype == "btrfs" && image.exists() {
                let image = image.canonicalize().ctx("resolve", image)?;
                if loopback::loop_devices_for(&image).contains(&m.source) {
                    tracing::info!(image = %image.display(), root = %root.display(), loop_device = %m.source, "store image already mounted; reusing it");
                    return Ok(m.source.clone());
                }
            }
            return Err(StorageError::ForeignMount {
                mount_point: root.to_owned(),
                fstype: m.fstype.clone(),
                source_dev: m.source.clone(),
                image: image.to_owned(),
            });
        }
        let created = loopback::ensure_image(image, loop_size)?;
        let image = image.canonicalize().ctx("resolve", image)?;
        if !loopback::has_btrfs(&image)? {
            tracing::info!(image = %image.display(), size = loop_size, "formatting store image as btrfs");
            loopback::format(&image)?;
        }
        loopback::detach_stale(&image)?;
        fsops::create_dir_all(root)?;
        let loop_device = loopback::mount(&image, root)?;
        tracing::info!(
            image = %image.display(),
            root = %root.display(),
            loop_device = %loop_device,
            created,
            "data directory is not on btrfs: loop-mounted a btrfs store image"
        );
        Ok(loop_device)
    }

    /// The store's root directory (on btrfs).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The data directory the store was opened in (canonical).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// How the btrfs is provided.
    pub fn backing(&self) -> &StoreBacking {
        &self.backing
    }

    /// Unmounts the store and detaches its loop device if it is loop-backed; a no-op for a
    /// native store. Fails with [`StorageError::Busy`] while anything uses it.
    pub fn unmount(&self) -> Result<(), StorageError> {
        let StoreBacking::LoopImage { image, .. } = &self.backing else {
            return Ok(());
        };
        let _lock = FileLock::exclusive(&self.data_dir.join("store.lock"))?;
        loopback::unmount(image, &self.root)
    }

    /// Directory of all sandboxes' files.
    pub fn sandboxes_root(&self) -> PathBuf {
        self.root.join("sandboxes")
    }

    /// Directory of one sandbox's files (`<root>/sandboxes/<id>`).
    pub fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.sandboxes_root().join(id.as_str())
    }

    /// Creates the sandbox's root disk as a reflink of `template_image` (no data copied; the
    /// call fails rather than copy if the filesystem cannot reflink), then grows it sparsely
    /// to `disk_mib` MiB (never below the template image's size). Returns its path.
    pub fn create_sandbox_disk(
        &self,
        id: &SandboxId,
        template_image: &Path,
        disk_mib: u32,
    ) -> Result<PathBuf, StorageError> {
        let dir = self.sandbox_dir(id);
        fsops::create_dir_all(&dir)?;
        let disk = dir.join(SANDBOX_DISK_FILE);
        clone_disk(template_image, &disk, disk_mib, ExistingDisk::Refuse)?;
        tracing::debug!(sandbox = %id.as_str(), disk = %disk.display(), disk_mib, "created sandbox disk (reflink)");
        Ok(disk)
    }

    /// Removes the sandbox's directory and everything in it. Idempotent.
    pub fn remove_sandbox_dir(&self, id: &SandboxId) -> Result<(), StorageError> {
        mountinfo::remove_tree(&self.sandbox_dir(id))
    }

    /// Where templates and kernel bundles fetched from the object store are put together
    /// before the node manager installs them (`<root>/incoming`, the sandbox manager's).
    pub fn incoming_dir(&self) -> PathBuf {
        self.root.join(INCOMING_DIR)
    }

    /// The template store (`<root>/templates`).
    pub fn templates(&self) -> TemplateStore {
        TemplateStore::new(self.root.join("templates"))
    }

    /// The kernel bundle store (`<root>/kernels`).
    pub fn kernels(&self) -> KernelStore {
        KernelStore::new(self.root.join("kernels"))
    }
}

/// What [`clone_disk`] does when the destination already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExistingDisk {
    /// Fail with [`StorageError::DiskExists`]: a disk is never overwritten by accident.
    Refuse,
    /// Replace it atomically (rollback: the old disk stays whole until the rename).
    Replace,
}

/// Makes `dst` a reflink of `src` grown sparsely to `disk_mib` MiB (never below `src`'s
/// size). The clone is made under a temporary name beside `dst`, synced, and renamed into
/// place, so a crash never leaves a half-made disk under the real name. Fails rather than
/// copy when the two are not on one reflink-capable filesystem.
pub(crate) fn clone_disk(
    src: &Path,
    dst: &Path,
    disk_mib: u32,
    existing: ExistingDisk,
) -> Result<(), StorageError> {
    let dir = dst.parent().unwrap_or(Path::new("."));
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if existing == ExistingDisk::Refuse && std::fs::symlink_metadata(dst).is_ok() {
        return Err(StorageError::DiskExists(dst.to_owned()));
    }
    let tmp = dir.join(format!(".{name}.tmp-{}", fsops::random_suffix()));
    let result = (|| {
        fsops::reflink(src, &tmp)?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&tmp)
            .ctx("open", &tmp)?;
        let len = f.metadata().ctx("stat", &tmp)?.len();
        let want = u64::from(disk_mib) * MIB;
        if want > len {
            f.set_len(want).ctx("grow", &tmp)?;
        }
        f.sync_all().ctx("sync", &tmp)?;
        match existing {
            ExistingDisk::Replace => std::fs::rename(&tmp, dst).ctx("rename into place", dst)?,
            // RENAME_NOREPLACE: a disk that appeared meanwhile is still never overwritten.
            ExistingDisk::Refuse => nix::fcntl::renameat2(
                None,
                &tmp,
                None,
                dst,
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            )
            .map_err(|e| match e {
                nix::errno::Errno::EEXIST => StorageError::DiskExists(dst.to_owned()),
                e => StorageError::io("rename into place", dst, e.into()),
            })?,
        }
        fsops::fsync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
