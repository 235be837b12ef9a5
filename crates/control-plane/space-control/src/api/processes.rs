//! Processes in a sandbox: start, list, inspect, stream output, stdin, signals, pty resize,
//! and `exec` (start + output in one request).
//!
//! Output is NDJSON, one `OutputEvent` per line. If the stream breaks (network, guest), the
//! response ends without an `exit` event and the client reconnects with `after=<last seq>`.

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use space_core::process::{
    OutputEvent, ProcessInfo, ProcessSpec, ProcessSpecError, PtySize, SignalRequest,
};
use space_core::ErrorBody;
use space_guest_client::GuestError;
use utoipa::IntoParams;

use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, ApiQuery, ProcessPath, SandboxPath};
use super::AppState;
use crate::service::Caller;

/// Content type of output streams.
pub const NDJSON: &str = "application/x-ndjson";

/// Checks a spec; path problems are `invalid_path`, the rest `invalid_request`.
pub fn validate_spec(spec: &ProcessSpec) -> Result<(), ApiError> {
    spec.validate().map_err(|e| match e {
        ProcessSpecError::Cwd(p) => ApiError::invalid_path(format!("bad cwd: {p}")),
        other => ApiError::invalid(other.to_string()),
    })
}

/// A stream of events (the guest's output or watch events, a followed build's) as an
/// NDJSON response body; an error ends the body.
pub fn ndjson_response<T, E>(events: BoxStream<'static, Result<T, E>>) -> Response
where
    T: Serialize + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    let lines = events
        .map_ok(|ev| {
            let mut line = serde_json::to_vec(&ev).unwrap_or_default();
            line.push(b'\n');
            Bytes::from(line)
        })
        .inspect_err(|e| tracing::debug!(error = %e, "event stream ended with an error"));
    (
        [(CONTENT_TYPE, NDJSON), (CACHE_CONTROL, "no-store")],
        Body::from_stream(lines),
    )
        .into_response()
}

