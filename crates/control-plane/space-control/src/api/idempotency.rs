//! `Idempotency-Key`: a client that retries a mutating request (after a timeout, a dropped
//! connection...) with the same key gets the first response again instead of doing the
//! work twice.
//!
//! A middleware on every authenticated `/v1` route, for `POST`, `PUT`, `PATCH` and `DELETE`
//! requests that carry the header (everything else passes through untouched, so streamed
//! uploads without the header are never buffered):
//!
//! - The key is 1-[`MAX_KEY_LEN`] printable ASCII characters, scoped to the tenant: two
//!   tenants may use the same key independently.
//! - The request body is buffered (at most [`MAX_REQUEST_BODY`]; more is `413`) and the
//!   request fingerprinted: SHA-256 of method, path, query and body.
//! - The first request claims the key in the database (`in_progress`, atomically: of two
//!   concurrent requests exactly one runs, the other gets `409 conflict`), runs, and its
//!   response (status, `Content-Type`, `Location`, body) is stored (`done`) and returned.
//! - A repeat with the same fingerprint gets the stored response, byte for byte, with
//!   `Idempotent-Replayed: true`. A surface whose responses carry credentials (the E2B
//!   surface's sandbox tokens) gives a [`ResponseCredentials`]: they are taken out of the
//!   body before it is stored and handed out afresh on a replay, so the database never holds
//!   a token and a replay never returns one that was revoked since. The same key with another fingerprint is `422
//!   idempotency_key_reused`.
//! - A `5xx` response releases the key (the client may retry); `4xx` responses are stored
//!   like successes, since the same request would fail the same way.
//! - **Streaming responses are not replayable**: an `application/x-ndjson` or
//!   `application/octet-stream` response, or any body over [`MAX_STORED_RESPONSE`], is
//!   passed through and the key released, so a retry runs the request again.
//! - The handler runs in its own task: a client that hangs up does not cancel it, and the
//!   retry finds the stored response (or `409` while it still runs).
//! - Keys expire after [`KEY_TTL`]. An `in_progress` row names the replica running its
//!   request; it is abandoned, and replaced, when that replica is dead (or is this one and
//!   no longer runs it). The leader also forgets a dead replica's unfinished claims
//!   (`db::replicas`). A row from before replicas were named is abandoned after
//!   [`ABANDONED_AFTER`].

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use space_core::{ErrorCode, TenantId};
use tracing::Instrument;
use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, OpenApi, Ref, RefOr, Required};

use super::error::ApiError;
use super::extract::{read_limited, MAX_JSON_BODY};
use crate::db::{now_ms, Db, DbError, IdempotencyState, NewIdempotencyKey, StoredResponse};
use crate::service::Caller;

/// The request header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// The response header on a replayed response (value `true`).
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 255;
/// Largest request body sent with a key (it is buffered to be fingerprinted): the JSON
/// body limit, so every JSON endpoint works with a key.
pub const MAX_REQUEST_BODY: usize = MAX_JSON_BODY;
/// Largest response body stored for replay; a larger response releases its key.
pub const MAX_STORED_RESPONSE: usize = 1024 * 1024;
/// How long a key is remembered.
pub const KEY_TTL: Duration = Duration::from_secs(24 * 3600);
/// Age after which an `in_progress` row that no request of this process is running counts
/// as abandoned (its server died mid-request).
pub const ABANDONED_AFTER: Duration = Duration::from_secs(5 * 60);
/// How often expired keys are deleted (checked when a key is claimed).
pub const CLEANUP_INTERVAL: Duration = Duration::from_secs(60);
/// Response headers stored and replayed (besides the status and body).
pub const STORED_HEADERS: [HeaderName; 2] = [CONTENT_TYPE, LOCATION];
/// Response content types that are streams: never stored, the key is released.
pub const STREAMING_CONTENT_TYPES: [&str; 3] = [
    "application/x-ndjson",
    "application/octet-stream",
    "text/event-stream",
];

