//! The operator's egress ceiling at the API: a policy (a sandbox's, at create or replaced,
//! or a tenant's default) whose rules reach only loopback, private, link-local or metadata
//! addresses or the node's own is refused with `400 egress_beyond_ceiling` naming the rule,
//! and changes nothing; what the operator granted (`--egress-grant`) is accepted. The
//! gateway's own refusal of such destinations is tested on the real kernel in space-net's
//! `tests/uplink.rs`.

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
