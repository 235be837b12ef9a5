//! Snapshots in object storage: a snapshot taken here going up, and a stored one coming
//! down onto this node. A suspend ([`crate::suspend`]) and a stored checkpoint go up this
//! way; a resume and a create from a stored persistent snapshot come down this way.
//!
//! **Up** ([`Node::upload_snapshot`]): the committed snapshot's files are only read, so the
//! sandbox runs on meanwhile (a suspend pauses it for its own reasons). Its artifacts are
//! `memory.zst` (device state and RAM, zstd; checkpoints only), `disk.delta.zst` (only the
//! blocks that differ from the template's image, zstd), `source.json` (what a sandbox made
//! from it needs: template, resources, egress policy, environment, CA, labels) and
//! `meta.json` (its description); each is recorded with its size and SHA-256.
//!
//! **Down** ([`Node::download_snapshot`]): the source and description first (small, checked
//! to describe the expected snapshot of the expected tenant before anything large moves),
//! then the template if this node lacks it, the disk rebuilt on a reflink of the template's
//! image, bounded by the snapshot's resources (a sealed one is kept as it is stored, the
//! snapshot's disk sealed at rest: see [`crate::sealed_disks`]), and the memory kept as it
//! is stored as the snapshot's saved state (compressed, and sealed if it was: a restore
//! feeds it to QEMU opened and decompressed, see [`crate::sealing::StateForm`]); a digest or
//! size that does not match refuses the snapshot ([`NodeError::SnapshotCorrupt`]). It is
//! committed into a pending snapshot the caller chose: a resumed sandbox's own directory,
//! or ([`Node::fetch_snapshot`]) the persistent snapshots whose sandbox is gone.

use std::path::Path;
use std::time::Instant;

use space_core::{SnapshotId, SnapshotInfo, SnapshotKind, TenantId};
use space_node_proto::snapshot::artifacts;
use space_node_proto::{
    FetchSnapshot, SnapshotHere, SnapshotOwner, StoreSnapshot, StoredArtifact, StoredSettings,
    StoredSnapshot,
};
use space_objects::{Artifact, ObjectKey, Objects, ObjectsError};
use space_storage::{ExistingDisk, PendingSnapshot, SnapshotDisk};

use crate::packing::compress;
use crate::sandbox_manager::internal;
use crate::sealed_disks::{apply_disk_delta, write_disk_delta, DeltaBase};
use crate::sealing::{open_bytes, read_opened, seal_bytes, write_sealed, ArtifactSeal, StateForm};
use crate::{Node, NodeError, SandboxRecord, SnapshotSource};

/// Largest `source.json` or `meta.json` read back (sealed: a header and a tag more).
const MAX_SEALED_JSON_ARTIFACT: u64 = 1024 * 1024 + 1024;

/// A stored snapshot, downloaded and committed on this node.
pub(crate) struct Downloaded {
    /// Its description (as committed here).
    pub info: SnapshotInfo,
    /// Its source.
    pub source: SnapshotSource,
}