/// Whether a method is subject to idempotency keys.
pub fn applies_to(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// Checks a key: 1-[`MAX_KEY_LEN`] bytes, each printable ASCII (space to `~`).
pub fn validate_key(raw: &[u8]) -> Result<&str, String> {
    if raw.is_empty() || raw.len() > MAX_KEY_LEN {
        return Err(format!(
            "Idempotency-Key must be 1-{MAX_KEY_LEN} characters, got {}",
            raw.len()
        ));
    }
    if !raw.iter().all(|b| (0x20..=0x7e).contains(b)) {
        return Err("Idempotency-Key must be printable ASCII".to_owned());
    }
    std::str::from_utf8(raw).map_err(|e| e.to_string())
}

/// SHA-256 (hex) of a request: method, path, query (absent = empty) and body, each
/// length-prefixed so no two different requests share an input.
pub fn fingerprint(method: &str, path: &str, query: Option<&str>, body: &[u8]) -> String {
    let mut h = Sha256::new();
    for part in [
        method.as_bytes(),
        path.as_bytes(),
        query.unwrap_or("").as_bytes(),
        body,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    hex::encode(h.finalize())
}

/// Whether a response is a stream (by content type), which is never stored.
pub fn is_streaming(headers: &axum::http::HeaderMap) -> bool {
    let Some(ct) = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = ct.split(';').next().unwrap_or("").trim();
    STREAMING_CONTENT_TYPES
        .iter()
        .any(|t| essence.eq_ignore_ascii_case(t))
}

/// Credentials a surface's responses carry, which must not be stored with them: a token
/// in the idempotency table would outlive its revocation and sit in every database backup.
pub trait ResponseCredentials: Send + Sync + 'static {
    /// The body to store: `body` without its credentials (unchanged if it has none).
    fn strip(&self, body: Bytes) -> Bytes;
    /// The body to replay: a stored body with its credentials handed out again, as they
    /// are now (after a revocation, the new ones).
    fn restore<'a>(
        &'a self,
        tenant: &'a TenantId,
        body: Bytes,
    ) -> futures::future::BoxFuture<'a, Result<Bytes, ApiError>>;
}

/// The middleware's state: the database and the claims running in this process. Cheap to
/// clone; build one per server.
#[derive(Clone)]
pub struct Idempotency {
    db: Db,
    replica: crate::replica::Replica,
    shared: Arc<Shared>,
    credentials: Option<Arc<dyn ResponseCredentials>>,
}

struct Shared {
    /// Tokens of the claims whose request runs in this process (never abandoned).
    running: Mutex<HashSet<String>>,
    /// When expired keys are next deleted, ms since the Unix epoch.
    next_cleanup_ms: AtomicI64,
}

/// A key this request claimed.
#[derive(Debug, Clone)]
struct Claim {
    tenant: TenantId,
    key: String,
    token: String,
}

/// What the database says about a key.
enum Outcome {
    /// This request claimed it: run.
    Run(Claim),
    /// Done before: replay.
    Replay(StoredResponse),
    /// Another request with this key is running.
    InProgress,
    /// Used before for another request.
    Mismatch { method: String, path: String },
}

impl Idempotency {
    /// State for one server, running requests as `replica`.
    pub fn new(db: Db, replica: crate::replica::Replica) -> Self {
        Self {
            db,
            replica,
            shared: Arc::new(Shared {
                running: Mutex::new(HashSet::new()),
                next_cleanup_ms: AtomicI64::new(0),
            }),
            credentials: None,
        }
    }

