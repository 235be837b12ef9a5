//! Request extractors that answer in our `ErrorBody` format.
//!
//! axum's own extractors reject with plain-text bodies and their own status codes (415,
//! 422...). These wrappers keep one error format: bad JSON, unknown fields, bad queries and
//! malformed ids are all `400 invalid_request` with the parser's message; an oversized JSON
//! body is `413 payload_too_large`.

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use space_core::process::ProcessId;
use space_core::{SandboxId, SnapshotId};

use super::error::ApiError;
use space_core::error::excerpt;

/// Largest JSON request body.
pub const MAX_JSON_BODY: usize = 1024 * 1024;

/// A JSON body, at most [`MAX_JSON_BODY`] bytes, parsed strictly.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, ApiError> {
        if let Some(ct) = req.headers().get(CONTENT_TYPE) {
            let ct = ct.to_str().unwrap_or("");
            let essence = ct.split(';').next().unwrap_or("").trim();
            if !(essence.eq_ignore_ascii_case("application/json") || essence.ends_with("+json")) {
                return Err(ApiError::invalid(format!(
                    "expected Content-Type: application/json, got {essence:?}"
                )));
            }
        }
        let (parts, body) = req.into_parts();
        let bytes = read_limited(&parts.headers, body, MAX_JSON_BODY).await?;
        serde_json::from_slice(&bytes)
            .map(ApiJson)
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
    }
}

/// Reads a whole body, refusing more than `limit` bytes (by `Content-Length` up front, and by
/// counting, since the header may be absent or lie).
pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    if let Some(len) = content_length(headers) {
        if len > limit as u64 {
            return Err(ApiError::too_large(format!(
                "body of {len} bytes is larger than the limit of {limit}"
            )));
        }
    }
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::invalid(format!("reading the request body: {e}")))?;
        if buf.len() + chunk.len() > limit {
            return Err(ApiError::too_large(format!(
                "body is larger than the limit of {limit} bytes"
            )));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf.freeze())
}

/// The `Content-Length` header, if present and numeric.
pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A query string parsed into `T` (unknown parameters are refused if `T` denies them).
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Query::<T>::try_from_uri(&parts.uri)
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e| ApiError::invalid(format!("invalid query: {}", e.body_text())))
    }
}

/// The `{id}` of `/v1/sandboxes/{id}/...`, parsed.
#[derive(Debug, Clone)]
pub struct SandboxPath(pub SandboxId);

impl<S: Send + Sync> FromRequestParts<S> for SandboxPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(e.body_text()))?;
        Ok(SandboxPath(sandbox_param(&params)?))
    }
}

/// The `{id}` and `{pid}` of `/v1/sandboxes/{id}/processes/{pid}/...`, parsed.
#[derive(Debug, Clone)]
pub struct ProcessPath(pub SandboxId, pub ProcessId);

impl<S: Send + Sync> FromRequestParts<S> for ProcessPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(e.body_text()))?;
        let id = sandbox_param(&params)?;
        let pid = param(&params, "pid")?;
        let pid = pid.parse::<ProcessId>().map_err(|_| {
            ApiError::invalid(format!("malformed process id {:?}", excerpt(pid, 64)))
        })?;
        Ok(ProcessPath(id, pid))
    }
}

/// The `{id}` and `{snapshot_id}` of `/v1/sandboxes/{id}/snapshots/{snapshot_id}`, parsed.
#[derive(Debug, Clone)]
pub struct SnapshotPath(pub SandboxId, pub SnapshotId);

impl<S: Send + Sync> FromRequestParts<S> for SnapshotPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(e.body_text()))?;
        let id = sandbox_param(&params)?;
        let snap = parse_snapshot_id(param(&params, "snapshot_id")?)?;
        Ok(SnapshotPath(id, snap))
    }
}

/// The `{snapshot_id}` of `/v1/snapshots/{snapshot_id}`, parsed.
#[derive(Debug, Clone)]
pub struct SnapshotIdPath(pub SnapshotId);

impl<S: Send + Sync> FromRequestParts<S> for SnapshotIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiError::invalid(e.body_text()))?;
        Ok(SnapshotIdPath(parse_snapshot_id(param(
            &params,
            "snapshot_id",
        )?)?))
    }
}

/// Parses a snapshot id from a path or query: `400 invalid_request` if malformed.
pub fn parse_snapshot_id(raw: &str) -> Result<SnapshotId, ApiError> {
    raw.parse::<SnapshotId>()
        .map_err(|e| ApiError::invalid(format!("bad snapshot id {:?}: {e}", excerpt(raw, 64))))
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Result<&'a str, ApiError> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| ApiError::internal(format!("route has no {{{name}}} parameter")))
}

fn sandbox_param(params: &[(String, String)]) -> Result<SandboxId, ApiError> {
    parse_sandbox_id(param(params, "id")?)
}

/// Parses a sandbox id from a path or query: `400 invalid_request` if malformed.
pub fn parse_sandbox_id(raw: &str) -> Result<SandboxId, ApiError> {
    raw.parse::<SandboxId>()
        .map_err(|e| ApiError::invalid(format!("bad sandbox id {:?}: {e}", excerpt(raw, 64))))
}
