//! Serving a guest connection as HTTP (cleartext HTTP/1.1, or HTTP/1.1 and HTTP/2 inside
//! terminated TLS) and forwarding each request upstream.
//!
//! Every request is checked on its own: its `Host` / `:authority` must name the connection's
//! host and port (else **421**: the connection is bound to one pinned address of one name,
//! and the client should open a new connection for another origin), `CONNECT` is refused
//! (**405**), the policy is asked again (it may have changed; **403**), and the credential
//! manager, when there is one, rewrites or refuses it (**403** `egress_denied`). Hop-by-hop
//! headers are dropped both ways, and the headers that name another host to a front
//! (`Forwarded`, `X-Forwarded-Host`, `X-Original-Host`, …) on the way out. The request goes
//! out through a per-connection hyper client whose only connector reaches the admitted
//! address; its URI is rebuilt from the connection's own origin, never from anything the
//! guest sent.
//!
//! HTTP/1.1 WebSocket upgrades (`Upgrade: websocket`) are forwarded, and after both sides
//! switch protocols the two streams are spliced. Any other `Upgrade` (`h2c`, …) is dropped
//! from the request, which then goes on as a plain request.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ACCEPT_ENCODING, CONNECTION, CONTENT_TYPE, HOST, PROXY_AUTHENTICATE,
    PROXY_AUTHORIZATION, TE, TRANSFER_ENCODING, UPGRADE,
};
use http::uri::{Authority, Scheme};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper::upgrade::OnUpgrade;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioIo, TokioTimer};
use space_core::egress::Hostname;
use space_secrets::RequestContext;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tracing::{debug, info};

use super::io::{idle, splice, Activity};
use super::route::{self, Refusal, HTTPS_PORT, HTTP_PORT};
use super::scrubbed::{scrub_headers, Scrubbed};
use super::upstream::Connector;
use super::{first_bytes::Unnamed, Shared};
use crate::sniff::{MAX_HTTP_HEADERS, MAX_HTTP_HEAD_LEN};

/// The body of responses to the guest: upstream's (scrubbed of injected values), or one of
/// ours.
pub(super) type Body = Either<Scrubbed, Full<Bytes>>;

/// How long an idle upstream connection is kept for the next request of the same guest
/// connection.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Idle upstream connections kept per guest connection.
const POOL_MAX_IDLE: usize = 4;

/// A task after a protocol switch: the two upgraded streams spliced.
type Tunnel = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The one origin a guest connection may address.
#[derive(Debug, Clone)]
pub(super) struct Origin {
    /// The host name (SNI, or the first request's `Host`).
    pub(super) host: Hostname,
    /// The pinned address and the destination port.
    pub(super) addr: std::net::SocketAddr,
    /// Whether the guest's connection is TLS (terminated).
    pub(super) tls: bool,
}

impl Origin {
    fn scheme(&self) -> Scheme {
        if self.tls {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        }
    }

    fn default_port(&self) -> u16 {
        if self.tls {
            HTTPS_PORT
        } else {
            HTTP_PORT
        }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `host[:port]`, the port only when it is not the scheme's default.
    fn authority(&self) -> Option<Authority> {
        let text = if self.port() == self.default_port() {
            self.host.as_str().to_owned()
        } else {
            format!("{}:{}", self.host, self.port())
        };
        text.parse().ok()
    }
}

/// Spawns the tasks of one guest connection (HTTP/2 streams, upstream connection drivers):
/// they are cancelled when the connection's [`serve`] returns or is dropped.
#[derive(Clone)]
struct ScopedExecutor {
    alive: watch::Receiver<()>,
}

impl<F> hyper::rt::Executor<F> for ScopedExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        let mut alive = self.alive.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = fut => {}
                // Only ever an error: the sender is dropped when the connection ends.
                _ = alive.changed() => {}
            }
        });
    }
}

