//! envd's HTTP `/files` (`docs/e2b-compat.md`, 3.3): `GET` streams a file's bytes; `POST`
//! writes files, as `multipart/form-data` (one part named `file` per file, its filename the
//! destination) or as one `application/octet-stream` body for `?path=` (optionally
//! `Content-Encoding: gzip`, decoded as it streams). Everything streams: nothing is
//! buffered whole, uploads are counted against the server's upload limit (413 past it,
//! with the file left as it was: SPACE's writes are atomic), decompressed bytes included.
//!
//! A request proves itself with the access token, or with a signed URL for exactly its
//! path and operation ([`super::signature`]). A signed URL made with `E2B_SANDBOX_URL` set
//! names no sandbox (the SDK adds no headers to it): the sandbox is then the one whose
//! token the signature was made with.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use space_control::api::error::ApiError;
use space_control::api::extract::content_length;
use space_control::api::files::{drain, limit_stream, MAX_DRAIN_BYTES};
use space_control::db::now_ms;
use space_core::ErrorCode;
use space_guest_client::GuestClient;
use tokio_util::io::{ReaderStream, StreamReader};

use super::access::{self, EnvdCaller, EnvdTarget, Proof};
use super::errors::{http_access_error, http_error, HttpError};
use super::filesystem_service::normalize;
use super::signature::{Operation, Presented, SignatureRefusal};
use crate::state::E2bState;
use space_core::error::excerpt;

/// Headers whose suffix names a metadata key of the written files (header names are
/// lowercase in `http`).
const METADATA_HEADER_PREFIX: &str = "x-metadata-";
/// Bytes a one-file multipart body may carry beyond its file (boundaries and part headers)
/// before its announced length alone says it is over the limit.
const MULTIPART_OVERHEAD: u64 = 64 * 1024;
/// Most files one multipart upload may carry.
pub const MAX_UPLOAD_PARTS: usize = 1000;
/// Largest part header block of a multipart upload (multer's bound).
const MAX_PART_HEADERS: usize = 8 * 1024;
/// Most live sandboxes a header-less signed URL is checked against (one hash each).
pub const MAX_SIGNATURE_CANDIDATES: usize = 100_000;

/// The query of `/files`.
#[derive(Debug, Default, Deserialize)]
pub struct FilesQuery {
    /// The guest path: absolute, or relative to the user's home.
    #[serde(default)]
    pub path: Option<String>,
    /// Acting user (empty: the default).
    #[serde(default)]
    pub username: Option<String>,
    /// A signed URL's signature.
    #[serde(default)]
    pub signature: Option<String>,
    /// A signed URL's expiry, Unix seconds.
    #[serde(default)]
    pub signature_expiration: Option<i64>,
}

/// One file written, as envd reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WrittenEntry {
    /// Base name.
    pub name: String,
    /// Always `file`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Absolute path.
    pub path: String,
    /// The metadata the file was written with, read back (absent when it has none), as
    /// envd's upload answers.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// `GET|POST /files`.
