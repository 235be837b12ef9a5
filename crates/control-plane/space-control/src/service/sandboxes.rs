//! Sandboxes: create (from a template or one of the caller's snapshots), get, list,
//! delete, timeout, token revocation, console; and the steps every new sandbox goes
//! through ([`begin_create`], [`finish_create`]), which forks share
//! ([`super::lifecycle`]).
//!
//! The database row (desired state, owner, labels) is merged with the node's live record
//! ([`sandbox_info`]). Creation records the desired state *before* asking the node, so a
//! crash in between leaves a row the reconciler resolves; node calls run in their own task,
//! so a client that hangs up cannot cancel a half-done create or delete.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use space_core::process::validate_env;
use space_core::sandbox::{
    validate_labels, CreateSandboxRequest, ResourcesRequest, SandboxInfo, MAX_TIMEOUT_SECS,
};
use space_core::sandbox::{
    OnNodeLoss, PausedBy, SandboxOrigin, SnapshotStorage, StoppedBy, TimeoutAction,
};
use space_core::template::validate_template_name;
use space_core::{ErrorCode, SandboxId, SandboxState, SnapshotId, TenantId};
use space_secrets::ProjectId;

use super::Caller;
use crate::api::error::{ApiError, ApiResult};
use crate::api::AppState;
use crate::db::{now_ms, DesiredState, SandboxFilter, SandboxRow, SandboxSpec};
use crate::nodes::{
    CreateFromSnapshot, CreateSandbox, FetchSnapshot, NodeApi, NodeCallError, NodeResult,
    PauseCause, SandboxSettings, SandboxView, StopCause, VmOrigin,
};
use crate::scheduler::NodeState;
use space_core::error::excerpt;

/// Timeout when a create request gives none.
pub const DEFAULT_TIMEOUT_SECS: u64 = 3600;

/// The API view of a sandbox: the desired state from the database merged with the node's
/// live record. `creating` says the create call is still under way in this process.
pub fn sandbox_info(row: &SandboxRow, record: Option<&SandboxView>, creating: bool) -> SandboxInfo {
    let (state, failure_reason) = match (row.desired_state, record) {
        (DesiredState::Deleted, Some(r)) if r.state != SandboxState::Deleted => {
            (SandboxState::Deleting, None)
        }
        (DesiredState::Deleted, _) => (SandboxState::Deleted, None),
        (DesiredState::Running, Some(r)) if r.state == SandboxState::Deleted => (
            SandboxState::Failed,
            Some("the sandbox was deleted on its node".to_owned()),
        ),
        (DesiredState::Running, Some(r)) => (r.state, r.failure_reason.clone()),
        (DesiredState::Running, None) if creating => (SandboxState::Creating, None),
        (DesiredState::Running, None) => (
            SandboxState::Failed,
            Some("its node has no record of this sandbox".to_owned()),
        ),
    };
    SandboxInfo {
        id: row.id.clone(),
        template: row.template.clone(),
        template_digest: record.map_or_else(
            || row.template_digest.clone(),
            |r| r.template_digest.clone(),
        ),
        state,
        resources: record.map_or(row.spec.resources, |r| r.resources),
        labels: row.labels.clone(),
        env_keys: row.spec.env_keys.clone(),
        node: row.node.clone(),
        created_at_ms: row.created_at_ms,
        expires_at_ms: row.expires_at_ms,
        timeout_secs: row.timeout_secs,
        on_timeout: row.on_timeout,
        auto_resume: row.auto_resume,
        on_node_loss: row.spec.on_node_loss,
        snapshot_storage: row.spec.snapshot_storage,
        stored_checkpoint_at_ms: row
            .stored_checkpoint
            .as_ref()
            .and(row.stored_checkpoint_at_ms),
        public_ports: row.spec.public_ports.clone(),
        timed_out_at_ms: row.timed_out_at_ms,
        create_latency_ms: row.create_latency_ms.and_then(|v| u64::try_from(v).ok()),
        failure_reason,
        paused_by: record
            .filter(|r| r.state == SandboxState::Paused)
            .and_then(|r| r.paused_by)
            .map(|c| match c {
                PauseCause::User => PausedBy::User,
                PauseCause::Idle => PausedBy::Idle,
                PauseCause::Timeout => PausedBy::Timeout,
                PauseCause::CutOff => PausedBy::CutOff,
            }),
        stopped_by: record
            .filter(|r| r.state == SandboxState::Stopped)
            .and_then(|r| r.stopped_by)
            .map(|c| match c {
                StopCause::User => StoppedBy::User,
                StopCause::Timeout => StoppedBy::Timeout,
            }),
        origin: record
            .filter(|r| !matches!(r.state, SandboxState::Deleted | SandboxState::Stopped))
            .map(|r| origin(&r.origin)),
        forked_from: row.spec.forked_from.clone(),
        from_snapshot: row.spec.from_snapshot.clone(),
        on_crash: record.map(|r| r.on_crash).unwrap_or_default(),
        auto_pause_secs: record.and_then(|r| r.auto_pause_secs),
        project: record.and_then(|r| r.project.as_ref().map(|p| p.to_string())),
        egress: record.map(|r| r.egress.clone()),
    }
}

