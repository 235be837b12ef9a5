//! Suspend to object storage, and resume on any node (issue 15).
//!
//! **Suspend** ([`Node::suspend`]): the sandbox goes `suspending` (persisted first), its VM
//! is paused (channel parked) and a full snapshot of the stopped VM is taken in its own
//! snapshots directory, under the id the control plane chose: device state and RAM (QEMU's
//! stream, zero pages already reduced to markers), a reflink of the disk, and its
//! `source.json` (what a sandbox restored from it needs: template, resources, egress policy,
//! environment, CA, labels). Its artifacts go up to object storage: `memory.zst` (the state,
//! zstd), `disk.delta.zst` (only the blocks that differ from the template's image, zstd),
//! `source.json`, `meta.json`; each is recorded with its size and SHA-256. The VM stays paused
//! and the sandbox `suspending` until the control plane, having committed the snapshot,
//! deletes it here (which frees everything), or gives up and aborts
//! ([`Node::abort_suspend`]: the VM resumes as it was). A failure of the node's own part
//! aborts at once.
//!
//! **Resume** ([`Node::resume_suspended`]): on any node, under the sandbox's own id. Every
//! artifact is downloaded and verified (size and digest), the disk rebuilt on a reflink of
//! the template's image and the state decompressed, both bounded by the sandbox's
//! resources; that snapshot is committed in the new sandbox directory and the sandbox
//! started from it as from any checkpoint (made current before its workload runs: RNG,
//! clock). The snapshot stays as the sandbox's own checkpoint.

use std::io::Write;

use std::path::Path;
use std::time::{Duration, Instant};

use space_core::snapshot::SnapshotTrigger;
use space_core::{SandboxEvent, SandboxId, SandboxState, SnapshotInfo, SnapshotKind};
use space_node_proto::{
    ResumeSandbox, SandboxSettings, StoredArtifact, SuspendSandbox, SuspendedSettings,
    SuspendedSnapshot,
};
use space_objects::{Artifact, ObjectKey, Objects, ObjectsError};
use space_storage::delta::{apply_delta, write_delta};
use space_storage::{ExistingDisk, SANDBOX_DISK_FILE};
use space_vmm::SaveOptions;

use crate::packing::{compress_file, decompress_sparse, UnpackError, ZSTD_LEVEL};
use crate::sandbox_manager::{internal, now_ms};
use crate::{Node, NodeError, SandboxRecord, SnapshotSource};

/// The artifacts of a stored snapshot, by name.
pub const MEMORY_ARTIFACT: &str = "memory.zst";
/// The disk's changes against the template's image.
pub const DISK_ARTIFACT: &str = "disk.delta.zst";
/// What a sandbox restored from it needs (template, resources, policy, env, CA, labels).
pub const SOURCE_ARTIFACT: &str = "source.json";
/// The snapshot's own description.
pub const META_ARTIFACT: &str = "meta.json";
/// Every artifact a stored snapshot has.
pub const ARTIFACTS: [&str; 4] = [
    MEMORY_ARTIFACT,
    DISK_ARTIFACT,
    SOURCE_ARTIFACT,
    META_ARTIFACT,
];