impl Node {
    /// Uploads committed snapshot `snap` of live sandbox `rec` (see the module docs). A
    /// snapshot without a `source.json` of its own (not persistent) is described by the
    /// sandbox as it is now, owned by `owner`.
    pub(crate) async fn upload_snapshot(
        &self,
        objects: &Objects,
        rec: &SandboxRecord,
        snap: &SnapshotId,
        owner: &SnapshotOwner,
    ) -> Result<StoredSnapshot, NodeError> {
        let id = &rec.id;
        let (info, paths) = self
            .inner
            .store
            .snapshot(id, snap)?
            .ok_or_else(|| NodeError::SnapshotNotFound(snap.clone()))?;
        if paths.memory.is_some() {
            // Ours save RAM into the state; a separate memory file is not uploaded.
            return Err(NodeError::Invalid(format!(
                "snapshot {snap} keeps guest memory in a file of its own: it cannot be stored"
            )));
        }
        let source_json = match space_storage::read_snapshot_source(&paths)? {
            Some(bytes) => bytes,
            None => self.source_json(id, snap, Some(owner))?,
        };
        let meta_json = serde_json::to_vec(&info).map_err(|e| internal("snapshot meta", e))?;
        // A sandbox sealed at rest stores every artifact sealed; without its key, nothing.
        let keys = &self.inner.artifact_keys;
        let seal = |name: &str| keys.seal_for(rec, stored_artifact_id(snap, name));
        let (memory_seal, disk_seal) = (seal(artifacts::MEMORY)?, seal(artifacts::DISK)?);
        let (source_json, meta_json) = (
            sealed_json(seal(artifacts::SOURCE)?, source_json)?,
            sealed_json(seal(artifacts::META)?, meta_json)?,
        );
        let state = match &paths.state {
            Some(state) => Some((
                state.clone(),
                keys.opener_of_state(rec.tenant.as_ref(), state)?,
            )),
            None => None,
        };
        // The manifest names the template by digest: the delta is taken against that one.
        let base = self.delta_base(rec).await?;
        // Packed (compressed, diffed) in a scratch directory of the sandbox's, then uploaded.
        let scratch = self
            .inner
            .store
            .sandbox_dir(id)
            .join(format!(".upload-{snap}"));
        let packed = {
            let (scratch, disk) = (scratch.clone(), paths.disk.clone());
            let seals = PackSeals {
                memory: memory_seal,
                disk: disk_seal,
            };
            tokio::task::spawn_blocking(move || pack(&scratch, state, &base, &disk, seals))
                .await
                .map_err(|e| internal("packing task", e))?
        };
        let sealed = rec.seal_at_rest;
        let uploaded = async {
            let packed = packed?;
            let mut files = vec![(artifacts::DISK, scratch.join(artifacts::DISK))];
            if packed.memory_bytes.is_some() {
                files.insert(0, (artifacts::MEMORY, scratch.join(artifacts::MEMORY)));
            }
            let mut stored_artifacts = Vec::with_capacity(artifacts::ALL.len());
            for (name, file) in files {
                let key = artifact_key(snap, name)?;
                stored_artifacts.push(stored(name, objects.put_file(&key, &file).await?, sealed));
            }
            for (name, bytes) in [
                (artifacts::SOURCE, source_json),
                (artifacts::META, meta_json),
            ] {
                let key = artifact_key(snap, name)?;
                stored_artifacts.push(stored(
                    name,
                    objects.put_bytes(&key, bytes.into()).await?,
                    sealed,
                ));
            }
            Ok::<_, NodeError>((stored_artifacts, packed))
        }
        .await;
        let _ = std::fs::remove_dir_all(&scratch);
        let (stored_artifacts, packed) = uploaded?;
        Ok(StoredSnapshot {
            snapshot: snap.clone(),
            sandbox_id: id.clone(),
            template: rec.template.clone(),
            template_digest: rec.template_digest.clone(),
            resources: rec.resources,
            artifacts: stored_artifacts,
            settings: StoredSettings {
                on_crash: rec.on_crash,
                auto_pause_secs: rec.auto_pause_secs,
                snapshots: Some(rec.snapshots.clone()),
            },
            memory_bytes: packed.memory_bytes.unwrap_or(0),
            disk_changed_blocks: packed.disk_changed_blocks,
            history: Vec::new(),
        })
    }

    /// Uploads one of a sandbox's committed snapshots (the control plane's request).
    pub async fn store_snapshot(&self, req: StoreSnapshot) -> Result<StoredSnapshot, NodeError> {
        let objects = self.objects()?.clone();
        let rec = self
            .sandbox(&req.id)
            .filter(|r| r.state != space_core::SandboxState::Deleted)
            .ok_or_else(|| NodeError::SandboxNotFound(req.id.clone()))?;
        let started = Instant::now();
        let stored = self
            .upload_snapshot(&objects, &rec, &req.snapshot, &req.owner)
            .await?;
        tracing::info!(id = %req.id, snapshot = %req.snapshot, ms = started.elapsed().as_millis() as u64, "snapshot stored in object storage");
        Ok(stored)
    }