/// The API view of how a VM came to be.
pub fn origin(o: &VmOrigin) -> SandboxOrigin {
    match o {
        VmOrigin::Boot => SandboxOrigin::Boot,
        VmOrigin::TemplateImage { pooled } => SandboxOrigin::TemplateImage { pooled: *pooled },
        VmOrigin::Checkpoint { sandbox, snapshot } => SandboxOrigin::Checkpoint {
            sandbox_id: sandbox.clone(),
            snapshot_id: snapshot.clone(),
        },
    }
}

/// A row merged with its node's view of the sandbox as it is now.
pub async fn info_now(st: &AppState, row: &SandboxRow) -> ApiResult<SandboxInfo> {
    if row.suspended_snapshot.is_some() {
        return Ok(super::suspend::suspended_info(row));
    }
    st.refresh_if_unavailable(&row.node).await?;
    if st.nodes.state(&row.node) == Some(NodeState::Lost) {
        return Ok(lost_info(row));
    }
    let view = match st.node_of(row).await?.sandbox(&row.id).await {
        Ok(view) => view,
        Err(e @ NodeCallError::Unavailable { .. }) => {
            return match st.lost_since_asked(&row.node).await? {
                true => Ok(lost_info(row)),
                false => Err(e.into()),
            }
        }
        Err(e) => return Err(e.into()),
    };
    Ok(sandbox_info(row, view.as_ref(), creating_anywhere(row)))
}

/// Whether `row`'s create is under way (not yet recorded as done, within the grace): on
/// some replica, or about to be finished or undone by the reconciler.
fn creating_anywhere(row: &SandboxRow) -> bool {
    crate::reconciler::create_unfinished(row, now_ms())
}

