//! The E2B REST API's sandbox operations, each a translation onto the same functions that
//! serve SPACE's `/v1` (so validation, idempotency, the in-flight set and the node calls are
//! exactly the native ones): create, get, list, kill, timeout and refresh, connect and
//! resume, pause, fork, and the network update.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};
use space_control::api::error::ApiError;
use space_control::api::extract::ApiJson;
use space_control::service::Caller;
use space_control::service::{egress, lifecycle, sandboxes};
use space_core::sandbox::{CreateSandboxRequest, ForkRequest, SandboxInfo, TimeoutAction};
use space_core::{SandboxId, SandboxState};

use super::error::{RestError, RestResult};
use super::list::{self, Cursor};
use super::network::{self, NetworkConfig};
use super::{
    E2bState as WireState, JsonOrEmpty, NewSandbox, Sandbox, SandboxDetail, DEFAULT_TIMEOUT_SECS,
};
use crate::state::{E2bState, HandedTokens};
use space_core::error::excerpt;

/// Fields of a create request SPACE does not offer: refused, never silently dropped.
const UNSUPPORTED_CREATE_FIELDS: &[&str] = &["mcp", "iam", "volumeMounts"];

/// The `{sandboxID}` of a path, parsed: a malformed id is simply not found, as on E2B.
pub fn sandbox_id(raw: &str) -> RestResult<SandboxId> {
    raw.parse()
        .map_err(|_| RestError::not_found(format!("sandbox {} not found", excerpt(raw, 64))))
}

/// The E2B view of a sandbox SPACE just made or woke, with its tokens (handed out again:
/// their validity is renewed).
pub async fn sandbox(st: &E2bState, info: &SandboxInfo) -> RestResult<Sandbox> {
    let tokens = handed_tokens(st, &info.id).await?;
    Ok(Sandbox {
        template_id: info.template.clone(),
        sandbox_id: info.id.to_string(),
        client_id: info.node.clone(),
        envd_version: super::ENVD_VERSION.to_owned(),
        envd_access_token: Some(tokens.envd),
        domain: Some(st.config.domain.clone()),
        traffic_access_token: Some(tokens.traffic),
    })
}

/// The tokens of sandbox `id`, handed out (404 if it is gone).
async fn handed_tokens(st: &E2bState, id: &SandboxId) -> RestResult<HandedTokens> {
    st.hand_out_tokens(id)
        .await
        .map_err(|e| RestError::from(space_control::api::error::ApiError::from(e)))?
        .ok_or_else(|| not_found(id))
}

/// The `autoResume` object of a create request.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
struct AutoResume {
    #[serde(default)]
    enabled: bool,
}

