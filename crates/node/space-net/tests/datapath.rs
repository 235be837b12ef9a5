//! The data path on the real kernel: a namespace with its TAP, address and nftables
//! firewall is made and removed; sockets bound inside it live there. Needs root, iproute2
//! and nftables (the test scripts install them).

use space_net::datapath::{netns, GuestLink, SandboxNetwork};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), rand_suffix())
}

fn rand_suffix() -> u32 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
}

fn in_ns(ns: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .expect("run in namespace");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn namespace_with_tap_address_and_firewall_comes_and_goes() {
    let name = unique("spt-dp");
    let net = SandboxNetwork::create(&name, GuestLink::default()).expect("create");
    assert!(netns::exists(&name));

    let links = in_ns(&name, &["ip", "-o", "addr", "show", "dev", "tap0"]);
    assert!(links.contains("10.0.2.1/24"), "{links}");
    // The gateway's MAC is the same in every namespace (restored guests keep it in ARP).
    let tap = in_ns(&name, &["ip", "-o", "link", "show", "dev", "tap0"]);
    assert!(tap.contains("link/ether 02:53:50:00:02:01"), "{tap}");
    let ipv6 = in_ns(&name, &["cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6"]);
    assert_eq!(ipv6.trim(), "1");

    let rules = in_ns(&name, &["nft", "list", "ruleset"]);
    for want in [
        "table netdev space_guest",
        "table inet space_gateway",
        "redirect to :15001",
        "ether saddr != 02:53:50:00:02:0f drop",
        "policy drop",
    ] {
        assert!(rules.contains(want), "missing {want:?} in:\n{rules}");
    }

    // A socket made inside the namespace is bound there (10.0.2.1 exists nowhere else).
    let listener = netns::run_in(&name, || std::net::TcpListener::bind("10.0.2.1:15001"))
        .expect("bind in namespace");
    assert_eq!(
        listener.local_addr().expect("addr").to_string(),
        "10.0.2.1:15001"
    );
    assert!(std::net::TcpListener::bind("10.0.2.1:15001").is_err());
    drop(listener);

    net.destroy().expect("destroy");
    assert!(!netns::exists(&name));
    // Destroying again is fine (idempotent cleanup after a crash).
    net.destroy().expect("destroy twice");
}

#[test]
fn bad_names_are_refused_before_anything_is_made() {
    for bad in ["../etc", "a b", "-x"] {
        assert!(SandboxNetwork::create(bad, GuestLink::default()).is_err());
        assert!(!netns::exists(bad));
    }
}
