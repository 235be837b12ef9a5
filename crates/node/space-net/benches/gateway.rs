//! Issue 4's gateway benchmark: the egress gateway against a direct path, in one run.
//!
//! Run it with `sudo ./scripts/bench-gateway` (or `cargo bench -p space-net --bench gateway`
//! as root). It needs `ip` and `nft`, and makes three network namespaces (`spt-bench-*`),
//! removed when it ends:
//!
//! ```text
//!   guest ns                    sandbox ns (SandboxNetwork)            internet ns
//!   eth0 10.0.2.15 ── veth ──── tap0 10.0.2.1                          lo 11.0.0.1  HTTP :80, HTTPS :443
//!   (the guest's MAC)           nftables: anti-spoof, TCP → :15001,    lo 11.0.0.53 DNS :53
//!                               DNS only to 10.0.2.1                   NetnsUplink: the gateway's
//!                               SandboxResolver :53, SandboxProxy      upstream sockets and lookups
//!                               :15001 (tasks of this process)
//!   direct0 172.31.0.2 ──────────────────── veth ──────────────────── direct1 172.31.0.1
//! ```
//!
//! No VM: under QEMU TCG the guest's virtio-net would measure the emulator, not the gateway.
//! The guest is a namespace whose `eth0` stands where a VM's NIC would, on the other end of
//! a veth that [`SandboxNetwork::create_with_veth`] puts in place of the TAP, with the guest's
//! address and MAC: its packets meet the real firewall (anti-spoofing on `tap0`'s ingress,
//! every TCP connection redirected to the proxy, DNS only to the gateway), the real
//! [`SandboxResolver`] and [`SandboxProxy`] (as `space-node` starts them), and leave through
//! the real [`NetnsUplink`] in the stand-in internet. The same client also reaches the
//! internet's servers directly over a plain veth (`direct0`, no proxy): that is the baseline.
//!
//! Figures (each sampled repeatedly after a warm-up, direct and gateway samples interleaved
//! so that load on the machine hits both alike):
//! - 100 MiB download throughput, cleartext HTTP (the proxy parses HTTP/1 and forwards it
//!   with hyper), HTTPS pass-through (the proxy splices; the rule asks for `pass_through`)
//!   and HTTPS terminated (the default for a domain rule: the proxy serves the guest TLS
//!   with a leaf of the sandbox CA and forwards every request over TLS), direct vs gateway;
//!   target for HTTP and pass-through: the median of the per-round ratios gateway / direct
//!   ≥ 80 % (a round is one direct and one gateway download back to back). Also the CPU
//!   time the process spent per download, a figure that load from other processes changes
//!   far less than throughput;
//! - latency of a small GET over a fresh connection (connect to last body byte), direct vs
//!   gateway; target: added p50 ≤ 1 ms;
//! - TLS handshakes per second through the gateway, terminated (a plain domain rule; the
//!   client trusts the sandbox CA) and passed through (the upstream's handshake, spliced),
//!   with the same handshakes against the upstream server directly as a reference;
//! - DNS answers per second from the gateway resolver (UDP, a few queries in flight), for a
//!   name in the upstream cache and for names that each need an upstream lookup, with the
//!   stand-in authoritative server asked directly as a reference.
//!
//! Percentiles are nearest-rank. For a rate, "p90" is the slow tail: the value 90 % of the
//! samples reach (for downloads, the throughput of the p90 download time).
//!
//! Options (after `--`): `--downloads N` (per path and protocol, default 10), `--requests N`
//! (latency samples per path, default 400), `--trials N` (rate trials, default 5),
//! `--trial-secs S` (default 2), `--concurrency N` (default 4).

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hickory_proto::op::{Message, MessageType, Query};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls::client::Resumption;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use space_core::egress::{DomainPattern, EgressMode, EgressPolicy, EgressRule};
use space_core::{SandboxId, TenantId};
use space_net::ca::{crypto_provider, LeafCache, SandboxCa};
use space_net::datapath::{netns, GuestLink, SandboxNetwork};
use space_net::dns::{DnsLimits, PinLimits, PinTable, SandboxResolver};
use space_net::proxy::tenant_connections::TenantConnections;
use space_net::proxy::{upstream_tls_config, ProxyContext, ProxyLimits, SandboxProxy, Uplink};
use space_net::uplink::NetnsUplink;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::runtime::Runtime;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The web server's address in the internet (what every name resolves to).
const WEB: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 1);
/// The authoritative DNS server's address in the internet.
const AUTHORITY: Ipv4Addr = Ipv4Addr::new(11, 0, 0, 53);
/// The internet's end of the direct veth.
const DIRECT_INET: Ipv4Addr = Ipv4Addr::new(172, 31, 0, 1);
/// The guest's end of the direct veth.
const DIRECT_GUEST: Ipv4Addr = Ipv4Addr::new(172, 31, 0, 2);

/// Downloaded through the gateway in pass-through (HTTP parsed, HTTPS spliced: its rule
/// asks for `pass_through`).
const DOWNLOAD_HOST: &str = "dl.bench.example";
/// A plain domain rule: the proxy terminates TLS for it (the default).
const TERMINATED_HOST: &str = "tls.bench.example";
/// Asked of the resolver again and again (answered from the upstream cache).
const DNS_HOST: &str = "dns.bench.example";
/// Under it, a fresh name per query (each one an upstream lookup).
const COLD_SUFFIX: &str = "cold.bench.example";

