//! Snapshots: a sandbox's (list, take one now — disk snapshot or full checkpoint,
//! persistent or not —, delete, the files changed between two), and the tenant's across
//! its sandboxes, deleted ones included for persistent snapshots.
//!
//! A sandbox's snapshots live under it on its node: another sandbox's (or tenant's)
//! snapshot id is simply not found. Who owns a snapshot is the node's to say, with the
//! files: the sandbox's owner (the database row) while the sandbox lives, the tenant its
//! persistent snapshot names once the sandbox is gone. A tenant-wide listing asks each node
//! once, all at once. Rolling back to a snapshot and forking from one are lifecycle
//! operations ([`super::lifecycle`]); creating a sandbox from one is a create
//! ([`super::sandboxes`]).
//!
//! A persistent snapshot of a sandbox whose `snapshot_storage` is `object_store` is also
//! uploaded to object storage before the call returns (the sandbox runs on meanwhile) and
//! committed in the database with what listings and creates need: from then on it is the
//! tenant's until deleted, listed and usable whatever becomes of the node that took it.
//! Deleting it drops the row (its objects are collected) and every node's copy.

use std::sync::Arc;

use space_core::sandbox::{CreateSnapshotRequest, SnapshotStorage, SnapshotTaken};
use space_core::snapshot::MAX_DIFF_LIMIT;
use space_core::{
    ErrorCode, SandboxId, SnapshotDiff, SnapshotId, SnapshotInfo, SnapshotKind, TenantId,
};

use super::Caller;
use crate::api::error::{ApiError, ApiResult};
use crate::api::AppState;
use crate::db::{DesiredState, SandboxFilter, SandboxRow};
use crate::nodes::{
    NodeApi, NodeCallError, SnapshotOrigin, SnapshotOwner, SnapshotRequest, StoredSnapshot,
};

/// A sandbox's snapshots, oldest first.
pub async fn list(st: &AppState, caller: &Caller, id: &SandboxId) -> ApiResult<Vec<SnapshotInfo>> {
    let row = st.live_sandbox(&caller.id, id).await?;
    Ok(st.node_of(&row).await?.snapshots(id).await?)
}

