//! `/v1/templates`: the templates sandboxes can be created from, and their builds.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::ACCEPT;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use space_core::build_steps::MAX_BUILD_FILES_BYTES;
use space_core::template::{
    CachedTemplate, TemplateBuildEvent, TemplateBuildStatus, TemplateCachePrune,
    TemplateCachePruneRequest, TemplateInfo,
};
use space_core::ErrorBody;

use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, ApiQuery};
use super::files::bounded_upload;
use super::processes::{ndjson_response, NDJSON};
use super::AppState;
use crate::service::build_files::{self, BuildFiles};
use crate::service::templates::{self, TemplateBuildRequest};
use crate::service::Caller;

/// List the templates the caller may use: the shared ones and its own (`TENANT.NAME`; the
/// operator sees every tenant's): name, size, origin (the image it was built from),
/// defaults.
#[utoipa::path(
    get,
    path = "/v1/templates",
    tag = "templates",
    responses(
        (status = 200, description = "Templates, by name", body = [TemplateInfo]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_templates(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<Vec<TemplateInfo>>> {
    Ok(Json(templates::list(&st, &caller).await?))
}

/// Build a template from a registry image or a template: a shared one (the operator's), or
/// the calling tenant's own, named `TENANT.NAME` (at most 100 per tenant, two builds at a
/// time; its builders have the tenant's default egress policy). Answers `202` with the build's
/// status, or, asked with `Accept: application/x-ndjson`, follows the build: one
/// `TemplateBuildEvent` per line (`started`, its `log` lines, then `ready` or `failed`). A
/// client that goes away does not stop the build.
#[utoipa::path(
    post,
    path = "/v1/templates",
    tag = "templates",
    request_body = TemplateBuildRequest,
    responses(
        (status = 202, description = "Build started", body = TemplateBuildStatus),
        (status = 200, description = "The build followed, one event per line", body = TemplateBuildEvent, content_type = "application/x-ndjson"),
        (status = 400, description = "Invalid name, tag or reference", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn build_template(
    State(st): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(req): ApiJson<TemplateBuildRequest>,
) -> ApiResult<Response> {
    let status = templates::start_build(&st, &caller, req).await?;
    let follow = headers
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(NDJSON));
    if !follow {
        return Ok((StatusCode::ACCEPTED, Json(status)).into_response());
    }
    let events = templates::follow_build(st, status).map(Ok::<_, std::convert::Infallible>);
    Ok(ndjson_response(events.boxed()))
}

/// One template.
#[utoipa::path(
    get,
    path = "/v1/templates/{name}",
    tag = "templates",
    params(("name" = String, Path, description = "Template name: NAME or NAME:TAG (a tenant's own first, then the shared one), or a tenant's own full name TENANT.NAME")),
    responses(
        (status = 200, description = "The template", body = TemplateInfo),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such template", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_template(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<TemplateInfo>> {
    Ok(Json(templates::get(&st, &caller, &name).await?))
}

/// `DELETE /v1/templates/{name}` options.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    /// Delete even while sandboxes or snapshots were made from it.
    #[serde(default)]
    pub force: bool,
}

/// Delete a template name (a tenant its own, the operator any); the template goes with its
/// last name.
/// Refused (`409`) while sandboxes or snapshots were made from it, unless `force=true`.
#[utoipa::path(
    delete,
    path = "/v1/templates/{name}",
    tag = "templates",
    params(("name" = String, Path, description = "Template name: NAME or NAME:TAG"), DeleteQuery),
    responses(
        (status = 204, description = "Deleted"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
        (status = 404, description = "No such template", body = ErrorBody),
        (status = 409, description = "In use", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn delete_template(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> ApiResult<StatusCode> {
    templates::delete(&st, &caller, &name, q.force).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/templates/builds/{id}` options.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct BuildQuery {
    /// Log lines from this index on (the previous answer's `next_log_index`).
    #[serde(default)]
    pub logs_from: u64,
}

/// A template build: its state, its log from `logs_from`, and its template or error.
#[utoipa::path(
    get,
    path = "/v1/templates/builds/{id}",
    tag = "templates",
    params(("id" = String, Path, description = "Build id"), BuildQuery),
    responses(
        (status = 200, description = "The build", body = TemplateBuildStatus),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such build (or another tenant's)", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_build(
    State(st): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<BuildQuery>,
) -> ApiResult<Json<TemplateBuildStatus>> {
    Ok(Json(
        templates::build_status(&st, &caller, &id, q.logs_from).await?,
    ))
}

/// Upload an archive of files (a tar) for build steps' `copy`, named by its SHA-256.
/// Checked against the hash before it is kept; one this tenant uploaded before is kept (and
/// the body not read). Kept a week; a tenant's builds copy only from archives it uploaded.
/// Larger than 1 GiB: 413.
#[utoipa::path(
    put,
    path = "/v1/templates/files/{sha256}",
    tag = "templates",
    params(("sha256" = String, Path, description = "Lowercase hex SHA-256 of the archive")),
    request_body(content = Vec<u8>, content_type = "application/x-tar", description = "The tar archive, streamed"),
    responses(
        (status = 200, description = "Stored", body = BuildFiles),
        (status = 400, description = "Not the archive the hash names", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "No object store, and not the operator's tenant", body = ErrorBody),
        (status = 413, description = "Larger than 1 GiB", body = ErrorBody),
        (status = 503, description = "The object store is unavailable", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn put_build_files(
    State(st): State<AppState>,
    caller: Caller,
    Path(sha256): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<BuildFiles>> {
    let limit = MAX_BUILD_FILES_BYTES;
    let too_large = || ApiError::too_large(format!("an archive of files is at most {limit} bytes"));
    let (data, exceeded) = bounded_upload(&headers, body, limit, too_large).await?;
    match build_files::put(&st, &caller, &sha256, data).await {
        Ok(stored) => Ok(Json(stored)),
        Err(_) if exceeded.load(Ordering::SeqCst) => Err(too_large()),
        Err(e) => Err(e),
    }
}

/// Whether an archive of files for build steps is uploaded (by this tenant; absent from its
/// sixth day, so that it is uploaded again before it goes).
#[utoipa::path(
    get,
    path = "/v1/templates/files/{sha256}",
    tag = "templates",
    params(("sha256" = String, Path, description = "Lowercase hex SHA-256 of the archive")),
    responses(
        (status = 200, description = "Whether it is there", body = BuildFiles),
        (status = 400, description = "Not a SHA-256", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "No object store, and not the operator's tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_build_files(
    State(st): State<AppState>,
    caller: Caller,
    Path(sha256): Path<String>,
) -> ApiResult<Json<BuildFiles>> {
    Ok(Json(build_files::get(&st, &caller, &sha256).await?))
}

/// The template cache of every node (the operator's): templates no name points at — build
/// steps' caches, what a rebuilt name meant before, templates fetched by digest — with when
/// each was last needed, oldest first.
#[utoipa::path(
    get,
    path = "/v1/template-cache",
    tag = "templates",
    responses(
        (status = 200, description = "Cached templates, least recently needed first", body = [CachedTemplate]),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list_template_cache(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Json<Vec<CachedTemplate>>> {
    Ok(Json(templates::cache(&st, &caller).await?))
}

/// Remove from every node's cache what no node needed for `unused_for_secs` (default a
/// day), except templates sandboxes or snapshots were made from. Nodes where a build runs,
/// and nodes that cannot be asked, are skipped and named. `dry_run` only lists.
#[utoipa::path(
    post,
    path = "/v1/template-cache/prune",
    tag = "templates",
    request_body = TemplateCachePruneRequest,
    responses(
        (status = 200, description = "What was removed and what was kept", body = TemplateCachePrune),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn prune_template_cache(
    State(st): State<AppState>,
    caller: Caller,
    ApiJson(req): ApiJson<TemplateCachePruneRequest>,
) -> ApiResult<Json<TemplateCachePrune>> {
    Ok(Json(templates::prune(&st, &caller, req).await?))
}
