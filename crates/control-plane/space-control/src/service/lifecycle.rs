//! Lifecycle operations on an existing sandbox: pause and resume (memory stays resident),
//! stop and start (cold; the disk is kept), rollback to a snapshot, fork into new
//! sandboxes, and the event log of its transitions.
//!
//! The node owns these states and persists them (see `space_node`); the database's desired
//! state stays `running` throughout (see [`crate::db::DesiredState`]). An operation the
//! sandbox's state does not allow is `409 conflict` with the node's message, e.g. "cannot
//! pause a sandbox that is paused". Node calls run in their own task, so a client that hangs
//! up cannot cancel an operation half-way.

use std::sync::Arc;
use std::time::Instant;

use space_core::sandbox::{validate_labels, ForkRequest, SandboxInfo, MAX_FORK_COUNT};
use space_core::{LifecycleEntry, SandboxId, SandboxState, SnapshotId, TenantId};

use super::sandboxes::{
    begin_create, discard, finish_create, new_row, sandbox_info, validate_timeout, NewRow,
};
use super::Caller;
use crate::api::error::{ApiError, ApiResult};
use crate::api::AppState;
use crate::db::{now_ms, SandboxRow, SandboxSpec};
use crate::nodes::{NodeApi, NodeCallError, NodeResult, PauseCause, SandboxView, StopCause};

/// What an operation does to the sandbox's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deadline {
    /// Left as it is.
    Keep,
    /// The sandbox runs again (resume, start): now + its timeout, also after its timeout
    /// had paused or stopped it.
    Renew,
}

/// Runs one node operation on a tenant's live sandbox in its own task and returns the
/// sandbox as it is afterwards.
async fn operate<F, Fut>(
    st: &AppState,
    tenant: &Caller,
    id: &SandboxId,
    deadline: Deadline,
    key_needed: bool,
    op: F,
) -> ApiResult<SandboxInfo>
where
    F: FnOnce(Arc<dyn NodeApi>, SandboxId) -> Fut,
    Fut: std::future::Future<Output = NodeResult<SandboxView>> + Send + 'static,
{
    let id = id.clone();
    let mut row = st.live_sandbox(&tenant.id, &id).await?;
    let task_state = st.clone();
    let node = st.node_of(&row).await?;
    if matches!(deadline, Deadline::Renew) || key_needed {
        // What runs again may checkpoint, and a rollback restores one: the node holds the
        // tenant's artifact key first.
        super::customer_keys::lend_artifact_key(st, &tenant.id, node.as_ref()).await?;
    }
    let work = op(node, id.clone());
    // The renewal is part of the task: a client that hangs up cannot leave a sandbox that
    // runs again without its new deadline.
    let record = tokio::spawn(async move {
        let record = work.await?;
        if deadline == Deadline::Renew {
            task_state.db.renew_timeout(&id, now_ms()).await?;
        }
        Ok::<_, ApiError>(record)
    })
    .await
    .map_err(ApiError::internal)??;
    if deadline == Deadline::Renew {
        row = st.find_sandbox(&tenant.id, &row.id).await?;
    }
    Ok(sandbox_info(&row, Some(&record), false))
}

/// Pauses a running sandbox: its vCPUs stop, its memory stays resident.
pub async fn pause(st: &AppState, caller: &Caller, id: &SandboxId) -> ApiResult<SandboxInfo> {
    operate(
        st,
        caller,
        id,
        Deadline::Keep,
        false,
        |node, id| async move { node.pause(&id, PauseCause::User).await },
    )
    .await
}

/// Resumes a paused sandbox (whoever paused it), once its daemon answers again; its
/// deadline becomes now + its timeout.
pub async fn resume(st: &AppState, caller: &Caller, id: &SandboxId) -> ApiResult<SandboxInfo> {
    let row = st.live_sandbox(&caller.id, id).await?;
    super::customer_keys::require_usable(st, &caller.id).await?;
    if row.suspended_snapshot.is_some() {
        // Suspended to object storage: restored on whichever node the scheduler picks.
        return super::suspend::resume(st, row).await;
    }
    operate(
        st,
        caller,
        id,
        Deadline::Renew,
        false,
        |node, id| async move { node.resume(&id).await },
    )
    .await
}

/// Stops a running or paused sandbox: the VM goes, the disk stays.
pub async fn stop(st: &AppState, caller: &Caller, id: &SandboxId) -> ApiResult<SandboxInfo> {
    operate(
        st,
        caller,
        id,
        Deadline::Keep,
        false,
        |node, id| async move { node.stop(&id, StopCause::User).await },
    )
    .await
}

/// Starts a stopped sandbox (a cold boot on its kept disk), once its daemon is ready; its
/// deadline becomes now + its timeout.
pub async fn start(st: &AppState, caller: &Caller, id: &SandboxId) -> ApiResult<SandboxInfo> {
    super::customer_keys::require_usable(st, &caller.id).await?;
    operate(
        st,
        caller,
        id,
        Deadline::Renew,
        false,
        |node, id| async move { node.start(&id).await },
    )
    .await
}

/// Rolls a sandbox back to one of its snapshots.
pub async fn rollback(
    st: &AppState,
    caller: &Caller,
    id: &SandboxId,
    to: &SnapshotId,
) -> ApiResult<SandboxInfo> {
    super::customer_keys::require_usable(st, &caller.id).await?;
    let to = to.clone();
    operate(
        st,
        caller,
        id,
        Deadline::Keep,
        true,
        |node, id| async move { node.rollback(&id, &to).await },
    )
    .await
}

