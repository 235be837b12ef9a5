//! The `Idempotency-Key` middleware against real databases (SQLite always, PostgreSQL when
//! `SPACE_TEST_POSTGRES_URL` is set), around a toy router whose handlers count their calls:
//! replay, mismatch, concurrency, hang-ups, 5xx/4xx, streams, size limits, abandoned and
//! expired keys. The end-to-end version with real sandboxes is in
//! `crates/test-support/tests/idempotency.rs`.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{Method, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use space_control::api::idempotency::{idempotency, Idempotency, MAX_REQUEST_BODY};
use space_control::db::{
    now_ms, Db, IdempotencyState, NewIdempotencyKey, ReplicaId, StoredResponse,
};
use space_control::replica::Replica;
use space_control::service::Caller;
use space_core::{ErrorBody, ErrorCode, TenantId};
use tokio::sync::Semaphore;
use tower::ServiceExt;

#[derive(Clone)]
struct Toy {
    calls: Arc<AtomicUsize>,
    /// `/v1/slow` waits for a permit.
    gate: Arc<Semaphore>,
}

impl Toy {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn count(&self) -> usize {
        self.calls.fetch_add(1, Ordering::SeqCst) + 1
    }
}

async fn create(State(t): State<Toy>, body: Bytes) -> Response {
    let n = t.count();
    (
        StatusCode::CREATED,
        [
            (CONTENT_TYPE, "application/json".to_owned()),
            (LOCATION, format!("/v1/things/{n}")),
            (axum::http::header::CACHE_CONTROL, "no-store".to_owned()),
        ],
        format!("{{\"call\":{n},\"body_len\":{}}}", body.len()),
    )
        .into_response()
}

async fn slow(State(t): State<Toy>) -> Response {
    let n = t.count();
    t.gate.acquire().await.expect("gate").forget();
    (StatusCode::CREATED, format!("slow {n}")).into_response()
}

