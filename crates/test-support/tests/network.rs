//! Sandbox networks on real VMs: every VM runs in a network namespace of its own, the guest
//! is addressed statically, the namespace's firewall refuses spoofed sources, the namespace
//! goes with the sandbox, and the gateway lets out only names the node's policy allows.
//! Policies from the API, TLS interception and credentials: `gateway_credentials.rs`; one
//! test per bypass attempt: `egress_bypass.rs`.

use std::time::Duration;

use space_core::sandbox::{CreateSandboxRequest, SandboxOrigin};
use space_core::SandboxId;
use test_support::internet::{Internet, PAGE};
use test_support::{shell, wait_until, TestServer, TEST_TEMPLATE};

fn request() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    }
}

/// A server whose node goes out through `inet` and allows only `allowed.example`.
async fn server_allowing_one_name(inet: &Internet) -> TestServer {
    use space_core::egress::{DomainPattern, EgressMode, EgressPolicy, EgressRule};
    TestServer::start_with(|c| {
        inet.uplink_of(&mut c.node);
        c.node.egress = EgressPolicy {
            mode: EgressMode::Allowlist,
            rules: vec![EgressRule::allow(
                DomainPattern::parse("allowed.example").expect("pattern"),
            )],
        };
    })
    .await
}

/// Node-made namespaces on this host whose name mentions `vm`.
fn namespaces_of(vm: &str) -> Vec<String> {
    test_support::leaks::sandbox_namespaces()
        .into_iter()
        .filter(|n| n.contains(vm))
        .collect()
}

