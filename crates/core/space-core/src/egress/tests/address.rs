//! Tests of address classes: single addresses, embedded IPv4 forms and whole networks.

use std::net::IpAddr;

use ipnet::IpNet;

use super::ip;
use crate::egress::address::network_class;
use crate::egress::{address_class, embedded_ipv4, AddressClass};

#[test]
fn address_classes() {
    use AddressClass::*;
    let cases: &[(&str, AddressClass)] = &[
        // IPv4
        ("8.8.8.8", Public),
        ("1.1.1.1", Public),
        ("93.184.216.34", Public),
        ("11.0.0.1", Public),
        ("172.32.0.1", Public),
        ("100.128.0.0", Public),
        ("198.20.0.0", Public),
        ("223.255.255.255", Public),
        ("0.0.0.0", Unspecified),
        ("0.1.2.3", Unspecified),
        ("10.0.0.1", Private),
        ("172.16.0.1", Private),
        ("172.31.255.255", Private),
        ("192.168.0.1", Private),
        ("100.64.0.1", SharedCgnat),
        ("100.127.255.255", SharedCgnat),
        ("100.100.100.200", Metadata),
        ("127.0.0.1", Loopback),
        ("127.255.255.254", Loopback),
        ("169.254.0.1", LinkLocal),
        ("169.254.169.253", LinkLocal),
        ("169.254.169.254", Metadata),
        ("169.254.170.2", Metadata),
        ("192.0.0.1", Reserved),
        ("192.0.0.192", Metadata),
        ("192.0.2.1", Documentation),
        ("198.51.100.1", Documentation),
        ("203.0.113.1", Documentation),
        ("198.18.0.1", Benchmarking),
        ("198.19.255.255", Benchmarking),
        ("192.88.99.1", Reserved),
        ("224.0.0.1", Multicast),
        ("239.255.255.250", Multicast),
        ("240.0.0.1", Reserved),
        ("255.255.255.254", Reserved),
        ("255.255.255.255", Broadcast),
        // IPv6
        ("2606:4700:4700::1111", Public),
        ("2001:4860:4860::8888", Public),
        ("2a00:1450::1", Public),
        ("::", Unspecified),
        ("::1", Loopback),
        ("fc00::1", Private),
        ("fd12:3456::1", Private),
        ("fd00:ec2::253", Private),
        ("fd00:ec2::254", Metadata),
        ("fe80::1", LinkLocal),
        ("febf::1", LinkLocal),
        ("fec0::1", Private),
        ("ff02::1", Multicast),
        ("ff0e::1", Multicast),
        ("2001:db8::1", Documentation),
        ("3fff::1", Documentation),
        ("2001:2::1", Benchmarking),
        ("2001::1", Reserved),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Reserved),
        ("64:ff9b:1::1", Reserved),
        ("100::1", Reserved),
        ("::1:0:0:1", Reserved),
        ("4000::1", Reserved),
        ("5f00::1", Reserved),
        ("e000::1", Reserved),
        ("fe00::1", Reserved),
        // IPv6 embedding IPv4: the class of the IPv4 address.
        ("::ffff:127.0.0.1", Loopback),
        ("::ffff:169.254.169.254", Metadata),
        ("::ffff:10.0.0.1", Private),
        ("::ffff:0.0.0.0", Unspecified),
        ("::ffff:8.8.8.8", Public),
        ("::127.0.0.1", Loopback),
        ("::0.0.0.2", Unspecified),
        ("::8.8.8.8", Public),
        ("::ffff:0:127.0.0.1", Loopback),
        ("64:ff9b::127.0.0.1", Loopback),
        ("64:ff9b::a9fe:a9fe", Metadata),
        ("64:ff9b::100.100.100.200", Metadata),
        ("64:ff9b::8.8.8.8", Public),
        ("2002:7f00:1::1", Loopback),
        ("2002:a9fe:a9fe::1", Metadata),
        ("2002:c0a8:101:1::1", Private),
        ("2002:808:808::1", Public),
    ];
    for (addr, want) in cases {
        assert_eq!(address_class(ip(addr)), *want, "{addr}");
        assert_eq!(
            address_class(ip(addr)).is_public(),
            *want == Public,
            "{addr}"
        );
    }
}

#[test]
fn embedded_ipv4_forms() {
    let cases: &[(&str, Option<&str>)] = &[
        ("::ffff:1.2.3.4", Some("1.2.3.4")),
        ("::1.2.3.4", Some("1.2.3.4")),
        ("::ffff:0:1.2.3.4", Some("1.2.3.4")),
        ("64:ff9b::1.2.3.4", Some("1.2.3.4")),
        ("2002:102:304::5", Some("1.2.3.4")),
        ("2002:102:304:ffff::5", Some("1.2.3.4")),
        ("::", None),
        ("::1", None),
        ("2001:db8::1.2.3.4", None),
        ("64:ff9b:1::1.2.3.4", None),
        ("fd00:ec2::254", None),
    ];
    for (addr, want) in cases {
        let IpAddr::V6(a) = ip(addr) else {
            panic!("{addr}")
        };
        assert_eq!(
            embedded_ipv4(a),
            want.map(|w| w.parse().expect("v4")),
            "{addr}"
        );
    }
}

#[test]
fn network_classes() {
    use AddressClass::*;
    let cases: &[(&str, Option<AddressClass>)] = &[
        ("10.0.0.0/8", Some(Private)),
        ("10.1.2.3/32", Some(Private)),
        ("10.0.0.0/7", None),
        ("0.0.0.0/0", None),
        ("8.0.0.0/8", None),
        ("169.254.0.0/16", Some(LinkLocal)),
        ("169.254.169.0/24", Some(LinkLocal)),
        ("169.254.169.254/32", Some(Metadata)),
        ("100.64.0.0/10", Some(SharedCgnat)),
        ("100.100.100.200/32", Some(Metadata)),
        ("127.0.0.0/8", Some(Loopback)),
        ("0.0.0.0/8", Some(Unspecified)),
        ("::/0", None),
        ("::1/128", Some(Loopback)),
        ("fc00::/7", Some(Private)),
        ("fd00:ec2::254/128", Some(Metadata)),
        ("fd00:ec2::/32", Some(Private)),
        ("fe80::/10", Some(LinkLocal)),
        ("fc00::/6", None),
        ("::ffff:0:0/96", None),
        ("2002::/16", None),
        ("2000::/3", None),
    ];
    for (net, want) in cases {
        let net: IpNet = net.parse().expect("net");
        assert_eq!(network_class(&net), *want, "{net}");
    }
}
