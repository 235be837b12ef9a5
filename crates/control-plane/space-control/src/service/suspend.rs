//! Suspend to object storage, and resume on any node (issue 15).
//!
//! **Suspend** ([`suspend`]): the stored snapshot's row first (`uploading`, this replica's),
//! then the node pauses the VM, snapshots it and uploads the artifacts; this replica checks
//! each artifact is in the store with the size the node reported, then commits in one
//! transaction (artifacts recorded, snapshot `committed`, sandbox suspended in it). Only
//! then is the node told to free the sandbox (a delete). Anything short of the commit gives
//! the suspend up: the node runs the sandbox again, the row is `abandoned`, its objects are
//! collected. A suspended sandbox holds nothing on any node.
//!
//! **Resume** ([`resume`]): the scheduler picks any node (ready, not cordoned, with room;
//! template locality first); the row names it and this replica while the node downloads,
//! verifies and restores the snapshot under the sandbox's own id; then the sandbox is an
//! ordinary live sandbox again, its deadline renewed. A resume that fails leaves it
//! suspended. If this replica dies in between, the reconciler settles it.
//!
//! **Collection** ([`collect`], the leader's): objects of abandoned snapshots, of uploads
//! whose replica died, and of committed snapshots no sandbox is suspended in any more; and
//! hourly ([`collect_orphans`]) objects under `snapshots/` that no row names at all (a node
//! that went on uploading after its replica gave the suspend up and removed what was there).

use std::sync::Arc;

use space_core::sandbox::SandboxInfo;
use space_core::{ErrorCode, SandboxId, SandboxState, SnapshotId, SnapshotInfo, SnapshotKind};
use space_node_proto::snapshot::artifacts;
use space_node_proto::{
    ResumeSandbox, SnapshotOwner, SnapshotRequest, StoreSnapshot, StoredSnapshot, SuspendSandbox,
};
use space_objects::{Artifact, ObjectKey, Objects};

use super::sandboxes::info_now;
use super::Caller;
use crate::api::error::{ApiError, ApiResult};
use crate::api::AppState;
use crate::db::{now_ms, Commit, SandboxRow};
use crate::nodes::NodeApi;

/// Label of the checkpoint a stored checkpoint is uploaded from (on its node until stored).
const STORED_CHECKPOINT_LABEL: &str = "stored-checkpoint";
/// Stored snapshots collected per pass at most.
const COLLECT_BATCH: i64 = 64;
/// Objects under `snapshots/` that no row names are collected once untouched this long
/// (rows are written before any upload, so a younger one may only be racing its row's
/// removal; an hour leaves any upload in flight time to finish or fail).
pub const ORPHAN_AGE_MS: i64 = 60 * 60 * 1000;

fn objects(st: &AppState) -> ApiResult<&Objects> {
    st.objects.as_ref().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Conflict,
            "this control plane has no object store configured (`--object-store`): sandboxes cannot be suspended",
        )
    })
}

/// Suspends one of the caller's running or paused sandboxes (see the module docs).
pub async fn suspend(st: &AppState, caller: &Caller, id: &SandboxId) -> ApiResult<SandboxInfo> {
    let row = st.live_sandbox(&caller.id, id).await?;
    suspend_row(st, row).await?;
    let row = st.find_sandbox(&caller.id, id).await?;
    info_now(st, &row).await
}

