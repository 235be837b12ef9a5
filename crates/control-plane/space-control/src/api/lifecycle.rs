//! Lifecycle operations on an existing sandbox: pause and resume (memory stays resident),
//! stop and start (cold; the disk is kept), rollback to a snapshot, fork into new
//! sandboxes, the event log of its transitions, and the node's warm pool.
//!
//! The node owns these states and persists them (see `space_node`); the database's desired
//! state stays `running` throughout (see [`crate::db::DesiredState`]). An operation the
//! sandbox's state does not allow is `409 conflict` with the node's message, e.g. "cannot
//! pause a sandbox that is paused". Node calls run in their own task, so a client that hangs
//! up cannot cancel an operation half-way.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use space_core::sandbox::{
    validate_labels, EventList, ForkRequest, PoolShape, PoolStatusList, RollbackRequest,
    SandboxInfo, SandboxList, MAX_FORK_COUNT,
};
use space_core::{ErrorBody, LifecycleEntry, SandboxId, SandboxState, TenantId};
use utoipa::IntoParams;

use super::auth::AuthTenant;
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, ApiQuery, SandboxPath};
use super::processes::NDJSON;
use super::sandboxes::{
    begin_create, discard, finish_create, new_row, sandbox_info, validate_timeout, NewRow,
};
use super::{AppState, InFlightGuard};
use crate::db::{now_ms, SandboxRow, SandboxSpec};
use crate::nodes::{
    EventFeed, EventNotice, NodeApi, NodeCallError, NodeResult, PauseCause, SandboxView, StopCause,
};

/// How often a followed event stream sends a keep-alive (an empty line, which NDJSON
/// readers skip) and checks that its sandbox still exists.
pub const FOLLOW_HEARTBEAT: Duration = Duration::from_secs(15);
/// Longest a followed event stream stays open; the client reconnects for more.
pub const MAX_FOLLOW: Duration = Duration::from_secs(24 * 3600);

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
    tenant: &AuthTenant,
    id: SandboxId,
    deadline: Deadline,
    op: F,
) -> ApiResult<Json<SandboxInfo>>
where
    F: FnOnce(Arc<dyn NodeApi>, SandboxId) -> Fut,
    Fut: std::future::Future<Output = NodeResult<SandboxView>> + Send + 'static,
{
    let mut row = st.live_sandbox(&tenant.id, &id).await?;
    let task_state = st.clone();
    let work = op(st.node_of(&row).await?, id.clone());
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
    Ok(Json(sandbox_info(&row, Some(&record), false)))
}

/// Pause a running sandbox: its vCPUs stop, its memory stays resident. Only `resume` wakes
/// it (calls that need the guest get `409`).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/pause",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Paused", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not running (the message names its state)", body = ErrorBody),
        (status = 502, description = "The sandbox broke while pausing (it is now failed)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn pause(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    operate(&st, &tenant, id, Deadline::Keep, |node, id| async move {
        node.pause(&id, PauseCause::User).await
    })
    .await
}

/// Resume a paused sandbox (whoever paused it); returns once its daemon answers again. Its
/// deadline becomes now + its timeout.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/resume",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Running again", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not paused (the message names its state)", body = ErrorBody),
        (status = 502, description = "The sandbox broke while resuming (it is now failed)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn resume(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    operate(&st, &tenant, id, Deadline::Renew, |node, id| async move {
        node.resume(&id).await
    })
    .await
}

/// Stop a running or paused sandbox: the VM goes away (processes and memory are lost), the
/// disk is kept and the sandbox holds no CPU or memory until `start`.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/stop",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Stopped", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Neither running nor paused (the message names its state)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn stop(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    operate(&st, &tenant, id, Deadline::Keep, |node, id| async move {
        node.stop(&id, StopCause::User).await
    })
    .await
}