    /// Downloads stored snapshot `s` of `tenant`'s into `pending` and commits it there
    /// (see the module docs); `persistent` marks it so.
    pub(crate) async fn download_snapshot(
        &self,
        objects: &Objects,
        s: &StoredSnapshot,
        tenant: &TenantId,
        pending: PendingSnapshot,
        persistent: bool,
    ) -> Result<Downloaded, NodeError> {
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
        // A sealed artifact opens only with the tenant's key, as the artifact it is stored as.
        let opener = |name: &str| -> Result<Option<ArtifactSeal>, NodeError> {
            let sealed = s.artifacts.iter().any(|a| a.name == name && a.sealed);
            if !sealed {
                return Ok(None);
            }
            let artifact = stored_artifact_id(&s.snapshot, name);
            self.inner.artifact_keys.seal_of(tenant, artifact).map(Some)
        };
        let source_bytes = opened_json(
            opener(artifacts::SOURCE)?,
            objects
                .get_bytes(&artifact(artifacts::SOURCE)?, MAX_SEALED_JSON_ARTIFACT)
                .await?,
        )?;
        let source: SnapshotSource = serde_json::from_slice(&source_bytes)
            .map_err(|e| NodeError::SnapshotCorrupt(format!("its source: {e}")))?;
        let meta_bytes = opened_json(
            opener(artifacts::META)?,
            objects
                .get_bytes(&artifact(artifacts::META)?, MAX_SEALED_JSON_ARTIFACT)
                .await?,
        )?;
        let mut info: SnapshotInfo = serde_json::from_slice(&meta_bytes)
            .map_err(|e| NodeError::SnapshotCorrupt(format!("its description: {e}")))?;
        if source.sandbox_id != s.sandbox_id
            || info.sandbox_id != s.sandbox_id
            || info.id != s.snapshot
            || source.tenant.as_ref() != Some(tenant)
            || source.template_digest != s.template_digest
            || source.resources != s.resources
        {
            return Err(NodeError::SnapshotCorrupt(
                "it does not describe the snapshot it is stored as".into(),
            ));
        }
        let memory = match info.kind {
            SnapshotKind::Checkpoint => Some(artifact(artifacts::MEMORY)?),
            SnapshotKind::Disk => None,
        };
        // A node that lacks the template fetches it (once, however many need it).
        let template = self
            .ensure_template(&s.template_digest, &s.template)
            .await?;
        let scratch = pending.dir().join(".download");
        std::fs::create_dir_all(&scratch).map_err(|e| internal("download scratch", e))?;
        let (memory_file, delta_file) = (
            scratch.join(artifacts::MEMORY),
            scratch.join(artifacts::DISK),
        );
        if let Some(memory) = &memory {
            objects.get_to_file(memory, &memory_file).await?;
        }
        objects
            .get_to_file(&artifact(artifacts::DISK)?, &delta_file)
            .await?;
        // A sealed disk is kept as it was stored: the snapshot's disk sealed at rest (see
        // `crate::sealed_disks`), opened whole when it is rebuilt, before any VM uses it (the
        // download itself is checked against the manifest's SHA-256); a plain one is
        // rebuilt here.
        let disk = match opener(artifacts::DISK)? {
            Some(_) => {
                std::fs::rename(&delta_file, pending.sealed_disk_path())
                    .map_err(|e| internal("keep the sealed disk", e))?;
                None
            }
            None => {
                self.inner.nm.clone_disk(
                    &self.inner.store,
                    &self.inner.store.templates().image_path(&template),
                    &pending.disk_path(),
                    0,
                    ExistingDisk::Refuse,
                )?;
                Some((delta_file, pending.disk_path()))
            }
        };
        // The memory artifact is kept as it was stored, as the snapshot's saved state
        // (compressed, sealed as it was: see `crate::sealing::StateForm`), checked whole when
        // a VM is fed from it.
        if memory.is_some() {
            // Stored sealed, it must be sealed as this very artifact (its chunks open when
            // a VM is fed from it): a plaintext one in its place is refused here.
            if opener(artifacts::MEMORY)?.is_some() {
                let named = space_envelope::sealed_artifact_id(&memory_file)
                    .map_err(|e| crate::sealing::envelope_error("its memory", e))?;
                if named.as_deref()
                    != Some(stored_artifact_id(&s.snapshot, artifacts::MEMORY).as_str())
                {
                    return Err(NodeError::SnapshotCorrupt(
                        "its memory is not sealed as the artifact it is stored as".into(),
                    ));
                }
            }
            std::fs::rename(&memory_file, pending.state_path())
                .map_err(|e| internal("keep the saved state", e))?;
        }
        if let Some((delta, disk)) = disk {
            let max_disk = u64::from(s.resources.disk_mib) << 20;
            let base_id = s.template_digest.clone();
            tokio::task::spawn_blocking(move || {
                apply_disk_delta(&delta, None, &base_id, &disk, max_disk)
            })
            .await
            .map_err(|e| internal("unpacking task", e))??;
        }
        let _ = std::fs::remove_dir_all(&scratch);
        pending.write_source(&source_bytes)?;
        info.persistent = persistent;
        let info = pending.commit(info)?;
        Ok(Downloaded { info, source })
    }

