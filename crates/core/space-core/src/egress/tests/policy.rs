//! Tests of policy validation and JSON.

use ipnet::{IpNet, Ipv4Net};

use super::{cidr, domain, policy};
use crate::egress::{
    EgressMode, EgressPolicy, EgressPolicyError, EgressRule, PortRange, Protocol, MAX_EGRESS_RULES,
};

#[test]
fn validation_names_the_rule() {
    use EgressPolicyError::*;
    let ok = EgressRule::allow(domain("example.com"));
    let net = |s: &str| s.parse::<IpNet>().expect("net");
    let v4 = |s: &str| s.parse::<Ipv4Net>().expect("net");
    let cases: Vec<(EgressRule, EgressPolicyError)> = vec![
        (ok.clone().with_ports([]), EmptyPorts { rule: 2 }),
        (
            ok.clone().with_ports((1..=65).map(PortRange::single)),
            TooManyPortRanges { rule: 2, count: 65 },
        ),
        (
            ok.clone().with_ports([PortRange::single(0)]),
            InvalidPortRange {
                rule: 2,
                start: 0,
                end: 0,
            },
        ),
        (
            ok.clone()
                .with_ports([PortRange::single(80), PortRange::new(10, 5)]),
            InvalidPortRange {
                rule: 2,
                start: 10,
                end: 5,
            },
        ),
        (ok.clone().with_protocols([]), EmptyProtocols { rule: 2 }),
        (
            EgressRule::deny(domain("example.com")).inspected(),
            InspectOnDeny { rule: 2 },
        ),
        (
            ok.clone().with_protocols([Protocol::Udp]).inspected(),
            InspectWithoutTcp { rule: 2 },
        ),
        (
            ok.clone().inspected().passed_through(),
            PassThroughAndInspect { rule: 2 },
        ),
        (
            EgressRule::deny(domain("example.com")).passed_through(),
            PassThroughWithoutName { rule: 2 },
        ),
        (
            EgressRule::allow(cidr("10.0.0.0/8")).passed_through(),
            PassThroughWithoutName { rule: 2 },
        ),
        (
            ok.clone().with_protocols([Protocol::Udp]).passed_through(),
            PassThroughWithoutTcp { rule: 2 },
        ),
        (
            EgressRule::allow(cidr("10.0.0.1/8")),
            CidrHostBits {
                rule: 2,
                cidr: net("10.0.0.1/8"),
                network: net("10.0.0.0/8"),
            },
        ),
        (
            EgressRule::deny(cidr("2001:db8::1/32")),
            CidrHostBits {
                rule: 2,
                cidr: net("2001:db8::1/32"),
                network: net("2001:db8::/32"),
            },
        ),
        (
            EgressRule::allow(cidr("::ffff:10.0.0.0/104")),
            CidrInsideEmbedding {
                rule: 2,
                cidr: net("::ffff:10.0.0.0/104"),
                ipv4: v4("10.0.0.0/8"),
            },
        ),
        (
            EgressRule::deny(cidr("64:ff9b::a00:0/120")),
            CidrInsideEmbedding {
                rule: 2,
                cidr: net("64:ff9b::a00:0/120"),
                ipv4: v4("10.0.0.0/24"),
            },
        ),
        (
            EgressRule::deny(cidr("::7f00:1/128")),
            CidrInsideEmbedding {
                rule: 2,
                cidr: net("::7f00:1/128"),
                ipv4: v4("127.0.0.1/32"),
            },
        ),
        (
            EgressRule::deny(cidr("2002:a00::/24")),
            CidrInsideEmbedding {
                rule: 2,
                cidr: net("2002:a00::/24"),
                ipv4: v4("10.0.0.0/8"),
            },
        ),
        (
            EgressRule::deny(cidr("2002:a00:1:1::/64")),
            CidrInsideEmbedding {
                rule: 2,
                cidr: net("2002:a00:1:1::/64"),
                ipv4: v4("10.0.0.1/32"),
            },
        ),
    ];
    for (bad, want) in cases {
        let p = EgressPolicy {
            mode: EgressMode::Allowlist,
            rules: vec![ok.clone(), ok.clone(), bad.clone()],
        };
        assert_eq!(p.validate(), Err(want.clone()), "{bad:?}");
        assert!(want.to_string().starts_with("rule 2: "), "{want}");
    }
    // Valid edge cases.
    for good in [
        "::ffff:0:0/96",
        "64:ff9b::/96",
        "2002::/16",
        "::/0",
        "0.0.0.0/0",
        "::1/128",
        "::/128",
        "fd00:ec2::254/128",
        "169.254.169.254/32",
    ] {
        policy(EgressMode::Denylist, vec![EgressRule::deny(cidr(good))]);
    }
    policy(
        EgressMode::Allowlist,
        vec![ok
            .clone()
            .with_ports([PortRange::single(1), PortRange::new(8000, 65535)])
            .with_protocols([Protocol::Tcp, Protocol::Udp])
            .inspected()],
    );
    // Rule count.
    let many = |n| EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: vec![ok.clone(); n],
    };
    assert_eq!(many(MAX_EGRESS_RULES).validate(), Ok(()));
    assert_eq!(
        many(MAX_EGRESS_RULES + 1).validate(),
        Err(TooManyRules {
            count: MAX_EGRESS_RULES + 1
        })
    );
    // Rules are kept (and ignored) in mode none.
    policy(EgressMode::None, vec![ok]);
}

