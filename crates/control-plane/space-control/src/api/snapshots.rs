//! Snapshots of a sandbox: list, take one now (disk snapshot or full checkpoint, persistent
//! or not), delete, and the files changed between two of them; and the tenant's snapshots
//! across its sandboxes, deleted ones included for persistent snapshots
//! (`/v1/snapshots`).
//!
//! A sandbox's snapshots live under it on its node: another sandbox's (or tenant's)
//! snapshot id is simply not found. Who owns a snapshot is the node's to say, with the
//! files: the sandbox's owner (the database row) while the sandbox lives, the tenant its
//! persistent snapshot names once the sandbox is gone. Rolling back to a snapshot and
//! forking from one are lifecycle operations ([`super::lifecycle`]); creating a sandbox
//! from one is a create ([`super::sandboxes`]).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use space_core::sandbox::{CreateSnapshotRequest, SnapshotList, SnapshotTaken};
use space_core::snapshot::{DEFAULT_DIFF_LIMIT, MAX_DIFF_LIMIT};
use space_core::{ErrorBody, SnapshotDiff, SnapshotId, SnapshotInfo, SnapshotKind, TenantId};
use utoipa::IntoParams;

use super::auth::AuthTenant;
use super::error::{ApiError, ApiResult};
use super::extract::{
    parse_sandbox_id, parse_snapshot_id, ApiJson, ApiQuery, SandboxPath, SnapshotIdPath,
    SnapshotPath,
};
use super::AppState;
use crate::db::{SandboxFilter, SandboxRow};
use crate::nodes::{NodeApi, NodeCallError, SnapshotOrigin, SnapshotOwner, SnapshotRequest};

/// The sandbox's snapshots, oldest first, with their current sizes.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/snapshots",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Snapshots (kind, trigger, time, exclusive and total bytes)", body = SnapshotList),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_snapshots(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SnapshotList>> {
    let row = st.live_sandbox(&tenant.id, &id).await?;
    let snapshots = st.node_of(&row).await?.snapshots(&id).await?;
    Ok(Json(SnapshotList { snapshots }))
}