    /// Makes stored snapshot `req.stored` present on this node (see
    /// [`space_node_proto::api::NodeApi::fetch_snapshot`]): among a live sandbox's
    /// snapshots or the persistent ones here already, else downloaded among the latter.
    pub async fn fetch_snapshot(&self, req: FetchSnapshot) -> Result<SnapshotHere, NodeError> {
        let s = &req.stored;
        let here = |node: &Node| -> Result<Option<SnapshotHere>, NodeError> {
            let live = node
                .sandbox(&s.sandbox_id)
                .is_some_and(|r| r.state != space_core::SandboxState::Deleted);
            if live
                && node
                    .inner
                    .store
                    .snapshot(&s.sandbox_id, &s.snapshot)?
                    .is_some()
            {
                return Ok(Some(SnapshotHere {
                    live_sandbox: Some(s.sandbox_id.clone()),
                }));
            }
            Ok(node
                .inner
                .store
                .persistent_snapshot(&s.snapshot)?
                .map(|_| SnapshotHere { live_sandbox: None }))
        };
        if let Some(found) = here(self)? {
            return Ok(found);
        }
        let objects = self.objects()?.clone();
        let key = format!("snapshot/{}", s.snapshot);
        let fetch = async {
            // Whoever went first may have fetched it.
            if let Some(found) = here(self)? {
                return Ok(found);
            }
            let started = Instant::now();
            let pending = self.inner.nm.begin_persistent_snapshot(
                &self.inner.store,
                &s.sandbox_id,
                &s.snapshot,
            )?;
            let done = self
                .download_snapshot(&objects, s, &req.tenant, pending, true)
                .await?;
            tracing::info!(snapshot = %s.snapshot, kind = %done.info.kind, ms = started.elapsed().as_millis() as u64, "stored snapshot fetched onto this node");
            Ok(SnapshotHere { live_sandbox: None })
        };
        self.inner.published.fetching.run(&key, fetch).await
    }
}

fn artifact_key(snap: &SnapshotId, name: &str) -> Result<ObjectKey, NodeError> {
    ObjectKey::snapshot_artifact(snap.as_str(), name).map_err(|e| NodeError::Invalid(e.to_string()))
}