/// Largest `source.json` or `meta.json` read back.
const MAX_JSON_ARTIFACT: u64 = 1024 * 1024;
/// Device state beside guest RAM a state file may hold, at most.
const STATE_OVERHEAD: u64 = 64 << 20;
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
    pub async fn suspend(&self, req: SuspendSandbox) -> Result<SuspendedSnapshot, NodeError> {
        let objects = self.objects()?.clone();
        let id = &req.id;
        let op = self.op_lock(id)?;
        let _guard = op.lock().await;
        let before = self
            .sandbox(id)
            .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
        self.inner.transition(id, SandboxEvent::Suspend, |_| {})?;
        let started = Instant::now();
        match self.store_snapshot(&req, &before, &objects).await {
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
    async fn store_snapshot(
        &self,
        req: &SuspendSandbox,
        before: &SandboxRecord,
        objects: &Objects,
    ) -> Result<SuspendedSnapshot, NodeError> {
        let id = &req.id;
        let vm = self.vm_of(id)?;
        if before.state == SandboxState::Running {
            self.detach_guest(id);
            crate::vm_start::park(&vm).await;
            vm.pause().await?;
        }
        let pending = self
            .inner
            .nm
            .begin_snapshot(&self.inner.store, id, &req.snapshot)?;
        let source = self.inner.snapshot_source(id, Some(&req.owner))?;
        let source_json =
            serde_json::to_vec(&source).map_err(|e| internal("snapshot source", e))?;
        pending.write_source(&source_json)?;
        let opts = SaveOptions {
            ignore_shared: false,
            live: false,
            max_downtime: Duration::from_secs(1),
            timeout: SUSPEND_SAVE_TIMEOUT,
        };
        vm.save_state(&pending.state_path(), opts).await?;
        let disk = self.inner.store.sandbox_dir(id).join(SANDBOX_DISK_FILE);
        self.inner.nm.snapshot_disk(&pending, &disk)?;
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
        })?;
        let (_, paths) = self
            .inner
            .store
            .snapshot(id, &req.snapshot)?
            .ok_or_else(|| internal("suspend", "the snapshot just committed is gone"))?;
        let state = paths
            .state
            .ok_or_else(|| internal("suspend", "the snapshot has no state"))?;
        let template = self
            .inner
            .store
            .templates()
            .image_path(&self.template_of(before)?);
        let meta_json = serde_json::to_vec(&info).map_err(|e| internal("snapshot meta", e))?;

        // Pack (compress, diff) in a scratch directory of the sandbox's, then upload.
        let scratch = self.inner.store.sandbox_dir(id).join(".suspend");
        let packed = {
            let (scratch, state, disk_copy, template) = (
                scratch.clone(),
                state.clone(),
                paths.disk.clone(),
                template.clone(),
            );
            tokio::task::spawn_blocking(move || pack(&scratch, &state, &template, &disk_copy))
                .await
                .map_err(|e| internal("packing task", e))??
        };
        let upload = async {
            let mut artifacts = Vec::with_capacity(ARTIFACTS.len());
            for (name, file) in [
                (MEMORY_ARTIFACT, scratch.join(MEMORY_ARTIFACT)),
                (DISK_ARTIFACT, scratch.join(DISK_ARTIFACT)),
            ] {
                let key = ObjectKey::snapshot_artifact(req.snapshot.as_str(), name)
                    .map_err(|e| NodeError::Invalid(e.to_string()))?;
                artifacts.push(stored(name, objects.put_file(&key, &file).await?));
            }
            for (name, bytes) in [(SOURCE_ARTIFACT, source_json), (META_ARTIFACT, meta_json)] {
                let key = ObjectKey::snapshot_artifact(req.snapshot.as_str(), name)
                    .map_err(|e| NodeError::Invalid(e.to_string()))?;
                artifacts.push(stored(name, objects.put_bytes(&key, bytes.into()).await?));
            }
            Ok::<_, NodeError>(artifacts)
        }
        .await;
        let _ = std::fs::remove_dir_all(&scratch);
        Ok(SuspendedSnapshot {
            snapshot: req.snapshot.clone(),
            sandbox_id: id.clone(),
            template: before.template.clone(),
            template_digest: before.template_digest.clone(),
            resources: before.resources,
            artifacts: upload?,
            settings: SuspendedSettings {
                on_crash: before.on_crash,
                auto_pause_secs: before.auto_pause_secs,
                snapshots: Some(before.snapshots.clone()),
            },
            memory_bytes: packed.memory_bytes,
            disk_changed_blocks: packed.disk_changed_blocks,
        })
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
        let artifact = |name: &str| -> Result<Artifact, NodeError> {
            s.artifacts
                .iter()
                .find(|a| a.name == name)
                .map(|a| Artifact {
                    key: a.key.clone(),
                    size: a.size,
                    sha256: a.sha256.clone(),
                })
                .ok_or_else(|| NodeError::SnapshotCorrupt(format!("it has no {name}")))
        };
        // The source and description first: small, checked before anything large moves.
        let source_bytes = objects
            .get_bytes(&artifact(SOURCE_ARTIFACT)?, MAX_JSON_ARTIFACT)
            .await?;
        let source: SnapshotSource = serde_json::from_slice(&source_bytes)
            .map_err(|e| NodeError::SnapshotCorrupt(format!("its source: {e}")))?;
        let meta_bytes = objects
            .get_bytes(&artifact(META_ARTIFACT)?, MAX_JSON_ARTIFACT)
            .await?;
        let mut info: SnapshotInfo = serde_json::from_slice(&meta_bytes)
            .map_err(|e| NodeError::SnapshotCorrupt(format!("its description: {e}")))?;
        if source.sandbox_id != *id
            || info.sandbox_id != *id
            || info.id != s.snapshot
            || info.kind != SnapshotKind::Checkpoint
            || source.tenant.as_ref() != Some(&req.tenant)
            || source.template_digest != s.template_digest
            || source.resources != s.resources
        {
            return Err(NodeError::SnapshotCorrupt(
                "it does not describe this sandbox".into(),
            ));
        }
        // A node that lacks the template fetches it (once, however many resumes need it).
        let template = self
            .ensure_template(&s.template_digest, &s.template)
            .await?;
        // The snapshot, rebuilt in the new sandbox's directory.
        let sandbox_dir = self.inner.store.sandbox_dir(id);
        std::fs::create_dir_all(&sandbox_dir).map_err(|e| internal("sandbox directory", e))?;
        let rebuilt = async {
            let pending = self
                .inner
                .nm
                .begin_snapshot(&self.inner.store, id, &s.snapshot)?;
            let scratch = sandbox_dir.join(".resume");
            std::fs::create_dir_all(&scratch).map_err(|e| internal("resume scratch", e))?;
            let (memory_file, delta_file) =
                (scratch.join(MEMORY_ARTIFACT), scratch.join(DISK_ARTIFACT));
            objects
                .get_to_file(&artifact(MEMORY_ARTIFACT)?, &memory_file)
                .await?;
            objects
                .get_to_file(&artifact(DISK_ARTIFACT)?, &delta_file)
                .await?;
            self.inner.nm.clone_disk(
                &self.inner.store,
                &self.inner.store.templates().image_path(&template),
                &pending.disk_path(),
                0,
                ExistingDisk::Refuse,
            )?;
            let max_disk = u64::from(s.resources.disk_mib) << 20;
            let max_state = (u64::from(s.resources.memory_mib) << 20) + STATE_OVERHEAD;
            let (disk, state) = (pending.disk_path(), pending.state_path());
            tokio::task::spawn_blocking(move || {
                unpack(
                    &memory_file,
                    &delta_file,
                    &state,
                    &disk,
                    max_state,
                    max_disk,
                )
            })
            .await
            .map_err(|e| internal("unpacking task", e))??;
            let _ = std::fs::remove_dir_all(&scratch);
            pending.write_source(&source_bytes)?;
            info.persistent = false;
            Ok::<_, NodeError>(pending.commit(info)?)
        }
        .await;
        if let Err(e) = rebuilt {
            let _ =
                self.inner
                    .nm
                    .remove_sandbox_files(&self.inner.store, id, &self.inner.run_dir(id));
            return Err(e);
        }
        let (_, paths) = self
            .inner
            .store
            .snapshot(id, &s.snapshot)?
            .ok_or_else(|| internal("resume", "the snapshot just rebuilt is gone"))?;
        let settings = SandboxSettings {
            on_crash: s.settings.on_crash,
            auto_pause_secs: s.settings.auto_pause_secs,
            snapshots: s.settings.snapshots.clone(),
            ..SandboxSettings::new(req.tenant.clone())
        };
        // Back on the node that freed it: its deleted record gives way (its event log goes
        // on).
        self.inner.forget_deleted(id);
        let rec = self
            .create_from_found(
                id,
                &s.snapshot,
                SnapshotKind::Checkpoint,
                paths,
                source,
                settings,
                None,
                started,
            )
            .await?;
        tracing::info!(%id, snapshot = %s.snapshot, ms = started.elapsed().as_millis() as u64, "suspended sandbox resumed on this node");
        Ok(rec)
    }
}