const BIG_PATH: &str = "/big";
const BIG_LEN: u64 = 100 * 1024 * 1024;
const SMALL_PATH: &str = "/small";
const SMALL_BODY: &[u8] = b"small response body of the gateway benchmark\n";

/// How long one request, handshake or download may take before the benchmark gives up.
const OP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a DNS query waits for its answer (then it counts as lost).
const DNS_TIMEOUT: Duration = Duration::from_secs(1);

struct Options {
    downloads: usize,
    requests: usize,
    trials: usize,
    trial: Duration,
    concurrency: usize,
}

impl Options {
    fn parse() -> Options {
        let mut o = Options {
            downloads: 10,
            requests: 400,
            trials: 5,
            trial: Duration::from_secs(2),
            concurrency: 4,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| -> u64 {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{name} needs a number"))
            };
            match arg.as_str() {
                "--downloads" => o.downloads = value(&arg).max(1) as usize,
                "--requests" => o.requests = value(&arg).max(1) as usize,
                "--trials" => o.trials = value(&arg).max(1) as usize,
                "--trial-secs" => o.trial = Duration::from_secs(value(&arg).max(1)),
                "--concurrency" => o.concurrency = value(&arg).max(1) as usize,
                // What cargo passes to every bench target.
                "--bench" => {}
                other => panic!("unknown option {other:?}"),
            }
        }
        o
    }
}

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: this one needs root
    // and namespaces, and takes a minute, so it only runs when asked for.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "gateway benchmark: skipped (run it with `cargo bench` or ./scripts/bench-gateway)"
        );
        return;
    }
    let options = Options::parse();
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("gateway benchmark: needs root (network namespaces, nftables)");
        std::process::exit(1);
    }
    let topology = Topology::create();
    let report = run(&topology, &options);
    drop(topology);
    report.print(&options);
}

// ---- namespaces ----

/// The three namespaces; removed on drop (also when the benchmark panics).
struct Topology {
    inet: String,
    guest: String,
    sandbox: SandboxNetwork,
}

impl Topology {
    fn create() -> Topology {
        let prefix = format!("spt-bench-{}", std::process::id());
        let inet = format!("{prefix}-inet");
        let guest = format!("{prefix}-guest");
        netns::create(&inet).expect("create the internet namespace");
        // From here on, a failure still removes what exists (Drop).
        let mut partial = Partial {
            names: vec![inet.clone()],
        };
        netns::create(&guest).expect("create the guest namespace");
        partial.names.push(guest.clone());
        ip(&format!("-n {inet} link set lo up"));
        ip(&format!("-n {inet} addr add {WEB}/32 dev lo"));
        ip(&format!("-n {inet} addr add {AUTHORITY}/32 dev lo"));
        ip(&format!("-n {guest} link set lo up"));
        // The direct path: a plain veth between the guest and the internet.
        ip(&format!(
            "-n {guest} link add direct0 type veth peer name direct1 netns {inet}"
        ));
        ip(&format!(
            "-n {guest} addr add {DIRECT_GUEST}/30 dev direct0"
        ));
        ip(&format!("-n {inet} addr add {DIRECT_INET}/30 dev direct1"));
        ip(&format!("-n {guest} link set direct0 up"));
        ip(&format!("-n {inet} link set direct1 up"));

        // The sandbox, with the guest's end of its link in the guest namespace.
        let link = GuestLink::default();
        let sandbox_ns = format!("{prefix}-sbx");
        let sandbox = SandboxNetwork::create_with_veth(&sandbox_ns, link.clone(), &guest, "eth0")
            .expect("create the sandbox network");
        partial.names.push(sandbox_ns);
        // What the guest's OS does with its NIC (spaced's `configure`).
        let (addr, prefix_len, gateway) = (link.guest, link.prefix, link.gateway);
        ip(&format!("-n {guest} addr add {addr}/{prefix_len} dev eth0"));
        ip(&format!("-n {guest} link set eth0 up"));
        ip(&format!(
            "-n {guest} route add default via {gateway} dev eth0"
        ));
        partial.names.clear();
        Topology {
            inet,
            guest,
            sandbox,
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let _ = self.sandbox.destroy();
        let _ = netns::delete(&self.guest);
        let _ = netns::delete(&self.inet);
    }
}

/// Namespaces made so far while [`Topology::create`] runs.
struct Partial {
    names: Vec<String>,
}

impl Drop for Partial {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = netns::delete(name);
        }
    }
}

/// Runs `ip` with these whitespace-separated arguments (names here have no spaces).
fn ip(args: &str) {
    let status = std::process::Command::new("ip")
        .args(args.split_whitespace())
        .status()
        .expect("run ip");
    assert!(status.success(), "ip {args} failed");
}

/// A runtime whose threads all live in namespace `ns`: sockets its tasks create belong to
/// it. (Only tasks run on those threads: `block_on` runs on the caller's, so everything
/// that makes sockets is spawned, see [`on`].)
fn runtime_in(ns: Option<&str>, workers: usize, name: &str) -> Runtime {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(workers)
        .thread_name(name)
        .enable_all();
    if let Some(ns) = ns {
        let file = Arc::new(std::fs::File::open(netns::path(ns)).expect("open the namespace"));
        builder.on_thread_start(move || {
            nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("enter the namespace");
        });
    }
    builder.build().expect("build a runtime")
}

/// Runs `fut` as a task of `rt` (so on its threads, in its namespace) and waits for it.
fn on<T: Send + 'static>(
    rt: &Runtime,
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    rt.block_on(rt.spawn(fut)).expect("benchmark task panicked")
}

