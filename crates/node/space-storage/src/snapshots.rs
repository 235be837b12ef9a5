//! Sandbox snapshots on disk, and the persistent snapshots that outlived their sandbox.
//!
//! ```text
//! <sandbox dir>/snapshots/
//!   <snapshot id>/          committed: usable, listed
//!     disk.raw              reflink of the sandbox disk (FICLONE, O(1)); or, for a sandbox
//!     disk.delta.zst        sealed at rest, its changes against the template's image,
//!                           compressed and sealed by the caller (exactly one of the two)
//!     vm.state              checkpoints only: QEMU device + memory state, written by the caller
//!     memory.raw            checkpoints only, optional: reflink of file-backed guest memory
//!     source.json           persistent snapshots only: what a sandbox made from it needs
//!                           (the caller's JSON, mode 0600: it holds secrets)
//!     meta.json             the SnapshotInfo
//!   .pending-<id>/          being taken; never listed, removed on abort, drop or recovery
//!   .deleting-<id>-<rnd>/   being deleted; never listed, removed on recovery
//! <store>/snapshots/        persistent snapshots whose sandbox was deleted, laid out as above
//!   <snapshot id>/
//!   .deleting-<id>-<rnd>/
//! ```
//!
//! A snapshot appears under its id only through an atomic rename of a complete, fsynced
//! pending directory, so a crash at any point leaves either a whole snapshot or debris that
//! [`Store::remove_pending_snapshots`] clears: never a usable half snapshot. A persistent
//! snapshot is committed with its `source.json`, so it is whole from the start; when its
//! sandbox is deleted, [`Store::persist_snapshot`] moves it with one rename into the store's
//! `snapshots/` (no replacing, both directories fsynced): at any instant it is in exactly one
//! of the two places, and a delete a crash interrupted moves the rest when it is resumed.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use space_core::snapshot::validate_snapshot_label;
use space_core::{SandboxId, SnapshotId, SnapshotInfo};

use crate::error::{IoContext, StorageError};
use crate::extents;
use crate::fsops;
use crate::mountinfo;
use crate::store::{clone_disk, ExistingDisk, Store};

/// Directory of a sandbox's snapshots, inside its sandbox directory.
pub const SNAPSHOTS_DIR: &str = "snapshots";
/// The disk image in a snapshot.
pub const SNAPSHOT_DISK_FILE: &str = "disk.raw";
/// A snapshot's disk sealed at rest: what differs from the template's image, compressed and
/// sealed (written by the caller; opaque here).
pub const SNAPSHOT_SEALED_DISK_FILE: &str = "disk.delta.zst";
/// The saved VM (device + memory) state in a checkpoint.
pub const SNAPSHOT_STATE_FILE: &str = "vm.state";
/// The guest memory file in a checkpoint, when guest memory is file-backed and reflinked.
pub const SNAPSHOT_MEMORY_FILE: &str = "memory.raw";
/// The snapshot's [`SnapshotInfo`], as JSON.
pub const SNAPSHOT_META_FILE: &str = "meta.json";
/// What a sandbox started from a persistent snapshot needs (opaque to the store, mode 0600).
pub const SNAPSHOT_SOURCE_FILE: &str = "source.json";
/// The store's directory of persistent snapshots whose sandbox was deleted.
pub const PERSISTENT_SNAPSHOTS_DIR: &str = "snapshots";
/// Largest source.json read back (it holds a sandbox's env: at most 512 values of 32 KiB).
pub const MAX_SNAPSHOT_SOURCE_BYTES: u64 = 64 << 20;
const PENDING_PREFIX: &str = ".pending-";
const DELETING_PREFIX: &str = ".deleting-";
/// Largest meta.json read back (ours are a few hundred bytes).
const MAX_META_BYTES: u64 = 64 << 10;

/// Where a committed snapshot's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPaths {
    /// The snapshot directory.
    pub dir: PathBuf,
    /// The disk (always present).
    pub disk: SnapshotDisk,
    /// The saved VM state, for checkpoints.
    pub state: Option<PathBuf>,
    /// The guest memory file, for checkpoints that have one.
    pub memory: Option<PathBuf>,
    /// The source description, for persistent snapshots.
    pub source: Option<PathBuf>,
}

