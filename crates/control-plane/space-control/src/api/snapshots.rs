//! `/v1/sandboxes/{id}/snapshots…` and `/v1/snapshots…`: each handler parses its request,
//! calls [`crate::service::snapshots`] and renders the answer.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use space_core::sandbox::{CreateSnapshotRequest, SnapshotList, SnapshotTaken};
use space_core::snapshot::DEFAULT_DIFF_LIMIT;
use space_core::{ErrorBody, SnapshotDiff, SnapshotInfo};
use utoipa::IntoParams;

use super::error::ApiResult;
use super::extract::{
    parse_sandbox_id, parse_snapshot_id, ApiJson, ApiQuery, SandboxPath, SnapshotIdPath,
    SnapshotPath,
};
use super::AppState;
use crate::service::snapshots;
use crate::service::Caller;

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
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SnapshotList>> {
    let snapshots = snapshots::list(&st, &tenant, &id).await?;
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
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<CreateSnapshotRequest>,
) -> ApiResult<(StatusCode, Json<SnapshotTaken>)> {
    let taken = snapshots::take(&st, &tenant, &id, req).await?;
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
    tenant: Caller,
    SnapshotPath(id, snap): SnapshotPath,
) -> ApiResult<StatusCode> {
    snapshots::delete(&st, &tenant, &id, &snap).await?;
    Ok(StatusCode::NO_CONTENT)
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
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<DiffQuery>,
) -> ApiResult<Json<SnapshotDiff>> {
    let from = parse_snapshot_id(&q.from)?;
    let to = parse_snapshot_id(&q.to)?;
    let limit = q.limit.unwrap_or(DEFAULT_DIFF_LIMIT);
    Ok(Json(
        snapshots::diff(&st, &tenant, &id, &from, &to, limit).await?,
    ))
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
    tenant: Caller,
    ApiQuery(q): ApiQuery<TenantSnapshotsQuery>,
) -> ApiResult<Json<SnapshotList>> {
    let sandbox = q.sandbox.as_deref().map(parse_sandbox_id).transpose()?;
    let snapshots =
        snapshots::list_tenant(&st, &tenant, sandbox.as_ref(), q.label.as_deref()).await?;
    Ok(Json(SnapshotList { snapshots }))
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
    tenant: Caller,
    SnapshotIdPath(snap): SnapshotIdPath,
) -> ApiResult<Json<SnapshotInfo>> {
    Ok(Json(snapshots::get_tenant(&st, &tenant, &snap).await?))
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
    tenant: Caller,
    SnapshotIdPath(snap): SnapshotIdPath,
) -> ApiResult<StatusCode> {
    snapshots::delete_tenant(&st, &tenant, &snap).await?;
    Ok(StatusCode::NO_CONTENT)
}