/// Rows merged with their nodes' views, in the rows' order: one call per node, not per row.
pub async fn infos_now(st: &AppState, rows: &[&SandboxRow]) -> ApiResult<Vec<SandboxInfo>> {
    let mut names: Vec<&str> = rows
        .iter()
        .filter(|r| r.suspended_snapshot.is_none())
        .map(|r| r.node.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut views: HashMap<SandboxId, SandboxView> = HashMap::new();
    for name in names {
        st.refresh_if_unavailable(name).await?;
        if st.nodes.state(name) == Some(NodeState::Lost) {
            continue;
        }
        match st.nodes.get(name)?.sandboxes().await {
            Ok(list) => views.extend(list.into_iter().map(|v| (v.id.clone(), v))),
            // Declared lost by another replica meanwhile: its rows read `lost` below.
            Err(NodeCallError::Unavailable { .. }) if st.lost_since_asked(name).await? => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(rows
        .iter()
        .map(|row| match st.nodes.state(&row.node) {
            _ if row.suspended_snapshot.is_some() => super::suspend::suspended_info(row),
            Some(NodeState::Lost) => lost_info(row),
            _ => sandbox_info(row, views.get(&row.id), creating_anywhere(row)),
        })
        .collect())
}

/// A sandbox whose node is lost: `lost` (or deleted, if that is what its row says), as
/// its row describes it.
fn lost_info(row: &SandboxRow) -> SandboxInfo {
    let mut info = sandbox_info(row, None, false);
    if row.desired_state != DesiredState::Deleted {
        info.state = SandboxState::Lost;
        info.failure_reason = Some(format!(
            "its node {} is lost (it missed its heartbeats); the sandbox is back when the node rejoins",
            row.node
        ));
    }
    info
}

/// Checks the parts of a create request that need no template.
pub fn validate_create(req: &CreateSandboxRequest) -> Result<(), ApiError> {
    validate_labels(&req.labels).map_err(ApiError::invalid)?;
    validate_env(&req.env).map_err(|name| {
        ApiError::invalid(format!(
            "bad environment variable {name:?}: names are [A-Za-z_][A-Za-z0-9_]*, values at most {} bytes without NUL, at most {} variables",
            space_core::process::MAX_ENV_VALUE,
            space_core::process::MAX_ENV
        ))
    })?;
    if let Some(t) = req.timeout_secs {
        validate_timeout(t)?;
    }
    if let Some(secs) = req.auto_pause_secs {
        if !(space_core::sandbox::MIN_AUTO_PAUSE_SECS..=MAX_TIMEOUT_SECS).contains(&secs) {
            return Err(ApiError::invalid(format!(
                "auto_pause_secs must be between {} and {MAX_TIMEOUT_SECS}, got {secs}",
                space_core::sandbox::MIN_AUTO_PAUSE_SECS
            )));
        }
    }
    if let Some(schedule) = &req.snapshots {
        schedule
            .validate()
            .map_err(|e| ApiError::invalid(format!("bad snapshot schedule: {e}")))?;
    }
    parse_project(req.project.as_deref())?;
    Ok(())
}

/// The request's project, checked.
pub fn parse_project(project: Option<&str>) -> Result<Option<ProjectId>, ApiError> {
    project
        .map(|p| {
            p.parse::<ProjectId>().map_err(|_| {
                ApiError::invalid(format!(
                    "project {:?} must be [a-z0-9][a-z0-9_-]*, at most {} bytes",
                    excerpt(p, 80),
                    space_secrets::model::MAX_PROJECT_ID_LEN
                ))
            })
        })
        .transpose()
}

/// A sandbox timeout must be 1..=[`MAX_TIMEOUT_SECS`].
pub fn validate_timeout(secs: u64) -> Result<(), ApiError> {
    if !(1..=MAX_TIMEOUT_SECS).contains(&secs) {
        return Err(ApiError::invalid(format!(
            "timeout_secs must be between 1 and {MAX_TIMEOUT_SECS}, got {secs}"
        )));
    }
    Ok(())
}

fn template_not_found(name: &str) -> ApiError {
    ApiError::not_found(format!("template '{}' not found", excerpt(name, 64)))
}

/// Creates on `node`; if the create certainly did nothing there (the node could not be
/// reached, or had no room after all), places it once more without that node and creates
/// there. Never twice: a create that may have reached its node is not retried.
async fn create_on(
    st: &AppState,
    node: Arc<dyn NodeApi>,
    create: CreateSandbox,
    resources: space_core::Resources,
    template_digest: &str,
) -> NodeResult<SandboxView> {
    let first = match node.create_sandbox(create.clone()).await {
        Err(e) if e.not_acted_on() => e,
        other => return other,
    };
    let excluded = [node.name().to_owned()];
    let Ok(other) = st.nodes.place(resources, template_digest, &excluded).await else {
        return Err(first);
    };
    match st
        .db
        .move_placement(&create.id, node.name(), other.name())
        .await
    {
        Ok(true) => {}
        Ok(false) => return Err(first),
        Err(e) => {
            tracing::warn!(sandbox = %create.id, error = %e, "cannot move the placement; not retrying");
            return Err(first);
        }
    }
    tracing::warn!(sandbox = %create.id, from = node.name(), to = other.name(), error = %first, "create did not reach its node; retrying on another");
    if create.settings.seal_at_rest {
        let tenant = &create.settings.tenant;
        if let Err(e) = super::customer_keys::lend_artifact_key(st, tenant, other.as_ref()).await {
            // Its checkpoints wait for the watch's next loan; the create itself needs none.
            tracing::warn!(sandbox = %create.id, error = %e.body.message, "cannot lend the artifact key to the other node");
        }
    }
    other.create_sandbox(create).await
}

/// What the node gives a new sandbox, from the create request (for both kinds of create).
fn sandbox_settings(req: CreateSandboxRequest, tenant: &TenantId) -> ApiResult<SandboxSettings> {
    Ok(SandboxSettings {
        project: parse_project(req.project.as_deref())?,
        env: req.env,
        on_crash: req.on_crash,
        auto_pause_secs: req.auto_pause_secs,
        snapshots: req.snapshots,
        tenant: tenant.clone(),
        egress: req.egress,
        // Set where the node is known (the loan of the tenant's artifact key goes to it).
        seal_at_rest: false,
    })
}

/// Runs the node's side of a create in its own task (a client that hangs up cannot cancel
/// it half-way), then [`finish_create`].
async fn create_in_task<F>(
    st: AppState,
    row: SandboxRow,
    started: Instant,
    create: F,
) -> ApiResult<SandboxInfo>
where
    F: std::future::Future<Output = NodeResult<SandboxView>> + Send + 'static,
{
    let task = tokio::spawn(async move {
        let result = create.await;
        finish_create(&st, row, result, started).await
    });
    task.await.map_err(ApiError::internal)?
}

/// A create with `snapshot`: template and resources are the snapshot's, labels and env are
/// added to its, its egress policy and project apply unless the request names others.
async fn create_from_snapshot(
    st: &AppState,
    tenant: &Caller,
    snapshot: SnapshotId,
    req: CreateSandboxRequest,
    started: Instant,
) -> ApiResult<SandboxInfo> {
    if !req.template.is_empty() || req.resources != ResourcesRequest::default() {
        return Err(ApiError::invalid(
            "a sandbox created from a snapshot takes its template and resources from the snapshot: give `snapshot` without `template` and `resources`",
        ));
    }
    let found = super::snapshots::find_snapshot(st, &tenant.id, &snapshot).await?;
    let mut labels = match &found.sandbox {
        Some(row) => row.labels.clone(),
        None => found.origin.labels.clone(),
    };
    labels.extend(req.labels.clone());
    validate_labels(&labels).map_err(|e| ApiError::invalid(format!("merged labels: {e}")))?;
    let mut env_keys: Vec<String> = found.origin.env_keys.clone();
    env_keys.extend(
        req.env
            .keys()
            .filter(|k| !found.origin.env_keys.contains(*k))
            .cloned(),
    );
    env_keys.sort();
    let (on_node_loss, checkpoint_interval_secs) = node_loss_policy(st, &req)?;
    let snapshot_storage = snapshot_storage_policy(st, &req)?;
    let (node, source) = snapshot_node(st, &tenant.id, &found).await?;
    let id = SandboxId::generate();
    let row = new_row(
        id.clone(),
        &tenant.id,
        node.name(),
        NewRow {
            template: found.origin.template.clone(),
            template_digest: found.origin.template_digest.clone(),
            spec: SandboxSpec {
                resources: found.origin.resources,
                env_keys,
                forked_from: None,
                from_snapshot: Some(snapshot.clone()),
                public_ports: req.public_ports.clone(),
                on_node_loss,
                checkpoint_interval_secs,
                snapshot_storage,
            },
            labels,
            timeout_secs: req.timeout_secs,
            on_timeout: req.on_timeout,
            auto_resume: req.auto_resume,
        },
    );
    let mut settings = sandbox_settings(req, &tenant.id)?;
    settings.seal_at_rest =
        super::customer_keys::lend_artifact_key(st, &tenant.id, node.as_ref()).await?;
    let create = CreateFromSnapshot {
        id: id.clone(),
        snapshot: snapshot.clone(),
        source,
        settings,
    };
    begin_create(st, &row).await?;
    tracing::info!(sandbox = %id, tenant = %tenant.name, %snapshot, "creating sandbox from a snapshot");
    create_in_task(st.clone(), row, started, async move {
        node.create_from_snapshot(create).await
    })
    .await
}

/// Where a sandbox made from snapshot `found` is made, and the live sandbox there it is a
/// snapshot of (if so). A node that holds the snapshot's files and takes new sandboxes makes
/// it; else, for a snapshot in object storage, a node the scheduler picks, which fetches it
/// first (once, however many creates need it); else the node that holds it, whatever its
/// state (its own answer says why it cannot).
async fn snapshot_node(
    st: &AppState,
    tenant: &TenantId,
    found: &super::snapshots::FoundSnapshot,
) -> ApiResult<(Arc<dyn NodeApi>, Option<SandboxId>)> {
    let live_source = || found.sandbox.as_ref().map(|r| r.id.clone());
    let holder_takes_sandboxes = found.node.as_ref().is_some_and(|n| {
        !st.nodes.is_cluster() || st.nodes.state(n.name()) == Some(NodeState::Ready)
    });
    match (&found.node, &found.stored) {
        (Some(node), _) if holder_takes_sandboxes => Ok((node.clone(), live_source())),
        (_, Some(stored)) => {
            if st.nodes.is_cluster() {
                st.nodes.refresh(&st.db.nodes().await?);
            }
            let node = st
                .nodes
                .place(found.origin.resources, &found.origin.template_digest, &[])
                .await?;
            tracing::info!(snapshot = %stored.snapshot, node = node.name(), "making a stored snapshot present on a node");
            // A sealed snapshot opens only with the tenant's key.
            super::customer_keys::lend_artifact_key(st, tenant, node.as_ref()).await?;
            let here = node
                .fetch_snapshot(FetchSnapshot {
                    stored: stored.clone(),
                    tenant: tenant.clone(),
                })
                .await?;
            Ok((node, here.live_sandbox))
        }
        (Some(node), None) => Ok((node.clone(), live_source())),
        (None, None) => Err(ApiError::snapshot_not_found(&found.info.id)),
    }
}

/// What a new sandbox row is made of (the rest is set by [`new_row`]).
pub struct NewRow {
    /// Template name.
    pub template: String,
    /// Template digest.
    pub template_digest: String,
    /// Resources and env names.
    pub spec: SandboxSpec,
    /// Labels (already validated).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Requested timeout (already validated); default [`DEFAULT_TIMEOUT_SECS`].
    pub timeout_secs: Option<u64>,
    /// What happens when the timeout passes.
    pub on_timeout: TimeoutAction,
    /// Whether the next call that needs the guest wakes it after its timeout acted.
    pub auto_resume: bool,
}

/// The node-loss policy a create asks for, checked: `restore` needs an object store and a
/// checkpoint interval within bounds.
pub fn node_loss_policy(
    st: &AppState,
    req: &CreateSandboxRequest,
) -> ApiResult<(OnNodeLoss, Option<u64>)> {
    use space_core::sandbox::{
        DEFAULT_STORED_CHECKPOINT_SECS, MAX_STORED_CHECKPOINT_SECS, MIN_STORED_CHECKPOINT_SECS,
    };
    match req.on_node_loss {
        OnNodeLoss::Fail if req.checkpoint_interval_secs.is_some() => Err(ApiError::invalid(
            "checkpoint_interval_secs applies only with on_node_loss: restore",
        )),
        OnNodeLoss::Fail => Ok((OnNodeLoss::Fail, None)),
        OnNodeLoss::Restore if st.objects.is_none() || !st.nodes.is_cluster() => Err(ApiError::new(
            ErrorCode::Conflict,
            "on_node_loss: restore needs a cluster with an object store (`--cluster-dir`, `--object-store`): its checkpoints are stored there, and restored on another node",
        )),
        OnNodeLoss::Restore => {
            let secs = req
                .checkpoint_interval_secs
                .unwrap_or(DEFAULT_STORED_CHECKPOINT_SECS);
            if !(MIN_STORED_CHECKPOINT_SECS..=MAX_STORED_CHECKPOINT_SECS).contains(&secs) {
                return Err(ApiError::invalid(format!(
                    "checkpoint_interval_secs must be between {MIN_STORED_CHECKPOINT_SECS} and {MAX_STORED_CHECKPOINT_SECS}"
                )));
            }
            Ok((OnNodeLoss::Restore, Some(secs)))
        }
    }
}

/// Where a create asks its persistent snapshots to be kept, checked: `object_store` needs
/// one.
pub fn snapshot_storage_policy(
    st: &AppState,
    req: &CreateSandboxRequest,
) -> ApiResult<SnapshotStorage> {
    match req.snapshot_storage {
        SnapshotStorage::ObjectStore if st.objects.is_none() => Err(ApiError::new(
            ErrorCode::Conflict,
            "snapshot_storage: object_store needs an object store (`--object-store`)",
        )),
        storage => Ok(storage),
    }
}

/// The desired-state row of a sandbox about to be made on the node called `node`.
pub fn new_row(id: SandboxId, tenant: &TenantId, node: &str, new: NewRow) -> SandboxRow {
    let now = now_ms();
    let timeout_secs = new.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
    let timeout_ms = i64::try_from(timeout_secs * 1000).unwrap_or(i64::MAX);
    SandboxRow {
        id,
        tenant_id: tenant.clone(),
        node: node.to_owned(),
        template: new.template,
        template_digest: new.template_digest,
        spec: new.spec,
        labels: new.labels,
        desired_state: DesiredState::Running,
        created_at_ms: now,
        expires_at_ms: now.saturating_add(timeout_ms),
        timeout_secs,
        on_timeout: new.on_timeout,
        auto_resume: new.auto_resume,
        timed_out_at_ms: None,
        deleted_at_ms: None,
        create_latency_ms: None,
        creating_replica: None,
        suspended_snapshot: None,
        stored_checkpoint: None,
        stored_checkpoint_at_ms: None,
        tokens: Default::default(),
    }
}

/// First step of making a sandbox (create or fork child): records the desired state
/// *before* the node is asked, naming this replica as the one running the create. Every
/// replica's reconciler leaves the row (and the node's `creating` record) alone while this
/// replica lives and until [`finish_create`] has recorded the outcome; if this replica
/// dies first, the reconciler adopts what the node made, or undoes the create.
/// The tenant's quota is checked here, under its admission lock held until the row is in.
pub async fn begin_create(st: &AppState, row: &SandboxRow) -> ApiResult<()> {
    let _admission = st.quotas.admission(&row.tenant_id).await?;
    st.admit_sandboxes(&row.tenant_id, row.spec.resources, 1)
        .await?;
    let claimed = SandboxRow {
        creating_replica: Some(st.replica.id().clone()),
        ..row.clone()
    };
    st.db.insert_sandbox(&claimed).await?;
    Ok(())
}

/// Last step of making a sandbox: records what the node reported, or, if the sandbox did
/// not come up running, marks the row deleted and releases whatever the node allocated.
pub async fn finish_create(
    st: &AppState,
    mut row: SandboxRow,
    result: NodeResult<SandboxView>,
    started: Instant,
) -> ApiResult<SandboxInfo> {
    let latency = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
    let failure = match result {
        Ok(record) if record.state == SandboxState::Running => {
            row.spec.resources = record.resources;
            if !st
                .db
                .set_created(&row.id, &record.template_digest, &row.spec, latency)
                .await?
            {
                return Err(created_but_gone(st, &row).await);
            }
            tracing::info!(sandbox = %row.id, latency_ms = latency, "sandbox running");
            let row = st
                .db
                .sandbox_any_tenant(&row.id)
                .await?
                .ok_or_else(|| ApiError::sandbox_not_found(&row.id))?;
            return Ok(sandbox_info(&row, Some(&record), false));
        }
        Ok(record) => ApiError::new(
            ErrorCode::SandboxFailed,
            format!(
                "sandbox failed to start ({}): {}",
                record.state,
                record
                    .failure_reason
                    .as_deref()
                    .unwrap_or("no reason recorded")
            ),
        ),
        Err(e) => ApiError::from(e),
    };
    tracing::warn!(sandbox = %row.id, error = %failure.body, "sandbox creation failed");
    // The create may have been retried on another node: discard it where the row says.
    if let Ok(Some(now)) = st.db.sandbox_any_tenant(&row.id).await {
        row.node = now.node;
    }
    discard(st, &row).await?;
    Err(failure)
}

/// The node made the sandbox, but its row is no longer live: it was deleted meanwhile, or
/// this replica was taken for dead and the reconciler undid the create. The sandbox goes
/// from the node (the row says nobody wants it).
async fn created_but_gone(st: &AppState, row: &SandboxRow) -> ApiError {
    tracing::warn!(sandbox = %row.id, "created, but its row was deleted meanwhile; removing it from its node");
    if let Err(e) = discard(st, row).await {
        tracing::warn!(sandbox = %row.id, error = %e.body, "cleanup failed; the reconciler will retry");
    }
    ApiError::new(
        ErrorCode::Conflict,
        format!("sandbox {} was deleted while it was being created", row.id),
    )
}

/// Nothing is left half-made: the row stops being desired and the node releases whatever
/// it allocated (the reconciler retries if the node side fails).
pub async fn discard(st: &AppState, row: &SandboxRow) -> ApiResult<()> {
    st.db.mark_deleted(&row.id, now_ms()).await?;
    if let Err(e) = st.node_of(row).await?.delete(&row.id).await {
        tracing::warn!(sandbox = %row.id, error = %e, "cleanup after failed create failed; the reconciler will retry")
    }
    Ok(())
}

/// Creates a sandbox, from a template or from one of the caller's snapshots; returns once
/// its daemon is ready.
pub async fn create(
    st: &AppState,
    caller: &Caller,
    mut req: CreateSandboxRequest,
) -> ApiResult<SandboxInfo> {
    let started = Instant::now();
    validate_create(&req)?;
    super::customer_keys::require_usable(st, &caller.id).await?;
    if let Some(snapshot) = req.snapshot.clone() {
        return create_from_snapshot(st, caller, snapshot, req, started).await;
    }
    if req.template.is_empty() {
        return Err(ApiError::invalid(
            "give `template` (or `snapshot`) to create a sandbox from",
        ));
    }
    if !validate_template_name(&req.template) {
        return Err(template_not_found(&req.template));
    }
    if st.nodes.is_cluster() {
        // Membership as the database has it now: a node that joined, or was cordoned or
        // lost, through another replica a moment ago is seen for the template and the
        // placement alike.
        st.nodes.refresh(&st.db.nodes().await?);
    }
    // The caller's own template of that name, else the shared one.
    let template = crate::service::templates::get(st, caller, &req.template)
        .await
        .map_err(|e| match e.body.code {
            ErrorCode::NotFound => template_not_found(&req.template),
            _ => e,
        })?;
    let resources = req.resources.resolve(template.default_resources);
    resources
        .validate(template.image_size_mib)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let (on_node_loss, checkpoint_interval_secs) = node_loss_policy(st, &req)?;
    let snapshot_storage = snapshot_storage_policy(st, &req)?;
    let node = st.nodes.place(resources, &template.digest, &[]).await?;

    let id = SandboxId::generate();
    let row = new_row(
        id.clone(),
        &caller.id,
        node.name(),
        NewRow {
            template: template.name.clone(),
            template_digest: template.digest.clone(),
            spec: SandboxSpec {
                resources,
                env_keys: req.env.keys().cloned().collect(),
                forked_from: None,
                from_snapshot: None,
                public_ports: req.public_ports.clone(),
                on_node_loss,
                checkpoint_interval_secs,
                snapshot_storage,
            },
            labels: req.labels.clone(),
            timeout_secs: req.timeout_secs,
            on_timeout: req.on_timeout,
            auto_resume: req.auto_resume,
        },
    );
    if req.egress.is_none() {
        req.egress = st.db.tenant_egress_policy(&caller.id).await?;
    }
    let mut settings = sandbox_settings(req, &caller.id)?;
    settings.seal_at_rest =
        super::customer_keys::lend_artifact_key(st, &caller.id, node.as_ref()).await?;
    begin_create(st, &row).await?;
    tracing::info!(sandbox = %id, tenant = %caller.name, template = %row.template, "creating sandbox");

    let create = CreateSandbox {
        id: id.clone(),
        template: row.template.clone(),
        // The build this placement chose: a node that lacks it fetches exactly it.
        template_digest: Some(template.digest.clone()),
        resources: ResourcesRequest {
            vcpus: Some(resources.vcpus),
            memory_mib: Some(resources.memory_mib),
            disk_mib: Some(resources.disk_mib),
        },
        settings,
    };
    let placement = st.clone();
    let digest = template.digest.clone();
    create_in_task(st.clone(), row, started, async move {
        create_on(&placement, node, create, resources, &digest).await
    })
    .await
}

/// Which of the caller's sandboxes a listing returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// `key=value` pairs that must all match.
    pub labels: Vec<(String, String)>,
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
}

/// The caller's sandboxes matching `query`, newest first.
pub async fn list(
    st: &AppState,
    caller: &Caller,
    query: &ListQuery,
) -> ApiResult<Vec<SandboxInfo>> {
    let filter = match query.state {
        None => SandboxFilter::Live,
        Some(SandboxState::Deleted | SandboxState::Deleting) => SandboxFilter::All,
        Some(_) => SandboxFilter::Live,
    };
    let rows = st.db.sandboxes(&caller.id, filter).await?;
    let matching: Vec<&SandboxRow> = rows
        .iter()
        .filter(|row| {
            query
                .labels
                .iter()
                .all(|(k, v)| row.labels.get(k) == Some(v))
        })
        .collect();
    Ok(infos_now(st, &matching)
        .await?
        .into_iter()
        .filter(|info| query.state.is_none_or(|s| info.state == s))
        .collect())
}

/// One of the caller's sandboxes (deleted ones too, with state `deleted`).
pub async fn get(st: &AppState, caller: &Caller, id: &SandboxId) -> ApiResult<SandboxInfo> {
    let row = st.find_sandbox(&caller.id, id).await?;
    info_now(st, &row).await
}

/// Deletes one of the caller's sandboxes: the VM is stopped and its disk removed. The
/// delete is recorded first; the node's side runs in its own task, and the reconciler
/// finishes it if that fails (or, for a node that is lost or unreachable, when the node is
/// reconciled).
pub async fn delete(st: &AppState, caller: &Caller, id: &SandboxId) -> ApiResult<()> {
    let row = st.live_sandbox(&caller.id, id).await?;
    if !st.db.mark_deleted(id, now_ms()).await? {
        // Someone else (another request, the TTL) won the race.
        return Err(ApiError::sandbox_not_found(id));
    }
    tracing::info!(sandbox = %id, tenant = %caller.name, "deleting sandbox");
    if row.suspended_snapshot.is_some() && row.creating_replica.is_none() {
        // No node holds it; its stored snapshot is collected by the leader.
        return Ok(());
    }
    let node = match st.node_of(&row).await {
        Ok(node) => node,
        Err(e) => {
            tracing::warn!(sandbox = %id, node = %row.node, error = %e.body.message, "node unavailable; the delete finishes when it is reconciled");
            return Ok(());
        }
    };
    let task_id = id.clone();
    match tokio::spawn(async move { node.delete(&task_id).await }).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(sandbox = %id, error = %e, "node delete failed; the reconciler will retry")
        }
        Err(e) => {
            tracing::warn!(sandbox = %id, error = %e, "node delete task failed; the reconciler will retry")
        }
    }
    Ok(())
}