impl SnapshotPaths {
    fn of(dir: PathBuf) -> SnapshotPaths {
        let existing = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
        let sealed = dir.join(SNAPSHOT_SEALED_DISK_FILE);
        SnapshotPaths {
            disk: if sealed.is_file() {
                SnapshotDisk::SealedDelta(sealed)
            } else {
                SnapshotDisk::Image(dir.join(SNAPSHOT_DISK_FILE))
            },
            state: existing(SNAPSHOT_STATE_FILE),
            memory: existing(SNAPSHOT_MEMORY_FILE),
            source: existing(SNAPSHOT_SOURCE_FILE),
            dir,
        }
    }
}

/// A snapshot's disk, in one of the two forms it is kept in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotDisk {
    /// A reflink of the sandbox's disk: a disk image as it is.
    Image(PathBuf),
    /// The disk's changes against its template's image, compressed and sealed under the
    /// tenant's key (a sandbox sealed at rest): rebuilt on a reflink of that image to be used.
    SealedDelta(PathBuf),
}

impl SnapshotDisk {
    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            SnapshotDisk::Image(p) | SnapshotDisk::SealedDelta(p) => p,
        }
    }
}

/// Whether [`Store::list_snapshots`] measures the snapshots again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotSizes {
    /// Sizes as recorded at commit (cheap: one small file read per snapshot). A fresh disk
    /// snapshot's exclusive bytes are 0 at commit, so these are stale for the API.
    Stored,
    /// Exclusive and total bytes measured now (a FIEMAP walk per file): they change as the
    /// sandbox writes and as other snapshots are deleted.
    Refresh,
}

/// A snapshot being taken: `snapshots/.pending-<id>/`. Fill it ([`reflink_disk`], the VM
/// state at [`state_path`]), then [`commit`] it; [`abort`] or dropping it uncommitted removes it.
///
/// [`reflink_disk`]: PendingSnapshot::reflink_disk
/// [`state_path`]: PendingSnapshot::state_path
/// [`commit`]: PendingSnapshot::commit
/// [`abort`]: PendingSnapshot::abort
#[derive(Debug)]
pub struct PendingSnapshot {
    sandbox: SandboxId,
    id: SnapshotId,
    /// `snapshots/`
    parent: PathBuf,
    /// `snapshots/.pending-<id>`
    dir: PathBuf,
    /// Set once the directory is committed or removed; Drop then does nothing.
    finished: bool,
}

impl PendingSnapshot {
    /// The snapshot's id.
    pub fn id(&self) -> &SnapshotId {
        &self.id
    }

    /// The sandbox it is a snapshot of.
    pub fn sandbox(&self) -> &SandboxId {
        &self.sandbox
    }

