//! A stand-in "internet" for network tests: a network namespace of its own with a DNS
//! server, web servers (HTTP, and HTTPS with certificates of a test CA) and listeners that
//! count what reaches them. Nodes under test use it as their uplink namespace, so nothing
//! leaves the machine, and everything a sandbox's gateway sends out lands here, where a test
//! can check that a bypass got nothing through ([`Internet::hits`], [`Internet::requests`],
//! [`Internet::dns_queries`]) as well as that the guest saw an error.
//!
//! Addresses (all on the namespace's loopback):
//! - [`WEB`] (11.0.0.1): HTTP on 80, HTTPS on 443, plain HTTP on 8080 (a non-standard port),
//!   TLS on 853 (DNS over TLS), a UDP echo on 443 (QUIC). Every name resolves here by default;
//! - [`OTHER_WEB`] (11.0.0.2): HTTP and HTTPS serving [`OTHER_PAGE`]: an address no name
//!   resolves to, so a page from it means a guest steered the gateway somewhere it chose;
//! - [`PRIVATE`] (10.1.2.3, [`REBIND_NAME`]'s answer) and [`METADATA`] (169.254.169.254,
//!   [`METADATA_NAME`]'s answer): HTTP (and HTTPS) servers, so a gateway that let such an
//!   answer through and connected would be seen;
//! - [`WEB6`] (2600::1, the AAAA of [`V6_NAME`]): HTTP and HTTPS over IPv6;
//! - [`DNS`] (11.0.0.53): the DNS server, UDP and TCP; the node's upstream, and what a guest
//!   might try to query directly.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::AbortHandle;
use tokio_rustls::TlsAcceptor;

/// The web server's address (every name resolves to it unless listed otherwise).
pub const WEB: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 1);
/// A second web server's address, which no name resolves to.
pub const OTHER_WEB: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 2);
/// The DNS server's address.
pub const DNS: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 53);
/// The private address [`REBIND_NAME`] resolves to (a DNS rebinding answer).
pub const PRIVATE: Ipv4Addr = Ipv4Addr::new(10, 1, 2, 3);
/// The cloud metadata address [`METADATA_NAME`] resolves to.
pub const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// The (public) IPv6 address [`V6_NAME`] has as its AAAA.
pub const WEB6: Ipv6Addr = Ipv6Addr::new(0x2600, 0, 0, 0, 0, 0, 0, 1);
/// What the web server at [`WEB`] answers (on every path but `/echo`).
pub const PAGE: &str = "hello from the internet";
/// What the web server at [`OTHER_WEB`] answers.
pub const OTHER_PAGE: &str = "hello from an address no allowed name resolves to";
/// A name whose A record is [`PRIVATE`].
pub const REBIND_NAME: &str = "rebind.example";
/// A name whose A record is [`METADATA`].
pub const METADATA_NAME: &str = "metadata.example";
/// A name with an AAAA record ([`WEB6`]) besides its A record.
pub const V6_NAME: &str = "v6.example";
/// The path on which the web servers echo the request (as does any `TRACE`): the request
/// head in the body, and its `Authorization` in the response header [`ECHO_HEADER`].
pub const ECHO_PATH: &str = "/echo";
/// The response header of [`ECHO_PATH`] that echoes the request's `Authorization`.
pub const ECHO_HEADER: &str = "x-echo-authorization";

/// The TTL of every DNS answer: an hour, so the gateway pins an answer for as long as it
/// does any (its own cap), and a slow test never sees its pins expire.
const TTL: u32 = 3600;
/// How long a listener waits for a TLS handshake before it drops the connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One listener of the internet: what a test asks [`Internet::hits`] about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Listener {
    /// HTTP on [`WEB`]:80.
    Http,
    /// HTTPS on [`WEB`]:443.
    Https,
    /// HTTP on [`OTHER_WEB`]:80.
    OtherHttp,
    /// HTTPS on [`OTHER_WEB`]:443.
    OtherHttps,
    /// HTTP on [`PRIVATE`]:80.
    PrivateHttp,
    /// HTTPS on [`PRIVATE`]:443.
    PrivateHttps,
    /// HTTP on [`METADATA`]:80.
    MetadataHttp,
    /// HTTP on [`WEB6`]:80.
    Http6,
    /// HTTPS on [`WEB6`]:443.
    Https6,
    /// HTTP on [`WEB`]:8080, a non-standard port.
    AltPort,
    /// TLS on [`WEB`]:853 (DNS over TLS; the handshake completes, then the server closes).
    Dot,
    /// UDP on [`WEB`]:443 (QUIC): every datagram is echoed.
    Quic,
    /// DNS on [`DNS`]:53, UDP and TCP (counts queries, the gateway's included).
    Dns,
}

