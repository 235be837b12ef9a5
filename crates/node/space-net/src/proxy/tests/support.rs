//! Test fixtures of the proxy: upstream servers on loopback (HTTP/1.1, HTTPS with HTTP/1.1
//! and HTTP/2 under a test CA, raw echo), a recording loopback-only uplink, a sandbox with
//! its policy, pins, CA and optional credential manager, and guest-side clients.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ServerConfig};
use space_core::egress::{DomainPattern, EgressMode, EgressPolicy, EgressRule, Hostname};
use space_core::{SandboxId, TenantId};
use space_secrets::{
    AuditEvent, AuditFilter, AuditLog, Credential, CredentialId, CredentialManager, CredentialRule,
    ManagerConfig, MemoryBackend, PlaceholderKey, Scope, SecretBackend, SecretValue,
};
use tempfile::TempDir;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::client::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::ca::{crypto_provider, LeafCache, SandboxCa};
use crate::dns::{PinTable, PolicyHandle};
use crate::proxy::tenant_connections::TenantConnections;
use crate::proxy::{
    upstream_tls_config, ConnectFuture, ProxyContext, ProxyError, ProxyLimits, SandboxProxy, Uplink,
};
pub(crate) use crate::test_util::client_tls;

/// The name most tests talk to.
pub const API: &str = "api.example.com";
/// A second allowed name, for cleartext tests.
pub const PLAIN: &str = "plain.example.com";
/// The value of the test credential.
pub const SECRET: &str = "s3cret-token-value";

/// `host:port` of `addr`, as a `Host` header or an `:authority`.
pub fn host_header(addr: SocketAddr, host: &str) -> String {
    format!("{host}:{}", addr.port())
}

pub fn name(s: &str) -> Hostname {
    Hostname::parse(s).unwrap()
}

fn domain(s: &str) -> DomainPattern {
    DomainPattern::parse(s).unwrap()
}

/// Allowlist: `API` (its TLS terminated, or passed through), `PLAIN`, and `127.0.0.0/8` so that loopback
/// addresses (upstreams here) are allowed at all.
pub fn policy(terminate_api: bool) -> EgressPolicy {
    let api = EgressRule::allow(domain(API));
    // Domain rules terminate TLS by default; `false` asks for pass-through.
    let api = if terminate_api {
        api
    } else {
        api.passed_through()
    };
    let policy = EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: vec![
            api,
            EgressRule::allow(domain(PLAIN)),
            EgressRule::allow("127.0.0.0/8".parse::<ipnet::IpNet>().unwrap()),
        ],
    };
    policy.validate().unwrap();
    policy
}

/// A CA for the upstream servers (the "public" PKI of these tests).
pub struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl TestCa {
    pub fn new() -> TestCa {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).unwrap();
        TestCa { cert, key }
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// A leaf for `host`, and its key.
    pub fn leaf(&self, host: &str) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let params = CertificateParams::new(vec![host.to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (cert.der().clone(), key)
    }
}

/// What an upstream HTTP server saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub version: http::Version,
    pub method: String,
    pub path: String,
    /// The `Host` header, or for HTTP/2 the `:authority`.
    pub host: String,
    pub authorization: Vec<String>,
    pub headers: Vec<String>,
}

/// An upstream HTTP server (TLS with `tls`), answering every request 200 `upstream ok`;
/// `WebSocket` upgrades get 101 and an echo.
pub struct Upstream {
    pub addr: SocketAddr,
    pub leaf: Option<CertificateDer<'static>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    _task: JoinHandle<()>,
}

impl Upstream {
    pub async fn plain(ip: &str) -> Upstream {
        Upstream::start(ip, None).await
    }

    pub async fn tls(ip: &str, ca: &TestCa, host: &str) -> Upstream {
        Upstream::start(ip, Some(ca.leaf(host))).await
    }