pub async fn files(st: &E2bState, target: Option<EnvdTarget>, req: Request) -> Response {
    let query: FilesQuery = match serde_urlencoded_query(req.uri().query()) {
        Ok(q) => q,
        Err(e) => return http_error(400, e),
    };
    let op = if req.method() == Method::GET {
        Operation::Read
    } else if req.method() == Method::POST {
        Operation::Write
    } else {
        return http_error(405, "method not allowed on /files: use GET or POST");
    };
    let user = query.username.clone().unwrap_or_default();
    let presented = query.signature.as_deref().map(|signature| Presented {
        signature,
        expiration: query.signature_expiration,
        path: query.path.as_deref().unwrap_or(""),
        user: &user,
        op,
    });
    let (guest, caller) = match authorize(st, target, req.headers(), presented, &user).await {
        Ok(found) => found,
        Err(refused) => {
            // An upload refused before its body was read: read it (bounded) first, or the
            // client, still sending, sees the connection reset instead of the answer.
            if op == Operation::Write {
                drain(req.into_body()).await;
            }
            return refused;
        }
    };
    let result = match op {
        Operation::Read => read(&guest, &caller, query.path.as_deref()).await,
        Operation::Write => write(st, &guest, &caller, query.path.as_deref(), req).await,
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// The guest and caller of a `/files` request, proved by its access token or signature.
async fn authorize(
    st: &E2bState,
    target: Option<EnvdTarget>,
    headers: &HeaderMap,
    presented: Option<Presented<'_>>,
    user: &str,
) -> Result<(GuestClient, EnvdCaller), Response> {
    let now = now_ms() / 1000;
    let refuse = |r: SignatureRefusal| http_error(401, r.to_string());
    // As E2B's envd: a token in the header must be right, whatever the signature; without
    // one, the signature must be.
    let by_token = headers.contains_key(access::ACCESS_TOKEN_HEADER);
    let signed = match (&presented, by_token) {
        (_, true) => None,
        (Some(p), false) => Some(p),
        (None, false) => return Err(refuse(SignatureRefusal::Missing)),
    };
    let target = match (target, signed) {
        (Some(t), _) => t,
        (None, Some(p)) => signed_sandbox(st, p)
            .await
            .ok_or_else(|| refuse(SignatureRefusal::Invalid))?,
        // Routing sends a request with a token to the sandbox the token names.
        (None, None) => return Err(refuse(SignatureRefusal::Missing)),
    };
    let check = |token: &str| signed.map_or(Ok(()), |p| p.check(token, now));
    let proof = if signed.is_some() {
        Proof::Signature(&check)
    } else {
        Proof::Token
    };
    let mut caller = access::caller(st, &target, headers, proof)
        .await
        .map_err(http_access_error)?;
    caller.user = access::user_name(user)
        .map_err(http_access_error)?
        .or(caller.user);
    let guest = st
        .app
        .guest(&caller.tenant, &caller.id)
        .await
        .map_err(|e| HttpError::from(e).into_response())?;
    Ok((guest, caller))
}

/// The live sandbox a header-less signed URL was made for, if any (expired or not: the
/// caller's check then says which).
async fn signed_sandbox(st: &E2bState, p: &Presented<'_>) -> Option<EnvdTarget> {
    let rows = st.app.db.live_sandboxes().await.ok()?;
    rows.into_iter()
        .take(MAX_SIGNATURE_CANDIDATES)
        .find(|row| p.made_with(&st.envd_token(&row.id, row.tokens)))
        .map(|row| EnvdTarget(row.id))
}

fn serde_urlencoded_query(query: Option<&str>) -> Result<FilesQuery, String> {
    let mut q = FilesQuery::default();
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*k {
            "path" => q.path = Some(v.into_owned()),
            "username" => q.username = Some(v.into_owned()),
            "signature" => q.signature = Some(v.into_owned()),
            "signature_expiration" => {
                q.signature_expiration = Some(
                    v.parse()
                        .map_err(|_| "signature_expiration must be Unix seconds".to_owned())?,
                )
            }
            // Other parameters (e.g. future SDK options) narrow nothing; ignore them.
            _ => {}
        }
    }
    Ok(q)
}

async fn read(
    guest: &GuestClient,
    caller: &EnvdCaller,
    path: Option<&str>,
) -> Result<Response, HttpError> {
    let path = path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| HttpError::new(400, "path is required"))?;
    let path = normalize(path).map_err(|e| HttpError::new(400, e.message))?;
    let stat = guest
        .stat(&path, caller.user.as_deref())
        .await
        .map_err(|e| HttpError::from(ApiError::from(e)))?;
    if stat.kind == space_core::files::FileKind::Dir {
        return Err(HttpError::new(400, format!("{path} is a directory")));
    }
    let (size, data) = guest
        .read_file(&path, caller.user.as_deref())
        .await
        .map_err(|e| HttpError::from(ApiError::from(e)))?;
    let body = Body::from_stream(
        data.inspect_err(|e| tracing::debug!(error = %e, "E2B file download broke off")),
    );
    let mut response = ([(CONTENT_TYPE, "application/octet-stream")], body).into_response();
    if let Some(size) = size {
        response.headers_mut().insert(CONTENT_LENGTH, size.into());
    }
    Ok(response)
}