/// Take a snapshot now. `disk`: the guest file systems are frozen for the instant of a
/// reflink, the VM keeps running (also allowed while stopped). `checkpoint`: memory, device
/// state and disk, saved live; the response says how long the guest was paused. With
/// `persistent`, it is kept until deleted, also after the sandbox is.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/snapshots",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateSnapshotRequest,
    responses(
        (status = 201, description = "Taken; a SnapshotInfo plus `guest_pause_ms` for checkpoints", body = SnapshotTaken),
        (status = 400, description = "Invalid request (bad kind or label)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not possible in the sandbox's state (e.g. paused), or the guest would not freeze its file systems", body = ErrorBody),
        (status = 507, description = "The node's store is full", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_snapshot(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<CreateSnapshotRequest>,
) -> ApiResult<(StatusCode, Json<SnapshotTaken>)> {
    if let Some(label) = &req.label {
        space_core::snapshot::validate_snapshot_label(label)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    let row = st.live_sandbox(&tenant.id, &id).await?;
    let reservation = st
        .admit_snapshot(
            &tenant.id,
            row.spec.resources,
            req.kind == SnapshotKind::Checkpoint,
        )
        .await?;
    let owner = req.persistent.then(|| SnapshotOwner {
        tenant: row.tenant_id.clone(),
        labels: row.labels.clone(),
    });
    let node = st.node_of(&row).await?;
    let request = SnapshotRequest {
        kind: req.kind,
        label: req.label,
        persistent: owner,
    };
    // In its own task: a client that hangs up does not abandon a half-taken snapshot.
    let taken = tokio::spawn(async move {
        // Held until the snapshot is taken (and listed) or failed.
        let _reservation = reservation;
        node.take_snapshot(&id, request).await
    })
    .await
    .map_err(ApiError::internal)??;
    Ok((StatusCode::CREATED, Json(taken)))
}

/// Delete a snapshot (frees its exclusive bytes), persistent or not.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/snapshots/{snapshot_id}",
    tag = "snapshots",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("snapshot_id" = String, Path, description = "Snapshot id"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or snapshot", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_snapshot(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SnapshotPath(id, snap): SnapshotPath,
) -> ApiResult<StatusCode> {
    let row = st.live_sandbox(&tenant.id, &id).await?;
    let node = st.node_of(&row).await?;
    tokio::spawn(async move { node.delete_snapshot(&id, &snap).await })
        .await
        .map_err(ApiError::internal)??;
    Ok(StatusCode::NO_CONTENT)
}

/// Query of the diff endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    /// The older snapshot.
    pub from: String,
    /// The newer snapshot.
    pub to: String,
    /// Most changes to return (default 1000, at most 100000); longer diffs are `truncated`.
    pub limit: Option<usize>,
}

/// Files added, removed or modified between two snapshots of the sandbox (read from the
/// disk images; nothing is mounted). Disk snapshots are taken with the guest's file
/// systems frozen; a checkpoint flushes them just before it starts, so only writes made
/// during the checkpoint itself (kept in its memory) can be missing from its disk.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/snapshots/diff",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id"), DiffQuery),
    responses(
        (status = 200, description = "Changed paths", body = SnapshotDiff),
        (status = 400, description = "Malformed id or bad limit", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or snapshot", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn diff_snapshots(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<DiffQuery>,
) -> ApiResult<Json<SnapshotDiff>> {
    let from = parse_snapshot_id(&q.from)?;
    let to = parse_snapshot_id(&q.to)?;
    let limit = q.limit.unwrap_or(DEFAULT_DIFF_LIMIT);
    if !(1..=MAX_DIFF_LIMIT).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit must be between 1 and {MAX_DIFF_LIMIT}, got {limit}"
        )));
    }
    let row = st.live_sandbox(&tenant.id, &id).await?;
    let _permit = st.diff_permit(&tenant.id).await?;
    let node = st.node_of(&row).await?;
    Ok(Json(node.diff_snapshots(&id, &from, &to, limit).await?))
}

/// A snapshot of a tenant's, and where it is.
#[derive(Clone)]
pub struct FoundSnapshot {
    /// The snapshot.
    pub info: SnapshotInfo,
    /// The sandbox it was taken of, as a sandbox made from it inherits it.
    pub origin: SnapshotOrigin,
    /// The live sandbox it is one of; `None`: a persistent snapshot whose sandbox was
    /// deleted.
    pub sandbox: Option<SandboxRow>,
    /// The node that holds its files.
    pub node: Arc<dyn NodeApi>,
}