/// How a TCP listener serves a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serve {
    Http,
    Https,
    TlsOnly,
}

impl Listener {
    /// The TCP listeners: address, and how each serves.
    const TCP: [(Listener, Serve); 11] = [
        (Listener::Http, Serve::Http),
        (Listener::Https, Serve::Https),
        (Listener::OtherHttp, Serve::Http),
        (Listener::OtherHttps, Serve::Https),
        (Listener::PrivateHttp, Serve::Http),
        (Listener::PrivateHttps, Serve::Https),
        (Listener::MetadataHttp, Serve::Http),
        (Listener::Http6, Serve::Http),
        (Listener::Https6, Serve::Https),
        (Listener::AltPort, Serve::Http),
        (Listener::Dot, Serve::TlsOnly),
    ];

    /// Where it listens.
    pub fn addr(self) -> SocketAddr {
        let (ip, port): (IpAddr, u16) = match self {
            Listener::Http => (WEB.into(), 80),
            Listener::Https | Listener::Quic => (WEB.into(), 443),
            Listener::OtherHttp => (OTHER_WEB.into(), 80),
            Listener::OtherHttps => (OTHER_WEB.into(), 443),
            Listener::PrivateHttp => (PRIVATE.into(), 80),
            Listener::PrivateHttps => (PRIVATE.into(), 443),
            Listener::MetadataHttp => (METADATA.into(), 80),
            Listener::Http6 => (WEB6.into(), 80),
            Listener::Https6 => (WEB6.into(), 443),
            Listener::AltPort => (WEB.into(), 8080),
            Listener::Dot => (WEB.into(), 853),
            Listener::Dns => (DNS.into(), 53),
        };
        SocketAddr::new(ip, port)
    }

    /// The page its web server answers: [`PAGE`] on [`WEB`], else one that names the
    /// address, so a test can tell where a response came from.
    fn page(self) -> String {
        match self.addr().ip() {
            IpAddr::V4(ip) if ip == WEB => PAGE.to_owned(),
            IpAddr::V4(ip) if ip == OTHER_WEB => OTHER_PAGE.to_owned(),
            ip => format!("hello from {ip}"),
        }
    }
}

/// One HTTP request a web server of the internet received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenRequest {
    /// Which server.
    pub listener: Listener,
    /// The method.
    pub method: String,
    /// The `Host` header, or else the target's authority (HTTP/2's `:authority`).
    pub host: Option<String>,
    /// The path and query.
    pub path: String,
    /// The `Authorization` header, if any (credential injection tests).
    pub authorization: Option<String>,
}

/// Everything the internet saw.
#[derive(Debug, Default)]
struct Log {
    hits: Mutex<HashMap<Listener, u64>>,
    /// TLS connections whose ClientHello did not fit its first record, per listener.
    fragmented_hellos: Mutex<HashMap<Listener, u64>>,
    requests: Mutex<Vec<SeenRequest>>,
    /// DNS question names (lower case, without the trailing dot; non-printable bytes escaped).
    queries: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicking server task leaves the log consistent (every update is one push or add).
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Log {
    fn hit(&self, listener: Listener) {
        *lock(&self.hits).entry(listener).or_default() += 1;
    }
}

/// A stand-in "internet" in a namespace of its own (see the module docs). Nothing leaves
/// the machine. Its servers are tasks on the runtime that started it; they stop, and the
/// namespace goes, when it is dropped.
pub struct Internet {
    /// The namespace's name (the node's `uplink_netns`).
    pub name: String,
    ca_pem: String,
    log: Arc<Log>,
    tasks: Vec<AbortHandle>,
}

impl Internet {
    /// Starts it (needs a tokio runtime: the servers are tasks on it).
    pub fn start() -> Internet {
        use space_net::datapath::netns;
        let name = format!("spt-inet-{}", space_core::SandboxId::generate().as_str());
        netns::create(&name).expect("create the internet namespace");
        // From here on, a panic drops `inet`, which deletes the namespace.
        let mut inet = Internet {
            name: name.clone(),
            ca_pem: String::new(),
            log: Arc::default(),
            tasks: Vec::new(),
        };
        let v4 = [WEB, OTHER_WEB, DNS, PRIVATE, METADATA].map(|ip| format!("{ip}/32"));
        let v6 = format!("{WEB6}/128");
        let mut commands = vec![vec!["-n", &name, "link", "set", "lo", "up"]];
        commands.extend(
            v4.iter()
                .map(|a| vec!["-n", &name, "addr", "add", a, "dev", "lo"]),
        );
        // `nodad`: the address is usable at once (no duplicate address detection to wait for).
        commands.push(vec![
            "-n", &name, "-6", "addr", "add", &v6, "dev", "lo", "nodad",
        ]);
        for args in commands {
            let ok = std::process::Command::new("ip")
                .args(&args)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "ip {args:?}");
        }

