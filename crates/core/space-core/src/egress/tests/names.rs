//! Tests of the names the resolver answers, and of the port coverage they rest on.

use super::{cidr, domain, host, policy};
use crate::egress::names::covers;
use crate::egress::{EgressMode, EgressPolicy, EgressRule, PortRange, Protocol};

#[test]
fn names_the_resolver_answers() {
    let p = |mode, rules| policy(mode, rules);
    let allowlist = p(
        EgressMode::Allowlist,
        vec![
            EgressRule::allow(domain("*.github.com"))
                .with_ports([PortRange::single(443)])
                .with_protocols([Protocol::Tcp]),
            EgressRule::allow(domain("pypi.org")),
            EgressRule::deny(domain("evil.github.com")),
            EgressRule::deny(domain("pypi.org")).with_protocols([Protocol::Udp]),
            EgressRule::allow(cidr("8.8.8.8/32")),
            EgressRule::allow(domain("partial.example")).with_ports([PortRange::single(443)]),
            EgressRule::deny(domain("partial.example")).with_ports([PortRange::new(400, 500)]),
            EgressRule::allow(domain("open.example")).with_ports([PortRange::single(443)]),
            EgressRule::deny(domain("open.example")).with_ports([PortRange::new(1, 442)]),
            EgressRule::deny(cidr("0.0.0.0/0")),
        ],
    );
    let denylist = p(
        EgressMode::Denylist,
        vec![
            EgressRule::deny(domain("*.tiktok.com")),
            EgressRule::deny(domain("smtp.example.com")).with_ports([PortRange::single(25)]),
            EgressRule::deny(domain("tcp.example.com")).with_protocols([Protocol::Tcp]),
            EgressRule::deny(domain("both.example.com")).with_protocols([Protocol::Tcp]),
            EgressRule::deny(domain("both.example.com")).with_protocols([Protocol::Udp]),
            EgressRule::deny(domain("split.example.com"))
                .with_ports([PortRange::new(1, 100), PortRange::new(300, 65535)]),
            EgressRule::deny(domain("split.example.com")).with_ports([PortRange::new(101, 299)]),
            EgressRule::deny(domain("gap.example.com"))
                .with_ports([PortRange::new(1, 100), PortRange::new(102, 65535)]),
        ],
    );
    let none = p(
        EgressMode::None,
        vec![EgressRule::allow(domain("example.com"))],
    );
    let cases: &[(&EgressPolicy, &str, bool)] = &[
        (&allowlist, "api.github.com", true),
        (&allowlist, "github.com", false),
        (&allowlist, "evil.github.com", false),
        (&allowlist, "pypi.org", true),
        (&allowlist, "example.com", false),
        (&allowlist, "partial.example", false),
        (&allowlist, "open.example", true),
        (&denylist, "www.tiktok.com", false),
        (&denylist, "tiktok.com", true),
        (&denylist, "smtp.example.com", true),
        (&denylist, "tcp.example.com", true),
        (&denylist, "both.example.com", false),
        (&denylist, "split.example.com", false),
        (&denylist, "gap.example.com", true),
        (&denylist, "example.com", true),
        (&none, "example.com", false),
        (&EgressPolicy::allow_all_public(), "example.com", true),
        (&EgressPolicy::default(), "example.com", false),
    ];
    for (policy, name, want) in cases {
        assert_eq!(
            policy.allows_name(&host(name)),
            *want,
            "{name} in {:?}",
            policy.mode
        );
    }
}

#[test]
fn port_coverage() {
    type Ranges = &'static [(u32, u32)];
    let cases: &[(Ranges, Ranges, bool)] = &[
        (&[], &[], true),
        (&[], &[(1, 1)], false),
        (&[(1, 65535)], &[(1, 65535)], true),
        (&[(1, 10), (11, 20)], &[(5, 15)], true),
        (&[(11, 20), (1, 10)], &[(1, 20)], true),
        (&[(1, 10), (12, 20)], &[(5, 15)], false),
        (&[(1, 100), (50, 60)], &[(1, 100)], true),
        (&[(5, 9)], &[(1, 4)], false),
        (&[(1, 4)], &[(5, 5)], false),
        (&[(1, 65535)], &[(443, 443), (80, 80)], true),
        (&[(443, 443)], &[(443, 443), (80, 80)], false),
    ];
    for (cover, ranges, want) in cases {
        let mut cover = cover.to_vec();
        assert_eq!(covers(&mut cover, ranges), *want, "{cover:?} {ranges:?}");
    }
}