    /// The pending directory, for files the caller writes itself.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the disk image goes.
    pub fn disk_path(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_DISK_FILE)
    }

    /// Where a disk sealed at rest goes (written by the caller, which then removes the
    /// reflink at [`PendingSnapshot::disk_path`]).
    pub fn sealed_disk_path(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_SEALED_DISK_FILE)
    }

    /// Where the VM state goes (QEMU's migration stream, written by the caller).
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_STATE_FILE)
    }

    /// Where a reflink of file-backed guest memory goes.
    pub fn memory_path(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_MEMORY_FILE)
    }

    /// Writes `source.json` (mode 0600 from the start, synced): what a sandbox started from
    /// this snapshot needs. Required before a persistent snapshot is committed.
    pub fn write_source(&self, json: &[u8]) -> Result<(), StorageError> {
        fsops::write_private(&self.dir.join(SNAPSHOT_SOURCE_FILE), json)
    }

    /// Makes the snapshot's disk a reflink of `src` (the sandbox disk; its guest filesystems
    /// frozen or the VM stopped): O(1), no data copied; fails rather than copy. Synced.
    pub fn reflink_disk(&self, src: &Path) -> Result<(), StorageError> {
        reflink_synced(src, &self.disk_path())
    }

    /// Makes the snapshot usable: checks `info` belongs to it and has one disk, syncs every
    /// file, measures it (`exclusive_bytes`, `total_bytes` are filled in), writes meta.json,
    /// and renames `.pending-<id>` to `<id>` with the directory fsynced. On error nothing is
    /// listed and the pending directory is removed.
    pub fn commit(mut self, mut info: SnapshotInfo) -> Result<SnapshotInfo, StorageError> {
        let invalid = |reason: String| StorageError::InvalidSnapshot {
            dir: self.dir.clone(),
            reason,
        };
        if info.id != self.id || info.sandbox_id != self.sandbox {
            return Err(invalid(format!(
                "metadata is for snapshot {} of sandbox {}, not {} of {}",
                info.id, info.sandbox_id, self.id, self.sandbox
            )));
        }
        if let Some(label) = &info.label {
            validate_snapshot_label(label)?;
        }
        let is_file = |p: PathBuf| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file());
        match (is_file(self.disk_path()), is_file(self.sealed_disk_path())) {
            (true, false) | (false, true) => {}
            (false, false) => {
                return Err(invalid(format!(
                    "it has neither {SNAPSHOT_DISK_FILE} nor {SNAPSHOT_SEALED_DISK_FILE}"
                )))
            }
            (true, true) => {
                return Err(invalid(format!(
                    "it has both {SNAPSHOT_DISK_FILE} and {SNAPSHOT_SEALED_DISK_FILE}"
                )))
            }
        }
        if info.persistent && !self.dir.join(SNAPSHOT_SOURCE_FILE).is_file() {
            return Err(invalid(format!(
                "it is persistent but has no {SNAPSHOT_SOURCE_FILE}"
            )));
        }
        for file in data_files(&self.dir)? {
            File::open(&file)
                .ctx("open", &file)?
                .sync_all()
                .ctx("sync", &file)?;
        }
        let (total, exclusive) = measure(&self.dir)?;
        info.total_bytes = total;
        info.exclusive_bytes = exclusive;
        let json = serde_json::to_vec_pretty(&info).map_err(|source| StorageError::Metadata {
            path: self.dir.join(SNAPSHOT_META_FILE),
            source,
        })?;
        // Writes, fsyncs the file, renames it in place and fsyncs the pending directory.
        fsops::write_atomic(&self.dir.join(SNAPSHOT_META_FILE), &json)?;
        let committed = self.parent.join(self.id.as_str());
        std::fs::rename(&self.dir, &committed).ctx("rename into place", &committed)?;
        self.finished = true;
        if let Err(e) = fsops::fsync_dir(&self.parent) {
            // Whether the rename is durable is unknown: take it back so the caller's view
            // (an error, no snapshot) stays true.
            let _ = mountinfo::remove_tree(&committed);
            return Err(e);
        }
        tracing::debug!(sandbox = %self.sandbox, snapshot = %self.id, kind = %info.kind, total, exclusive, "snapshot committed");
        Ok(info)
    }

    /// Removes the pending directory and everything in it.
    pub fn abort(mut self) -> Result<(), StorageError> {
        self.finished = true;
        mountinfo::remove_tree(&self.dir)
    }
}

impl Drop for PendingSnapshot {
    fn drop(&mut self) {
        if !self.finished {
            if let Err(e) = mountinfo::remove_tree(&self.dir) {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot remove an uncommitted snapshot; it is removed at the next recovery");
            }
        }
    }
}