    /// State for a surface whose responses carry `credentials`.
    pub fn with_credentials(
        db: Db,
        replica: crate::replica::Replica,
        credentials: Arc<dyn ResponseCredentials>,
    ) -> Self {
        Self {
            credentials: Some(credentials),
            ..Self::new(db, replica)
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        // Single inserts and removes: a poisoned lock still holds a consistent set.
        self.shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a row is left over from a request that will never finish: its replica is
    /// dead, or is this one and does not run it.
    async fn is_abandoned(
        &self,
        row: &crate::db::IdempotencyRecord,
        now: i64,
    ) -> Result<bool, DbError> {
        if row.state != IdempotencyState::InProgress || self.running().contains(&row.token) {
            return Ok(false);
        }
        Ok(match &row.replica {
            Some(r) if r == self.replica.id() => true,
            Some(r) => !self.replica.alive(r).await?,
            None => row.created_at_ms < now - duration_ms(ABANDONED_AFTER),
        })
    }

    /// Deletes expired keys, at most once per [`CLEANUP_INTERVAL`] (errors are logged).
    async fn cleanup_expired(&self, now: i64) {
        let next = self.shared.next_cleanup_ms.load(Ordering::Relaxed);
        if now < next
            || self
                .shared
                .next_cleanup_ms
                .compare_exchange(
                    next,
                    now + duration_ms(CLEANUP_INTERVAL),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        match self
            .db
            .delete_idempotency_keys_before(now - duration_ms(KEY_TTL))
            .await
        {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deleted = n, "deleted expired idempotency keys"),
            Err(e) => tracing::warn!(error = %e, "deleting expired idempotency keys failed"),
        }
    }

    /// Claims the key, or says why not. Expired and abandoned rows are replaced.
    async fn claim(
        &self,
        tenant: &TenantId,
        key: &str,
        method: &str,
        path: &str,
        fingerprint: &str,
    ) -> Result<Outcome, DbError> {
        let now = now_ms();
        self.cleanup_expired(now).await;
        // Each round either claims, decides, or deletes a stale row; a few rounds are only
        // needed when other requests race on the same stale key.
        for _ in 0..4 {
            let token = new_token();
            // Running before the row exists: a concurrent request of this replica must
            // never take the new row for abandoned.
            self.running().insert(token.clone());
            let claimed = self
                .db
                .claim_idempotency_key(&NewIdempotencyKey {
                    tenant_id: tenant,
                    key,
                    token: &token,
                    method,
                    path,
                    fingerprint,
                    now_ms: now,
                    replica: self.replica.id(),
                })
                .await;
            if !matches!(claimed, Ok(true)) {
                self.running().remove(&token);
            }
            if claimed? {
                return Ok(Outcome::Run(Claim {
                    tenant: tenant.clone(),
                    key: key.to_owned(),
                    token,
                }));
            }
            let Some(row) = self.db.idempotency_key(tenant, key).await? else {
                continue; // released in between
            };
            let expired = row.created_at_ms < now - duration_ms(KEY_TTL);
            if expired || self.is_abandoned(&row, now).await? {
                if row.state == IdempotencyState::InProgress {
                    tracing::warn!(tenant = %tenant, method = %row.method, path = %row.path, "releasing an abandoned idempotency key");
                }
                self.db
                    .release_idempotency_key(tenant, key, &row.token)
                    .await?;
                continue;
            }
            if row.fingerprint != fingerprint {
                return Ok(Outcome::Mismatch {
                    method: row.method,
                    path: row.path,
                });
            }
            return Ok(match row.response {
                Some(stored) if row.state == IdempotencyState::Done => Outcome::Replay(stored),
                _ => Outcome::InProgress,
            });
        }
        Ok(Outcome::InProgress)
    }

    /// Releases a claim (errors are logged: the row then ages into "abandoned").
    async fn release(&self, claim: &Claim) {
        if let Err(e) = self
            .db
            .release_idempotency_key(&claim.tenant, &claim.key, &claim.token)
            .await
        {
            tracing::warn!(error = %e, tenant = %claim.tenant, "releasing an idempotency key failed");
        }
    }

    /// Runs the request in its own task (a client hanging up does not cancel it) and
    /// records its response.
    async fn run(&self, claim: Claim, req: Request, next: Next) -> Response {
        self.running().insert(claim.token.clone());
        let guard = RunningGuard {
            idem: self.clone(),
            token: claim.token.clone(),
        };
        let this = self.clone();
        let task_claim = claim.clone();
        let task = tokio::spawn(
            async move {
                let _running = guard;
                let response = next.run(req).await;
                this.finish(&task_claim, response).await
            }
            .instrument(tracing::Span::current()),
        );
        match task.await {
            Ok(response) => response,
            Err(e) => {
                self.release(&claim).await;
                ApiError::internal(format!("request handler failed: {e}")).into_response()
            }
        }
    }

    /// Stores a response for replay, or releases the key (5xx, streams, large bodies), and
    /// returns what the client gets.
    async fn finish(&self, claim: &Claim, response: Response) -> Response {
        let status = response.status();
        let too_large = response.body().size_hint().lower() > MAX_STORED_RESPONSE as u64;
        if status.is_server_error() || is_streaming(response.headers()) || too_large {
            self.release(claim).await;
            return response;
        }
        let (parts, body) = response.into_parts();
        let bytes = match collect_limited(body, MAX_STORED_RESPONSE).await {
            Collected::Whole(bytes) => bytes,
            Collected::TooLarge(body) => {
                self.release(claim).await;
                return Response::from_parts(parts, body);
            }
            Collected::Failed(e) => {
                self.release(claim).await;
                return ApiError::internal(format!("reading the response body: {e}"))
                    .into_response();
            }
        };
        let stored = StoredResponse {
            status: status.as_u16(),
            headers: STORED_HEADERS
                .iter()
                .filter_map(|name| {
                    let value = parts.headers.get(name)?.to_str().ok()?;
                    Some((name.as_str().to_owned(), value.to_owned()))
                })
                .collect(),
            body: match &self.credentials {
                Some(credentials) => credentials.strip(bytes.clone()).to_vec(),
                None => bytes.to_vec(),
            },
        };
        match self
            .db
            .complete_idempotency_key(&claim.tenant, &claim.key, &claim.token, &stored, now_ms())
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(tenant = %claim.tenant, "idempotency key was released before its response was stored")
            }
            Err(e) => {
                tracing::warn!(error = %e, tenant = %claim.tenant, "storing the response of an idempotency key failed; releasing it");
                self.release(claim).await;
            }
        }
        Response::from_parts(parts, Body::from(bytes))
    }
}