async fn flaky(State(t): State<Toy>) -> Response {
    let n = t.count();
    if n == 1 {
        (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response()
    } else {
        (StatusCode::CREATED, format!("ok {n}")).into_response()
    }
}

async fn missing(State(t): State<Toy>) -> Response {
    let n = t.count();
    (StatusCode::NOT_FOUND, format!("not found {n}")).into_response()
}

async fn stream(State(t): State<Toy>) -> Response {
    let n = t.count();
    (
        [(CONTENT_TYPE, "application/x-ndjson")],
        format!("{{\"call\":{n}}}\n"),
    )
        .into_response()
}

async fn big(State(t): State<Toy>) -> Response {
    t.count();
    let body = vec![b'x'; 2 * 1024 * 1024];
    // A stream, so the size is only discovered while reading.
    let chunks = body
        .chunks(64 * 1024)
        .map(|c| Ok::<_, std::io::Error>(Bytes::copy_from_slice(c)))
        .collect::<Vec<_>>();
    Body::from_stream(futures::stream::iter(chunks)).into_response()
}

async fn binary(State(t): State<Toy>) -> Response {
    let n = t.count();
    (
        [(CONTENT_TYPE, "application/x-custom")],
        vec![0u8, 0xff, 0x80, n as u8],
    )
        .into_response()
}

async fn panics(State(t): State<Toy>) -> Response {
    if t.count() == 1 {
        panic!("handler bug");
    }
    "recovered".into_response()
}

async fn remove(State(t): State<Toy>) -> StatusCode {
    if t.count() == 1 {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn read(State(t): State<Toy>) -> String {
    format!("read {}", t.count())
}

/// Stands in for authentication: the tenant id comes from `x-tenant`.
async fn fake_auth(mut req: Request, next: Next) -> Response {
    let id: TenantId = req.headers()["x-tenant"].to_str().unwrap().parse().unwrap();
    req.extensions_mut().insert(Caller {
        id,
        name: "t".into(),
        key_id: "key-test".into(),
    });
    next.run(req).await
}

/// How long a replica may be silent here before the fixture's replica takes it for dead.
const TEST_REPLICA_TIMEOUT: Duration = Duration::from_millis(300);

fn app(db: &Db, replica: &Replica, toy: &Toy) -> Router {
    Router::new()
        .route("/v1/things", post(create).get(read))
        .route("/v1/things/{id}", delete(remove))
        .route("/v1/slow", post(slow))
        .route("/v1/flaky", post(flaky))
        .route("/v1/missing", post(missing))
        .route("/v1/stream", post(stream))
        .route("/v1/big", post(big))
        .route("/v1/binary", put(binary))
        .route("/v1/panics", post(panics))
        .route("/v1/read", get(read))
        .route_layer(from_fn_with_state(
            Idempotency::new(db.clone(), replica.clone()),
            idempotency,
        ))
        .route_layer(from_fn(fake_auth))
        .with_state(toy.clone())
}

struct Fixture {
    _db: common::TestDb,
    db: Db,
    toy: Toy,
    app: Router,
    tenant: TenantId,
    label: &'static str,
}

async fn fixtures() -> Vec<Fixture> {
    let mut out = Vec::new();
    for t in common::test_dbs().await {
        let db = t.db.clone();
        let tenant = db.create_tenant("acme").await.unwrap().id;
        let toy = Toy {
            calls: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        };
        let replica = Replica::register_with_timeout(db.clone(), TEST_REPLICA_TIMEOUT)
            .await
            .unwrap();
        out.push(Fixture {
            app: app(&db, &replica, &toy),
            label: t.label,
            _db: t,
            db,
            toy,
            tenant,
        });
    }
    out
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Bytes,
}

impl Reply {
    fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    fn error(&self) -> ErrorBody {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not an ErrorBody ({e}): {} {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

fn request(
    tenant: &TenantId,
    method: Method,
    path: &str,
    key: Option<&str>,
    body: impl Into<Body>,
) -> Request {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("x-tenant", tenant.as_str());
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(body.into()).unwrap()
}

async fn send(app: &Router, req: Request) -> Reply {
    let resp = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: to_bytes(body, usize::MAX).await.unwrap(),
    }
}

impl Fixture {
    async fn call(&self, method: Method, path: &str, key: Option<&str>, body: &str) -> Reply {
        send(
            &self.app,
            request(&self.tenant, method, path, key, body.to_owned()),
        )
        .await
    }

    async fn post(&self, path: &str, key: &str, body: &str) -> Reply {
        self.call(Method::POST, path, Some(key), body).await
    }
}

async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn repeat_replays_the_stored_response() {
    for f in fixtures().await {
        let first = f.post("/v1/things", "k1", "{\"a\":1}").await;
        assert_eq!(first.status, StatusCode::CREATED, "{}", f.label);
        assert!(!first.replayed());
        assert_eq!(first.headers["cache-control"], "no-store");
        let second = f.post("/v1/things", "k1", "{\"a\":1}").await;
        assert_eq!(second.status, StatusCode::CREATED);
        assert!(second.replayed(), "{}", f.label);
        assert_eq!(second.body, first.body, "{}", f.label);
        assert_eq!(second.headers[CONTENT_TYPE], "application/json");
        assert_eq!(second.headers[LOCATION], first.headers[LOCATION]);
        // Only the headers that matter are stored.
        assert!(second.headers.get("cache-control").is_none());
        assert_eq!(f.toy.calls(), 1, "{}", f.label);

        // A new key is a new request.
        let third = f.post("/v1/things", "k2", "{\"a\":1}").await;
        assert!(!third.replayed());
        assert_eq!(f.toy.calls(), 2);

        // The row holds what the brief says.
        let row =
            f.db.idempotency_key(&f.tenant, "k1")
                .await
                .unwrap()
                .unwrap();
        assert_eq!(row.state, IdempotencyState::Done);
        assert_eq!(
            (row.method.as_str(), row.path.as_str()),
            ("POST", "/v1/things")
        );
        assert_eq!(
            row.fingerprint,
            space_control::api::idempotency::fingerprint("POST", "/v1/things", None, b"{\"a\":1}")
        );
        assert_eq!(row.response.unwrap().body, first.body.to_vec());
    }
}

#[tokio::test]
async fn same_key_for_another_request_is_refused() {
    for f in fixtures().await {
        f.post("/v1/things", "k", "{\"a\":1}").await;
        for (method, path, body) in [
            (Method::POST, "/v1/things", "{\"a\":2}"),
            (Method::POST, "/v1/things?x=1", "{\"a\":1}"),
            (Method::POST, "/v1/slow", "{\"a\":1}"),
            (Method::DELETE, "/v1/things/1", ""),
        ] {
            let r = f.call(method, path, Some("k"), body).await;
            assert_eq!(r.status.as_u16(), 422, "{} {path}", f.label);
            let e = r.error();
            assert_eq!(e.code, ErrorCode::IdempotencyKeyReused);
            assert!(e.message.contains("POST /v1/things"), "{}", e.message);
        }
        assert_eq!(f.toy.calls(), 1, "{}", f.label);
    }
}

#[tokio::test]
async fn without_a_key_or_for_reads_nothing_changes() {
    for f in fixtures().await {
        for _ in 0..2 {
            let r = f.call(Method::POST, "/v1/things", None, "{}").await;
            assert!(!r.replayed());
            let r = f.call(Method::GET, "/v1/read", Some("k"), "").await;
            assert_eq!(r.status, StatusCode::OK);
            assert!(!r.replayed());
        }
        assert_eq!(f.toy.calls(), 4, "{}", f.label);
        assert!(f
            .db
            .idempotency_key(&f.tenant, "k")
            .await
            .unwrap()
            .is_none());
    }
}

#[tokio::test]
async fn malformed_keys_are_refused() {
    for f in fixtures().await {
        let long = "k".repeat(256);
        for key in ["", &long, "tab\tkey"] {
            let r = f.post("/v1/things", key, "{}").await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{key:?}");
            assert_eq!(r.error().code, ErrorCode::InvalidRequest);
        }
        let mut req = request(&f.tenant, Method::POST, "/v1/things", Some("a"), "{}");
        req.headers_mut()
            .append("idempotency-key", "b".parse().unwrap());
        let r = send(&f.app, req).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        let mut req = request(&f.tenant, Method::POST, "/v1/things", None, "{}");
        req.headers_mut().insert(
            "idempotency-key",
            axum::http::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        );
        assert_eq!(send(&f.app, req).await.status, StatusCode::BAD_REQUEST);
        // The longest key is fine.
        let ok = f.post("/v1/things", &"k".repeat(255), "{}").await;
        assert_eq!(ok.status, StatusCode::CREATED);
        assert_eq!(f.toy.calls(), 1, "{}", f.label);
    }
}

#[tokio::test]
async fn keys_are_per_tenant() {
    for f in fixtures().await {
        let other = f.db.create_tenant("other").await.unwrap().id;
        let a = f.post("/v1/things", "shared", "{}").await;
        let b = send(
            &f.app,
            request(&other, Method::POST, "/v1/things", Some("shared"), "{}"),
        )
        .await;
        assert!(!a.replayed() && !b.replayed(), "{}", f.label);
        assert_ne!(a.body, b.body);
        // A different body under the other tenant is not a reuse of this tenant's key.
        let c = send(
            &f.app,
            request(
                &other,
                Method::POST,
                "/v1/things",
                Some("mine"),
                "{\"x\":1}",
            ),
        )
        .await;
        assert_eq!(c.status, StatusCode::CREATED);
        let c2 = f.post("/v1/things", "mine", "{}").await;
        assert_eq!(c2.status, StatusCode::CREATED);
        assert!(!c2.replayed());
        // Each replays its own.
        let a2 = f.post("/v1/things", "shared", "{}").await;
        assert!(a2.replayed());
        assert_eq!(a2.body, a.body);
        assert_eq!(f.toy.calls(), 4, "{}", f.label);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_run_once() {
    for f in fixtures().await {
        let requests = (0..5).map(|_| {
            let app = f.app.clone();
            let tenant = f.tenant.clone();
            tokio::spawn(async move {
                send(
                    &app,
                    request(&tenant, Method::POST, "/v1/slow", Some("c"), "{}"),
                )
                .await
            })
        });
        let handles: Vec<_> = requests.collect();
        // Exactly one runs; the others are refused while it does.
        wait_for("the first call", async || f.toy.calls() == 1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let mut conflicts = 0;
        let mut pending = Vec::new();
        for h in handles {
            if h.is_finished() {
                let r = h.await.unwrap();
                assert_eq!(r.status, StatusCode::CONFLICT, "{}", f.label);
                let e = r.error();
                assert_eq!(e.code, ErrorCode::Conflict);
                assert!(e.message.contains("still in progress"));
                conflicts += 1;
            } else {
                pending.push(h);
            }
        }
        assert_eq!((conflicts, pending.len()), (4, 1), "{}", f.label);
        f.toy.gate.add_permits(1);
        let first = pending.pop().unwrap().await.unwrap();
        assert_eq!(first.status, StatusCode::CREATED);
        let again = f.post("/v1/slow", "c", "{}").await;
        assert!(again.replayed());
        assert_eq!(again.body, first.body);
        assert_eq!(f.toy.calls(), 1, "{}", f.label);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_hangs_up_does_not_cancel_the_request() {
    for f in fixtures().await {
        let app = f.app.clone();
        let tenant = f.tenant.clone();
        let client = tokio::spawn(async move {
            send(
                &app,
                request(&tenant, Method::POST, "/v1/slow", Some("h"), "{}"),
            )
            .await
        });
        wait_for("the call", async || f.toy.calls() == 1).await;
        client.abort(); // the client times out
        let _ = client.await;
        // The retry while the work goes on is told so.
        assert_eq!(
            f.post("/v1/slow", "h", "{}").await.status,
            StatusCode::CONFLICT
        );
        f.toy.gate.add_permits(1);
        wait_for("the stored response", async || {
            f.db.idempotency_key(&f.tenant, "h")
                .await
                .unwrap()
                .is_some_and(|r| r.state == IdempotencyState::Done)
        })
        .await;
        let retry = f.post("/v1/slow", "h", "{}").await;
        assert!(retry.replayed(), "{}", f.label);
        assert_eq!(retry.body, "slow 1");
        assert_eq!(f.toy.calls(), 1, "{}", f.label);
    }
}

#[tokio::test]
async fn server_errors_release_the_key_and_client_errors_are_stored() {
    for f in fixtures().await {
        let r1 = f.post("/v1/flaky", "f", "{}").await;
        assert_eq!(r1.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(f
            .db
            .idempotency_key(&f.tenant, "f")
            .await
            .unwrap()
            .is_none());
        let r2 = f.post("/v1/flaky", "f", "{}").await;
        assert_eq!(r2.status, StatusCode::CREATED);
        assert!(!r2.replayed(), "{}", f.label);
        let r3 = f.post("/v1/flaky", "f", "{}").await;
        assert!(r3.replayed());
        assert_eq!(r3.body, "ok 2");

        let n1 = f.post("/v1/missing", "m", "{}").await;
        let n2 = f.post("/v1/missing", "m", "{}").await;
        assert_eq!(
            (n1.status, n2.status),
            (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND)
        );
        assert!(n2.replayed());
        assert_eq!(n2.body, n1.body);
        assert_eq!(f.toy.calls(), 3, "{}", f.label);
    }
}

#[tokio::test]
async fn a_panicking_handler_releases_the_key() {
    for f in fixtures().await {
        let r = f.post("/v1/panics", "p", "{}").await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(r.error().code, ErrorCode::Internal);
        let r = f.post("/v1/panics", "p", "{}").await;
        assert_eq!(r.status, StatusCode::OK, "{}", f.label);
        assert_eq!(r.body, "recovered");
    }
}

#[tokio::test]
async fn streams_and_large_responses_are_not_stored() {
    for f in fixtures().await {
        let s1 = f.post("/v1/stream", "s", "{}").await;
        let s2 = f.post("/v1/stream", "s", "{}").await;
        assert!(!s1.replayed() && !s2.replayed(), "{}", f.label);
        assert_eq!(s2.body, "{\"call\":2}\n");
        assert!(f
            .db
            .idempotency_key(&f.tenant, "s")
            .await
            .unwrap()
            .is_none());

        let b1 = f.post("/v1/big", "b", "{}").await;
        assert_eq!(b1.body.len(), 2 * 1024 * 1024, "{}", f.label);
        assert!(b1.body.iter().all(|&b| b == b'x'));
        assert!(f
            .db
            .idempotency_key(&f.tenant, "b")
            .await
            .unwrap()
            .is_none());
        let b2 = f.post("/v1/big", "b", "{}").await;
        assert!(!b2.replayed());
        assert_eq!(f.toy.calls(), 4, "{}", f.label);
    }
}

#[tokio::test]
async fn binary_bodies_replay_byte_for_byte() {
    for f in fixtures().await {
        let a = f.call(Method::PUT, "/v1/binary", Some("bin"), "x").await;
        let b = f.call(Method::PUT, "/v1/binary", Some("bin"), "x").await;
        assert!(b.replayed(), "{}", f.label);
        assert_eq!(a.body, b.body);
        assert_eq!(&a.body[..], &[0u8, 0xff, 0x80, 1]);
        assert_eq!(b.headers[CONTENT_TYPE], "application/x-custom");
    }
}

#[tokio::test]
async fn delete_is_replayed_instead_of_404() {
    for f in fixtures().await {
        let d1 = f.call(Method::DELETE, "/v1/things/1", Some("d"), "").await;
        let d2 = f.call(Method::DELETE, "/v1/things/1", Some("d"), "").await;
        assert_eq!(
            (d1.status, d2.status),
            (StatusCode::NO_CONTENT, StatusCode::NO_CONTENT)
        );
        assert!(d2.replayed(), "{}", f.label);
        // Without the key the second delete does run (and finds nothing).
        let d3 = f.call(Method::DELETE, "/v1/things/1", None, "").await;
        assert_eq!(d3.status, StatusCode::NOT_FOUND);
    }
}

#[tokio::test]
async fn request_bodies_with_a_key_are_bounded() {
    for f in fixtures().await {
        let at_limit = "x".repeat(MAX_REQUEST_BODY);
        let ok = f.post("/v1/things", "big-ok", &at_limit).await;
        assert_eq!(ok.status, StatusCode::CREATED, "{}", f.label);
        assert!(
            String::from_utf8_lossy(&ok.body).contains(&format!("\"body_len\":{MAX_REQUEST_BODY}"))
        );

        let over = "x".repeat(MAX_REQUEST_BODY + 1);
        let r = f.post("/v1/things", "big", &over).await;
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
        let e = r.error();
        assert_eq!(e.code, ErrorCode::PayloadTooLarge);
        assert!(e.message.contains("Idempotency-Key"), "{}", e.message);
        // Streamed (no Content-Length) too.
        let chunks = over
            .as_bytes()
            .chunks(4096)
            .map(|c| Ok::<_, std::io::Error>(Bytes::copy_from_slice(c)))
            .collect::<Vec<_>>();
        let body = Body::from_stream(futures::stream::iter(chunks));
        let r = send(
            &f.app,
            request(&f.tenant, Method::POST, "/v1/things", Some("big"), body),
        )
        .await;
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(f
            .db
            .idempotency_key(&f.tenant, "big")
            .await
            .unwrap()
            .is_none());
        // Without a key the body is not touched: the handler sees all of it.
        let r = f.call(Method::POST, "/v1/things", None, &over).await;
        assert!(String::from_utf8_lossy(&r.body)
            .contains(&format!("\"body_len\":{}", MAX_REQUEST_BODY + 1)));
        assert_eq!(f.toy.calls(), 2, "{}", f.label);
    }
}

/// A request another replica, `by`, claimed `age` ago and has not finished.
async fn stage_by(f: &Fixture, key: &str, age: Duration, by: &ReplicaId) -> String {
    let token = format!("crashed-{key}");
    let claimed =
        f.db.claim_idempotency_key(&NewIdempotencyKey {
            tenant_id: &f.tenant,
            key,
            token: &token,
            method: "POST",
            path: "/v1/things",
            fingerprint: &space_control::api::idempotency::fingerprint(
                "POST",
                "/v1/things",
                None,
                b"{}",
            ),
            now_ms: now_ms() - age.as_millis() as i64,
            replica: by,
        })
        .await
        .unwrap();
    assert!(claimed);
    token
}

/// A request a replica that is alive now (registered, not heartbeating) claimed.
async fn stage(f: &Fixture, key: &str, age: Duration) -> String {
    let other = ReplicaId::generate();
    f.db.register_replica(&other, "elsewhere").await.unwrap();
    stage_by(f, key, age, &other).await
}

#[tokio::test]
async fn abandoned_and_expired_keys_are_released() {
    for f in fixtures().await {
        // Another replica runs it: in progress, however old, while that replica lives...
        stage(&f, "running", Duration::from_secs(600)).await;
        assert_eq!(
            f.post("/v1/things", "running", "{}").await.status,
            StatusCode::CONFLICT,
            "{}",
            f.label
        );
        // ...and abandoned once it is dead (its heartbeat lapsed).
        tokio::time::sleep(TEST_REPLICA_TIMEOUT * 2).await;
        let r = f.post("/v1/things", "running", "{}").await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", f.label);
        assert!(!r.replayed());
        assert!(f.post("/v1/things", "running", "{}").await.replayed());

        // A response stored 25 hours ago is forgotten.
        let token = stage(&f, "stale", Duration::from_secs(25 * 3600)).await;
        let stored = StoredResponse {
            status: 201,
            headers: vec![],
            body: b"ancient".to_vec(),
        };
        assert!(f
            .db
            .complete_idempotency_key(&f.tenant, "stale", &token, &stored, now_ms())
            .await
            .unwrap());
        let r = f.post("/v1/things", "stale", "{}").await;
        assert!(!r.replayed(), "{}", f.label);
        assert_ne!(r.body, "ancient");
        assert_eq!(f.toy.calls(), 2, "{}", f.label);
    }
}

#[tokio::test]
async fn database_claims_are_exclusive_and_tokened() {
    for f in fixtures().await {
        let db = &f.db;
        let token = stage(&f, "x", Duration::ZERO).await;
        let again = NewIdempotencyKey {
            tenant_id: &f.tenant,
            key: "x",
            token: "other",
            method: "POST",
            path: "/",
            fingerprint: "f",
            now_ms: now_ms(),
            replica: &ReplicaId::generate(),
        };
        assert!(
            !db.claim_idempotency_key(&again).await.unwrap(),
            "{}",
            f.label
        );
        let resp = StoredResponse {
            status: 200,
            headers: vec![("content-type".into(), "a/b".into())],
            body: vec![0, 1, 2, 255],
        };
        // Only the claimant completes or releases.
        assert!(!db
            .complete_idempotency_key(&f.tenant, "x", "other", &resp, now_ms())
            .await
            .unwrap());
        assert!(!db
            .release_idempotency_key(&f.tenant, "x", "other")
            .await
            .unwrap());
        assert!(db
            .complete_idempotency_key(&f.tenant, "x", &token, &resp, now_ms())
            .await
            .unwrap());
        // Completing twice does nothing.
        assert!(!db
            .complete_idempotency_key(&f.tenant, "x", &token, &resp, now_ms())
            .await
            .unwrap());
        let row = db.idempotency_key(&f.tenant, "x").await.unwrap().unwrap();
        assert_eq!(row.response, Some(resp), "{}", f.label);
        // Expiry removes done rows too.
        assert_eq!(
            db.delete_idempotency_keys_before(now_ms() + 1)
                .await
                .unwrap(),
            1
        );
        assert!(db.idempotency_key(&f.tenant, "x").await.unwrap().is_none());
    }
}