// ---- the internet's servers ----

/// The upstream servers' CA (the "public" PKI of the benchmark).
struct TestCa {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl TestCa {
    fn new() -> TestCa {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("CA key");
        let mut params = CertificateParams::new(Vec::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa { cert, key }
    }

    fn leaf(&self, hosts: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).expect("leaf key");
        let names: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
        let params = CertificateParams::new(names).expect("leaf params");
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("leaf certificate");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (cert.der().clone(), key)
    }
}

/// Starts the web servers (HTTP :80, HTTPS :443, on every address of the internet namespace)
/// and the authoritative DNS server (:53) as tasks of `rt`, whose threads are in it.
fn start_internet(rt: &Runtime, ca: &TestCa) {
    let (cert, key) = ca.leaf(&[DOWNLOAD_HOST, TERMINATED_HOST]);
    let mut config = ServerConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .expect("server certificate");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    on(rt, async move {
        let http = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 80))
            .await
            .expect("bind :80");
        let https = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 443))
            .await
            .expect("bind :443");
        let dns = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 53))
            .await
            .expect("bind :53");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = http.accept().await {
                let _ = tcp.set_nodelay(true);
                tokio::spawn(serve_http(tcp));
            }
        });
        tokio::spawn(async move {
            while let Ok((tcp, _)) = https.accept().await {
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        serve_http(tls).await;
                    }
                });
            }
        });
        tokio::spawn(serve_dns(dns));
    });
}

/// A minimal HTTP/1.1 origin: `GET /big` is [`BIG_LEN`] bytes, anything else
/// [`SMALL_BODY`]; keeps the connection unless asked to close. Hand-written so that the
/// origin costs as little CPU as possible (both paths share the machine's two cores).
async fn serve_http<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
    let chunk = vec![0x5a_u8; 1 << 20];
    let mut buf = Vec::with_capacity(4096);
    loop {
        let Some(head_len) = read_head(&mut s, &mut buf).await else {
            return;
        };
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        if !matches!(
            req.parse(&buf[..head_len]),
            Ok(httparse::Status::Complete(_))
        ) {
            return;
        }
        let big = req.path == Some(BIG_PATH);
        let close = req.version == Some(0)
            || req.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("connection") && h.value.eq_ignore_ascii_case(b"close")
            });
        buf.drain(..head_len);
        let len = if big {
            BIG_LEN
        } else {
            SMALL_BODY.len() as u64
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {len}\r\n{}\r\n",
            if close { "connection: close\r\n" } else { "" }
        );
        if s.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let written = if big {
            let mut left = BIG_LEN;
            let mut ok = true;
            while left > 0 && ok {
                let n = left.min(chunk.len() as u64) as usize;
                ok = s.write_all(&chunk[..n]).await.is_ok();
                left -= n as u64;
            }
            ok
        } else {
            s.write_all(SMALL_BODY).await.is_ok()
        };
        if !written || s.flush().await.is_err() {
            return;
        }
        if close {
            let _ = s.shutdown().await;
            return;
        }
    }
}

/// Reads into `buf` until it holds a whole message head; returns the head's length, or
/// `None` at EOF, on an error, or when the head is unreasonably long.
async fn read_head<S: AsyncRead + Unpin>(s: &mut S, buf: &mut Vec<u8>) -> Option<usize> {
    let mut tmp = [0u8; 8192];
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(i + 4);
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        match s.read(&mut tmp).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&tmp[..n]),
        }
    }
}

/// The stand-in authoritative server: every A query is answered [`WEB`] (TTL 300), any
/// other type with no answer.
async fn serve_dns(socket: UdpSocket) {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; 1500];
    while let Ok((n, from)) = socket.recv_from(&mut buf).await {
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let mut answer = Message::new();
        answer
            .set_id(query.id())
            .set_message_type(MessageType::Response)
            .set_op_code(query.op_code())
            .set_authoritative(true)
            .set_recursion_desired(query.recursion_desired());
        for q in query.queries() {
            answer.add_query(q.clone());
            if q.query_type() == RecordType::A {
                answer.add_answer(Record::from_rdata(q.name().clone(), 300, RData::A(A(WEB))));
            }
        }
        if let Some(edns) = query.extensions() {
            answer.set_edns(edns.clone());
        }
        if let Ok(bytes) = answer.to_vec() {
            let _ = socket.send_to(&bytes, from).await;
        }
    }
}

// ---- the gateway ----

/// The sandbox's gateway, as `space-node`'s `start_gateway` makes it (with the benchmark's
/// policy, upstream CA and a DNS rate limit out of the way).
struct Gateway {
    proxy: Arc<SandboxProxy>,
    ca: Arc<SandboxCa>,
}

