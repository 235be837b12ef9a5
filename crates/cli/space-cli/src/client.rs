//! `SpaceClient`: a typed client of the SPACE HTTP API, one method per endpoint.
//!
//! Errors from the server arrive as [`ClientError::Api`] with the server's `ErrorBody`, so
//! callers match on [`ErrorCode`]s rather than on message text. Output streams are decoded
//! NDJSON; [`SpaceClient::run`] collects a whole command, reconnecting (with `after=SEQ`) if
//! the stream breaks before the process exits.

use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use reqwest::{Method, RequestBuilder, Response};
use serde::de::DeserializeOwned;
use space_core::files::watch::{WatchEvent, WatchRequest};
use space_core::files::{FileList, FileStat, MkdirRequest, RenameRequest};
use space_core::metrics::SandboxMetrics;
use space_core::process::{
    ExitStatus, OutputEvent, OutputStream, ProcessId, ProcessInfo, ProcessSpec, PtySize,
    SignalRequest, MAX_OUTPUT_LINE,
};
use space_core::sandbox::{
    CreateSandboxRequest, CreateSnapshotRequest, EventList, ForkRequest, PoolStatusList,
    SandboxInfo, SandboxList, SetTimeoutRequest, SnapshotList, SnapshotTaken,
};
use space_core::template::{
    CachedTemplate, TemplateBuildEvent, TemplateBuildStatus, TemplateCachePrune,
    TemplateCachePruneRequest, TemplateInfo,
};
use space_core::{
    ErrorBody, ErrorCode, LifecycleEntry, SandboxId, SandboxState, SnapshotDiff, SnapshotId,
    SnapshotInfo,
};
use space_guest_proto::limits::MAX_WATCH_LINE;

use space_control::api::audit::{AuditLog, AuditLogParams};
use space_control::api::credentials::{
    AuditList, CredentialInfo, CredentialList, CredentialRequest,
};
use space_control::api::quota::QuotaReport;
use space_control::service::customer_keys::{
    CustomerKeyRequest, CustomerKeyView, KeyServiceInfo, RotateRequest, Rotation,
};
use space_core::egress::EgressPolicy;

use crate::ndjson::Lines;

/// Longest error body read from the server.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error.
    #[error("{}", .body.message)]
    Api {
        /// HTTP status.
        status: u16,
        /// The server's error.
        body: ErrorBody,
    },
    /// The request could not be sent or the response not read.
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    /// The server answered something this client does not understand.
    #[error("unexpected response: {0}")]
    Protocol(String),
    /// The client was configured wrongly (bad URL...).
    #[error("{0}")]
    Config(String),
}

impl ClientError {
    /// The server's error code, for API errors.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { body, .. } => Some(body.code),
            _ => None,
        }
    }

    /// HTTP status, for API errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Result of a client call.
pub type ClientResult<T> = Result<T, ClientError>;

/// A stream of output events.
pub type EventStream = BoxStream<'static, ClientResult<OutputEvent>>;

/// A stream of file bytes.
pub type ByteStream = BoxStream<'static, ClientResult<Bytes>>;

/// A finished command, as collected by [`SpaceClient::run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutput {
    /// Process id in the sandbox.
    pub id: ProcessId,
    /// Standard output (pty output too, for pty processes).
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub status: ExitStatus,
    /// Bytes the server reported lost (client too slow).
    pub lost_bytes: u64,
}

impl RunOutput {
    /// stdout as (lossy) UTF-8.
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as (lossy) UTF-8.
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// The shell convention for an exit status: the code, or 128 + signal.
pub fn shell_exit_code(status: &ExitStatus) -> i32 {
    match (status.exit_code, status.signal) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 255,
    }
}

/// Anything that names a sandbox: `&SandboxId`, `&str`, `&String`. The server validates it;
/// the client percent-encodes it so it can never change the request path.
pub trait SandboxRef {
    /// The id as text.
    fn sandbox_ref(&self) -> &str;
}

impl SandboxRef for SandboxId {
    fn sandbox_ref(&self) -> &str {
        self.as_str()
    }
}

impl SandboxRef for str {
    fn sandbox_ref(&self) -> &str {
        self
    }
}

impl SandboxRef for String {
    fn sandbox_ref(&self) -> &str {
        self
    }
}

/// Anything that names a snapshot: `&SnapshotId`, `&str`, `&String` (validated by the
/// server, percent-encoded by the client).
pub trait SnapshotRef {
    /// The id as text.
    fn snapshot_ref(&self) -> &str;
}

impl SnapshotRef for SnapshotId {
    fn snapshot_ref(&self) -> &str {
        self.as_str()
    }
}

impl SnapshotRef for str {
    fn snapshot_ref(&self) -> &str {
        self
    }
}

impl SnapshotRef for String {
    fn snapshot_ref(&self) -> &str {
        self
    }
}

/// A directory watch.
pub type WatchStream = BoxStream<'static, ClientResult<WatchEvent>>;

/// A followed event log.
pub type LifecycleStream = BoxStream<'static, ClientResult<LifecycleEntry>>;

/// Longest line of a followed event log.
const MAX_EVENT_LINE: usize = 64 * 1024;

/// A client of one SPACE server. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SpaceClient {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
}

fn encode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Builds `?k=v&...` from optional pairs.
fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