/// Serves the guest connection `io` (HTTP/2 when `h2`, else HTTP/1.1) until it closes,
/// fails, or idles past the limit; forwards its requests to `origin` through `connector`.
pub(super) async fn serve<I>(
    shared: Arc<Shared>,
    io: I,
    h2: bool,
    origin: Origin,
    connector: Connector,
    activity: Arc<Activity>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Some(authority) = origin.authority() else {
        // Unreachable: a valid host name and a port always make an authority.
        debug!(sandbox = %shared.sandbox, host = %origin.host, "egress: no authority for the origin");
        return;
    };
    let (_alive, alive) = watch::channel(());
    let exec = ScopedExecutor { alive };
    let client = Client::builder(exec.clone())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT)
        .pool_max_idle_per_host(POOL_MAX_IDLE)
        .build(connector);
    let (tunnel_tx, mut tunnel_rx) = mpsc::unbounded_channel();
    let limits = shared.limits.clone();
    let forwarder = Arc::new(Forwarder {
        shared,
        origin,
        authority,
        client,
        tunnels: tunnel_tx,
        activity: Arc::clone(&activity),
    });
    let service = service_fn(move |req| {
        let forwarder = Arc::clone(&forwarder);
        async move { Ok::<_, Infallible>(forwarder.forward(req).await) }
    });
    let io = TokioIo::new(io);
    let mut conn: Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>> = if h2 {
        let mut builder = http2::Builder::new(exec);
        builder
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_h2_streams)
            .max_header_list_size(limits.max_h2_header_list);
        Box::pin(builder.serve_connection(io, service))
    } else {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.sniff_timeout)
            // A client that shuts its write side after sending (nc, some scripts) still gets
            // its answers: the proxy must not drop requests it already read.
            .half_close(true)
            .max_header_size(MAX_HTTP_HEAD_LEN)
            .max_headers(MAX_HTTP_HEADERS);
        Box::pin(builder.serve_connection(io, service).with_upgrades())
    };
    let mut conn_done = false;
    let mut tunnels = JoinSet::new();
    loop {
        tokio::select! {
            result = &mut conn, if !conn_done => {
                conn_done = true;
                if let Err(error) = result {
                    debug!(%error, "egress: guest HTTP connection ended with an error");
                }
            }
            Some(tunnel) = tunnel_rx.recv() => {
                tunnels.spawn(tunnel);
            }
            Some(_) = tunnels.join_next(), if !tunnels.is_empty() => {}
            () = idle(&activity, limits.idle_timeout) => {
                debug!("egress: idle HTTP connection closed");
                break;
            }
        }
        if conn_done {
            while let Ok(tunnel) = tunnel_rx.try_recv() {
                tunnels.spawn(tunnel);
            }
            if tunnels.is_empty() {
                break;
            }
        }
    }
}

/// Checks and forwards the requests of one guest connection.
struct Forwarder {
    shared: Arc<Shared>,
    origin: Origin,
    /// The origin's authority, as sent upstream.
    authority: Authority,
    client: Client<Connector, Incoming>,
    tunnels: mpsc::UnboundedSender<Tunnel>,
    activity: Arc<Activity>,
}

/// A request refused by the proxy: the status and the JSON error body's fields.
#[derive(Debug)]
struct RequestRefusal {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl RequestRefusal {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        RequestRefusal {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(message: &str) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    fn misdirected(message: &str) -> Self {
        Self::new(
            StatusCode::MISDIRECTED_REQUEST,
            "misdirected_request",
            message,
        )
    }

    fn denied(message: String) -> Self {
        Self::new(StatusCode::FORBIDDEN, "egress_denied", message)
    }
}

impl Forwarder {
    async fn forward(&self, req: Request<Incoming>) -> Response<Body> {
        self.shared.counters.add_request();
        let method = req.method().clone();
        match self.try_forward(req).await {
            Ok(response) => response,
            Err(refused) => {
                self.shared.counters.add_request_refused();
                info!(
                    sandbox = %self.shared.sandbox,
                    host = %self.origin.host,
                    %method,
                    status = refused.status.as_u16(),
                    reason = %refused.message,
                    "egress: request refused"
                );
                error_response(refused.status, refused.code, &refused.message)
            }
        }
    }

