//! The E2B REST control API (`docs/e2b-compat.md`, section 2): its wire types and their
//! mapping from SPACE's (the error body with an *integer* `code`, which the JS SDK reads
//! instead of the status; the create request; the sandbox as `Sandbox`, `SandboxDetail` and
//! `ListedSandbox`), and [`router`], the handlers in [`sandboxes`] and [`snapshots`] behind
//! the API key check ([`auth`]), SPACE's idempotency keys and E2B's error bodies
//! ([`error`]).

pub mod auth;
pub mod error;
pub mod list;
pub mod logs;
pub mod metrics;
pub mod network;
pub mod sandboxes;
pub mod snapshots;
pub mod stored_tokens;
pub mod templates;

use axum::extract::{FromRequest, Request};
use axum::routing::{delete, get, post, put};
use axum::{middleware, Router};
use space_control::api::action_log;
use space_control::api::error::ApiError;
use space_control::api::extract::read_limited;
use space_control::api::idempotency::{self, Idempotency};

use crate::state::E2bState as SharedState;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use space_core::sandbox::{PausedBy, SandboxInfo, TimeoutAction};
use space_core::{ErrorCode, SandboxState};

use crate::timestamp::rfc3339;
use space_core::error::excerpt;

/// The envd version SPACE reports: the highest the pinned SDKs gate features on (default
/// user, `CloseStdin`, octet-stream uploads, file metadata, watch entries).
pub const ENVD_VERSION: &str = "0.6.4";
/// E2B's default sandbox timeout, seconds (SPACE's own default is longer).
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// An error response: `{"code": 404, "message": "…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct E2bError {
    /// The HTTP status, repeated in the body.
    pub code: u16,
    /// What went wrong.
    pub message: String,
}

impl E2bError {
    /// The E2B form of a SPACE error: the status the SDKs map to the same exception
    /// (`insufficient_capacity` becomes 503, which they raise as "service busy").
    pub fn from_native(code: ErrorCode, message: impl Into<String>) -> E2bError {
        let status = match code {
            ErrorCode::InsufficientCapacity => 503,
            other => other.http_status(),
        };
        E2bError {
            code: status,
            message: message.into(),
        }
    }
}

/// `POST /v2/sandboxes`. Fields SPACE cannot honour (`mcp`, `volumeMounts`, …) are
/// refused by the handler, not silently dropped: unknown fields are kept to be checked.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// Template name (or alias).
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox is killed (or paused, with `autoPause`).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Free-form labels.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Environment of every process.
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    /// Pause instead of kill when the timeout passes.
    #[serde(default)]
    pub auto_pause: bool,
    /// `false`: no egress at all.
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Whether envd requests need the access token (Python SDK 2.63 always asks for it).
    #[serde(default)]
    pub secure: Option<bool>,
    /// Everything else the SDK sent, for the handler to refuse what it cannot do.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// A sandbox as `create` and `connect` return it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    /// Template name.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Sandbox id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Any constant (the node's name).
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// [`ENVD_VERSION`].
    pub envd_version: String,
    /// The token envd requests must carry (`X-Access-Token`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// The domain `get_host(port)` builds host names under (may carry a port).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// What requests to the sandbox's ports must carry when they are private.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
}

/// E2B's two states: everything that is not running is `paused` to the SDKs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum E2bState {
    /// Running (or coming up).
    Running,
    /// Paused, stopped, or on the way there.
    Paused,
}

impl E2bState {
    /// The E2B state of a SPACE sandbox. A sandbox idleness paused is running to E2B: it
    /// wakes on the next request by itself, which is what E2B's running sandboxes do.
    pub fn of_sandbox(info: &SandboxInfo) -> Option<E2bState> {
        if info.state == SandboxState::Paused && info.paused_by == Some(PausedBy::Idle) {
            return Some(E2bState::Running);
        }
        E2bState::of(info.state)
    }

    /// The E2B state of a SPACE state; `None` for sandboxes the SDKs must not see (failed,
    /// deleted, deleting): those are "not found" to them.
    pub fn of(state: SandboxState) -> Option<E2bState> {
        use SandboxState::*;
        match state {
            Creating | Running | Resuming | Starting | Checkpointing | RollingBack | Restoring => {
                Some(E2bState::Running)
            }
            Pausing | Paused | Stopping | Stopped | Suspending | Suspended => {
                Some(E2bState::Paused)
            }
            // Its node missed its heartbeats: the sandbox still exists and comes back with
            // the node (E2B has no word for that; "not found" would make a client recreate
            // it). Calls to it are answered 503 meanwhile.
            Lost => Some(E2bState::Running),
            Deleting | Deleted | Failed => None,
        }
    }
}

