//! Snapshots of a sandbox: disk snapshots (guest file systems frozen, disk reflinked, the VM
//! never pauses), full checkpoints (a live save of memory and device state, the disk
//! reflinked in the same instant), listing, deleting, diffing, and rolling back.
//!
//! Every snapshot is taken two-phase in the store (pending directory, then an atomic
//! rename), so a crash never leaves a half-written snapshot that could be listed or used.
//! A persistent one gets its source (see [`crate::persistent`]) before that rename.

use std::sync::Arc;
use std::time::Duration;

use space_core::{
    SandboxEvent, SandboxId, SandboxState, SnapshotDiff, SnapshotId, SnapshotInfo, SnapshotKind,
    SnapshotTrigger,
};
use space_storage::{ExistingDisk, SnapshotSizes, SANDBOX_DISK_FILE};
use space_vmm::{GuestMemory, SaveOptions, Vm, VmConfig};

use crate::sandbox_manager::{internal, now_ms};
use crate::sealed_disks::{DiskImage, DiskSealing, DiskToSeal};
use crate::sealing::StateForm;
use crate::vm_start::{connect_restored, identity, load_saved_state, SavedState};
use crate::{Node, NodeError, SandboxRecord, SnapshotOwner, VmOrigin};

/// How long the guest keeps its file systems frozen if the node never thaws them.
const FREEZE_HOLD: Duration = Duration::from_secs(10);
/// How long the node waits for a guest to freeze before giving up: a guest that does not
/// answer gets a clear error, never an endless wait.
const FREEZE_WAIT: Duration = Duration::from_secs(15);
/// Longest pause the final pass of a live checkpoint may cause.
const CHECKPOINT_MAX_DOWNTIME: Duration = Duration::from_millis(100);
/// Bound on a whole checkpoint save.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(120);
/// Below this much free space in the store a failed checkpoint is reported as a full disk.
const LOW_DISK_BYTES: u64 = 256 << 20;

/// A checkpoint just taken, with what the guest saw.
#[derive(Debug, Clone)]
pub struct CheckpointTaken {
    pub info: SnapshotInfo,
    /// How long the guest's vCPUs were stopped.
    pub guest_pause: Option<Duration>,
}

/// When a new snapshot's disk is sealed (a sandbox sealed at rest): a persistent one, which
/// outlives its sandbox and may be used by others, before it is listed; any other once the
/// call has returned, under the sandbox's operation lock (see [`crate::sealed_disks`]).
fn disk_sealing(persistent: &Option<SnapshotOwner>) -> DiskSealing {
    match persistent {
        Some(_) => DiskSealing::BeforeCommit,
        None => DiskSealing::AfterCommit,
    }
}

impl Node {
    /// A persistent snapshot's source goes into it before it is committed.
    fn write_source(
        &self,
        id: &SandboxId,
        pending: &space_storage::PendingSnapshot,
        persistent: Option<&SnapshotOwner>,
    ) -> Result<(), NodeError> {
        let Some(owner) = persistent else {
            return Ok(());
        };
        let json = self.source_json(id, pending.id(), Some(owner))?;
        Ok(pending.write_source(&json)?)
    }

    fn check_label(label: &Option<String>) -> Result<(), NodeError> {
        if let Some(l) = label {
            space_core::snapshot::validate_snapshot_label(l)
                .map_err(|e| NodeError::Invalid(e.to_string()))?;
        }
        Ok(())
    }

