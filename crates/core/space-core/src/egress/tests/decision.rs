//! Tests of decisions on connections, per mode, and of their JSON.

use super::{cidr, domain, host, ip, policy};
use crate::egress::{
    AddressClass, ConnectionFacts, Decision, DecisionReason, EgressMode, EgressPolicy, EgressRule,
    PortRange, Protocol,
};

struct Case {
    host: Option<&'static str>,
    addr: Option<&'static str>,
    port: u16,
    protocol: Protocol,
    want: DecisionReason,
    /// Whether TLS is terminated; `None`: not checked by this case.
    inspect: Option<bool>,
}

fn tcp(
    host: Option<&'static str>,
    addr: Option<&'static str>,
    port: u16,
    want: DecisionReason,
) -> Case {
    Case {
        host,
        addr,
        port,
        protocol: Protocol::Tcp,
        want,
        inspect: None,
    }
}

fn udp(
    host: Option<&'static str>,
    addr: Option<&'static str>,
    port: u16,
    want: DecisionReason,
) -> Case {
    Case {
        host,
        addr,
        port,
        protocol: Protocol::Udp,
        want,
        inspect: Some(false),
    }
}

fn inspected(mut c: Case) -> Case {
    c.inspect = Some(true);
    c
}

fn passed_through(mut c: Case) -> Case {
    c.inspect = Some(false);
    c
}

fn check(p: &EgressPolicy, cases: &[Case]) {
    for c in cases {
        let h = c.host.map(host);
        let facts = ConnectionFacts {
            host: h.as_ref(),
            addr: c.addr.map(ip),
            port: c.port,
            protocol: c.protocol,
        };
        let got = p.decide(&facts);
        let allowed = matches!(
            c.want,
            DecisionReason::AllowedByRule { .. } | DecisionReason::AllowedByDefault
        );
        assert_eq!((got.allowed, got.reason), (allowed, c.want), "{facts:?}");
        let inspect = c.inspect.unwrap_or(got.inspect);
        assert_eq!(got.inspect, inspect && allowed, "inspect: {facts:?}");
    }
}

