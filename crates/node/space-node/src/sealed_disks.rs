//! Snapshot disks of a sandbox sealed at rest (see [`crate::sealing`]).
//!
//! A snapshot's disk is normally a reflink of the sandbox's disk: O(1), and plaintext. For a
//! sandbox sealed at rest the reflink is only a moment's step: once the guest runs again,
//! what differs from the template's image (blocks the extent maps prove shared are skipped
//! unread) is written compressed and sealed as `disk.delta.zst`, and the reflink removed.
//! It is the very artifact object storage keeps (same format, same artifact id), so a
//! suspend uploads it and a resume downloads it as they are.
//!
//! When ([`DiskSealing`]): before the commit ([`Node::seal_new_disk`]) for a snapshot that
//! must never be listed in plaintext (persistent, a suspend's); else after it, on a task
//! holding the sandbox's operation lock ([`Node::seal_in_background`]), so the call returns
//! as fast as a plain one and the sandbox's next operation waits for the seal. A seal a
//! crash interrupted is done when the tenant's key is next lent
//! ([`Node::seal_leftover_disks`]).
//!
//! Whatever uses such a disk (rollback, fork, a sandbox made from the snapshot, a crash
//! restore, a diff) asks [`Node::snapshot_disk_image`] for an image: the reflink as it is,
//! or one rebuilt from the sealed delta on a reflink of the template's image, in the
//! directory of the sandbox it is for. A rebuilt image is as plaintext as that sandbox's
//! live disk, and is removed as soon as its user is done (at drop; a node restart sweeps
//! any a crash left). A delta that does not open whole, or was taken against another base,
//! is refused before anything uses it.

use std::path::{Path, PathBuf};

use space_core::{SnapshotId, TenantId};
use space_node_proto::snapshot::artifacts;
use space_storage::delta::{apply_delta, write_delta, DeltaStats};
use space_storage::{ExistingDisk, PendingSnapshot, SnapshotDisk};
use tokio::sync::OwnedMutexGuard;

use crate::packing::ZSTD_LEVEL;
use crate::sandbox_manager::internal;
use crate::sealing::{read_opened, write_sealed, ArtifactSeal};
use crate::{Node, NodeError, SandboxRecord};

/// What an image rebuilt in a sandbox's directory is named after (and swept by).
const REBUILT_PREFIX: &str = ".rebuilt-";
/// A committed snapshot's sealed disk while it is written (renamed in once whole).
const PARTIAL_SEALED_DISK: &str = ".disk.delta.zst.partial";

/// When the disk of a new snapshot of a sandbox sealed at rest is sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiskSealing {
    /// Before the snapshot is committed: it is never listed with a plaintext disk (a
    /// persistent snapshot, a suspend's upload).
    BeforeCommit,
    /// By the caller, once the snapshot is committed ([`DiskToSeal`]): the call returns
    /// sooner, at the price of a plaintext reflink for as long as the seal takes.
    AfterCommit,
}

/// A committed snapshot of a sandbox sealed at rest whose disk is still the reflink.
#[must_use = "a snapshot disk not sealed stays in plaintext"]
pub(crate) struct DiskToSeal {
    rec: SandboxRecord,
    snap: SnapshotId,
    seal: ArtifactSeal,
}

/// The id a snapshot's sealed disk is sealed as: the same on the node's store and in
/// object storage (one artifact, moved as it is).
pub(crate) fn disk_artifact(snap: &SnapshotId) -> String {
    crate::stored::stored_artifact_id(snap, artifacts::DISK)
}

/// The image a disk delta is taken against and applied onto, and what it is known as in
/// the delta (its template's digest).
pub(crate) struct DeltaBase {
    pub image: PathBuf,
    pub id: String,
}

/// Writes what `disk` changed against `base` into new file `out`: a disk delta,
/// compressed, sealed when `seal` says so. Blocking.
pub(crate) fn write_disk_delta(
    base: &DeltaBase,
    disk: &Path,
    out: &Path,
    seal: Option<&ArtifactSeal>,
) -> Result<DeltaStats, NodeError> {
    let file = std::fs::File::create_new(out)
        .map_err(|e| internal(&format!("create {}", out.display()), e))?;
    write_sealed(seal, file, |w| {
        let mut enc = zstd::Encoder::new(w, ZSTD_LEVEL)?;
        let stats =
            write_delta(&base.image, &base.id, disk, &mut enc).map_err(std::io::Error::other)?;
        std::io::Write::flush(&mut enc.finish()?)?;
        Ok(stats)
    })
}

