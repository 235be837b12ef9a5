//! Tests of domain patterns: parsing, label-by-label matching and serde.

use super::host;
use crate::egress::{DomainPattern, DomainPatternError, HostnameError};

#[test]
fn domain_patterns_parse() {
    let cases: &[(&str, &str, bool)] = &[
        ("example.com", "example.com", false),
        ("Example.COM.", "example.com", false),
        ("*.example.com", "*.example.com", true),
        ("*.Example.Com.", "*.example.com", true),
        ("*.com", "*.com", true),
        ("*.bücher.example", "*.xn--bcher-kva.example", true),
    ];
    for (input, display, wildcard) in cases {
        let p = DomainPattern::parse(input).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(p.to_string(), *display, "{input:?}");
        assert_eq!(p.is_wildcard(), *wildcard, "{input:?}");
        assert_eq!(DomainPattern::parse(&p.to_string()), Ok(p.clone()));
    }
    use DomainPatternError::*;
    let errors: &[(&str, DomainPatternError)] = &[
        ("*", BadWildcard),
        ("**.example.com", BadWildcard),
        ("*example.com", BadWildcard),
        ("*.*.example.com", BadWildcard),
        ("www.*.example.com", BadWildcard),
        ("example.*", BadWildcard),
        ("ex*ample.com", BadWildcard),
        ("*.", Host(HostnameError::Empty)),
        ("*..com", Host(HostnameError::EmptyLabel { index: 0 })),
        ("localhost", Host(HostnameError::SingleLabel)),
        ("*.127.0.0.1", Host(HostnameError::IpLiteral)),
        ("*.1", Host(HostnameError::IpLiteral)),
        (
            "10.0.0.0/8",
            Host(HostnameError::InvalidCharacter { ch: '/' }),
        ),
        (
            "*.\u{ff45}xample.com",
            Host(HostnameError::NotNormalised { index: 0 }),
        ),
        ("", Host(HostnameError::Empty)),
    ];
    for (input, want) in errors {
        assert_eq!(DomainPattern::parse(input).as_ref(), Err(want), "{input:?}");
    }
    // The suffix leaves room for at least one more label.
    let suffix = format!("{0}.{0}.{0}.{1}.com", "a".repeat(63), "b".repeat(55));
    assert_eq!(suffix.len(), 251);
    assert!(DomainPattern::parse(&format!("*.{suffix}")).is_ok());
    let suffix = format!("{0}.{0}.{0}.{1}.com", "a".repeat(63), "b".repeat(56));
    assert_eq!(
        DomainPattern::parse(&format!("*.{suffix}")),
        Err(Host(HostnameError::TooLong { len: 254 }))
    );
}

#[test]
fn domain_patterns_match_by_label() {
    let cases: &[(&str, &str, bool)] = &[
        ("example.com", "example.com", true),
        ("example.com", "www.example.com", false),
        ("www.example.com", "example.com", false),
        ("*.example.com", "example.com", false),
        ("*.example.com", "www.example.com", true),
        ("*.example.com", "a.b.c.example.com", true),
        ("*.example.com", "evilexample.com", false),
        ("*.example.com", "www.evilexample.com", false),
        ("*.example.com", "example.com.evil.net", false),
        ("*.example.com", "www.example.co", false),
        ("*.example.com", "example.org", false),
        ("*.com", "example.com", true),
        ("*.com", "a.example.com", true),
        ("*.com", "example.net", false),
        ("*.bücher.example", "www.xn--bcher-kva.example", true),
        ("*.github.com", "api.github.com", true),
    ];
    for (pattern, name, want) in cases {
        let p = DomainPattern::parse(pattern).expect("pattern");
        assert_eq!(p.matches(&host(name)), *want, "{pattern} vs {name}");
    }
    assert!(DomainPattern::exact(host("Example.com")).matches(&host("example.com")));
}

#[test]
fn domain_pattern_serde() {
    let p: DomainPattern = serde_json::from_str("\"*.Example.com\"").expect("parses");
    assert_eq!(
        serde_json::to_string(&p).expect("serialises"),
        "\"*.example.com\""
    );
    assert!(serde_json::from_str::<DomainPattern>("\"a.*.example.com\"").is_err());
}
