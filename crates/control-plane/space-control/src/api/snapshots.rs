//! Snapshots of a sandbox: list, take one now (disk snapshot or full checkpoint), delete,
//! and the files changed between two of them.
//!
//! A sandbox's snapshots live under it on its node: another sandbox's (or tenant's)
//! snapshot id is simply not found. Rolling back to a snapshot and forking from one are
//! lifecycle operations ([`super::lifecycle`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use space_core::sandbox::{CreateSnapshotRequest, SnapshotList, SnapshotTaken};
use space_core::snapshot::{DEFAULT_DIFF_LIMIT, MAX_DIFF_LIMIT};
use space_core::{ErrorBody, SnapshotDiff, SnapshotKind, SnapshotTrigger};
use utoipa::IntoParams;

use super::auth::AuthTenant;
use super::error::{ApiError, ApiResult};
use super::extract::{parse_snapshot_id, ApiJson, ApiQuery, SandboxPath, SnapshotPath};
use super::AppState;

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
    st.live_sandbox(&tenant.id, &id).await?;
    let snapshots = st.node.snapshots(&id).await?;
    Ok(Json(SnapshotList { snapshots }))
}

/// Take a snapshot now. `disk`: the guest file systems are frozen for the instant of a
/// reflink, the VM keeps running (also allowed while stopped). `checkpoint`: memory, device
/// state and disk, saved live; the response says how long the guest was paused.
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
    st.live_sandbox(&tenant.id, &id).await?;
    let node = st.node.clone();
    // In its own task: a client that hangs up does not abandon a half-taken snapshot.
    let taken = tokio::spawn(async move {
        match req.kind {
            SnapshotKind::Disk => node
                .snapshot_disk(&id, req.label, SnapshotTrigger::Manual)
                .await
                .map(|snapshot| SnapshotTaken {
                    snapshot,
                    guest_pause_ms: None,
                }),
            SnapshotKind::Checkpoint => node
                .checkpoint(&id, req.label, SnapshotTrigger::Manual)
                .await
                .map(|t| SnapshotTaken {
                    snapshot: t.info,
                    guest_pause_ms: t
                        .guest_pause
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                }),
        }
    })
    .await
    .map_err(ApiError::internal)??;
    Ok((StatusCode::CREATED, Json(taken)))
}

/// Delete a snapshot (frees its exclusive bytes).
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
    st.live_sandbox(&tenant.id, &id).await?;
    let node = st.node.clone();
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
    st.live_sandbox(&tenant.id, &id).await?;
    Ok(Json(st.node.diff_snapshots(&id, &from, &to, limit).await?))
}