    async fn try_forward(
        &self,
        mut req: Request<Incoming>,
    ) -> Result<Response<Body>, RequestRefusal> {
        if req.method() == Method::CONNECT {
            return Err(RequestRefusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "CONNECT is not supported",
            ));
        }
        check_authority(&req, &self.origin)?;
        let decision = self.shared.policy.load().decide(&route::facts(
            Some(&self.origin.host),
            self.origin.addr.ip(),
            self.origin.port(),
        ));
        if !decision.allowed {
            return Err(RequestRefusal::denied(format!(
                "denied by the policy: {}",
                decision.reason
            )));
        }
        let guest_upgrade = wants_websocket(&req).then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers, guest_upgrade.is_some());
        strip_host_overrides(&mut parts.headers);
        let mut scrubber = None;
        if let Some(credentials) = &self.shared.credentials {
            let method = parts.method.clone();
            let path = parts.uri.path().to_owned();
            let ctx = RequestContext {
                tenant: &self.shared.tenant,
                project: self.shared.project.as_ref(),
                sandbox: &self.shared.sandbox,
                inherited_from: &self.shared.inherited_from,
                host: &self.origin.host,
                method: &method,
                path: &path,
                tls: self.origin.tls,
                now_ms: now_ms(),
            };
            let authorized = credentials
                .authorize_request(&ctx, &mut parts)
                .await
                .map_err(|denial| RequestRefusal::denied(denial.to_string()))?;
            if authorized.scrubber.is_some() {
                // The response is scrubbed of the values: it must come uncompressed to be.
                parts
                    .headers
                    .insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
            }
            scrubber = authorized.scrubber;
        }
        parts.uri = self.upstream_uri(&parts.uri)?;
        parts.headers.remove(HOST);
        parts.version = Version::HTTP_11;
        parts.extensions = http::Extensions::new();
        if guest_upgrade.is_some() {
            parts
                .headers
                .insert(CONNECTION, HeaderValue::from_static("upgrade"));
        }
        let mut response = self
            .client
            .request(Request::from_parts(parts, body))
            .await
            .map_err(|error| {
                debug!(sandbox = %self.shared.sandbox, host = %self.origin.host, %error, "egress: upstream request failed");
                RequestRefusal::new(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    "the upstream request failed",
                )
            })?;
        if response.status() == StatusCode::SWITCHING_PROTOCOLS {
            let Some(guest_upgrade) = guest_upgrade else {
                return Err(RequestRefusal::new(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    "upstream switched protocols unasked",
                ));
            };
            let upstream_upgrade = hyper::upgrade::on(&mut response);
            self.tunnel(guest_upgrade, upstream_upgrade);
            return Ok(response.map(|b| Either::Left(Scrubbed::plain(b))));
        }
        strip_hop_by_hop(response.headers_mut(), false);
        if let Some(scrubber) = &scrubber {
            if scrub_headers(response.headers_mut(), scrubber) {
                info!(sandbox = %self.shared.sandbox, host = %self.origin.host, "egress: a credential's value in a response header was masked");
            }
        }
        Ok(response.map(|b| Either::Left(Scrubbed::new(b, scrubber.as_ref()))))
    }

    /// The upstream URI: the connection's scheme and authority, the request's path and query.
    fn upstream_uri(&self, uri: &Uri) -> Result<Uri, RequestRefusal> {
        let path = uri.path_and_query().map_or("/", |pq| pq.as_str());
        if !path.starts_with('/') {
            return Err(RequestRefusal::bad_request(
                "the request target must be a path",
            ));
        }
        Uri::builder()
            .scheme(self.origin.scheme())
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|_| RequestRefusal::bad_request("the request target cannot be forwarded"))
    }

    /// Hands the connection task a splice of the two upgraded streams.
    fn tunnel(&self, guest: OnUpgrade, upstream: OnUpgrade) {
        let activity = Arc::clone(&self.activity);
        let timeout = self.shared.limits.idle_timeout;
        let tunnel: Tunnel = Box::pin(async move {
            let (guest, upstream) = match tokio::try_join!(guest, upstream) {
                Ok(pair) => pair,
                Err(error) => {
                    debug!(%error, "egress: protocol switch failed");
                    return;
                }
            };
            let mut guest = TokioIo::new(guest);
            let mut upstream = TokioIo::new(upstream);
            if let Err(error) = splice(&mut guest, &mut upstream, &activity, timeout).await {
                debug!(%error, "egress: upgraded connection ended with an error");
            }
        });
        // The receiver lives as long as the connection task, which outlives this request.
        let _ = self.tunnels.send(tunnel);
    }
}