/// Applies compressed disk delta `delta` (opened on the way when `open` says so) onto
/// `disk`, a reflink of the image known as `base_id`, growing it to at most `max` bytes. A
/// delta that is damaged, does not open whole, or was taken against another base is
/// [`NodeError::SnapshotCorrupt`]. Blocking.
pub(crate) fn apply_disk_delta(
    delta: &Path,
    open: Option<&ArtifactSeal>,
    base_id: &str,
    disk: &Path,
    max: u64,
) -> Result<DeltaStats, NodeError> {
    let bad = |e: &dyn std::fmt::Display| NodeError::SnapshotCorrupt(format!("its disk: {e}"));
    let input = std::fs::File::open(delta)
        .map_err(|e| internal(&format!("open {}", delta.display()), e))?;
    read_opened(open, input, |packed| {
        let mut dec = zstd::Decoder::new(packed).map_err(|e| bad(&e))?;
        apply_delta(&mut dec, base_id, disk, max).map_err(|e| bad(&e))
    })
}

/// Replaces reflink `disk` in snapshot directory `dir` (pending or committed) by its
/// delta against `base`, sealed: written under a hidden name, renamed in once whole (a
/// reader from then on takes it), then the reflink removed. Blocking.
fn replace_by_sealed_delta(
    base: &DeltaBase,
    dir: &Path,
    disk: &Path,
    seal: &ArtifactSeal,
) -> Result<(), NodeError> {
    let partial = dir.join(PARTIAL_SEALED_DISK);
    let _ = std::fs::remove_file(&partial);
    let written = write_disk_delta(base, disk, &partial, Some(seal));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written?;
    let sealed = dir.join(space_storage::SNAPSHOT_SEALED_DISK_FILE);
    let io = |what: &str, e| internal(&format!("{what} in {}", dir.display()), e);
    std::fs::rename(&partial, &sealed).map_err(|e| io("rename the sealed disk", e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("sync", e))?;
    std::fs::remove_file(disk).map_err(|e| io("remove the disk's reflink", e))
}

/// A snapshot's disk as an image, for as long as this lives (see the module docs).
pub(crate) struct DiskImage {
    path: PathBuf,
    /// Rebuilt for this use: removed at drop.
    rebuilt: bool,
}

impl DiskImage {
    /// The image.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DiskImage {
    fn drop(&mut self) {
        if self.rebuilt {
            if let Err(e) = std::fs::remove_file(&self.path) {
                tracing::warn!(image = %self.path.display(), error = %e, "cannot remove a rebuilt snapshot disk; the next node start does");
            }
        }
    }
}

impl Node {
    /// The key a new snapshot `snap` of `rec` seals its disk under; `None` for a sandbox
    /// not sealed at rest. Asked before anything moves: without the key, no snapshot.
    pub(crate) fn disk_seal(
        &self,
        rec: &SandboxRecord,
        snap: &SnapshotId,
    ) -> Result<Option<ArtifactSeal>, NodeError> {
        self.inner.artifact_keys.seal_for(rec, disk_artifact(snap))
    }

    /// Seals the disk reflinked into `pending` (a new snapshot `snap` of `rec`) when `seal`
    /// is given (see the module docs): now, before the commit, or by the caller after it
    /// (the [`DiskToSeal`] returned).
    pub(crate) async fn seal_new_disk(
        &self,
        rec: &SandboxRecord,
        pending: &PendingSnapshot,
        snap: &SnapshotId,
        seal: Option<ArtifactSeal>,
        when: DiskSealing,
    ) -> Result<Option<DiskToSeal>, NodeError> {
        let Some(seal) = seal else {
            return Ok(None);
        };
        if when == DiskSealing::AfterCommit {
            return Ok(Some(DiskToSeal {
                rec: rec.clone(),
                snap: snap.clone(),
                seal,
            }));
        }
        let base = self.delta_base(rec).await?;
        let (dir, disk) = (pending.dir().to_owned(), pending.disk_path());
        tokio::task::spawn_blocking(move || replace_by_sealed_delta(&base, &dir, &disk, &seal))
            .await
            .map_err(|e| internal("sealing a snapshot's disk", e))??;
        Ok(None)
    }

    /// Seals the disk of committed snapshot `d` in place (with the sandbox's operation lock
    /// held by the caller): the sealed delta is written under a hidden name, renamed in (a
    /// reader from then on takes it), and the reflink removed. A snapshot gone, or sealed
    /// already, is left as it is.
    pub(crate) async fn seal_committed_disk(&self, d: DiskToSeal) -> Result<(), NodeError> {
        let Some((_, paths)) = self.inner.store.snapshot(&d.rec.id, &d.snap)? else {
            return Ok(());
        };
        let SnapshotDisk::Image(disk) = paths.disk else {
            return Ok(());
        };
        let base = self.delta_base(&d.rec).await?;
        let dir = paths.dir;
        tokio::task::spawn_blocking(move || replace_by_sealed_delta(&base, &dir, &disk, &d.seal))
            .await
            .map_err(|e| internal("sealing a snapshot's disk", e))?
    }

    /// Seals committed snapshot `d`'s disk on a task of its own, holding `guard` (the
    /// sandbox's operation lock) until done: the call that took the snapshot returns at
    /// once, and the sandbox's next operation waits for the seal. A disk that cannot be
    /// sealed is not kept in plaintext: its snapshot is removed.
    pub(crate) fn seal_in_background(&self, d: DiskToSeal, guard: OwnedMutexGuard<()>) {
        let node = self.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let (id, snap) = (d.rec.id.clone(), d.snap.clone());
            let started = std::time::Instant::now();
            match node.seal_committed_disk(d).await {
                Ok(()) => {
                    tracing::debug!(%id, snapshot = %snap, ms = started.elapsed().as_millis() as u64, "snapshot disk sealed")
                }
                Err(e) => {
                    tracing::error!(%id, snapshot = %snap, error = %e, "cannot seal a snapshot's disk; the snapshot is removed rather than kept in plaintext");
                    if let Err(e) = node.inner.nm.delete_snapshot(&node.inner.store, &id, &snap) {
                        tracing::error!(%id, snapshot = %snap, error = %e, "cannot remove a snapshot whose disk is not sealed");
                    }
                }
            }
        });
    }

    /// Notes (at node start) whether sandbox `id`, sealed at rest, has snapshot disks a
    /// crash left as reflinks: its tenant's next key loan seals them
    /// ([`Node::seal_leftover_disks`]).
    pub(crate) fn note_leftover_disks(&self, id: &space_core::SandboxId) {
        let Some(rec) = self.sandbox(id) else {
            return;
        };
        let Some(tenant) = rec.tenant.as_ref().filter(|_| rec.seal_at_rest) else {
            return;
        };
        if self.leftover_disks(id).is_empty() {
            return;
        }
        tracing::warn!(%id, "snapshot disks left in plaintext by a crash; sealed once the tenant's key is lent");
        self.inner.artifact_keys.await_key(tenant);
    }

    /// The committed snapshots of sandbox `id` whose disk is a reflink.
    fn leftover_disks(&self, id: &space_core::SandboxId) -> Vec<SnapshotId> {
        let store = &self.inner.store;
        let Ok(listed) = store.list_snapshots(id, space_storage::SnapshotSizes::Stored) else {
            return Vec::new();
        };
        listed
            .into_iter()
            // A fork's own checkpoint is in use, reflink and all, until the fork is done.
            .filter(|info| info.trigger != space_core::SnapshotTrigger::Fork)
            .filter(|info| {
                matches!(
                    store.snapshot(id, &info.id),
                    Ok(Some((_, p))) if matches!(p.disk, SnapshotDisk::Image(_))
                )
            })
            .map(|info| info.id)
            .collect()
    }

    /// Seals the snapshot disks of `tenant`'s sandboxes sealed at rest that a crash (or a
    /// node stopped mid-seal) left as reflinks: run when the tenant's key is lent, the
    /// first moment this node can. Each sandbox's operation lock is taken in turn.
    pub(crate) async fn seal_leftover_disks(&self, tenant: &TenantId) {
        let sandboxes: Vec<SandboxRecord> = self
            .sandboxes()
            .into_iter()
            .filter(|r| {
                r.state != space_core::SandboxState::Deleted
                    && r.seal_at_rest
                    && r.tenant.as_ref() == Some(tenant)
            })
            .collect();
        for rec in sandboxes {
            let Ok(op) = self.op_lock(&rec.id) else {
                continue;
            };
            let _guard = op.lock().await;
            for snap in self.leftover_disks(&rec.id) {
                let sealed = match self.disk_seal(&rec, &snap) {
                    Ok(Some(seal)) => {
                        self.seal_committed_disk(DiskToSeal {
                            rec: rec.clone(),
                            snap: snap.clone(),
                            seal,
                        })
                        .await
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                };
                match sealed {
                    Ok(()) => {
                        tracing::info!(id = %rec.id, snapshot = %snap, "sealed a snapshot disk left in plaintext")
                    }
                    Err(e) => {
                        tracing::warn!(id = %rec.id, snapshot = %snap, error = %e, "cannot seal a snapshot disk left in plaintext; tried again at the next loan");
                        self.inner.artifact_keys.await_key(tenant);
                    }
                }
            }
        }
    }

    /// Snapshot `snap`'s disk as an image, for sandbox `rec` (its tenant's key opens a
    /// sealed disk, its template's image is the base, its disk size the bound, its
    /// directory holds the rebuilt image).
    pub(crate) async fn snapshot_disk_image(
        &self,
        rec: &SandboxRecord,
        snap: &SnapshotId,
        disk: &SnapshotDisk,
    ) -> Result<DiskImage, NodeError> {
        let delta = match disk {
            SnapshotDisk::Image(path) => {
                return Ok(DiskImage {
                    path: path.clone(),
                    rebuilt: false,
                })
            }
            SnapshotDisk::SealedDelta(delta) => delta.clone(),
        };
        let open = self.inner.artifact_keys.opener(
            rec.tenant.as_ref(),
            disk_artifact(snap),
            "a sealed disk",
        )?;
        let store = &self.inner.store;
        let base = self.delta_base(rec).await?;
        let image = DiskImage {
            path: store.sandbox_dir(&rec.id).join(format!(
                "{REBUILT_PREFIX}{snap}-{:016x}.raw",
                rand::random::<u64>()
            )),
            rebuilt: true,
        };
        self.inner
            .nm
            .clone_disk(store, &base.image, &image.path, 0, ExistingDisk::Refuse)?;
        let max = std::fs::metadata(&base.image)
            .map_err(|e| internal(&format!("stat {}", base.image.display()), e))?
            .len()
            .max(u64::from(rec.resources.disk_mib) << 20);
        let path = image.path.clone();
        tokio::task::spawn_blocking(move || {
            apply_disk_delta(&delta, Some(&open), &base.id, &path, max)
        })
        .await
        .map_err(|e| internal("rebuilding a snapshot's disk", e))??;
        Ok(image)
    }

    /// The image a disk delta of sandbox `rec` is taken against and applied onto: its
    /// template's, by digest (fetched if this node lacks it). Never the template its name
    /// points at now: a delta applied onto another image than its own is a corrupt disk.
    pub(crate) async fn delta_base(&self, rec: &SandboxRecord) -> Result<DeltaBase, NodeError> {
        let tpl = self
            .ensure_template(&rec.template_digest, &rec.template)
            .await?;
        Ok(DeltaBase {
            image: self.inner.store.templates().image_path(&tpl),
            id: rec.template_digest.clone(),
        })
    }

    /// Removes the images rebuilt in sandbox `id`'s directory that a crash left behind.
    pub(crate) fn sweep_rebuilt_disks(&self, id: &space_core::SandboxId) {
        let dir = self.inner.store.sandbox_dir(id);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(REBUILT_PREFIX))
            {
                match std::fs::remove_file(entry.path()) {
                    Ok(()) => {
                        tracing::info!(sandbox = %id, image = %entry.path().display(), "removed a rebuilt snapshot disk left by a crash")
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %id, error = %e, "cannot remove a rebuilt snapshot disk")
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_disk_is_the_artifact_object_storage_keeps() {
        let snap = SnapshotId::generate();
        assert_eq!(artifacts::DISK, space_storage::SNAPSHOT_SEALED_DISK_FILE);
        assert_eq!(
            disk_artifact(&snap),
            format!("snapshots/{snap}/disk.delta.zst")
        );
    }
}
