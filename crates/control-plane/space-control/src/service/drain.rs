//! Draining a node: every sandbox it holds moves to the other nodes, each suspended to
//! object storage and resumed where the scheduler puts it (the node is cordoned first, so
//! none comes back to it). A sandbox keeps its id, files, processes and settings, and comes
//! back as it was: running, or paused.
//!
//! Each sandbox is one unit: one that cannot move is reported and left where it is (or
//! suspended, if only its resume failed: any later resume brings it back), and the others
//! go on. Stopped sandboxes have no VM to suspend and stay: start or delete them, then
//! drain again. A few move at once ([`DRAIN_PARALLEL`]): each is a memory dump and an
//! upload, and the node being drained is usually already under pressure.

use futures::StreamExt;
use space_core::cluster::{DrainFailure, DrainReport, DrainedSandbox};
use space_core::{ErrorCode, SandboxState};
use std::sync::Arc;

use crate::api::error::{ApiError, ApiResult};
use crate::api::AppState;
use crate::db::SandboxRow;
use crate::nodes::{NodeApi, PauseCause};

/// Sandboxes moved at once.
pub const DRAIN_PARALLEL: usize = 4;

/// Cordons node `name` and moves every sandbox it holds (see the module docs).
pub async fn drain(st: &AppState, name: &str) -> ApiResult<DrainReport> {
    if st.objects.is_none() {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            "this control plane has no object store configured (`--object-store`): sandboxes cannot move between nodes",
        ));
    }
    if !st.db.set_node_cordoned(name, true).await? {
        return Err(ApiError::not_found(format!(
            "node {} not found",
            space_core::error::excerpt(name, 64)
        )));
    }
    st.nodes.refresh(&st.db.nodes().await?);
    let node = st.nodes.get(name)?;
    let rows: Vec<SandboxRow> = st
        .db
        .live_sandboxes()
        .await?
        .into_iter()
        .filter(|r| r.node == name && r.suspended_snapshot.is_none())
        .collect();
    tracing::info!(node = %name, sandboxes = rows.len(), "draining node");
    let outcomes: Vec<Result<DrainedSandbox, DrainFailure>> = futures::stream::iter(rows)
        .map(|row| move_one(st, node.clone(), row))
        .buffer_unordered(DRAIN_PARALLEL)
        .collect()
        .await;
    let mut report = DrainReport {
        node: name.to_owned(),
        moved: Vec::new(),
        failed: Vec::new(),
    };
    for outcome in outcomes {
        match outcome {
            Ok(moved) => report.moved.push(moved),
            Err(failed) => report.failed.push(failed),
        }
    }
    report.moved.sort_by(|a, b| a.id.cmp(&b.id));
    report.failed.sort_by(|a, b| a.id.cmp(&b.id));
    tracing::info!(node = %name, moved = report.moved.len(), failed = report.failed.len(), "node drained");
    Ok(report)
}

/// Moves one sandbox off `node`.
async fn move_one(
    st: &AppState,
    node: Arc<dyn NodeApi>,
    row: SandboxRow,
) -> Result<DrainedSandbox, DrainFailure> {
    let id = row.id.clone();
    let failed = |state: SandboxState, e: ApiError| DrainFailure {
        id: id.clone(),
        state,
        code: e.body.code,
        message: e.body.message,
    };
    let view = match node.sandbox(&id).await {
        Ok(Some(v)) => v,
        // Gone meanwhile (deleted): nothing to move.
        Ok(None) => {
            return Err(failed(
                SandboxState::Deleted,
                ApiError::not_found(format!("sandbox {id} is no longer on the node")),
            ))
        }
        Err(e) => return Err(failed(SandboxState::Failed, e.into())),
    };
    let paused_by = match view.state {
        SandboxState::Running => None,
        SandboxState::Paused => Some(view.paused_by.unwrap_or(PauseCause::User)),
        other => {
            return Err(failed(
                other,
                ApiError::new(
                    ErrorCode::Conflict,
                    format!("sandbox {id} is {other}: only running and paused sandboxes move (start it, or delete it, then drain again)"),
                ),
            ))
        }
    };
    if let Err(e) = super::suspend::suspend_row(st, row).await {
        return Err(failed(view.state, e));
    }
    let suspended = match st.db.sandbox_any_tenant(&id).await {
        Ok(Some(r)) => r,
        Ok(None) => {
            return Err(failed(
                SandboxState::Deleted,
                ApiError::not_found(format!("sandbox {id} was deleted while it moved")),
            ))
        }
        Err(e) => return Err(failed(SandboxState::Suspended, e.into())),
    };
    let info = match super::suspend::resume(st, suspended).await {
        Ok(info) => info,
        // Suspended, whole: any later resume brings it back.
        Err(e) => return Err(failed(SandboxState::Suspended, e)),
    };
    let mut state = info.state;
    if let Some(cause) = paused_by {
        // It comes back as it was.
        let paused = async { st.nodes.get(&info.node)?.pause(&id, cause).await };
        match paused.await {
            Ok(v) => state = v.state,
            Err(e) => {
                tracing::warn!(sandbox = %id, node = %info.node, error = %e, "a paused sandbox that moved runs: pausing it again failed")
            }
        }
    }
    tracing::info!(sandbox = %id, from = %node.name(), to = %info.node, "sandbox moved");
    Ok(DrainedSandbox {
        id,
        node: info.node,
        state,
    })
}
