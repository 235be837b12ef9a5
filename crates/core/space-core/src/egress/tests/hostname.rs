//! Tests of host names: canonical spellings, refusals, IP literals, SNI and serde.

use super::host;
use crate::egress::{Hostname, HostnameError, MAX_LABEL_BYTES};

#[test]
fn hostnames_canonicalise() {
    let long_label = "a".repeat(63);
    let long_name = format!("{0}.{0}.{0}.{1}.com", "a".repeat(63), "b".repeat(57));
    assert_eq!(long_name.len(), 253);
    let cases: &[(&str, &str)] = &[
        ("example.com", "example.com"),
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("WWW.Example.Com.", "www.example.com"),
        ("a-b.c-d.example", "a-b.c-d.example"),
        ("r3---sn-abc.googlevideo.com", "r3---sn-abc.googlevideo.com"),
        ("1.2.3.4.nip.io", "1.2.3.4.nip.io"),
        ("0x7f.example.com", "0x7f.example.com"),
        ("123.example", "123.example"),
        ("bücher.example", "xn--bcher-kva.example"),
        ("Bücher.Example.", "xn--bcher-kva.example"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("XN--BCHER-KVA.EXAMPLE.", "xn--bcher-kva.example"),
        ("münchen.de", "xn--mnchen-3ya.de"),
        ("faß.de", "xn--fa-hia.de"),
        ("例え.jp", "xn--r8jz45g.jp"),
        ("www.例え.jp", "www.xn--r8jz45g.jp"),
        ("\u{1F4A9}.la", "xn--ls8h.la"),
        // A Cyrillic look-alike is accepted as the different name it is.
        ("\u{0435}xample.com", "xn--xample-2of.com"),
    ];
    for (input, want) in cases {
        assert_eq!(host(input).as_str(), *want, "{input:?}");
    }
    assert_eq!(host(&format!("{long_label}.com")).as_str().len(), 67);
    assert_eq!(host(&long_name).as_str(), long_name);
    assert_eq!(host(&format!("{long_name}.")).as_str(), long_name);
}

#[test]
fn hostnames_are_refused() {
    use HostnameError::*;
    let label64 = format!("{}.com", "a".repeat(64));
    let name254 = format!("{0}.{0}.{0}.{1}.com", "a".repeat(63), "b".repeat(58));
    let huge = "a.".repeat(600);
    let long_unicode = format!("{}.example", "ü".repeat(60));
    let cases: &[(&str, HostnameError)] = &[
        ("", Empty),
        (".", Empty),
        ("example..com", EmptyLabel { index: 1 }),
        (".example.com", EmptyLabel { index: 0 }),
        ("example.com..", EmptyLabel { index: 2 }),
        ("exa\0mple.com", ControlCharacter { code: 0 }),
        ("example.com\0", ControlCharacter { code: 0 }),
        ("example.com\n", ControlCharacter { code: 0x0a }),
        ("exa\tmple.com", ControlCharacter { code: 0x09 }),
        ("example.com\u{85}", ControlCharacter { code: 0x85 }),
        ("exa mple.com", Whitespace { code: 0x20 }),
        (" example.com", Whitespace { code: 0x20 }),
        ("\u{a0}example.com", Whitespace { code: 0xa0 }),
        ("example\u{3000}.com", Whitespace { code: 0x3000 }),
        ("example\u{3002}com", NonAsciiDot { code: 0x3002 }),
        ("example\u{ff0e}com", NonAsciiDot { code: 0xff0e }),
        ("example\u{ff61}com", NonAsciiDot { code: 0xff61 }),
        ("exam_ple.com", InvalidCharacter { ch: '_' }),
        ("_dmarc.example.com", InvalidCharacter { ch: '_' }),
        ("example.com:443", InvalidCharacter { ch: ':' }),
        ("user@example.com", InvalidCharacter { ch: '@' }),
        ("exa%2fmple.com", InvalidCharacter { ch: '%' }),
        ("example.com/x", InvalidCharacter { ch: '/' }),
        ("*.example.com", InvalidCharacter { ch: '*' }),
        ("[::1]:443", InvalidCharacter { ch: '[' }),
        ("-example.com", HyphenAtLabelEdge { index: 0 }),
        ("example-.com", HyphenAtLabelEdge { index: 0 }),
        ("example.-com", HyphenAtLabelEdge { index: 1 }),
        (&label64, LabelTooLong { index: 0, len: 64 }),
        (&name254, TooLong { len: 254 }),
        (&huge, TooLong { len: 1200 }),
        ("localhost", SingleLabel),
        ("localhost.", SingleLabel),
        ("metadata", SingleLabel),
        ("com", SingleLabel),
        ("xn--bcher-kva", SingleLabel),
        // IDN: mapping must change nothing but the encoding.
        ("\u{ff45}xample.com", NotNormalised { index: 0 }),
        (
            "\u{ff25}\u{ff38}\u{ff21}\u{ff2d}\u{ff30}\u{ff2c}\u{ff25}.com",
            NotNormalised { index: 0 },
        ),
        ("example.\u{ff43}om", NotNormalised { index: 1 }),
        ("\u{212a}ey.com", NotNormalised { index: 0 }),
        ("ex\u{ad}ample.com", NotNormalised { index: 0 }),
        ("ex\u{200b}ample.com", NotNormalised { index: 0 }),
        ("\u{fb01}le.example", NotNormalised { index: 0 }),
        ("BÜCHER.example", NotNormalised { index: 0 }),
        ("bu\u{308}cher.example", NotNormalised { index: 0 }),
        (
            "\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}",
            NotNormalised { index: 0 },
        ),
        ("\u{ff11}\u{ff12}\u{ff17}.0.0.1", IpLiteral),
        // IDNA refusals.
        ("xn--a.example", Idna { index: 0 }),
        ("xn--zzzzzzzzzzzzzzzzzzzz9999.example", Idna { index: 0 }),
        ("\u{5d0}a.example", Idna { index: 0 }),
        ("a\u{200d}b.example", Idna { index: 0 }),
        ("ab--\u{fc}.example", Idna { index: 0 }),
        ("b\u{fc}cher\u{202e}.example", Idna { index: 0 }),
        ("1.\u{5d0}\u{5d1}.example", IdnaName),
        (&long_unicode, LabelTooLong { index: 0, len: 0 }),
    ];
    for (input, want) in cases {
        let got = Hostname::parse(input);
        match (want, &got) {
            // The exact length of a long A-label does not matter.
            (LabelTooLong { index, len: 0 }, Err(LabelTooLong { index: i, len })) => {
                assert_eq!(index, i, "{input:?}");
                assert!(*len > MAX_LABEL_BYTES, "{input:?}");
            }
            _ => assert_eq!(got.as_ref(), Err(want), "{input:?}"),
        }
    }
}

#[test]
fn an_a_label_of_an_unnormalised_name_is_refused() {
    // The Punycode of a full-width spelling: valid Punycode, but not a valid U-label.
    let fullwidth = idna::punycode::encode_str("\u{ff45}xample").expect("encodes");
    let input = format!("xn--{fullwidth}.com");
    assert_eq!(
        Hostname::parse(&input),
        Err(HostnameError::Idna { index: 0 })
    );
    // Punycode of a pure ASCII label ends in a hyphen: refused too.
    assert!(Hostname::parse("xn--example-.com").is_err());
}

#[test]
fn look_alikes_never_fold_into_another_name() {
    for input in [
        "\u{ff45}xample.com",
        "ex\u{ad}ample.com",
        "ex\u{200b}ample.com",
        "ex\u{200c}ample.com",
        "\u{212a}ey.example.com",
        "e\u{301}xample.com",
        "\u{0435}xample.com",
        "exampl\u{0435}.com",
        "example\u{3002}com",
        "EXAMPLE\u{ff0e}COM",
        "\u{1d41e}xample.com",
        "example.c\u{1d428}m",
    ] {
        if let Ok(h) = Hostname::parse(input) {
            assert_ne!(h.as_str(), "example.com", "{input:?}");
            assert!(
                h.labels().any(|l| l.starts_with("xn--")),
                "{input:?} became the ASCII name {h}"
            );
        }
    }
}

#[test]
fn ip_literals_are_refused() {
    for input in [
        "127.0.0.1",
        "127.0.0.1.",
        "127.1",
        "127.0.1",
        "0x7f.0.0.1",
        "0x7F.1",
        "0x7f000001",
        "0X7F000001",
        "2130706433",
        "0177.0.0.1",
        "017700000001",
        "1.2.3.0x4",
        "1.2.3.0x",
        "169.254.169.254",
        "example.0x10",
        "example.123",
        "::1",
        "[::1]",
        "[::1].",
        "::ffff:127.0.0.1",
        "[::ffff:169.254.169.254]",
        "fe80::1%eth0",
        "[fe80::1%25eth0]",
        "fd00:ec2::254",
    ] {
        assert_eq!(
            Hostname::parse(input),
            Err(HostnameError::IpLiteral),
            "{input:?}"
        );
    }
    // A last label that only starts like a number is a name.
    assert_eq!(host("example.0xgg").as_str(), "example.0xgg");
    assert_eq!(host("example.1a").as_str(), "example.1a");
}

#[test]
fn sni_is_ascii_without_trailing_dot() {
    use HostnameError::*;
    let cases: &[(&[u8], Result<&str, HostnameError>)] = &[
        (b"example.com", Ok("example.com")),
        (b"API.Example.COM", Ok("api.example.com")),
        (b"xn--bcher-kva.example", Ok("xn--bcher-kva.example")),
        (b"example.com.", Err(SniTrailingDot)),
        ("b\u{fc}cher.example".as_bytes(), Err(SniNotAscii)),
        ("\u{ff45}xample.com".as_bytes(), Err(SniNotAscii)),
        (b"\xff\xfe", Err(SniNotAscii)),
        (b"", Err(Empty)),
        (b"exa\0mple.com", Err(ControlCharacter { code: 0 })),
        (b"example.com\0", Err(ControlCharacter { code: 0 })),
        (b"127.0.0.1", Err(IpLiteral)),
        (b"localhost", Err(SingleLabel)),
        (b"exa mple.com", Err(Whitespace { code: 0x20 })),
        (b"xn--a.example", Err(Idna { index: 0 })),
    ];
    for (input, want) in cases {
        let got = Hostname::from_sni(input);
        assert_eq!(
            got.as_ref().map(Hostname::as_str).map_err(Clone::clone),
            want.clone(),
            "{input:?}"
        );
    }
}

#[test]
fn hostname_serde() {
    let h: Hostname = serde_json::from_str("\"B\u{fc}cher.Example.\"").expect("parses");
    assert_eq!(h.as_str(), "xn--bcher-kva.example");
    assert_eq!(
        serde_json::to_string(&h).expect("serialises"),
        "\"xn--bcher-kva.example\""
    );
    for bad in [
        "\"127.0.0.1\"",
        "\"exa\\u0000mple.com\"",
        "\"localhost\"",
        "42",
    ] {
        assert!(serde_json::from_str::<Hostname>(bad).is_err(), "{bad}");
    }
    assert_eq!(host("Example.com").to_string(), "example.com");
    assert_eq!(
        "www.example.com"
            .parse::<Hostname>()
            .map(|h| h.labels().count()),
        Ok(3)
    );
}
