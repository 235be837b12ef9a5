//! Suspend to object storage, and resume on any node (issue 15).
//!
//! **Suspend** ([`Node::suspend`]): the sandbox goes `suspending` (persisted first), its VM
//! is paused (channel parked) and a full snapshot of the stopped VM is taken in its own
//! snapshots directory, under the id the control plane chose: device state and RAM (QEMU's
//! stream, zero pages already reduced to markers), a reflink of the disk, and its
//! `source.json`. Its artifacts go up to object storage ([`crate::stored`]). The VM stays
//! paused and the sandbox `suspending` until the control plane, having committed the snapshot,
//! deletes it here (which frees everything), or gives up and aborts
//! ([`Node::abort_suspend`]: the VM resumes as it was). A failure of the node's own part
//! aborts at once.
//!
//! **Resume** ([`Node::resume_suspended`]): on any node, under the sandbox's own id. The
//! snapshot is downloaded and verified ([`crate::stored`]) and committed in the new sandbox
//! directory, and the sandbox started from it as from any checkpoint (made current before its
//! workload runs: RNG, clock). The snapshot stays as the sandbox's own checkpoint.

use std::time::{Duration, Instant};

use space_core::snapshot::SnapshotTrigger;
use space_core::{SandboxEvent, SandboxId, SandboxState, SnapshotInfo, SnapshotKind};
use space_node_proto::{ResumeSandbox, SandboxSettings, StoredSnapshot, SuspendSandbox};
use space_objects::Objects;
use space_storage::SANDBOX_DISK_FILE;
use space_vmm::SaveOptions;

use crate::sandbox_manager::{internal, now_ms};
use crate::{Node, NodeError, SandboxRecord};

pub use space_node_proto::snapshot::artifacts::{
    ALL as ARTIFACTS, DISK as DISK_ARTIFACT, MEMORY as MEMORY_ARTIFACT, META as META_ARTIFACT,
    SOURCE as SOURCE_ARTIFACT,
};

/// Bound on saving the paused VM's state.
const SUSPEND_SAVE_TIMEOUT: Duration = Duration::from_secs(300);
/// Label of the snapshot a suspend takes.
const SUSPEND_LABEL: &str = "suspend";

impl Node {
    pub(crate) fn objects(&self) -> Result<&Objects, NodeError> {
        self.inner.objects.as_ref().ok_or_else(|| {
            NodeError::Invalid(
                "this node has no object store configured (`--object-store`): it cannot suspend or resume sandboxes".into(),
            )
        })
    }

    /// Suspends sandbox `req.id` (see the module docs). Returns what was stored.
    pub async fn suspend(&self, req: SuspendSandbox) -> Result<StoredSnapshot, NodeError> {
        let objects = self.objects()?.clone();
        let id = &req.id;
        let op = self.op_lock(id)?;
        let _guard = op.lock().await;
        let before = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        self.inner.transition(id, SandboxEvent::Suspend, |_| {})?;
        let started = Instant::now();
        match self.take_and_store(&req, &before, &objects).await {
            Ok(stored) => {
                tracing::info!(%id, snapshot = %req.snapshot, ms = started.elapsed().as_millis() as u64, memory_bytes = stored.memory_bytes, disk_blocks = stored.disk_changed_blocks, "sandbox snapshot stored; suspending until the control plane commits it");
                Ok(stored)
            }
            Err(e) => {
                tracing::warn!(%id, error = %e, "suspend failed; the sandbox runs again");
                if let Err(again) = self.abort_suspend_locked(id).await {
                    tracing::warn!(%id, error = %again, "cannot run the sandbox again after a failed suspend");
                }
                Err(e)
            }
        }
    }

    /// Pauses the VM, takes the snapshot and uploads its artifacts.
    async fn take_and_store(
        &self,
        req: &SuspendSandbox,
        before: &SandboxRecord,
        objects: &Objects,
    ) -> Result<StoredSnapshot, NodeError> {
        let id = &req.id;
        let vm = self.vm_of(id)?;
        // A sandbox sealed at rest whose key this node lacks is not suspended at all.
        let seal = self.inner.artifact_keys.seal_for(
            before,
            crate::sealing::compressed_state_artifact(&req.snapshot),
        )?;
        let disk_seal = self.disk_seal(before, &req.snapshot)?;
        if before.state == SandboxState::Running {
            self.detach_guest(id);
            crate::vm_start::park(&vm).await;
            vm.pause().await?;
        }
        let pending = self
            .inner
            .nm
            .begin_snapshot(&self.inner.store, id, &req.snapshot)?;
        let source_json = self.source_json(id, &req.snapshot, Some(&req.owner))?;
        pending.write_source(&source_json)?;
        let opts = SaveOptions {
            ignore_shared: false,
            live: false,
            max_downtime: Duration::from_secs(1),
            timeout: SUSPEND_SAVE_TIMEOUT,
        };
        // One pass: QEMU's stream is compressed (and sealed) on its way into the file, which
        // is uploaded as it is.
        let form = crate::sealing::StateForm::Compressed;
        let saved = crate::sealing::save_state(&vm, &pending.state_path(), seal, form, opts)
            .await?
            .finish()
            .await?;
        let disk = self.inner.store.sandbox_dir(id).join(SANDBOX_DISK_FILE);
        self.inner.nm.snapshot_disk(&pending, &disk)?;
        // Sealed here, it is uploaded as it is.
        let sealed_now = crate::sealed_disks::DiskSealing::BeforeCommit;
        let unsealed = self
            .seal_new_disk(before, &pending, &req.snapshot, disk_seal, sealed_now)
            .await?;
        debug_assert!(unsealed.is_none());
        // Not persistent: the snapshot goes with the sandbox when the node frees it; the
        // stored copy is the one that counts.
        let info = pending.commit(SnapshotInfo {
            id: req.snapshot.clone(),
            sandbox_id: id.clone(),
            kind: SnapshotKind::Checkpoint,
            trigger: SnapshotTrigger::Manual,
            created_at_ms: now_ms(),
            exclusive_bytes: 0,
            total_bytes: 0,
            label: Some(SUSPEND_LABEL.into()),
            persistent: false,
            stored: false,
        })?;
        debug_assert_eq!(info.id, req.snapshot);
        let mut stored = self
            .upload_snapshot(objects, before, &req.snapshot, &req.owner)
            .await?;
        stored.memory_bytes = saved.bytes;
        let mut history = self.inner.events.read(id);
        let cut = history
            .len()
            .saturating_sub(space_node_proto::snapshot::MAX_STORED_HISTORY);
        stored.history = history.split_off(cut);
        Ok(stored)
    }

