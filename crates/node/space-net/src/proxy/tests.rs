//! End-to-end tests of the proxy over loopback: real upstream servers (HTTP/1.1, HTTPS with
//! HTTP/1.1 and HTTP/2, raw echo), real guest clients (rustls, hyper) and raw hostile bytes.
//! No namespaces: tests call [`SandboxProxy::handle`] with an explicit original destination.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use rustls::pki_types::{CertificateDer, ServerName};
use space_core::egress::EgressPolicy;
use space_secrets::{AuditDecision, AuditKind, Credential, Scope, SecretValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use self::support::*;
use super::{ProxyError, ProxyLimits, Refusal, SandboxProxy, Unnamed};

/// Waits for a connection's outcome (bounded).
async fn outcome(handle: JoinHandle<Result<(), ProxyError>>) -> Result<(), ProxyError> {
    tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .expect("the proxy did not finish the connection")
        .unwrap()
}

fn refusal(result: Result<(), ProxyError>) -> Refusal {
    match result {
        Err(ProxyError::Refused(refusal)) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A guest TLS handshake for `host` to `dst`, trusting `root`, which must fail; returns why
/// the proxy refused the connection.
async fn tls_refusal(
    sandbox: &Sandbox,
    dst: SocketAddr,
    root: &CertificateDer<'static>,
    host: &str,
) -> Refusal {
    let (guest, done) = sandbox.connect(dst).await;
    assert!(tls_connect(client_tls(root, &[]), host, guest)
        .await
        .is_err());
    refusal(outcome(done).await)
}

/// Sends raw `bytes` on a new connection to `dst`; returns the proxy's whole reply and why
/// it refused the connection.
async fn raw_refusal(sandbox: &Sandbox, dst: SocketAddr, bytes: &[u8]) -> (String, Refusal) {
    let (guest, done) = sandbox.connect(dst).await;
    let reply = String::from_utf8_lossy(&raw_exchange(guest, bytes).await).into_owned();
    (reply, refusal(outcome(done).await))
}

// ---- allowed traffic ----

#[tokio::test]
async fn allowed_cleartext_http_is_forwarded_request_by_request() {
    let (upstream, sandbox) = plain_setup(policy(false), PLAIN, |_| {}).await;
    let mut guest = sandbox.h1_guest(upstream.addr, PLAIN).await;

    let response = guest
        .call(
            "GET",
            "/one?x=1",
            &[("connection", "keep-alive, x-hop"), ("x-hop", "1")],
        )
        .await;
    assert_eq!(
        read_response(response).await,
        (StatusCode::OK, "upstream ok".into())
    );
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].host, guest.host);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("GET", "/one?x=1")
    );
    assert!(
        !seen[0].headers.contains(&"x-hop".to_owned()),
        "{:?}",
        seen[0].headers
    );

    // Same connection, another Host: misdirected, never forwarded.
    let other = host_header(upstream.addr, "other.example.com");
    let response = guest
        .send(request("GET", "/two", &[("host", &other)]))
        .await;
    expect_error(
        response,
        StatusCode::MISDIRECTED_REQUEST,
        "misdirected_request",
    )
    .await;
    assert_eq!(upstream.seen().len(), 1);

    // An absolute-form target for another origin, likewise.
    let absolute = format!("http://{other}/three");
    let response = guest
        .send(request("GET", &absolute, &[("host", &guest.host)]))
        .await;
    assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST);

    outcome(guest.close()).await.unwrap();
    assert_eq!(sandbox.uplink.connects(), vec![upstream.addr]);
    let stats = sandbox.proxy.stats();
    assert_eq!(stats.connections_accepted, 1);
    assert_eq!(stats.connections_refused, 0);
    assert_eq!((stats.requests, stats.requests_refused), (3, 2));
    assert!(stats.bytes_up > 0 && stats.bytes_down > 0, "{stats:?}");
}