    async fn start(
        ip: &str,
        tls: Option<(CertificateDer<'static>, PrivateKeyDer<'static>)>,
    ) -> Upstream {
        let listener = TcpListener::bind((ip.parse::<IpAddr>().unwrap(), 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let leaf = tls.as_ref().map(|(cert, _)| cert.clone());
        let acceptor = tls.map(|(cert, key)| {
            let mut config = ServerConfig::builder_with_provider(crypto_provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert], key)
                .unwrap();
            config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
            TlsAcceptor::from(Arc::new(config))
        });
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let seen = Arc::clone(&recorder);
                tokio::spawn(async move {
                    match acceptor {
                        None => serve_upstream(tcp, false, seen).await,
                        Some(acceptor) => {
                            let Ok(tls) = acceptor.accept(tcp).await else {
                                return;
                            };
                            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                            serve_upstream(tls, h2, seen).await;
                        }
                    }
                });
            }
        });
        Upstream {
            addr,
            leaf,
            seen,
            _task: task,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn serve_upstream<I>(io: I, h2: bool, seen: Arc<Mutex<Vec<Seen>>>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |mut req: Request<Incoming>| {
        let seen = Arc::clone(&seen);
        async move {
            let host = req
                .headers()
                .get(http::header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
                .or_else(|| req.uri().authority().map(|a| a.to_string()))
                .unwrap_or_default();
            let record = Seen {
                version: req.version(),
                method: req.method().to_string(),
                path: req
                    .uri()
                    .path_and_query()
                    .map(|pq| pq.to_string())
                    .unwrap_or_default(),
                host,
                authorization: req
                    .headers()
                    .get_all(http::header::AUTHORIZATION)
                    .iter()
                    .map(|v| v.to_str().unwrap_or_default().to_owned())
                    .collect(),
                headers: req.headers().keys().map(|k| k.to_string()).collect(),
            };
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(record);
            let websocket = req
                .headers()
                .get(http::header::UPGRADE)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
            if websocket {
                let upgrade = hyper::upgrade::on(&mut req);
                tokio::spawn(async move {
                    let Ok(upgraded) = upgrade.await else {
                        return;
                    };
                    let (mut r, mut w) = tokio::io::split(TokioIo::new(upgraded));
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
                let response = Response::builder()
                    .status(StatusCode::SWITCHING_PROTOCOLS)
                    .header(http::header::CONNECTION, "upgrade")
                    .header(http::header::UPGRADE, "websocket")
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                return Ok::<_, hyper::Error>(response);
            }
            // Drain the request body before answering.
            let _ = req.into_body().collect().await;
            Ok(Response::new(Full::new(Bytes::from_static(b"upstream ok"))))
        }
    });
    let io = TokioIo::new(io);
    if h2 {
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await;
    } else {
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .with_upgrades()
            .await;
    }
}

/// A raw TCP echo server; counts connections.
pub struct Echo {
    pub addr: SocketAddr,
    pub connections: Arc<Mutex<usize>>,
    _task: JoinHandle<()>,
}

impl Echo {
    pub async fn start(ip: &str) -> Echo {
        let listener = TcpListener::bind((ip.parse::<IpAddr>().unwrap(), 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(Mutex::new(0));
        let counter = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                *counter.lock().unwrap_or_else(PoisonError::into_inner) += 1;
                tokio::spawn(async move {
                    let (mut r, mut w) = tcp.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        Echo {
            addr,
            connections,
            _task: task,
        }
    }

    pub fn connections(&self) -> usize {
        *self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Connects over loopback only, and records every address asked for.
#[derive(Default)]
pub struct TestUplink {
    connects: Mutex<Vec<SocketAddr>>,
}

impl TestUplink {
    pub fn connects(&self) -> Vec<SocketAddr> {
        self.connects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Uplink for TestUplink {
    fn connect(&self, addr: SocketAddr) -> ConnectFuture<'_> {
        Box::pin(async move {
            self.connects
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(addr);
            // Never anything but this machine, whatever the proxy asks.
            if !addr.ip().is_loopback() {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the test uplink reaches loopback only",
                ));
            }
            TcpStream::connect(addr).await
        })
    }
}

/// The test credential's tenant, manager, audit log, and their directory.
pub struct Credentials {
    pub tenant: TenantId,
    pub manager: Arc<CredentialManager>,
    pub audit: Arc<AuditLog>,
    _dir: TempDir,
}

impl Credentials {
    /// Makes the sandbox one of the credential's tenant, using its manager.
    pub fn grant(&self, options: &mut Options) {
        options.tenant = self.tenant.clone();
        options.credentials = Some(Arc::clone(&self.manager));
    }

    /// Every byte of the tenant's audit log files.
    pub fn raw_log(&self) -> String {
        let mut out = String::new();
        let dir = self.audit.dir().join(self.tenant.as_str());
        for entry in std::fs::read_dir(dir).unwrap() {
            out.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
        }
        out
    }

    /// The audit log so far.
    pub fn events(&self) -> Vec<AuditEvent> {
        self.audit
            .query(&AuditFilter {
                limit: 100,
                ..AuditFilter::default()
            })
            .unwrap()
    }
}

/// A tenant-wide bearer credential for `API` worth [`SECRET`], for a new tenant.
pub async fn credentials(require_tls: bool) -> Credentials {
    credentials_with(|credential| credential.rule.require_tls = require_tls).await
}

/// [`credentials`], requiring TLS, with `edit` applied to the credential.
pub async fn credentials_with(edit: impl FnOnce(&mut Credential)) -> Credentials {
    let tenant = TenantId::generate();
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(MemoryBackend::new());
    let audit = Arc::new(AuditLog::open(dir.path().join("audit")).unwrap());
    let manager = CredentialManager::load(
        backend as Arc<dyn SecretBackend>,
        PlaceholderKey::from_bytes([7u8; 32]),
        ManagerConfig::default(),
    )
    .await
    .unwrap()
    .with_audit(Arc::clone(&audit));
    let mut credential = Credential {
        id: CredentialId::generate(),
        name: "api".parse().unwrap(),
        scope: Scope::Tenant {
            tenant: tenant.clone(),
        },
        // As an operator writes it: everything else as the defaults have it.
        rule: serde_json::from_value::<CredentialRule>(serde_json::json!({
            "hosts": [API],
            "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
        }))
        .unwrap(),
        created_at_ms: 1_000,
        expires_at_ms: None,
    };
    edit(&mut credential);
    manager
        .put(credential, SecretValue::new(SECRET.into()).unwrap())
        .await
        .unwrap();
    Credentials {
        tenant,
        manager: Arc::new(manager),
        audit,
        _dir: dir,
    }
}

/// One sandbox's proxy with its policy, pins and CA.
pub struct Sandbox {
    pub proxy: Arc<SandboxProxy>,
    pub uplink: Arc<TestUplink>,
    pub policy: PolicyHandle,
    pub pins: Arc<PinTable>,
    pub ca: Arc<SandboxCa>,
}

/// How to build a [`Sandbox`].
pub struct Options {
    pub policy: EgressPolicy,
    pub upstream_ca: Option<CertificateDer<'static>>,
    pub credentials: Option<Arc<CredentialManager>>,
    pub tenant: TenantId,
    pub limits: ProxyLimits,
    pub tenant_connections: Arc<TenantConnections>,
}

impl Options {
    pub fn new(policy: EgressPolicy) -> Options {
        Options {
            policy,
            upstream_ca: None,
            credentials: None,
            tenant: TenantId::generate(),
            limits: ProxyLimits::default(),
            tenant_connections: TenantConnections::unshared(None),
        }
    }
}

impl Sandbox {
    pub fn new(options: Options) -> Sandbox {
        let ca = Arc::new(SandboxCa::generate("SPACE test sandbox CA").unwrap());
        let policy: PolicyHandle = Arc::new(ArcSwap::from_pointee(options.policy));
        let pins = Arc::new(PinTable::default());
        let uplink = Arc::new(TestUplink::default());
        let extra: Vec<CertificateDer<'static>> = options.upstream_ca.into_iter().collect();
        let ctx = ProxyContext {
            sandbox: SandboxId::generate(),
            tenant: options.tenant,
            project: None,
            inherited_from: Vec::new(),
            policy: Arc::clone(&policy),
            pins: Arc::clone(&pins),
            leaves: Arc::new(LeafCache::new(Arc::clone(&ca))),
            credentials: options.credentials,
            upstream_tls: upstream_tls_config(&extra).unwrap(),
            limits: options.limits,
            tenant_connections: options.tenant_connections,
        };
        let proxy = Arc::new(SandboxProxy::new(
            ctx,
            Arc::clone(&uplink) as Arc<dyn Uplink>,
        ));
        Sandbox {
            proxy,
            uplink,
            policy,
            pins,
            ca,
        }
    }

    /// As if the resolver had answered `addr` for `host`.
    pub fn pin(&self, host: &str, addr: SocketAddr) {
        self.pins
            .pin(&name(host), &[addr.ip()], Duration::from_secs(300));
    }

    /// A guest connection whose original destination is `dst`: the guest's end, and the
    /// proxy's outcome for it.
    pub async fn connect(
        &self,
        dst: SocketAddr,
    ) -> (TcpStream, JoinHandle<Result<(), ProxyError>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let guest = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let proxy = Arc::clone(&self.proxy);
        let outcome = tokio::spawn(async move { proxy.handle(accepted, dst).await });
        (guest, outcome)
    }

    /// A guest speaking cleartext HTTP/1.1 to `dst`, naming `host` (with `dst`'s port).
    pub async fn h1_guest(&self, dst: SocketAddr, host: &str) -> Guest {
        let (tcp, done) = self.connect(dst).await;
        Guest::h1(tcp, host_header(dst, host), done).await
    }

    /// A guest speaking TLS for [`API`] to `dst`, trusting only the sandbox CA (so the proxy
    /// must terminate), offering `alpn`.
    pub async fn terminated_guest(&self, dst: SocketAddr, alpn: &[&[u8]]) -> Guest {
        let (tcp, done) = self.connect(dst).await;
        let tls = tls_connect(client_tls(self.ca.cert_der(), alpn), API, tcp)
            .await
            .unwrap();
        Guest::tls(tls, host_header(dst, API), done).await
    }

    /// A guest TLS connection for [`API`] to `dst` under `config`, written at most `chunk`
    /// bytes per TCP segment.
    pub async fn trickled_tls(
        &self,
        dst: SocketAddr,
        config: ClientConfig,
        chunk: usize,
    ) -> (
        TlsStream<Trickle<TcpStream>>,
        JoinHandle<Result<(), ProxyError>>,
    ) {
        let (tcp, done) = self.connect(dst).await;
        let _ = tcp.set_nodelay(true);
        let tls = tls_connect(config, API, Trickle::new(tcp, chunk))
            .await
            .unwrap();
        (tls, done)
    }

    /// Asserts that nothing went upstream: no connection asked of the uplink, no request
    /// seen by `upstream`.
    pub fn assert_nothing_forwarded(&self, upstream: &Upstream) {
        assert!(self.uplink.connects().is_empty());
        assert!(upstream.seen().is_empty());
    }
}

/// A TLS upstream for [`API`] and a sandbox (built with `configure`) whose proxy trusts its
/// CA, without a pin for it.
pub async fn tls_upstream(
    policy: EgressPolicy,
    configure: impl FnOnce(&mut Options),
) -> (TestCa, Upstream, Sandbox) {
    let ca = TestCa::new();
    let upstream = Upstream::tls("127.0.0.1", &ca, API).await;
    let mut options = Options::new(policy);
    options.upstream_ca = Some(ca.der());
    configure(&mut options);
    (ca, upstream, Sandbox::new(options))
}

/// [`tls_upstream`], with [`API`] pinned to the upstream.
pub async fn tls_setup(
    policy: EgressPolicy,
    configure: impl FnOnce(&mut Options),
) -> (TestCa, Upstream, Sandbox) {
    let (ca, upstream, sandbox) = tls_upstream(policy, configure).await;
    sandbox.pin(API, upstream.addr);
    (ca, upstream, sandbox)
}

/// A cleartext upstream and a sandbox (built with `configure`) where `host` is pinned to it.
pub async fn plain_setup(
    policy: EgressPolicy,
    host: &str,
    configure: impl FnOnce(&mut Options),
) -> (Upstream, Sandbox) {
    let upstream = Upstream::plain("127.0.0.1").await;
    let mut options = Options::new(policy);
    configure(&mut options);
    let sandbox = Sandbox::new(options);
    sandbox.pin(host, upstream.addr);
    (upstream, sandbox)
}

type H1Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;
type H2Sender = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

enum Sender {
    H1(H1Sender),
    H2(H2Sender),
}

/// A guest's HTTP client on one connection through the proxy.
pub struct Guest {
    sender: Sender,
    /// The connection's origin, `name:port`: the `Host` (HTTP/1.1) or `:authority` (HTTP/2)
    /// of [`Guest::call`].
    pub host: String,
    /// The proxy's outcome for the connection.
    pub done: JoinHandle<Result<(), ProxyError>>,
}

impl Guest {
    /// HTTP/1.1 over `io`.
    pub async fn h1<I>(io: I, host: String, done: JoinHandle<Result<(), ProxyError>>) -> Guest
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let sender = Sender::H1(h1_client(io).await);
        Guest { sender, host, done }
    }

    /// HTTP/2 over `tls` if it negotiated `h2`, else HTTP/1.1.
    pub async fn tls<I>(
        tls: TlsStream<I>,
        host: String,
        done: JoinHandle<Result<(), ProxyError>>,
    ) -> Guest
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice()) {
            let sender = Sender::H2(h2_client(tls).await);
            Guest { sender, host, done }
        } else {
            Guest::h1(tls, host, done).await
        }
    }

    /// Sends `request` as it is.
    pub async fn send(&mut self, request: Request<Empty<Bytes>>) -> Response<Incoming> {
        match &mut self.sender {
            Sender::H1(sender) => sender.send_request(request).await.unwrap(),
            Sender::H2(sender) => sender.send_request(request).await.unwrap(),
        }
    }

    /// `method path` to the connection's origin, with `headers` after `Host` (HTTP/1.1), or
    /// in absolute form (HTTP/2).
    pub async fn call(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Response<Incoming> {
        let request = match self.sender {
            Sender::H1(_) => {
                let mut all = vec![("host", self.host.as_str())];
                all.extend_from_slice(headers);
                request(method, path, &all)
            }
            Sender::H2(_) => request(method, &format!("https://{}{path}", self.host), headers),
        };
        self.send(request).await
    }

    /// `GET path` to the connection's origin.
    pub async fn get(&mut self, path: &str) -> Response<Incoming> {
        self.call("GET", path, &[]).await
    }

    /// Closes the guest's side; returns the proxy's outcome.
    pub fn close(self) -> JoinHandle<Result<(), ProxyError>> {
        self.done
    }
}

/// The guest's TLS handshake for `host` over `io`.
pub async fn tls_connect<I>(config: ClientConfig, host: &str, io: I) -> io::Result<TlsStream<I>>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    let name = ServerName::try_from(host.to_owned()).unwrap();
    TlsConnector::from(Arc::new(config)).connect(name, io).await
}

/// How many TLS records the ClientHello of `config` (for `host`) takes.
pub fn client_hello_records(config: &ClientConfig, host: &str) -> usize {
    let name = ServerName::try_from(host.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config.clone()), name).unwrap();
    let mut bytes = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut bytes).unwrap();
    }
    let mut records = 0;
    let mut rest = bytes.as_slice();
    while rest.len() >= 5 {
        let len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        rest = &rest[(5 + len).min(rest.len())..];
        records += 1;
    }
    records
}

/// The certificate the server of `tls` presented.
pub fn peer_leaf<I>(tls: &TlsStream<I>) -> CertificateDer<'static> {
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// A response's status and body text.
pub async fn read_response(response: Response<Incoming>) -> (StatusCode, String) {
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Reads an error the proxy answered itself: its status must be `status` and its JSON
/// `code` `code`. Returns the body.
pub async fn expect_error(response: Response<Incoming>, status: StatusCode, code: &str) -> String {
    let (got, body) = read_response(response).await;
    assert_eq!(got, status, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    assert_eq!(json["code"].as_str().unwrap_or_default(), code, "{body}");
    body
}

/// [`expect_error`] for a request the egress policy or the credential manager refused.
pub async fn expect_denied(response: Response<Incoming>) -> String {
    expect_error(response, StatusCode::FORBIDDEN, "egress_denied").await
}

/// An HTTP/1.1 client connection over `io`.
pub async fn h1_client<I>(io: I) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    sender
}

/// An HTTP/2 client connection over `io`.
pub async fn h2_client<I>(io: I) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

/// A request with these headers and no body.
pub fn request(method: &str, uri: &str, headers: &[(&str, &str)]) -> Request<Empty<Bytes>> {
    let mut builder = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    builder.body(Empty::new()).unwrap()
}

/// Writes raw bytes and reads everything until the proxy closes (bounded).
pub async fn raw_exchange(mut guest: TcpStream, bytes: &[u8]) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    guest.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), guest.read_to_end(&mut out)).await;
    out
}

/// Writes `bytes` and asserts they come back.
pub async fn assert_echoed(guest: &mut TcpStream, bytes: &[u8]) {
    use tokio::io::AsyncReadExt;
    guest.write_all(bytes).await.unwrap();
    let mut back = vec![0u8; bytes.len()];
    guest.read_exact(&mut back).await.unwrap();
    assert_eq!(back, bytes);
}

/// A stream that writes at most `chunk` bytes per write, each flushed and followed by a
/// short pause: TCP segments as small as a hostile (or just unlucky) guest can make them.
pub struct Trickle<S> {
    inner: S,
    chunk: usize,
    pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> Trickle<S> {
    pub fn new(inner: S, chunk: usize) -> Trickle<S> {
        Trickle {
            inner,
            chunk,
            pause: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Trickle<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Trickle<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(pause) = self.pause.as_mut() {
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.pause = None;
        }
        let n = buf.len().min(self.chunk);
        let poll = Pin::new(&mut self.inner).poll_write(cx, &buf[..n]);
        if let Poll::Ready(Ok(_)) = poll {
            self.pause = Some(Box::pin(tokio::time::sleep(Duration::from_millis(1))));
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