#[test]
fn allowlist_decisions() {
    use DecisionReason::*;
    let p = policy(
        EgressMode::Allowlist,
        vec![
            // 0
            EgressRule::allow(domain("*.github.com"))
                .with_ports([PortRange::single(443)])
                .with_protocols([Protocol::Tcp]),
            // 1
            EgressRule::allow(domain("pypi.org")).inspected(),
            // 2
            EgressRule::deny(domain("evil.github.com")),
            // 3
            EgressRule::allow(cidr("10.1.0.0/16"))
                .with_ports([PortRange::single(5432)])
                .with_protocols([Protocol::Tcp]),
            // 4
            EgressRule::deny(cidr("1.2.3.0/24")),
            // 5
            EgressRule::allow(cidr("8.8.8.8/32")).with_ports([PortRange::single(53)]),
        ],
    );
    let gh = Some("api.github.com");
    let gh_ip = Some("140.82.112.3");
    check(
        &p,
        &[
            tcp(gh, gh_ip, 443, AllowedByRule { rule: 0 }),
            tcp(
                Some("a.b.github.com"),
                gh_ip,
                443,
                AllowedByRule { rule: 0 },
            ),
            tcp(gh, Some("2606:50c0::1"), 443, AllowedByRule { rule: 0 }),
            tcp(gh, gh_ip, 80, DeniedByDefault),
            udp(gh, gh_ip, 443, DeniedByDefault),
            tcp(Some("github.com"), gh_ip, 443, DeniedByDefault),
            tcp(Some("evilgithub.com"), gh_ip, 443, DeniedByDefault),
            tcp(
                Some("evil.github.com"),
                gh_ip,
                443,
                DeniedByRule { rule: 2 },
            ),
            tcp(None, gh_ip, 443, DeniedByDefault),
            inspected(tcp(
                Some("pypi.org"),
                Some("151.101.0.223"),
                443,
                AllowedByRule { rule: 1 },
            )),
            udp(
                Some("pypi.org"),
                Some("151.101.0.223"),
                443,
                AllowedByRule { rule: 1 },
            ),
            // DNS rebinding: an allowed name pointing at non-public addresses.
            tcp(
                Some("pypi.org"),
                Some("127.0.0.1"),
                443,
                NonPublicAddress {
                    class: AddressClass::Loopback,
                },
            ),
            tcp(
                Some("pypi.org"),
                Some("::ffff:127.0.0.1"),
                443,
                NonPublicAddress {
                    class: AddressClass::Loopback,
                },
            ),
            tcp(
                Some("pypi.org"),
                Some("169.254.169.254"),
                80,
                NonPublicAddress {
                    class: AddressClass::Metadata,
                },
            ),
            tcp(
                Some("pypi.org"),
                Some("64:ff9b::a9fe:a9fe"),
                80,
                NonPublicAddress {
                    class: AddressClass::Metadata,
                },
            ),
            tcp(
                Some("pypi.org"),
                Some("10.1.2.3"),
                443,
                NonPublicAddress {
                    class: AddressClass::Private,
                },
            ),
            // An explicit private CIDR rule.
            tcp(None, Some("10.1.2.3"), 5432, AllowedByRule { rule: 3 }),
            tcp(
                None,
                Some("::ffff:10.1.2.3"),
                5432,
                AllowedByRule { rule: 3 },
            ),
            tcp(
                Some("db.internal.example"),
                Some("10.1.2.3"),
                5432,
                AllowedByRule { rule: 3 },
            ),
            udp(
                None,
                Some("10.1.2.3"),
                5432,
                NonPublicAddress {
                    class: AddressClass::Private,
                },
            ),
            tcp(
                None,
                Some("10.1.2.3"),
                5433,
                NonPublicAddress {
                    class: AddressClass::Private,
                },
            ),
            tcp(
                None,
                Some("10.2.0.1"),
                5432,
                NonPublicAddress {
                    class: AddressClass::Private,
                },
            ),
            // Deny CIDR catches IPv6 spellings of the address too, and wins over names.
            tcp(gh, Some("1.2.3.4"), 443, DeniedByRule { rule: 4 }),
            tcp(gh, Some("::ffff:1.2.3.4"), 443, DeniedByRule { rule: 4 }),
            tcp(gh, Some("64:ff9b::102:304"), 443, DeniedByRule { rule: 4 }),
            tcp(gh, Some("2002:102:304::1"), 443, DeniedByRule { rule: 4 }),
            tcp(gh, Some("::1.2.3.4"), 443, DeniedByRule { rule: 4 }),
            // Public CIDR allow.
            udp(None, Some("8.8.8.8"), 53, AllowedByRule { rule: 5 }),
            udp(None, Some("::ffff:8.8.8.8"), 53, AllowedByRule { rule: 5 }),
            tcp(None, Some("8.8.8.8"), 443, DeniedByDefault),
            tcp(None, Some("9.9.9.9"), 53, DeniedByDefault),
            // Before resolution: the name only.
            tcp(gh, None, 443, AllowedByRule { rule: 0 }),
            tcp(Some("example.com"), None, 443, DeniedByDefault),
            tcp(None, None, 443, NoDestination),
        ],
    );
}