fn stored(name: &str, a: Artifact) -> StoredArtifact {
    StoredArtifact {
        name: name.to_owned(),
        key: a.key,
        size: a.size,
        sha256: a.sha256,
    }
}

/// What packing measured.
struct Packed {
    memory_bytes: u64,
    disk_changed_blocks: u64,
}

/// Writes `memory.zst` (the state, compressed) and `disk.delta.zst` (the disk's changes
/// against `template`, compressed) into `scratch`.
fn pack(scratch: &Path, state: &Path, template: &Path, disk: &Path) -> Result<Packed, NodeError> {
    let io = |what: &str, path: &Path| {
        let what = format!("{what} {}", path.display());
        move |e: std::io::Error| internal(&what, e)
    };
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).map_err(io("create", scratch))?;
    let memory_out = scratch.join(MEMORY_ARTIFACT);
    let memory_bytes = compress_file(state, &memory_out).map_err(io("compress", &memory_out))?;
    let delta_out = scratch.join(DISK_ARTIFACT);
    let out = std::fs::File::create(&delta_out).map_err(io("create", &delta_out))?;
    let mut enc = zstd::Encoder::new(std::io::BufWriter::new(out), ZSTD_LEVEL)
        .map_err(io("compress", &delta_out))?;
    let stats = write_delta(template, disk, &mut enc).map_err(|e| internal("disk delta", e))?;
    let mut buf = enc.finish().map_err(io("compress", &delta_out))?;
    buf.flush().map_err(io("compress", &delta_out))?;
    Ok(Packed {
        memory_bytes,
        disk_changed_blocks: stats.changed_blocks,
    })
}

/// Decompresses `memory.zst` into `state` (at most `max_state` bytes) and applies
/// `disk.delta.zst` to `disk` (a reflink of the template's image; at most `max_disk`).
fn unpack(
    memory: &Path,
    delta: &Path,
    state: &Path,
    disk: &Path,
    max_state: u64,
    max_disk: u64,
) -> Result<(), NodeError> {
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        NodeError::SnapshotCorrupt(format!("its {what}: {e}"))
    };
    match decompress_sparse(memory, state, max_state, false) {
        Ok(_) => {}
        Err(UnpackError::Malformed(m)) => return Err(bad("memory", &m)),
        Err(e) => return Err(internal("unpack memory", e)),
    }
    let input = std::fs::File::open(delta).map_err(|e| internal("open disk delta", e))?;
    let mut dec = zstd::Decoder::new(input).map_err(|e| bad("disk", &e))?;
    apply_delta(&mut dec, disk, max_disk).map_err(|e| bad("disk", &e))?;
    Ok(())
}

impl From<ObjectsError> for NodeError {
    fn from(e: ObjectsError) -> Self {
        match e {
            ObjectsError::Corrupt { .. } | ObjectsError::NotFound(_) | ObjectsError::Key(_) => {
                NodeError::SnapshotCorrupt(e.to_string())
            }
            other => NodeError::Storage(other.to_string()),
        }
    }
}