async fn check_guest_network(ts: &TestServer, id: &SandboxId) {
    let c = &ts.client;
    let out = shell(
        c,
        id,
        "cat /sys/class/net/eth0/address; ip -4 -o addr show dev eth0 | awk '{print $4}'; \
         ip route | grep default; cat /etc/resolv.conf",
        true,
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "02:53:50:00:02:0f", "{out}");
    assert_eq!(lines[1], "10.0.2.15/24", "{out}");
    assert!(lines[2].contains("via 10.0.2.1"), "{out}");
    assert_eq!(lines[3], "nameserver 10.0.2.1", "{out}");

    // From its own address the guest reaches the gateway's proxy port (which answers, or
    // refuses, at once: not a timeout); from a forged address nothing gets through (the
    // namespace's ingress filter drops it: timeout, exit 28).
    let out = shell(
        c,
        id,
        "curl -s -m 3 http://10.0.2.1:15001/ >/dev/null; echo own=$?; \
         ip addr add 10.0.2.99/24 dev eth0; \
         curl -s -m 3 --interface 10.0.2.99 http://10.0.2.1:15001/ >/dev/null; echo forged=$?; \
         ip addr del 10.0.2.99/24 dev eth0",
        true,
    )
    .await;
    assert!(out.contains("own=") && !out.contains("own=28"), "{out}");
    assert!(out.contains("forged=28"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sandboxes_get_their_own_namespace_and_a_static_address() {
    let ts = TestServer::start_with(|c| {
        c.node.sandbox_network = true;
        c.node.pool_size = 1;
    })
    .await;
    let c = &ts.client;

    let first = c.create_sandbox(&request()).await.expect("create");
    assert_eq!(
        first.origin,
        Some(SandboxOrigin::TemplateImage { pooled: false })
    );
    assert_eq!(namespaces_of(first.id.as_str()).len(), 1);
    check_guest_network(&ts, &first.id).await;

    // A pool member has its namespace from the start; the sandbox keeps it.
    wait_until(Duration::from_secs(120), "a pool member", || async {
        let pools = c.pool().await.ok()?;
        (pools.pools.iter().map(|p| p.ready).sum::<usize>() >= 1).then_some(())
    })
    .await;
    let pooled = c.create_sandbox(&request()).await.expect("create");
    assert_eq!(
        pooled.origin,
        Some(SandboxOrigin::TemplateImage { pooled: true })
    );
    check_guest_network(&ts, &pooled.id).await;

    c.delete_sandbox(&first.id).await.expect("delete");
    assert!(
        namespaces_of(first.id.as_str()).is_empty(),
        "the namespace goes with the sandbox"
    );
    c.delete_sandbox(&pooled.id).await.expect("delete");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allowed_names_go_out_through_the_gateway_and_nothing_else_does() {
    let inet = Internet::start();
    let ts = server_allowing_one_name(&inet).await;
    let c = &ts.client;
    let sb = c.create_sandbox(&request()).await.expect("create");

    let out = shell(
        c,
        &sb.id,
        "curl -s -m 10 http://allowed.example/; echo; echo allowed=$?; \
         curl -s -m 10 http://denied.example/ >/dev/null; echo denied=$?; \
         echo literal=$(curl -s -m 10 -o /dev/null -w '%{http_code}' http://11.0.0.1/); \
         echo forged_host=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -H 'Host: allowed.example' http://11.0.0.53/)",
        true,
    )
    .await;
    // The allowed name resolves through the gateway and its page comes back.
    assert!(out.contains(PAGE), "{out}");
    assert!(out.contains("allowed=0"), "{out}");
    // A name the policy does not allow does not even resolve (curl 6).
    assert!(out.contains("denied=6"), "{out}");
    // An IP literal, and an allowed Host towards an address the resolver never gave for it,
    // are refused by the proxy (an error status, or no answer at all; never the page).
    for case in ["literal", "forged_host"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{case}=")))
            .unwrap_or_default();
        assert!(!line.ends_with("=200"), "{case} must be refused: {out}");
    }

    // The gateway outlives a pause: the same VM keeps its resolver, proxy and pins (this
    // request skips DNS and relies on the address the resolver gave before the pause).
    c.pause_sandbox(&sb.id).await.expect("pause");
    c.resume_sandbox(&sb.id).await.expect("resume");
    let again = shell(
        c,
        &sb.id,
        "curl -s -m 10 --resolve allowed.example:80:11.0.0.1 http://allowed.example/",
        true,
    )
    .await;
    assert_eq!(again, PAGE);

    c.delete_sandbox(&sb.id).await.expect("delete");
    ts.stop().await;
    drop(inet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_open_connections_are_capped_by_its_quota() {
    use space_core::quota::TenantQuota;
    let inet = Internet::start();
    let ts = server_allowing_one_name(&inet).await;
    let tenant = "connections";
    let c = ts.new_tenant_client(tenant).await;
    let limit = |n| TenantQuota {
        max_connections: Some(n),
        ..Default::default()
    };
    ts.client
        .set_tenant_quota(tenant, &limit(1))
        .await
        .expect("set the quota");
    let sb = c.create_sandbox(&request()).await.expect("create");
    // One connection that sends nothing holds a slot while the gateway waits for its first
    // bytes; a request made meanwhile is a second open connection of the tenant.
    // (The holder is killed at the end, which gives its slot back.)
    let while_one_is_open =
        "(sleep 15 | curl -s -m 20 telnet://allowed.example:80 & echo $! > /tmp/holder) \
         >/dev/null 2>&1 </dev/null; sleep 3; \
         echo second=$(curl -s -m 5 -o /dev/null -w '%{http_code}' http://allowed.example/); \
         kill $(cat /tmp/holder)";
    let out = shell(&c, &sb.id, while_one_is_open, true).await;
    assert!(out.contains("second=000"), "the tenant's limit is 1: {out}");
    // The operator raises it: the same two connections go.
    ts.client
        .set_tenant_quota(tenant, &limit(2))
        .await
        .expect("raise the quota");
    let out = shell(&c, &sb.id, while_one_is_open, true).await;
    assert!(out.contains("second=200"), "the tenant's limit is 2: {out}");
    c.delete_sandbox(&sb.id).await.expect("delete");
    ts.stop().await;
    drop(inet);
}