/// Suspends live sandbox `row` (found by the caller); returns once it is suspended, or
/// runs again where it was.
pub async fn suspend_row(st: &AppState, row: SandboxRow) -> ApiResult<()> {
    let objects = objects(st)?.clone();
    let id = &row.id;
    if row.suspended_snapshot.is_some() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("sandbox {id} is suspended already"),
        ));
    }
    let node = st.node_of(&row).await?;
    // What the suspend stores is sealed under the tenant's key (and it is not suspended at
    // all without it).
    super::customer_keys::lend_artifact_key(st, &row.tenant_id, node.as_ref()).await?;
    let snapshot = SnapshotId::generate();
    st.db
        .begin_stored_snapshot(&snapshot, id, &row.tenant_id, node.name(), st.replica.id())
        .await?;
    tracing::info!(sandbox = %id, %snapshot, node = node.name(), "suspending sandbox");
    let task_state = st.clone();
    let req = SuspendSandbox {
        id: id.clone(),
        snapshot: snapshot.clone(),
        owner: SnapshotOwner {
            tenant: row.tenant_id.clone(),
            labels: row.labels.clone(),
        },
    };
    // In its own task: a client that hangs up does not leave a suspend half-done.
    let task_id = id.clone();
    tokio::spawn(async move {
        let (st, id) = (&task_state, &task_id);
        let stored = match node.suspend(req).await {
            Ok(stored) => stored,
            Err(e) => {
                // The node ran the sandbox again itself.
                give_up(st, &objects, &snapshot).await;
                return Err(ApiError::from(e));
            }
        };
        if let Err(e) =
            check_stored(&objects, &stored, id, &snapshot, SnapshotKind::Checkpoint).await
        {
            tracing::warn!(sandbox = %id, %snapshot, error = %e.body.message, "stored snapshot does not check out; the sandbox runs again");
            if let Err(again) = node.abort_suspend(id).await {
                tracing::warn!(sandbox = %id, error = %again, "cannot run the sandbox again after a failed suspend");
            }
            give_up(st, &objects, &snapshot).await;
            return Err(e);
        }
        if !st.db.commit_stored_snapshot(&stored, Commit::Suspended).await? {
            // Deleted or suspended meanwhile: nothing to keep.
            let _ = node.abort_suspend(id).await;
            give_up(st, &objects, &snapshot).await;
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("sandbox {id} changed while it was being suspended; it was not suspended"),
            ));
        }
        tracing::info!(sandbox = %id, %snapshot, memory_bytes = stored.memory_bytes, disk_blocks = stored.disk_changed_blocks, "sandbox suspended; its node frees it");
        // Committed: the node lets it go (the reconciler retries if this fails).
        if let Err(e) = node.delete(id).await {
            tracing::warn!(sandbox = %id, error = %e, "node did not free the suspended sandbox yet; the reconciler retries");
        }
        Ok(())
    })
    .await
    .map_err(ApiError::internal)?
}

/// Stores a checkpoint of live sandbox `row` in object storage; the committed snapshot
/// becomes its `stored_checkpoint`, what it is restored from if its node is lost
/// (`service::node_loss`), and the one it replaces is collected. The checkpoint is taken on
/// the node as any (the guest pauses for its final pass only) and uploaded from there while
/// the sandbox runs on; the node's copy goes once stored.
pub async fn checkpoint_row(st: &AppState, row: SandboxRow) -> ApiResult<()> {
    let objects = objects(st)?.clone();
    let node = st.node_of(&row).await?;
    super::customer_keys::lend_artifact_key(st, &row.tenant_id, node.as_ref()).await?;
    let request = SnapshotRequest {
        kind: SnapshotKind::Checkpoint,
        label: Some(STORED_CHECKPOINT_LABEL.into()),
        persistent: None,
    };
    let task_state = st.clone();
    // In its own task: a replica's caller going away does not strand the node's copy.
    tokio::spawn(async move {
        let st = &task_state;
        let id = &row.id;
        let taken = node.take_snapshot(id, request).await?.snapshot;
        let stored = async {
            let stored = upload_taken(st, &objects, &node, &row, &taken).await?;
            if !st.db.commit_stored_snapshot(&stored, Commit::Checkpoint).await? {
                // Deleted or suspended meanwhile: nothing to keep.
                give_up(st, &objects, &taken.id).await;
                return Err(ApiError::new(
                    ErrorCode::Conflict,
                    format!("sandbox {id} changed while its checkpoint was stored"),
                ));
            }
            Ok(stored)
        }
        .await;
        // Apart: the checkpoint is done once committed (a node lost right after must not
        // hold the sandbox's restore back while this call waits on it).
        let (cleanup_node, cleanup_id, snap) = (node.clone(), id.clone(), taken.id.clone());
        tokio::spawn(async move {
            if let Err(e) = cleanup_node.delete_snapshot(&cleanup_id, &snap).await {
                tracing::warn!(sandbox = %cleanup_id, snapshot = %snap, error = %e, "the node keeps its copy of a stored checkpoint");
            }
        });
        let stored = stored?;
        tracing::info!(sandbox = %id, snapshot = %taken.id, memory_bytes = stored.memory_bytes, disk_blocks = stored.disk_changed_blocks, "checkpoint stored");
        Ok(())
    })
    .await
    .map_err(ApiError::internal)?
}