/// Checks that every authority the request carries (absolute-form target or `:authority`,
/// and `Host`) names the connection's host and port (the scheme's default when absent).
fn check_authority<B>(req: &Request<B>, origin: &Origin) -> Result<(), RequestRefusal> {
    let mut named = false;
    if let Some(authority) = req.uri().authority() {
        if req
            .uri()
            .scheme()
            .is_some_and(|scheme| *scheme != origin.scheme())
        {
            return Err(RequestRefusal::misdirected(
                "the request's scheme is not the connection's",
            ));
        }
        check_one_authority(authority.as_str(), origin)?;
        named = true;
    }
    let mut hosts = req.headers().get_all(HOST).iter();
    if let Some(host) = hosts.next() {
        if hosts.next().is_some() {
            return Err(RequestRefusal::bad_request("several Host headers"));
        }
        let host = host
            .to_str()
            .map_err(|_| RequestRefusal::bad_request("the Host header is not ASCII"))?;
        check_one_authority(host.trim_matches([' ', '\t']), origin)?;
        named = true;
    }
    if named {
        Ok(())
    } else {
        Err(RequestRefusal::bad_request("the request names no host"))
    }
}

fn check_one_authority(text: &str, origin: &Origin) -> Result<(), RequestRefusal> {
    let authority: Authority = text
        .parse()
        .map_err(|_| RequestRefusal::bad_request("malformed Host or :authority"))?;
    if authority.as_str().contains('@') {
        return Err(RequestRefusal::bad_request(
            "user information in the authority",
        ));
    }
    let port = match (authority.port_u16(), authority.as_str().rsplit_once(':')) {
        (Some(port), _) => port,
        (None, Some((_, rest))) if !rest.contains(']') => {
            return Err(RequestRefusal::bad_request(
                "malformed port in the authority",
            ))
        }
        (None, _) => origin.default_port(),
    };
    let same_host = Hostname::parse(authority.host()).is_ok_and(|host| host == origin.host);
    if same_host && port == origin.port() {
        Ok(())
    } else {
        Err(RequestRefusal::misdirected(
            "the request's host is not the one this connection was opened for",
        ))
    }
}