        // A CA of the test's own (rcgen, through space-net's CA code), minting a leaf for
        // whatever name a client asks for: HTTPS works for every test name, and the node
        // trusts it through `upstream_extra_ca_pem`, the guest through `curl --cacert`.
        let ca = space_net::ca::SandboxCa::generate("space test internet")
            .expect("make the internet's CA");
        inet.ca_pem = ca.cert_pem().to_owned();
        let leaves = Arc::new(space_net::ca::LeafCache::new(Arc::new(ca)));
        let tls = space_net::ca::server_config(
            leaves,
            &[space_net::ca::Alpn::H2, space_net::ca::Alpn::Http11],
        )
        .expect("the internet's TLS configuration");
        let acceptor = TlsAcceptor::from(tls);

        let (tcp, udp) = netns::run_in(&name, || {
            let mut tcp = Vec::new();
            for (listener, serve) in Listener::TCP {
                let socket = std::net::TcpListener::bind(listener.addr())?;
                socket.set_nonblocking(true)?;
                tcp.push((listener, serve, socket));
            }
            let dns_tcp = std::net::TcpListener::bind(Listener::Dns.addr())?;
            dns_tcp.set_nonblocking(true)?;
            let mut udp = Vec::new();
            for listener in [Listener::Dns, Listener::Quic] {
                let socket = std::net::UdpSocket::bind(listener.addr())?;
                socket.set_nonblocking(true)?;
                udp.push((listener, socket));
            }
            Ok(((tcp, dns_tcp), udp))
        })
        .expect("bind in the internet namespace");
        let (tcp, dns_tcp) = tcp;

        for (listener, serve, socket) in tcp {
            let socket = tokio::net::TcpListener::from_std(socket).expect("tokio listener");
            let tls = (serve != Serve::Http).then(|| acceptor.clone());
            let log = Arc::clone(&inet.log);
            let task = tokio::spawn(serve_tcp(listener, serve, socket, tls, log));
            inet.tasks.push(task.abort_handle());
        }
        let dns_tcp = tokio::net::TcpListener::from_std(dns_tcp).expect("tokio listener");
        let task = tokio::spawn(serve_dns_tcp(dns_tcp, Arc::clone(&inet.log)));
        inet.tasks.push(task.abort_handle());
        for (listener, socket) in udp {
            let socket = tokio::net::UdpSocket::from_std(socket).expect("tokio udp");
            let log = Arc::clone(&inet.log);
            let task = tokio::spawn(serve_udp(listener, socket, log));
            inet.tasks.push(task.abort_handle());
        }
        inet
    }

    /// The PEM of the CA its HTTPS certificates chain to (for the node's
    /// `upstream_extra_ca_pem`, and for `curl --cacert` in a guest).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Makes `node` reach this internet: sandbox networks on, the gateways connecting out
    /// from its namespace, asking its DNS server and trusting its CA.
    pub fn uplink_of(&self, node: &mut space_node::NodeConfig) {
        node.sandbox_network = true;
        node.uplink_netns = Some(self.name.clone());
        node.upstream_dns = vec![SocketAddr::from((DNS, 53))];
        node.upstream_extra_ca_pem = Some(self.ca_pem.clone());
    }

    /// Connections (TCP) or datagrams (UDP) `listener` received so far; for [`Listener::Dns`],
    /// queries over either.
    pub fn hits(&self, listener: Listener) -> u64 {
        lock(&self.log.hits).get(&listener).copied().unwrap_or(0)
    }