#[test]
fn policy_json_shape() {
    let json = r#"{
        "mode": "allowlist",
        "rules": [
            {"action": "allow", "destination": {"domain": "*.GitHub.com"},
             "ports": [{"start": 443, "end": 443}], "protocols": ["tcp"]},
            {"action": "allow", "destination": {"domain": "pypi.org"}, "inspect": true},
            {"action": "deny", "destination": {"domain": "gist.github.com"}},
            {"action": "allow", "destination": {"cidr": "10.1.0.0/16"},
             "ports": [{"start": 5432, "end": 5432}, {"start": 8000, "end": 8100}]},
            {"action": "deny", "destination": {"cidr": "2001:db8::/32"}, "protocols": ["udp"]}
        ]
    }"#;
    let p: EgressPolicy = serde_json::from_str(json).expect("parses");
    let want = EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: vec![
            EgressRule::allow(domain("*.github.com"))
                .with_ports([PortRange::single(443)])
                .with_protocols([Protocol::Tcp]),
            EgressRule::allow(domain("pypi.org")).inspected(),
            EgressRule::deny(domain("gist.github.com")),
            EgressRule::allow(cidr("10.1.0.0/16"))
                .with_ports([PortRange::single(5432), PortRange::new(8000, 8100)]),
            EgressRule::deny(cidr("2001:db8::/32")).with_protocols([Protocol::Udp]),
        ],
    };
    assert_eq!(p, want);
    let back = serde_json::to_value(&p).expect("serialises");
    assert_eq!(
        back,
        serde_json::json!({
            "mode": "allowlist",
            "rules": [
                {"action": "allow", "destination": {"domain": "*.github.com"},
                 "ports": [{"start": 443, "end": 443}], "protocols": ["tcp"]},
                {"action": "allow", "destination": {"domain": "pypi.org"}, "inspect": true},
                {"action": "deny", "destination": {"domain": "gist.github.com"}},
                {"action": "allow", "destination": {"cidr": "10.1.0.0/16"},
                 "ports": [{"start": 5432, "end": 5432}, {"start": 8000, "end": 8100}]},
                {"action": "deny", "destination": {"cidr": "2001:db8::/32"}, "protocols": ["udp"]}
            ]
        })
    );
    assert_eq!(
        serde_json::from_value::<EgressPolicy>(back).expect("round trip"),
        p
    );

    assert_eq!(
        serde_json::to_value(EgressPolicy::default()).expect("serialises"),
        serde_json::json!({"mode": "none", "rules": []})
    );
    let p: EgressPolicy = serde_json::from_str(r#"{"mode": "denylist"}"#).expect("parses");
    assert_eq!(p, EgressPolicy::allow_all_public());
}

#[test]
fn policy_json_is_validated() {
    let cases: &[(&str, &str)] = &[
        (r#"{"rules": []}"#, "missing field `mode`"),
        (r#"{"mode": "open"}"#, "unknown variant"),
        (r#"{"mode": "none", "extra": 1}"#, "unknown field"),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain": "a.example"}, "inpsect": true}]}"#,
            "unknown field `inpsect`",
        ),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain": "localhost"}}]}"#,
            "single label",
        ),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain": "127.0.0.1"}}]}"#,
            "IP address",
        ),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"cidr": "10.0.0.0/33"}}]}"#,
            "invalid IP address syntax",
        ),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"cidr": "10.0.0.1/8"}}]}"#,
            "rule 0: 10.0.0.1/8 has host bits set; did you mean 10.0.0.0/8?",
        ),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "deny", "destination": {"domain": "a.example"}, "inspect": true}]}"#,
            "rule 0: inspect applies to allow rules only",
        ),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain": "a.example"}, "ports": []}]}"#,
            "rule 0: ports is an empty list",
        ),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain": "a.example"}, "ports": [{"start": 443}]}]}"#,
            "missing field `end`",
        ),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain": "a.example"}, "ports": [{"start": 70000, "end": 70000}]}]}"#,
            "invalid value",
        ),
        (
            r#"{"mode": "allowlist", "rules": [{"action": "allow", "destination": {"domain": "a.example", "cidr": "10.0.0.0/8"}}]}"#,
            "",
        ),
    ];
    for (json, want) in cases {
        let err = serde_json::from_str::<EgressPolicy>(json)
            .expect_err(json)
            .to_string();
        assert!(err.contains(want), "{json}: {err}");
    }
}