/// The upload limit's answer.
fn too_large(limit: u64) -> HttpError {
    HttpError::new(
        413,
        format!("upload is larger than the limit of {limit} bytes"),
    )
}

async fn write(
    st: &E2bState,
    guest: &GuestClient,
    caller: &EnvdCaller,
    path: Option<&str>,
    req: Request,
) -> Result<Response, HttpError> {
    let limit = st.app.max_upload_bytes;
    let (parts, body) = req.into_parts();
    let metadata = metadata_headers(&parts.headers)?;
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let multipart = content_type.starts_with("multipart/form-data");
    // A body announced larger than any accepted upload is answered before it is read (a
    // multipart body also carries part headers; the counts while writing are exact).
    let announced_max = if multipart {
        limit.saturating_add(MULTIPART_OVERHEAD)
    } else {
        limit
    };
    if let Some(len) = content_length(&parts.headers).filter(|&len| len > announced_max) {
        // Read (bounded) what the client is still sending, so it gets the answer and not
        // a reset connection.
        if len <= MAX_DRAIN_BYTES {
            drain(body).await;
        }
        return Err(too_large(limit));
    }
    let entries = if multipart {
        let boundary = multer::parse_boundary(&content_type)
            .map_err(|e| HttpError::new(400, format!("bad multipart body: {e}")))?;
        write_multipart(guest, caller, path, body, boundary, limit, &metadata).await?
    } else {
        let path = path
            .filter(|p| !p.is_empty())
            .ok_or_else(|| HttpError::new(400, "path is required for an octet-stream upload"))?;
        let data = decoded(&parts.headers, body)?;
        vec![
            write_one(guest, caller, path, data, limit, 0, &metadata)
                .await?
                .0,
        ]
    };
    // A multipart body with no file part writes nothing: `200 []`, as envd answers.
    Ok((StatusCode::OK, Json(entries)).into_response())
}

/// The file metadata of `X-Metadata-<key>: <value>` headers (keys lowercased, the first
/// value of a repeated header), as envd reads them.
fn metadata_headers(headers: &HeaderMap) -> Result<BTreeMap<String, String>, HttpError> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER_PREFIX) else {
            continue;
        };
        if key.is_empty() || out.contains_key(key) {
            continue;
        }
        let value = value
            .to_str()
            .map_err(|_| HttpError::new(400, format!("metadata {key:?}: not printable ASCII")))?;
        out.insert(key.to_owned(), value.to_owned());
    }
    space_core::files::validate_file_metadata(&out)
        .map_err(|e| HttpError::new(400, format!("bad X-Metadata-* headers: {e}")))?;
    Ok(out)
}

/// The body's bytes, gzip-decoded when `Content-Encoding: gzip`.
fn decoded(
    headers: &HeaderMap,
    body: Body,
) -> Result<BoxStream<'static, Result<Bytes, io::Error>>, HttpError> {
    let raw = body.into_data_stream().map_err(io::Error::other).boxed();
    match headers.get(CONTENT_ENCODING).and_then(|v| v.to_str().ok()) {
        None | Some("identity") | Some("") => Ok(raw),
        Some(e) if e.eq_ignore_ascii_case("gzip") => {
            let reader = tokio::io::BufReader::new(StreamReader::new(raw));
            let decoder = async_compression::tokio::bufread::GzipDecoder::new(reader);
            Ok(ReaderStream::new(decoder).boxed())
        }
        Some(other) => Err(HttpError::new(
            415,
            format!(
                "Content-Encoding {:?} is not supported: send gzip or identity",
                excerpt(other, 32)
            ),
        )),
    }
}