/// The tenant's snapshot `snap`, of a live sandbox of its or persistent and its; `404`
/// otherwise (another tenant's is indistinguishable from none).
pub async fn find_snapshot(
    st: &AppState,
    tenant: &TenantId,
    snap: &SnapshotId,
) -> ApiResult<FoundSnapshot> {
    for node in st.nodes.all() {
        if let Some((info, origin)) = node.persistent_snapshot(snap).await? {
            if origin.tenant.as_ref() == Some(tenant) {
                return Ok(FoundSnapshot {
                    info,
                    origin,
                    sandbox: None,
                    node: node.clone(),
                });
            }
            return Err(ApiError::snapshot_not_found(snap));
        }
    }
    for row in st.db.sandboxes(tenant, SandboxFilter::Live).await? {
        let node = st.node_of(&row).await?;
        match node.snapshot_origin(&row.id, snap).await {
            Ok(Some((info, origin))) => {
                return Ok(FoundSnapshot {
                    info,
                    origin,
                    sandbox: Some(row),
                    node,
                })
            }
            Ok(None) => {}
            // Deleted meanwhile: then it is not this one's.
            Err(NodeCallError::SandboxNotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(ApiError::snapshot_not_found(snap))
}

/// Query of `GET /v1/snapshots`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct TenantSnapshotsQuery {
    /// Only snapshots of this sandbox (live or deleted).
    pub sandbox: Option<String>,
    /// Only snapshots with this label.
    pub label: Option<String>,
}

/// The caller's snapshots, newest first: those of its live sandboxes, and the persistent
/// ones of its deleted sandboxes, with their current sizes.
#[utoipa::path(
    get,
    path = "/v1/snapshots",
    tag = "snapshots",
    params(TenantSnapshotsQuery),
    responses(
        (status = 200, description = "Snapshots, newest first", body = SnapshotList),
        (status = 400, description = "Malformed sandbox id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_tenant_snapshots(
    State(st): State<AppState>,
    tenant: AuthTenant,
    ApiQuery(q): ApiQuery<TenantSnapshotsQuery>,
) -> ApiResult<Json<SnapshotList>> {
    let sandbox = q.sandbox.as_deref().map(parse_sandbox_id).transpose()?;
    let wanted = |info: &SnapshotInfo| {
        sandbox.as_ref().is_none_or(|s| &info.sandbox_id == s)
            && q.label
                .as_ref()
                .is_none_or(|l| info.label.as_ref() == Some(l))
    };
    let mut snapshots: Vec<SnapshotInfo> = st
        .tenant_snapshots(&tenant.id)
        .await?
        .into_iter()
        .filter(|i| wanted(i))
        .collect();
    snapshots.sort_by(|a, b| {
        b.created_at_ms
            .cmp(&a.created_at_ms)
            .then_with(|| b.id.cmp(&a.id))
    });
    Ok(Json(SnapshotList { snapshots }))
}

impl AppState {
    /// Every snapshot of `tenant`'s: of its live sandboxes, and its persistent ones whose
    /// sandbox was deleted.
    pub async fn tenant_snapshots(&self, tenant: &TenantId) -> ApiResult<Vec<SnapshotInfo>> {
        let mut snapshots: Vec<SnapshotInfo> = Vec::new();
        for row in self.db.sandboxes(tenant, SandboxFilter::Live).await? {
            match self.node_of(&row).await?.snapshots(&row.id).await {
                Ok(list) => snapshots.extend(list),
                // Deleted meanwhile (its persistent snapshots are listed below).
                Err(NodeCallError::SandboxNotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        for node in self.nodes.all() {
            for (info, origin) in node.persistent_snapshots().await? {
                if origin.tenant.as_ref() == Some(tenant)
                    && !snapshots.iter().any(|s| s.id == info.id)
                {
                    snapshots.push(info);
                }
            }
        }
        Ok(snapshots)
    }
}

/// One of the caller's snapshots (of a live sandbox, or persistent of a deleted one).
#[utoipa::path(
    get,
    path = "/v1/snapshots/{snapshot_id}",
    tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 200, description = "The snapshot", body = SnapshotInfo),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such snapshot of the caller's", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_tenant_snapshot(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SnapshotIdPath(snap): SnapshotIdPath,
) -> ApiResult<Json<SnapshotInfo>> {
    Ok(Json(find_snapshot(&st, &tenant.id, &snap).await?.info))
}

/// Delete one of the caller's snapshots, wherever it is (of a live sandbox, or persistent of
/// a deleted one).
#[utoipa::path(
    delete,
    path = "/v1/snapshots/{snapshot_id}",
    tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such snapshot of the caller's", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_tenant_snapshot(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SnapshotIdPath(snap): SnapshotIdPath,
) -> ApiResult<StatusCode> {
    let found = find_snapshot(&st, &tenant.id, &snap).await?;
    let node = found.node.clone();
    tokio::spawn(async move {
        match found.sandbox {
            Some(row) => node.delete_snapshot(&row.id, &snap).await,
            None => node.delete_persistent_snapshot(&snap).await,
        }
    })
    .await
    .map_err(ApiError::internal)??;
    Ok(StatusCode::NO_CONTENT)
}
