//! The DNS resolver a sandbox talks to.
//!
//! The node binds a UDP and a TCP socket on port 53 inside each sandbox's network namespace
//! (nftables drops the guest's DNS to anywhere else) and hands them to
//! [`SandboxResolver::serve`]. The resolver:
//!
//! - answers only names the sandbox's [`EgressPolicy`] could allow (`allows_name`); any
//!   other name, and any query name that is not a valid hostname, gets **NXDOMAIN**, so
//!   clients fail fast instead of retrying another server;
//! - looks allowed names up itself ([`Upstream`]; [`HickoryUpstream`] in production) and
//!   answers only `A`/`AAAA`. A CNAME chain is **flattened**: the answer holds the final
//!   addresses, owned by the name asked. The guest never learns the chain's targets, which
//!   its policy may not allow, and the name it will connect to is the one pinned;
//! - removes every address that is not public (private, loopback, link-local, metadata,
//!   CGNAT, IPv4-mapped forms of those, …) unless the policy explicitly allows it
//!   ([`answer_address_permitted`]); when addresses were removed and none remain the answer
//!   is NXDOMAIN (DNS rebinding defence). A name with no record of the type gets NOERROR
//!   with no answer, as upstream said;
//! - answers `HTTPS`/`SVCB` (and every other type of an allowed name: TXT, MX, PTR, …)
//!   with NOERROR and no answer: no ECH config or alternative endpoint reaches the guest,
//!   and browsers fall back to A/AAAA as they do for a name without such records (an
//!   NXDOMAIN there could make them give up on the name). `ANY`, `AXFR`, `IXFR` and
//!   classes other than IN get REFUSED; opcodes other than QUERY get NOTIMP;
//! - **pins** every address it answered with, for the name asked, in the sandbox's
//!   [`PinTable`], before the answer leaves: the transparent proxy connects only to pinned
//!   addresses.
//!
//! Hostile-input bounds (see [`DnsLimits`]): a query is at most [`MAX_UDP_QUERY`] bytes on
//! UDP and [`MAX_TCP_QUERY`] on TCP; it must hold exactly one question and at most one
//! additional record (the OPT), or it gets FORMERR (checked on the raw header before any
//! parsing, so hostile counts allocate nothing); unparsable queries get FORMERR, and
//! anything shorter than a header, or a response, is ignored. Answers over UDP fit 512
//! bytes, or the client's EDNS size capped at 1232; larger ones are sent empty with TC set
//! (the client retries over TCP). Queries past a per-sandbox token bucket are dropped
//! (a TCP connection whose query is dropped is closed); upstream lookups are bounded in
//! number and time (timeout → SERVFAIL); TCP connections are bounded in number and idle
//! time.
//!
//! The policy can change while the sandbox runs: the resolver reads it through a
//! [`PolicyHandle`] (`Arc<ArcSwap<EgressPolicy>>`), a lock-free load per query that any
//! task, sync or async, can `store` into. (A `watch::Receiver` would need `&mut` or a
//! clone per reader and adds nothing here: the resolver needs the current policy, not
//! change notifications.) A query uses the policy it loaded when it arrived.
//!
//! Why not hickory-server: its `ServerFuture`/`RequestHandler` would take the pre-bound
//! sockets, but a handler is shared state behind its own per-request API, its own TCP
//! handling (connection counts, timeouts) is not ours to bound per sandbox, and it answers
//! malformed and truncated cases its own way. The loop here is small, and the logic lives
//! in [`SandboxResolver::answer`], bytes in and bytes out, tested without sockets.
//! hickory-proto parses and writes the messages.

mod pins;
mod upstream;

#[cfg(test)]
mod tests;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use space_core::egress::{
    address_class, ConnectionFacts, Destination, EgressPolicy, Hostname, Protocol, RuleAction,
};
use space_core::SandboxId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, info};

pub use pins::{PinLimits, PinTable};
pub use upstream::{HickoryUpstream, Upstream, UpstreamAddr, UpstreamConfigError, UpstreamError};

