//! Files in a sandbox: read, write (streamed, size-limited), remove, stat, list, mkdir,
//! rename, watch (streamed). Every path is checked here (no `..`, no NUL) and again by the guest daemon, which
//! runs the operation as the acting user.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use serde::Deserialize;
use space_core::files::watch::{WatchEvent, WatchRequest, WatchRequestError};
use space_core::files::{
    validate_file_metadata, validate_path, FileList, FileStat, MkdirRequest, RenameRequest,
    MAX_LIST_DEPTH,
};
use space_core::process::validate_user_name;
use space_core::ErrorBody;
use utoipa::IntoParams;

use super::error::{ApiError, ApiResult};
use super::extract::{content_length, ApiJson, ApiQuery, SandboxPath};
use super::processes::ndjson_response;
use super::AppState;
use crate::service::Caller;
use space_core::error::excerpt;

/// Checks a path parameter: `invalid_path` if unacceptable.
pub fn check_path(what: &str, path: &str) -> Result<(), ApiError> {
    validate_path(path).map_err(|e| ApiError::invalid_path(format!("bad {what}: {e}")))
}

/// Checks an optional acting user.
pub fn check_user(user: Option<&str>) -> Result<(), ApiError> {
    match user {
        Some(u) if validate_user_name(u).is_err() => Err(ApiError::invalid(
            "bad user name: [a-z_][a-z0-9_-]*, at most 32 bytes",
        )),
        _ => Ok(()),
    }
}

/// Parses an octal mode such as `0644` or `755` (at most `7777`).
pub fn parse_mode(mode: &str) -> Result<u32, ApiError> {
    let bad = || {
        ApiError::invalid(format!(
            "mode must be octal permission bits like 0644, got {:?}",
            excerpt(mode, 16)
        ))
    };
    let digits = mode.strip_prefix("0o").unwrap_or(mode);
    if digits.is_empty() || digits.len() > 5 {
        return Err(bad());
    }
    let value = u32::from_str_radix(digits, 8).map_err(|_| bad())?;
    if value > 0o7777 {
        return Err(bad());
    }
    Ok(value)
}

/// Parses and checks a file's metadata given as a JSON object of strings.
pub fn parse_metadata(json: Option<&str>) -> Result<BTreeMap<String, String>, ApiError> {
    let metadata: BTreeMap<String, String> = match json {
        None => BTreeMap::new(),
        Some(text) => serde_json::from_str(text).map_err(|e| {
            ApiError::invalid(format!("metadata must be a JSON object of strings: {e}"))
        })?,
    };
    validate_file_metadata(&metadata)
        .map_err(|e| ApiError::invalid(format!("bad metadata: {e}")))?;
    Ok(metadata)
}

/// Passes `stream` through until more than `limit` bytes have gone by, then fails it; the
/// flag tells afterwards whether that is why it failed.
pub fn limit_stream<S>(
    stream: S,
    limit: u64,
) -> (
    BoxStream<'static, Result<Bytes, io::Error>>,
    Arc<AtomicBool>,
)
where
    S: Stream<Item = Result<Bytes, io::Error>> + Send + 'static,
{
    let exceeded = Arc::new(AtomicBool::new(false));
    let flag = exceeded.clone();
    let mut seen: u64 = 0;
    let limited = stream
        .map(move |chunk| {
            let chunk = chunk?;
            seen = seen.saturating_add(chunk.len() as u64);
            if seen > limit {
                flag.store(true, Ordering::SeqCst);
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "upload larger than the limit",
                ));
            }
            Ok(chunk)
        })
        .boxed();
    (limited, exceeded)
}

/// `path` and `user` of a file request.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// Path in the sandbox: absolute, or relative to the user's home.
    pub path: String,
    /// User to act as; default the sandbox's default user.
    pub user: Option<String>,
}

impl FileQuery {
    fn check(&self) -> Result<(), ApiError> {
        check_path("path", &self.path)?;
        check_user(self.user.as_deref())
    }
}

/// Query of a file upload.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PutFileQuery {
    /// Path in the sandbox; parent directories are created; a symlink there is followed
    /// (the file it leads to is written).
    pub path: String,
    /// User to act as; default the sandbox's default user.
    pub user: Option<String>,
    /// Octal permission bits, e.g. `0644`. Without it a new file gets `0644` and a file
    /// it replaces keeps its mode (and, written as root, its owner).
    pub mode: Option<String>,
    /// The file's metadata: a JSON object of strings (keys `[a-z0-9._-]`, at most 4096
    /// bytes in all), kept with the file and returned by `stat` and `list`.
    pub metadata: Option<String>,
}

