//! `/v1/sandboxes`: create, list, get, delete, timeout, token revocation, console. Each
//! handler parses its request, calls [`crate::service::sandboxes`] and renders the answer;
//! the other lifecycle operations are in [`super::lifecycle`].

use axum::body::Body;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use space_core::sandbox::{
    CreateSandboxRequest, SandboxInfo, SandboxList, SetTimeoutRequest, MAX_LABELS,
};
use space_core::{ErrorBody, SandboxState};
use utoipa::IntoParams;

use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, ApiQuery, SandboxPath};
use super::AppState;
use crate::service::sandboxes::{self, ListQuery, DEFAULT_CONSOLE_BYTES};
use crate::service::Caller;
use space_core::error::excerpt;

/// Create a sandbox, from a template or from one of the caller's snapshots; returns once
/// its daemon is ready.
#[utoipa::path(
    post,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "Created and running", body = SandboxInfo),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such template, or no such snapshot of the caller's", body = ErrorBody),
        (status = 413, description = "Body larger than 1 MiB", body = ErrorBody),
        (status = 502, description = "The sandbox failed to start", body = ErrorBody),
        (status = 507, description = "Not enough capacity on the node", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn create_sandbox(
    State(st): State<AppState>,
    tenant: Caller,
    ApiJson(req): ApiJson<CreateSandboxRequest>,
) -> ApiResult<(StatusCode, Json<SandboxInfo>)> {
    let info = sandboxes::create(&st, &tenant, req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// Parses `label=k=v&label=k2=v2&state=running`.
pub fn parse_list_query(query: Option<&str>) -> Result<ListQuery, ApiError> {
    let mut out = ListQuery::default();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*k {
            "label" => {
                let (lk, lv) = v
                    .split_once('=')
                    .ok_or_else(|| ApiError::invalid("label filters are label=KEY=VALUE"))?;
                if out.labels.len() >= MAX_LABELS {
                    return Err(ApiError::invalid(format!(
                        "at most {MAX_LABELS} label filters"
                    )));
                }
                out.labels.push((lk.to_owned(), lv.to_owned()));
            }
            "state" => {
                out.state = Some(SandboxState::parse(&v).ok_or_else(|| {
                    ApiError::invalid(format!("unknown state {:?}", excerpt(&v, 32)))
                })?);
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {:?}",
                    excerpt(other, 32)
                )))
            }
        }
    }
    Ok(out)
}

/// Query parameters of `GET /v1/sandboxes`, for the OpenAPI document.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct ListParams {
    /// `KEY=VALUE`; repeat for several labels, all must match.
    label: Option<Vec<String>>,
    /// Only sandboxes in this state (default: all that are not deleted).
    state: Option<SandboxState>,
}

/// List the caller's sandboxes, newest first.
#[utoipa::path(
    get,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    params(ListParams),
    responses(
        (status = 200, description = "Matching sandboxes", body = SandboxList),
        (status = 400, description = "Bad filter", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_sandboxes(
    State(st): State<AppState>,
    tenant: Caller,
    uri: Uri,
) -> ApiResult<Json<SandboxList>> {
    let query = parse_list_query(uri.query())?;
    let sandboxes = sandboxes::list(&st, &tenant, &query).await?;
    Ok(Json(SandboxList { sandboxes }))
}

/// One sandbox (deleted ones too, with state `deleted`).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox", body = SandboxInfo),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_sandbox(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(sandboxes::get(&st, &tenant, &id).await?))
}

/// Delete a sandbox: the VM is stopped and its disk removed.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Malformed id", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox, or already deleted", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_sandbox(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<StatusCode> {
    sandboxes::delete(&st, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Set the sandbox timeout: its `on_timeout` action (deletion by default) happens
/// `timeout_secs` from now, and each time it runs again (resume, start) it gets
/// `timeout_secs` once more. A sandbox its timeout paused or stopped gets a deadline again.
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/timeout",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetTimeoutRequest,
    responses(
        (status = 200, description = "The sandbox with its new expiry", body = SandboxInfo),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_timeout(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<SetTimeoutRequest>,
) -> ApiResult<Json<SandboxInfo>> {
    Ok(Json(
        sandboxes::set_timeout(&st, &tenant, &id, req.timeout_secs).await?,
    ))
}

/// Revoke every access token handed out for the sandbox (the E2B surface's envd and
/// traffic tokens, and the signed URLs made with them): they fail at once; a client gets
/// new ones by connecting (or `GET`ting) the sandbox again.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/revoke-tokens",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn revoke_tokens(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<StatusCode> {
    sandboxes::revoke_tokens(&st, &tenant, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Query of the console endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ConsoleQuery {
    /// Bytes of the tail to return (default 16384, at most 1048576).
    pub bytes: Option<usize>,
}

/// The tail of the sandbox's serial console (kernel and boot messages).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/console",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), ConsoleQuery),
    responses(
        (status = 200, description = "Console text", body = String, content_type = "text/plain"),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn console(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<ConsoleQuery>,
) -> ApiResult<Response> {
    let bytes = q.bytes.unwrap_or(DEFAULT_CONSOLE_BYTES);
    let text = sandboxes::console_tail(&st, &tenant, &id, bytes).await?;
    Ok((
        [(CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from(text),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_query() {
        let q = parse_list_query(Some("label=a%3Db=c&label=x=y&state=running")).unwrap();
        assert_eq!(
            q.labels,
            vec![("a".into(), "b=c".into()), ("x".into(), "y".into())]
        );
        assert_eq!(q.state, Some(SandboxState::Running));
        assert_eq!(parse_list_query(None).unwrap(), ListQuery::default());
        assert!(parse_list_query(Some("label=nokey")).is_err());
        assert!(parse_list_query(Some("state=sleepy")).is_err());
        assert!(parse_list_query(Some("bogus=1")).is_err());
    }
}