/// Start a process.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ProcessSpec,
    responses(
        (status = 201, description = "Started", body = ProcessInfo),
        (status = 400, description = "Invalid spec", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 422, description = "The program cannot be executed", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn start_process(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(spec): ApiJson<ProcessSpec>,
) -> ApiResult<(StatusCode, Json<ProcessInfo>)> {
    validate_spec(&spec)?;
    let guest = st.guest(&tenant.id, &id).await?;
    let info = guest
        .start_process(&st.process_spec(&tenant.id, &id, &spec).await?)
        .await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// List processes (running and recently finished).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Processes", body = [ProcessInfo]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_processes(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<Vec<ProcessInfo>>> {
    let guest = st.guest(&tenant.id, &id).await?;
    Ok(Json(guest.list_processes().await?))
}

/// One process.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes/{pid}",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u64, Path, description = "Process id")),
    responses(
        (status = 200, description = "The process", body = ProcessInfo),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_process(
    State(st): State<AppState>,
    tenant: Caller,
    ProcessPath(id, pid): ProcessPath,
) -> ApiResult<Json<ProcessInfo>> {
    let guest = st.guest(&tenant.id, &id).await?;
    Ok(Json(guest.process(pid).await?))
}

/// Query of the output endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    /// Only events with a larger sequence number (the last one seen, when reconnecting).
    pub after: Option<u64>,
    /// From now on: the `started` event, then only events produced after this request (an
    /// exited process: `started`, then `exit`). Not with `after`.
    pub live: Option<bool>,
}

/// Stream a process's output as NDJSON `OutputEvent`s; ends after the `exit` event. With
/// `live=true`, `started` and then only what the process prints from now on.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes/{pid}/output",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u64, Path, description = "Process id"), OutputQuery),
    responses(
        (status = 200, description = "One OutputEvent per line", body = OutputEvent, content_type = "application/x-ndjson"),
        (status = 400, description = "Both live and after", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn output(
    State(st): State<AppState>,
    tenant: Caller,
    ProcessPath(id, pid): ProcessPath,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> ApiResult<Response> {
    let events = match (q.live.unwrap_or(false), q.after) {
        (true, Some(_)) => return Err(ApiError::invalid("live and after exclude each other")),
        (true, None) => st.guest(&tenant.id, &id).await?.output_live(pid).await?,
        (false, after) => st.guest(&tenant.id, &id).await?.output(pid, after).await?,
    };
    Ok(ndjson_response(events))
}

/// Query of the stdin endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StdinQuery {
    /// Close the process's stdin after this body (EOF).
    pub close: Option<bool>,
}

/// Write the request body (streamed) to the process's stdin.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{pid}/stdin",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u64, Path, description = "Process id"), StdinQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "Bytes for stdin, streamed"),
    responses(
        (status = 204, description = "Written"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
        (status = 409, description = "The process has no open stdin", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn stdin(
    State(st): State<AppState>,
    tenant: Caller,
    ProcessPath(id, pid): ProcessPath,
    ApiQuery(q): ApiQuery<StdinQuery>,
    body: Body,
) -> ApiResult<StatusCode> {
    let guest = st.guest(&tenant.id, &id).await?;
    let data = body
        .into_data_stream()
        .map_err(std::io::Error::other)
        .boxed();
    guest
        .write_stdin(pid, data, q.close.unwrap_or(false))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Send a signal to the process (and its process group).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{pid}/signal",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u64, Path, description = "Process id")),
    request_body = SignalRequest,
    responses(
        (status = 204, description = "Delivered"),
        (status = 400, description = "Invalid signal", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn signal(
    State(st): State<AppState>,
    tenant: Caller,
    ProcessPath(id, pid): ProcessPath,
    ApiJson(req): ApiJson<SignalRequest>,
) -> ApiResult<StatusCode> {
    space_core::process::validate_signal(req.signal)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let guest = st.guest(&tenant.id, &id).await?;
    guest.signal(pid, req.signal).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resize the process's pseudo-terminal.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{pid}/resize",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), ("pid" = u64, Path, description = "Process id")),
    request_body = PtySize,
    responses(
        (status = 204, description = "Resized"),
        (status = 400, description = "Invalid size", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or process", body = ErrorBody),
        (status = 409, description = "The process has no pty", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn resize(
    State(st): State<AppState>,
    tenant: Caller,
    ProcessPath(id, pid): ProcessPath,
    ApiJson(size): ApiJson<PtySize>,
) -> ApiResult<StatusCode> {
    size.validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let guest = st.guest(&tenant.id, &id).await?;
    guest.resize(pid, size).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Start a process and stream its output in one request; the first event is `started`
/// (with the process id, for stdin and signals), the last `exit`.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ProcessSpec,
    responses(
        (status = 200, description = "One OutputEvent per line", body = OutputEvent, content_type = "application/x-ndjson"),
        (status = 400, description = "Invalid spec", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 422, description = "The program cannot be executed", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn exec(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(spec): ApiJson<ProcessSpec>,
) -> ApiResult<Response> {
    validate_spec(&spec)?;
    let guest = st.guest(&tenant.id, &id).await?;
    let info = guest
        .start_process(&st.process_spec(&tenant.id, &id, &spec).await?)
        .await?;
    let events = guest.output(info.id, None).await?;
    // Guarantee the contract "first event is `started`" whatever the guest replays first.
    let (first, rest) = events.into_future().await;
    let head: Vec<Result<OutputEvent, GuestError>> = match first {
        Some(Ok(ev @ OutputEvent::Started { .. })) => vec![Ok(ev)],
        Some(other) => vec![
            Ok(OutputEvent::Started {
                seq: 0,
                id: info.id,
                pid: info.pid,
            }),
            other,
        ],
        None => vec![Ok(OutputEvent::Started {
            seq: 0,
            id: info.id,
            pid: info.pid,
        })],
    };
    Ok(ndjson_response(
        futures::stream::iter(head).chain(rest).boxed(),
    ))
}
