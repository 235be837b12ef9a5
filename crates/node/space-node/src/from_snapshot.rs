//! Creating a sandbox from a snapshot, of a live sandbox or a persistent one whose sandbox
//! was deleted: a checkpoint is restored as a fork child is (a copy-on-write copy of its
//! disk, its memory loaded, made unique before its workload runs again) and configured as
//! the new sandbox; a disk snapshot cold-boots on a copy-on-write copy of its disk. The new
//! sandbox takes template, resources and CA from the snapshot's source (see
//! [`crate::persistent`]); the snapshot's files are only read, so any number of creates may
//! use one snapshot at once.

use std::time::Instant;

use space_core::template::TemplateInfo;
use space_core::{SandboxEvent, SandboxId, SandboxState, SnapshotId, SnapshotKind};
use space_guest_proto::GuestConfig;
use space_storage::{ExistingDisk, SnapshotPaths, SANDBOX_DISK_FILE};

use crate::sandbox_manager::now_ms;
use crate::settings::Inherited;
use crate::{
    CreateFromSnapshot, Node, NodeError, SandboxRecord, SandboxSettings, SnapshotSource, VmOrigin,
};

impl Node {
    /// Creates sandbox `req.id` from a snapshot and returns when its daemon is ready
    /// (`running`), or fails it. A snapshot of another tenant's is not found.
    pub async fn create_sandbox_from_snapshot(
        &self,
        req: CreateFromSnapshot,
    ) -> Result<SandboxRecord, NodeError> {
        let started = Instant::now();
        let (kind, paths, source) = self.find_snapshot_for(&req).await?;
        self.create_from_found(
            &req.id,
            &req.snapshot,
            kind,
            paths,
            source,
            req.settings,
            req.source,
            SandboxState::Creating,
            started,
        )
        .await
    }

    /// Creates sandbox `id` from snapshot `snapshot`, found at `paths` with `source`
    /// (`live_source`: the live sandbox it is a snapshot of, whose CA the new one copies
    /// when the source carries none). Its record starts `initial`: `creating`, or
    /// `resuming` for a suspended sandbox coming back under its own id.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn create_from_found(
        &self,
        id: &SandboxId,
        snapshot: &SnapshotId,
        kind: SnapshotKind,
        paths: SnapshotPaths,
        source: SnapshotSource,
        settings: SandboxSettings,
        live_source: Option<SandboxId>,
        initial: SandboxState,
        started: Instant,
    ) -> Result<SandboxRecord, NodeError> {
        let source = self.open_source(source, snapshot)?;
        let origin = match kind {
            SnapshotKind::Checkpoint => VmOrigin::Checkpoint {
                sandbox: source.sandbox_id.clone(),
                snapshot: Some(snapshot.clone()),
            },
            SnapshotKind::Disk => VmOrigin::Boot,
        };
        let mut record = SandboxRecord::new(
            id.clone(),
            source.template.clone(),
            source.template_digest.clone(),
            source.resources,
            initial,
        );
        record.created_at_ms = now_ms();
        if kind == SnapshotKind::Checkpoint {
            record.inherited_from = vec![source.sandbox_id.clone()];
        }
        record.origin = origin;
        let inherited = Inherited {
            env: source.env.clone(),
            project: source.project.clone(),
            egress: source.egress.clone(),
        };
        crate::settings::apply(
            &settings,
            inherited,
            &self.inner.egress_ceiling,
            &mut record,
        )?;
        let tpl = self.template_of(&record)?;
        // The snapshot's disk and memory trust the source sandbox's CA: so must its gateway.
        let ca = match (&source.sandbox_ca_pem, &live_source) {
            (Some(pem), _) => self.inner.sandbox_cas.install(id, pem),
            (None, Some(live)) => self.inner.sandbox_cas.copy(live, id),
            (None, None) => Ok(()),
        };
        let op = match ca.and_then(|()| self.inner.admit(record)) {
            Ok(op) => op,
            Err(e) => {
                self.inner.sandbox_cas.remove(id);
                return Err(e);
            }
        };
        let _guard = op.lock().await;
        let started_vm = async {
            let rec = self
                .sandbox(id)
                .ok_or_else(|| NodeError::SandboxNotFound(id.clone()))?;
            let config = self.inner.guest_config(id, &tpl)?;
            let disk = self
                .snapshot_disk_image(&rec, snapshot, &paths.disk)
                .await?;
            match &paths.state {
                Some(state) => {
                    self.start_from_checkpoint(id, disk.path(), state, None, Some(&config), started)
                        .await
                }
                None => {
                    self.boot_snapshot_disk(&rec, &tpl, disk.path(), &config, started)
                        .await
                }
            }
        };
        match started_vm.await {
            Ok(rec) => {
                tracing::info!(id = %id, snapshot = %snapshot, latency_ms = rec.create_latency_ms, origin = ?rec.origin, "sandbox created from a snapshot");
                Ok(rec)
            }
            Err(e) => {
                self.inner
                    .fail(id, None, &format!("create from snapshot failed: {e}"))
                    .await;
                Err(e)
            }
        }
    }

    /// The snapshot's kind, files and source, checked to be the tenant's.
    async fn find_snapshot_for(
        &self,
        req: &CreateFromSnapshot,
    ) -> Result<(SnapshotKind, SnapshotPaths, SnapshotSource), NodeError> {
        let not_found = || NodeError::SnapshotNotFound(req.snapshot.clone());
        let (info, source) = match &req.source {
            Some(live) => self.snapshot_source(live, &req.snapshot).await?,
            None => self.persistent_snapshot(&req.snapshot).await?,
        }
        .ok_or_else(not_found)?;
        if source
            .tenant
            .as_ref()
            .is_some_and(|t| t != &req.settings.tenant)
        {
            return Err(not_found());
        }
        let paths = match &req.source {
            Some(live) => self.inner.store.snapshot(live, &req.snapshot)?,
            None => self.inner.store.persistent_snapshot(&req.snapshot)?,
        }
        .map(|(_, paths)| paths)
        .ok_or_else(not_found)?;
        Ok((info.kind, paths, source))
    }

    /// Boots new sandbox `rec` on a copy-on-write copy of a disk snapshot's image `disk`;
    /// marks it running.
    async fn boot_snapshot_disk(
        &self,
        rec: &SandboxRecord,
        tpl: &TemplateInfo,
        disk: &std::path::Path,
        config: &GuestConfig,
        started: Instant,
    ) -> Result<SandboxRecord, NodeError> {
        let id = &rec.id;
        self.inner.nm.clone_disk(
            &self.inner.store,
            disk,
            &self.inner.store.sandbox_dir(id).join(SANDBOX_DISK_FILE),
            rec.resources.disk_mib,
            ExistingDisk::Refuse,
        )?;
        let pid = self.boot_in_place(rec, tpl, config).await?;
        self.inner.transition(id, SandboxEvent::Ready, |r| {
            r.vmm_pid = Some(pid);
            r.create_latency_ms = Some(started.elapsed().as_millis() as u64);
        })
    }
}