fn start_gateway(
    rt: &Runtime,
    topology: &Topology,
    upstream_ca: CertificateDer<'static>,
) -> Gateway {
    let link = &topology.sandbox.link;
    let (gw, proxy_port) = (link.gateway, link.proxy_port);
    let (udp, dns_tcp, listener) = netns::run_in(&topology.sandbox.netns, move || {
        let udp = std::net::UdpSocket::bind((gw, 53))?;
        let dns_tcp = std::net::TcpListener::bind((gw, 53))?;
        let proxy = std::net::TcpListener::bind(SocketAddr::from((gw, proxy_port)))?;
        udp.set_nonblocking(true)?;
        dns_tcp.set_nonblocking(true)?;
        proxy.set_nonblocking(true)?;
        Ok((udp, dns_tcp, proxy))
    })
    .expect("gateway sockets in the sandbox namespace");
    let uplink = Arc::new(
        NetnsUplink::start(
            Some(&topology.inet),
            &[SocketAddr::from((AUTHORITY, 53))],
            Default::default(),
            Arc::new(
                space_net::datapath::uplink_guard::MarkedSockets::new(
                    Some(&topology.inet),
                    0x5ace_be00,
                )
                .expect("uplink sockets"),
            ),
        )
        .expect("start the uplink"),
    );
    let domain = |s: &str| DomainPattern::parse(s).expect("domain pattern");
    let policy = EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: vec![
            // Pass-through asked for explicitly; domain rules terminate TLS by default.
            EgressRule::allow(domain(DOWNLOAD_HOST)).passed_through(),
            EgressRule::allow(domain(TERMINATED_HOST)),
            EgressRule::allow(domain(DNS_HOST)),
            EgressRule::allow(domain(&format!("*.{COLD_SUFFIX}"))),
        ],
    };
    policy.validate().expect("valid policy");
    let policy = Arc::new(ArcSwap::from_pointee(policy));
    let pins = Arc::new(PinTable::new(PinLimits::default()));
    let id = SandboxId::generate();
    // The default token bucket (200 queries/s per sandbox) would measure the limit, not the
    // resolver: lift it. Every other bound is the default.
    let dns_limits = DnsLimits {
        queries_per_second: 10_000_000,
        query_burst: 10_000_000,
        ..DnsLimits::default()
    };
    let resolver = Arc::new(SandboxResolver::with_limits(
        id.clone(),
        Arc::clone(&policy),
        Arc::clone(&pins),
        Arc::clone(&uplink),
        dns_limits,
    ));
    let ca = Arc::new(SandboxCa::generate("SPACE gateway benchmark").expect("sandbox CA"));
    let proxy = Arc::new(SandboxProxy::new(
        ProxyContext {
            sandbox: id,
            tenant: TenantId::generate(),
            project: None,
            inherited_from: Vec::new(),
            policy,
            pins,
            leaves: Arc::new(LeafCache::new(Arc::clone(&ca))),
            credentials: None,
            upstream_tls: upstream_tls_config(&[upstream_ca]).expect("upstream TLS"),
            limits: ProxyLimits::default(),
            tenant_connections: TenantConnections::unshared(None),
        },
        uplink as Arc<dyn Uplink>,
    ));
    let serving = Arc::clone(&proxy);
    rt.block_on(async move {
        let udp = UdpSocket::from_std(udp).expect("tokio UDP socket");
        let dns_tcp = TcpListener::from_std(dns_tcp).expect("tokio listener");
        let listener = TcpListener::from_std(listener).expect("tokio listener");
        tokio::spawn(resolver.serve(udp, dns_tcp));
        tokio::spawn(serving.serve(listener));
    });
    Gateway { proxy, ca }
}

// ---- the guest's client ----

fn client_tls(root: &CertificateDer<'static>) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(root.clone()).expect("trust root");
    let mut config = ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    // Every handshake a full one: resumption would measure the session cache instead.
    config.resumption = Resumption::disabled();
    Arc::new(config)
}

/// Where a request goes: an address, and TLS for a name (or cleartext).
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    host: &'static str,
    tls: Option<Arc<ClientConfig>>,
}

/// A DNS query for `name`'s A record.
fn dns_query(name: &str, id: u16) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(id).set_recursion_desired(true);
    m.add_query(Query::query(
        Name::from_ascii(name).expect("DNS name"),
        RecordType::A,
    ));
    m.to_vec().expect("DNS query")
}

/// Sends a query for `name` on the connected `socket`; the first A address of the answer,
/// or `None` (no answer in time, or none with an address).
async fn ask(socket: &UdpSocket, name: &str, id: u16) -> Option<Ipv4Addr> {
    socket.send(&dns_query(name, id)).await.ok()?;
    let mut buf = [0u8; 1500];
    let deadline = tokio::time::Instant::now() + DNS_TIMEOUT;
    loop {
        let n = tokio::time::timeout_at(deadline, socket.recv(&mut buf))
            .await
            .ok()?
            .ok()?;
        let Ok(answer) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if answer.id() != id {
            continue; // a late answer to an earlier, timed-out query
        }
        return answer.answers().iter().find_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        });
    }
}

/// Resolves `name` through the gateway, as the guest's stub resolver would (this is what
/// pins the address the proxy will connect to).
async fn resolve(gateway: Ipv4Addr, name: &str) -> Ipv4Addr {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .await
        .expect("bind");
    socket.connect((gateway, 53)).await.expect("connect");
    for id in 1..=3 {
        if let Some(addr) = ask(&socket, name, id).await {
            return addr;
        }
    }
    panic!("the gateway resolver did not answer {name}");
}

/// `GET path` on a fresh connection to `target`: the body's length (checked against
/// `content-length`).
async fn get(target: &Target, path: &str) -> std::io::Result<u64> {
    let tcp = TcpStream::connect(target.addr).await?;
    let _ = tcp.set_nodelay(true);
    match &target.tls {
        None => get_on(tcp, target.host, path).await,
        Some(config) => {
            let name = ServerName::try_from(target.host).map_err(std::io::Error::other)?;
            let tls = TlsConnector::from(Arc::clone(config))
                .connect(name, tcp)
                .await?;
            get_on(tls, target.host, path).await
        }
    }
}