/// Uploads snapshot `taken` of live sandbox `row`, already committed on `node`, to object
/// storage: its row first (`uploading`, this replica's), then the node's upload (the
/// sandbox runs on), then each artifact checked in the store. Committing it is the
/// caller's; on error it is given up (abandoned, its objects removed or left to the
/// collection).
pub(super) async fn upload_taken(
    st: &AppState,
    objects: &Objects,
    node: &Arc<dyn NodeApi>,
    row: &SandboxRow,
    taken: &SnapshotInfo,
) -> ApiResult<StoredSnapshot> {
    let (id, snapshot) = (&row.id, &taken.id);
    st.db
        .begin_stored_snapshot(snapshot, id, &row.tenant_id, node.name(), st.replica.id())
        .await?;
    let req = StoreSnapshot {
        id: id.clone(),
        snapshot: snapshot.clone(),
        owner: SnapshotOwner {
            tenant: row.tenant_id.clone(),
            labels: row.labels.clone(),
        },
    };
    let stored = match node.store_snapshot(req).await {
        Ok(stored) => stored,
        Err(e) => {
            give_up(st, objects, snapshot).await;
            return Err(ApiError::from(e));
        }
    };
    if let Err(e) = check_stored(objects, &stored, id, snapshot, taken.kind).await {
        tracing::warn!(sandbox = %id, %snapshot, error = %e.body.message, "stored snapshot does not check out");
        give_up(st, objects, snapshot).await;
        return Err(e);
    }
    Ok(stored)
}

/// Every artifact of `stored` (those a snapshot of `kind` has: a disk snapshot no memory)
/// is one of `snapshot`'s and is in the store at the size the node reported (its digest is
/// checked when it is read back).
async fn check_stored(
    objects: &Objects,
    stored: &StoredSnapshot,
    id: &SandboxId,
    snapshot: &SnapshotId,
    kind: SnapshotKind,
) -> ApiResult<()> {
    let corrupt = |what: String| ApiError::new(ErrorCode::SnapshotCorrupt, what);
    if stored.snapshot != *snapshot || stored.sandbox_id != *id {
        return Err(corrupt("the node reported another snapshot".into()));
    }
    let prefix = format!("snapshots/{snapshot}/");
    let expected: &[&str] = match kind {
        SnapshotKind::Checkpoint => &artifacts::ALL,
        SnapshotKind::Disk => &[artifacts::DISK, artifacts::SOURCE, artifacts::META],
    };
    for name in expected {
        let Some(a) = stored.artifacts.iter().find(|a| a.name == *name) else {
            return Err(corrupt(format!("the stored snapshot has no {name}")));
        };
        if !a.key.starts_with(&prefix) || a.sha256.len() != 64 {
            return Err(corrupt(format!("artifact {name} is not where it belongs")));
        }
        objects
            .check(&Artifact {
                key: a.key.clone(),
                size: a.size,
                sha256: a.sha256.clone(),
            })
            .await
            .map_err(|e| corrupt(e.to_string()))?;
    }
    if stored.artifacts.len() != expected.len() {
        return Err(corrupt(
            "the stored snapshot has unexpected artifacts".into(),
        ));
    }
    Ok(())
}