#[test]
fn denylist_decisions() {
    use DecisionReason::*;
    let p = policy(
        EgressMode::Denylist,
        vec![
            // 0
            EgressRule::deny(domain("*.tiktok.com")),
            // 1
            EgressRule::deny(cidr("1.2.3.0/24")),
            // 2
            EgressRule::allow(cidr("192.168.1.0/24")).with_ports([PortRange::single(8080)]),
            // 3
            EgressRule::allow(domain("*.corp.example")).inspected(),
            // 4
            EgressRule::deny(domain("smtp.example.com"))
                .with_ports([PortRange::single(25), PortRange::single(587)])
                .with_protocols([Protocol::Tcp]),
            // 5
            EgressRule::allow(cidr("169.254.0.0/16")).with_ports([PortRange::single(80)]),
            // 6
            EgressRule::deny(cidr("2001:db8:dead::/48")),
        ],
    );
    let public = Some("93.184.216.34");
    check(
        &p,
        &[
            tcp(Some("example.org"), public, 443, AllowedByDefault),
            udp(Some("example.org"), public, 443, AllowedByDefault),
            tcp(None, public, 22, AllowedByDefault),
            tcp(None, Some("2a00:1450::1"), 443, AllowedByDefault),
            tcp(
                Some("www.tiktok.com"),
                public,
                443,
                DeniedByRule { rule: 0 },
            ),
            tcp(Some("tiktok.com"), public, 443, AllowedByDefault),
            tcp(None, Some("1.2.3.4"), 443, DeniedByRule { rule: 1 }),
            tcp(None, Some("::ffff:1.2.3.4"), 443, DeniedByRule { rule: 1 }),
            tcp(
                Some("www.tiktok.com"),
                Some("1.2.3.4"),
                443,
                DeniedByRule { rule: 0 },
            ),
            tcp(None, Some("192.168.1.10"), 8080, AllowedByRule { rule: 2 }),
            tcp(
                None,
                Some("192.168.1.10"),
                22,
                NonPublicAddress {
                    class: AddressClass::Private,
                },
            ),
            tcp(
                None,
                Some("192.168.2.1"),
                8080,
                NonPublicAddress {
                    class: AddressClass::Private,
                },
            ),
            tcp(
                None,
                Some("127.0.0.1"),
                8080,
                NonPublicAddress {
                    class: AddressClass::Loopback,
                },
            ),
            tcp(
                None,
                Some("0.0.0.0"),
                8080,
                NonPublicAddress {
                    class: AddressClass::Unspecified,
                },
            ),
            tcp(
                None,
                Some("::"),
                8080,
                NonPublicAddress {
                    class: AddressClass::Unspecified,
                },
            ),
            tcp(
                None,
                Some("::1"),
                8080,
                NonPublicAddress {
                    class: AddressClass::Loopback,
                },
            ),
            tcp(
                None,
                Some("100.64.0.1"),
                80,
                NonPublicAddress {
                    class: AddressClass::SharedCgnat,
                },
            ),
            tcp(
                None,
                Some("100.100.100.200"),
                80,
                NonPublicAddress {
                    class: AddressClass::Metadata,
                },
            ),
            tcp(
                None,
                Some("224.0.0.1"),
                80,
                NonPublicAddress {
                    class: AddressClass::Multicast,
                },
            ),
            tcp(
                None,
                Some("255.255.255.255"),
                80,
                NonPublicAddress {
                    class: AddressClass::Broadcast,
                },
            ),
            tcp(
                None,
                Some("203.0.113.5"),
                80,
                NonPublicAddress {
                    class: AddressClass::Documentation,
                },
            ),
            tcp(
                None,
                Some("198.18.0.1"),
                80,
                NonPublicAddress {
                    class: AddressClass::Benchmarking,
                },
            ),
            tcp(
                None,
                Some("240.0.0.1"),
                80,
                NonPublicAddress {
                    class: AddressClass::Reserved,
                },
            ),
            tcp(
                None,
                Some("2001::1"),
                80,
                NonPublicAddress {
                    class: AddressClass::Reserved,
                },
            ),
            // Link-local unlocked on port 80, but not the metadata address inside it.
            tcp(None, Some("169.254.1.1"), 80, AllowedByRule { rule: 5 }),
            tcp(
                None,
                Some("::ffff:169.254.1.1"),
                80,
                AllowedByRule { rule: 5 },
            ),
            tcp(
                None,
                Some("169.254.169.254"),
                80,
                NonPublicAddress {
                    class: AddressClass::Metadata,
                },
            ),
            tcp(
                None,
                Some("169.254.170.2"),
                80,
                NonPublicAddress {
                    class: AddressClass::Metadata,
                },
            ),
            tcp(
                None,
                Some("fe80::1"),
                80,
                NonPublicAddress {
                    class: AddressClass::LinkLocal,
                },
            ),
            tcp(
                None,
                Some("fd00:ec2::254"),
                80,
                NonPublicAddress {
                    class: AddressClass::Metadata,
                },
            ),
            // A domain allow rule never unlocks a non-public address.
            tcp(
                Some("git.corp.example"),
                Some("10.0.0.5"),
                443,
                NonPublicAddress {
                    class: AddressClass::Private,
                },
            ),
            inspected(tcp(
                Some("git.corp.example"),
                public,
                443,
                AllowedByRule { rule: 3 },
            )),
            udp(
                Some("git.corp.example"),
                public,
                443,
                AllowedByRule { rule: 3 },
            ),
            tcp(
                Some("smtp.example.com"),
                public,
                25,
                DeniedByRule { rule: 4 },
            ),
            tcp(
                Some("smtp.example.com"),
                public,
                587,
                DeniedByRule { rule: 4 },
            ),
            tcp(Some("smtp.example.com"), public, 465, AllowedByDefault),
            udp(Some("smtp.example.com"), public, 25, AllowedByDefault),
            tcp(
                None,
                Some("2001:db8:dead::1"),
                443,
                DeniedByRule { rule: 6 },
            ),
            tcp(None, None, 443, NoDestination),
        ],
    );
}