/// Takes a snapshot of a sandbox now, within the tenant's snapshot quota.
pub async fn take(
    st: &AppState,
    caller: &Caller,
    id: &SandboxId,
    req: CreateSnapshotRequest,
) -> ApiResult<SnapshotTaken> {
    if let Some(label) = &req.label {
        space_core::snapshot::validate_snapshot_label(label)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    let row = st.live_sandbox(&caller.id, id).await?;
    let reservation = st
        .admit_snapshot(
            &caller.id,
            row.spec.resources,
            req.kind == SnapshotKind::Checkpoint,
        )
        .await?;
    let owner = req.persistent.then(|| SnapshotOwner {
        tenant: row.tenant_id.clone(),
        labels: row.labels.clone(),
    });
    let node = st.node_of(&row).await?;
    // A checkpoint of a sandbox sealed at rest is sealed under its tenant's key.
    super::customer_keys::lend_artifact_key(st, &row.tenant_id, node.as_ref()).await?;
    let request = SnapshotRequest {
        kind: req.kind,
        label: req.label,
        persistent: owner,
    };
    let stored = req.persistent && row.spec.snapshot_storage == SnapshotStorage::ObjectStore;
    let task_state = st.clone();
    // In its own task: a client that hangs up does not abandon a half-taken snapshot.
    tokio::spawn(async move {
        // Held until the snapshot is taken (and listed) or failed.
        let _reservation = reservation;
        let taken = node.take_snapshot(&row.id, request).await?;
        if !stored {
            return Ok(taken);
        }
        store_persistent(&task_state, &node, &row, taken).await
    })
    .await
    .map_err(ApiError::internal)?
}

/// Uploads persistent snapshot `taken` of `row` and commits it (see the module docs). If
/// it cannot be stored, the node's copy is deleted too and the call fails: a snapshot asked
/// to be in object storage is there, or is not at all.
async fn store_persistent(
    st: &AppState,
    node: &Arc<dyn NodeApi>,
    row: &SandboxRow,
    mut taken: SnapshotTaken,
) -> ApiResult<SnapshotTaken> {
    let snap = taken.snapshot.id.clone();
    let stored = async {
        let objects = st.objects.as_ref().ok_or_else(|| {
            ApiError::new(
                ErrorCode::Conflict,
                "this control plane has no object store configured (`--object-store`)",
            )
        })?;
        let (_, origin) = node
            .snapshot_origin(&row.id, &snap)
            .await?
            .ok_or_else(|| ApiError::snapshot_not_found(&snap))?;
        let manifest =
            super::suspend::upload_taken(st, objects, node, row, &taken.snapshot).await?;
        let mut info = taken.snapshot.clone();
        info.stored = true;
        if !st
            .db
            .commit_stored_persistent(&manifest, &info, &origin)
            .await?
        {
            super::suspend::give_up(st, objects, &snap).await;
            return Err(ApiError::new(
                ErrorCode::Conflict,
                format!("snapshot {snap} was given up while it was stored"),
            ));
        }
        Ok(())
    }
    .await;
    match stored {
        Ok(()) => {
            tracing::info!(sandbox = %row.id, snapshot = %snap, "persistent snapshot stored in object storage");
            taken.snapshot.stored = true;
            Ok(taken)
        }
        Err(e) => {
            if let Err(again) = node.delete_snapshot(&row.id, &snap).await {
                tracing::warn!(sandbox = %row.id, snapshot = %snap, error = %again, "cannot delete a snapshot that could not be stored");
            }
            Err(e)
        }
    }
}

/// Deletes one of a sandbox's snapshots.
pub async fn delete(
    st: &AppState,
    caller: &Caller,
    id: &SandboxId,
    snap: &SnapshotId,
) -> ApiResult<()> {
    let row = st.live_sandbox(&caller.id, id).await?;
    let node = st.node_of(&row).await?;
    let (id, snap) = (id.clone(), snap.clone());
    let task_state = st.clone();
    let tenant = caller.id.clone();
    tokio::spawn(async move {
        node.delete_snapshot(&id, &snap).await?;
        drop_stored_copies(&task_state, &tenant, &snap, Some(node.name())).await
    })
    .await
    .map_err(ApiError::internal)??;
    Ok(())
}

/// Deletes `tenant`'s snapshot `snap` from object storage (if it is there) and every node's
/// copy of it but `except`'s (a node that does not answer keeps its copy, which no longer
/// lists once the row is gone… unless it is the last one, so its failure is logged).
async fn drop_stored_copies(
    st: &AppState,
    tenant: &TenantId,
    snap: &SnapshotId,
    except: Option<&str>,
) -> ApiResult<()> {
    if !st.db.drop_stored_persistent(tenant, snap).await? {
        return Ok(());
    }
    tracing::info!(%snap, "persistent snapshot dropped from object storage");
    let others = st
        .nodes
        .all()
        .into_iter()
        .filter(|n| Some(n.name()) != except);
    for node in others {
        match node.delete_persistent_snapshot(snap).await {
            Ok(()) | Err(NodeCallError::SnapshotNotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(node = node.name(), %snap, error = %e, "a node keeps its copy of a deleted snapshot")
            }
        }
    }
    Ok(())
}

/// The files changed between two of a sandbox's snapshots, at most `limit` entries,
/// within the tenant's concurrent-diff quota.
pub async fn diff(
    st: &AppState,
    caller: &Caller,
    id: &SandboxId,
    from: &SnapshotId,
    to: &SnapshotId,
    limit: usize,
) -> ApiResult<SnapshotDiff> {
    if !(1..=MAX_DIFF_LIMIT).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit must be between 1 and {MAX_DIFF_LIMIT}, got {limit}"
        )));
    }
    let row = st.live_sandbox(&caller.id, id).await?;
    let _permit = st.diff_permit(&caller.id).await?;
    let node = st.node_of(&row).await?;
    Ok(node.diff_snapshots(id, from, to, limit).await?)
}

/// The caller's snapshots, newest first (of one sandbox, with one label, if given).
pub async fn list_tenant(
    st: &AppState,
    caller: &Caller,
    sandbox: Option<&SandboxId>,
    label: Option<&str>,
) -> ApiResult<Vec<SnapshotInfo>> {
    let wanted = |info: &SnapshotInfo| {
        sandbox.is_none_or(|s| &info.sandbox_id == s)
            && label.is_none_or(|l| info.label.as_deref() == Some(l))
    };
    let mut snapshots: Vec<SnapshotInfo> = tenant_snapshots(st, &caller.id)
        .await?
        .into_iter()
        .filter(|i| wanted(i))
        .collect();
    snapshots.sort_by(|a, b| {
        b.created_at_ms
            .cmp(&a.created_at_ms)
            .then_with(|| b.id.cmp(&a.id))
    });
    Ok(snapshots)
}

/// One of the caller's snapshots by id.
pub async fn get_tenant(
    st: &AppState,
    caller: &Caller,
    snap: &SnapshotId,
) -> ApiResult<SnapshotInfo> {
    Ok(find_snapshot(st, &caller.id, snap).await?.info)
}

/// Deletes one of the caller's snapshots by id (of a live sandbox, or persistent).
pub async fn delete_tenant(st: &AppState, caller: &Caller, snap: &SnapshotId) -> ApiResult<()> {
    let found = find_snapshot(st, &caller.id, snap).await?;
    let snap = snap.clone();
    let task_state = st.clone();
    let tenant = caller.id.clone();
    tokio::spawn(async move {
        let node = found.node.as_ref();
        if let Some(node) = node {
            match &found.sandbox {
                Some(row) => node.delete_snapshot(&row.id, &snap).await?,
                None => node.delete_persistent_snapshot(&snap).await?,
            }
        }
        drop_stored_copies(&task_state, &tenant, &snap, node.map(|n| n.name())).await
    })
    .await
    .map_err(ApiError::internal)??;
    Ok(())
}