/// Sets a sandbox's timeout: its `on_timeout` action happens `timeout_secs` from now, and
/// each time it runs again it gets `timeout_secs` once more. A sandbox its timeout paused
/// or stopped gets a deadline again.
pub async fn set_timeout(
    st: &AppState,
    caller: &Caller,
    id: &SandboxId,
    timeout_secs: u64,
) -> ApiResult<SandboxInfo> {
    validate_timeout(timeout_secs)?;
    st.live_sandbox(&caller.id, id).await?;
    if !st.db.set_timeout(id, timeout_secs, now_ms()).await? {
        return Err(ApiError::sandbox_not_found(id));
    }
    let row = st.find_sandbox(&caller.id, id).await?;
    info_now(st, &row).await
}

/// Revokes every access token handed out for the sandbox: they fail at once.
pub async fn revoke_tokens(st: &AppState, caller: &Caller, id: &SandboxId) -> ApiResult<()> {
    st.live_sandbox(&caller.id, id).await?;
    if !st.db.revoke_tokens(id).await? {
        return Err(ApiError::sandbox_not_found(id));
    }
    tracing::info!(sandbox = %id, tenant = %caller.name, "sandbox tokens revoked");
    Ok(())
}

/// Default console tail.
pub const DEFAULT_CONSOLE_BYTES: usize = 16 * 1024;
/// Largest console tail a request may ask for.
pub const MAX_CONSOLE_BYTES: usize = 1024 * 1024;