/// `GET /sandboxes/{id}` (and, without the token, one item of `GET /v2/sandboxes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    /// Template name.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Sandbox id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// The node's name.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// Creation time, RFC 3339.
    pub started_at: String,
    /// When its timeout passes, RFC 3339.
    pub end_at: String,
    /// [`ENVD_VERSION`].
    pub envd_version: String,
    /// vCPUs.
    pub cpu_count: u32,
    /// Memory, MiB.
    #[serde(rename = "memoryMB")]
    pub memory_mb: u32,
    /// Root disk, MiB.
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u32,
    /// Running or paused.
    pub state: E2bState,
    /// Labels.
    pub metadata: BTreeMap<String, String>,
    /// Present in `GET /sandboxes/{id}` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// The domain sandbox hosts are named under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// What its timeout does.
    pub lifecycle: Lifecycle,
}

/// What a sandbox's timeout does, as E2B says it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Whether the next request resumes a sandbox its timeout paused.
    pub auto_resume: bool,
    /// `kill` (SPACE's delete) or `pause` (SPACE's pause, or its stop for a file-system-only
    /// pause).
    pub on_timeout: String,
}

impl Lifecycle {
    fn of(info: &SandboxInfo) -> Lifecycle {
        Lifecycle {
            auto_resume: info.auto_resume,
            on_timeout: match info.on_timeout {
                TimeoutAction::Delete => "kill",
                TimeoutAction::Pause | TimeoutAction::Stop => "pause",
            }
            .to_owned(),
        }
    }
}

impl SandboxDetail {
    /// The E2B view of a SPACE sandbox; `None` when the SDKs must not see it (see
    /// [`E2bState::of`]).
    pub fn of(
        info: &SandboxInfo,
        token: Option<String>,
        domain: Option<String>,
    ) -> Option<SandboxDetail> {
        Some(SandboxDetail {
            template_id: info.template.clone(),
            sandbox_id: info.id.to_string(),
            client_id: info.node.clone(),
            started_at: rfc3339(info.created_at_ms),
            end_at: rfc3339(info.expires_at_ms),
            envd_version: ENVD_VERSION.to_owned(),
            cpu_count: info.resources.vcpus,
            memory_mb: info.resources.memory_mib,
            disk_size_mb: info.resources.disk_mib,
            state: E2bState::of_sandbox(info)?,
            metadata: info.labels.clone(),
            envd_access_token: token,
            domain,
            lifecycle: Lifecycle::of(info),
        })
    }
}

/// A JSON body that may be absent (an empty body is `T::default()`), at most SPACE's JSON
/// limit; unknown fields are ignored, as the SDKs add fields over time.
#[derive(Debug, Clone, Default)]
pub struct JsonOrEmpty<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Default> FromRequest<S> for JsonOrEmpty<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        let bytes = read_limited(
            &parts.headers,
            body,
            space_control::api::extract::MAX_JSON_BODY,
        )
        .await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(JsonOrEmpty(T::default()));
        }
        serde_json::from_slice(&bytes)
            .map(JsonOrEmpty)
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
    }
}

/// The E2B REST API: every route authenticated by API key, mutating ones idempotent by
/// `Idempotency-Key` as in `/v1`, every error in E2B's shape.
pub fn router(st: SharedState) -> Router {
    Router::new()
        .route(
            "/sandboxes",
            post(sandboxes::create).get(sandboxes::list_v1),
        )
        .route(
            "/v2/sandboxes",
            post(sandboxes::create).get(sandboxes::list_v2),
        )
        .route(
            "/sandboxes/{id}",
            get(sandboxes::get).delete(sandboxes::kill),
        )
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(sandboxes::refresh))
        .route("/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/v2/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/fork", post(sandboxes::fork))
        .route("/sandboxes/{id}/network", put(sandboxes::update_network))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/sandboxes/{id}/logs", get(logs::v1))
        .route("/sandboxes/{id}/metrics", get(metrics::sandbox))
        .route("/sandboxes/metrics", get(metrics::latest))
        .route("/v2/sandboxes/{id}/logs", get(logs::v2))
        .route("/snapshots", get(snapshots::list))
        .route("/templates/{id}", delete(snapshots::delete))
        .route("/v3/templates", post(templates::request_build))
        .route("/v2/templates", post(templates::request_build))
        .route("/templates/{id}/files/{hash}", get(templates::files_link))
        .route(
            "/v2/templates/{id}/builds/{build}",
            post(templates::start_build),
        )
        .route(
            "/templates/{id}/builds/{build}/status",
            get(templates::build_status),
        )
        .route("/templates/aliases/{alias}", get(templates::alias))
        // The layer added last runs first: the key, its request rate, idempotency (scoped to
        // its tenant), then the action log.
        .route_layer(middleware::from_fn_with_state(
            st.app.db.clone(),
            action_log::record,
        ))
        .route_layer(middleware::from_fn_with_state(
            Idempotency::with_credentials(
                st.app.db.clone(),
                st.app.replica.clone(),
                Arc::new(stored_tokens::StoredTokens(st.clone())),
            ),
            idempotency::idempotency,
        ))
        .route_layer(middleware::from_fn_with_state(
            st.app.clone(),
            space_control::api::quota::rate_limit,
        ))
        .route_layer(middleware::from_fn_with_state(
            st.clone(),
            auth::require_api_key,
        ))
        // Signed, like the presigned URLs E2B hands out: no API key (see `templates`).
        .route(
            "/templates/files/upload/{tenant}/{hash}",
            put(templates::upload_files),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(error::e2b_error_bodies))
        .with_state(st)
}