/// A snapshot of a tenant's, and where it is.
#[derive(Clone)]
pub struct FoundSnapshot {
    /// The snapshot.
    pub info: SnapshotInfo,
    /// The sandbox it was taken of, as a sandbox made from it inherits it.
    pub origin: SnapshotOrigin,
    /// The live sandbox it is one of, on `node`; `None`: a persistent snapshot whose
    /// sandbox was deleted or moved on, or one only in object storage.
    pub sandbox: Option<SandboxRow>,
    /// A node that holds its files and answered; `None`: none did, it is in object storage.
    pub node: Option<Arc<dyn NodeApi>>,
    /// What is in object storage, for a persistent snapshot kept there.
    pub stored: Option<StoredSnapshot>,
}

/// The tenant's snapshot `snap`, of a live sandbox of its or persistent and its; `404`
/// otherwise (another tenant's is indistinguishable from none).
pub async fn find_snapshot(
    st: &AppState,
    tenant: &TenantId,
    snap: &SnapshotId,
) -> ApiResult<FoundSnapshot> {
    let stored = st.db.stored_persistent(tenant, snap).await?;
    let on_node = tenant_snapshots_by_node(st, tenant)
        .await?
        .into_iter()
        .find(|(_, info)| info.id == *snap);
    if let Some((node, info)) = on_node {
        let row = st
            .db
            .sandbox(tenant, &info.sandbox_id)
            .await?
            .filter(|r| r.desired_state == DesiredState::Running && r.node == node.name());
        let found = match &row {
            Some(row) => match node.snapshot_origin(&row.id, snap).await {
                Ok(found) => found,
                // Deleted meanwhile: then it is not this one's.
                Err(NodeCallError::SandboxNotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            },
            None => node
                .persistent_snapshot(snap)
                .await?
                .filter(|(_, origin)| origin.tenant.as_ref() == Some(tenant)),
        };
        if let Some((mut info, origin)) = found {
            info.stored = stored.is_some();
            return Ok(FoundSnapshot {
                info,
                origin,
                sandbox: row,
                node: Some(node),
                stored: stored.map(|s| s.manifest),
            });
        }
    }
    let stored = stored.ok_or_else(|| ApiError::snapshot_not_found(snap))?;
    Ok(FoundSnapshot {
        info: stored.info,
        origin: stored.origin,
        sandbox: None,
        node: None,
        stored: Some(stored.manifest),
    })
}

/// Every snapshot of `tenant`'s: of its live sandboxes, its persistent ones whose sandbox
/// was deleted or moved on, and those in object storage. One call per node, all at once; what a node answers is kept
/// only where the database agrees it is the tenant's (a snapshot of a sandbox the tenant
/// has on that node, or a persistent one the node says is the tenant's). A node that is
/// lost or does not answer is left out of the listing (logged), not an error.
pub async fn tenant_snapshots(st: &AppState, tenant: &TenantId) -> ApiResult<Vec<SnapshotInfo>> {
    let mut snapshots: Vec<SnapshotInfo> = tenant_snapshots_by_node(st, tenant)
        .await?
        .into_iter()
        .map(|(_, info)| info)
        .collect();
    for stored in st.db.stored_persistents(tenant).await? {
        match snapshots.iter_mut().find(|s| s.id == stored.info.id) {
            Some(on_node) => on_node.stored = true,
            None => snapshots.push(stored.info),
        }
    }
    Ok(snapshots)
}

/// [`tenant_snapshots`], each with the node that holds it.
pub async fn tenant_snapshots_by_node(
    st: &AppState,
    tenant: &TenantId,
) -> ApiResult<Vec<(Arc<dyn NodeApi>, SnapshotInfo)>> {
    let rows = st.db.sandboxes(tenant, SandboxFilter::All).await?;
    let nodes = st.nodes.all();
    let answers = futures::future::join_all(
        nodes
            .iter()
            .map(|node| async move { (node, node.tenant_snapshots(tenant).await) }),
    )
    .await;
    let mut snapshots: Vec<(Arc<dyn NodeApi>, SnapshotInfo)> = Vec::new();
    for (node, answer) in answers {
        let list = match answer {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(node = node.name(), error = %e, "node left out of a snapshot listing");
                continue;
            }
        };
        for info in list {
            let row = rows.iter().find(|r| r.id == info.sandbox_id);
            let theirs = match row {
                // A live sandbox's snapshot: on the node that holds it; a persistent one also
                // where it stayed when the sandbox moved on (suspended, resumed elsewhere).
                Some(r) if r.desired_state == DesiredState::Running => {
                    r.node == node.name() || info.persistent
                }
                // A deleted sandbox's persistent snapshot, wherever it stayed.
                Some(_) => info.persistent,
                // No row (long gone): the node's word that the persistent snapshot is
                // the tenant's.
                None => info.persistent,
            };
            if theirs && !snapshots.iter().any(|(_, s)| s.id == info.id) {
                snapshots.push((node.clone(), info));
            }
        }
    }
    Ok(snapshots)
}