    /// Takes a disk snapshot. A running guest's file systems are frozen for the instant of
    /// the reflink (so the snapshot is crash-consistent) and the VM keeps running; a stopped
    /// sandbox's disk is reflinked as it is. With `persistent`, the snapshot carries its
    /// [`crate::SnapshotSource`] and outlives the sandbox.
    pub async fn snapshot_disk(
        &self,
        id: &SandboxId,
        label: Option<String>,
        trigger: SnapshotTrigger,
        persistent: Option<SnapshotOwner>,
    ) -> Result<SnapshotInfo, NodeError> {
        Self::check_label(&label)?;
        let op = self.op_lock(id)?;
        let guard = op.lock_owned().await;
        let rec = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        let guest = match rec.state {
            SandboxState::Running => Some(self.guest(id)?),
            SandboxState::Stopped => None,
            state => {
                return Err(NodeError::WrongState {
                    action: "take a disk snapshot of",
                    state,
                })
            }
        };
        let inner = &self.inner;
        let snap = SnapshotId::generate();
        let disk_seal = self.disk_seal(&rec, &snap)?;
        let pending = inner.nm.begin_snapshot(&inner.store, id, &snap)?;
        self.write_source(id, &pending, persistent.as_ref())?;
        let disk = inner.store.sandbox_dir(id).join(SANDBOX_DISK_FILE);
        if let Some(guest) = &guest {
            match tokio::time::timeout(FREEZE_WAIT, guest.freeze_fs(FREEZE_HOLD)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    return Err(NodeError::SnapshotRefused(format!(
                        "the guest could not freeze its file systems: {e}"
                    )))
                }
                Err(_) => {
                    return Err(NodeError::SnapshotRefused(format!(
                        "the guest did not freeze its file systems within {FREEZE_WAIT:?}"
                    )))
                }
            }
        }
        let copied = inner.nm.snapshot_disk(&pending, &disk);
        if let Some(guest) = &guest {
            // If this fails the guest thaws by itself after FREEZE_HOLD.
            if let Err(e) = guest.thaw_fs().await {
                tracing::warn!(%id, error = %e, "cannot thaw guest file systems");
            }
        }
        copied?;
        let unsealed = self
            .seal_new_disk(&rec, &pending, &snap, disk_seal, disk_sealing(&persistent))
            .await?;
        let info = pending.commit(new_info(
            &snap,
            id,
            SnapshotKind::Disk,
            trigger,
            label,
            persistent.is_some(),
        ))?;
        if let Some(disk) = unsealed {
            self.seal_in_background(disk, guard);
        }
        tracing::info!(%id, snapshot = %snap, persistent = info.persistent, "disk snapshot taken");
        Ok(info)
    }

    /// Takes a full checkpoint: memory and device state saved live (the guest pauses only
    /// for the final pass), the disk reflinked while the VM is stopped for that pass. With
    /// `persistent`, the checkpoint carries its [`crate::SnapshotSource`] and outlives the
    /// sandbox, and the workload is frozen across the save (as for a fork), so sandboxes
    /// created from it run none of it before they are made unique.
    pub async fn checkpoint(
        &self,
        id: &SandboxId,
        label: Option<String>,
        trigger: SnapshotTrigger,
        persistent: Option<SnapshotOwner>,
    ) -> Result<CheckpointTaken, NodeError> {
        Self::check_label(&label)?;
        let op = self.op_lock(id)?;
        let guard = op.lock_owned().await;
        let freeze_workload = persistent.is_some();
        let sealing = disk_sealing(&persistent);
        let (taken, unsealed) = self
            .checkpoint_locked(id, label, trigger, freeze_workload, persistent, sealing)
            .await?;
        if let Some(disk) = unsealed {
            self.seal_in_background(disk, guard);
        }
        Ok(taken)
    }

    /// A checkpoint with the operation lock held. With `freeze_workload`, the guest's
    /// workload processes are frozen across the save and stay frozen in the saved state,
    /// so VMs restored from it run no workload code before they are made unique (forks,
    /// persistent checkpoints). A sandbox sealed at rest has its checkpoint's disk sealed
    /// as `disk_sealing` says: after the commit, by the caller, with what is returned.
    pub(crate) async fn checkpoint_locked(
        &self,
        id: &SandboxId,
        label: Option<String>,
        trigger: SnapshotTrigger,
        freeze_workload: bool,
        persistent: Option<SnapshotOwner>,
        disk_sealing: DiskSealing,
    ) -> Result<(CheckpointTaken, Option<DiskToSeal>), NodeError> {
        self.inner
            .transition(id, SandboxEvent::Checkpoint, |_| {})?;
        let vm = self.vm_of(id)?;
        let guest = self.guest(id).ok();
        let snap = SnapshotId::generate();
        let result = async {
            // Before anything moves: a sandbox sealed at rest whose key this node lacks
            // takes no checkpoint at all.
            let rec = self
                .sandbox(id)
                .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
            let seal = self
                .inner
                .artifact_keys
                .seal_for(&rec, crate::sealing::state_artifact(&snap))?;
            let disk_seal = self.disk_seal(&rec, &snap)?;
            let pending = self.inner.nm.begin_snapshot(&self.inner.store, id, &snap)?;
            self.write_source(id, &pending, persistent.as_ref())?;
            // Flush the guest's dirty file data first (a freeze syncs, the thaw follows at
            // once), so the checkpoint's disk also reads right on its own (e.g. in a diff).
            // Best effort, and outside the guest-visible pause.
            if let Some(g) = &guest {
                if g.freeze_fs(FREEZE_HOLD).await.is_ok() {
                    let _ = g.thaw_fs().await;
                }
            }
            if freeze_workload {
                if let Some(g) = &guest {
                    g.freeze_workload().await?;
                }
            }
            let saved = self
                .save_with_disk(id, &vm, &pending.state_path(), seal, |disk| {
                    self.inner.nm.snapshot_disk(&pending, disk)
                })
                .await;
            if freeze_workload {
                if let Some(g) = &guest {
                    if let Err(e) = g.thaw_workload().await {
                        tracing::warn!(%id, error = %e, "cannot thaw workload after checkpoint");
                    }
                }
            }
            let guest_pause = saved?;
            // The guest runs again: a disk sealed at rest is sealed in its own time.
            let unsealed = self
                .seal_new_disk(&rec, &pending, &snap, disk_seal, disk_sealing)
                .await?;
            let info = pending.commit(new_info(
                &snap,
                id,
                SnapshotKind::Checkpoint,
                trigger,
                label,
                persistent.is_some(),
            ))?;
            Ok::<_, NodeError>((CheckpointTaken { info, guest_pause }, unsealed))
        }
        .await;
        match result {
            Ok((taken, unsealed)) => {
                self.inner.transition(id, SandboxEvent::Done, |_| {})?;
                tracing::info!(%id, snapshot = %snap, pause = ?taken.guest_pause, bytes = taken.info.total_bytes, "checkpoint taken");
                Ok((taken, unsealed))
            }
            Err(e) => {
                if let Some(exit) = vm.exit_now() {
                    // The VM died under the checkpoint: treat it like any crash.
                    self.inner.transition(id, SandboxEvent::Abort, |_| {})?;
                    let node = self.clone();
                    let id2 = id.clone();
                    tokio::spawn(async move {
                        node.restore_after_crash(
                            &id2,
                            vm,
                            format!("VM exited during a checkpoint: {}", exit.reason),
                        )
                        .await;
                    });
                    return Err(e);
                }
                self.inner.transition(id, SandboxEvent::Abort, |_| {})?;
                Err(self.explain_checkpoint_failure(e))
            }
        }
    }

    /// Saves the VM's state live into `state` (sealed with `seal`); while the VM is stopped
    /// for the final pass, `snapshot_disk` copies the disk; then the VM runs again. Returns
    /// the guest's pause.
    async fn save_with_disk(
        &self,
        id: &SandboxId,
        vm: &Vm,
        state: &std::path::Path,
        seal: Option<crate::sealing::ArtifactSeal>,
        snapshot_disk: impl FnOnce(&std::path::Path) -> Result<(), space_node_manager::NodeManagerError>,
    ) -> Result<Option<Duration>, NodeError> {
        let opts = SaveOptions {
            ignore_shared: false,
            live: true,
            max_downtime: CHECKPOINT_MAX_DOWNTIME,
            timeout: CHECKPOINT_TIMEOUT,
        };
        let saved = crate::sealing::save_state(vm, state, seal, StateForm::Raw, opts).await?;
        let disk = self.inner.store.sandbox_dir(id).join(SANDBOX_DISK_FILE);
        let copied = snapshot_disk(&disk);
        // Resume whatever happened to the copy: the sandbox must keep running. A sealed
        // state's last chunks are sealed while the guest runs again.
        let resumed = vm.resume().await;
        let sealed = saved.finish().await;
        resumed?;
        copied?;
        sealed?;
        Ok(vm.last_pause())
    }

    fn explain_checkpoint_failure(&self, e: NodeError) -> NodeError {
        let free = nix::sys::statvfs::statvfs(self.inner.store.root())
            .map(|s| s.blocks_available() * s.fragment_size())
            .unwrap_or(u64::MAX);
        if free < LOW_DISK_BYTES {
            NodeError::StoreFull(format!(
                "the checkpoint did not fit: {} MiB free in the node's store ({e})",
                free >> 20
            ))
        } else {
            e
        }
    }

    /// The sandbox's committed snapshots, oldest first, with current sizes.
    pub async fn snapshots(&self, id: &SandboxId) -> Result<Vec<SnapshotInfo>, NodeError> {
        self.sandbox(id)
            .filter(|r| r.state != SandboxState::Deleted)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        let store = self.inner.store.clone();
        let id = id.clone();
        tokio::task::spawn_blocking(move || store.list_snapshots(&id, SnapshotSizes::Refresh))
            .await
            .map_err(|e| internal("snapshot list task", e))?
            .map_err(NodeError::from)
    }

    /// Deletes one snapshot of the sandbox.
    pub async fn delete_snapshot(
        &self,
        id: &SandboxId,
        snap: &SnapshotId,
    ) -> Result<(), NodeError> {
        let op = self.op_lock(id)?;
        let _guard = op.lock().await;
        if !self.inner.nm.delete_snapshot(&self.inner.store, id, snap)? {
            return Err(NodeError::SnapshotNotFound(snap.clone()));
        }
        Ok(())
    }

    /// Files that differ between two disk snapshots (or checkpoints) of the sandbox, read
    /// from the images in user space (a guest-written file system is never mounted).
    pub async fn diff_snapshots(
        &self,
        id: &SandboxId,
        from: &SnapshotId,
        to: &SnapshotId,
        limit: usize,
    ) -> Result<SnapshotDiff, NodeError> {
        let a = self.snapshot_paths(id, from)?;
        let b = self.snapshot_paths(id, to)?;
        let rec = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        // Disks sealed at rest are rebuilt for the diff, and removed after it.
        let a = self.snapshot_disk_image(&rec, from, &a.disk).await?;
        let b = self.snapshot_disk_image(&rec, to, &b.disk).await?;
        let limit = limit.clamp(1, space_core::snapshot::MAX_DIFF_LIMIT);
        let (changes, truncated) = tokio::task::spawn_blocking(move || {
            space_storage::diff_disk_images(a.path(), b.path(), limit)
        })
        .await
        .map_err(|e| internal("diff task", e))??;
        Ok(SnapshotDiff {
            from: from.clone(),
            to: to.clone(),
            changes,
            truncated,
        })
    }

    fn snapshot_paths(
        &self,
        id: &SandboxId,
        snap: &SnapshotId,
    ) -> Result<space_storage::SnapshotPaths, NodeError> {
        self.sandbox(id)
            .filter(|r| r.state != SandboxState::Deleted)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        self.inner
            .store
            .snapshot(id, snap)?
            .map(|(_, paths)| paths)
            .ok_or_else(|| NodeError::SnapshotNotFound(snap.clone()))
    }

    /// Rolls the sandbox back to one of its snapshots: a disk snapshot brings back the old
    /// disk (the VM boots on it); a checkpoint brings back memory and processes too.
    pub async fn rollback(
        &self,
        id: &SandboxId,
        snap: &SnapshotId,
    ) -> Result<SandboxRecord, NodeError> {
        let op = self.op_lock(id)?;
        let _guard = op.lock().await;
        // Only this sandbox's own snapshots exist under it: another sandbox's (or tenant's)
        // snapshot id is simply not found here.
        let paths = self.snapshot_paths(id, snap)?;
        let rec = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        // A disk sealed at rest is rebuilt before the running VM is given up for it too.
        let image = self.snapshot_disk_image(&rec, snap, &paths.disk).await?;
        if let Some(state) = paths.state {
            // A sealed state opens whole once before the running VM is given up for it: one
            // that is damaged, or whose key this node lacks, is refused while the sandbox
            // still runs as it was.
            if let Some(open) = self
                .inner
                .artifact_keys
                .opener_of_state(rec.tenant.as_ref(), &state)?
            {
                tokio::task::spawn_blocking(move || {
                    crate::sealing::verify(&open, &state, "its saved state")
                })
                .await
                .map_err(|e| internal("checking the saved state", e))??;
            }
        }
        self.inner.admit_compute(id)?;
        self.inner.transition(id, SandboxEvent::Rollback, |r| {
            r.rollback_to = Some(snap.clone())
        })?;
        self.finish_rollback(id, Some(image)).await
    }

    /// Second half of a rollback (also used to finish one after a restart, `image` then
    /// `None`: the snapshot's disk image is made here): idempotent.
    pub(crate) async fn finish_rollback(
        &self,
        id: &SandboxId,
        image: Option<DiskImage>,
    ) -> Result<SandboxRecord, NodeError> {
        let rec = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        let Some(snap) = rec.rollback_to.clone() else {
            return Err(NodeError::Internal("rollback without a target".into()));
        };
        let result = async {
            let paths = self.snapshot_paths(id, &snap)?;
            let image = match image {
                Some(image) => image,
                None => self.snapshot_disk_image(&rec, &snap, &paths.disk).await?,
            };
            self.discard_current_vm(id).await?;
            let disk = self.inner.store.sandbox_dir(id).join(SANDBOX_DISK_FILE);
            self.inner.nm.clone_disk(
                &self.inner.store,
                image.path(),
                &disk,
                0,
                ExistingDisk::Replace,
            )?;
            drop(image);
            match &paths.state {
                Some(state) => {
                    self.restore_checkpoint_vm(
                        id,
                        &rec,
                        state,
                        VmOrigin::Checkpoint {
                            sandbox: id.clone(),
                            snapshot: Some(snap.clone()),
                        },
                    )
                    .await
                }
                None => self.boot_existing_disk(id).await,
            }
        }
        .await;
        match result {
            Ok(rec) => {
                tracing::info!(%id, snapshot = %snap, "rolled back");
                Ok(rec)
            }
            Err(e) => {
                let reason = format!("rollback to {snap} failed: {e}");
                self.inner.fail(id, None, &reason).await;
                Err(e)
            }
        }
    }

    /// Stops watching the sandbox's VM, kills it and every other VM that may belong to the
    /// sandbox, and removes their run directories (see [`Inner::discard_vms`]).
    pub(crate) async fn discard_current_vm(&self, id: &SandboxId) -> Result<(), NodeError> {
        let vm = self.release_vm(id);
        self.inner.discard_vms(id, vm).await
    }

    /// Starts the sandbox's VM from a saved state (its disk already in place), makes it
    /// unique, and marks the transient state done (`running`).
    pub(crate) async fn restore_checkpoint_vm(
        &self,
        id: &SandboxId,
        rec: &SandboxRecord,
        state: &std::path::Path,
        origin: VmOrigin,
    ) -> Result<SandboxRecord, NodeError> {
        let vm = self
            .launch_from_state(
                id.as_str(),
                rec,
                state,
                &self.inner.store.sandbox_dir(id).join(SANDBOX_DISK_FILE),
            )
            .await?;
        let ready = async {
            let guest = connect_restored(&vm, self.inner.ready_timeout()).await?;
            guest.set_identity(&identity(id.as_str())).await?;
            // A fork's state has the workload frozen; thawing after the identity is what
            // guarantees no workload code runs before the guest is unique.
            let _ = guest.thaw_workload().await;
            Ok::<_, NodeError>(guest)
        };
        let guest = match ready.await {
            Ok(g) => g,
            Err(e) => {
                let _ = self.inner.nm.kill_vm(&vm).await;
                return Err(e);
            }
        };
        let pid = vm.pid();
        self.attach(id, Arc::new(vm), Some(guest));
        self.inner.transition(id, SandboxEvent::Done, |r| {
            r.vmm_pid = Some(pid);
            r.vm_name = None;
            r.origin = origin;
            r.rollback_to = None;
            r.paused_by = None;
            r.stopped_by = None;
        })
    }

    /// Launches a VM named `vm_name` for a sandbox shaped like `rec`, from a full saved
    /// state (sealed or not), on `disk`.
    pub(crate) async fn launch_from_state(
        &self,
        vm_name: &str,
        rec: &SandboxRecord,
        state: &std::path::Path,
        disk: &std::path::Path,
    ) -> Result<Vm, NodeError> {
        let saved = SavedState {
            path: state,
            ignore_shared: false,
            paused: false,
            open: self
                .inner
                .artifact_keys
                .opener_of_state(rec.tenant.as_ref(), state)?,
        };
        self.launch_restored(vm_name, rec, saved, GuestMemory::Anonymous, disk)
            .await
    }

    /// Launches a VM named `vm_name` for a sandbox shaped like `rec` from `state`, with
    /// `memory` as its RAM, on `disk`.
    pub(crate) async fn launch_restored(
        &self,
        vm_name: &str,
        rec: &SandboxRecord,
        state: SavedState<'_>,
        memory: GuestMemory,
        disk: &std::path::Path,
    ) -> Result<Vm, NodeError> {
        let tpl = self.template_of(rec)?;
        let kernel = self.inner.kernel(&tpl)?;
        let cfg = VmConfig {
            name: vm_name.to_owned(),
            vcpus: rec.resources.vcpus,
            memory_mib: rec.resources.memory_mib,
            kernel: kernel.vmlinuz.clone(),
            initrd: kernel.initramfs.clone(),
            cmdline: space_images::kernel_cmdline(),
            root_disk: disk.to_owned(),
            run_dir: self.inner.vm_run_dir(vm_name),
            accel: self.inner.accel,
            tcg_tb_size_mib: self.inner.cfg.tcg_tb_size_mib,
            memory,
            restore: Some(space_vmm::RestoreFrom {
                ignore_shared: state.ignore_shared,
            }),
            network: self.inner.vm_network(vm_name)?,
        };
        let vm = self.inner.nm.launch_vm(&cfg).await?;
        load_saved_state(&self.inner, vm, state).await
    }
}

fn new_info(
    snap: &SnapshotId,
    id: &SandboxId,
    kind: SnapshotKind,
    trigger: SnapshotTrigger,
    label: Option<String>,
    persistent: bool,
) -> SnapshotInfo {
    SnapshotInfo {
        id: snap.clone(),
        sandbox_id: id.clone(),
        kind,
        trigger,
        created_at_ms: now_ms(),
        exclusive_bytes: 0,
        total_bytes: 0,
        label,
        persistent,
        stored: false,
    }
}