/// The largest query accepted in a UDP datagram (bytes); longer ones are not read whole
/// and are ignored.
pub const MAX_UDP_QUERY: usize = 1232;
/// The largest query accepted over TCP (bytes); a longer length prefix closes the
/// connection. Real queries are a few hundred bytes.
pub const MAX_TCP_QUERY: usize = 4096;
/// The UDP payload size the resolver advertises and the most it sends over UDP (the DNS
/// flag day 2020 value: no IP fragmentation).
pub const EDNS_PAYLOAD: u16 = 1232;
/// The UDP answer size for a client without EDNS.
const PLAIN_UDP_PAYLOAD: u16 = 512;
const HEADER_LEN: usize = 12;

/// How the resolver reads a sandbox's egress policy: swapped whole when it changes.
pub type PolicyHandle = Arc<ArcSwap<EgressPolicy>>;

/// What a query arrived over (it sets the size bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A UDP datagram.
    Udp,
    /// A length-prefixed message on a TCP connection.
    Tcp,
}

/// The per-sandbox bounds of the resolver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsLimits {
    /// Sustained queries per second (token bucket refill); excess queries are dropped.
    pub queries_per_second: u32,
    /// Token bucket size: queries accepted in a burst.
    pub query_burst: u32,
    /// Upstream lookups in flight at once.
    pub max_concurrent_lookups: usize,
    /// The deadline of one upstream lookup, waiting for a lookup slot included; past it
    /// the answer is SERVFAIL.
    pub lookup_timeout: Duration,
    /// UDP queries being answered at once; more are dropped.
    pub max_udp_in_flight: usize,
    /// Open TCP connections; more are closed on accept.
    pub max_tcp_connections: usize,
    /// A TCP connection is closed when a query (or the write of its answer) takes longer.
    pub tcp_idle_timeout: Duration,
    /// The largest TTL (seconds) handed to the guest (upstream TTLs are capped to it).
    pub max_ttl: u32,
}

impl Default for DnsLimits {
    fn default() -> Self {
        Self {
            queries_per_second: 200,
            query_burst: 400,
            max_concurrent_lookups: 32,
            lookup_timeout: Duration::from_secs(3),
            max_udp_in_flight: 64,
            max_tcp_connections: 16,
            tcp_idle_timeout: Duration::from_secs(10),
            max_ttl: 300,
        }
    }
}

/// How many `decide` calls [`answer_address_permitted`] makes at most for one address.
const MAX_UNLOCK_PROBES: usize = 16;

/// Whether the resolver may give the guest `addr` as an address of `host` (a name the
/// policy allows by name).
///
/// A public address: yes (the proxy still judges each connection with `decide`). Any other
/// (private, loopback, link-local, metadata, IPv6 forms of those, …): only when the policy
/// explicitly unlocks it, i.e. `decide` allows a connection to (`host`, `addr`) on a port
/// and protocol of an allow CIDR rule that contains it. At DNS time the port is unknown,
/// so each such rule is probed with its first port (443 when it names none) and each of its
/// protocols, at most 16 probes in all: a policy that unlocks an address
/// only on some other port than the probed ones gets it removed (conservative), never the
/// reverse.
pub fn answer_address_permitted(policy: &EgressPolicy, host: &Hostname, addr: IpAddr) -> bool {
    if address_class(addr).is_public() {
        return true;
    }
    let probes = policy
        .rules
        .iter()
        .filter(|rule| {
            rule.action == RuleAction::Allow && matches!(rule.destination, Destination::Cidr(_))
        })
        .flat_map(|rule| {
            let port = rule
                .ports
                .as_ref()
                .and_then(|ranges| ranges.first())
                .map_or(443, |range| range.start);
            let protocols = match &rule.protocols {
                Some(protocols) => protocols.clone(),
                None => vec![Protocol::Tcp, Protocol::Udp],
            };
            protocols.into_iter().map(move |protocol| {
                let facts = ConnectionFacts {
                    host: Some(host),
                    addr: Some(addr),
                    port,
                    protocol,
                };
                (rule, facts)
            })
        })
        // Only probes whose rule contains the address reach `decide`.
        .filter(|(rule, facts)| rule.matches(facts))
        .map(|(_, facts)| facts)
        .take(MAX_UNLOCK_PROBES);
    for facts in probes {
        if policy.decide(&facts).allowed {
            return true;
        }
    }
    false
}