    /// TLS connections to `listener` whose ClientHello arrived split over several records.
    pub fn fragmented_hellos(&self, listener: Listener) -> u64 {
        lock(&self.log.fragmented_hellos)
            .get(&listener)
            .copied()
            .unwrap_or(0)
    }

    /// The HTTP requests the web servers received so far.
    pub fn requests(&self) -> Vec<SeenRequest> {
        lock(&self.log.requests).clone()
    }

    /// How many DNS queries for `name` (compared in lower case, without a trailing dot)
    /// the DNS server received.
    pub fn dns_queries(&self, name: &str) -> usize {
        let name = normalise(name);
        lock(&self.log.queries)
            .iter()
            .filter(|q| **q == name)
            .count()
    }

    /// Every DNS question name received so far (lower case, no trailing dot, bytes that are
    /// not printable ASCII escaped as `\DDD`).
    pub fn all_dns_queries(&self) -> Vec<String> {
        lock(&self.log.queries).clone()
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let _ = space_net::datapath::netns::delete(&self.name);
    }
}

fn normalise(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// Accepts connections on `socket` forever, counting each before anything else happens.
async fn serve_tcp(
    listener: Listener,
    serve: Serve,
    socket: tokio::net::TcpListener,
    tls: Option<TlsAcceptor>,
    log: Arc<Log>,
) {
    while let Ok((stream, _)) = socket.accept().await {
        log.hit(listener);
        let log = Arc::clone(&log);
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_http(listener, TokioIo::new(stream), false, log).await,
                Some(acceptor) => {
                    if hello_is_fragmented(&stream).await {
                        *lock(&log.fragmented_hellos).entry(listener).or_default() += 1;
                    }
                    let accept = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
                    let Ok(Ok(stream)) = accept.await else {
                        return;
                    };
                    if serve == Serve::TlsOnly {
                        return;
                    }
                    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                    serve_http(listener, TokioIo::new(stream), h2, log).await;
                }
            }
        });
    }
}

/// Whether the ClientHello at the start of `stream` is longer than its first TLS record (a
/// client that split it). Looks without consuming; `false` when it cannot tell in time.
async fn hello_is_fragmented(stream: &tokio::net::TcpStream) -> bool {
    // Record header (type, version, length) then the handshake header (type, 24-bit length).
    let mut head = [0u8; 9];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let Ok(Ok(n)) = tokio::time::timeout_at(deadline, stream.peek(&mut head)).await else {
            return false;
        };
        if n == 0 {
            return false;
        }
        if n == head.len() {
            break;
        }
        // Fewer bytes than asked are there: wait a little for the rest.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if head[0] != 22 || head[5] != 1 {
        return false;
    }
    let record = usize::from(u16::from_be_bytes([head[3], head[4]]));
    let hello = usize::from(head[6]) << 16 | usize::from(head[7]) << 8 | usize::from(head[8]);
    hello + 4 > record
}

/// Serves HTTP/1.1 or (after ALPN `h2`) HTTP/2 on one connection.
async fn serve_http<I>(listener: Listener, io: TokioIo<I>, h2: bool, log: Arc<Log>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let log = Arc::clone(&log);
        async move { Ok::<_, Infallible>(respond(listener, &log, &req)) }
    });
    if h2 {
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, service)
            .await;
    } else {
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(io, service)
            .await;
    }
}