/// `POST /v2/sandboxes` (and the older `POST /sandboxes`).
pub async fn create(
    State(st): State<E2bState>,
    tenant: Caller,
    ApiJson(req): ApiJson<NewSandbox>,
) -> RestResult<(StatusCode, Json<Sandbox>)> {
    for field in UNSUPPORTED_CREATE_FIELDS {
        if req.other.get(*field).is_some_and(|v| !v.is_null()) {
            return Err(RestError::bad_request(format!(
                "{field} is not supported by SPACE"
            )));
        }
    }
    let network: Option<NetworkConfig> = match req.other.get("network") {
        Some(v) if !v.is_null() => Some(
            serde_json::from_value(v.clone())
                .map_err(|e| RestError::bad_request(format!("network: {e}")))?,
        ),
        _ => None,
    };
    let auto_resume: AutoResume = match req.other.get("autoResume") {
        Some(v) if !v.is_null() => serde_json::from_value(v.clone())
            .map_err(|e| RestError::bad_request(format!("autoResume: {e}")))?,
        _ => AutoResume::default(),
    };
    let keep_memory = match req.other.get("autoPauseMemory") {
        Some(serde_json::Value::Bool(b)) => *b,
        None | Some(serde_json::Value::Null) => true,
        Some(_) => return Err(RestError::bad_request("autoPauseMemory: want a boolean")),
    };
    // E2B's auto-pause is SPACE's timeout action: a pause keeps memory, a file-system-only
    // pause is a stop.
    let on_timeout = match (req.auto_pause, keep_memory) {
        (false, _) => TimeoutAction::Delete,
        (true, true) => TimeoutAction::Pause,
        (true, false) => TimeoutAction::Stop,
    };
    // A sandbox made from a snapshot takes template and resources from it.
    let (template, snapshot) = match req.template_id.parse::<space_core::SnapshotId>() {
        Ok(snap) => (String::new(), Some(snap)),
        Err(_) => (req.template_id.clone(), None),
    };
    let egress = network::egress_policy(req.allow_internet_access, network.as_ref())
        .map_err(RestError::bad_request)?;
    let timeout_secs = req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
    let native = CreateSandboxRequest {
        template,
        snapshot,
        env: req.env_vars.clone(),
        labels: req.metadata.clone(),
        timeout_secs: Some(timeout_secs),
        on_timeout,
        auto_resume: auto_resume.enabled,
        egress,
        public_ports: network::public_ports(network.as_ref()),
        ..CreateSandboxRequest::default()
    };
    let info = sandboxes::create(&st.app, &tenant, native).await?;
    Ok((StatusCode::CREATED, Json(sandbox(&st, &info).await?)))
}

/// `GET /sandboxes/{id}`.
pub async fn get(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
) -> RestResult<Json<SandboxDetail>> {
    let info = visible(&st, &tenant, &raw).await?;
    let token = Some(handed_tokens(&st, &info.id).await?.envd);
    SandboxDetail::of(&info, token, Some(st.config.domain.clone()))
        .map(Json)
        .ok_or_else(|| not_found(&info.id))
}

fn not_found(id: &SandboxId) -> RestError {
    RestError::not_found(format!("sandbox {id} not found"))
}

/// The sandbox `raw` names, if the caller may see it and E2B would show it (not failed or
/// deleted).
async fn visible(st: &E2bState, tenant: &Caller, raw: &str) -> RestResult<SandboxInfo> {
    let id = sandbox_id(raw)?;
    let info = sandboxes::get(&st.app, tenant, &id).await?;
    if WireState::of_sandbox(&info).is_none() {
        return Err(not_found(&info.id));
    }
    Ok(info)
}

/// The caller's sandboxes E2B would show, newest first.
async fn listed(st: &E2bState, tenant: &Caller) -> RestResult<Vec<SandboxInfo>> {
    let mut infos: Vec<SandboxInfo> =
        sandboxes::list(&st.app, tenant, &sandboxes::ListQuery::default())
            .await?
            .into_iter()
            .filter(|info| WireState::of_sandbox(info).is_some())
            .collect();
    infos.sort_by(|a, b| (b.created_at_ms, b.id.as_str()).cmp(&(a.created_at_ms, a.id.as_str())));
    Ok(infos)
}

/// `GET /v2/sandboxes?metadata=&state=&limit=&nextToken=`: one page, newest first; the next
/// page's token in `x-next-token`.
pub async fn list_v2(State(st): State<E2bState>, tenant: Caller, uri: Uri) -> RestResult<Response> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let query = list::parse(&pairs).map_err(RestError::bad_request)?;
    // Each item with the creation time and id its cursor is made of.
    let mut page: Vec<(Cursor, SandboxDetail)> = Vec::new();
    let mut more = false;
    let mut infos = listed(&st, &tenant).await?;
    if query.order == list::Order::Asc {
        infos.reverse();
    }
    for info in infos {
        if query
            .after
            .as_ref()
            .is_some_and(|c| !c.precedes(query.order, info.created_at_ms, &info.id))
        {
            continue;
        }
        let Some(detail) = SandboxDetail::of(&info, None, Some(st.config.domain.clone())) else {
            continue;
        };
        if !query.selects(
            info.created_at_ms,
            &info.template,
            &info.labels,
            detail.state,
        ) {
            continue;
        }
        if page.len() == query.limit {
            more = true;
            break;
        }
        let cursor = Cursor {
            created_at_ms: info.created_at_ms,
            id: info.id.clone(),
        };
        page.push((cursor, detail));
    }
    let next = more.then(|| page.last().map(|(c, _)| c.encode())).flatten();
    let items: Vec<SandboxDetail> = page.into_iter().map(|(_, d)| d).collect();
    Ok(list::page_response(items, next))
}