/// The resolver of one sandbox: its policy, its pins, the node's upstream.
pub struct SandboxResolver<U: Upstream = HickoryUpstream> {
    sandbox: SandboxId,
    policy: PolicyHandle,
    pins: Arc<PinTable>,
    upstream: Arc<U>,
    limits: DnsLimits,
    bucket: Mutex<TokenBucket>,
    lookups: Semaphore,
}

impl<U: Upstream> std::fmt::Debug for SandboxResolver<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxResolver")
            .field("sandbox", &self.sandbox)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<U: Upstream> SandboxResolver<U> {
    /// The resolver of `sandbox`, with the default [`DnsLimits`].
    pub fn new(
        sandbox: SandboxId,
        policy: PolicyHandle,
        pins: Arc<PinTable>,
        upstream: Arc<U>,
    ) -> Self {
        Self::with_limits(sandbox, policy, pins, upstream, DnsLimits::default())
    }

    /// The resolver of `sandbox`, with these bounds.
    pub fn with_limits(
        sandbox: SandboxId,
        policy: PolicyHandle,
        pins: Arc<PinTable>,
        upstream: Arc<U>,
        limits: DnsLimits,
    ) -> Self {
        Self {
            sandbox,
            policy,
            pins,
            upstream,
            bucket: Mutex::new(TokenBucket::new(
                limits.queries_per_second,
                limits.query_burst,
                Instant::now(),
            )),
            lookups: Semaphore::new(limits.max_concurrent_lookups.max(1)),
            limits,
        }
    }

    /// The sandbox's pin table (the proxy holds the same `Arc`).
    pub fn pins(&self) -> &Arc<PinTable> {
        &self.pins
    }

    /// Serves the sandbox's DNS on these already bound sockets (created by the node inside
    /// the sandbox's namespace) until the future is dropped or its task aborted; the
    /// per-query and per-connection tasks it spawned end with it.
    pub async fn serve(self: Arc<Self>, udp: UdpSocket, tcp: TcpListener) {
        let udp = Arc::new(udp);
        let mut udp_tasks = JoinSet::new();
        let mut tcp_tasks = JoinSet::new();
        // One byte more than accepted, to tell an oversized datagram from a full one.
        let mut buf = vec![0u8; MAX_UDP_QUERY + 1];
        loop {
            tokio::select! {
                Some(_) = udp_tasks.join_next(), if !udp_tasks.is_empty() => {}
                Some(_) = tcp_tasks.join_next(), if !tcp_tasks.is_empty() => {}
                received = udp.recv_from(&mut buf) => match received {
                    Ok((len, peer)) => {
                        if len > MAX_UDP_QUERY {
                            debug!(sandbox = %self.sandbox, %peer, "dns: oversized UDP query dropped");
                            continue;
                        }
                        if udp_tasks.len() >= self.limits.max_udp_in_flight {
                            debug!(sandbox = %self.sandbox, %peer, "dns: too many UDP queries in flight, dropped");
                            continue;
                        }
                        let query = buf[..len].to_vec();
                        let this = Arc::clone(&self);
                        let socket = Arc::clone(&udp);
                        udp_tasks.spawn(async move { this.answer_udp(&socket, &query, peer).await });
                    }
                    Err(e) => {
                        // ICMP errors for earlier answers surface here (ECONNREFUSED): harmless.
                        debug!(sandbox = %self.sandbox, error = %e, "dns: UDP receive failed");
                        if e.kind() != std::io::ErrorKind::ConnectionRefused {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                },
                accepted = tcp.accept() => match accepted {
                    Ok((stream, peer)) => {
                        if tcp_tasks.len() >= self.limits.max_tcp_connections {
                            debug!(sandbox = %self.sandbox, %peer, "dns: too many TCP connections, closed");
                            continue;
                        }
                        let this = Arc::clone(&self);
                        tcp_tasks.spawn(async move { this.serve_tcp(stream, peer).await });
                    }
                    Err(e) => {
                        // Out of descriptors, usually: back off rather than spin.
                        debug!(sandbox = %self.sandbox, error = %e, "dns: TCP accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    }

    async fn answer_udp(&self, socket: &UdpSocket, query: &[u8], peer: SocketAddr) {
        if let Some(response) = self.answer(query, Transport::Udp).await {
            if let Err(e) = socket.send_to(&response, peer).await {
                debug!(sandbox = %self.sandbox, %peer, error = %e, "dns: UDP send failed");
            }
        }
    }

    async fn serve_tcp(&self, mut stream: TcpStream, peer: SocketAddr) {
        let idle = self.limits.tcp_idle_timeout;
        loop {
            let mut len = [0u8; 2];
            match tokio::time::timeout(idle, stream.read_exact(&mut len)).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => return, // closed, reset or idle
            }
            let len = usize::from(u16::from_be_bytes(len));
            if len == 0 || len > MAX_TCP_QUERY {
                debug!(sandbox = %self.sandbox, %peer, len, "dns: bad TCP query length, closing");
                return;
            }
            let mut query = vec![0u8; len];
            match tokio::time::timeout(idle, stream.read_exact(&mut query)).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) | Err(_) => return,
            }
            let Some(response) = self.answer(&query, Transport::Tcp).await else {
                debug!(sandbox = %self.sandbox, %peer, "dns: TCP query dropped, closing");
                return;
            };
            let Ok(response_len) = u16::try_from(response.len()) else {
                return; // cannot happen: answers are a few KiB at most
            };
            let mut framed = Vec::with_capacity(2 + response.len());
            framed.extend_from_slice(&response_len.to_be_bytes());
            framed.extend_from_slice(&response);
            match tokio::time::timeout(idle, stream.write_all(&framed)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }

    /// Answers one DNS query (wire format, without TCP's length prefix): the response's
    /// wire format, or `None` when the query is to be dropped unanswered (past the rate
    /// limit, shorter than a header, or not a query at all).
    pub async fn answer(&self, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
        if !self.take_token() {
            debug!(sandbox = %self.sandbox, "dns: rate limited, query dropped");
            return None;
        }
        let header = RawHeader::parse(query)?;
        if header.is_response() {
            debug!(sandbox = %self.sandbox, "dns: a response sent to the resolver, dropped");
            return None;
        }
        let max_len = match transport {
            Transport::Udp => MAX_UDP_QUERY,
            Transport::Tcp => MAX_TCP_QUERY,
        };
        if query.len() > max_len {
            debug!(sandbox = %self.sandbox, len = query.len(), "dns: oversized query, FORMERR");
            return Some(header.error(ResponseCode::FormErr));
        }
        if header.opcode() != 0 {
            debug!(sandbox = %self.sandbox, opcode = header.opcode(), "dns: not a QUERY, NOTIMP");
            return Some(header.error(ResponseCode::NotImp));
        }
        if !header.counts_are_a_plain_query() {
            debug!(sandbox = %self.sandbox, "dns: query section counts, FORMERR");
            return Some(header.error(ResponseCode::FormErr));
        }
        let request = match Message::from_vec(query) {
            Ok(request) => request,
            Err(e) => {
                debug!(sandbox = %self.sandbox, error = %e, "dns: malformed query, FORMERR");
                return Some(header.error(ResponseCode::FormErr));
            }
        };
        let Some(question) = request.queries().first() else {
            return Some(header.error(ResponseCode::FormErr));
        };
        let reply = Reply {
            request: &request,
            header: &header,
            limit: response_limit(&request, transport),
        };
        let qname = question.name();
        let qtype = question.query_type();

        if question.query_class() != DNSClass::IN {
            debug!(sandbox = %self.sandbox, name = %qname, class = %question.query_class(), "dns: class not IN, REFUSED");
            return Some(reply.empty(ResponseCode::Refused));
        }
        match qtype {
            RecordType::ANY | RecordType::AXFR | RecordType::IXFR => {
                debug!(sandbox = %self.sandbox, name = %qname, %qtype, "dns: refused type, REFUSED");
                return Some(reply.empty(ResponseCode::Refused));
            }
            RecordType::OPT => {
                debug!(sandbox = %self.sandbox, name = %qname, "dns: OPT as a question, FORMERR");
                return Some(reply.empty(ResponseCode::FormErr));
            }
            _ => {}
        }
        let Some(host) = canonical_name(qname) else {
            info!(sandbox = %self.sandbox, name = %qname, %qtype, "dns: denied: not a valid hostname, NXDOMAIN");
            return Some(reply.empty(ResponseCode::NXDomain));
        };
        let policy = self.policy.load_full();
        if !policy.allows_name(&host) {
            info!(sandbox = %self.sandbox, name = %host, %qtype, "dns: denied by egress policy, NXDOMAIN");
            return Some(reply.empty(ResponseCode::NXDomain));
        }
        if !matches!(qtype, RecordType::A | RecordType::AAAA) {
            debug!(sandbox = %self.sandbox, name = %host, %qtype, "dns: type not served, empty NOERROR");
            return Some(reply.empty(ResponseCode::NoError));
        }

        let found = match self.lookup(&host, qtype).await {
            Ok(found) => found,
            Err(UpstreamError::NxDomain) => {
                debug!(sandbox = %self.sandbox, name = %host, %qtype, "dns: upstream NXDOMAIN");
                return Some(reply.empty(ResponseCode::NXDomain));
            }
            Err(UpstreamError::Failed(e)) => {
                debug!(sandbox = %self.sandbox, name = %host, %qtype, error = %e, "dns: upstream failed, SERVFAIL");
                return Some(reply.empty(ResponseCode::ServFail));
            }
        };

        let max_answers = self.pins.limits().max_per_name;
        let mut kept: Vec<IpAddr> = Vec::new();
        let mut removed = 0usize;
        let mut ttl = self.limits.max_ttl;
        for UpstreamAddr {
            addr,
            ttl: record_ttl,
        } in found
        {
            let right_family = match qtype {
                RecordType::A => addr.is_ipv4(),
                _ => addr.is_ipv6(),
            };
            if !right_family || kept.contains(&addr) {
                continue;
            }
            if !answer_address_permitted(&policy, &host, addr) {
                debug!(sandbox = %self.sandbox, name = %host, %addr, "dns: non-public address removed");
                removed += 1;
                continue;
            }
            if kept.len() < max_answers {
                kept.push(addr);
                ttl = ttl.min(record_ttl);
            }
        }
        if kept.is_empty() {
            if removed > 0 {
                info!(sandbox = %self.sandbox, name = %host, %qtype, removed, "dns: denied: only non-public addresses, NXDOMAIN");
                return Some(reply.empty(ResponseCode::NXDomain));
            }
            debug!(sandbox = %self.sandbox, name = %host, %qtype, "dns: no records, empty NOERROR");
            return Some(reply.empty(ResponseCode::NoError));
        }

        // RFC 2181: one TTL for the RRset, the smallest.
        let answers: Vec<Record> = kept
            .iter()
            .map(|addr| {
                let rdata = match addr {
                    IpAddr::V4(v4) => RData::A(A(*v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                };
                Record::from_rdata(qname.clone(), ttl, rdata)
            })
            .collect();
        let (response, truncated) = reply.build(ResponseCode::NoError, answers);
        if truncated {
            debug!(sandbox = %self.sandbox, name = %host, %qtype, "dns: answer too large for UDP, truncated");
        } else {
            // Pinned before the answer leaves: the guest cannot connect before the pin exists.
            self.pins
                .pin(&host, &kept, Duration::from_secs(u64::from(ttl)));
            debug!(sandbox = %self.sandbox, name = %host, %qtype, addrs = ?kept, ttl, "dns: answered and pinned");
        }
        Some(response)
    }

    async fn lookup(
        &self,
        host: &Hostname,
        qtype: RecordType,
    ) -> Result<Vec<UpstreamAddr>, UpstreamError> {
        let bounded = async {
            let _slot = self
                .lookups
                .acquire()
                .await
                .map_err(|_| UpstreamError::Failed("lookup slots closed".into()))?;
            self.upstream.lookup(host, qtype).await
        };
        tokio::time::timeout(self.limits.lookup_timeout, bounded)
            .await
            .unwrap_or_else(|_| Err(UpstreamError::Failed("timed out".into())))
    }

    fn take_token(&self) -> bool {
        self.bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(Instant::now())
    }
}

/// The query name as a strict hostname, or `None` if it cannot be one (root, a label with a
/// dot or a byte outside printable ASCII, or whatever `Hostname::parse` rejects).
fn canonical_name(name: &Name) -> Option<Hostname> {
    let mut text = String::with_capacity(name.len());
    for label in name.iter() {
        if label.is_empty()
            || !label
                .iter()
                .all(|b| b.is_ascii_graphic() && *b != b'.' && *b != b'\\')
        {
            return None;
        }
        if !text.is_empty() {
            text.push('.');
        }
        text.extend(label.iter().map(|b| char::from(*b)));
    }
    if text.is_empty() {
        return None;
    }
    Hostname::parse(&text).ok()
}

/// The most bytes an answer to `request` may take.
fn response_limit(request: &Message, transport: Transport) -> usize {
    match transport {
        Transport::Tcp => usize::from(u16::MAX),
        Transport::Udp => usize::from(
            request
                .extensions()
                .as_ref()
                .map_or(PLAIN_UDP_PAYLOAD, |edns| {
                    edns.max_payload().clamp(PLAIN_UDP_PAYLOAD, EDNS_PAYLOAD)
                }),
        ),
    }
}

/// The fixed 12-byte header of a query, read before any parsing.
struct RawHeader([u8; HEADER_LEN]);

impl RawHeader {
    fn parse(query: &[u8]) -> Option<Self> {
        query.get(..HEADER_LEN)?.try_into().ok().map(Self)
    }

    fn is_response(&self) -> bool {
        self.0[2] & 0x80 != 0
    }

    fn opcode(&self) -> u8 {
        (self.0[2] >> 3) & 0x0f
    }

    fn count(&self, index: usize) -> u16 {
        u16::from_be_bytes([self.0[4 + 2 * index], self.0[5 + 2 * index]])
    }

    /// One question, no answer or authority, at most one additional record (the OPT).
    fn counts_are_a_plain_query(&self) -> bool {
        self.count(0) == 1 && self.count(1) == 0 && self.count(2) == 0 && self.count(3) <= 1
    }

    /// A header-only response: same id and opcode, RD echoed, RA set, this code.
    fn error(&self, code: ResponseCode) -> Vec<u8> {
        let mut out = vec![0u8; HEADER_LEN];
        out[..2].copy_from_slice(&self.0[..2]);
        out[2] = 0x80 | (self.0[2] & 0x78) | (self.0[2] & 0x01);
        out[3] = 0x80 | code.low();
        out
    }
}

/// The response to one parsed query.
struct Reply<'a> {
    request: &'a Message,
    header: &'a RawHeader,
    limit: usize,
}

impl Reply<'_> {
    fn empty(&self, code: ResponseCode) -> Vec<u8> {
        self.build(code, Vec::new()).0
    }

    /// The response with these answers; if it does not fit the limit, without them and with
    /// TC set (`true`).
    fn build(&self, code: ResponseCode, answers: Vec<Record>) -> (Vec<u8>, bool) {
        let mut response = Message::new();
        response
            .set_id(self.request.id())
            .set_message_type(MessageType::Response)
            .set_op_code(OpCode::Query)
            .set_recursion_desired(self.request.recursion_desired())
            .set_recursion_available(true)
            .set_response_code(code);
        response.add_queries(self.request.queries().iter().cloned());
        if self.request.extensions().is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(EDNS_PAYLOAD).set_version(0);
            response.set_edns(edns);
        }
        let had_answers = !answers.is_empty();
        response.add_answers(answers);
        match response.to_vec() {
            Ok(bytes) if bytes.len() <= self.limit => return (bytes, false),
            Ok(_) if had_answers => {}
            Ok(_) | Err(_) => return (self.header.error(ResponseCode::ServFail), false),
        }
        response.take_answers();
        response.set_truncated(true);
        match response.to_vec() {
            Ok(bytes) if bytes.len() <= self.limit => (bytes, true),
            _ => (self.header.error(ResponseCode::ServFail), false),
        }
    }
}

/// A token bucket: `rate` tokens a second, at most `burst` saved.
#[derive(Debug)]
struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(rate: u32, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate: f64::from(rate),
            burst,
            tokens: burst,
            last: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