async fn not_found(req: Request) -> error::RestError {
    error::RestError::not_found(format!(
        "no route for {} {} (SPACE serves the E2B sandbox API and template builds; template tags, volumes and secrets are managed with SPACE's own API)",
        req.method(),
        excerpt(req.uri().path(), 128)
    ))
}

async fn method_not_allowed(req: Request) -> error::RestError {
    error::RestError::new(
        405,
        format!(
            "method {} is not allowed on {}",
            req.method(),
            excerpt(req.uri().path(), 128)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_the_status_as_an_integer_code() {
        let e = E2bError::from_native(ErrorCode::NotFound, "sandbox x not found");
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            serde_json::json!({"code": 404, "message": "sandbox x not found"})
        );
        assert_eq!(
            E2bError::from_native(ErrorCode::InsufficientCapacity, "").code,
            503
        );
        assert_eq!(
            E2bError::from_native(ErrorCode::Unauthenticated, "").code,
            401
        );
        assert_eq!(
            E2bError::from_native(ErrorCode::InvalidRequest, "").code,
            400
        );
    }

    #[test]
    fn create_requests_parse_as_the_sdks_send_them() {
        let req: NewSandbox = serde_json::from_value(serde_json::json!({
            "templateID": "base", "timeout": 60, "metadata": {"user": "a"},
            "envVars": {"K": "v"}, "autoPause": true, "allow_internet_access": false,
            "secure": true, "mcp": {"x": 1}
        }))
        .unwrap();
        assert_eq!(req.template_id, "base");
        assert_eq!(req.timeout, Some(60));
        assert_eq!(req.env_vars["K"], "v");
        assert!(req.auto_pause);
        assert_eq!(req.allow_internet_access, Some(false));
        assert!(req.other.contains_key("mcp"), "kept, to be refused");
        let minimal: NewSandbox =
            serde_json::from_value(serde_json::json!({"templateID": "base"})).unwrap();
        assert_eq!((minimal.timeout, minimal.auto_pause), (None, false));
        assert!(serde_json::from_value::<NewSandbox>(serde_json::json!({})).is_err());
    }

    #[test]
    fn states_collapse_to_running_and_paused() {
        assert_eq!(
            E2bState::of(SandboxState::Creating),
            Some(E2bState::Running)
        );
        assert_eq!(E2bState::of(SandboxState::Stopped), Some(E2bState::Paused));
        assert_eq!(E2bState::of(SandboxState::Pausing), Some(E2bState::Paused));
        assert_eq!(E2bState::of(SandboxState::Failed), None);
        assert_eq!(E2bState::of(SandboxState::Deleted), None);
    }

    #[test]
    fn details_use_e2b_names_and_rfc3339() {
        let info: SandboxInfo = serde_json::from_value(serde_json::json!({
            "id": "sbx-abcdefghij0123456789", "template": "base", "template_digest": "d",
            "state": "paused", "resources": {"vcpus": 2, "memory_mib": 512, "disk_mib": 4096},
            "labels": {"k": "v"}, "env_keys": [], "node": "local",
            "created_at_ms": 1_764_417_600_000_i64, "expires_at_ms": 1_764_417_900_500_i64
        }))
        .unwrap();
        let d = SandboxDetail::of(&info, None, None).unwrap();
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["sandboxID"], "sbx-abcdefghij0123456789");
        assert_eq!(json["templateID"], "base");
        assert_eq!(json["memoryMB"], 512);
        assert_eq!(json["diskSizeMB"], 4096);
        assert_eq!(json["cpuCount"], 2);
        assert_eq!(json["state"], "paused");
        assert_eq!(json["startedAt"], "2025-11-29T12:00:00Z");
        assert_eq!(json["endAt"], "2025-11-29T12:05:00.5Z");
        assert!(json.get("envdAccessToken").is_none());
    }
}