#[tokio::test]
async fn https_to_a_pass_through_rule_passes_through() {
    let (ca, upstream, sandbox) = tls_setup(policy(false), |_| {}).await;
    let (guest, done) = sandbox.connect(upstream.addr).await;
    let tls = tls_connect(client_tls(&ca.der(), &[b"http/1.1"]), API, guest)
        .await
        .unwrap();
    // The guest talks to the upstream itself: it sees the upstream's certificate.
    assert_eq!(Some(peer_leaf(&tls)), upstream.leaf);
    let mut guest = Guest::tls(tls, host_header(upstream.addr, API), done).await;
    assert_eq!(
        read_response(guest.get("/pass").await).await.0,
        StatusCode::OK
    );
    assert_eq!(sandbox.uplink.connects(), vec![upstream.addr]);
    // Pass-through does not parse requests.
    assert_eq!(sandbox.proxy.stats().requests, 0);
}

#[tokio::test]
async fn https_to_a_domain_rule_is_terminated_by_default() {
    let (_ca, upstream, sandbox) = tls_setup(policy(true), |_| {}).await;
    let (guest, done) = sandbox.connect(upstream.addr).await;
    let tls = tls_connect(
        client_tls(sandbox.ca.cert_der(), &[b"h2", b"http/1.1"]),
        API,
        guest,
    );
    // The guest trusts only its sandbox CA, and the handshake succeeds: the proxy answered
    // with a leaf of that CA, not the upstream's certificate.
    let tls = tls.await.unwrap();
    assert_ne!(Some(peer_leaf(&tls)), upstream.leaf);
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
    drop(tls);
    let _ = outcome(done).await;

    // HTTP/1.1 end to end.
    let mut guest = sandbox
        .terminated_guest(upstream.addr, &[b"http/1.1"])
        .await;
    assert_eq!(
        read_response(guest.get("/inspected").await).await,
        (StatusCode::OK, "upstream ok".into())
    );
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].version, http::Version::HTTP_11);
    assert_eq!(seen[0].host, guest.host);
    assert_eq!(seen[0].path, "/inspected");
}

#[tokio::test]
async fn http2_is_terminated_and_forwarded_as_http2() {
    let (_ca, upstream, sandbox) = tls_setup(policy(true), |_| {}).await;
    let mut guest = sandbox.terminated_guest(upstream.addr, &[b"h2"]).await;
    for path in ["/a", "/b"] {
        assert_eq!(read_response(guest.get(path).await).await.0, StatusCode::OK);
    }
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter()
            .all(|s| s.version == http::Version::HTTP_2 && s.host == guest.host),
        "{seen:?}"
    );
    assert_eq!(
        sandbox.uplink.connects(),
        vec![upstream.addr],
        "one upstream connection"
    );
}

#[tokio::test]
async fn a_fragmented_client_hello_works() {
    /// TLS records of at most 64 bytes.
    fn small_records(mut config: rustls::ClientConfig) -> rustls::ClientConfig {
        config.max_fragment_size = Some(64);
        config
    }
    // Terminated: records of at most 64 bytes, written 7 bytes per TCP segment.
    let (ca, upstream, sandbox) = tls_setup(policy(true), |_| {}).await;
    let host = host_header(upstream.addr, API);
    let config = small_records(client_tls(sandbox.ca.cert_der(), &[b"http/1.1"]));
    assert!(client_hello_records(&config, API) >= 4);
    let (tls, done) = sandbox.trickled_tls(upstream.addr, config, 7).await;
    let mut guest = Guest::tls(tls, host.clone(), done).await;
    assert_eq!(
        read_response(guest.get("/frag").await).await.0,
        StatusCode::OK
    );

    // Pass-through: replayed verbatim, records and all.
    sandbox.policy.store(Arc::new(policy(false)));
    let config = small_records(client_tls(&ca.der(), &[b"http/1.1"]));
    let (tls, done) = sandbox.trickled_tls(upstream.addr, config, 5).await;
    assert_eq!(Some(peer_leaf(&tls)), upstream.leaf);
    let mut guest = Guest::tls(tls, host, done).await;
    assert_eq!(
        read_response(guest.get("/frag2").await).await.0,
        StatusCode::OK
    );
}

#[tokio::test]
async fn websocket_upgrades_are_spliced() {
    let (upstream, sandbox) = plain_setup(policy(false), PLAIN, |_| {}).await;
    let mut guest = sandbox.h1_guest(upstream.addr, PLAIN).await;
    let response = guest
        .call(
            "GET",
            "/ws",
            &[("connection", "Upgrade"), ("upgrade", "websocket")],
        )
        .await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    let upgraded = hyper::upgrade::on(response).await.unwrap();
    let mut io = hyper_util::rt::TokioIo::new(upgraded);
    io.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(10), io.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echoed, b"ping");
}

