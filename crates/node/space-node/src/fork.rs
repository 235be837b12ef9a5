//! Forking: N new sandboxes from a running sandbox (through a checkpoint taken for the
//! purpose, with the workload frozen) or from one of its checkpoints. Each child gets a CoW
//! copy of the disk, its own memory restored from the saved state, its own id, and restored
//! uniqueness (fresh RNG seed, hostname, clock) before its workload runs again.

use std::sync::Arc;

use space_core::{SandboxEvent, SandboxId, SandboxState, SnapshotId, SnapshotTrigger};
use space_node_manager::{fork_image_prefix, FORK_IMAGE_ROOT};
use space_storage::{ExistingDisk, SANDBOX_DISK_FILE};

use crate::sandbox_manager::now_ms;
use space_guest_proto::GuestConfig;

use crate::vm_start::{connect_restored, identity, make_unique_and_configure};
use crate::{Node, NodeError, SandboxRecord, VmOrigin};

/// Most children of one fork.
pub const MAX_FORK_CHILDREN: usize = 16;
/// Children restored at once (each restore is CPU-bound under TCG).
const PARALLEL_RESTORES: usize = 4;
/// From this many children on, the checkpoint is first turned into a memory image (RAM in
/// memory only, held by the node manager): each child then maps it copy-on-write and loads
/// ~60 KB of device state instead of the whole RAM, and the children share their
/// unmodified pages.
const IMAGE_FORK_MIN_CHILDREN: usize = 3;
/// Prefix of the in-memory image (and of the VM filling it) of the fork whose image
/// directory is named `<fork_image_prefix><suffix>`: `fork-<suffix>`.
const FORK_MEMORY_PREFIX: &str = "fork-";

/// A checkpoint turned into a memory image for one fork: its RAM an in-memory image
/// ([`GuestMemory::InMemory`](space_vmm::GuestMemory::InMemory)), its device state a file
/// in `dir`. Both go when the children run (their mappings keep the memory alive).
pub(crate) struct ForkImage {
    dir: std::path::PathBuf,
    memory: String,
    state: std::path::PathBuf,
    nm: Arc<dyn space_node_manager::NodeManager>,
}

impl ForkImage {
    /// The in-memory image of the fork whose image directory is named `dir_name`, if it is
    /// a fork image directory of the node whose prefix is `prefix`.
    pub(crate) fn memory_of(dir_name: &str, prefix: &str) -> Option<String> {
        dir_name
            .strip_prefix(prefix)
            .map(|suffix| format!("{FORK_MEMORY_PREFIX}{suffix}"))
    }
}