async fn get_on<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    host: &str,
    path: &str,
) -> std::io::Result<u64> {
    let request = format!("GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await?;
    let mut buf = Vec::with_capacity(8192);
    let bad = |what: &str| std::io::Error::other(what.to_owned());
    let head_len = read_head(&mut s, &mut buf)
        .await
        .ok_or_else(|| bad("no response head"))?;
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut response = httparse::Response::new(&mut headers);
    response
        .parse(&buf[..head_len])
        .map_err(|e| bad(&format!("bad response head: {e}")))?;
    if response.code != Some(200) {
        return Err(bad(&format!("status {:?}", response.code)));
    }
    let len: u64 = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
        .ok_or_else(|| bad("no content-length"))?;
    let mut got = (buf.len() - head_len) as u64;
    let mut chunk = vec![0u8; 256 * 1024];
    while got < len {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(bad(&format!("body ended at {got} of {len} bytes")));
        }
        got += n as u64;
    }
    if got != len {
        return Err(bad(&format!("body of {got} bytes, expected {len}")));
    }
    Ok(got)
}

/// One timed operation, bounded by [`OP_TIMEOUT`].
async fn timed<F, T>(fut: F) -> (Duration, T)
where
    F: std::future::Future<Output = std::io::Result<T>>,
{
    let start = Instant::now();
    let result = tokio::time::timeout(OP_TIMEOUT, fut)
        .await
        .expect("operation timed out")
        .expect("operation failed");
    (start.elapsed(), result)
}

/// One download: how long it took, and the CPU time the whole process (client, gateway,
/// origin, and the kernel's work on their behalf) spent meanwhile.
#[derive(Clone, Copy)]
struct Download {
    wall: Duration,
    cpu: Duration,
}

/// CPU time (user + system) of this process so far.
fn process_cpu() -> Duration {
    // SAFETY: `getrusage` only writes the struct it is given, which is plain data.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(
            libc::getrusage(libc::RUSAGE_SELF, &mut usage),
            0,
            "getrusage"
        );
        usage
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Downloads [`BIG_PATH`] from each target in turn, `n` rounds (after a warm-up round);
/// each target's downloads, round by round.
async fn downloads(targets: Vec<Target>, n: usize) -> Vec<Vec<Download>> {
    let mut samples = vec![Vec::with_capacity(n); targets.len()];
    for round in 0..=n {
        for (i, target) in targets.iter().enumerate() {
            let cpu = process_cpu();
            let (wall, len) = timed(get(target, BIG_PATH)).await;
            let cpu = process_cpu().saturating_sub(cpu);
            assert_eq!(len, BIG_LEN);
            if round > 0 {
                samples[i].push(Download { wall, cpu });
            }
        }
    }
    samples
}

/// Small GETs on fresh connections, alternating between the targets, `n` each (after a
/// warm-up); each target's latencies.
async fn small_requests(targets: Vec<Target>, n: usize) -> Vec<Vec<Duration>> {
    let warm_up = (n / 10).max(10);
    let mut times = vec![Vec::with_capacity(n); targets.len()];
    for round in 0..warm_up + n {
        for (i, target) in targets.iter().enumerate() {
            let (t, len) = timed(get(target, SMALL_PATH)).await;
            assert_eq!(len, SMALL_BODY.len() as u64);
            if round >= warm_up {
                times[i].push(t);
            }
        }
    }
    times
}