/// Writes one file from `data`, counting it against what is left of `limit` after `used`;
/// returns the entry and its size.
async fn write_one(
    guest: &GuestClient,
    caller: &EnvdCaller,
    path: &str,
    data: BoxStream<'static, Result<Bytes, io::Error>>,
    limit: u64,
    used: u64,
    metadata: &BTreeMap<String, String>,
) -> Result<(WrittenEntry, u64), HttpError> {
    let path = normalize(path).map_err(|e| HttpError::new(400, e.message))?;
    let (data, exceeded) = limit_stream(data, limit.saturating_sub(used));
    match guest
        .write_file(&path, caller.user.as_deref(), None, metadata, data)
        .await
    {
        Ok(stat) => Ok((
            WrittenEntry {
                name: stat.name,
                kind: "file",
                path: stat.path,
                metadata: stat.metadata,
            },
            stat.size,
        )),
        Err(_) if exceeded.load(Ordering::SeqCst) => Err(too_large(limit)),
        Err(e) if e.code() == ErrorCode::PayloadTooLarge => Err(too_large(limit)),
        Err(e) => Err(HttpError::from(ApiError::from(e))),
    }
}

async fn write_multipart(
    guest: &GuestClient,
    caller: &EnvdCaller,
    path: Option<&str>,
    body: Body,
    boundary: String,
    limit: u64,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<WrittenEntry>, HttpError> {
    // multer's own bounds sit just above ours, so our count (which knows the limit the
    // client must be told) trips first.
    let slack = (MAX_PART_HEADERS * MAX_UPLOAD_PARTS) as u64;
    let constraints = multer::Constraints::new().size_limit(
        multer::SizeLimit::new()
            .whole_stream(limit.saturating_add(slack))
            .per_field(limit.saturating_add(slack)),
    );
    let mut multipart =
        multer::Multipart::with_constraints(body.into_data_stream(), boundary, constraints);
    let mut written: Vec<WrittenEntry> = Vec::new();
    let mut used = 0u64;
    loop {
        let field = match multipart.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(
                multer::Error::StreamSizeExceeded { .. } | multer::Error::FieldSizeExceeded { .. },
            ) => return Err(too_large(limit)),
            Err(e) => return Err(HttpError::new(400, format!("bad multipart body: {e}"))),
        };
        if field.name() != Some("file") {
            continue;
        }
        if written.len() == MAX_UPLOAD_PARTS {
            return Err(HttpError::new(
                400,
                format!("at most {MAX_UPLOAD_PARTS} files per upload"),
            ));
        }
        // The query's path names the file of a one-file upload; otherwise each part's
        // filename is its destination.
        let dest = match (path.filter(|p| !p.is_empty()), field.file_name()) {
            (Some(p), _) => p.to_owned(),
            (None, Some(name)) if !name.is_empty() => name.to_owned(),
            _ => {
                return Err(HttpError::new(
                    400,
                    "a file part has no filename and no path was given",
                ))
            }
        };
        let data = field.map_err(io::Error::other).boxed();
        let (entry, size) = write_one(guest, caller, &dest, data, limit, used, metadata).await?;
        used = used.saturating_add(size);
        written.push(entry);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_as_the_sdks_send_them() {
        let q = serde_urlencoded_query(Some(
            "path=%2Fhome%2Fuser%2Fa%20b.txt&username=root&signature=v1_x&signature_expiration=5",
        ))
        .unwrap();
        assert_eq!(q.path.as_deref(), Some("/home/user/a b.txt"));
        assert_eq!(q.username.as_deref(), Some("root"));
        assert_eq!(q.signature_expiration, Some(5));
        assert!(serde_urlencoded_query(Some("signature_expiration=soon")).is_err());
    }
}