impl Drop for ForkImage {
    fn drop(&mut self) {
        if let Err(e) = self.nm.forget_memory_image(&self.memory) {
            tracing::warn!(image = %self.memory, error = %e, "cannot drop a fork's memory image");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Node {
    /// Removes the checkpoints forks of sandbox `id` took for themselves and a restart
    /// ended before they could (at node start: no fork runs then). Such a checkpoint is
    /// needed by nobody, and is a plaintext reflink when the sandbox is sealed at rest.
    pub(crate) fn remove_abandoned_fork_checkpoints(&self, id: &SandboxId) {
        let store = &self.inner.store;
        let Ok(listed) = store.list_snapshots(id, space_storage::SnapshotSizes::Stored) else {
            return;
        };
        for info in listed.iter().filter(|i| i.trigger == SnapshotTrigger::Fork) {
            match self.inner.nm.delete_snapshot(store, id, &info.id) {
                Ok(_) => {
                    tracing::info!(%id, snapshot = %info.id, "removed the checkpoint of a fork a restart ended")
                }
                Err(e) => {
                    tracing::warn!(%id, snapshot = %info.id, error = %e, "cannot remove the checkpoint of a fork a restart ended")
                }
            }
        }
    }

    /// Forks `parent` into one new sandbox per id in `children`, from the parent as it is now
    /// (`from` = None: a checkpoint is taken and deleted once the children run) or from one
    /// of its checkpoints. Returns the children; those that could not start are failed.
    pub async fn fork(
        &self,
        parent: &SandboxId,
        children: &[SandboxId],
        from: Option<&SnapshotId>,
    ) -> Result<Vec<SandboxRecord>, NodeError> {
        if children.is_empty() || children.len() > MAX_FORK_CHILDREN {
            return Err(NodeError::Invalid(format!(
                "a fork makes 1 to {MAX_FORK_CHILDREN} sandboxes, not {}",
                children.len()
            )));
        }
        let parent_rec = self
            .sandbox(parent)
            .filter(|r| r.state != SandboxState::Deleted)
            .ok_or_else(|| NodeError::SandboxNotFound(parent.clone()))?;
        let op = self.op_lock(parent)?;
        let guard = op.lock().await;
        let (snap, transient) = match from {
            Some(s) => {
                let paths = self
                    .inner
                    .store
                    .snapshot(parent, s)?
                    .ok_or_else(|| NodeError::SnapshotNotFound(s.clone()))?;
                if paths.1.state.is_none() {
                    return Err(NodeError::Invalid(format!(
                        "snapshot {s} is a disk snapshot; a fork needs a checkpoint (memory and disk)"
                    )));
                }
                (s.clone(), false)
            }
            None => {
                if parent_rec.state != SandboxState::Running {
                    return Err(NodeError::WrongState {
                        action: "fork",
                        state: parent_rec.state,
                    });
                }
                // Its disk is not sealed: the checkpoint is removed once the children run
                // (a node start removes one a crash left: `remove_abandoned_fork_checkpoints`,
                // which `seal_leftover_disks` leaves alone for that reason), and the children
                // take the reflink as it is instead of a rebuilt copy.
                let (taken, unsealed) = self
                    .checkpoint_locked(
                        parent,
                        None,
                        SnapshotTrigger::Fork,
                        true,
                        None,
                        crate::sealed_disks::DiskSealing::AfterCommit,
                    )
                    .await?;
                drop(unsealed);
                (taken.info.id, true)
            }
        };
        drop(guard);
        let (_, paths) = self
            .inner
            .store
            .snapshot(parent, &snap)?
            .ok_or_else(|| NodeError::SnapshotNotFound(snap.clone()))?;
        let state = paths
            .state
            .clone()
            .ok_or_else(|| NodeError::Internal("checkpoint without state".into()))?;
        // A checkpoint the fork took for itself goes once the children run, or the fork is
        // given up.
        let discard_checkpoint = || {
            if !transient {
                return;
            }
            if let Err(e) = self
                .inner
                .nm
                .delete_snapshot(&self.inner.store, parent, &snap)
            {
                tracing::warn!(%parent, snapshot = %snap, error = %e, "cannot remove fork checkpoint");
            }
        };
        // One image of the checkpoint's disk for every child (a sealed one is rebuilt once,
        // and removed when the fork is done).
        let disk_image = match self
            .snapshot_disk_image(&parent_rec, &snap, &paths.disk)
            .await
        {
            Ok(image) => image,
            Err(e) => {
                discard_checkpoint();
                return Err(e);
            }
        };

        // Admit every child first, so capacity is checked for the whole fork at once.
        let mut admitted = Vec::new();
        for child in children {
            let mut rec = SandboxRecord {
                id: child.clone(),
                state: SandboxState::Creating,
                created_at_ms: now_ms(),
                origin: VmOrigin::Checkpoint {
                    sandbox: parent.clone(),
                    snapshot: (!transient).then(|| snap.clone()),
                },
                ..parent_rec.clone()
            };
            rec.failure_reason = None;
            rec.create_latency_ms = None;
            rec.vmm_pid = None;
            rec.vm_name = None;
            rec.paused_by = None;
            rec.stopped_by = None;
            rec.rollback_to = None;
            rec.crash_restores_ms.clear();
            rec.inherited_from = std::iter::once(parent.clone())
                .chain(parent_rec.inherited_from.iter().cloned())
                .take(crate::MAX_INHERITED_FROM)
                .collect();
            // The child's disk and memory trust the parent's CA: its gateway signs with it.
            let admit = self
                .inner
                .sandbox_cas
                .copy(parent, child)
                .and_then(|()| self.inner.admit(rec));
            match admit {
                Ok(op) => admitted.push((child.clone(), op)),
                Err(e) => {
                    self.inner.sandbox_cas.remove(child);
                    for (id, _) in &admitted {
                        self.inner
                            .fail(id, None, "fork aborted: not every child fit")
                            .await;
                    }
                    discard_checkpoint();
                    return Err(e);
                }
            }
        }

        let started = std::time::Instant::now();
        let image = if children.len() >= IMAGE_FORK_MIN_CHILDREN {
            match self
                .fork_image(&parent_rec, &state, disk_image.path())
                .await
            {
                Ok(image) => Some(image),
                Err(e) => {
                    tracing::warn!(%parent, error = %e, "cannot make a fork image; restoring each child from the checkpoint");
                    None
                }
            }
        } else {
            None
        };
        let image = image.as_ref();
        let semaphore = Arc::new(tokio::sync::Semaphore::new(PARALLEL_RESTORES));
        let work = admitted.iter().map(|(child, op)| {
            let (semaphore, disk_src, state) = (
                semaphore.clone(),
                disk_image.path().to_owned(),
                state.clone(),
            );
            async move {
                let _guard = op.lock().await;
                let _permit = semaphore.acquire().await;
                match self
                    .start_from_checkpoint(child, &disk_src, &state, image, None, started)
                    .await
                {
                    Ok(rec) => Ok(rec),
                    Err(e) => {
                        self.inner
                            .fail(child, None, &format!("fork failed: {e}"))
                            .await;
                        Err(e)
                    }
                }
            }
        });
        let results = futures::future::join_all(work).await;
        // The children's disks are reflinks and their memory is loaded: the saved state is
        // no longer needed.
        discard_checkpoint();
        let mut out = Vec::new();
        for (r, (child, _)) in results.into_iter().zip(&admitted) {
            match r {
                Ok(rec) => out.push(rec),
                Err(e) => {
                    tracing::warn!(%parent, %child, error = %e, "fork child failed");
                    if let Some(rec) = self.sandbox(child) {
                        out.push(rec);
                    }
                }
            }
        }
        tracing::info!(%parent, children = out.len(), ms = started.elapsed().as_millis() as u64, "forked");
        Ok(out)
    }

    /// Starts admitted sandbox `child` from a checkpoint: its disk a reflink of `disk_src`,
    /// its memory and devices from `state` (or from a fork's memory image of it), made
    /// unique before its workload is thawed, and, with `config`, configured as a new sandbox
    /// (its env, hostname, trust) in the same round trip. Marks it running.
    pub(crate) async fn start_from_checkpoint(
        &self,
        child: &SandboxId,
        disk_src: &std::path::Path,
        state: &std::path::Path,
        image: Option<&ForkImage>,
        config: Option<&GuestConfig>,
        started: std::time::Instant,
    ) -> Result<SandboxRecord, NodeError> {
        let rec = self
            .sandbox(child)
            .ok_or_else(|| NodeError::SandboxNotFound(child.clone()))?;
        let disk = self.inner.store.sandbox_dir(child).join(SANDBOX_DISK_FILE);
        self.inner
            .nm
            .clone_disk(&self.inner.store, disk_src, &disk, 0, ExistingDisk::Refuse)?;
        let vm = match image {
            Some(img) => {
                let restore = crate::vm_start::SavedState {
                    path: &img.state,
                    ignore_shared: true,
                    paused: false,
                    open: None,
                };
                let memory = space_vmm::GuestMemory::InMemory {
                    image: img.memory.clone(),
                    shared: false,
                };
                self.launch_restored(child.as_str(), &rec, restore, memory, &disk)
                    .await?
            }
            None => {
                self.launch_from_state(child.as_str(), &rec, state, &disk)
                    .await?
            }
        };
        let ready = async {
            let guest = connect_restored(&vm, self.inner.ready_timeout()).await?;
            // Unique before the (frozen) workload runs again.
            match config {
                Some(config) => make_unique_and_configure(&guest, config).await?,
                None => guest.set_identity(&identity(child.as_str())).await?,
            }
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
        self.attach(child, Arc::new(vm), Some(guest));
        self.inner.transition(child, SandboxEvent::Ready, |r| {
            r.vmm_pid = Some(pid);
            r.create_latency_ms = Some(started.elapsed().as_millis() as u64);
        })
    }

    /// Loads the checkpoint once into a VM whose RAM is a new in-memory image, and saves
    /// that VM's device state without its RAM: a memory image of the checkpoint.
    async fn fork_image(
        &self,
        parent: &SandboxRecord,
        state: &std::path::Path,
        disk: &std::path::Path,
    ) -> Result<ForkImage, NodeError> {
        let suffix = SandboxId::generate()
            .as_str()
            .trim_start_matches(SandboxId::PREFIX)
            .to_owned();
        let dir_name = format!("{}{suffix}", fork_image_prefix(&self.inner.run_root));
        let dir = std::path::Path::new(FORK_IMAGE_ROOT).join(&dir_name);
        std::fs::create_dir(&dir)
            .map_err(|e| NodeError::Internal(format!("cannot create {}: {e}", dir.display())))?;
        // The VM that fills the image and the image itself: one name (see `memory_of`).
        let name = format!("{FORK_MEMORY_PREFIX}{suffix}");
        let image = ForkImage {
            memory: name.clone(),
            state: dir.join(crate::image::STATE_FILE),
            dir,
            nm: self.inner.nm.clone(),
        };
        // The parent's checkpoint (sealed when the parent is); the image itself is memory
        // only (a memfd and a state file on tmpfs), never at rest.
        let restore = crate::vm_start::SavedState {
            path: state,
            ignore_shared: false,
            paused: true,
            open: self
                .inner
                .artifact_keys
                .opener_of_state(parent.tenant.as_ref(), state)?,
        };
        let memory = space_vmm::GuestMemory::InMemory {
            image: image.memory.clone(),
            shared: true,
        };
        let vm = self
            .launch_restored(&name, parent, restore, memory, disk)
            .await?;
        let saved = crate::sealing::save_state(
            &vm,
            &image.state,
            None,
            crate::sealing::StateForm::Raw,
            space_vmm::SaveOptions {
                ignore_shared: true,
                live: false,
                ..Default::default()
            },
        )
        .await;
        self.inner
            .discard_vm(&vm, &self.inner.vm_run_dir(&name))
            .await;
        saved?.finish().await?;
        Ok(image)
    }
}