#[test]
fn mode_none_refuses_everything() {
    let p = policy(
        EgressMode::None,
        vec![
            EgressRule::allow(domain("example.com")),
            EgressRule::allow(cidr("0.0.0.0/0")),
            EgressRule::allow(cidr("10.0.0.0/8")),
        ],
    );
    let reason = DecisionReason::ModeNone;
    check(
        &p,
        &[
            tcp(Some("example.com"), Some("93.184.216.34"), 443, reason),
            tcp(None, Some("8.8.8.8"), 443, reason),
            tcp(None, Some("10.0.0.1"), 443, reason),
            udp(None, Some("8.8.8.8"), 53, reason),
            tcp(None, None, 443, reason),
        ],
    );
    assert_eq!(EgressPolicy::default().mode, EgressMode::None);
    assert!(EgressPolicy::default().rules.is_empty());
    let d = EgressPolicy::default().decide(&ConnectionFacts {
        host: None,
        addr: Some(ip("8.8.8.8")),
        port: 53,
        protocol: Protocol::Udp,
    });
    assert!(!d.allowed);
}

#[test]
fn broad_cidrs_do_not_unlock_non_public_addresses() {
    use DecisionReason::*;
    for mode in [EgressMode::Allowlist, EgressMode::Denylist] {
        let p = policy(
            mode,
            vec![
                EgressRule::allow(cidr("0.0.0.0/0")),
                EgressRule::allow(cidr("::/0")),
                EgressRule::allow(cidr("10.0.0.0/7")),
                EgressRule::allow(cidr("100.64.0.0/10")),
                EgressRule::allow(cidr("192.0.0.0/24")),
                EgressRule::allow(cidr("::ffff:0:0/96")),
                EgressRule::allow(cidr("fd00::/8")),
            ],
        );
        check(
            &p,
            &[
                tcp(None, Some("8.8.8.8"), 443, AllowedByRule { rule: 0 }),
                tcp(None, Some("2606:4700::1"), 443, AllowedByRule { rule: 1 }),
                tcp(None, Some("::ffff:8.8.8.8"), 443, AllowedByRule { rule: 0 }),
                tcp(
                    None,
                    Some("10.0.0.1"),
                    443,
                    NonPublicAddress {
                        class: AddressClass::Private,
                    },
                ),
                tcp(
                    None,
                    Some("127.0.0.1"),
                    443,
                    NonPublicAddress {
                        class: AddressClass::Loopback,
                    },
                ),
                tcp(
                    None,
                    Some("::ffff:127.0.0.1"),
                    443,
                    NonPublicAddress {
                        class: AddressClass::Loopback,
                    },
                ),
                tcp(
                    None,
                    Some("::1"),
                    443,
                    NonPublicAddress {
                        class: AddressClass::Loopback,
                    },
                ),
                tcp(None, Some("100.64.0.1"), 443, AllowedByRule { rule: 3 }),
                tcp(
                    None,
                    Some("100.100.100.200"),
                    80,
                    NonPublicAddress {
                        class: AddressClass::Metadata,
                    },
                ),
                tcp(None, Some("192.0.0.8"), 80, AllowedByRule { rule: 4 }),
                tcp(
                    None,
                    Some("192.0.0.192"),
                    80,
                    NonPublicAddress {
                        class: AddressClass::Metadata,
                    },
                ),
                tcp(None, Some("fd12::1"), 80, AllowedByRule { rule: 6 }),
                tcp(
                    None,
                    Some("fd00:ec2::254"),
                    80,
                    NonPublicAddress {
                        class: AddressClass::Metadata,
                    },
                ),
            ],
        );
    }
}