/// An HTTP/1.1 `GET` asking to switch to WebSocket.
fn wants_websocket<B>(req: &Request<B>) -> bool {
    let headers = req.headers();
    let connection_upgrade = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    let websocket = headers
        .get(UPGRADE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(|p| {
            let p = p.trim();
            p.eq_ignore_ascii_case("websocket")
                || p.get(..10)
                    .is_some_and(|s| s.eq_ignore_ascii_case("websocket/"))
        });
    req.version() == Version::HTTP_11
        && req.method() == Method::GET
        && connection_upgrade
        && websocket
}

/// Headers by which a proxy tells the server another host than `Host`: a shared front that
/// trusts them could be steered by the guest to a name the policy never allowed, behind
/// the checked `Host`. The gateway is the last proxy before upstream and adds none.
const HOST_OVERRIDES: &[&str] = &[
    "forwarded",
    "x-forwarded-host",
    "x-forwarded-server",
    "x-original-host",
    "x-host",
];

/// Drops [`HOST_OVERRIDES`] (`Forwarded` whole: what else it says about the guest's side
/// is the guest's claim too).
fn strip_host_overrides(headers: &mut HeaderMap) {
    for name in HOST_OVERRIDES {
        headers.remove(*name);
    }
}

/// Drops hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and the fields it names,
/// `Keep-Alive`, `Proxy-Connection`, `TE` unless it is exactly `trailers`,
/// `Transfer-Encoding`, `Upgrade` unless `keep_upgrade`) and the proxy authentication
/// fields, which are for a proxy the guest does not know it has.
fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect();
    let te_trailers = headers.get_all(TE).iter().count() == 1
        && headers
            .get(TE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
    for name in named {
        if !(keep_upgrade && name == UPGRADE) {
            headers.remove(&name);
        }
    }
    for name in [
        CONNECTION,
        TRANSFER_ENCODING,
        TE,
        PROXY_AUTHORIZATION,
        PROXY_AUTHENTICATE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
    if !keep_upgrade {
        headers.remove(UPGRADE);
    }
    if te_trailers {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
}

/// `{"code": …, "message": …}`.
fn error_json(code: &str, message: &str) -> String {
    serde_json::json!({ "code": code, "message": message }).to_string()
}

fn error_response(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(error_json(
        code, message,
    )))));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The HTTP/1.1 response (closing the connection) that answers a refused connection whose
/// first bytes were an HTTP/1 request.
pub(super) fn refusal_response(refusal: &Refusal) -> Vec<u8> {
    let (status, code) = match refusal {
        Refusal::Connect => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
        Refusal::PortMismatch { .. } => (StatusCode::MISDIRECTED_REQUEST, "misdirected_request"),
        Refusal::Unnamed {
            what: Unnamed::Unparsable {
                ip_literal: true, ..
            },
            ..
        } => (StatusCode::FORBIDDEN, "egress_denied"),
        Refusal::Unnamed { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
        _ => (StatusCode::FORBIDDEN, "egress_denied"),
    };
    let body = error_json(code, &refusal.to_string());
    format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
        body
    )
    .into_bytes()
}

pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(tls: bool, port: u16) -> Origin {
        Origin {
            host: Hostname::parse("api.example.com").unwrap(),
            addr: std::net::SocketAddr::from(([93, 184, 215, 14], port)),
            tls,
        }
    }

    fn req(uri: &str, hosts: &[&str]) -> Request<()> {
        let mut b = Request::builder().uri(uri);
        for h in hosts {
            b = b.header(HOST, *h);
        }
        b.body(()).unwrap()
    }

    fn status(r: Result<(), RequestRefusal>) -> u16 {
        r.map_or_else(|e| e.status.as_u16(), |()| 200)
    }

    #[test]
    fn authority_must_name_the_connections_origin() {
        let tls = origin(true, 443);
        let plain = origin(false, 8080);
        // (origin, URI, Host headers, status)
        let cases: &[(&Origin, &str, &[&str], u16)] = &[
            (&tls, "/", &["api.example.com"], 200),
            (&tls, "/", &["API.example.com."], 200),
            (&tls, "/", &["api.example.com:443"], 200),
            (&tls, "/", &["api.example.com:8443"], 421),
            (&tls, "/", &["other.example.com"], 421),
            (&tls, "/", &["93.184.215.14"], 421),
            (&tls, "/", &["[::1]:443"], 421),
            (&tls, "/", &["user@api.example.com"], 400),
            (&tls, "/", &["api.example.com:x"], 400),
            (&tls, "/", &[], 400),
            (&tls, "/", &["api.example.com", "api.example.com"], 400),
            // Absolute form (and HTTP/2's :authority) must agree too, scheme included.
            (&tls, "https://api.example.com/x", &[], 200),
            (
                &tls,
                "https://evil.example.com/x",
                &["api.example.com"],
                421,
            ),
            (&tls, "http://api.example.com/x", &[], 421),
            (&plain, "/", &["api.example.com"], 421),
            (&plain, "/", &["api.example.com:8080"], 200),
        ];
        for (origin, uri, hosts, want) in cases {
            assert_eq!(
                status(check_authority(&req(uri, hosts), origin)),
                *want,
                "{uri} {hosts:?} (tls: {})",
                origin.tls
            );
        }
    }

    #[test]
    fn host_overrides_are_dropped() {
        let mut h = HeaderMap::new();
        for name in HOST_OVERRIDES {
            h.insert(*name, HeaderValue::from_static("denied.example"));
        }
        h.insert(
            "forwarded",
            HeaderValue::from_static("for=1.2.3.4;host=denied.example"),
        );
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_host_overrides(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("x-kept"));
    }

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret-hop, upgrade"),
        );
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(UPGRADE, HeaderValue::from_static("h2c"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        h.insert(PROXY_AUTHORIZATION, HeaderValue::from_static("Basic x"));
        h.insert("x-kept", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        let names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-kept", "te"]);
        let mut h = HeaderMap::new();
        h.insert(TE, HeaderValue::from_static("gzip"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        strip_hop_by_hop(&mut h, true);
        let names: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["upgrade"]);
    }

    #[test]
    fn websocket_upgrades_are_recognised() {
        let ws = |conn: &str, up: &str| {
            Request::get("/")
                .header(CONNECTION, conn)
                .header(UPGRADE, up)
                .body(())
                .unwrap()
        };
        assert!(wants_websocket(&ws("keep-alive, Upgrade", "websocket")));
        assert!(!wants_websocket(&ws("keep-alive", "websocket")));
        assert!(!wants_websocket(&ws("upgrade", "h2c")));
    }

    #[test]
    fn refusal_responses_are_complete_http_messages() {
        let text = String::from_utf8(refusal_response(&Refusal::Connect)).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"),
            "{text}"
        );
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["code"], "method_not_allowed");
    }
}