/// Removes a token from the running set when its task ends (even by panic).
struct RunningGuard {
    idem: Idempotency,
    token: String,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.idem.running().remove(&self.token);
    }
}

enum Collected {
    Whole(Bytes),
    /// Over the limit: the whole body again (what was read, then the rest).
    TooLarge(Body),
    Failed(axum::Error),
}

async fn collect_limited(body: Body, limit: usize) -> Collected {
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => return Collected::Failed(e),
        };
        buf.extend_from_slice(&chunk);
        if buf.len() > limit {
            let head = futures::stream::iter([Ok::<Bytes, axum::Error>(buf.freeze())]);
            return Collected::TooLarge(Body::from_stream(head.chain(stream)));
        }
    }
    Collected::Whole(buf.freeze())
}

fn new_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A stored response as sent again.
fn replay(stored: StoredResponse, body: Bytes) -> Response {
    let Ok(status) = StatusCode::from_u16(stored.status) else {
        return ApiError::internal(format!("stored status {} is invalid", stored.status))
            .into_response();
    };
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    for (name, value) in stored.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// The middleware (layer it inside authentication: it needs the [`Caller`]).
pub async fn idempotency(
    State(idem): State<Idempotency>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if !applies_to(req.method()) {
        return Ok(next.run(req).await);
    }
    let mut values = req.headers().get_all(&IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(next.run(req).await);
    };
    if values.next().is_some() {
        return Err(ApiError::invalid("send at most one Idempotency-Key header"));
    }
    let key = validate_key(value.as_bytes())
        .map_err(ApiError::invalid)?
        .to_owned();
    let tenant = req
        .extensions()
        .get::<Caller>()
        .ok_or_else(|| ApiError::unauthenticated("missing API key"))?
        .id
        .clone();

    let (parts, body) = req.into_parts();
    let body = read_limited(&parts.headers, body, MAX_REQUEST_BODY)
        .await
        .map_err(|e| {
            if e.body.code == ErrorCode::PayloadTooLarge {
                ApiError::too_large(format!(
                    "a request with an Idempotency-Key may have a body of at most {MAX_REQUEST_BODY} bytes (it is buffered to be fingerprinted); send larger uploads without the header"
                ))
            } else {
                e
            }
        })?;
    let method = parts.method.as_str().to_owned();
    let path = parts.uri.path().to_owned();
    let fp = fingerprint(&method, &path, parts.uri.query(), &body);
    let req = Request::from_parts(parts, Body::from(body));

    match idem.claim(&tenant, &key, &method, &path, &fp).await? {
        Outcome::Run(claim) => Ok(idem.run(claim, req, next).await),
        Outcome::Replay(mut stored) => {
            tracing::debug!(tenant = %tenant, %method, %path, "replaying a stored response");
            let body = Bytes::from(std::mem::take(&mut stored.body));
            let body = match &idem.credentials {
                Some(credentials) => credentials.restore(&tenant, body).await?,
                None => body,
            };
            Ok(replay(stored, body))
        }
        Outcome::InProgress => Err(ApiError::new(
            ErrorCode::Conflict,
            "a request with this Idempotency-Key is still in progress",
        )),
        Outcome::Mismatch { method, path } => Err(ApiError::new(
            ErrorCode::IdempotencyKeyReused,
            format!(
                "this Idempotency-Key was already used for a different request ({method} {path}); use a new key for a new request"
            ),
        )),
    }
}

/// At server start: deletes expired keys (errors are logged). Unfinished claims of a
/// replica that died are forgotten with it by the leader.
pub async fn delete_expired_at_start(db: &Db) {
    if let Err(e) = db
        .delete_idempotency_keys_before(now_ms() - duration_ms(KEY_TTL))
        .await
    {
        tracing::warn!(error = %e, "deleting expired idempotency keys failed");
    }
}

const HEADER_DOC: &str = "Makes a retry safe: a repeat of this request with the same key (within 24 h, same tenant) returns the stored first response, byte for byte (sandbox tokens excepted: they are never stored, and are handed out afresh), with `Idempotent-Replayed: true`, instead of doing the work again. 1-255 printable ASCII characters (a UUID is a good choice). The same key with a different method, path, query or body is `422 idempotency_key_reused`; while the first request still runs, `409 conflict`. A 5xx response is not stored (retry with the same key). With a key the body may be at most 1 MiB (`413` otherwise). Streaming responses (NDJSON, octet-stream) are not replayable: the key is released and a retry runs again.";

fn header_parameter() -> Parameter {
    ParameterBuilder::new()
        .name("Idempotency-Key")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .description(Some(HEADER_DOC))
        .schema(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(MAX_KEY_LEN)),
        ))
        .build()
}

