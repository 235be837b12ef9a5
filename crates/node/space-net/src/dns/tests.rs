//! Tests of the resolver: answer logic against a fake upstream, and the real upstream and
//! server over loopback sockets against a small authoritative server.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::xfer::Protocol as DnsProtocol;
use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::TokioResolver;
use ipnet::IpNet;
use space_core::egress::{
    DomainPattern, EgressMode, EgressPolicy, EgressRule, Hostname, PortRange, Protocol,
};
use space_core::SandboxId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use super::*;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

type Zone = HashMap<(String, RecordType), Result<Vec<UpstreamAddr>, UpstreamError>>;

/// An upstream answering from a map, counting calls and concurrency.
#[derive(Default)]
struct FakeUpstream {
    zone: Zone,
    delay: Option<Duration>,
    asked: Mutex<Vec<(String, RecordType)>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl FakeUpstream {
    fn with(mut self, name: &str, rtype: RecordType, addrs: &[&str], ttl: u32) -> Self {
        let addrs = addrs
            .iter()
            .map(|a| UpstreamAddr {
                addr: a.parse().unwrap(),
                ttl,
            })
            .collect();
        self.zone.insert((name.to_owned(), rtype), Ok(addrs));
        self
    }

    fn failing(mut self, name: &str, rtype: RecordType, error: UpstreamError) -> Self {
        self.zone.insert((name.to_owned(), rtype), Err(error));
        self
    }

    fn calls(&self) -> usize {
        self.asked.lock().unwrap().len()
    }
}

impl Upstream for FakeUpstream {
    async fn lookup(
        &self,
        name: &Hostname,
        record_type: RecordType,
    ) -> Result<Vec<UpstreamAddr>, UpstreamError> {
        self.asked
            .lock()
            .unwrap()
            .push((name.as_str().to_owned(), record_type));
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        if let Some(delay) = self.delay {
            tokio::time::sleep(delay).await;
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.zone
            .get(&(name.as_str().to_owned(), record_type))
            .cloned()
            .unwrap_or(Err(UpstreamError::NxDomain))
    }
}

fn domain(pattern: &str) -> EgressRule {
    EgressRule::allow(DomainPattern::parse(pattern).unwrap())
}

fn cidr(net: &str) -> EgressRule {
    EgressRule::allow(net.parse::<IpNet>().unwrap())
}

/// Allowlist: `example.com`, `*.example.com`, plus `extra` rules.
fn policy(extra: Vec<EgressRule>) -> EgressPolicy {
    let mut rules = vec![domain("example.com"), domain("*.example.com")];
    rules.extend(extra);
    let policy = EgressPolicy {
        mode: EgressMode::Allowlist,
        rules,
    };
    policy.validate().unwrap();
    policy
}

fn resolver_with(
    policy: EgressPolicy,
    upstream: FakeUpstream,
    limits: DnsLimits,
    pin_limits: PinLimits,
) -> SandboxResolver<FakeUpstream> {
    SandboxResolver::with_limits(
        SandboxId::generate(),
        Arc::new(ArcSwap::from_pointee(policy)),
        Arc::new(PinTable::new(pin_limits)),
        Arc::new(upstream),
        limits,
    )
}

fn resolver(upstream: FakeUpstream) -> SandboxResolver<FakeUpstream> {
    resolver_with(
        policy(vec![]),
        upstream,
        DnsLimits::default(),
        PinLimits::default(),
    )
}

fn host(name: &str) -> Hostname {
    Hostname::parse(name).unwrap()
}

fn query_message(name: &str, rtype: RecordType) -> Message {
    let mut m = Message::new();
    m.set_id(0x4242)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    m
}

fn query(name: &str, rtype: RecordType) -> Vec<u8> {
    query_message(name, rtype).to_vec().unwrap()
}

fn query_edns(name: &str, rtype: RecordType, payload: u16) -> Vec<u8> {
    let mut m = query_message(name, rtype);
    let mut edns = Edns::new();
    edns.set_max_payload(payload);
    m.set_edns(edns);
    m.to_vec().unwrap()
}

async fn ask(r: &SandboxResolver<FakeUpstream>, name: &str, rtype: RecordType) -> Message {
    let bytes = r.answer(&query(name, rtype), Transport::Udp).await.unwrap();
    Message::from_vec(&bytes).unwrap()
}

fn addrs_of(m: &Message) -> Vec<IpAddr> {
    m.answers()
        .iter()
        .map(|r| match r.data() {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            other => panic!("unexpected answer {other:?}"),
        })
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// ---------------------------------------------------------------------------------------
// Answer logic
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn allowed_name_is_answered_and_pinned() {
    let r = resolver(FakeUpstream::default().with(
        "api.example.com",
        RecordType::A,
        &["93.184.216.34", "93.184.216.35"],
        120,
    ));
    let m = ask(&r, "api.example.com.", RecordType::A).await;
    assert_eq!(m.id(), 0x4242);
    assert_eq!(m.message_type(), MessageType::Response);
    assert_eq!(m.response_code(), ResponseCode::NoError);
    assert!(m.recursion_desired() && m.recursion_available() && !m.authoritative());
    assert_eq!(m.queries().len(), 1);
    assert_eq!(m.queries()[0].name().to_ascii(), "api.example.com.");
    assert_eq!(addrs_of(&m), vec![ip("93.184.216.34"), ip("93.184.216.35")]);
    assert!(m.answers().iter().all(|a| a.ttl() == 120));
    assert!(m
        .answers()
        .iter()
        .all(|a| a.name().to_ascii() == "api.example.com."));

    let pins = r.pins();
    let mut pinned = pins.addresses_for(&host("api.example.com"));
    pinned.sort();
    assert_eq!(pinned, vec![ip("93.184.216.34"), ip("93.184.216.35")]);
    assert_eq!(
        pins.names_for(ip("93.184.216.34")),
        vec![host("api.example.com")]
    );
    assert!(pins.is_pinned(&host("api.example.com"), ip("93.184.216.35")));
    assert!(!pins.is_pinned(&host("other.example.com"), ip("93.184.216.35")));
}

#[tokio::test]
async fn denied_name_is_nxdomain_and_never_looked_up() {
    let upstream = FakeUpstream::default().with("evil.org", RecordType::A, &["1.2.3.4"], 60);
    let r = resolver(upstream);
    for (name, rtype) in [
        ("evil.org.", RecordType::A),
        ("evil.org.", RecordType::AAAA),
        ("evil.org.", RecordType::HTTPS),
        ("evil.org.", RecordType::TXT),
        ("notexample.com.", RecordType::A),
    ] {
        let m = ask(&r, name, rtype).await;
        assert_eq!(m.response_code(), ResponseCode::NXDomain, "{name} {rtype}");
        assert!(m.answers().is_empty());
    }
    assert_eq!(r.upstream.calls(), 0);
    assert!(r.pins().is_empty());
}

#[tokio::test]
async fn mode_none_resolves_nothing() {
    let none = EgressPolicy::default();
    let r = resolver_with(
        none,
        FakeUpstream::default().with("api.example.com", RecordType::A, &["1.1.1.1"], 60),
        DnsLimits::default(),
        PinLimits::default(),
    );
    let m = ask(&r, "api.example.com.", RecordType::A).await;
    assert_eq!(m.response_code(), ResponseCode::NXDomain);
    assert_eq!(r.upstream.calls(), 0);
}

#[tokio::test]
async fn rebinding_to_non_public_addresses_is_nxdomain() {
    let cases: &[(&str, RecordType, &str)] = &[
        ("private.example.com", RecordType::A, "10.0.0.1"),
        ("loopback.example.com", RecordType::A, "127.0.0.1"),
        ("metadata.example.com", RecordType::A, "169.254.169.254"),
        ("zero.example.com", RecordType::A, "0.0.0.0"),
        ("cgnat.example.com", RecordType::A, "100.64.1.1"),
        ("mapped.example.com", RecordType::AAAA, "::ffff:127.0.0.1"),
        ("nat64.example.com", RecordType::AAAA, "64:ff9b::a00:1"),
        ("loop6.example.com", RecordType::AAAA, "::1"),
        ("ula.example.com", RecordType::AAAA, "fd00:ec2::254"),
        ("ll6.example.com", RecordType::AAAA, "fe80::1"),
    ];
    let mut upstream = FakeUpstream::default();
    for (name, rtype, addr) in cases {
        upstream = upstream.with(name, *rtype, &[addr], 60);
    }
    let r = resolver(upstream);
    for (name, rtype, addr) in cases {
        let m = ask(&r, &format!("{name}."), *rtype).await;
        assert_eq!(m.response_code(), ResponseCode::NXDomain, "{name} → {addr}");
        assert!(m.answers().is_empty());
    }
    assert!(r.pins().is_empty());
}

#[tokio::test]
async fn mixed_answers_keep_only_public_addresses() {
    let r = resolver(
        FakeUpstream::default()
            .with(
                "mixed.example.com",
                RecordType::A,
                &[
                    "10.0.0.1",
                    "1.1.1.1",
                    "127.0.0.1",
                    "8.8.8.8",
                    "169.254.169.254",
                ],
                60,
            )
            .with(
                "mixed.example.com",
                RecordType::AAAA,
                &["::ffff:10.0.0.1", "2606:4700:4700::1111", "::ffff:1.0.0.1"],
                60,
            ),
    );
    let m = ask(&r, "mixed.example.com.", RecordType::A).await;
    assert_eq!(m.response_code(), ResponseCode::NoError);
    assert_eq!(addrs_of(&m), vec![ip("1.1.1.1"), ip("8.8.8.8")]);
    let m = ask(&r, "mixed.example.com.", RecordType::AAAA).await;
    assert_eq!(
        addrs_of(&m),
        vec![ip("2606:4700:4700::1111"), ip("::ffff:1.0.0.1")]
    );
    let mut pinned = r.pins().addresses_for(&host("mixed.example.com"));
    pinned.sort();
    // Pins are canonical: ::ffff:1.0.0.1 is pinned (and found) as 1.0.0.1.
    assert_eq!(
        pinned,
        vec![
            ip("1.0.0.1"),
            ip("1.1.1.1"),
            ip("8.8.8.8"),
            ip("2606:4700:4700::1111")
        ]
    );
    assert!(r
        .pins()
        .is_pinned(&host("mixed.example.com"), ip("::ffff:1.0.0.1")));
    assert!(r.pins().names_for(ip("10.0.0.1")).is_empty());
}

#[tokio::test]
async fn explicitly_allowed_networks_are_kept() {
    let r = resolver_with(
        policy(vec![cidr("10.0.0.0/8"), cidr("169.254.0.0/16")]),
        FakeUpstream::default()
            .with(
                "internal.example.com",
                RecordType::A,
                &["10.1.2.3", "192.168.1.1", "169.254.169.254", "169.254.1.1"],
                60,
            )
            .with("meta.example.com", RecordType::A, &["169.254.169.254"], 60),
        DnsLimits::default(),
        PinLimits::default(),
    );
    let m = ask(&r, "internal.example.com.", RecordType::A).await;
    // 10/8 and link-local unlocked; 192.168/16 not; the metadata address only by its /32.
    assert_eq!(addrs_of(&m), vec![ip("10.1.2.3"), ip("169.254.1.1")]);
    let m = ask(&r, "meta.example.com.", RecordType::A).await;
    assert_eq!(m.response_code(), ResponseCode::NXDomain);

    // A deny rule still wins over the unlocking rule.
    let mut p = policy(vec![cidr("10.0.0.0/8")]);
    p.rules
        .push(EgressRule::deny("10.1.0.0/16".parse::<IpNet>().unwrap()));
    assert!(!answer_address_permitted(
        &p,
        &host("internal.example.com"),
        ip("10.1.2.3")
    ));
    assert!(answer_address_permitted(
        &p,
        &host("internal.example.com"),
        ip("10.2.0.1")
    ));
    // Port-restricted unlocking rules are probed on their own port.
    let p = policy(vec![cidr("10.0.0.0/8")
        .with_ports([PortRange::single(5432)])
        .with_protocols([Protocol::Tcp])]);
    assert!(answer_address_permitted(
        &p,
        &host("db.example.com"),
        ip("10.9.9.9")
    ));
    // Public addresses are always permitted.
    assert!(answer_address_permitted(
        &policy(vec![]),
        &host("x.example.com"),
        ip("1.1.1.1")
    ));
}

#[tokio::test]
async fn https_svcb_and_other_types_get_an_empty_noerror() {
    let r =
        resolver(FakeUpstream::default().with("api.example.com", RecordType::A, &["1.1.1.1"], 60));
    for rtype in [
        RecordType::HTTPS,
        RecordType::SVCB,
        RecordType::TXT,
        RecordType::MX,
        RecordType::CNAME,
        RecordType::PTR,
        RecordType::SRV,
        RecordType::Unknown(65280),
    ] {
        let m = ask(&r, "api.example.com.", rtype).await;
        assert_eq!(m.response_code(), ResponseCode::NoError, "{rtype}");
        assert!(m.answers().is_empty(), "{rtype}");
        assert!(m.name_servers().is_empty() && m.additionals().is_empty());
    }
    assert_eq!(r.upstream.calls(), 0);
    assert!(r.pins().is_empty());
}

#[tokio::test]
async fn any_zone_transfers_and_other_classes_are_refused() {
    let r =
        resolver(FakeUpstream::default().with("api.example.com", RecordType::A, &["1.1.1.1"], 60));
    for rtype in [RecordType::ANY, RecordType::AXFR, RecordType::IXFR] {
        let m = ask(&r, "api.example.com.", rtype).await;
        assert_eq!(m.response_code(), ResponseCode::Refused, "{rtype}");
        assert!(m.answers().is_empty());
    }
    let mut chaos = query_message("version.bind.", RecordType::TXT);
    chaos.queries_mut()[0].set_query_class(DNSClass::CH);
    let bytes = r
        .answer(&chaos.to_vec().unwrap(), Transport::Udp)
        .await
        .unwrap();
    assert_eq!(
        Message::from_vec(&bytes).unwrap().response_code(),
        ResponseCode::Refused
    );
    assert_eq!(r.upstream.calls(), 0);
}

#[tokio::test]
async fn names_are_canonicalised_but_echoed_as_asked() {
    let r =
        resolver(FakeUpstream::default().with("api.example.com", RecordType::A, &["1.1.1.1"], 60));
    let m = ask(&r, "API.Example.COM.", RecordType::A).await;
    assert_eq!(m.response_code(), ResponseCode::NoError);
    assert_eq!(addrs_of(&m), vec![ip("1.1.1.1")]);
    // Question and owner keep the guest's spelling (0x20 randomisation must survive).
    assert_eq!(m.queries()[0].name().to_ascii(), "API.Example.COM.");
    assert_eq!(m.answers()[0].name().to_ascii(), "API.Example.COM.");
    // Without the trailing dot in the text form: the wire form is the same name.
    let m = ask(&r, "api.EXAMPLE.com", RecordType::A).await;
    assert_eq!(addrs_of(&m), vec![ip("1.1.1.1")]);
    assert_eq!(
        *r.upstream.asked.lock().unwrap(),
        vec![
            ("api.example.com".to_owned(), RecordType::A),
            ("api.example.com".to_owned(), RecordType::A)
        ]
    );
    assert_eq!(
        r.pins().addresses_for(&host("api.example.com")),
        vec![ip("1.1.1.1")]
    );
}

#[tokio::test]
async fn names_that_are_not_hostnames_are_nxdomain() {
    let r = resolver_with(
        EgressPolicy::allow_all_public(),
        FakeUpstream::default(),
        DnsLimits::default(),
        PinLimits::default(),
    );
    // A label holding a dot, a NUL, a backslash; an underscore; a single label; the root;
    // an IP literal.
    let mut weird = Vec::new();
    for labels in [
        vec![&b"api.example"[..], b"com"],
        vec![b"a\0b", b"example", b"com"],
        vec![b"a\\b", b"example", b"com"],
        vec![b"_dmarc", b"example", b"com"],
        vec![b"localhost"],
        vec![],
        vec![b"127", b"0", b"0", b"1"],
    ] {
        weird.push(Name::from_labels(labels).unwrap());
    }
    for name in weird {
        let mut m = Message::new();
        m.set_id(7).set_recursion_desired(true);
        m.add_query(Query::query(name.clone(), RecordType::A));
        let bytes = r
            .answer(&m.to_vec().unwrap(), Transport::Udp)
            .await
            .unwrap();
        let m = Message::from_vec(&bytes).unwrap();
        assert_eq!(m.response_code(), ResponseCode::NXDomain, "{name:?}");
    }
    assert_eq!(r.upstream.calls(), 0);
}

#[tokio::test]
async fn malformed_queries_get_formerr_or_nothing() {
    let r = resolver(FakeUpstream::default());
    // Shorter than a header: nothing to answer to.
    assert_eq!(r.answer(&[], Transport::Udp).await, None);
    assert_eq!(r.answer(&[0x12; 11], Transport::Udp).await, None);

    // A header claiming one question, then garbage.
    let mut garbage = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    garbage.extend_from_slice(&[0x3f, 0xff, 0xff, 0xff]);
    let out = r.answer(&garbage, Transport::Udp).await.unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(m.id(), 0xabcd);
    assert_eq!(m.message_type(), MessageType::Response);
    assert_eq!(m.response_code(), ResponseCode::FormErr);
    assert!(m.recursion_desired());

    // Hostile counts are refused from the header alone.
    let huge = [
        0, 1, 0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    ];
    let m = Message::from_vec(&r.answer(&huge, Transport::Udp).await.unwrap()).unwrap();
    assert_eq!(m.response_code(), ResponseCode::FormErr);

    // Two questions.
    let mut two = query_message("a.example.com.", RecordType::A);
    two.add_query(Query::query(
        Name::from_ascii("b.example.com.").unwrap(),
        RecordType::A,
    ));
    let m = Message::from_vec(
        &r.answer(&two.to_vec().unwrap(), Transport::Udp)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(m.response_code(), ResponseCode::FormErr);

    // No question.
    let none = [0, 2, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0];
    let m = Message::from_vec(&r.answer(&none, Transport::Udp).await.unwrap()).unwrap();
    assert_eq!(m.response_code(), ResponseCode::FormErr);

    // An answer section in a query.
    let mut with_answer = query_message("a.example.com.", RecordType::A);
    with_answer.add_answer(Record::from_rdata(
        Name::from_ascii("a.example.com.").unwrap(),
        60,
        RData::A(A::new(1, 2, 3, 4)),
    ));
    let m = Message::from_vec(
        &r.answer(&with_answer.to_vec().unwrap(), Transport::Udp)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(m.response_code(), ResponseCode::FormErr);

    // Other opcodes: NOTIMP, opcode echoed.
    let mut notify = query_message("a.example.com.", RecordType::SOA);
    notify.set_op_code(OpCode::Notify);
    let m = Message::from_vec(
        &r.answer(&notify.to_vec().unwrap(), Transport::Udp)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(m.response_code(), ResponseCode::NotImp);
    assert_eq!(m.op_code(), OpCode::Notify);

    // A response sent to the resolver is ignored (no reflection loops).
    let mut response = query_message("a.example.com.", RecordType::A);
    response.set_message_type(MessageType::Response);
    assert_eq!(
        r.answer(&response.to_vec().unwrap(), Transport::Udp).await,
        None
    );

    // Oversized for the transport.
    let mut big = query("a.example.com.", RecordType::A);
    big.resize(MAX_UDP_QUERY + 1, 0);
    let m = Message::from_vec(&r.answer(&big, Transport::Udp).await.unwrap()).unwrap();
    assert_eq!(m.response_code(), ResponseCode::FormErr);

    // Trailing bytes after a valid question (counts say there is nothing more).
    let mut trailing = query("a.example.com.", RecordType::TXT);
    trailing.extend_from_slice(&[0; 8]);
    assert!(r.answer(&trailing, Transport::Udp).await.is_some());

    assert_eq!(r.upstream.calls(), 0);
}

#[tokio::test]
async fn upstream_outcomes_map_to_response_codes() {
    let r = resolver_with(
        policy(vec![]),
        FakeUpstream::default()
            .failing("gone.example.com", RecordType::A, UpstreamError::NxDomain)
            .failing(
                "broken.example.com",
                RecordType::A,
                UpstreamError::Failed("SERVFAIL".into()),
            )
            .with("v4only.example.com", RecordType::AAAA, &[], 60)
            .with(
                "wrongfamily.example.com",
                RecordType::A,
                &["2001:4860::1"],
                60,
            ),
        DnsLimits::default(),
        PinLimits::default(),
    );
    let cases = [
        ("gone.example.com.", ResponseCode::NXDomain),
        ("broken.example.com.", ResponseCode::ServFail),
        ("wrongfamily.example.com.", ResponseCode::NoError),
    ];
    for (name, code) in cases {
        let m = ask(&r, name, RecordType::A).await;
        assert_eq!(m.response_code(), code, "{name}");
        assert!(m.answers().is_empty());
    }
    let m = ask(&r, "v4only.example.com.", RecordType::AAAA).await;
    assert_eq!(m.response_code(), ResponseCode::NoError);
    assert!(m.answers().is_empty());
    assert!(r.pins().is_empty());
}

#[tokio::test]
async fn slow_upstream_is_servfail() {
    let upstream = FakeUpstream {
        delay: Some(Duration::from_secs(5)),
        ..FakeUpstream::default().with("slow.example.com", RecordType::A, &["1.1.1.1"], 60)
    };
    let limits = DnsLimits {
        lookup_timeout: Duration::from_millis(50),
        ..DnsLimits::default()
    };
    let r = resolver_with(policy(vec![]), upstream, limits, PinLimits::default());
    let started = Instant::now();
    let m = ask(&r, "slow.example.com.", RecordType::A).await;
    assert_eq!(m.response_code(), ResponseCode::ServFail);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(r.pins().is_empty());
}

#[tokio::test]
async fn upstream_lookups_are_bounded() {
    let upstream = FakeUpstream {
        delay: Some(Duration::from_millis(30)),
        ..FakeUpstream::default().with("a.example.com", RecordType::A, &["1.1.1.1"], 60)
    };
    let limits = DnsLimits {
        max_concurrent_lookups: 2,
        ..DnsLimits::default()
    };
    let r = Arc::new(resolver_with(
        policy(vec![]),
        upstream,
        limits,
        PinLimits::default(),
    ));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let r = Arc::clone(&r);
        tasks.spawn(async move {
            r.answer(&query("a.example.com.", RecordType::A), Transport::Udp)
                .await
        });
    }
    while let Some(out) = tasks.join_next().await {
        let m = Message::from_vec(&out.unwrap().unwrap()).unwrap();
        assert_eq!(m.response_code(), ResponseCode::NoError);
    }
    assert_eq!(r.upstream.calls(), 8);
    assert_eq!(r.upstream.max_in_flight.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn ttls_are_capped_and_one_per_rrset() {
    let r = resolver(
        FakeUpstream::default()
            .with("long.example.com", RecordType::A, &["1.1.1.1"], 86_400)
            .with("zero.example.com", RecordType::A, &["1.1.1.1"], 0),
    );
    let m = ask(&r, "long.example.com.", RecordType::A).await;
    assert_eq!(m.answers()[0].ttl(), DnsLimits::default().max_ttl);
    let m = ask(&r, "zero.example.com.", RecordType::A).await;
    assert_eq!(m.answers()[0].ttl(), 0);
    // TTL 0 still pins for the floor.
    assert!(r.pins().is_pinned(&host("zero.example.com"), ip("1.1.1.1")));

    let mut mixed = FakeUpstream::default();
    mixed.zone.insert(
        ("mixed.example.com".into(), RecordType::A),
        Ok(vec![
            UpstreamAddr {
                addr: ip("1.1.1.1"),
                ttl: 200,
            },
            UpstreamAddr {
                addr: ip("1.0.0.1"),
                ttl: 90,
            },
        ]),
    );
    let r = resolver(mixed);
    let m = ask(&r, "mixed.example.com.", RecordType::A).await;
    assert!(m.answers().iter().all(|a| a.ttl() == 90));
}

#[tokio::test]
async fn large_answers_are_truncated_over_udp_and_whole_over_tcp() {
    let many: Vec<String> = (1..=64).map(|i| format!("2001:4860::{i:x}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let r = resolver(FakeUpstream::default().with("big.example.com", RecordType::AAAA, &many, 60));

    // No EDNS: 512 bytes.
    let out = r
        .answer(&query("big.example.com.", RecordType::AAAA), Transport::Udp)
        .await
        .unwrap();
    assert!(out.len() <= 512);
    let m = Message::from_vec(&out).unwrap();
    assert!(m.truncated());
    assert!(m.answers().is_empty());
    assert!(
        r.pins().is_empty(),
        "nothing was handed out, nothing pinned"
    );

    // EDNS 4096 is capped at 1232: 64 AAAA records still do not fit.
    let out = r
        .answer(
            &query_edns("big.example.com.", RecordType::AAAA, 4096),
            Transport::Udp,
        )
        .await
        .unwrap();
    assert!(out.len() <= usize::from(EDNS_PAYLOAD));
    let m = Message::from_vec(&out).unwrap();
    assert!(m.truncated());
    assert_eq!(m.max_payload(), EDNS_PAYLOAD);

    // TCP: everything.
    let out = r
        .answer(&query("big.example.com.", RecordType::AAAA), Transport::Tcp)
        .await
        .unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert!(!m.truncated());
    assert_eq!(m.answers().len(), 64);
    assert_eq!(r.pins().addresses_for(&host("big.example.com")).len(), 64);
}

#[tokio::test]
async fn answers_are_capped_at_the_per_name_pin_limit() {
    let many: Vec<String> = (1..=10).map(|i| format!("1.1.1.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let r = resolver_with(
        policy(vec![]),
        FakeUpstream::default().with("pool.example.com", RecordType::A, &many, 60),
        DnsLimits::default(),
        PinLimits {
            max_per_name: 4,
            ..PinLimits::default()
        },
    );
    let m = ask(&r, "pool.example.com.", RecordType::A).await;
    assert_eq!(m.answers().len(), 4);
    let mut pinned = r.pins().addresses_for(&host("pool.example.com"));
    pinned.sort();
    let mut answered = addrs_of(&m);
    answered.sort();
    assert_eq!(pinned, answered);
}

#[tokio::test]
async fn edns_queries_get_an_opt_record() {
    let r =
        resolver(FakeUpstream::default().with("api.example.com", RecordType::A, &["1.1.1.1"], 60));
    let out = r
        .answer(
            &query_edns("api.example.com.", RecordType::A, 4096),
            Transport::Udp,
        )
        .await
        .unwrap();
    let m = Message::from_vec(&out).unwrap();
    assert_eq!(
        m.extensions().as_ref().map(Edns::max_payload),
        Some(EDNS_PAYLOAD)
    );
    let out = r
        .answer(&query("api.example.com.", RecordType::A), Transport::Udp)
        .await
        .unwrap();
    assert!(Message::from_vec(&out).unwrap().extensions().is_none());
}

#[tokio::test]
async fn policy_updates_apply_to_the_next_query() {
    let handle: PolicyHandle = Arc::new(ArcSwap::from_pointee(policy(vec![])));
    let r = SandboxResolver::new(
        SandboxId::generate(),
        Arc::clone(&handle),
        Arc::new(PinTable::default()),
        Arc::new(
            FakeUpstream::default()
                .with("api.example.com", RecordType::A, &["1.1.1.1"], 60)
                .with("api.other.org", RecordType::A, &["1.0.0.1"], 60),
        ),
    );
    assert_eq!(
        ask(&r, "api.example.com.", RecordType::A)
            .await
            .response_code(),
        ResponseCode::NoError
    );
    assert_eq!(
        ask(&r, "api.other.org.", RecordType::A)
            .await
            .response_code(),
        ResponseCode::NXDomain
    );
    handle.store(Arc::new(EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: vec![domain("*.other.org")],
    }));
    assert_eq!(
        ask(&r, "api.example.com.", RecordType::A)
            .await
            .response_code(),
        ResponseCode::NXDomain
    );
    assert_eq!(
        ask(&r, "api.other.org.", RecordType::A)
            .await
            .response_code(),
        ResponseCode::NoError
    );
}

#[tokio::test]
async fn queries_past_the_rate_limit_are_dropped() {
    let limits = DnsLimits {
        queries_per_second: 1,
        query_burst: 3,
        ..DnsLimits::default()
    };
    let r = resolver_with(
        policy(vec![]),
        FakeUpstream::default(),
        limits,
        PinLimits::default(),
    );
    let q = query("api.example.com.", RecordType::TXT);
    for _ in 0..3 {
        assert!(r.answer(&q, Transport::Udp).await.is_some());
    }
    assert_eq!(r.answer(&q, Transport::Udp).await, None);
    assert_eq!(r.answer(&q, Transport::Tcp).await, None);
}

#[test]
fn token_bucket_refills_at_its_rate_up_to_its_burst() {
    let t0 = Instant::now();
    let mut bucket = TokenBucket::new(200, 400, t0);
    for _ in 0..400 {
        assert!(bucket.take(t0));
    }
    assert!(!bucket.take(t0));
    // 10 ms at 200/s: two more.
    let t1 = t0 + Duration::from_millis(10);
    assert!(bucket.take(t1));
    assert!(bucket.take(t1));
    assert!(!bucket.take(t1));
    // A long pause refills to the burst, no more.
    let t2 = t1 + Duration::from_secs(3600);
    for _ in 0..400 {
        assert!(bucket.take(t2));
    }
    assert!(!bucket.take(t2));
    // Time going backwards grants nothing.
    assert!(!bucket.take(t0));
}

// ---------------------------------------------------------------------------------------
// Pin table
// ---------------------------------------------------------------------------------------

#[test]
fn pins_expire_after_max_of_ttl_and_floor() {
    let pins = PinTable::default();
    let t0 = Instant::now();
    let short = host("short.example.com");
    let long = host("long.example.com");
    pins.pin_at(&short, &[ip("1.1.1.1")], Duration::from_secs(5), t0);
    pins.pin_at(&long, &[ip("1.0.0.1")], Duration::from_secs(300), t0);

    let t59 = t0 + Duration::from_secs(59);
    assert_eq!(pins.addresses_for_at(&short, t59), vec![ip("1.1.1.1")]);
    let t61 = t0 + Duration::from_secs(61);
    assert!(pins.addresses_for_at(&short, t61).is_empty());
    assert!(pins.names_for_at(ip("1.1.1.1"), t61).is_empty());
    assert!(!pins.is_pinned_at(&short, ip("1.1.1.1"), t61));
    assert!(pins.is_pinned_at(&long, ip("1.0.0.1"), t61));
    let t301 = t0 + Duration::from_secs(301);
    assert!(!pins.is_pinned_at(&long, ip("1.0.0.1"), t301));

    // Re-pinning extends, never shortens.
    pins.pin_at(&long, &[ip("1.0.0.1")], Duration::from_secs(300), t0);
    pins.pin_at(
        &long,
        &[ip("1.0.0.1")],
        Duration::from_secs(10),
        t0 + Duration::from_secs(1),
    );
    assert!(pins.is_pinned_at(&long, ip("1.0.0.1"), t0 + Duration::from_secs(299)));
    pins.pin_at(
        &long,
        &[ip("1.0.0.1")],
        Duration::from_secs(300),
        t0 + Duration::from_secs(100),
    );
    assert!(pins.is_pinned_at(&long, ip("1.0.0.1"), t0 + Duration::from_secs(399)));
}

#[test]
fn pins_are_capped_per_name_evicting_the_oldest() {
    let pins = PinTable::new(PinLimits {
        max_per_name: 3,
        ..PinLimits::default()
    });
    let t0 = Instant::now();
    let name = host("pool.example.com");
    for i in 1..=5u8 {
        pins.pin_at(
            &name,
            &[IpAddr::V4(Ipv4Addr::new(1, 1, 1, i))],
            Duration::from_secs(60),
            t0,
        );
    }
    assert_eq!(
        pins.addresses_for_at(&name, t0),
        vec![ip("1.1.1.5"), ip("1.1.1.4"), ip("1.1.1.3")]
    );
    assert!(pins.names_for_at(ip("1.1.1.1"), t0).is_empty());
    assert_eq!(pins.len(), 3);

    // Refreshing an address makes it the newest: 1.1.1.3 survives the next insertion.
    pins.pin_at(&name, &[ip("1.1.1.3")], Duration::from_secs(60), t0);
    pins.pin_at(&name, &[ip("1.1.1.6")], Duration::from_secs(60), t0);
    let mut left = pins.addresses_for_at(&name, t0);
    left.sort();
    assert_eq!(left, vec![ip("1.1.1.3"), ip("1.1.1.5"), ip("1.1.1.6")]);
}

#[test]
fn pins_are_capped_per_sandbox_expired_first_then_oldest() {
    let pins = PinTable::new(PinLimits {
        max_per_name: 64,
        max_entries: 4,
        min_ttl: Duration::from_secs(60),
    });
    let t0 = Instant::now();
    let names: Vec<Hostname> = (0..6).map(|i| host(&format!("n{i}.example.com"))).collect();
    for (i, name) in names.iter().enumerate().take(4) {
        pins.pin_at(
            name,
            &[IpAddr::V4(Ipv4Addr::new(1, 1, 1, i as u8))],
            Duration::from_secs(60),
            t0,
        );
    }
    assert_eq!(pins.len(), 4);
    // Full: the oldest goes.
    pins.pin_at(&names[4], &[ip("1.1.1.4")], Duration::from_secs(600), t0);
    assert_eq!(pins.len(), 4);
    assert!(pins.addresses_for_at(&names[0], t0).is_empty());
    assert!(pins.is_pinned_at(&names[1], ip("1.1.1.1"), t0));
    // Later, the 60 s pins have expired: they are swept, the 600 s one stays.
    let t2 = t0 + Duration::from_secs(120);
    pins.pin_at(&names[5], &[ip("1.1.1.5")], Duration::from_secs(60), t2);
    assert_eq!(pins.len(), 2);
    assert!(pins.is_pinned_at(&names[4], ip("1.1.1.4"), t2));
    assert!(pins.is_pinned_at(&names[5], ip("1.1.1.5"), t2));
}

#[test]
fn pins_map_addresses_back_to_every_name() {
    let pins = PinTable::default();
    let cdn = ip("151.101.1.1");
    pins.pin(&host("a.example.com"), &[cdn], Duration::from_secs(60));
    pins.pin(&host("b.example.com"), &[cdn], Duration::from_secs(60));
    let mut names = pins.names_for(cdn);
    names.sort();
    assert_eq!(names, vec![host("a.example.com"), host("b.example.com")]);
    // IPv4-mapped spellings find the same pins.
    assert_eq!(pins.names_for(ip("::ffff:151.101.1.1")).len(), 2);
    pins.pin(
        &host("c.example.com"),
        &[IpAddr::V6(Ipv4Addr::new(151, 101, 1, 2).to_ipv6_mapped())],
        Duration::from_secs(60),
    );
    assert_eq!(
        pins.addresses_for(&host("c.example.com")),
        vec![ip("151.101.1.2")]
    );
    pins.purge_expired();
    assert_eq!(pins.len(), 3);
}

// ---------------------------------------------------------------------------------------
// Over real loopback sockets, with the real upstream
// ---------------------------------------------------------------------------------------

/// A tiny authoritative server for `example.com` on 127.0.0.1 (UDP), recording every name
/// it is asked.
struct TestAuthority {
    addr: SocketAddr,
    asked: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestAuthority {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn authority_answer(query: &Message) -> Message {
    let mut response = Message::new();
    response
        .set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_authoritative(true)
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true);
    let Some(q) = query.queries().first() else {
        response.set_response_code(ResponseCode::FormErr);
        return response;
    };
    response.add_query(q.clone());
    let name = q.name().to_ascii().to_ascii_lowercase();
    let owner = q.name().clone();
    let a = |o: &Name, s: &str| Record::from_rdata(o.clone(), 120, RData::A(A(s.parse().unwrap())));
    let aaaa = |o: &Name, s: &str| {
        Record::from_rdata(o.clone(), 120, RData::AAAA(AAAA(s.parse().unwrap())))
    };
    let www = Name::from_ascii("www.example.com.").unwrap();
    let answers: Option<Vec<Record>> = match (name.as_str(), q.query_type()) {
        ("www.example.com.", RecordType::A) => Some(vec![a(&owner, "93.184.216.34")]),
        ("www.example.com.", RecordType::AAAA) => {
            Some(vec![aaaa(&owner, "2606:2800:21f:cb07:6820:80da:af6b:8b2c")])
        }
        ("www.example.com.", _) => Some(vec![]),
        ("alias.example.com.", RecordType::A) => Some(vec![
            Record::from_rdata(owner.clone(), 120, RData::CNAME(CNAME(www.clone()))),
            a(&www, "93.184.216.34"),
        ]),
        ("rebind.example.com.", RecordType::A) => Some(vec![a(&owner, "127.0.0.1")]),
        ("metadata.example.com.", RecordType::A) => Some(vec![a(&owner, "169.254.169.254")]),
        ("mixed.example.com.", RecordType::A) => {
            Some(vec![a(&owner, "10.1.2.3"), a(&owner, "1.1.1.1")])
        }
        ("github.com.", RecordType::A) => Some(vec![a(&owner, "140.82.112.3")]),
        _ => None,
    };
    match answers {
        Some(answers) => {
            response.add_answers(answers);
        }
        None => {
            response.set_response_code(ResponseCode::NXDomain);
        }
    }
    response
}

async fn start_authority() -> TestAuthority {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&asked);
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((len, peer)) = socket.recv_from(&mut buf).await else {
                continue;
            };
            let Ok(query) = Message::from_vec(&buf[..len]) else {
                continue;
            };
            if let Some(q) = query.queries().first() {
                log.lock()
                    .unwrap()
                    .push(q.name().to_ascii().to_ascii_lowercase());
            }
            let response = authority_answer(&query);
            let _ = socket.send_to(&response.to_vec().unwrap(), peer).await;
        }
    });
    TestAuthority { addr, asked, task }
}

/// A hickory stub resolver talking to `server` over one protocol, without a cache.
fn client(server: SocketAddr, protocol: DnsProtocol) -> TokioResolver {
    let mut config = ResolverConfig::new();
    config.add_name_server(NameServerConfig::new(server, protocol));
    let mut options = ResolverOpts::default();
    options.cache_size = 0;
    options.attempts = 1;
    options.timeout = Duration::from_secs(5);
    options.use_hosts_file = hickory_resolver::config::ResolveHosts::Never;
    TokioResolver::builder_with_config(config, TokioConnectionProvider::default())
        .with_options(options)
        .build()
}

fn v4s(lookup: &hickory_resolver::lookup::Lookup) -> Vec<IpAddr> {
    lookup
        .record_iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

async fn raw_udp(server: SocketAddr, query: &[u8]) -> Message {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(query, server).await.unwrap();
    let mut buf = vec![0u8; 2048];
    let (len, _) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    Message::from_vec(&buf[..len]).unwrap()
}

#[tokio::test]
async fn serves_over_loopback_with_the_real_upstream() {
    let authority = start_authority().await;
    let upstream = Arc::new(HickoryUpstream::with_name_servers(&[authority.addr]).unwrap());
    let pins = Arc::new(PinTable::default());
    let policy = EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: vec![domain("*.example.com")],
    };
    let resolver = Arc::new(SandboxResolver::new(
        SandboxId::generate(),
        Arc::new(ArcSwap::from_pointee(policy)),
        Arc::clone(&pins),
        upstream,
    ));
    // As the node does: bind first, hand over the sockets.
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (udp_addr, tcp_addr) = (udp.local_addr().unwrap(), tcp.local_addr().unwrap());
    let server = tokio::spawn(Arc::clone(&resolver).serve(udp, tcp));

    for (protocol, addr) in [(DnsProtocol::Udp, udp_addr), (DnsProtocol::Tcp, tcp_addr)] {
        let client = client(addr, protocol);
        let www = client
            .lookup("www.example.com.", RecordType::A)
            .await
            .unwrap();
        assert_eq!(v4s(&www), vec![ip("93.184.216.34")], "{protocol}");
        let www6 = client
            .lookup("WWW.example.com.", RecordType::AAAA)
            .await
            .unwrap();
        assert_eq!(
            v4s(&www6),
            vec![ip("2606:2800:21f:cb07:6820:80da:af6b:8b2c")]
        );
        // The CNAME chain is flattened onto the name asked.
        let alias = client
            .lookup("alias.example.com.", RecordType::A)
            .await
            .unwrap();
        assert!(alias.record_iter().all(
            |r| r.record_type() == RecordType::A && r.name().to_ascii() == "alias.example.com."
        ));
        assert_eq!(v4s(&alias), vec![ip("93.184.216.34")]);
        // Mixed: only the public address.
        let mixed = client
            .lookup("mixed.example.com.", RecordType::A)
            .await
            .unwrap();
        assert_eq!(v4s(&mixed), vec![ip("1.1.1.1")]);
        // Rebinding, metadata, denied and missing names: NXDOMAIN.
        for name in [
            "rebind.example.com.",
            "metadata.example.com.",
            "github.com.",
            "missing.example.com.",
        ] {
            let err = client.lookup(name, RecordType::A).await.unwrap_err();
            assert!(err.is_nx_domain(), "{protocol} {name}: {err}");
        }
    }

    // The denied name never reached the upstream; the allowed ones did.
    let asked = authority.asked.lock().unwrap().clone();
    assert!(!asked.iter().any(|n| n == "github.com."), "{asked:?}");
    assert!(asked.iter().any(|n| n == "www.example.com."));

    // Pins: what was answered, for the names asked.
    assert!(pins.is_pinned(&host("www.example.com"), ip("93.184.216.34")));
    assert!(pins.is_pinned(
        &host("www.example.com"),
        ip("2606:2800:21f:cb07:6820:80da:af6b:8b2c")
    ));
    assert!(pins.is_pinned(&host("alias.example.com"), ip("93.184.216.34")));
    assert_eq!(
        pins.addresses_for(&host("mixed.example.com")),
        vec![ip("1.1.1.1")]
    );
    assert!(pins.names_for(ip("127.0.0.1")).is_empty());
    assert!(pins.names_for(ip("10.1.2.3")).is_empty());
    assert!(pins.addresses_for(&host("github.com")).is_empty());

    // Raw UDP: HTTPS records are withheld; a malformed query gets FORMERR.
    let m = raw_udp(udp_addr, &query("www.example.com.", RecordType::HTTPS)).await;
    assert_eq!(m.response_code(), ResponseCode::NoError);
    assert!(m.answers().is_empty());
    let m = raw_udp(
        udp_addr,
        &[0x99, 0x01, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xff],
    )
    .await;
    assert_eq!(m.id(), 0x9901);
    assert_eq!(m.response_code(), ResponseCode::FormErr);

    // Raw TCP: two queries on one connection; a bad length prefix closes it.
    let mut stream = TcpStream::connect(tcp_addr).await.unwrap();
    for _ in 0..2 {
        let q = query("www.example.com.", RecordType::A);
        stream
            .write_all(&(q.len() as u16).to_be_bytes())
            .await
            .unwrap();
        stream.write_all(&q).await.unwrap();
        let mut len = [0u8; 2];
        stream.read_exact(&mut len).await.unwrap();
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        stream.read_exact(&mut buf).await.unwrap();
        let m = Message::from_vec(&buf).unwrap();
        assert_eq!(addrs_of(&m), vec![ip("93.184.216.34")]);
    }
    stream
        .write_all(&((MAX_TCP_QUERY + 1) as u16).to_be_bytes())
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .expect("closed");
    assert!(read.is_err() || rest.is_empty());

    // Aborting the server closes its sockets.
    server.abort();
    let _ = server.await;
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if TcpStream::connect(tcp_addr).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(closed.is_ok(), "the listener is closed after abort");
}

async fn tcp_round_trip(stream: &mut TcpStream) -> Message {
    let q = query("api.example.com.", RecordType::TXT);
    stream
        .write_all(&(q.len() as u16).to_be_bytes())
        .await
        .unwrap();
    stream.write_all(&q).await.unwrap();
    let mut len = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut len))
        .await
        .unwrap()
        .unwrap();
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

async fn serve_fake(limits: DnsLimits) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let resolver = Arc::new(resolver_with(
        policy(vec![]),
        FakeUpstream::default(),
        limits,
        PinLimits::default(),
    ));
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp_addr = tcp.local_addr().unwrap();
    (tcp_addr, tokio::spawn(resolver.serve(udp, tcp)))
}

/// Whether the server closed the connection (EOF or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = Vec::new();
    matches!(
        tokio::time::timeout(within, stream.read_to_end(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test]
async fn tcp_connections_are_bounded() {
    let (addr, server) = serve_fake(DnsLimits {
        max_tcp_connections: 2,
        tcp_idle_timeout: Duration::from_secs(60),
        ..DnsLimits::default()
    })
    .await;
    let mut a = TcpStream::connect(addr).await.unwrap();
    let mut b = TcpStream::connect(addr).await.unwrap();
    // Both accepted and served.
    tcp_round_trip(&mut a).await;
    tcp_round_trip(&mut b).await;
    // The third is closed on accept (the idle timeout is far away).
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut third, Duration::from_secs(5)).await);
    // Once one closes, there is room again.
    drop(a);
    let mut fresh = loop {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let q = query("api.example.com.", RecordType::TXT);
        let mut framed = (q.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        if s.write_all(&framed).await.is_ok() {
            let mut len = [0u8; 2];
            if let Ok(Ok(_)) =
                tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut len)).await
            {
                let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
                s.read_exact(&mut buf).await.unwrap();
                break s;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        tcp_round_trip(&mut fresh).await.response_code(),
        ResponseCode::NoError
    );
    tcp_round_trip(&mut b).await;
    server.abort();
}

#[tokio::test]
async fn idle_tcp_connections_are_closed() {
    let (addr, server) = serve_fake(DnsLimits {
        tcp_idle_timeout: Duration::from_millis(200),
        ..DnsLimits::default()
    })
    .await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    tcp_round_trip(&mut idle).await;
    let started = Instant::now();
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await);
    assert!(started.elapsed() >= Duration::from_millis(150));

    // Half a length prefix, then silence: closed too (no slowloris).
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(&[0]).await.unwrap();
    assert!(closed_within(&mut slow, Duration::from_secs(5)).await);
    server.abort();
}