impl SpaceClient {
    /// A client of the server at `base_url` (e.g. `http://127.0.0.1:7070`).
    pub fn new(base_url: &str, api_key: Option<String>) -> ClientResult<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        Self::with_http(http, base_url, api_key)
    }

    /// The API key this client sends, if any.
    pub fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }

    /// A client using a preconfigured `reqwest::Client`.
    pub fn with_http(
        http: reqwest::Client,
        base_url: &str,
        api_key: Option<String>,
    ) -> ClientResult<Self> {
        let base = base_url.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ClientError::Config(format!(
                "server URL must start with http:// or https://, got {base:?}"
            )));
        }
        Ok(Self {
            http,
            base,
            api_key,
        })
    }

    /// The server's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let rb = self.http.request(method, format!("{}{}", self.base, path));
        match &self.api_key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    fn sbx(id: &(impl SandboxRef + ?Sized)) -> String {
        let encoded: String =
            form_urlencoded::byte_serialize(id.sandbox_ref().as_bytes()).collect();
        format!("/v1/sandboxes/{encoded}")
    }

    /// Sends and turns non-2xx responses into [`ClientError::Api`].
    async fn send(rb: RequestBuilder) -> ClientResult<Response> {
        let resp = rb.send().await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(error_from(resp).await)
    }

    async fn json<T: DeserializeOwned>(rb: RequestBuilder) -> ClientResult<T> {
        let resp = Self::send(rb).await?;
        let bytes = resp.bytes().await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("bad JSON from the server: {e}")))
    }

    async fn empty(rb: RequestBuilder) -> ClientResult<()> {
        Self::send(rb).await.map(drop)
    }

    /// `GET /healthz`.
    pub async fn health(&self) -> ClientResult<serde_json::Value> {
        Self::json(self.request(Method::GET, "/healthz")).await
    }

    /// `GET /openapi.json`.
    pub async fn openapi(&self) -> ClientResult<serde_json::Value> {
        Self::json(self.request(Method::GET, "/openapi.json")).await
    }

    /// `GET /v1/templates`.
    pub async fn templates(&self) -> ClientResult<Vec<TemplateInfo>> {
        Self::json(self.request(Method::GET, "/v1/templates")).await
    }

    /// `GET /v1/templates/{name}`.
    pub async fn template(&self, name: &str) -> ClientResult<TemplateInfo> {
        Self::json(self.request(Method::GET, &Self::template_path(name))).await
    }

    /// `POST /v1/templates`: starts a build (the operator's); returns its first status.
    pub async fn build_template(
        &self,
        req: &serde_json::Value,
    ) -> ClientResult<TemplateBuildStatus> {
        Self::json(self.request(Method::POST, "/v1/templates").json(req)).await
    }

    /// `PUT /v1/templates/files/{sha256}`: uploads an archive of files for build steps.
    pub async fn put_build_files(
        &self,
        sha256: &str,
        body: impl Into<reqwest::Body>,
    ) -> ClientResult<serde_json::Value> {
        Self::json(
            self.request(Method::PUT, &format!("/v1/templates/files/{sha256}"))
                .header("content-type", "application/x-tar")
                .body(body),
        )
        .await
    }

    /// `GET /v1/templates/files/{sha256}`: whether an archive of files is uploaded (for
    /// this caller), as `{"sha256", "present", "size"}`.
    pub async fn build_files(&self, sha256: &str) -> ClientResult<serde_json::Value> {
        Self::json(self.request(Method::GET, &format!("/v1/templates/files/{sha256}"))).await
    }

    /// `POST /v1/templates` followed: the build's events as they come, until `ready` or
    /// `failed`.
    pub async fn build_template_followed(
        &self,
        req: &serde_json::Value,
    ) -> ClientResult<BoxStream<'static, ClientResult<TemplateBuildEvent>>> {
        let resp = Self::send(
            self.request(Method::POST, "/v1/templates")
                .header(reqwest::header::ACCEPT, "application/x-ndjson")
                .json(req),
        )
        .await?;
        Ok(decode_ndjson(resp, 64 * 1024))
    }

    /// `GET /v1/templates/builds/{id}?logs_from=N`.
    pub async fn template_build(
        &self,
        id: &str,
        logs_from: u64,
    ) -> ClientResult<TemplateBuildStatus> {
        let id: String = form_urlencoded::byte_serialize(id.as_bytes()).collect();
        Self::json(self.request(
            Method::GET,
            &format!("/v1/templates/builds/{id}?logs_from={logs_from}"),
        ))
        .await
    }

    /// `DELETE /v1/templates/{name}` (`force`: even while in use).
    pub async fn delete_template(&self, name: &str, force: bool) -> ClientResult<()> {
        Self::empty(self.request(
            Method::DELETE,
            &format!("{}?force={force}", Self::template_path(name)),
        ))
        .await
    }

    /// `GET /v1/template-cache`: every node's cached templates, least recently needed first.
    pub async fn template_cache(&self) -> ClientResult<Vec<CachedTemplate>> {
        Self::json(self.request(Method::GET, "/v1/template-cache")).await
    }

    /// `POST /v1/template-cache/prune`.
    pub async fn prune_template_cache(
        &self,
        req: &TemplateCachePruneRequest,
    ) -> ClientResult<TemplateCachePrune> {
        Self::json(
            self.request(Method::POST, "/v1/template-cache/prune")
                .json(req),
        )
        .await
    }

    fn template_path(name: &str) -> String {
        let encoded: String = form_urlencoded::byte_serialize(name.as_bytes()).collect();
        format!("/v1/templates/{encoded}")
    }

    /// `POST /v1/sandboxes`: returns once the sandbox runs.
    pub async fn create_sandbox(&self, req: &CreateSandboxRequest) -> ClientResult<SandboxInfo> {
        Self::json(self.request(Method::POST, "/v1/sandboxes").json(req)).await
    }

    /// `GET /v1/sandboxes`: the sandboxes that are not deleted, filtered by labels (all must
    /// match).
    pub async fn list_sandboxes(&self, labels: &[(&str, &str)]) -> ClientResult<SandboxList> {
        self.list_sandboxes_filtered(labels, None).await
    }

    /// `GET /v1/sandboxes?label=K=V&state=S`.
    pub async fn list_sandboxes_filtered(
        &self,
        labels: &[(&str, &str)],
        state: Option<SandboxState>,
    ) -> ClientResult<SandboxList> {
        let mut parts: Vec<(&str, Option<String>)> = labels
            .iter()
            .map(|(k, v)| ("label", Some(format!("{k}={v}"))))
            .collect();
        parts.push(("state", state.map(|s| s.as_str().to_owned())));
        Self::json(self.request(Method::GET, &format!("/v1/sandboxes{}", query(&parts)))).await
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn sandbox(&self, id: &(impl SandboxRef + ?Sized)) -> ClientResult<SandboxInfo> {
        Self::json(self.request(Method::GET, &Self::sbx(id))).await
    }

    /// `DELETE /v1/sandboxes/{id}`.
    pub async fn delete_sandbox(&self, id: &(impl SandboxRef + ?Sized)) -> ClientResult<()> {
        Self::empty(self.request(Method::DELETE, &Self::sbx(id))).await
    }

    /// `PUT /v1/sandboxes/{id}/timeout`.
    pub async fn set_timeout(
        &self,
        id: &(impl SandboxRef + ?Sized),
        timeout_secs: u64,
    ) -> ClientResult<SandboxInfo> {
        Self::json(
            self.request(Method::PUT, &format!("{}/timeout", Self::sbx(id)))
                .json(&SetTimeoutRequest { timeout_secs }),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/revoke-tokens`.
    pub async fn revoke_tokens(&self, id: &(impl SandboxRef + ?Sized)) -> ClientResult<()> {
        Self::empty(self.request(Method::POST, &format!("{}/revoke-tokens", Self::sbx(id)))).await
    }

    /// `GET /v1/sandboxes/{id}/console?bytes=N`.
    pub async fn console(
        &self,
        id: &(impl SandboxRef + ?Sized),
        bytes: Option<usize>,
    ) -> ClientResult<String> {
        let q = query(&[("bytes", bytes.map(|b| b.to_string()))]);
        let resp =
            Self::send(self.request(Method::GET, &format!("{}/console{q}", Self::sbx(id)))).await?;
        Ok(resp.text().await?)
    }

    /// `GET /v1/sandboxes/{id}/metrics?start_ms=&end_ms=`: resource-use samples, oldest first.
    pub async fn metrics(
        &self,
        id: &(impl SandboxRef + ?Sized),
        start_ms: Option<i64>,
        end_ms: Option<i64>,
    ) -> ClientResult<SandboxMetrics> {
        let q = query(&[
            ("start_ms", start_ms.map(|t| t.to_string())),
            ("end_ms", end_ms.map(|t| t.to_string())),
        ]);
        Self::json(self.request(Method::GET, &format!("{}/metrics{q}", Self::sbx(id)))).await
    }

    async fn lifecycle(
        &self,
        id: &(impl SandboxRef + ?Sized),
        op: &str,
    ) -> ClientResult<SandboxInfo> {
        Self::json(self.request(Method::POST, &format!("{}/{op}", Self::sbx(id)))).await
    }

    /// `POST /v1/sandboxes/{id}/pause`.
    pub async fn pause_sandbox(
        &self,
        id: &(impl SandboxRef + ?Sized),
    ) -> ClientResult<SandboxInfo> {
        self.lifecycle(id, "pause").await
    }

    /// `POST /v1/sandboxes/{id}/suspend`.
    pub async fn suspend_sandbox(
        &self,
        id: &(impl SandboxRef + ?Sized),
    ) -> ClientResult<SandboxInfo> {
        self.lifecycle(id, "suspend").await
    }

    /// `POST /v1/sandboxes/{id}/resume`.
    pub async fn resume_sandbox(
        &self,
        id: &(impl SandboxRef + ?Sized),
    ) -> ClientResult<SandboxInfo> {
        self.lifecycle(id, "resume").await
    }

    /// `POST /v1/sandboxes/{id}/stop`.
    pub async fn stop_sandbox(&self, id: &(impl SandboxRef + ?Sized)) -> ClientResult<SandboxInfo> {
        self.lifecycle(id, "stop").await
    }

    /// `POST /v1/sandboxes/{id}/start`.
    pub async fn start_sandbox(
        &self,
        id: &(impl SandboxRef + ?Sized),
    ) -> ClientResult<SandboxInfo> {
        self.lifecycle(id, "start").await
    }

    /// `POST /v1/sandboxes/{id}/rollback`.
    pub async fn rollback(
        &self,
        id: &(impl SandboxRef + ?Sized),
        snapshot: &(impl SnapshotRef + ?Sized),
    ) -> ClientResult<SandboxInfo> {
        Self::json(
            self.request(Method::POST, &format!("{}/rollback", Self::sbx(id)))
                .json(&serde_json::json!({ "snapshot": snapshot.snapshot_ref() })),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/fork`: returns once every child runs.
    pub async fn fork(
        &self,
        id: &(impl SandboxRef + ?Sized),
        req: &ForkRequest,
    ) -> ClientResult<SandboxList> {
        Self::json(
            self.request(Method::POST, &format!("{}/fork", Self::sbx(id)))
                .json(req),
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/events`.
    pub async fn events(&self, id: &(impl SandboxRef + ?Sized)) -> ClientResult<EventList> {
        Self::json(self.request(Method::GET, &format!("{}/events", Self::sbx(id)))).await
    }

    /// `GET /v1/sandboxes/{id}/events?follow=true`: the past entries, then new ones as they
    /// happen; ends when the sandbox is deleted.
    pub async fn follow_events(
        &self,
        id: &(impl SandboxRef + ?Sized),
    ) -> ClientResult<LifecycleStream> {
        let resp = Self::send(self.request(
            Method::GET,
            &format!("{}/events?follow=true", Self::sbx(id)),
        ))
        .await?;
        Ok(decode_ndjson(resp, MAX_EVENT_LINE))
    }

    /// `GET /v1/sandboxes/{id}/snapshots`.
    pub async fn snapshots(&self, id: &(impl SandboxRef + ?Sized)) -> ClientResult<SnapshotList> {
        Self::json(self.request(Method::GET, &format!("{}/snapshots", Self::sbx(id)))).await
    }

    /// `POST /v1/sandboxes/{id}/snapshots`.
    pub async fn create_snapshot(
        &self,
        id: &(impl SandboxRef + ?Sized),
        req: &CreateSnapshotRequest,
    ) -> ClientResult<SnapshotTaken> {
        Self::json(
            self.request(Method::POST, &format!("{}/snapshots", Self::sbx(id)))
                .json(req),
        )
        .await
    }

    /// `DELETE /v1/sandboxes/{id}/snapshots/{snapshot_id}`.
    pub async fn delete_snapshot(
        &self,
        id: &(impl SandboxRef + ?Sized),
        snapshot: &(impl SnapshotRef + ?Sized),
    ) -> ClientResult<()> {
        Self::empty(self.request(
            Method::DELETE,
            &format!(
                "{}/snapshots/{}",
                Self::sbx(id),
                encode(snapshot.snapshot_ref())
            ),
        ))
        .await
    }

    /// `GET /v1/snapshots?sandbox=&label=`: the tenant's snapshots, newest first (those of
    /// deleted sandboxes too, for persistent ones).
    pub async fn tenant_snapshots(
        &self,
        sandbox: Option<&(impl SandboxRef + ?Sized)>,
        label: Option<&str>,
    ) -> ClientResult<SnapshotList> {
        let q = query(&[
            ("sandbox", sandbox.map(|s| s.sandbox_ref().to_owned())),
            ("label", label.map(str::to_owned)),
        ]);
        Self::json(self.request(Method::GET, &format!("/v1/snapshots{q}"))).await
    }

    /// `GET /v1/snapshots/{snapshot_id}`.
    pub async fn tenant_snapshot(
        &self,
        snapshot: &(impl SnapshotRef + ?Sized),
    ) -> ClientResult<SnapshotInfo> {
        Self::json(self.request(
            Method::GET,
            &format!("/v1/snapshots/{}", encode(snapshot.snapshot_ref())),
        ))
        .await
    }

    /// `DELETE /v1/snapshots/{snapshot_id}`: wherever the snapshot is.
    pub async fn delete_tenant_snapshot(
        &self,
        snapshot: &(impl SnapshotRef + ?Sized),
    ) -> ClientResult<()> {
        Self::empty(self.request(
            Method::DELETE,
            &format!("/v1/snapshots/{}", encode(snapshot.snapshot_ref())),
        ))
        .await
    }

    /// `GET /v1/sandboxes/{id}/snapshots/diff?from=&to=&limit=`.
    pub async fn diff_snapshots(
        &self,
        id: &(impl SandboxRef + ?Sized),
        from: &(impl SnapshotRef + ?Sized),
        to: &(impl SnapshotRef + ?Sized),
        limit: Option<usize>,
    ) -> ClientResult<SnapshotDiff> {
        let q = query(&[
            ("from", Some(from.snapshot_ref().to_owned())),
            ("to", Some(to.snapshot_ref().to_owned())),
            ("limit", limit.map(|l| l.to_string())),
        ]);
        Self::json(self.request(Method::GET, &format!("{}/snapshots/diff{q}", Self::sbx(id)))).await
    }

    /// `GET /v1/pool`.
    pub async fn pool(&self) -> ClientResult<PoolStatusList> {
        Self::json(self.request(Method::GET, "/v1/pool")).await
    }

    /// `POST /v1/sandboxes/{id}/processes`.
    pub async fn start_process(
        &self,
        id: &(impl SandboxRef + ?Sized),
        spec: &ProcessSpec,
    ) -> ClientResult<ProcessInfo> {
        Self::json(
            self.request(Method::POST, &format!("{}/processes", Self::sbx(id)))
                .json(spec),
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/processes`.
    pub async fn processes(
        &self,
        id: &(impl SandboxRef + ?Sized),
    ) -> ClientResult<Vec<ProcessInfo>> {
        Self::json(self.request(Method::GET, &format!("{}/processes", Self::sbx(id)))).await
    }

    /// `GET /v1/sandboxes/{id}/processes/{pid}`.
    pub async fn process(
        &self,
        id: &(impl SandboxRef + ?Sized),
        pid: ProcessId,
    ) -> ClientResult<ProcessInfo> {
        Self::json(self.request(Method::GET, &format!("{}/processes/{pid}", Self::sbx(id)))).await
    }

    /// `GET /v1/sandboxes/{id}/processes/{pid}/output?after=SEQ`: the events after `after`.
    /// The stream ends after `exit`, or early (without `exit`) if the connection breaks.
    pub async fn output(
        &self,
        id: &(impl SandboxRef + ?Sized),
        pid: ProcessId,
        after: Option<u64>,
    ) -> ClientResult<EventStream> {
        let q = query(&[("after", after.map(|a| a.to_string()))]);
        let resp = Self::send(self.request(
            Method::GET,
            &format!("{}/processes/{pid}/output{q}", Self::sbx(id)),
        ))
        .await?;
        Ok(decode_events(resp))
    }

    /// `GET /v1/sandboxes/{id}/processes/{pid}/output?live=true`: `started`, then only the
    /// events produced from now on; ends after `exit`, or early if the connection breaks.
    pub async fn output_live(
        &self,
        id: &(impl SandboxRef + ?Sized),
        pid: ProcessId,
    ) -> ClientResult<EventStream> {
        let resp = Self::send(self.request(
            Method::GET,
            &format!("{}/processes/{pid}/output?live=true", Self::sbx(id)),
        ))
        .await?;
        Ok(decode_events(resp))
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/stdin?close=BOOL`: the body is streamed.
    pub async fn write_stdin(
        &self,
        id: &(impl SandboxRef + ?Sized),
        pid: ProcessId,
        body: impl Into<reqwest::Body>,
        close: bool,
    ) -> ClientResult<()> {
        let path = format!("{}/processes/{pid}/stdin?close={close}", Self::sbx(id));
        Self::empty(
            self.request(Method::POST, &path)
                .header("content-type", "application/octet-stream")
                .body(body),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/signal`.
    pub async fn signal(
        &self,
        id: &(impl SandboxRef + ?Sized),
        pid: ProcessId,
        signal: i32,
    ) -> ClientResult<()> {
        Self::empty(
            self.request(
                Method::POST,
                &format!("{}/processes/{pid}/signal", Self::sbx(id)),
            )
            .json(&SignalRequest { signal }),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/resize`.
    pub async fn resize(
        &self,
        id: &(impl SandboxRef + ?Sized),
        pid: ProcessId,
        size: PtySize,
    ) -> ClientResult<()> {
        Self::empty(
            self.request(
                Method::POST,
                &format!("{}/processes/{pid}/resize", Self::sbx(id)),
            )
            .json(&size),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/exec`: starts the process and streams its output; the first
    /// event is `started` (with the process id).
    pub async fn exec(
        &self,
        id: &(impl SandboxRef + ?Sized),
        spec: &ProcessSpec,
    ) -> ClientResult<EventStream> {
        let resp = Self::send(
            self.request(Method::POST, &format!("{}/exec", Self::sbx(id)))
                .json(spec),
        )
        .await?;
        Ok(decode_events(resp))
    }

    /// Runs a command to completion and collects its output (through `exec`, reconnecting
    /// to `output` if the stream breaks before the exit event).
    pub async fn run(
        &self,
        id: &(impl SandboxRef + ?Sized),
        spec: &ProcessSpec,
    ) -> ClientResult<RunOutput> {
        let mut events = self.exec(id, spec).await?;
        let mut out = RunOutput {
            id: 0,
            stdout: Vec::new(),
            stderr: Vec::new(),
            status: ExitStatus {
                exit_code: None,
                signal: None,
                timed_out: false,
            },
            lost_bytes: 0,
        };
        let mut started = false;
        let mut last_seq: Option<u64> = None;
        let mut reconnects = 0;
        loop {
            match events.next().await {
                Some(Ok(ev)) => {
                    last_seq = Some(ev.seq());
                    match &ev {
                        OutputEvent::Started { id, .. } => {
                            out.id = *id;
                            started = true;
                        }
                        OutputEvent::Data { .. } => {
                            let (stream, bytes) = ev.bytes().ok_or_else(|| {
                                ClientError::Protocol("bad base64 in a data event".into())
                            })?;
                            match stream {
                                OutputStream::Stdout | OutputStream::Pty => {
                                    out.stdout.extend_from_slice(&bytes)
                                }
                                OutputStream::Stderr => out.stderr.extend_from_slice(&bytes),
                            }
                        }
                        OutputEvent::Lost { bytes, .. } => out.lost_bytes += bytes,
                        OutputEvent::Exit { status, .. } => {
                            out.status = *status;
                            return Ok(out);
                        }
                    }
                }
                // The stream broke (or ended without `exit`): pick up where it stopped.
                Some(Err(_)) | None if started && reconnects < 5 => {
                    reconnects += 1;
                    events = self.output(id, out.id, last_seq).await?;
                }
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(ClientError::Protocol(
                        "output stream ended before the process was started".into(),
                    ))
                }
            }
        }
    }

    /// `GET /v1/sandboxes/{id}/files?path=&user=`: the size (if known) and the content.
    pub async fn read_file(
        &self,
        id: &(impl SandboxRef + ?Sized),
        path: &str,
        user: Option<&str>,
    ) -> ClientResult<(Option<u64>, ByteStream)> {
        let q = query(&[
            ("path", Some(path.to_owned())),
            ("user", user.map(str::to_owned)),
        ]);
        let resp =
            Self::send(self.request(Method::GET, &format!("{}/files{q}", Self::sbx(id)))).await?;
        let size = resp.content_length();
        Ok((size, resp.bytes_stream().map_err(ClientError::from).boxed()))
    }

    /// A whole file in memory.
    pub async fn read_file_bytes(
        &self,
        id: &(impl SandboxRef + ?Sized),
        path: &str,
        user: Option<&str>,
    ) -> ClientResult<Vec<u8>> {
        let (_, mut stream) = self.read_file(id, path, user).await?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    /// `PUT /v1/sandboxes/{id}/files?path=&user=&mode=`: the body is streamed.
    pub async fn write_file(
        &self,
        id: &(impl SandboxRef + ?Sized),
        path: &str,
        user: Option<&str>,
        mode: Option<u32>,
        body: impl Into<reqwest::Body>,
    ) -> ClientResult<FileStat> {
        let q = query(&[
            ("path", Some(path.to_owned())),
            ("user", user.map(str::to_owned)),
            ("mode", mode.map(|m| format!("{m:04o}"))),
        ]);
        Self::json(
            self.request(Method::PUT, &format!("{}/files{q}", Self::sbx(id)))
                .header("content-type", "application/octet-stream")
                .body(body),
        )
        .await
    }

    /// `DELETE /v1/sandboxes/{id}/files?path=&recursive=&user=`.
    pub async fn remove_file(
        &self,
        id: &(impl SandboxRef + ?Sized),
        path: &str,
        recursive: bool,
        user: Option<&str>,
    ) -> ClientResult<()> {
        let q = query(&[
            ("path", Some(path.to_owned())),
            ("recursive", Some(recursive.to_string())),
            ("user", user.map(str::to_owned)),
        ]);
        Self::empty(self.request(Method::DELETE, &format!("{}/files{q}", Self::sbx(id)))).await
    }

    /// `GET /v1/sandboxes/{id}/files/stat?path=&user=`.
    pub async fn stat(
        &self,
        id: &(impl SandboxRef + ?Sized),
        path: &str,
        user: Option<&str>,
    ) -> ClientResult<FileStat> {
        let q = query(&[
            ("path", Some(path.to_owned())),
            ("user", user.map(str::to_owned)),
        ]);
        Self::json(self.request(Method::GET, &format!("{}/files/stat{q}", Self::sbx(id)))).await
    }

    /// `GET /v1/sandboxes/{id}/files/watch?path=&recursive=&user=`: `started` once the
    /// watch is in place, then the changes; ends after the directory's own removal, or early
    /// if the connection breaks.
    pub async fn watch(
        &self,
        id: &(impl SandboxRef + ?Sized),
        req: &WatchRequest,
    ) -> ClientResult<WatchStream> {
        let q = query(&[
            ("path", Some(req.path.clone())),
            ("recursive", Some(req.recursive.to_string())),
            ("user", req.user.clone()),
        ]);
        let resp =
            Self::send(self.request(Method::GET, &format!("{}/files/watch{q}", Self::sbx(id))))
                .await?;
        Ok(decode_ndjson(resp, MAX_WATCH_LINE))
    }

    /// `GET /v1/sandboxes/{id}/files/list?path=&depth=&user=`.
    pub async fn list_files(
        &self,
        id: &(impl SandboxRef + ?Sized),
        path: &str,
        depth: Option<u32>,
        user: Option<&str>,
    ) -> ClientResult<FileList> {
        let q = query(&[
            ("path", Some(path.to_owned())),
            ("depth", depth.map(|d| d.to_string())),
            ("user", user.map(str::to_owned)),
        ]);
        Self::json(self.request(Method::GET, &format!("{}/files/list{q}", Self::sbx(id)))).await
    }

    /// `POST /v1/sandboxes/{id}/files/mkdir`.
    pub async fn mkdir(
        &self,
        id: &(impl SandboxRef + ?Sized),
        req: &MkdirRequest,
    ) -> ClientResult<FileStat> {
        Self::json(
            self.request(Method::POST, &format!("{}/files/mkdir", Self::sbx(id)))
                .json(req),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/files/rename`.
    pub async fn rename(
        &self,
        id: &(impl SandboxRef + ?Sized),
        req: &RenameRequest,
    ) -> ClientResult<()> {
        Self::empty(
            self.request(Method::POST, &format!("{}/files/rename", Self::sbx(id)))
                .json(req),
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}/egress-policy`.
    pub async fn egress_policy(
        &self,
        id: &(impl SandboxRef + ?Sized),
    ) -> ClientResult<EgressPolicy> {
        Self::json(self.request(Method::GET, &format!("{}/egress-policy", Self::sbx(id)))).await
    }

    /// `PUT /v1/sandboxes/{id}/egress-policy`: takes effect at once.
    pub async fn set_egress_policy(
        &self,
        id: &(impl SandboxRef + ?Sized),
        policy: &EgressPolicy,
    ) -> ClientResult<EgressPolicy> {
        Self::json(
            self.request(Method::PUT, &format!("{}/egress-policy", Self::sbx(id)))
                .json(policy),
        )
        .await
    }

    /// `GET /v1/egress-policy`: the tenant's default (404 when it has none).
    pub async fn default_egress_policy(&self) -> ClientResult<EgressPolicy> {
        Self::json(self.request(Method::GET, "/v1/egress-policy")).await
    }

    /// `PUT /v1/egress-policy` (`Some`) or `DELETE` it (`None`).
    pub async fn set_default_egress_policy(
        &self,
        policy: Option<&EgressPolicy>,
    ) -> ClientResult<()> {
        match policy {
            Some(p) => Self::empty(self.request(Method::PUT, "/v1/egress-policy").json(p)).await,
            None => Self::empty(self.request(Method::DELETE, "/v1/egress-policy")).await,
        }
    }

    /// `GET /v1/customer-key/services`: the key services a customer key may be at.
    pub async fn key_services(&self) -> ClientResult<Vec<KeyServiceInfo>> {
        Self::json(self.request(Method::GET, "/v1/customer-key/services")).await
    }

    /// `GET /v1/customer-key` (404 when the tenant has none).
    pub async fn customer_key(&self) -> ClientResult<CustomerKeyView> {
        Self::json(self.request(Method::GET, "/v1/customer-key")).await
    }

    /// `PUT /v1/customer-key`: registers the tenant's customer key.
    pub async fn set_customer_key(
        &self,
        req: &CustomerKeyRequest,
    ) -> ClientResult<CustomerKeyView> {
        Self::json(self.request(Method::PUT, "/v1/customer-key").json(req)).await
    }

    /// `POST /v1/customer-key/check`: asks its key service now.
    pub async fn check_customer_key(&self) -> ClientResult<CustomerKeyView> {
        Self::json(self.request(Method::POST, "/v1/customer-key/check")).await
    }

    /// `POST /v1/customer-key/rotate`.
    pub async fn rotate_customer_key(&self, req: &RotateRequest) -> ClientResult<Rotation> {
        Self::json(
            self.request(Method::POST, "/v1/customer-key/rotate")
                .json(req),
        )
        .await
    }

    /// `DELETE /v1/customer-key`.
    pub async fn remove_customer_key(&self) -> ClientResult<()> {
        Self::empty(self.request(Method::DELETE, "/v1/customer-key")).await
    }

    /// `POST /v1/credentials`.
    pub async fn create_credential(&self, req: &CredentialRequest) -> ClientResult<CredentialInfo> {
        Self::json(self.request(Method::POST, "/v1/credentials").json(req)).await
    }

    /// `PUT /v1/credentials/{id}`.
    pub async fn replace_credential(
        &self,
        id: &str,
        req: &CredentialRequest,
    ) -> ClientResult<CredentialInfo> {
        Self::json(
            self.request(Method::PUT, &format!("/v1/credentials/{}", encode(id)))
                .json(req),
        )
        .await
    }

    /// `GET /v1/credentials`.
    pub async fn credentials(&self) -> ClientResult<CredentialList> {
        Self::json(self.request(Method::GET, "/v1/credentials")).await
    }

    /// `GET /v1/credentials/{id}`.
    pub async fn credential(&self, id: &str) -> ClientResult<CredentialInfo> {
        Self::json(self.request(Method::GET, &format!("/v1/credentials/{}", encode(id)))).await
    }

    /// `DELETE /v1/credentials/{id}`.
    pub async fn delete_credential(&self, id: &str) -> ClientResult<()> {
        Self::empty(self.request(Method::DELETE, &format!("/v1/credentials/{}", encode(id)))).await
    }

    /// `GET /v1/audit/credentials?sandbox=&credential=&since_ms=&limit=`.
    pub async fn credential_audit(
        &self,
        sandbox: Option<&str>,
        credential: Option<&str>,
        since_ms: Option<i64>,
        limit: Option<usize>,
    ) -> ClientResult<AuditList> {
        let q = query(&[
            ("sandbox", sandbox.map(str::to_owned)),
            ("credential", credential.map(str::to_owned)),
            ("since_ms", since_ms.map(|v| v.to_string())),
            ("limit", limit.map(|v| v.to_string())),
        ]);
        Self::json(self.request(Method::GET, &format!("/v1/audit/credentials{q}"))).await
    }

    /// `GET /v1/quota`: the caller's limits and usage.
    pub async fn my_quota(&self) -> ClientResult<QuotaReport> {
        Self::json(self.request(Method::GET, "/v1/quota")).await
    }

    /// `GET /v1/tenants/{tenant}/quota` (the operator's key).
    pub async fn tenant_quota(&self, tenant: &str) -> ClientResult<QuotaReport> {
        Self::json(self.request(
            Method::GET,
            &format!("/v1/tenants/{}/quota", encode(tenant)),
        ))
        .await
    }

    /// `PUT /v1/tenants/{tenant}/quota` (the operator's key).
    pub async fn set_tenant_quota(
        &self,
        tenant: &str,
        quota: &space_core::quota::TenantQuota,
    ) -> ClientResult<QuotaReport> {
        Self::json(
            self.request(
                Method::PUT,
                &format!("/v1/tenants/{}/quota", encode(tenant)),
            )
            .json(quota),
        )
        .await
    }

    /// `DELETE /v1/tenants/{tenant}/quota` (the operator's key).
    pub async fn clear_tenant_quota(&self, tenant: &str) -> ClientResult<()> {
        Self::empty(self.request(
            Method::DELETE,
            &format!("/v1/tenants/{}/quota", encode(tenant)),
        ))
        .await
    }

    /// `GET /v1/nodes`.
    pub async fn nodes(&self) -> ClientResult<space_core::cluster::NodeList> {
        Self::json(self.request(Method::GET, "/v1/nodes")).await
    }

    /// `POST /v1/nodes/join-tokens`.
    pub async fn create_join_token(
        &self,
        req: &space_core::cluster::CreateJoinTokenRequest,
    ) -> ClientResult<space_core::cluster::JoinTokenCreated> {
        Self::json(
            self.request(Method::POST, "/v1/nodes/join-tokens")
                .json(req),
        )
        .await
    }

    /// `POST /v1/nodes/{name}/cordon` (`cordoned`) or `/uncordon`.
    pub async fn set_node_cordoned(
        &self,
        name: &str,
        cordoned: bool,
    ) -> ClientResult<space_core::cluster::NodeInfo> {
        let verb = if cordoned { "cordon" } else { "uncordon" };
        Self::json(self.request(Method::POST, &format!("/v1/nodes/{}/{verb}", encode(name)))).await
    }

    /// `POST /v1/nodes/{name}/drain`: returns once every sandbox of the node has moved or
    /// failed to.
    pub async fn drain_node(&self, name: &str) -> ClientResult<space_core::cluster::DrainReport> {
        Self::json(self.request(Method::POST, &format!("/v1/nodes/{}/drain", encode(name)))).await
    }

    /// `DELETE /v1/nodes/{name}`.
    pub async fn remove_node(&self, name: &str) -> ClientResult<()> {
        Self::empty(self.request(Method::DELETE, &format!("/v1/nodes/{}", encode(name)))).await
    }

    /// `GET /v1/audit`: a page of the caller's action log.
    pub async fn audit_log(&self, params: &AuditLogParams) -> ClientResult<AuditLog> {
        Self::json(self.request(Method::GET, "/v1/audit").query(params)).await
    }
}

/// Reads an error response into [`ClientError::Api`] (bounded).
async fn error_from(resp: Response) -> ClientError {
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_ERROR_BODY {
            body.truncate(MAX_ERROR_BODY);
            break;
        }
    }
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(body) => ClientError::Api { status, body },
        Err(_) => {
            let text = String::from_utf8_lossy(&body)
                .chars()
                .take(200)
                .collect::<String>();
            let code = match status {
                401 => ErrorCode::Unauthenticated,
                404 => ErrorCode::NotFound,
                413 => ErrorCode::PayloadTooLarge,
                400..=499 => ErrorCode::InvalidRequest,
                _ => ErrorCode::Internal,
            };
            ClientError::Api {
                status,
                body: ErrorBody::new(code, format!("HTTP {status}: {text}")),
            }
        }
    }
}

/// Decodes an NDJSON response into output events.
fn decode_events(resp: Response) -> EventStream {
    decode_ndjson(resp, MAX_OUTPUT_LINE)
}

/// Decodes an NDJSON response into values (empty keep-alive lines are skipped); a bad line
/// ends the stream with an error.
fn decode_ndjson<T: DeserializeOwned + Send + 'static>(
    resp: Response,
    max_line: usize,
) -> BoxStream<'static, ClientResult<T>> {
    let bytes = resp.bytes_stream();
    futures::stream::unfold(
        (bytes, Lines::new(max_line), false),
        |(mut bytes, mut lines, done)| async move {
            if done {
                return None;
            }
            loop {
                match lines.next_line() {
                    Ok(Some(line)) => {
                        let ev = serde_json::from_slice::<T>(&line)
                            .map_err(|e| ClientError::Protocol(format!("bad NDJSON line: {e}")));
                        let stop = ev.is_err();
                        return Some((ev, (bytes, lines, stop)));
                    }
                    Ok(None) => {}
                    Err(e) => {
                        return Some((
                            Err(ClientError::Protocol(e.to_string())),
                            (bytes, lines, true),
                        ))
                    }
                }
                match bytes.next().await {
                    Some(Ok(chunk)) => lines.push(&chunk),
                    Some(Err(e)) => return Some((Err(ClientError::Http(e)), (bytes, lines, true))),
                    None => {
                        let last = lines.finish()?;
                        let ev = serde_json::from_slice::<T>(&last)
                            .map_err(|e| ClientError::Protocol(format!("bad NDJSON line: {e}")));
                        return Some((ev, (bytes, lines, true)));
                    }
                }
            }
        },
    )
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_encoded() {
        assert_eq!(
            query(&[("path", Some("/a b&c".into())), ("user", None)]),
            "?path=%2Fa+b%26c"
        );
        assert_eq!(query(&[("user", None)]), "");
    }

    #[test]
    fn exit_codes() {
        let st = |exit_code, signal| ExitStatus {
            exit_code,
            signal,
            timed_out: false,
        };
        assert_eq!(shell_exit_code(&st(Some(3), None)), 3);
        assert_eq!(shell_exit_code(&st(None, Some(9))), 137);
    }

    #[test]
    fn urls_are_checked() {
        assert!(SpaceClient::new("127.0.0.1:7070", None).is_err());
        assert_eq!(
            SpaceClient::new("http://h:1/", None).unwrap().base_url(),
            "http://h:1"
        );
    }
}