/// `GET /sandboxes` (deprecated): the running sandboxes, filtered by `metadata`.
pub async fn list_v1(
    State(st): State<E2bState>,
    tenant: Caller,
    uri: Uri,
) -> RestResult<Json<Vec<SandboxDetail>>> {
    let pairs: Vec<(String, String)> = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .filter(|(k, _)| k == "metadata")
        .collect();
    let query = list::parse(&pairs).map_err(RestError::bad_request)?;
    Ok(Json(
        listed(&st, &tenant)
            .await?
            .iter()
            .filter(|info| {
                query
                    .metadata
                    .iter()
                    .all(|(k, v)| info.labels.get(k) == Some(v))
            })
            .filter_map(|info| SandboxDetail::of(info, None, Some(st.config.domain.clone())))
            .filter(|d| d.state == WireState::Running)
            .collect(),
    ))
}

/// `DELETE /sandboxes/{id}`: 204, or 404 (the SDKs' `kill` then returns false).
pub async fn kill(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
) -> RestResult<StatusCode> {
    let id = sandbox_id(&raw)?;
    sandboxes::delete(&st.app, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `{"timeout": seconds}` (E2B's is an int32: zero or less ends the sandbox now).
#[derive(Debug, Deserialize)]
pub struct TimeoutRequest {
    timeout: i64,
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now; with `0`
/// (or less) now, as on E2B (`KeepAliveFor` of zero): its deadline is now, and the
/// reconciler's next pass (within a second) does its timeout action, as at any deadline.
pub async fn set_timeout(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    ApiJson(req): ApiJson<TimeoutRequest>,
) -> RestResult<StatusCode> {
    let info = visible(&st, &tenant, &raw).await?;
    match u64::try_from(req.timeout) {
        Ok(secs) if secs > 0 => {
            apply_timeout(&st, &tenant, &info.id, secs).await?;
        }
        _ => {
            let now = space_control::db::now_ms();
            if !st
                .app
                .db
                .expire_now(&info.id, now)
                .await
                .map_err(ApiError::from)?
            {
                return Err(ApiError::sandbox_not_found(&info.id).into());
            }
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn apply_timeout(
    st: &E2bState,
    tenant: &Caller,
    id: &SandboxId,
    secs: u64,
) -> RestResult<SandboxInfo> {
    Ok(sandboxes::set_timeout(&st.app, tenant, id, secs).await?)
}

/// `{"duration": seconds}` of a refresh.
#[derive(Debug, Default, Deserialize)]
pub struct RefreshRequest {
    #[serde(default)]
    duration: Option<u64>,
}

/// `POST /sandboxes/{id}/refreshes`: keeps the sandbox alive for `duration` more seconds
/// (never shortens it).
pub async fn refresh(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    JsonOrEmpty(req): JsonOrEmpty<RefreshRequest>,
) -> RestResult<StatusCode> {
    let info = visible(&st, &tenant, &raw).await?;
    let secs = req.duration.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if ends_later(secs, info.expires_at_ms) {
        apply_timeout(&st, &tenant, &info.id, secs).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Body of connect (`timeout`, `memory`) and of the older resume (`timeout`, `autoPause`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectRequest {
    #[serde(default)]
    timeout: Option<u64>,
    /// `false`: resume from the disk only (a cold boot), as E2B's "reboot" on resume.
    #[serde(default)]
    memory: Option<bool>,
}

/// How long a connect or resume waits for a sandbox that is on its way to a state (pausing,
/// stopping, …) to get there before acting on it.
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);
/// How often it looks meanwhile.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Whether a sandbox in `state` is between two states (an operation is under way).
fn is_transient(state: SandboxState) -> bool {
    use SandboxState::*;
    matches!(
        state,
        Creating
            | Pausing
            | Resuming
            | Stopping
            | Starting
            | Checkpointing
            | RollingBack
            | Restoring
            | Suspending
    )
}

/// Brings a paused or stopped sandbox back (waiting first for an operation under way, such
/// as the pause its timeout started, to finish); returns whether it was running already,
/// as E2B sees it (a sandbox idleness paused is running to E2B).
async fn wake(
    st: &E2bState,
    tenant: &Caller,
    info: &SandboxInfo,
    memory: bool,
) -> RestResult<bool> {
    let app = &st.app;
    let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
    let mut info = info.clone();
    while is_transient(info.state) {
        if tokio::time::Instant::now() >= deadline {
            return Err(RestError::new(
                409,
                format!("sandbox {} is still {}", info.id, info.state),
            ));
        }
        tokio::time::sleep(SETTLE_POLL).await;
        info = visible(st, tenant, info.id.as_str()).await?;
    }
    let idle = info.paused_by == Some(space_core::sandbox::PausedBy::Idle);
    match info.state {
        SandboxState::Paused if memory || idle => {
            let _ = lifecycle::resume(app, tenant, &info.id).await?;
            return Ok(idle);
        }
        SandboxState::Paused => {
            let _ = lifecycle::stop(app, tenant, &info.id).await?;
            let _ = lifecycle::start(app, tenant, &info.id).await?;
        }
        SandboxState::Stopped => {
            let _ = lifecycle::start(app, tenant, &info.id).await?;
        }
        // In object storage: restored, memory and all, on whichever node has room; to
        // come back from its disk only, it then boots again.
        SandboxState::Suspended => {
            let _ = lifecycle::resume(app, tenant, &info.id).await?;
            if !memory {
                let _ = lifecycle::stop(app, tenant, &info.id).await?;
                let _ = lifecycle::start(app, tenant, &info.id).await?;
            }
        }
        _ => return Ok(true),
    }
    Ok(false)
}

/// Whether a timeout of `secs` from now ends after `expires_at_ms`.
fn ends_later(secs: u64, expires_at_ms: i64) -> bool {
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    space_control::db::now_ms().saturating_add(secs.saturating_mul(1000)) > expires_at_ms
}

/// `POST /v2/sandboxes/{id}/connect` (and `POST /sandboxes/{id}/connect`): 200 with the
/// sandbox if it was running, 201 if it had to be resumed. `timeout` only ever extends a
/// running sandbox's end (as on E2B, whose connect keeps the later of the two ends): an
/// agent reconnecting with the default must not cut short a sandbox another one extended.
/// A resumed sandbox gets it as its new timeout.
pub async fn connect(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    JsonOrEmpty(req): JsonOrEmpty<ConnectRequest>,
) -> RestResult<(StatusCode, Json<Sandbox>)> {
    let info = visible(&st, &tenant, &raw).await?;
    let was_running = wake(&st, &tenant, &info, req.memory.unwrap_or(true)).await?;
    let info = match req.timeout {
        Some(secs) if !was_running || ends_later(secs, info.expires_at_ms) => {
            apply_timeout(&st, &tenant, &info.id, secs).await?
        }
        _ => info,
    };
    let status = if was_running {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(sandbox(&st, &info).await?)))
}

/// `POST /sandboxes/{id}/resume` (deprecated): like connect, but 409 for a running sandbox.
pub async fn resume(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    JsonOrEmpty(req): JsonOrEmpty<ConnectRequest>,
) -> RestResult<(StatusCode, Json<Sandbox>)> {
    let info = visible(&st, &tenant, &raw).await?;
    if wake(&st, &tenant, &info, req.memory.unwrap_or(true)).await? {
        return Err(RestError::new(
            409,
            format!("sandbox {} is already running", info.id),
        ));
    }
    let info = apply_timeout(
        &st,
        &tenant,
        &info.id,
        req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(sandbox(&st, &info).await?)))
}

/// Body of a pause.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseRequest {
    /// `false`: keep only the file system (SPACE's stop).
    #[serde(default)]
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204; 409 if it is not running (the SDKs then return
/// false). With an object store (SPACE's suspend), a pause is E2B's: the sandbox is
/// suspended to it, memory and all, and holds nothing on its node until `connect` resumes
/// it, on any node; without one it is SPACE's pause (its memory stays resident).
/// `memory: false` stops it (its disk kept).
pub async fn pause(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    JsonOrEmpty(req): JsonOrEmpty<PauseRequest>,
) -> RestResult<StatusCode> {
    let info = visible(&st, &tenant, &raw).await?;
    if req.memory.unwrap_or(true) {
        let idle = info.paused_by == Some(space_core::sandbox::PausedBy::Idle);
        let running = info.state == SandboxState::Running || idle;
        match (st.app.objects.is_some(), running) {
            (true, true) => {
                let _ =
                    space_control::service::suspend::suspend(&st.app, &tenant, &info.id).await?;
            }
            (true, false) => {
                return Err(RestError::new(
                    409,
                    format!("sandbox {} is not running (it is {})", info.id, info.state),
                ))
            }
            (false, _) => {
                let _ = lifecycle::pause(&st.app, &tenant, &info.id).await?;
            }
        }
    } else {
        if info.state == SandboxState::Stopped {
            return Err(RestError::new(
                409,
                format!("sandbox {} is already paused", info.id),
            ));
        }
        let _ = lifecycle::stop(&st.app, &tenant, &info.id).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Body of a fork.
#[derive(Debug, Default, Deserialize)]
pub struct ForkBody {
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    count: Option<u32>,
}

/// One child of a fork.
#[derive(Debug, Serialize)]
pub struct ForkResult {
    sandbox: Sandbox,
}

/// `POST /sandboxes/{id}/fork`: 201 with one result per child (SPACE forks all or none,
/// so no result carries an error).
pub async fn fork(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    JsonOrEmpty(req): JsonOrEmpty<ForkBody>,
) -> RestResult<(StatusCode, Json<Vec<ForkResult>>)> {
    let info = visible(&st, &tenant, &raw).await?;
    let children = lifecycle::fork(
        &st.app,
        &tenant,
        &info.id,
        ForkRequest {
            count: req.count,
            snapshot: None,
            labels: BTreeMap::new(),
            timeout_secs: Some(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS)),
        },
    )
    .await?;
    let mut made = Vec::with_capacity(children.len());
    for child in &children {
        // A child's tokens are its own (derived from its id): the parent's never work on it.
        made.push(ForkResult {
            sandbox: sandbox(&st, child).await?,
        });
    }
    Ok((StatusCode::CREATED, Json(made)))
}

/// `PUT /sandboxes/{id}/network`: the sandbox's egress policy, replaced live.
pub async fn update_network(
    State(st): State<E2bState>,
    tenant: Caller,
    Path(raw): Path<String>,
    ApiJson(net): ApiJson<NetworkConfig>,
) -> RestResult<StatusCode> {
    let info = visible(&st, &tenant, &raw).await?;
    let policy = network::egress_policy(Some(true), Some(&net))
        .map_err(RestError::bad_request)?
        .ok_or_else(|| RestError::bad_request("network: nothing to apply"))?;
    let _ = egress::set_sandbox_policy(&st.app, &tenant, &info.id, policy).await?;
    Ok(StatusCode::NO_CONTENT)
}