fn error_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build(),
    )
}

fn document_operation(op: &mut Operation) {
    let params = op.parameters.get_or_insert_with(Vec::new);
    if !params.iter().any(|p| p.name == "Idempotency-Key") {
        params.push(header_parameter());
    }
    let replayed = HeaderBuilder::new()
        .schema(ObjectBuilder::new().schema_type(Type::String))
        .description(Some(
            "`true` when this is the stored response of an earlier request with the same Idempotency-Key",
        ))
        .build();
    for (status, response) in op.responses.responses.iter_mut() {
        if let (true, RefOr::T(response)) = (status.starts_with('2'), response) {
            response
                .headers
                .insert("Idempotent-Replayed".to_owned(), replayed.clone());
        }
    }
    let responses = &mut op.responses.responses;
    responses.entry("409".to_owned()).or_insert_with(|| {
        error_response("A request with the same Idempotency-Key is still in progress")
    });
    responses.entry("422".to_owned()).or_insert_with(|| {
        error_response("The Idempotency-Key was already used for a different request")
    });
}

/// Documents the header on every `POST`/`PUT`/`PATCH`/`DELETE` under `/v1/`.
pub fn document(doc: &mut OpenApi) {
    for (path, item) in doc.paths.paths.iter_mut() {
        if !path.starts_with("/v1/") {
            continue;
        }
        for op in [
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
        {
            document_operation(op);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(validate_key(b"a").unwrap(), "a");
        assert!(validate_key(b"0b7c6f1e-6c1f-4b8e-9d1e-2f4a5b6c7d8e").is_ok());
        assert!(validate_key(b"with space and ~!{}").is_ok());
        assert!(validate_key(&[b'k'; MAX_KEY_LEN]).is_ok());
        assert!(validate_key(&[b'k'; MAX_KEY_LEN + 1]).is_err());
        assert!(validate_key(b"").is_err());
        assert!(validate_key(b"tab\there").is_err());
        assert!(validate_key(b"nul\0").is_err());
        assert!(validate_key(b"del\x7f").is_err());
        assert!(validate_key("caf\u{e9}".as_bytes()).is_err());
    }

    #[test]
    fn fingerprints() {
        let base = fingerprint("POST", "/v1/sandboxes", None, b"{}");
        assert_eq!(base.len(), 64);
        assert_eq!(base, fingerprint("POST", "/v1/sandboxes", None, b"{}"));
        assert_eq!(base, fingerprint("POST", "/v1/sandboxes", Some(""), b"{}"));
        for other in [
            fingerprint("PUT", "/v1/sandboxes", None, b"{}"),
            fingerprint("POST", "/v1/sandboxes/x", None, b"{}"),
            fingerprint("POST", "/v1/sandboxes", Some("a=1"), b"{}"),
            fingerprint("POST", "/v1/sandboxes", None, b"{ }"),
            fingerprint("POST", "/v1/sandboxes", None, b""),
        ] {
            assert_ne!(base, other);
        }
        // Length prefixes: moving bytes between parts changes the fingerprint.
        assert_ne!(
            fingerprint("POST", "/a", Some("b"), b""),
            fingerprint("POST", "/ab", None, b"")
        );
        // A known vector, so the format does not change by accident (stored rows use it).
        assert_eq!(
            fingerprint("", "", None, b""),
            hex::encode(Sha256::digest([0u8; 32]))
        );
    }

    #[test]
    fn methods_and_streams() {
        assert!(applies_to(&Method::POST) && applies_to(&Method::DELETE));
        assert!(applies_to(&Method::PUT) && applies_to(&Method::PATCH));
        assert!(!applies_to(&Method::GET) && !applies_to(&Method::HEAD));
        let mut h = axum::http::HeaderMap::new();
        assert!(!is_streaming(&h));
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        assert!(!is_streaming(&h));
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("Application/X-NDJSON; charset=utf-8"),
        );
        assert!(is_streaming(&h));
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        assert!(is_streaming(&h));
    }

    #[test]
    fn replays_status_headers_and_body() {
        let r = replay(
            StoredResponse {
                status: 201,
                headers: vec![("content-type".into(), "application/json".into())],
                body: Vec::new(),
            },
            Bytes::from_static(b"{\"a\":1}"),
        );
        assert_eq!(r.status(), StatusCode::CREATED);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(r.headers()[IDEMPOTENT_REPLAYED], "true");
    }

    #[test]
    fn documents_mutating_v1_operations() {
        let doc = super::super::openapi::document();
        let json = serde_json::to_value(&doc).unwrap();
        let create = &json["paths"]["/v1/sandboxes"]["post"];
        let params = create["parameters"].as_array().unwrap();
        assert!(params
            .iter()
            .any(|p| p["name"] == "Idempotency-Key" && p["in"] == "header"));
        assert!(create["responses"]["201"]["headers"]["Idempotent-Replayed"].is_object());
        assert!(create["responses"]["409"].is_object());
        assert!(create["responses"]["422"].is_object());
        let list = &json["paths"]["/v1/sandboxes"]["get"];
        assert!(list["parameters"]
            .as_array()
            .is_none_or(|p| p.iter().all(|p| p["name"] != "Idempotency-Key")));
    }
}