/// Forks a sandbox into `req.count` new ones, all or none (see `POST …/fork`).
pub async fn fork(
    st: &AppState,
    tenant: &Caller,
    parent: &SandboxId,
    req: ForkRequest,
) -> ApiResult<Vec<SandboxInfo>> {
    let parent = parent.clone();
    let started = Instant::now();
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORK_COUNT).contains(&count) {
        return Err(ApiError::invalid(format!(
            "count must be between 1 and {MAX_FORK_COUNT}, got {count}"
        )));
    }
    super::customer_keys::require_usable(st, &tenant.id).await?;
    if let Some(t) = req.timeout_secs {
        validate_timeout(t)?;
    }
    validate_labels(&req.labels).map_err(ApiError::invalid)?;
    let parent_row = st.live_sandbox(&tenant.id, &parent).await?;
    // Children are made from the parent's memory and disk: on the parent's node.
    let node = st.node_of(&parent_row).await?;
    let parent_rec = node
        .sandbox(&parent)
        .await?
        .filter(|r| r.state != SandboxState::Deleted)
        .ok_or_else(|| ApiError::sandbox_not_found(&parent))?;
    let mut labels = parent_row.labels.clone();
    labels.extend(req.labels);
    validate_labels(&labels).map_err(|e| ApiError::invalid(format!("merged labels: {e}")))?;

    // The children inherit the parent's sealing; the fork reads its checkpoint. Lent before
    // any child's row exists: a key found unavailable here (revoked since its last check)
    // must not leave children nobody made.
    super::customer_keys::lend_artifact_key(st, &tenant.id, node.as_ref()).await?;
    // All children or none: the quota is checked for all of them first (and again, under
    // the admission lock, for each as its row goes in).
    st.admit_sandboxes(&tenant.id, parent_rec.resources, u64::from(count))
        .await?;
    let mut rows: Vec<SandboxRow> = Vec::new();
    for _ in 0..count {
        let row = new_row(
            SandboxId::generate(),
            &tenant.id,
            node.name(),
            NewRow {
                template: parent_row.template.clone(),
                template_digest: parent_rec.template_digest.clone(),
                spec: SandboxSpec {
                    resources: parent_rec.resources,
                    env_keys: parent_row.spec.env_keys.clone(),
                    forked_from: Some(parent.clone()),
                    from_snapshot: None,
                    public_ports: parent_row.spec.public_ports.clone(),
                    // A child is as restorable as its parent.
                    on_node_loss: parent_row.spec.on_node_loss,
                    checkpoint_interval_secs: parent_row.spec.checkpoint_interval_secs,
                    snapshot_storage: parent_row.spec.snapshot_storage,
                },
                labels: labels.clone(),
                timeout_secs: req.timeout_secs,
                on_timeout: parent_row.on_timeout,
                auto_resume: parent_row.auto_resume,
            },
        );
        match begin_create(st, &row).await {
            Ok(()) => {}
            Err(e) => {
                for r in &rows {
                    discard(st, r).await?;
                }
                return Err(e);
            }
        }
        rows.push(row);
    }
    tracing::info!(sandbox = %parent, tenant = %tenant.name, children = count, "forking sandbox");

    let task_state = st.clone();
    let task = tokio::spawn(async move {
        let ids: Vec<SandboxId> = rows.iter().map(|r| r.id.clone()).collect();
        let result = node.fork(&parent, &ids, req.snapshot.as_ref()).await;
        finish_fork(&task_state, rows, result, started).await
    });
    task.await.map_err(ApiError::internal)?
}

/// Records each child like a finished create; if any did not come up, deletes them all.
async fn finish_fork(
    st: &AppState,
    rows: Vec<SandboxRow>,
    result: NodeResult<Vec<SandboxView>>,
    started: Instant,
) -> ApiResult<Vec<SandboxInfo>> {
    let records = match result {
        Ok(r) => r,
        Err(e) => {
            for row in &rows {
                discard(st, row).await?;
            }
            return Err(e.into());
        }
    };
    let mut children = Vec::new();
    let mut failure = None;
    for row in &rows {
        let record = records
            .iter()
            .find(|r| r.id == row.id)
            .cloned()
            .ok_or_else(|| NodeCallError::Internal {
                detail: format!("the node returned no record for child {}", row.id),
            });
        match finish_create(st, row.clone(), record, started).await {
            Ok(info) => children.push(info),
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failure {
        for row in rows
            .iter()
            .filter(|r| children.iter().any(|c| c.id == r.id))
        {
            discard(st, row).await?;
        }
        return Err(e);
    }
    Ok(children)
}

/// The lifecycle log of a sandbox the tenant may see, as `GET …/events` without `follow`
/// returns it (other APIs' log endpoints read it here).
pub async fn event_log(
    st: &AppState,
    tenant: &TenantId,
    id: &SandboxId,
) -> ApiResult<Vec<LifecycleEntry>> {
    let row = st.find_sandbox(tenant, id).await?;
    past_events(st.node_of(&row).await?.as_ref(), id).await
}

/// What the node's log holds for `id`. Deleted sandboxes keep their log for auditing (while
/// the node keeps their record); one the node has no record of has an empty log.
pub(crate) async fn past_events(
    node: &dyn NodeApi,
    id: &SandboxId,
) -> ApiResult<Vec<LifecycleEntry>> {
    match node.events(id).await {
        Ok(events) => Ok(events),
        Err(NodeCallError::SandboxNotFound { .. }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}
