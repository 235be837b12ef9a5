//! The operator's egress ceiling at the API: a policy (a sandbox's, at create or replaced,
//! or a tenant's default) whose rules reach only loopback, private, link-local or metadata
//! addresses or the node's own is refused with `400 egress_beyond_ceiling` naming the rule,
//! and changes nothing; what the operator granted (`--egress-grant`) is accepted. The
//! gateway's own refusal of such destinations is tested on the real kernel in space-net's
//! `tests/uplink.rs`, and from inside a real sandbox against a server on a public-class
//! address of the node (`a_sandbox_cannot_reach_the_nodes_own_public_address`).

use space_core::egress::{EgressMode, EgressPolicy, EgressRule};
use space_core::sandbox::CreateSandboxRequest;
use space_core::ErrorCode;
use test_support::{api_error, TestServer, TEST_TEMPLATE};

fn allowing(cidrs: &[&str]) -> EgressPolicy {
    EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: cidrs
            .iter()
            .map(|c| EgressRule::allow(c.parse::<ipnet::IpNet>().expect("cidr")))
            .collect(),
    }
}

fn with_egress(policy: EgressPolicy) -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        egress: Some(policy),
        ..Default::default()
    }
}

/// One of this host's own addresses that is not loopback (the node's address).
fn node_address() -> Option<std::net::IpAddr> {
    space_net::uplink::interface_addresses()
        .into_iter()
        .find(|a| !a.is_loopback() && a.is_ipv4())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn policies_beyond_the_ceiling_are_refused_and_grants_open_them() {
    let ts = TestServer::start_with(|c| {
        c.node.egress_grants = vec!["10.1.2.0/24".parse().expect("grant")];
    })
    .await;
    let c = &ts.client;
    let refused = |r| {
        let (status, code, message) = api_error(r);
        assert_eq!(
            (status, code),
            (400, ErrorCode::EgressBeyondCeiling),
            "{message}"
        );
        message
    };

    // A tenant default.
    let message = refused(
        c.set_default_egress_policy(Some(&allowing(&["1.2.3.0/24", "127.0.0.1/32"])))
            .await,
    );
    assert!(
        message.contains("rule 1") && message.contains("loopback"),
        "{message}"
    );
    assert!(
        c.default_egress_policy().await.is_err(),
        "no default was stored"
    );

    // A create: nothing is made.
    for cidr in [
        "169.254.169.254/32",
        "10.0.0.0/8",
        "192.168.1.0/24",
        "100.64.0.0/10",
    ] {
        refused(
            c.create_sandbox(&with_egress(allowing(&[cidr])))
                .await
                .map(drop),
        );
    }
    assert!(c
        .list_sandboxes(&[])
        .await
        .expect("list")
        .sandboxes
        .is_empty());

    // Granted, or merely containing forbidden space: accepted.
    let sb = c
        .create_sandbox(&with_egress(allowing(&["10.1.2.3/32", "0.0.0.0/0"])))
        .await
        .expect("a granted network and 0.0.0.0/0 are accepted");

    // Replacing a running sandbox's policy: refused, and the old one stays.
    let mut beyond = vec!["127.0.0.0/8".to_owned()];
    if let Some(addr) = node_address() {
        beyond.push(format!("{addr}/32"));
    }
    for cidr in &beyond {
        let message = refused(
            c.set_egress_policy(&sb.id, &allowing(&[cidr.as_str()]))
                .await
                .map(drop),
        );
        assert!(message.contains("rule 0"), "{cidr}: {message}");
    }
    let kept = c.egress_policy(&sb.id).await.expect("policy");
    assert_eq!(kept, allowing(&["10.1.2.3/32", "0.0.0.0/0"]));
    c.delete_sandbox(sb.id.as_str()).await.expect("delete");
    ts.stop().await;
}

/// A public-class address of this node's own, on its loopback interface for the test's life
/// (no dummy interfaces here; the node reads its addresses when it starts).
struct NodeAddress {
    addr: std::net::Ipv4Addr,
}

fn ip_addr(verb: &str, addr: std::net::Ipv4Addr) -> bool {
    std::process::Command::new("ip")
        .args(["addr", verb, &format!("{addr}/32"), "dev", "lo"])
        .status()
        .is_ok_and(|s| s.success())
}

impl NodeAddress {
    fn add(addr: std::net::Ipv4Addr) -> NodeAddress {
        assert!(ip_addr("add", addr), "ip addr add {addr}/32 dev lo");
        NodeAddress { addr }
    }
}

impl Drop for NodeAddress {
    fn drop(&mut self) {
        let _ = ip_addr("del", self.addr);
    }
}

/// From inside a real sandbox: a policy that allows all of IPv4 on a port (accepted: it is
/// broader than the ceiling) reaches a public address on the internet, but not a server on
/// the node's own public-class address, which the gateway's uplink refuses; the operator's
/// grant opens it. Without the ceiling the first curl would get the page.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_cannot_reach_the_nodes_own_public_address() {
    const PORT: u16 = 18_480;
    let node = NodeAddress::add(std::net::Ipv4Addr::new(11, 9, 9, 9));
    let listener = tokio::net::TcpListener::bind((node.addr, PORT))
        .await
        .expect("a server on the node's address");
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            use tokio::io::AsyncWriteExt;
            let _ = conn
                .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 4\r\n\r\nnode")
                .await;
        }
    });
    let url = format!("http://{}:{PORT}/", node.addr);
    let everything = EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: vec![
            EgressRule::allow("0.0.0.0/0".parse::<ipnet::IpNet>().expect("cidr"))
                .with_ports([space_core::egress::PortRange::single(PORT)]),
        ],
    };

    let ts = TestServer::start().await;
    let sb = ts
        .client
        .create_sandbox(&with_egress(everything.clone()))
        .await
        .expect("0.0.0.0/0 is accepted");
    let out = test_support::shell(
        &ts.client,
        &sb.id,
        &format!("curl -sS -m 5 {url} || echo refused"),
        false,
    )
    .await;
    assert!(out.contains("refused") && !out.contains("node"), "{out}");
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "it got through"
    );
    let _ = ts.client.delete_sandbox(sb.id.as_str()).await;
    ts.stop().await;

    // The operator grants it: an explicit rule for it now reaches the server.
    let granted = format!("{}/32", node.addr);
    let ts = TestServer::start_with(|c| {
        c.node.egress_grants = vec![granted.parse().expect("grant")];
    })
    .await;
    let sb = ts
        .client
        .create_sandbox(&with_egress(allowing(&[granted.as_str()])))
        .await
        .expect("a granted address");
    let out = test_support::shell(&ts.client, &sb.id, &format!("curl -sS -m 5 {url}"), false).await;
    assert!(out.contains("node"), "{out}");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
    let _ = ts.client.delete_sandbox(sb.id.as_str()).await;
    ts.stop().await;
}