#[tokio::test]
async fn a_stream_without_a_name_to_a_cidr_allowed_address_is_spliced() {
    let echo = Echo::start("127.0.0.1").await;
    let sandbox = Sandbox::new(Options::new(policy(false)));
    // An SSH-like client: a banner line, then binary.
    let (mut guest, _done) = sandbox.connect(echo.addr).await;
    assert_echoed(&mut guest, b"SSH-2.0-test\r\n\x00\x01\x02").await;

    // A server-speaks-first protocol: the guest sends nothing at first.
    let mut options = Options::new(policy(false));
    options.limits.server_first_wait = Duration::from_millis(100);
    let sandbox = Sandbox::new(options);
    let (mut guest, _done) = sandbox.connect(echo.addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sandbox.uplink.connects(), vec![echo.addr]);
    assert_echoed(&mut guest, b"hello").await;
}

#[tokio::test]
async fn idle_connections_are_closed() {
    let echo = Echo::start("127.0.0.1").await;
    let mut options = Options::new(policy(false));
    options.limits.idle_timeout = Duration::from_millis(200);
    let sandbox = Sandbox::new(options);
    let (mut guest, done) = sandbox.connect(echo.addr).await;
    assert_echoed(&mut guest, b"\x00hello").await;
    outcome(done).await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(guest.read_to_end(&mut rest).await.unwrap(), 0);
}

// ---- refusals ----

#[tokio::test]
async fn a_name_the_policy_does_not_allow_is_refused() {
    let (_ca, upstream, sandbox) = tls_setup(policy(true), |_| {}).await;
    // Even pinned (a stale pin, or a forged one): the name is not allowed.
    sandbox.pin("evil.example.net", upstream.addr);
    let root = sandbox.ca.cert_der();
    assert_eq!(
        tls_refusal(&sandbox, upstream.addr, root, "evil.example.net").await,
        Refusal::NameNotAllowed
    );
    sandbox.assert_nothing_forwarded(&upstream);
    assert_eq!(sandbox.proxy.stats().connections_refused, 1);
}

#[tokio::test]
async fn an_allowed_name_without_a_pin_is_refused() {
    let (ca, upstream, sandbox) = tls_upstream(policy(false), |_| {}).await;
    // The guest never resolved the name through the gateway.
    assert_eq!(
        tls_refusal(&sandbox, upstream.addr, &ca.der(), API).await,
        Refusal::NotPinned
    );
    assert!(sandbox.uplink.connects().is_empty());
}