#[test]
fn explicit_rules_unlock_and_deny_still_wins() {
    use DecisionReason::*;
    let p = policy(
        EgressMode::Denylist,
        vec![
            EgressRule::allow(cidr("169.254.169.254/32")).with_ports([PortRange::single(80)]),
            EgressRule::allow(cidr("10.0.0.0/8")),
            EgressRule::deny(cidr("10.0.0.5/32")),
            EgressRule::allow(cidr("127.0.0.0/8")).with_protocols([Protocol::Tcp]),
            EgressRule::allow(cidr("fd00:ec2::254/128")),
        ],
    );
    check(
        &p,
        &[
            tcp(None, Some("169.254.169.254"), 80, AllowedByRule { rule: 0 }),
            tcp(
                None,
                Some("::ffff:169.254.169.254"),
                80,
                AllowedByRule { rule: 0 },
            ),
            tcp(
                None,
                Some("169.254.169.254"),
                443,
                NonPublicAddress {
                    class: AddressClass::Metadata,
                },
            ),
            tcp(None, Some("10.9.9.9"), 22, AllowedByRule { rule: 1 }),
            tcp(None, Some("10.0.0.5"), 22, DeniedByRule { rule: 2 }),
            tcp(None, Some("::ffff:10.0.0.5"), 22, DeniedByRule { rule: 2 }),
            tcp(None, Some("127.0.0.1"), 8080, AllowedByRule { rule: 3 }),
            tcp(
                None,
                Some("::ffff:127.0.0.1"),
                8080,
                AllowedByRule { rule: 3 },
            ),
            udp(
                None,
                Some("127.0.0.1"),
                53,
                NonPublicAddress {
                    class: AddressClass::Loopback,
                },
            ),
            tcp(
                None,
                Some("::1"),
                8080,
                NonPublicAddress {
                    class: AddressClass::Loopback,
                },
            ),
            tcp(None, Some("fd00:ec2::254"), 80, AllowedByRule { rule: 4 }),
        ],
    );
}