fn stored(name: &str, a: Artifact, sealed: bool) -> StoredArtifact {
    StoredArtifact {
        name: name.to_owned(),
        key: a.key,
        size: a.size,
        sha256: a.sha256,
        sealed,
    }
}

/// The id a stored artifact is sealed as: its place in the object store.
pub(crate) fn stored_artifact_id(snap: &SnapshotId, name: &str) -> String {
    format!("snapshots/{snap}/{name}")
}

fn sealed_json(seal: Option<ArtifactSeal>, json: Vec<u8>) -> Result<Vec<u8>, NodeError> {
    match seal {
        Some(seal) => seal_bytes(&seal, &json),
        None => Ok(json),
    }
}

fn opened_json(open: Option<ArtifactSeal>, bytes: bytes::Bytes) -> Result<Vec<u8>, NodeError> {
    match open {
        Some(open) => open_bytes(&open, &bytes),
        None => Ok(bytes.to_vec()),
    }
}

/// What packing measured.
struct Packed {
    /// Bytes of device state and RAM before compression (checkpoints only; 0 for a state
    /// kept compressed, measured when it was saved).
    memory_bytes: Option<u64>,
    disk_changed_blocks: u64,
}

/// The keys the packed artifacts are sealed under (`None`: plaintext).
struct PackSeals {
    memory: Option<ArtifactSeal>,
    disk: Option<ArtifactSeal>,
}

/// Writes `disk.delta.zst` (the disk's changes against `base`, compressed) and, for a
/// checkpoint, `memory.zst` (the state, opened if sealed, compressed) into `scratch`, each
/// sealed when `seals` says so.
fn pack(
    scratch: &Path,
    state: Option<(std::path::PathBuf, Option<ArtifactSeal>)>,
    base: &DeltaBase,
    disk: &SnapshotDisk,
    seals: PackSeals,
) -> Result<Packed, NodeError> {
    let io = |what: &str, path: &Path| {
        let what = format!("{what} {}", path.display());
        move |e: std::io::Error| internal(&what, e)
    };
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).map_err(io("create", scratch))?;
    let memory_bytes = match state {
        // Kept compressed (a suspend's, or a resumed snapshot's): already the artifact, and
        // sealed as it (see `crate::sealing::StateForm`); its size was reported when saved.
        Some((state, open)) if StateForm::of(&state, open.as_ref())? == StateForm::Compressed => {
            if open.is_some() != seals.memory.is_some() {
                return Err(NodeError::Internal(
                    "a saved state sealed at rest, of a sandbox that is not (or the reverse)"
                        .into(),
                ));
            }
            let out = scratch.join(artifacts::MEMORY);
            space_storage::reflink_or_copy(&state, &out)?;
            Some(0)
        }
        Some((state, open)) => {
            let out = scratch.join(artifacts::MEMORY);
            let file = std::fs::File::create(&out).map_err(io("create", &out))?;
            let input = std::fs::File::open(&state).map_err(io("open", &state))?;
            let seal = seals.memory.as_ref();
            Some(read_opened(open.as_ref(), input, |plain| {
                write_sealed(seal, file, |w| compress(plain, w))
            })?)
        }
        None => None,
    };
    let delta_out = scratch.join(artifacts::DISK);
    let disk_changed_blocks = match disk {
        SnapshotDisk::Image(disk) => {
            write_disk_delta(base, disk, &delta_out, seals.disk.as_ref())?.changed_blocks
        }
        // Already the artifact, sealed under its id there too (see `crate::sealed_disks`);
        // its blocks were counted when it was taken.
        SnapshotDisk::SealedDelta(delta) => {
            if seals.disk.is_none() {
                return Err(NodeError::Internal(
                    "a snapshot disk sealed at rest, of a sandbox that is not".into(),
                ));
            }
            space_storage::reflink_or_copy(delta, &delta_out)?;
            0
        }
    };
    Ok(Packed {
        memory_bytes,
        disk_changed_blocks,
    })
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