/// Logs a request and answers it: its listener's page, or on [`ECHO_PATH`] (and for any
/// `TRACE`) what the server received, one line each: who served it, method, version, the
/// target's authority, then every header as `name: value`.
fn respond(listener: Listener, log: &Log, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .or_else(|| req.uri().authority().map(|a| a.to_string()));
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    lock(&log.requests).push(SeenRequest {
        listener,
        method: req.method().to_string(),
        host,
        path: path.clone(),
        authorization: req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    });
    let body = if path == ECHO_PATH || req.method() == hyper::Method::TRACE {
        let mut echo = format!(
            "served-by {}\nmethod {}\nversion {:?}\nauthority {}\n",
            listener.addr(),
            req.method(),
            req.version(),
            req.uri()
                .authority()
                .map_or_else(|| "-".to_owned(), |a| a.to_string()),
        );
        for (name, value) in req.headers() {
            echo.push_str(&format!(
                "{name}: {}\n",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
        echo
    } else {
        listener.page()
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    if path == ECHO_PATH {
        // An echo in a response header too (a debug header of some APIs).
        if let Some(auth) = req.headers().get(hyper::header::AUTHORIZATION) {
            response.headers_mut().insert(ECHO_HEADER, auth.clone());
        }
    }
    response
}

/// UDP: DNS queries are answered, anything else (QUIC) echoed; every datagram counted.
async fn serve_udp(listener: Listener, socket: tokio::net::UdpSocket, log: Arc<Log>) {
    let mut buf = vec![0u8; 65536];
    while let Ok((n, from)) = socket.recv_from(&mut buf).await {
        log.hit(listener);
        let reply = match listener {
            Listener::Dns => dns_answer(&buf[..n], &log),
            _ => Some(buf[..n].to_vec()),
        };
        if let Some(reply) = reply {
            let _ = socket.send_to(&reply, from).await;
        }
    }
}

/// DNS over TCP: length-prefixed queries, answered in turn.
async fn serve_dns_tcp(socket: tokio::net::TcpListener, log: Arc<Log>) {
    while let Ok((mut stream, _)) = socket.accept().await {
        let log = Arc::clone(&log);
        tokio::spawn(async move {
            loop {
                let mut len = [0u8; 2];
                if stream.read_exact(&mut len).await.is_err() {
                    return;
                }
                let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
                if stream.read_exact(&mut query).await.is_err() {
                    return;
                }
                log.hit(Listener::Dns);
                let Some(answer) = dns_answer(&query, &log) else {
                    return;
                };
                let Ok(answer_len) = u16::try_from(answer.len()) else {
                    return;
                };
                let mut framed = answer_len.to_be_bytes().to_vec();
                framed.extend_from_slice(&answer);
                if stream.write_all(&framed).await.is_err() {
                    return;
                }
            }
        });
    }
}

/// The addresses of `name` (normalised) of type `qtype`: [`PRIVATE`] for [`REBIND_NAME`],
/// [`METADATA`] for [`METADATA_NAME`], [`WEB`] for any other A; [`WEB6`] as the AAAA of
/// [`V6_NAME`], no other AAAA.
fn records(name: &str, qtype: hickory_proto::rr::RecordType) -> Vec<hickory_proto::rr::RData> {
    use hickory_proto::rr::rdata::{A, AAAA};
    use hickory_proto::rr::{RData, RecordType};
    match qtype {
        RecordType::A => {
            let ip = match name {
                REBIND_NAME => PRIVATE,
                METADATA_NAME => METADATA,
                _ => WEB,
            };
            vec![RData::A(A(ip))]
        }
        RecordType::AAAA if name == V6_NAME => vec![RData::AAAA(AAAA(WEB6))],
        _ => Vec::new(),
    }
}

/// Answers one DNS query (wire format), logging its question names.
fn dns_answer(query: &[u8], log: &Log) -> Option<Vec<u8>> {
    use hickory_proto::op::{Message, MessageType};
    use hickory_proto::rr::Record;
    let q = Message::from_vec(query).ok()?;
    let mut a = Message::new();
    a.set_id(q.id())
        .set_message_type(MessageType::Response)
        .set_op_code(q.op_code())
        .set_recursion_desired(q.recursion_desired())
        .set_recursion_available(true);
    for query in q.queries() {
        a.add_query(query.clone());
        let name = query_name(query.name());
        for rdata in records(&name, query.query_type()) {
            a.add_answer(Record::from_rdata(query.name().clone(), TTL, rdata));
        }
        lock(&log.queries).push(name);
    }
    a.to_vec().ok()
}

/// A question name as logged: labels joined by dots, lower case, bytes that are not
/// printable ASCII (or are a dot inside a label) as `\DDD`.
fn query_name(name: &hickory_proto::rr::Name) -> String {
    let mut out = String::new();
    for label in name.iter() {
        if !out.is_empty() {
            out.push('.');
        }
        for &b in label {
            if b.is_ascii_graphic() && b != b'.' && b != b'\\' {
                out.push(char::from(b.to_ascii_lowercase()));
            } else {
                out.push_str(&format!("\\{b:03}"));
            }
        }
    }
    out
}