/// Start a stopped sandbox (whoever stopped it): a cold boot on its kept disk; returns once
/// its daemon is ready. Its deadline becomes now + its timeout.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/start",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Running", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Not stopped (the message names its state)", body = ErrorBody),
        (status = 507, description = "Not enough capacity on the node", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn start(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    operate(&st, &tenant, id, Deadline::Renew, |node, id| async move {
        node.start(&id).await
    })
    .await
}

/// Roll the sandbox back to one of its snapshots: a disk snapshot brings the old disk back
/// (the VM boots on it: processes are gone); a checkpoint brings back memory and processes
/// as they were. Allowed while running, paused, stopped or failed.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/rollback",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RollbackRequest,
    responses(
        (status = 200, description = "Running on the snapshot", body = SandboxInfo),
        (status = 400, description = "Invalid request (malformed snapshot id)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox, or no such snapshot of this sandbox", body = ErrorBody),
        (status = 409, description = "Not possible in the sandbox's state", body = ErrorBody),
        (status = 502, description = "The rollback failed (the sandbox is now failed; roll back again or delete it)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn rollback(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<RollbackRequest>,
) -> ApiResult<Json<SandboxInfo>> {
    operate(&st, &tenant, id, Deadline::Keep, |node, id| async move {
        node.rollback(&id, &req.snapshot).await
    })
    .await
}

/// Fork the sandbox into `count` new sandboxes, from the sandbox as it is now (it must be
/// running) or from one of its checkpoints. Each child has its own id, a copy-on-write copy
/// of the disk and memory, and restored uniqueness (fresh RNG seed, hostname, clock) before
/// any of its processes runs again. Children belong to the caller, inherit the template,
/// resources, environment, crash policy and timeout action (`on_timeout`, `auto_resume`),
/// and get the parent's labels merged with `labels`. All or nothing: if a child fails to start, every child is deleted.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/fork",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "The children, running", body = SandboxList),
        (status = 400, description = "Invalid request (count, labels, timeout, a disk snapshot)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox, or no such checkpoint of it", body = ErrorBody),
        (status = 409, description = "Not running (and no checkpoint given)", body = ErrorBody),
        (status = 502, description = "A child failed to start", body = ErrorBody),
        (status = 507, description = "Not enough capacity on the node for every child", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn fork(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(parent): SandboxPath,
    ApiJson(req): ApiJson<ForkRequest>,
) -> ApiResult<(StatusCode, Json<SandboxList>)> {
    let started = Instant::now();
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORK_COUNT).contains(&count) {
        return Err(ApiError::invalid(format!(
            "count must be between 1 and {MAX_FORK_COUNT}, got {count}"
        )));
    }
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

    // All children or none: the quota is checked for all of them first (and again, under
    // the admission lock, for each as its row goes in).
    st.admit_sandboxes(&tenant.id, parent_rec.resources, u64::from(count))
        .await?;
    let mut rows: Vec<SandboxRow> = Vec::new();
    let mut guards: Vec<InFlightGuard> = Vec::new();
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
                },
                labels: labels.clone(),
                timeout_secs: req.timeout_secs,
                on_timeout: parent_row.on_timeout,
                auto_resume: parent_row.auto_resume,
            },
        );
        match begin_create(&st, &row).await {
            Ok(g) => guards.push(g),
            Err(e) => {
                for r in &rows {
                    discard(&st, r).await?;
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
        let outcome = finish_fork(&task_state, rows, result, started).await;
        drop(guards);
        outcome
    });
    let sandboxes = task.await.map_err(ApiError::internal)??;
    Ok((StatusCode::CREATED, Json(SandboxList { sandboxes })))
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

/// Query of the events endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// Stream NDJSON: the past entries, then new ones as they happen, until the sandbox is
    /// deleted (or 24 h pass). Empty lines are keep-alives.
    pub follow: Option<bool>,
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
async fn past_events(node: &dyn NodeApi, id: &SandboxId) -> ApiResult<Vec<LifecycleEntry>> {
    match node.events(id).await {
        Ok(events) => Ok(events),
        Err(NodeCallError::SandboxNotFound { .. }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// The sandbox's lifecycle transitions with their times (and details such as what a crash
/// restore lost), oldest first. With `follow=true`, an NDJSON stream of `LifecycleEntry`.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/events",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), EventsQuery),
    responses(
        (status = 200, description = "The event log; with follow=true an NDJSON stream, one LifecycleEntry per line", content(
            (EventList = "application/json"),
            (LifecycleEntry = "application/x-ndjson"),
        )),
        (status = 400, description = "Malformed id or query", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn events(
    State(st): State<AppState>,
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> ApiResult<Response> {
    let row = st.find_sandbox(&tenant.id, &id).await?;
    let node = st.node_of(&row).await?;
    if !q.follow.unwrap_or(false) {
        let past = past_events(node.as_ref(), &id).await?;
        return Ok(Json(EventList { events: past }).into_response());
    }
    // Subscribe before reading the log: nothing falls between the two.
    let rx = node.subscribe_events().await?;
    let past = past_events(node.as_ref(), &id).await?;
    let ended = past.last().is_some_and(|e| e.to == SandboxState::Deleted)
        || node
            .sandbox(&id)
            .await?
            .is_none_or(|r| r.state == SandboxState::Deleted);
    let follow = Follow {
        node,
        id,
        backlog: past.iter().cloned().collect(),
        maybe_seen: Some(past),
        last_sent: None,
        rx,
        heartbeat: tokio::time::interval_at(
            tokio::time::Instant::now() + FOLLOW_HEARTBEAT,
            FOLLOW_HEARTBEAT,
        ),
        done: ended,
        deadline: tokio::time::Instant::now() + MAX_FOLLOW,
    };
    let lines = futures::stream::unfold(follow, |mut f| async move {
        f.next_line()
            .await
            .map(|line| (Ok::<_, Infallible>(line), f))
    });
    Ok((
        [(CONTENT_TYPE, NDJSON), (CACHE_CONTROL, "no-store")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// State of a followed event stream.
struct Follow {
    node: Arc<dyn NodeApi>,
    id: SandboxId,
    /// Entries to send before waiting for new ones.
    backlog: VecDeque<LifecycleEntry>,
    /// Entries already queued from the log: live entries equal to one of these were
    /// broadcast while the log was read, and are skipped. Cleared at the first new entry.
    maybe_seen: Option<Vec<LifecycleEntry>>,
    last_sent: Option<LifecycleEntry>,
    rx: EventFeed,
    heartbeat: tokio::time::Interval,
    /// No more entries will come: send the backlog, then end.
    done: bool,
    deadline: tokio::time::Instant,
}

impl Follow {
    /// The next NDJSON line (an entry, or an empty keep-alive line); `None` ends the stream.
    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if let Some(entry) = self.backlog.pop_front() {
                if entry.to == SandboxState::Deleted {
                    self.done = true;
                }
                let mut line = serde_json::to_vec(&entry).unwrap_or_default();
                line.push(b'\n');
                self.last_sent = Some(entry);
                return Some(Bytes::from(line));
            }
            if self.done {
                return None;
            }
            tokio::select! {
                got = self.rx.next() => match got {
                    Some(EventNotice::Entry(entry)) if entry.sandbox_id == self.id => {
                        if let Some(seen) = &self.maybe_seen {
                            if seen.contains(&entry) {
                                continue;
                            }
                            self.maybe_seen = None;
                        }
                        self.backlog.push_back(entry);
                    }
                    Some(EventNotice::Entry(_)) => {}
                    Some(EventNotice::Lagged) => self.catch_up().await,
                    None => self.done = true,
                },
                _ = self.heartbeat.tick() => {
                    // A node that cannot say is no reason to end the stream.
                    if self
                        .node
                        .sandbox(&self.id)
                        .await
                        .is_ok_and(|r| r.is_none_or(|r| r.state == SandboxState::Deleted))
                    {
                        // Gone without a final entry reaching us: send what the log has.
                        self.catch_up().await;
                        self.done = true;
                        continue;
                    }
                    // Also how a client that went away is noticed: the write fails.
                    return Some(Bytes::from_static(b"\n"));
                }
                () = tokio::time::sleep_until(self.deadline) => self.done = true,
            }
        }
    }

    /// Too many entries went by (this follower lagged): re-read the log and queue what came
    /// after the last entry sent.
    async fn catch_up(&mut self) {
        let log = self.node.events(&self.id).await.unwrap_or_default();
        let already = self.backlog.len();
        let start = match &self.last_sent {
            Some(last) => log.iter().rposition(|e| e == last).map_or(0, |i| i + 1),
            None => 0,
        };
        let missed: Vec<LifecycleEntry> = log.into_iter().skip(start + already).collect();
        self.backlog.extend(missed.iter().cloned());
        self.maybe_seen = Some(missed);
    }
}

/// What the node's warm pool holds: restored, paused VMs per template shape, ready to
/// become sandboxes. Node-wide state: for the operator's tenant (`default`) only.
#[utoipa::path(
    get,
    path = "/v1/pool",
    tag = "pool",
    responses(
        (status = 200, description = "Pool members per template shape", body = PoolStatusList),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn pool(
    State(st): State<AppState>,
    tenant: AuthTenant,
) -> ApiResult<Json<PoolStatusList>> {
    tenant.require_operator()?;
    let mut pools = Vec::new();
    for node in st.nodes.all() {
        pools.extend(node.pool_status().await?);
    }
    let pools = pools
        .into_iter()
        .map(|p| PoolShape {
            template: p.template,
            resources: p.resources,
            ready: p.ready,
            filling: p.filling,
            target: p.target,
        })
        .collect();
    Ok(Json(PoolStatusList { pools }))
}