#[tokio::test]
async fn an_allowed_name_towards_an_address_not_pinned_for_it_is_refused() {
    let (ca, upstream, sandbox) = tls_setup(policy(false), |_| {}).await;
    // Another server, at an address the name was never resolved to.
    let echo = Echo::start("127.0.0.2").await;
    assert_eq!(
        tls_refusal(&sandbox, echo.addr, &ca.der(), API).await,
        Refusal::NotPinned
    );

    // Cleartext, same story.
    let head = format!(
        "GET / HTTP/1.1\r\nHost: {}\r\n\r\n",
        host_header(echo.addr, API)
    );
    let (reply, refused) = raw_refusal(&sandbox, echo.addr, head.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 403 "), "{reply}");
    assert!(reply.contains(r#""code":"egress_denied""#), "{reply}");
    assert_eq!(refused, Refusal::NotPinned);

    assert_eq!(echo.connections(), 0);
    sandbox.assert_nothing_forwarded(&upstream);
}

#[tokio::test]
async fn ip_literals_are_refused_without_a_cidr_rule() {
    let upstream = Upstream::plain("127.0.0.1").await;
    // Everything public by default, no CIDR rule: an address alone is not enough.
    let sandbox = Sandbox::new(Options::new(EgressPolicy::allow_all_public()));
    let head = format!("GET / HTTP/1.1\r\nHost: {}\r\n\r\n", upstream.addr);
    let (reply, refused) = raw_refusal(&sandbox, upstream.addr, head.as_bytes()).await;
    assert!(reply.starts_with("HTTP/1.1 403 "), "{reply}");
    assert!(matches!(
        refused,
        Refusal::Unnamed {
            what: Unnamed::Unparsable {
                ip_literal: true,
                ..
            },
            ..
        }
    ));

    // TLS to an IP address: no server_name at all.
    let ca = TestCa::new();
    let (guest, done) = sandbox.connect(upstream.addr).await;
    let config = Arc::new(client_tls(&ca.der(), &[]));
    let name = ServerName::IpAddress(upstream.addr.ip().into());
    assert!(tokio_rustls::TlsConnector::from(config)
        .connect(name, guest)
        .await
        .is_err());
    assert!(matches!(
        refusal(outcome(done).await),
        Refusal::Unnamed { .. }
    ));

    sandbox.assert_nothing_forwarded(&upstream);
}

#[tokio::test]
async fn host_different_from_sni_is_misdirected() {
    let (_ca, upstream, sandbox) = tls_setup(policy(true), |_| {}).await;
    let mut guest = sandbox
        .terminated_guest(upstream.addr, &[b"http/1.1"])
        .await;
    for host in [
        host_header(upstream.addr, "other.example.com"),
        format!("{API}:1"),
        API.to_owned(), // port 443 implied, but the connection is to another port
    ] {
        let response = guest.send(request("GET", "/", &[("host", &host)])).await;
        expect_error(
            response,
            StatusCode::MISDIRECTED_REQUEST,
            "misdirected_request",
        )
        .await;
    }
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn http2_authority_different_from_sni_is_misdirected() {
    let (_ca, upstream, sandbox) = tls_setup(policy(true), |_| {}).await;
    let mut guest = sandbox.terminated_guest(upstream.addr, &[b"h2"]).await;
    let other = host_header(upstream.addr, "other.example.com");
    let response = guest
        .send(request("GET", &format!("https://{other}/"), &[]))
        .await;
    assert_eq!(response.status(), StatusCode::MISDIRECTED_REQUEST);
    // The same stream multiplexing goes on: a good request still works.
    assert_eq!(guest.get("/").await.status(), StatusCode::OK);
    assert_eq!(upstream.seen().len(), 1);
}

#[tokio::test]
async fn connect_is_refused() {
    let (upstream, sandbox) = plain_setup(policy(false), API, |_| {}).await;
    let (reply, refused) = raw_refusal(
        &sandbox,
        upstream.addr,
        b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n",
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 405 "), "{reply}");
    assert_eq!(refused, Refusal::Connect);
    assert!(sandbox.uplink.connects().is_empty());
}

#[tokio::test]
async fn garbage_is_refused() {
    let upstream = Upstream::plain("127.0.0.1").await;
    let sandbox = Sandbox::new(Options::new(EgressPolicy::allow_all_public()));
    let cases: [&[u8]; 4] = [
        b"\x00\x01\x02garbage",
        // A TLS record holding a ServerHello.
        b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00",
        // An SSLv2-style hello.
        b"\x80\x2e\x01\x03\x01",
        // Not a request line.
        b"HELLO there\r\n",
    ];
    for bytes in cases {
        let (reply, refused) = raw_refusal(&sandbox, upstream.addr, bytes).await;
        assert!(reply.is_empty(), "{bytes:?}: {reply:?}");
        assert!(matches!(refused, Refusal::Unnamed { .. }), "{bytes:?}");
    }
    // HTTP without a Host: 400.
    let (reply, refused) = raw_refusal(&sandbox, upstream.addr, b"GET / HTTP/1.1\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 400 "), "{reply}");
    assert!(matches!(refused, Refusal::Unnamed { .. }));
    // Cleartext HTTP/2: refused.
    let (_, refused) =
        raw_refusal(&sandbox, upstream.addr, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    assert!(matches!(
        refused,
        Refusal::Unnamed {
            what: Unnamed::H2PriorKnowledge,
            ..
        }
    ));
    sandbox.assert_nothing_forwarded(&upstream);
}

#[tokio::test]
async fn policy_changes_apply_to_the_next_request() {
    let (upstream, sandbox) = plain_setup(policy(false), PLAIN, |_| {}).await;
    let mut guest = sandbox.h1_guest(upstream.addr, PLAIN).await;
    assert_eq!(guest.get("/").await.status(), StatusCode::OK);
    sandbox.policy.store(Arc::new(EgressPolicy::default()));
    expect_denied(guest.get("/").await).await;
    assert_eq!(upstream.seen().len(), 1);
}

#[tokio::test]
async fn connections_past_the_limit_are_closed() {
    let (upstream, sandbox) = plain_setup(policy(false), PLAIN, |options| {
        options.limits = ProxyLimits {
            max_connections: 1,
            ..ProxyLimits::default()
        };
    })
    .await;
    // The first connection holds the only slot while it is sniffed.
    let (first, first_done) = sandbox.connect(upstream.addr).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (_second, second_done) = sandbox.connect(upstream.addr).await;
    assert_eq!(
        refusal(outcome(second_done).await),
        Refusal::TooManyConnections { limit: 1 }
    );
    drop(first);
    outcome(first_done).await.unwrap();
    // The slot is free again.
    let mut guest = sandbox.h1_guest(upstream.addr, PLAIN).await;
    assert_eq!(guest.get("/").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_tenants_sandboxes_share_its_connection_limit() {
    use super::tenant_connections::TenantConnectionLimits;
    let limits = TenantConnectionLimits::new(Some(1));
    let tenant = space_core::TenantId::generate();
    let of_tenant = |options: &mut Options| {
        options.tenant = tenant.clone();
        options.tenant_connections = limits.of(&tenant);
    };
    let (upstream, first) = plain_setup(policy(false), PLAIN, of_tenant).await;
    let second = Sandbox::new({
        let mut options = Options::new(policy(false));
        of_tenant(&mut options);
        options
    });
    second.pin(PLAIN, upstream.addr);
    // The first sandbox's connection holds the tenant's only slot while it is sniffed.
    let (held, held_done) = first.connect(upstream.addr).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (_refused, refused_done) = second.connect(upstream.addr).await;
    assert_eq!(
        refusal(outcome(refused_done).await),
        Refusal::TooManyTenantConnections { limit: 1 }
    );
    second.assert_nothing_forwarded(&upstream);
    // Another tenant's sandbox is not counted against it.
    let (upstream_b, other) = plain_setup(policy(false), PLAIN, |_| {}).await;
    let mut guest = other.h1_guest(upstream_b.addr, PLAIN).await;
    assert_eq!(guest.get("/").await.status(), StatusCode::OK);
    drop(held);
    outcome(held_done).await.unwrap();
    let mut guest = second.h1_guest(upstream.addr, PLAIN).await;
    assert_eq!(guest.get("/").await.status(), StatusCode::OK);
}

// ---- credentials ----

#[tokio::test]
async fn credentials_are_injected_and_the_guests_own_are_stripped() {
    let credentials = credentials(true).await;
    let (_ca, upstream, sandbox) =
        tls_setup(policy(false), |options| credentials.grant(options)).await;
    // A pass-through rule: the credential alone makes the proxy terminate.
    let mut guest = sandbox
        .terminated_guest(upstream.addr, &[b"http/1.1"])
        .await;
    let response = guest
        .call(
            "GET",
            "/v1/models",
            &[
                ("authorization", "Bearer guest-own"),
                ("proxy-authorization", "Basic eA=="),
            ],
        )
        .await;
    let (status, body) = read_response(response).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!body.contains(SECRET));
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].authorization, vec![format!("Bearer {SECRET}")]);
    assert!(!seen[0].headers.contains(&"proxy-authorization".to_owned()));

    // TRACE would echo the injected value back: refused, and the value appears nowhere.
    let response = guest.call("TRACE", "/v1/models", &[]).await;
    let body = expect_denied(response).await;
    assert!(!body.contains(SECRET), "{body}");
    assert_eq!(upstream.seen().len(), 1);

    let events = credentials.events();
    assert!(
        events.iter().any(|e| e.event == AuditKind::Inject
            && e.decision == AuditDecision::Allow
            && e.host == API
            && e.path == "/v1/models"
            && &e.sandbox == sandbox.proxy.sandbox()),
        "{events:?}"
    );
    assert!(events
        .iter()
        .any(|e| e.event == AuditKind::Deny && e.method == "TRACE"));
    let log = credentials.raw_log();
    assert!(!log.contains(SECRET));
}

#[tokio::test]
async fn an_expired_credential_still_terminates_and_refuses() {
    // Expired long ago; the rule asks for pass-through.
    let credentials = credentials_with(|c| c.expires_at_ms = Some(2_000)).await;
    let (_ca, upstream, sandbox) =
        tls_setup(policy(false), |options| credentials.grant(options)).await;
    // Terminated (the guest trusts only its sandbox CA), then refused rather than forwarded
    // without the credential.
    let mut guest = sandbox
        .terminated_guest(upstream.addr, &[b"http/1.1"])
        .await;
    let body = expect_denied(guest.get("/v1/models").await).await;
    assert!(body.contains("expired"), "{body}");
    assert!(upstream.seen().is_empty());
}

#[tokio::test]
async fn a_credential_overridden_for_the_sandbox_does_not_terminate() {
    let credentials = credentials(true).await;
    let (ca, upstream, sandbox) =
        tls_setup(policy(false), |options| credentials.grant(options)).await;
    // The sandbox's own `api` credential, for another host, replaces the tenant-wide one.
    let mut own = Credential {
        id: space_secrets::CredentialId::generate(),
        scope: Scope::Sandbox {
            tenant: credentials.tenant.clone(),
            sandbox: sandbox.proxy.sandbox().clone(),
        },
        ..credentials.manager.list()[0].clone()
    };
    own.rule.hosts = vec!["other.example.com".into()];
    credentials
        .manager
        .put(own, SecretValue::new("other".into()).unwrap())
        .await
        .unwrap();
    let (guest, _done) = sandbox.connect(upstream.addr).await;
    let tls = tls_connect(client_tls(&ca.der(), &[b"http/1.1"]), API, guest)
        .await
        .unwrap();
    // Passed through: the guest sees the upstream's certificate.
    assert_eq!(Some(peer_leaf(&tls)), upstream.leaf);
}

#[tokio::test]
async fn cleartext_to_a_host_whose_credential_requires_tls_is_refused() {
    let credentials = credentials(true).await;
    let (upstream, sandbox) =
        plain_setup(policy(false), API, |options| credentials.grant(options)).await;
    let mut guest = sandbox.h1_guest(upstream.addr, API).await;
    let body = expect_denied(guest.get("/v1/models").await).await;
    assert!(body.contains("cleartext"), "{body}");
    assert!(upstream.seen().is_empty());
    assert!(credentials
        .events()
        .iter()
        .any(|e| e.event == AuditKind::Deny && e.host == API));
}

#[tokio::test]
async fn cleartext_credentials_that_allow_it_are_injected() {
    let credentials = credentials(false).await;
    let (upstream, sandbox) =
        plain_setup(policy(false), API, |options| credentials.grant(options)).await;
    let mut guest = sandbox.h1_guest(upstream.addr, API).await;
    let response = guest
        .call("GET", "/", &[("authorization", "Basic Z3Vlc3Q=")])
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        upstream.seen()[0].authorization,
        vec![format!("Bearer {SECRET}")]
    );
}

// ---- the accept loop ----

#[tokio::test]
async fn serve_closes_connections_that_were_not_redirected() {
    let sandbox = Sandbox::new(Options::new(policy(false)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(SandboxProxy::serve(Arc::clone(&sandbox.proxy), listener));
    let mut guest = TcpStream::connect(addr).await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), guest.read_to_end(&mut out)).await;
    // Closed: no original destination, or one pointing back at the listener.
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    let stats = sandbox.proxy.stats();
    assert_eq!(
        (stats.connections_accepted, stats.connections_refused),
        (1, 1)
    );
    assert!(sandbox.uplink.connects().is_empty());
    server.abort();
}

#[tokio::test]
async fn original_dst_fails_cleanly_without_a_redirect() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _client = TcpStream::connect(addr).await.unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    // Without conntrack NAT: an error. With conntrack loaded but no NAT: the address itself.
    match super::original_dst(&accepted) {
        Ok(dst) => assert_eq!(dst, addr),
        Err(e) => assert!(e.raw_os_error().is_some(), "{e}"),
    }
}
