//! `/v1/sandboxes/{id}/…` lifecycle operations: pause and resume, stop and start,
//! rollback, fork, the event log (and its NDJSON follow stream), and the node's warm pool.
//! Each handler parses its request, calls [`crate::service::lifecycle`] and renders the
//! answer; the follow stream is HTTP's own.
//!
//! The node owns these states and persists them (see `space_node`); the database's desired
//! state stays `running` throughout (see [`crate::db::DesiredState`]). An operation the
//! sandbox's state does not allow is `409 conflict` with the node's message, e.g. "cannot
//! pause a sandbox that is paused". Node calls run in their own task, so a client that hangs
//! up cannot cancel an operation half-way.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

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
    EventList, ForkRequest, PoolShape, PoolStatusList, RollbackRequest, SandboxInfo, SandboxList,
};
use space_core::{ErrorBody, LifecycleEntry, SandboxId, SandboxState};
use utoipa::IntoParams;

use super::error::ApiResult;
use super::extract::{ApiJson, ApiQuery, SandboxPath};
use super::processes::NDJSON;
use super::AppState;
use crate::nodes::{EventFeed, EventNotice, NodeApi};
use crate::service::lifecycle::{self, past_events};
use crate::service::Caller;

/// How often a followed event stream sends a keep-alive (an empty line, which NDJSON
/// readers skip) and checks that its sandbox still exists.
pub const FOLLOW_HEARTBEAT: Duration = Duration::from_secs(15);
/// Longest a followed event stream stays open; the client reconnects for more.
pub const MAX_FOLLOW: Duration = Duration::from_secs(24 * 3600);

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
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(lifecycle::pause(&st, &tenant, &id).await?))
}

/// Resume a paused sandbox (whoever paused it), or a suspended one (restored from object
/// storage on whichever node the scheduler picks, under its own id, with its files,
/// processes, egress policy, CA, credentials, labels and timeout); returns once its daemon
/// answers again. Its deadline becomes now + its timeout.
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
        (status = 409, description = "Neither paused nor suspended (the message names its state), or being resumed already", body = ErrorBody),
        (status = 502, description = "The sandbox broke while resuming (it is now failed), or its stored snapshot is damaged (snapshot_corrupt: it stays suspended)", body = ErrorBody),
        (status = 503, description = "Object storage cannot be reached (storage_unavailable: it stays suspended)", body = ErrorBody),
        (status = 507, description = "No node has room for it", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn resume(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(lifecycle::resume(&st, &tenant, &id).await?))
}

/// Suspend a running or paused sandbox to object storage: its VM is paused and fully
/// snapshotted, the snapshot's artifacts (memory and device state compressed, the disk's
/// changes against its template, its description) uploaded and checked, and only then is
/// the sandbox `suspended` and its node's resources freed. A failure before that leaves it
/// running as it was. `resume` restores it on any node.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/suspend",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Suspended", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "Neither running nor paused, suspended already, or no object store is configured", body = ErrorBody),
        (status = 503, description = "Object storage or the sandbox's node cannot be reached (it runs on)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn suspend(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(
        crate::service::suspend::suspend(&st, &tenant, &id).await?,
    ))
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
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(lifecycle::stop(&st, &tenant, &id).await?))
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
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(lifecycle::start(&st, &tenant, &id).await?))
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
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<RollbackRequest>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(
        lifecycle::rollback(&st, &tenant, &id, &req.snapshot).await?,
    ))
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
    tenant: Caller,
    SandboxPath(parent): SandboxPath,
    ApiJson(req): ApiJson<ForkRequest>,
) -> ApiResult<(StatusCode, Json<SandboxList>)> {
    let sandboxes = lifecycle::fork(&st, &tenant, &parent, req).await?;
    Ok((StatusCode::CREATED, Json(SandboxList { sandboxes })))
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
    tenant: Caller,
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
pub async fn pool(State(st): State<AppState>, tenant: Caller) -> ApiResult<Json<PoolStatusList>> {
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