/// Completed TLS handshakes per second over fresh connections to `target`, `concurrency`
/// at once, for `trial`.
async fn handshake_trial(target: Target, concurrency: usize, trial: Duration) -> f64 {
    let config = target.tls.clone().expect("a TLS target");
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + trial;
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (done, config) = (Arc::clone(&done), Arc::clone(&config));
        let (addr, host) = (target.addr, target.host);
        tasks.push(tokio::spawn(async move {
            let name = ServerName::try_from(host).expect("server name");
            while Instant::now() < end {
                let handshake = async {
                    let tcp = TcpStream::connect(addr).await?;
                    let _ = tcp.set_nodelay(true);
                    let mut tls = TlsConnector::from(Arc::clone(&config))
                        .connect(name.clone(), tcp)
                        .await?;
                    let _ = tls.shutdown().await;
                    Ok::<_, std::io::Error>(())
                };
                timed(handshake).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("handshake task");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// Which names a DNS trial asks for.
#[derive(Clone, Copy)]
enum Names {
    /// [`DNS_HOST`], over and over.
    Same,
    /// A new name under [`COLD_SUFFIX`] each time.
    Fresh,
}

/// DNS answers (with an A record) per second from `server`, `concurrency` queries in
/// flight, for `trial`; and the queries lost (unanswered within [`DNS_TIMEOUT`]).
async fn dns_trial(
    server: SocketAddr,
    names: Names,
    concurrency: usize,
    trial: Duration,
) -> (f64, u64) {
    static FRESH: AtomicU64 = AtomicU64::new(0);
    let answered = Arc::new(AtomicU64::new(0));
    let lost = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let end = start + trial;
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let (answered, lost) = (Arc::clone(&answered), Arc::clone(&lost));
        tasks.push(tokio::spawn(async move {
            let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
                .await
                .expect("bind");
            socket.connect(server).await.expect("connect");
            let mut id = (worker as u16).wrapping_mul(10_000);
            while Instant::now() < end {
                id = id.wrapping_add(1);
                let name = match names {
                    Names::Same => DNS_HOST.to_owned(),
                    Names::Fresh => {
                        format!("n{}.{COLD_SUFFIX}", FRESH.fetch_add(1, Ordering::Relaxed))
                    }
                };
                match ask(&socket, &name, id).await {
                    Some(addr) => {
                        assert_eq!(addr, WEB, "wrong answer for {name}");
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        lost.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("DNS task");
    }
    let rate = answered.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    (rate, lost.load(Ordering::Relaxed))
}

/// Rates of several variants of a trial, alternating: one warm-up round, then `trials`
/// rounds of one trial of each variant (so that a change in the machine's load hits them
/// alike); each variant's rates and lost operations.
fn alternate<V, F, Fut>(
    rt: &Runtime,
    variants: &[V],
    trials: usize,
    trial: F,
) -> Vec<(Vec<f64>, u64)>
where
    V: Clone + Send + 'static,
    F: Fn(V) -> Fut,
    Fut: std::future::Future<Output = (f64, u64)> + Send + 'static,
{
    let mut out = vec![(Vec::with_capacity(trials), 0); variants.len()];
    for round in 0..=trials {
        for (i, variant) in variants.iter().enumerate() {
            let (rate, lost) = on(rt, trial(variant.clone()));
            if round > 0 {
                out[i].0.push(rate);
                out[i].1 += lost;
            }
        }
    }
    out
}

// ---- the run ----

fn run(topology: &Topology, o: &Options) -> Report {
    eprintln!("gateway benchmark: starting the internet, the gateway and the guest");
    let inet_rt = runtime_in(Some(&topology.inet), 2, "bench-internet");
    let gateway_rt = runtime_in(None, 2, "bench-gateway");
    let guest_rt = runtime_in(Some(&topology.guest), 2, "bench-guest");
    let upstream_ca = TestCa::new();
    start_internet(&inet_rt, &upstream_ca);
    let gateway = start_gateway(&gateway_rt, topology, upstream_ca.cert.der().clone());
    let gw_addr = topology.sandbox.link.gateway;

    // Before measuring: the guest's traffic really meets the firewall. DNS to anyone but the
    // gateway dies there (the authority answers the direct path, so it is up), and so does
    // a frame from another MAC than the guest's (the anti-spoofing chain on the veth end).
    let try_ask = |server: SocketAddr| async move {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
            .await
            .expect("bind");
        socket.connect(server).await.expect("connect");
        ask(&socket, DNS_HOST, 7).await
    };
    let gw_dns = SocketAddr::from((gw_addr, 53));
    let elsewhere = on(&guest_rt, try_ask(SocketAddr::from((AUTHORITY, 53))));
    assert_eq!(
        elsewhere, None,
        "DNS to the authority got past the firewall"
    );
    let direct = on(&guest_rt, try_ask(SocketAddr::from((DIRECT_INET, 53))));
    assert_eq!(direct, Some(WEB), "the authority does not answer directly");
    let guest_mac = topology.sandbox.link.guest_mac_text();
    ip(&format!(
        "-n {} link set eth0 address 02:00:00:00:00:01",
        topology.guest
    ));
    let spoofed = on(&guest_rt, try_ask(gw_dns));
    ip(&format!(
        "-n {} link set eth0 address {guest_mac}",
        topology.guest
    ));
    assert_eq!(
        spoofed, None,
        "a frame from another MAC got past the firewall"
    );
    let gateway_ok = on(&guest_rt, try_ask(gw_dns));
    assert_eq!(
        gateway_ok,
        Some(WEB),
        "the gateway resolver does not answer"
    );

    let pass_tls = client_tls(upstream_ca.cert.der());
    let sandbox_tls = client_tls(gateway.ca.cert_der());
    let (dl_addr, terminated_addr) = on(&guest_rt, async move {
        (
            resolve(gw_addr, DOWNLOAD_HOST).await,
            resolve(gw_addr, TERMINATED_HOST).await,
        )
    });
    assert_eq!((dl_addr, terminated_addr), (WEB, WEB));
    let target = |ip: Ipv4Addr, port: u16, host, tls: Option<&Arc<ClientConfig>>| Target {
        addr: SocketAddr::from((ip, port)),
        host,
        tls: tls.cloned(),
    };
    let http_direct = target(DIRECT_INET, 80, DOWNLOAD_HOST, None);
    let http_gateway = target(dl_addr, 80, DOWNLOAD_HOST, None);
    let https_direct = target(DIRECT_INET, 443, DOWNLOAD_HOST, Some(&pass_tls));
    let https_gateway = target(dl_addr, 443, DOWNLOAD_HOST, Some(&pass_tls));
    let https_terminated = target(terminated_addr, 443, TERMINATED_HOST, Some(&sandbox_tls));
    let handshake_direct = target(DIRECT_INET, 443, TERMINATED_HOST, Some(&pass_tls));
    let handshake_pass_through = https_gateway.clone();
    let handshake_terminated = https_terminated.clone();

    let mut report = Report {
        load_before: load_average(),
        ..Report::default()
    };

    eprintln!(
        "gateway benchmark: 100 MiB downloads ({} per path and protocol)",
        o.downloads
    );
    let targets = vec![
        http_direct.clone(),
        http_gateway.clone(),
        https_direct.clone(),
        https_gateway.clone(),
        https_terminated.clone(),
    ];
    let n = o.downloads;
    let times = on(&guest_rt, downloads(targets, n));
    let before = gateway.proxy.stats();
    assert!(
        before.bytes_down >= 3 * n as u64 * BIG_LEN,
        "the gateway downloads did not go through the proxy: {before:?}"
    );
    report.downloads = times;

    eprintln!(
        "gateway benchmark: small GETs on fresh connections ({} per path)",
        o.requests
    );
    let times = on(
        &guest_rt,
        small_requests(
            vec![
                http_direct,
                http_gateway,
                https_direct,
                https_gateway,
                handshake_terminated.clone(),
            ],
            o.requests,
        ),
    );
    report.requests = times;

    let (c, t, d) = (o.concurrency, o.trials, o.trial);
    eprintln!("gateway benchmark: TLS handshakes ({t} trials of {d:?}, {c} at once)");
    let accepted = gateway.proxy.stats().connections_accepted;
    let handshakes = alternate(
        &guest_rt,
        &[
            handshake_direct,
            handshake_pass_through,
            handshake_terminated,
        ],
        t,
        move |target| async move { (handshake_trial(target, c, d).await, 0) },
    );
    // The gateway's handshakes were the proxy's (a direct one never reaches it).
    assert!(gateway.proxy.stats().connections_accepted > accepted);
    report.handshakes_direct = handshakes[0].0.clone();
    report.handshakes_pass_through = handshakes[1].0.clone();
    report.handshakes_terminated = handshakes[2].0.clone();

    eprintln!("gateway benchmark: DNS answers ({t} trials of {d:?}, {c} in flight)");
    let direct_dns = SocketAddr::from((DIRECT_INET, 53));
    let dns = alternate(
        &guest_rt,
        &[
            (direct_dns, Names::Same),
            (gw_dns, Names::Same),
            (gw_dns, Names::Fresh),
        ],
        t,
        move |(server, names)| dns_trial(server, names, c, d),
    );
    report.dns_direct = dns[0].clone();
    report.dns_cached = dns[1].clone();
    report.dns_fresh = dns[2].clone();
    report.load_after = load_average();
    report.proxy = gateway.proxy.stats();

    guest_rt.shutdown_background();
    gateway_rt.shutdown_background();
    inet_rt.shutdown_background();
    report
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---- the report ----

#[derive(Default)]
struct Report {
    /// HTTP direct, HTTP gateway, HTTPS direct, HTTPS gateway.
    downloads: Vec<Vec<Download>>,
    /// HTTP direct, HTTP gateway, HTTPS direct, HTTPS gateway pass-through, HTTPS gateway
    /// terminated.
    requests: Vec<Vec<Duration>>,
    handshakes_direct: Vec<f64>,
    handshakes_pass_through: Vec<f64>,
    handshakes_terminated: Vec<f64>,
    dns_direct: (Vec<f64>, u64),
    dns_cached: (Vec<f64>, u64),
    dns_fresh: (Vec<f64>, u64),
    load_before: String,
    load_after: String,
    proxy: space_net::proxy::ProxyStats,
}

/// The nearest-rank `p`th percentile of `values` (sorted here).
fn percentile<T: PartialOrd + Copy>(values: &[T], p: f64) -> T {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).expect("comparable"));
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// Throughput in MiB/s of a [`BIG_LEN`] download that took `t`.
fn mib_per_s(t: Duration) -> f64 {
    BIG_LEN as f64 / (1024.0 * 1024.0) / t.as_secs_f64()
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1000.0
}

/// A row: figure, n, p50, p90, unit, target, verdict.
struct Row {
    figure: String,
    n: usize,
    p50: f64,
    p90: f64,
    decimals: usize,
    unit: &'static str,
    target: String,
    ok: Option<bool>,
}

impl Row {
    fn new(figure: impl Into<String>, n: usize, p50: f64, p90: f64, unit: &'static str) -> Row {
        Row {
            figure: figure.into(),
            n,
            p50,
            p90,
            decimals: 1,
            unit,
            target: String::new(),
            ok: None,
        }
    }

    /// Two decimals instead of one (sub-millisecond figures).
    fn precise(mut self) -> Row {
        self.decimals = 2;
        self
    }

    fn target(mut self, target: impl Into<String>, ok: bool) -> Row {
        self.target = target.into();
        self.ok = Some(ok);
        self
    }

    /// A headline figure the issue names without a target.
    fn no_target(mut self) -> Row {
        self.target = "none set".into();
        self
    }
}

impl Report {
    fn print(&self, o: &Options) {
        let mut rows = Vec::new();
        // Downloads: throughput at the median and at the p90 (slow tail) download time; the
        // ratio per round (direct and gateway downloads alternate, so a round's pair met the
        // same load), its median and slow tail.
        let rate = |d: &[Download]| {
            let wall: Vec<Duration> = d.iter().map(|d| d.wall).collect();
            (
                mib_per_s(percentile(&wall, 50.0)),
                mib_per_s(percentile(&wall, 90.0)),
            )
        };
        let cpu = |d: &[Download]| {
            let cpu: Vec<Duration> = d.iter().map(|d| d.cpu).collect();
            (ms(percentile(&cpu, 50.0)), ms(percentile(&cpu, 90.0)))
        };
        let n = o.downloads;
        for (proto, direct, gateway) in [
            ("HTTP", 0, 1),
            ("HTTPS pass-through", 2, 3),
            ("HTTPS terminated", 2, 4),
        ] {
            let gateway_index = gateway;
            let (direct, gateway) = (&self.downloads[direct], &self.downloads[gateway]);
            let (d50, d90) = rate(direct);
            let (g50, g90) = rate(gateway);
            rows.push(Row::new(
                format!("100 MiB download, {proto}, direct"),
                n,
                d50,
                d90,
                "MiB/s",
            ));
            rows.push(Row::new(
                format!("100 MiB download, {proto}, via gateway"),
                n,
                g50,
                g90,
                "MiB/s",
            ));
            let ratios: Vec<f64> = direct
                .iter()
                .zip(gateway)
                .map(|(d, g)| d.wall.as_secs_f64() / g.wall.as_secs_f64() * 100.0)
                .collect();
            let (r50, r90) = (percentile(&ratios, 50.0), percentile(&ratios, 10.0));
            let ratio = Row::new(
                format!("  gateway / direct, {proto}, per round"),
                n,
                r50,
                r90,
                "%",
            );
            rows.push(if gateway_index == 4 {
                ratio.no_target()
            } else {
                ratio.target("p50 ≥ 80 %", r50 >= 80.0)
            });
            let (c50, c90) = cpu(direct);
            rows.push(Row::new(
                format!("  CPU per download, {proto}, direct"),
                n,
                c50,
                c90,
                "ms",
            ));
            let (c50, c90) = cpu(gateway);
            rows.push(Row::new(
                format!("  CPU per download, {proto}, via gateway"),
                n,
                c50,
                c90,
                "ms",
            ));
        }
        let latency = |t: &[Duration]| (ms(percentile(t, 50.0)), ms(percentile(t, 90.0)));
        let n = self.requests[0].len();
        for (proto, direct, gateway) in [("HTTP", 0, 1), ("HTTPS pass-through", 2, 3)] {
            let (d50, d90) = latency(&self.requests[direct]);
            let (g50, g90) = latency(&self.requests[gateway]);
            rows.push(Row::new(format!("small GET, {proto}, direct"), n, d50, d90, "ms").precise());
            rows.push(
                Row::new(
                    format!("small GET, {proto}, via gateway"),
                    n,
                    g50,
                    g90,
                    "ms",
                )
                .precise(),
            );
            rows.push(
                Row::new(
                    format!("  added latency, {proto}"),
                    n,
                    g50 - d50,
                    g90 - d90,
                    "ms",
                )
                .precise()
                .target("p50 ≤ 1 ms", g50 - d50 <= 1.0),
            );
        }
        let (t50, t90) = latency(&self.requests[4]);
        rows.push(
            Row::new(
                "small GET, HTTPS terminated by the gateway",
                n,
                t50,
                t90,
                "ms",
            )
            .precise(),
        );
        // Rates: the median trial and the slow tail (the rate 90 % of trials reached).
        let rates = |r: &[f64]| (percentile(r, 50.0), percentile(r, 10.0));
        let (h50, h90) = rates(&self.handshakes_direct);
        rows.push(Row::new(
            "TLS handshakes, upstream server directly",
            o.trials,
            h50,
            h90,
            "/s",
        ));
        let (h50, h90) = rates(&self.handshakes_pass_through);
        rows.push(
            Row::new(
                "TLS handshakes through the gateway, pass-through",
                o.trials,
                h50,
                h90,
                "/s",
            )
            .no_target(),
        );
        let (h50, h90) = rates(&self.handshakes_terminated);
        rows.push(
            Row::new(
                "TLS handshakes terminated by the gateway",
                o.trials,
                h50,
                h90,
                "/s",
            )
            .no_target(),
        );
        for (figure, (r, lost), gateway) in [
            ("DNS answers, authority directly", &self.dns_direct, false),
            ("DNS answers, gateway, cached name", &self.dns_cached, true),
            ("DNS answers, gateway, fresh names", &self.dns_fresh, true),
        ] {
            let (r50, r90) = rates(r);
            let row = Row::new(format!("{figure} ({lost} lost)"), o.trials, r50, r90, "/s");
            rows.push(if gateway { row.no_target() } else { row });
        }

        println!();
        println!(
            "Gateway benchmark (issue 4): {} cores, load {} before, {} after; concurrency {} for rates, trials of {:?}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            self.load_before,
            self.load_after,
            o.concurrency,
            o.trial,
        );
        println!("p90 of a rate is its slow tail (the value 90 % of the samples reach). CPU: user + system");
        println!("time of the whole process (client, gateway, origin) during one download.");
        println!(
            "The resolver's rate limit (200 queries/s per sandbox by default) is lifted here."
        );
        println!();
        let w = rows
            .iter()
            .map(|r| r.figure.chars().count())
            .max()
            .unwrap_or(0);
        println!(
            "| {:w$} | {:>4} | {:>9} | {:>9} | {:5} | {:12} |   |",
            "figure", "n", "p50", "p90", "unit", "target"
        );
        println!(
            "|{}|------|-----------|-----------|-------|--------------|---|",
            "-".repeat(w + 2)
        );
        for r in &rows {
            let verdict = match r.ok {
                Some(true) => "✓",
                Some(false) => "✗",
                None if r.target.is_empty() => "",
                None => "—",
            };
            println!(
                "| {:w$} | {:>4} | {:>9} | {:>9} | {:5} | {:12} | {:1} |",
                r.figure,
                r.n,
                format!("{:.*}", r.decimals, r.p50),
                format!("{:.*}", r.decimals, r.p90),
                r.unit,
                r.target,
                verdict
            );
        }
        println!();
        println!(
            "proxy: {} connections accepted, {} refused, {} requests ({} refused), {:.1} GiB down",
            self.proxy.connections_accepted,
            self.proxy.connections_refused,
            self.proxy.requests,
            self.proxy.requests_refused,
            self.proxy.bytes_down as f64 / (1u64 << 30) as f64,
        );
    }
}
