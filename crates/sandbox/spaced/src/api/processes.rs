//! The process routes: start, list, get, output stream, stdin, signal, resize.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use http_body_util::BodyExt;
use serde::Deserialize;
use space_core::process::{ProcessInfo, ProcessSpec, PtySize, SignalRequest};
use space_core::ErrorCode;
use space_guest_proto::routes::NDJSON;

use super::{ApiJson, ApiQuery, ProcId, St};
use crate::error::ApiError;
use crate::fsuser;
use crate::process::env::build_env;
use crate::process::manager::StartRequest;
use crate::process::spawn::SpawnRequest;

/// Longest timeout honoured (about 10 years); longer ones mean "none".
const MAX_TIMEOUT_MS: u64 = 10 * 365 * 24 * 3600 * 1000;

pub(super) async fn start(
    axum::extract::State(st): St,
    ApiJson(spec): ApiJson<ProcessSpec>,
) -> Result<(StatusCode, Json<ProcessInfo>), ApiError> {
    spec.validate()
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let user = st.user(spec.user.as_deref())?;
    let default_workdir = st.config().default_workdir;
    let cwd = st.path_for(
        &user,
        spec.cwd
            .as_deref()
            .or(default_workdir.as_deref())
            .unwrap_or(&user.home),
    )?;

    // Check the working directory as the user, so a bad cwd is a clear 400 and not a
    // confusing exec failure.
    let (u, c) = (user.clone(), cwd.clone());
    tokio::task::spawn_blocking(move || fsuser::with_user(&u, || std::fs::metadata(&c)))
        .await?
        .map_err(|e| {
            // A missing cwd is a bad request, not a missing resource.
            let mut err = ApiError::io("working directory", &cwd, &e);
            if err.code() == ErrorCode::NotFound {
                err.0.code = ErrorCode::InvalidPath;
            }
            err
        })
        .and_then(|md| {
            if md.is_dir() {
                Ok(())
            } else {
                Err(ApiError::new(
                    ErrorCode::InvalidPath,
                    format!("working directory {} is not a directory", cwd.display()),
                ))
            }
        })?;

    let config = st.config();
    let env = build_env(&user, &config.env, &spec.env, spec.pty.is_some());
    let tty_gid = crate::users::lookup_group("tty");
    let req = StartRequest {
        spawn: SpawnRequest {
            argv: spec.effective_argv(),
            env,
            cwd,
            user,
            stdin: spec.stdin,
            pty: spec.pty,
            tty_gid,
        },
        timeout: spec
            .timeout_ms
            .filter(|t| *t <= MAX_TIMEOUT_MS)
            .map(Duration::from_millis),
        tag: spec.tag,
        requested_env: spec.env,
    };
    let info = st.processes.start(req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub(super) async fn list(axum::extract::State(st): St) -> Json<Vec<ProcessInfo>> {
    Json(st.processes.list())
}

pub(super) async fn get(
    axum::extract::State(st): St,
    ProcId(id): ProcId,
) -> Result<Json<ProcessInfo>, ApiError> {
    Ok(Json(st.processes.get(id)?.info()))
}

#[derive(Debug, Deserialize)]
pub(super) struct OutputQuery {
    after: Option<u64>,
    #[serde(default)]
    live: bool,
}

pub(super) async fn output(
    axum::extract::State(st): St,
    ProcId(id): ProcId,
    ApiQuery(q): ApiQuery<OutputQuery>,
) -> Result<Response, ApiError> {
    let proc = st.processes.get(id)?;
    let body = match (q.live, q.after) {
        (true, Some(_)) => return Err(ApiError::invalid("live and after exclude each other")),
        (true, None) => Body::from_stream(proc.live_stream()),
        (false, after) => Body::from_stream(proc.output_stream(after.unwrap_or(0))),
    };
    Ok(([(header::CONTENT_TYPE, NDJSON)], body).into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct StdinQuery {
    #[serde(default)]
    close: bool,
}

pub(super) async fn stdin(
    axum::extract::State(st): St,
    ProcId(id): ProcId,
    ApiQuery(q): ApiQuery<StdinQuery>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let proc = st.processes.get(id)?;
    if !proc.has_stdin().await {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("stdin of process {id} is not open (started without stdin, closed, or exited)"),
        ));
    }
    let mut body = body;
    // One frame at a time: the next is not read until this one is in the pipe, so HTTP/2
    // flow control pushes back on the host while the process is not reading.
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::invalid(format!("reading request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if !data.is_empty() {
                proc.write_stdin(&data).await?;
            }
        }
    }
    if q.close {
        proc.close_stdin().await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn signal(
    axum::extract::State(st): St,
    ProcId(id): ProcId,
    ApiJson(req): ApiJson<SignalRequest>,
) -> Result<StatusCode, ApiError> {
    st.processes.get(id)?.signal(req.signal)?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn resize(
    axum::extract::State(st): St,
    ProcId(id): ProcId,
    ApiJson(size): ApiJson<PtySize>,
) -> Result<StatusCode, ApiError> {
    st.processes.get(id)?.resize(size)?;
    Ok(StatusCode::NO_CONTENT)
}