/// Query of a removal.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    /// Path in the sandbox.
    pub path: String,
    /// Remove directories with their contents.
    pub recursive: Option<bool>,
    /// User to act as; default the sandbox's default user.
    pub user: Option<String>,
}

/// Query of a listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Directory in the sandbox.
    pub path: String,
    /// Levels to descend (1 = the directory's entries; at most 16).
    pub depth: Option<u32>,
    /// User to act as; default the sandbox's default user.
    pub user: Option<String>,
}

/// Download a file (streamed).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses(
        (status = 200, description = "File content", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 400, description = "Invalid path or user", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Permission denied in the sandbox", body = ErrorBody),
        (status = 404, description = "No such sandbox or file", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn read_file(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Response> {
    q.check()?;
    let guest = st.guest(&tenant.id, &id).await?;
    let (size, data) = guest.read_file(&q.path, q.user.as_deref()).await?;
    let body = Body::from_stream(
        data.inspect_err(|e| tracing::debug!(error = %e, "file download broke off")),
    );
    let mut response = ([(CONTENT_TYPE, "application/octet-stream")], body).into_response();
    if let Some(size) = size {
        response.headers_mut().insert(CONTENT_LENGTH, size.into());
    }
    Ok(response)
}

/// Upload a file (streamed; atomically replaces the target). Larger than the server's
/// upload limit: 413.
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), PutFileQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "File content, streamed"),
    responses(
        (status = 200, description = "Written", body = FileStat),
        (status = 400, description = "Invalid path, user or mode", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Permission denied in the sandbox", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 413, description = "Larger than the upload limit", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn write_file(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<PutFileQuery>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Json<FileStat>> {
    check_path("path", &q.path)?;
    check_user(q.user.as_deref())?;
    let mode = q.mode.as_deref().map(parse_mode).transpose()?;
    let metadata = parse_metadata(q.metadata.as_deref())?;
    let limit = st.max_upload_bytes;
    let too_large =
        || ApiError::too_large(format!("upload is larger than the limit of {limit} bytes"));
    // Going over the limit fails the stream, which aborts the guest's atomic write, so
    // nothing partial remains.
    let (data, exceeded) = bounded_upload(&headers, body, limit, too_large).await?;
    let guest = st.guest(&tenant.id, &id).await?;
    match guest
        .write_file(&q.path, q.user.as_deref(), mode, &metadata, data)
        .await
    {
        Ok(stat) => Ok(Json(stat)),
        Err(_) if exceeded.load(Ordering::SeqCst) => Err(too_large()),
        Err(e) => Err(e.into()),
    }
}

/// An upload's body, refused at once (`too_large()`, after draining a small one) when its
/// `Content-Length` is over `limit`, and otherwise counted as it streams: the header may be
/// absent (chunked) or lie. The flag tells afterwards whether the stream failed for size.
pub async fn bounded_upload(
    headers: &HeaderMap,
    body: Body,
    limit: u64,
    too_large: impl Fn() -> ApiError,
) -> Result<
    (
        BoxStream<'static, Result<Bytes, io::Error>>,
        Arc<AtomicBool>,
    ),
    ApiError,
> {
    if let Some(len) = content_length(headers).filter(|&len| len > limit) {
        if len <= MAX_DRAIN_BYTES {
            drain(body).await;
        }
        return Err(too_large());
    }
    Ok(limit_stream(
        body.into_data_stream().map_err(io::Error::other),
        limit,
    ))
}

/// Largest oversized upload the server reads and throws away before it answers 413: a
/// client still sending its body would otherwise see the connection reset rather than the
/// answer (HTTP/1 has no way to stop a sender politely). Anything larger is answered at
/// once, and the connection closed.
pub const MAX_DRAIN_BYTES: u64 = 16 << 20;
/// How long draining an oversized upload may take.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads and discards `body`, at most [`MAX_DRAIN_BYTES`] and for at most [`DRAIN_TIMEOUT`].
pub async fn drain(body: Body) {
    let mut stream = body.into_data_stream();
    let mut seen = 0u64;
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while let Some(Ok(chunk)) = stream.next().await {
            seen += chunk.len() as u64;
            if seen > MAX_DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
}

/// Remove a file or directory.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), RemoveQuery),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Invalid path or user", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or file", body = ErrorBody),
        (status = 409, description = "Directory not empty and not recursive", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn remove(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<RemoveQuery>,
) -> ApiResult<StatusCode> {
    check_path("path", &q.path)?;
    check_user(q.user.as_deref())?;
    let guest = st.guest(&tenant.id, &id).await?;
    guest
        .remove(&q.path, q.recursive.unwrap_or(false), q.user.as_deref())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Metadata of one entry (symlinks are not followed).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/stat",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FileQuery),
    responses(
        (status = 200, description = "Metadata", body = FileStat),
        (status = 400, description = "Invalid path or user", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or file", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn stat(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> ApiResult<Json<FileStat>> {
    q.check()?;
    let guest = st.guest(&tenant.id, &id).await?;
    Ok(Json(guest.stat(&q.path, q.user.as_deref()).await?))
}

/// List a directory.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/list",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), ListQuery),
    responses(
        (status = 200, description = "Entries", body = FileList),
        (status = 400, description = "Invalid path, user or depth", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or directory", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn list(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<FileList>> {
    check_path("path", &q.path)?;
    check_user(q.user.as_deref())?;
    let depth = q.depth.unwrap_or(1);
    if !(1..=MAX_LIST_DEPTH).contains(&depth) {
        return Err(ApiError::invalid(format!(
            "depth must be between 1 and {MAX_LIST_DEPTH}"
        )));
    }
    let guest = st.guest(&tenant.id, &id).await?;
    Ok(Json(guest.list(&q.path, depth, q.user.as_deref()).await?))
}

/// Create a directory with its parents.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/files/mkdir",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MkdirRequest,
    responses(
        (status = 200, description = "The directory", body = FileStat),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn mkdir(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<MkdirRequest>,
) -> ApiResult<Json<FileStat>> {
    check_path("path", &req.path)?;
    check_user(req.user.as_deref())?;
    if req.mode.is_some_and(|m| m > 0o7777) {
        return Err(ApiError::invalid("mode must be at most 0o7777"));
    }
    let guest = st.guest(&tenant.id, &id).await?;
    Ok(Json(guest.mkdir(&req).await?))
}

/// Rename (move) a file or directory.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/files/rename",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RenameRequest,
    responses(
        (status = 204, description = "Renamed"),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox or file", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn rename(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<RenameRequest>,
) -> ApiResult<StatusCode> {
    check_path("from", &req.from)?;
    check_path("to", &req.to)?;
    check_user(req.user.as_deref())?;
    let guest = st.guest(&tenant.id, &id).await?;
    guest.rename(&req).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Watch a directory: one `WatchEvent` per line, `started` first (sent once every watch is
/// in place), then the changes (`name` relative to the directory); the stream ends after
/// the directory's own removal. With `recursive`, subdirectories are watched too, those
/// created later included: a new subdirectory's entries are reported as it is watched
/// (`create`, and `write` for a file with content), since they may predate its watch.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/watch",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), WatchRequest),
    responses(
        (status = 200, description = "One WatchEvent per line", body = WatchEvent, content_type = "application/x-ndjson"),
        (status = 400, description = "Invalid path or user, or not a directory", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 403, description = "Permission denied in the sandbox", body = ErrorBody),
        (status = 404, description = "No such sandbox or directory", body = ErrorBody),
        (status = 429, description = "Too many watches at once, or too many directories in the tree", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn watch(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(req): ApiQuery<WatchRequest>,
) -> ApiResult<Response> {
    req.validate().map_err(|e| match e {
        WatchRequestError::Path(_) => ApiError::invalid_path(e.to_string()),
        WatchRequestError::User => ApiError::invalid(e.to_string()),
    })?;
    let guest = st.guest(&tenant.id, &id).await?;
    Ok(ndjson_response(guest.watch(&req).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("0644").unwrap(), 0o644);
        assert_eq!(parse_mode("755").unwrap(), 0o755);
        assert_eq!(parse_mode("0o4755").unwrap(), 0o4755);
        for bad in ["", "8", "0x1ff", "17777", "rw-r--r--", "-1"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn uploads_are_cut_at_the_limit() {
        let chunks = || futures::stream::iter((0..4).map(|_| Ok(Bytes::from_static(b"12345"))));
        let (s, flag) = limit_stream(chunks(), 20);
        let all: Vec<_> = s.collect().await;
        assert!(all.iter().all(Result::is_ok) && !flag.load(Ordering::SeqCst));
        let (s, flag) = limit_stream(chunks(), 12);
        let all: Vec<_> = s.collect().await;
        assert_eq!(all.iter().filter(|r| r.is_ok()).count(), 2);
        assert!(all[2].is_err() && flag.load(Ordering::SeqCst));
    }

    #[test]
    fn paths_and_users() {
        assert_eq!(
            check_path("path", "../x").unwrap_err().body.code,
            space_core::ErrorCode::InvalidPath
        );
        assert!(check_path("path", "/etc/hosts").is_ok());
        assert!(check_user(Some("root")).is_ok());
        assert!(check_user(Some("../x")).is_err());
        assert!(check_user(None).is_ok());
    }
}