#[test]
fn tls_termination() {
    use DecisionReason::*;
    let public = Some("93.184.216.34");
    let p = policy(
        EgressMode::Allowlist,
        vec![
            // 0
            EgressRule::allow(domain("*.example.com")),
            // 1
            EgressRule::allow(domain("api.example.com"))
                .with_ports([PortRange::single(443)])
                .inspected(),
            // 2
            EgressRule::allow(cidr("10.0.0.0/8")).inspected(),
            // 3
            EgressRule::allow(domain("pinned.example")).passed_through(),
            // 4
            EgressRule::allow(domain("*.both.example")).passed_through(),
            // 5
            EgressRule::allow(domain("mixed.both.example")),
            // 6
            EgressRule::allow(domain("forced.both.example")).passed_through(),
            // 7
            EgressRule::allow(cidr("93.184.216.0/24"))
                .inspected()
                .with_ports([PortRange::single(8443)]),
            // 8
            EgressRule::allow(cidr("1.1.1.0/24")),
        ],
    );
    check(
        &p,
        &[
            // A domain rule terminates by default, with or without `inspect`.
            inspected(tcp(
                Some("www.example.com"),
                public,
                443,
                AllowedByRule { rule: 0 },
            )),
            inspected(tcp(
                Some("api.example.com"),
                public,
                443,
                AllowedByRule { rule: 0 },
            )),
            inspected(tcp(
                Some("api.example.com"),
                public,
                80,
                AllowedByRule { rule: 0 },
            )),
            // UDP never.
            udp(
                Some("api.example.com"),
                public,
                443,
                AllowedByRule { rule: 0 },
            ),
            // `pass_through` on every matching domain rule: SNI only.
            passed_through(tcp(
                Some("pinned.example"),
                public,
                443,
                AllowedByRule { rule: 3 },
            )),
            passed_through(tcp(
                Some("x.both.example"),
                public,
                443,
                AllowedByRule { rule: 4 },
            )),
            passed_through(tcp(
                Some("forced.both.example"),
                public,
                443,
                AllowedByRule { rule: 4 },
            )),
            // One matching domain rule without it is enough to terminate.
            inspected(tcp(
                Some("mixed.both.example"),
                public,
                443,
                AllowedByRule { rule: 4 },
            )),
            // `inspect` on a matching CIDR rule wins over `pass_through`.
            inspected(tcp(
                Some("pinned.example"),
                public,
                8443,
                AllowedByRule { rule: 3 },
            )),
            inspected(tcp(
                Some("api.example.com"),
                Some("10.1.1.1"),
                443,
                AllowedByRule { rule: 2 },
            )),
            inspected(tcp(
                Some("other.example"),
                Some("10.1.1.1"),
                443,
                AllowedByRule { rule: 2 },
            )),
            // Allowed by a CIDR rule alone: any name there is allowed, nothing to check.
            passed_through(tcp(
                Some("other.example"),
                Some("1.1.1.1"),
                443,
                AllowedByRule { rule: 8 },
            )),
            passed_through(tcp(None, Some("1.1.1.1"), 443, AllowedByRule { rule: 8 })),
        ],
    );

    // The denylist default: pass-through, unless deny domain rules could be dodged.
    let open = policy(
        EgressMode::Denylist,
        vec![EgressRule::deny(cidr("1.2.3.0/24"))],
    );
    check(
        &open,
        &[passed_through(tcp(
            Some("any.example"),
            public,
            443,
            AllowedByDefault,
        ))],
    );
    let with_denied_names = policy(
        EgressMode::Denylist,
        vec![
            EgressRule::deny(domain("*.evil.example")),
            EgressRule::allow(domain("pinned.example")).passed_through(),
        ],
    );
    check(
        &with_denied_names,
        &[
            inspected(tcp(Some("any.example"), public, 443, AllowedByDefault)),
            passed_through(tcp(
                Some("pinned.example"),
                public,
                443,
                AllowedByRule { rule: 1 },
            )),
        ],
    );
}

#[test]
fn decision_json() {
    let d = Decision {
        allowed: false,
        inspect: false,
        reason: DecisionReason::DeniedByRule { rule: 2 },
    };
    assert_eq!(
        serde_json::to_value(d).expect("serialises"),
        serde_json::json!({"allowed": false, "inspect": false, "reason": {"kind": "denied_by_rule", "rule": 2}})
    );
    let reason = DecisionReason::NonPublicAddress {
        class: AddressClass::SharedCgnat,
    };
    assert_eq!(
        serde_json::to_value(reason).expect("serialises"),
        serde_json::json!({"kind": "non_public_address", "class": "shared_cgnat"})
    );
    assert_eq!(
        reason.to_string(),
        "shared_cgnat address not allowed by a CIDR rule"
    );
    assert_eq!(
        serde_json::to_value(DecisionReason::ModeNone).expect("serialises"),
        serde_json::json!({"kind": "mode_none"})
    );
}