/// Marks the snapshot abandoned and removes whatever of it was uploaded (what this cannot
/// remove now, the collection does).
pub(super) async fn give_up(st: &AppState, objects: &Objects, snapshot: &SnapshotId) {
    if let Err(e) = st.db.abandon_stored_snapshot(snapshot).await {
        tracing::warn!(%snapshot, error = %e, "cannot mark the stored snapshot abandoned");
        return;
    }
    match remove_objects(objects, snapshot).await {
        Ok(()) => {
            let _ = st.db.delete_stored_snapshot(snapshot).await;
        }
        Err(e) => {
            tracing::warn!(%snapshot, error = %e, "stored snapshot's objects stay until collected")
        }
    }
}

async fn remove_objects(
    objects: &Objects,
    snapshot: &SnapshotId,
) -> Result<(), space_objects::ObjectsError> {
    let prefix = ObjectKey::snapshot_prefix(snapshot.as_str())?;
    objects.delete_prefix(&prefix).await.map(drop)
}

/// Resumes suspended sandbox `row` (the caller's, found by the caller) on a node the
/// scheduler picks (see the module docs); its deadline is renewed.
pub async fn resume(st: &AppState, row: SandboxRow) -> ApiResult<SandboxInfo> {
    super::customer_keys::require_usable(st, &row.tenant_id).await?;
    let id = row.id.clone();
    let snapshot = row.suspended_snapshot.clone().ok_or_else(|| {
        ApiError::new(
            ErrorCode::Conflict,
            format!("sandbox {id} is not suspended"),
        )
    })?;
    let stored = st
        .db
        .stored_snapshot(&snapshot)
        .await?
        .and_then(|s| s.manifest)
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::SnapshotCorrupt,
                format!("sandbox {id} is suspended in snapshot {snapshot}, which is not recorded"),
            )
        })?;
    if st.nodes.is_cluster() {
        st.nodes.refresh(&st.db.nodes().await?);
    }
    let node = st
        .nodes
        .place(stored.resources, &stored.template_digest, &[])
        .await?;
    if !st
        .db
        .begin_resume(&id, node.name(), st.replica.id())
        .await?
    {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("sandbox {id} is being resumed already, or is not suspended"),
        ));
    }
    tracing::info!(sandbox = %id, %snapshot, node = node.name(), "resuming suspended sandbox");
    let task_state = st.clone();
    let seal_at_rest =
        match super::customer_keys::lend_artifact_key(st, &row.tenant_id, node.as_ref()).await {
            Ok(sealed) => sealed,
            Err(e) => {
                st.db.undo_resume(&id).await?;
                return Err(e);
            }
        };
    let req = ResumeSandbox {
        suspended: stored,
        tenant: row.tenant_id.clone(),
        seal_at_rest,
    };
    let task_id = id.clone();
    tokio::spawn(async move {
        let st = &task_state;
        match node.resume_suspended(req).await {
            Ok(_) => {
                st.db.finish_resume(&task_id).await?;
                st.db.renew_timeout(&task_id, now_ms()).await?;
                Ok(())
            }
            Err(e) => {
                st.db.undo_resume(&task_id).await?;
                Err(ApiError::from(e))
            }
        }
    })
    .await
    .map_err(ApiError::internal)??;
    let row = st.find_sandbox(&row.tenant_id, &id).await?;
    info_now(st, &row).await
}

/// The view of a sandbox suspended in a stored snapshot (no node holds it): `suspended`,
/// `resuming` while a replica resumes it, `deleted` once deleted.
pub fn suspended_info(row: &SandboxRow) -> SandboxInfo {
    let mut info = super::sandboxes::sandbox_info(row, None, false);
    if row.desired_state == crate::db::DesiredState::Running {
        info.state = if row.creating_replica.is_some() {
            SandboxState::Resuming
        } else {
            SandboxState::Suspended
        };
        info.failure_reason = None;
    }
    info
}