/// The last `bytes` of the sandbox's serial console (kernel and boot messages).
pub async fn console_tail(
    st: &AppState,
    caller: &Caller,
    id: &SandboxId,
    bytes: usize,
) -> ApiResult<String> {
    if !(1..=MAX_CONSOLE_BYTES).contains(&bytes) {
        return Err(ApiError::invalid(format!(
            "bytes must be between 1 and {MAX_CONSOLE_BYTES}"
        )));
    }
    let row = st.live_sandbox(&caller.id, id).await?;
    Ok(st.node_of(&row).await?.console_tail(id, bytes).await?)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use space_core::Resources;

    use super::*;

    fn row(desired: DesiredState) -> SandboxRow {
        SandboxRow {
            id: SandboxId::generate(),
            tenant_id: space_core::TenantId::generate(),
            node: "local".into(),
            template: "base".into(),
            template_digest: "d1".into(),
            spec: SandboxSpec {
                resources: Resources::default(),
                env_keys: vec!["A".into()],
                forked_from: None,
                from_snapshot: None,
                public_ports: Default::default(),
                on_node_loss: Default::default(),
                checkpoint_interval_secs: None,
                snapshot_storage: Default::default(),
            },
            labels: BTreeMap::new(),
            desired_state: desired,
            created_at_ms: 1,
            expires_at_ms: 2,
            timeout_secs: 1,
            on_timeout: TimeoutAction::Pause,
            auto_resume: true,
            timed_out_at_ms: None,
            deleted_at_ms: None,
            create_latency_ms: Some(5),
            creating_replica: None,
            suspended_snapshot: None,
            stored_checkpoint: None,
            stored_checkpoint_at_ms: None,
            tokens: Default::default(),
        }
    }

    fn record(row: &SandboxRow, state: SandboxState) -> SandboxView {
        SandboxView {
            id: row.id.clone(),
            template: row.template.clone(),
            template_digest: "d2".into(),
            resources: Resources {
                vcpus: 2,
                ..Resources::default()
            },
            state,
            failure_reason: (state == SandboxState::Failed).then(|| "boom".into()),
            created_at_ms: 1,
            create_latency_ms: Some(3),
            origin: VmOrigin::Boot,
            on_crash: Default::default(),
            auto_pause_secs: None,
            paused_by: None,
            stopped_by: None,
            tenant: None,
            project: None,
            egress: Default::default(),
        }
    }

    #[test]
    fn merge_prefers_the_live_record() {
        let r = row(DesiredState::Running);
        let info = sandbox_info(&r, Some(&record(&r, SandboxState::Running)), false);
        assert_eq!(
            (
                info.state,
                info.template_digest.as_str(),
                info.resources.vcpus
            ),
            (SandboxState::Running, "d2", 2)
        );
        assert_eq!(info.env_keys, vec!["A".to_owned()]);
        let info = sandbox_info(&r, Some(&record(&r, SandboxState::Failed)), false);
        assert_eq!(
            (info.state, info.failure_reason.as_deref()),
            (SandboxState::Failed, Some("boom"))
        );
    }

    #[test]
    fn merge_shows_who_paused_and_where_the_vm_came_from() {
        let mut r = row(DesiredState::Running);
        let parent = SandboxId::generate();
        r.spec.forked_from = Some(parent.clone());
        let mut rec = record(&r, SandboxState::Paused);
        rec.paused_by = Some(PauseCause::Idle);
        rec.auto_pause_secs = Some(60);
        rec.origin = VmOrigin::Checkpoint {
            sandbox: parent.clone(),
            snapshot: None,
        };
        let info = sandbox_info(&r, Some(&rec), false);
        assert_eq!(info.state, SandboxState::Paused);
        assert_eq!(info.paused_by, Some(PausedBy::Idle));
        assert_eq!(info.auto_pause_secs, Some(60));
        assert_eq!(info.forked_from.as_ref(), Some(&parent));
        assert_eq!(
            info.origin,
            Some(SandboxOrigin::Checkpoint {
                sandbox_id: parent,
                snapshot_id: None
            })
        );
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["paused_by"], "idle");
        assert_eq!(json["origin"]["kind"], "checkpoint");
        // A stale cause is not shown once running; a stopped sandbox has no VM origin.
        rec.state = SandboxState::Running;
        assert_eq!(sandbox_info(&r, Some(&rec), false).paused_by, None);
        rec.state = SandboxState::Stopped;
        assert_eq!(sandbox_info(&r, Some(&rec), false).origin, None);
        assert_eq!(
            sandbox_info(&r, None, true).on_crash,
            space_core::sandbox::CrashPolicy::Restore
        );
    }

    #[test]
    fn merge_shows_what_the_timeout_did() {
        let mut r = row(DesiredState::Running);
        r.timed_out_at_ms = Some(7);
        let mut rec = record(&r, SandboxState::Paused);
        rec.paused_by = Some(PauseCause::Timeout);
        let info = sandbox_info(&r, Some(&rec), false);
        assert_eq!(
            (info.paused_by, info.stopped_by, info.timed_out_at_ms),
            (Some(PausedBy::Timeout), None, Some(7))
        );
        assert_eq!(
            (info.on_timeout, info.auto_resume, info.timeout_secs),
            (TimeoutAction::Pause, true, 1)
        );
        rec.state = SandboxState::Stopped;
        rec.stopped_by = Some(StopCause::Timeout);
        let info = sandbox_info(&r, Some(&rec), false);
        assert_eq!(
            (info.paused_by, info.stopped_by),
            (None, Some(StoppedBy::Timeout))
        );
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(
            (&json["stopped_by"], &json["on_timeout"]),
            (&serde_json::json!("timeout"), &serde_json::json!("pause"))
        );
        // Only a stopped sandbox shows who stopped it.
        rec.state = SandboxState::Running;
        assert_eq!(sandbox_info(&r, Some(&rec), false).stopped_by, None);
    }

    #[test]
    fn merge_without_a_record() {
        let r = row(DesiredState::Running);
        assert_eq!(sandbox_info(&r, None, true).state, SandboxState::Creating);
        assert_eq!(sandbox_info(&r, None, false).state, SandboxState::Failed);
        let d = row(DesiredState::Deleted);
        assert_eq!(sandbox_info(&d, None, false).state, SandboxState::Deleted);
        assert_eq!(
            sandbox_info(&d, Some(&record(&d, SandboxState::Running)), false).state,
            SandboxState::Deleting
        );
    }

    #[test]
    fn create_validation() {
        let mut req = CreateSandboxRequest {
            template: "base".into(),
            ..Default::default()
        };
        assert!(validate_create(&req).is_ok());
        req.timeout_secs = Some(0);
        assert!(validate_create(&req).is_err());
        req.timeout_secs = Some(MAX_TIMEOUT_SECS + 1);
        assert!(validate_create(&req).is_err());
        req.timeout_secs = None;
        req.labels.insert("bad key".into(), "v".into());
        assert!(validate_create(&req).is_err());
    }
}