    /// Gives up a suspend: the paused VM runs again (the snapshot it took stays, as a
    /// checkpoint of the sandbox).
    pub async fn abort_suspend(&self, id: &SandboxId) -> Result<SandboxRecord, NodeError> {
        let op = self.op_lock(id)?;
        let _guard = op.lock().await;
        self.abort_suspend_locked(id).await
    }

    async fn abort_suspend_locked(&self, id: &SandboxId) -> Result<SandboxRecord, NodeError> {
        let rec = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        if rec.state != SandboxState::Suspending {
            return Err(space_core::LifecycleError {
                state: rec.state,
                event: SandboxEvent::Abort,
            }
            .into());
        }
        let vm = self.vm_of(id)?;
        let resumed = async {
            vm.resume().await?;
            let guest = crate::vm_start::connect_ready(&vm, self.inner.ready_timeout()).await?;
            // The guest clock stood still while paused.
            guest
                .set_identity(&crate::vm_start::identity(id.as_str()))
                .await?;
            Ok::<_, NodeError>(guest)
        };
        match resumed.await {
            Ok(guest) => {
                self.attach(id, vm, Some(guest));
                self.inner.scheduler.reset(id);
                let rec = self
                    .inner
                    .transition(id, SandboxEvent::Abort, |r| r.paused_by = None)?;
                tracing::info!(%id, "suspend given up; the sandbox runs again");
                Ok(rec)
            }
            Err(e) => {
                let reason = format!("could not run again after a suspend was given up: {e}");
                self.inner.fail(id, Some(&vm), &reason).await;
                Err(NodeError::SandboxFailed(reason))
            }
        }
    }

    /// Restores a suspended sandbox here, under its own id (see the module docs).
    pub async fn resume_suspended(&self, req: ResumeSandbox) -> Result<SandboxRecord, NodeError> {
        let objects = self.objects()?.clone();
        let s = &req.suspended;
        let id = &s.sandbox_id;
        if self
            .sandbox(id)
            .is_some_and(|r| r.state != SandboxState::Deleted)
        {
            return Err(NodeError::SandboxExists(id.clone()));
        }
        let started = Instant::now();
        // The snapshot, rebuilt in the new sandbox's directory.
        let sandbox_dir = self.inner.store.sandbox_dir(id);
        std::fs::create_dir_all(&sandbox_dir).map_err(|e| internal("sandbox directory", e))?;
        let rebuilt = async {
            let pending = self
                .inner
                .nm
                .begin_snapshot(&self.inner.store, id, &s.snapshot)?;
            let done = self
                .download_snapshot(&objects, s, &req.tenant, pending, false)
                .await?;
            if done.info.kind != SnapshotKind::Checkpoint {
                return Err(NodeError::SnapshotCorrupt(
                    "it is not a checkpoint: a suspended sandbox resumes only from one".into(),
                ));
            }
            Ok(done.source)
        }
        .await;
        let source = match rebuilt {
            Ok(source) => source,
            Err(e) => {
                let _ = self.inner.nm.remove_sandbox_files(
                    &self.inner.store,
                    id,
                    &self.inner.run_dir(id),
                );
                return Err(e);
            }
        };
        let (_, paths) = self
            .inner
            .store
            .snapshot(id, &s.snapshot)?
            .ok_or_else(|| internal("resume", "the snapshot just rebuilt is gone"))?;
        let settings = SandboxSettings {
            on_crash: s.settings.on_crash,
            auto_pause_secs: s.settings.auto_pause_secs,
            snapshots: s.settings.snapshots.clone(),
            seal_at_rest: req.seal_at_rest,
            ..SandboxSettings::new(req.tenant.clone())
        };
        // Back on the node that freed it: its deleted record gives way (its event log goes
        // on). On another node, the log goes on from the one the suspend carried.
        self.inner.forget_deleted(id);
        self.inner.events.seed(id, &s.history);
        let created = self
            .create_from_found(
                id,
                &s.snapshot,
                SnapshotKind::Checkpoint,
                paths,
                source,
                settings,
                None,
                SandboxState::Resuming,
                started,
            )
            .await;
        let rec = match created {
            Ok(rec) => rec,
            Err(e) => {
                // A resume that failed leaves nothing here: the sandbox stays suspended (its
                // stored snapshot is the one that counts), and resuming it again, here or
                // elsewhere, finds its id free.
                if let Err(again) = self.delete_sandbox(id).await {
                    tracing::warn!(%id, error = %again, "cannot remove a sandbox whose resume failed");
                }
                return Err(e);
            }
        };
        tracing::info!(%id, snapshot = %s.snapshot, ms = started.elapsed().as_millis() as u64, "suspended sandbox resumed on this node");
        Ok(rec)
    }
}