/// The leader's collection of stored snapshots nothing needs (see the module docs);
/// returns how many went.
pub async fn collect(st: &AppState) -> ApiResult<usize> {
    let Some(objects) = st.objects.as_ref() else {
        return Ok(0);
    };
    let live = st.replica.live_set().await?;
    let mut collected = 0;
    for stored in st
        .db
        .stored_snapshots_to_collect(&live, COLLECT_BATCH)
        .await?
    {
        if let Err(e) = remove_objects(objects, &stored.id).await {
            tracing::warn!(snapshot = %stored.id, error = %e, "cannot collect a stored snapshot's objects; retrying later");
            continue;
        }
        st.db.delete_stored_snapshot(&stored.id).await?;
        tracing::info!(snapshot = %stored.id, sandbox = %stored.sandbox_id, state = stored.state.as_str(), "stored snapshot collected");
        collected += 1;
    }
    Ok(collected)
}

/// The snapshot ids a listing of `snapshots/` holds objects of, each with its newest
/// object's time, those untouched since `before_ms` only. Pure: what [`collect_orphans`]
/// checks against the database.
pub fn untouched_snapshot_prefixes(listing: &[(String, u64, i64)], before_ms: i64) -> Vec<String> {
    let mut newest: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
    for (key, _, modified_ms) in listing {
        let mut parts = key.split('/');
        let (Some("snapshots"), Some(id)) = (parts.next(), parts.next()) else {
            continue;
        };
        let t = newest.entry(id).or_insert(i64::MIN);
        *t = (*t).max(*modified_ms);
    }
    newest
        .into_iter()
        .filter(|(_, t)| *t < before_ms)
        .map(|(id, _)| id.to_owned())
        .collect()
}

/// The leader's hourly sweep of objects under `snapshots/` that no stored snapshot row
/// names (see the module docs); returns how many snapshots' objects went.
pub async fn collect_orphans(st: &AppState) -> ApiResult<usize> {
    let Some(objects) = st.objects.as_ref() else {
        return Ok(0);
    };
    let prefix = ObjectKey::parse("snapshots").map_err(ApiError::internal)?;
    let listing = objects.list(&prefix).await.map_err(ApiError::internal)?;
    let mut collected = 0;
    for id in untouched_snapshot_prefixes(&listing, now_ms() - ORPHAN_AGE_MS) {
        // A name that is no snapshot id is no upload of ours either: left alone.
        let Ok(snapshot) = id.parse::<SnapshotId>() else {
            continue;
        };
        if st.db.stored_snapshot(&snapshot).await?.is_some() {
            continue;
        }
        match remove_objects(objects, &snapshot).await {
            Ok(()) => {
                tracing::info!(%snapshot, "objects of a snapshot no row names collected");
                collected += 1;
            }
            Err(e) => {
                tracing::warn!(%snapshot, error = %e, "cannot collect orphan objects; retrying later")
            }
        }
    }
    Ok(collected)
}

#[cfg(test)]
mod tests {
    use super::untouched_snapshot_prefixes;

    #[test]
    fn only_snapshots_untouched_since_the_cutoff_are_candidates() {
        let listing = vec![
            ("snapshots/snp-old/memory.zst".to_owned(), 10, 100),
            ("snapshots/snp-old/meta.json".to_owned(), 1, 150),
            // One object written lately keeps the whole snapshot.
            ("snapshots/snp-busy/memory.zst".to_owned(), 10, 100),
            ("snapshots/snp-busy/disk.delta.zst".to_owned(), 10, 900),
            ("templates/sha/rootfs.ext4.zst".to_owned(), 10, 1),
            ("snapshots".to_owned(), 0, 1),
        ];
        assert_eq!(untouched_snapshot_prefixes(&listing, 500), vec!["snp-old"]);
        assert!(untouched_snapshot_prefixes(&listing, 100).is_empty());
    }
}