/// The snapshot's data files: every regular file in `dir` but meta.json, source.json and
/// temporaries.
fn data_files(dir: &Path) -> Result<Vec<PathBuf>, StorageError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).ctx("read directory", dir)? {
        let entry = entry.ctx("read directory", dir)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == SNAPSHOT_META_FILE || name == SNAPSHOT_SOURCE_FILE || name.starts_with('.') {
            continue;
        }
        if entry.file_type().ctx("stat", &entry.path())?.is_file() {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// `(total_bytes, exclusive_bytes)` of the snapshot's data files.
fn measure(dir: &Path) -> Result<(u64, u64), StorageError> {
    let (mut total, mut exclusive) = (0u64, 0u64);
    for file in data_files(dir)? {
        total = total.saturating_add(std::fs::metadata(&file).ctx("stat", &file)?.len());
        exclusive = exclusive.saturating_add(extents::exclusive_bytes(&file)?);
    }
    Ok((total, exclusive))
}

/// Reads and checks a committed snapshot's meta.json: it must name `id`, and `sandbox` when
/// one is given (a persistent snapshot whose sandbox was deleted names its own).
fn read_meta(
    dir: &Path,
    sandbox: Option<&SandboxId>,
    id: &SnapshotId,
) -> Result<SnapshotInfo, StorageError> {
    let path = dir.join(SNAPSHOT_META_FILE);
    let mut bytes = Vec::new();
    File::open(&path)
        .ctx("open", &path)?
        .take(MAX_META_BYTES + 1)
        .read_to_end(&mut bytes)
        .ctx("read", &path)?;
    if bytes.len() as u64 > MAX_META_BYTES {
        return Err(StorageError::io(
            "read",
            &path,
            std::io::Error::other(format!("larger than {MAX_META_BYTES} bytes")),
        ));
    }
    let info: SnapshotInfo =
        serde_json::from_slice(&bytes).map_err(|source| StorageError::Metadata {
            path: path.clone(),
            source,
        })?;
    if &info.id != id || sandbox.is_some_and(|s| &info.sandbox_id != s) {
        return Err(StorageError::InvalidSnapshot {
            dir: dir.to_owned(),
            reason: format!(
                "meta.json names snapshot {} of sandbox {}",
                info.id, info.sandbox_id
            ),
        });
    }
    Ok(info)
}

/// The snapshot's source.json, if it has one (read whole, at most
/// [`MAX_SNAPSHOT_SOURCE_BYTES`]).
pub fn read_snapshot_source(paths: &SnapshotPaths) -> Result<Option<Vec<u8>>, StorageError> {
    let Some(path) = &paths.source else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    File::open(path)
        .ctx("open", path)?
        .take(MAX_SNAPSHOT_SOURCE_BYTES + 1)
        .read_to_end(&mut bytes)
        .ctx("read", path)?;
    if bytes.len() as u64 > MAX_SNAPSHOT_SOURCE_BYTES {
        return Err(StorageError::io(
            "read",
            path,
            std::io::Error::other(format!("larger than {MAX_SNAPSHOT_SOURCE_BYTES} bytes")),
        ));
    }
    Ok(Some(bytes))
}

/// The committed snapshots in `parent`, oldest first; each must name `sandbox` if given.
fn list_in(
    parent: &Path,
    sandbox: Option<&SandboxId>,
    sizes: SnapshotSizes,
) -> Result<Vec<SnapshotInfo>, StorageError> {
    let entries = match std::fs::read_dir(parent) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StorageError::io("read directory", parent, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.ctx("read directory", parent)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let Ok(id) = name.parse::<SnapshotId>() else {
            tracing::warn!(dir = %entry.path().display(), "not a snapshot directory; ignored");
            continue;
        };
        let dir = entry.path();
        let mut info = match read_meta(&dir, sandbox, &id) {
            Ok(info) => info,
            // Deleted (or moved) meanwhile.
            Err(_) if !dir.exists() => continue,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "unreadable snapshot skipped");
                continue;
            }
        };
        if sizes == SnapshotSizes::Refresh {
            match measure(&dir) {
                Ok((total, exclusive)) => {
                    info.total_bytes = total;
                    info.exclusive_bytes = exclusive;
                }
                // Deleted meanwhile, most likely: then it is not listed.
                Err(_) if !dir.exists() => continue,
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot measure snapshot; listing its sizes at commit")
                }
            }
        }
        out.push(info);
    }
    out.sort_by(|a, b| {
        a.created_at_ms
            .cmp(&b.created_at_ms)
            .then_with(|| a.id.cmp(&b.id))
    });
    Ok(out)
}

/// One committed snapshot in `parent` and its paths; it must name `sandbox` if given.
fn snapshot_in(
    parent: &Path,
    sandbox: Option<&SandboxId>,
    id: &SnapshotId,
) -> Result<Option<(SnapshotInfo, SnapshotPaths)>, StorageError> {
    let dir = parent.join(id.as_str());
    if !dir.is_dir() {
        return Ok(None);
    }
    let info = read_meta(&dir, sandbox, id)?;
    Ok(Some((info, SnapshotPaths::of(dir))))
}

/// Deletes the committed snapshot `id` in `parent`: renamed out of the listing first.
fn delete_in(parent: &Path, id: &SnapshotId) -> Result<bool, StorageError> {
    let dir = parent.join(id.as_str());
    let doomed = parent.join(format!("{DELETING_PREFIX}{id}-{}", fsops::random_suffix()));
    match std::fs::rename(&dir, &doomed) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(StorageError::io("rename for deletion", &dir, e)),
    }
    fsops::fsync_dir(parent)?;
    mountinfo::remove_tree(&doomed)?;
    tracing::debug!(dir = %parent.display(), snapshot = %id, "snapshot deleted");
    Ok(true)
}

/// Removes the `.pending-*` and `.deleting-*` directories in `parent`; how many.
fn remove_debris_in(parent: &Path) -> Result<usize, StorageError> {
    let entries = match std::fs::read_dir(parent) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(StorageError::io("read directory", parent, e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.ctx("read directory", parent)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(PENDING_PREFIX) || name.starts_with(DELETING_PREFIX) {
            mountinfo::remove_tree(&entry.path())?;
            tracing::info!(dir = %entry.path().display(), "removed an unfinished snapshot");
            removed += 1;
        }
    }
    Ok(removed)
}

impl Store {
    /// Directory of a sandbox's snapshots (`<sandbox dir>/snapshots`).
    pub fn snapshots_dir(&self, sandbox: &SandboxId) -> PathBuf {
        self.sandbox_dir(sandbox).join(SNAPSHOTS_DIR)
    }

    /// Starts a snapshot: creates `snapshots/.pending-<id>/`. The sandbox directory must
    /// exist; the id must not be taken.
    pub fn begin_snapshot(
        &self,
        sandbox: &SandboxId,
        id: &SnapshotId,
    ) -> Result<PendingSnapshot, StorageError> {
        let sandbox_dir = self.sandbox_dir(sandbox);
        if !sandbox_dir.is_dir() {
            return Err(StorageError::NotFound {
                what: "sandbox",
                name: sandbox.to_string(),
                dir: self.sandboxes_root(),
            });
        }
        begin_in(sandbox_dir.join(SNAPSHOTS_DIR), sandbox, id)
    }

    /// [`PendingSnapshot::reflink_disk`] for a pending snapshot another process began
    /// (the sandbox manager's, asking the node manager): fails unless it is pending.
    pub fn reflink_pending_snapshot_disk(
        &self,
        sandbox: &SandboxId,
        id: &SnapshotId,
        src: &Path,
    ) -> Result<PathBuf, StorageError> {
        let dir = self
            .snapshots_dir(sandbox)
            .join(format!("{PENDING_PREFIX}{id}"));
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            return Err(StorageError::NotFound {
                what: "pending snapshot",
                name: id.to_string(),
                dir: self.snapshots_dir(sandbox),
            });
        }
        let copy = dir.join(SNAPSHOT_DISK_FILE);
        reflink_synced(src, &copy)?;
        Ok(copy)
    }

    /// The sandbox's committed snapshots, oldest first. Pending and half-deleted ones are not
    /// listed; a snapshot whose meta.json cannot be read is skipped with a warning.
    pub fn list_snapshots(
        &self,
        sandbox: &SandboxId,
        sizes: SnapshotSizes,
    ) -> Result<Vec<SnapshotInfo>, StorageError> {
        list_in(&self.snapshots_dir(sandbox), Some(sandbox), sizes)
    }

    /// One committed snapshot and where its files are; `None` if the sandbox has no such
    /// snapshot. Sizes are those recorded at commit.
    pub fn snapshot(
        &self,
        sandbox: &SandboxId,
        id: &SnapshotId,
    ) -> Result<Option<(SnapshotInfo, SnapshotPaths)>, StorageError> {
        snapshot_in(&self.snapshots_dir(sandbox), Some(sandbox), id)
    }

    /// Deletes a committed snapshot; `false` if there was none. It disappears from listings
    /// atomically (a rename) before its files are removed.
    pub fn delete_snapshot(
        &self,
        sandbox: &SandboxId,
        id: &SnapshotId,
    ) -> Result<bool, StorageError> {
        delete_in(&self.snapshots_dir(sandbox), id)
    }

    /// Crash recovery: removes the sandbox's uncommitted (`.pending-*`) and half-deleted
    /// (`.deleting-*`) snapshot directories; returns how many. Call when no snapshot of the
    /// sandbox is being taken (at node start, before the scheduler runs).
    pub fn remove_pending_snapshots(&self, sandbox: &SandboxId) -> Result<usize, StorageError> {
        remove_debris_in(&self.snapshots_dir(sandbox))
    }

    /// The store's directory of persistent snapshots whose sandbox was deleted
    /// (`<root>/snapshots`).
    pub fn persistent_snapshots_dir(&self) -> PathBuf {
        self.root().join(PERSISTENT_SNAPSHOTS_DIR)
    }

    /// Moves the sandbox's committed snapshot `id` (a persistent one, whose sandbox is being
    /// deleted) into [`Store::persistent_snapshots_dir`]: one rename that never replaces,
    /// then both directories are fsynced. `false` if the sandbox has no such snapshot (moved
    /// already, by a delete a crash interrupted). Idempotent.
    pub fn persist_snapshot(
        &self,
        sandbox: &SandboxId,
        id: &SnapshotId,
    ) -> Result<bool, StorageError> {
        let from_parent = self.snapshots_dir(sandbox);
        let from = from_parent.join(id.as_str());
        if !from.is_dir() {
            return Ok(false);
        }
        let to_parent = self.persistent_snapshots_dir();
        fsops::create_dir_all(&to_parent)?;
        let to = to_parent.join(id.as_str());
        nix::fcntl::renameat2(
            None,
            &from,
            None,
            &to,
            nix::fcntl::RenameFlags::RENAME_NOREPLACE,
        )
        .map_err(|e| match e {
            nix::errno::Errno::EEXIST => StorageError::SnapshotExists(to.clone()),
            e => StorageError::io("move into the persistent snapshots", &from, e.into()),
        })?;
        fsops::fsync_dir(&to_parent)?;
        fsops::fsync_dir(&from_parent)?;
        tracing::debug!(%sandbox, snapshot = %id, "snapshot kept after its sandbox");
        Ok(true)
    }

    /// Starts a persistent snapshot of sandbox `sandbox` directly among those whose sandbox
    /// is gone (`snapshots/.pending-<id>/` at the store's root): a stored snapshot downloaded
    /// onto this node to create sandboxes from. The id must not be taken there.
    pub fn begin_persistent_snapshot(
        &self,
        sandbox: &SandboxId,
        id: &SnapshotId,
    ) -> Result<PendingSnapshot, StorageError> {
        begin_in(self.persistent_snapshots_dir(), sandbox, id)
    }

    /// The persistent snapshots whose sandbox was deleted, oldest first (as
    /// [`Store::list_snapshots`]).
    pub fn list_persistent_snapshots(
        &self,
        sizes: SnapshotSizes,
    ) -> Result<Vec<SnapshotInfo>, StorageError> {
        list_in(&self.persistent_snapshots_dir(), None, sizes)
    }

    /// One persistent snapshot whose sandbox was deleted, and where its files are.
    pub fn persistent_snapshot(
        &self,
        id: &SnapshotId,
    ) -> Result<Option<(SnapshotInfo, SnapshotPaths)>, StorageError> {
        snapshot_in(&self.persistent_snapshots_dir(), None, id)
    }

    /// Deletes a persistent snapshot whose sandbox was deleted; `false` if there was none.
    pub fn delete_persistent_snapshot(&self, id: &SnapshotId) -> Result<bool, StorageError> {
        delete_in(&self.persistent_snapshots_dir(), id)
    }

    /// Crash recovery of [`Store::persistent_snapshots_dir`]: removes half-deleted
    /// snapshot directories; returns how many. Call at node start.
    pub fn remove_pending_persistent_snapshots(&self) -> Result<usize, StorageError> {
        remove_debris_in(&self.persistent_snapshots_dir())
    }

    /// Makes `dst` a reflink of a snapshot's disk, grown sparsely to `disk_mib` MiB (never
    /// below the snapshot disk's size; 0 keeps its size): for rollback (`ExistingDisk::Replace` over the
    /// sandbox's disk, VM stopped) or fork (a new sandbox's disk, `ExistingDisk::Refuse`).
    /// The parent directory is created; the disk appears under `dst` only when complete.
    pub fn clone_snapshot_disk(
        &self,
        snapshot_disk: &Path,
        dst: &Path,
        disk_mib: u32,
        existing: ExistingDisk,
    ) -> Result<(), StorageError> {
        if let Some(dir) = dst.parent() {
            fsops::create_dir_all(dir)?;
        }
        clone_disk(snapshot_disk, dst, disk_mib, existing)
    }
}

/// Creates `<parent>/.pending-<id>/` for a new snapshot of `sandbox`; the id must not be
/// taken in `parent`.
fn begin_in(
    parent: PathBuf,
    sandbox: &SandboxId,
    id: &SnapshotId,
) -> Result<PendingSnapshot, StorageError> {
    fsops::create_dir_all(&parent)?;
    let committed = parent.join(id.as_str());
    if std::fs::symlink_metadata(&committed).is_ok() {
        return Err(StorageError::SnapshotExists(committed));
    }
    let dir = parent.join(format!("{PENDING_PREFIX}{id}"));
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(StorageError::SnapshotExists(dir))
        }
        Err(e) => return Err(StorageError::io("create directory", &dir, e)),
    }
    Ok(PendingSnapshot {
        sandbox: sandbox.clone(),
        id: id.clone(),
        parent,
        dir,
        finished: false,
    })
}

/// A reflink of `src` at `dst`, synced.
fn reflink_synced(src: &Path, dst: &Path) -> Result<(), StorageError> {
    fsops::reflink(src, dst)?;
    File::open(dst)
        .ctx("open", dst)?
        .sync_all()
        .ctx("sync", dst)
}
