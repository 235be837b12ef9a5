//! The egress gateway driven through the API, from inside real sandboxes against the stand-in
//! internet (`test_support::internet`): per-sandbox and tenant-default egress policies
//! (changed while the sandbox runs), the sandbox CA the guest trusts for intercepted TLS, and
//! credentials injected on the way out that never reach the guest — not its output, not its
//! memory, not its disk — with every decision in the audit log.

use std::path::Path;

use serde_json::json;
use space_cli::client::SpaceClient;
use space_control::api::credentials::{CredentialInfo, CredentialRequest, CredentialScope};
use space_core::egress::{DomainPattern, EgressMode, EgressPolicy, EgressRule};
use space_core::sandbox::{CreateSandboxRequest, CreateSnapshotRequest};
use space_core::{SandboxId, SnapshotKind};
use test_support::internet::{Internet, PAGE};
use test_support::{shell, TestServer, TEST_TEMPLATE};

/// A node whose gateways go out into `inet` and trust its CA; node default policy: none.
async fn server(inet: &Internet) -> TestServer {
    TestServer::start_with(|c| inet.uplink_of(&mut c.node)).await
}

/// Allows exactly `names` (their TLS terminated by the gateway: the default for domain rules).
fn allow(names: &[&str]) -> EgressPolicy {
    EgressPolicy {
        mode: EgressMode::Allowlist,
        rules: names
            .iter()
            .map(|n| EgressRule::allow(DomainPattern::parse(n).expect("pattern")))
            .collect(),
    }
}

async fn sandbox(c: &SpaceClient, egress: Option<EgressPolicy>) -> SandboxId {
    let req = CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        egress,
        ..Default::default()
    };
    c.create_sandbox(&req).await.expect("create").id
}

/// `curl`'s exit code and body for `url` from inside the sandbox (extra curl flags first).
async fn curl(c: &SpaceClient, id: &SandboxId, flags: &str, url: &str) -> (i32, String) {
    let out = shell(
        c,
        id,
        &format!("curl -s -m 10 {flags} {url}; code=$?; echo; echo \"exit=$code\""),
        true,
    )
    .await;
    let (body, code) = out.trim_end().rsplit_once("exit=").unwrap_or((&out, "?"));
    (
        code.trim().parse().unwrap_or(-1),
        body.trim_end().to_owned(),
    )
}

/// The issuer of the certificate the guest sees for `allowed.example:443`.
async fn issuer(c: &SpaceClient, id: &SandboxId) -> String {
    shell(
        c,
        id,
        "echo | openssl s_client -connect allowed.example:443 -servername allowed.example 2>/dev/null \
         | openssl x509 -noout -issuer",
        true,
    )
    .await
}

async fn checkpoint(c: &SpaceClient, id: &SandboxId) {
    let req = CreateSnapshotRequest {
        kind: SnapshotKind::Checkpoint,
        label: None,
        persistent: false,
    };
    c.create_snapshot(id, &req).await.expect("checkpoint");
}

const SECRET: &str = "sk-live-7c1e9a3b5d2f4e6a8b0c";

fn bearer(name: &str, host: &str, value: &str) -> CredentialRequest {
    CredentialRequest {
        name: name.into(),
        scope: CredentialScope::Tenant,
        rule: serde_json::from_value(json!({
            "hosts": [host],
            "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
        }))
        .expect("rule"),
        expires_at_ms: None,
        value: value.into(),
    }
}

/// The tenant credential `api` ([`SECRET`] for allowed.example), then a sandbox allowed
/// to reach allowed.example.
async fn sandbox_with_api_credential(c: &SpaceClient) -> (CredentialInfo, SandboxId) {
    let cred = c
        .create_credential(&bearer("api", "allowed.example", SECRET))
        .await
        .expect("credential");
    (cred, sandbox(c, Some(allow(&["allowed.example"]))).await)
}

/// The `Authorization` headers the internet's web servers received, in order.
fn authorizations(inet: &Internet) -> Vec<String> {
    inet.requests()
        .into_iter()
        .filter_map(|r| r.authorization)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sandbox_policies_come_from_the_api_and_change_while_it_runs() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;

    // The tenant's default applies to a sandbox whose request names no policy.
    c.set_default_egress_policy(Some(&allow(&["tenant.example"])))
        .await
        .expect("set default");
    let by_default = sandbox(c, None).await;
    assert_eq!(
        c.egress_policy(&by_default).await.expect("get"),
        allow(&["tenant.example"])
    );
    assert_eq!(
        curl(c, &by_default, "", "http://tenant.example/").await,
        (0, PAGE.into())
    );
    assert_eq!(
        curl(c, &by_default, "", "http://allowed.example/").await.0,
        6
    );

    // The request's own policy wins over the default; an update applies at once.
    let own = sandbox(c, Some(allow(&["allowed.example"]))).await;
    assert_eq!(
        curl(c, &own, "", "http://allowed.example/").await,
        (0, PAGE.into())
    );
    assert_eq!(curl(c, &own, "", "http://other.example/").await.0, 6);
    c.set_egress_policy(&own, &allow(&["other.example"]))
        .await
        .expect("update");
    assert_eq!(
        curl(c, &own, "", "http://other.example/").await,
        (0, PAGE.into())
    );
    // The old name no longer resolves, and its address, pinned before the update, is
    // refused too: the proxy asks the new policy on every connection.
    assert_eq!(curl(c, &own, "", "http://allowed.example/").await.0, 6);
    let (code, body) = curl(
        c,
        &own,
        "--resolve allowed.example:80:11.0.0.1",
        "http://allowed.example/",
    )
    .await;
    assert!(
        code != 0 || body != PAGE,
        "a pinned name of the old policy: {code} {body}"
    );
    // The update survives a restart of the VM (it is in the record).
    c.stop_sandbox(&own).await.expect("stop");
    c.start_sandbox(&own).await.expect("start");
    assert_eq!(
        curl(c, &own, "", "http://other.example/").await,
        (0, PAGE.into())
    );
    ts.stop().await;
    drop(inet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_guest_trusts_its_sandbox_ca_for_intercepted_tls() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    let id = sandbox(c, Some(allow(&["allowed.example"]))).await;

    // No --cacert: the guest's own trust store has the sandbox CA, which signed the leaf.
    assert_eq!(
        curl(c, &id, "", "https://allowed.example/").await,
        (0, PAGE.into())
    );
    let first = issuer(c, &id).await;
    assert!(first.contains(&format!("SPACE sandbox {id}")), "{first}");
    // Python's requests and Node.js read their own bundles: they are pointed at the system one.
    let env = shell(
        c,
        &id,
        "echo $SSL_CERT_FILE $REQUESTS_CA_BUNDLE $NODE_EXTRA_CA_CERTS",
        true,
    )
    .await;
    assert!(env.contains("/etc/ssl/certs/ca-certificates.crt"), "{env}");

    // The same CA after a cold restart (the guest's trust store is on its disk) and in a fork.
    c.stop_sandbox(&id).await.expect("stop");
    c.start_sandbox(&id).await.expect("start");
    assert_eq!(issuer(c, &id).await, first);
    let children = c
        .fork(
            &id,
            &space_core::sandbox::ForkRequest {
                count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("fork");
    let child = &children.sandboxes[0].id;
    assert_eq!(
        curl(c, child, "", "https://allowed.example/").await,
        (0, PAGE.into())
    );
    assert_eq!(issuer(c, child).await, first);
    ts.stop().await;
    drop(inet);
}

/// Every file under `dir` holding `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    use std::io::Read;
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            let Ok(mut f) = std::fs::File::open(&p) else {
                continue;
            };
            // Streamed with an overlap, so a needle across two chunks is found too.
            let mut buf = vec![0u8; 1 << 20];
            let mut carry: Vec<u8> = Vec::new();
            loop {
                let n = f.read(&mut buf).unwrap_or(0);
                if n == 0 {
                    break;
                }
                carry.extend_from_slice(&buf[..n]);
                if carry.windows(needle.len()).any(|w| w == needle) {
                    hits.push(p.clone());
                    break;
                }
                let keep = carry.len().min(needle.len() - 1);
                carry.drain(..carry.len() - keep);
            }
        }
    }
    hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_credential_is_injected_and_never_enters_the_guest() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    let (cred, id) = sandbox_with_api_credential(c).await;

    // The guest sends its own (fake) token: it is stripped and the real one injected.
    let (code, body) = curl(
        c,
        &id,
        "-H 'Authorization: Bearer guest-made-this-up'",
        "https://allowed.example/",
    )
    .await;
    assert_eq!((code, body.as_str()), (0, PAGE));
    assert_eq!(authorizations(&inet), vec![format!("Bearer {SECRET}")]);

    // Nothing of the value in the guest: not in what it received, not in its memory (a
    // full checkpoint), not on its disk.
    let everything = shell(
        c,
        &id,
        "env; cat /etc/ssl/certs/ca-certificates.crt | tail -3",
        true,
    )
    .await;
    assert!(!everything.contains(SECRET));
    checkpoint(c, &id).await;
    let node = &ts.server().local_node();
    let store = node.store();
    let mut searched = vec![store.sandbox_dir(&id), store.snapshots_dir(&id)];
    searched.dedup();
    for dir in &searched {
        assert!(dir.exists(), "{}", dir.display());
        assert_eq!(
            files_containing(dir, SECRET.as_bytes()),
            Vec::<std::path::PathBuf>::new(),
            "the secret is in the sandbox's files"
        );
    }
    // The search itself works: the checkpoint does hold what the guest wrote in memory.
    let marker = "space-memory-marker-5b8e21";
    shell(
        c,
        &id,
        &format!("echo {marker} > /dev/shm/m; cat /dev/shm/m >/dev/null"),
        true,
    )
    .await;
    checkpoint(c, &id).await;
    assert!(!files_containing(&store.snapshots_dir(&id), marker.as_bytes()).is_empty());

    // The audit log names the sandbox, the credential and the host, never the value.
    let audit = c
        .credential_audit(Some(id.as_str()), None, None, None)
        .await
        .expect("audit");
    let text = serde_json::to_string(&audit).expect("json");
    assert!(!text.contains(SECRET));
    assert!(
        audit
            .events
            .iter()
            .any(
                |e| e.credential_id.as_ref().map(|c| c.as_str()) == Some(cred.id.as_str())
                    && e.host == "allowed.example"
                    && e.decision == space_secrets::AuditDecision::Allow
            ),
        "{text}"
    );
    ts.stop().await;
    drop(inet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trace_towards_a_credential_host_is_refused() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    let (_, id) = sandbox_with_api_credential(c).await;
    // TRACE would echo the injected header back into the guest.
    let (code, body) = curl(
        c,
        &id,
        "-X TRACE -w ' status=%{http_code}'",
        "https://allowed.example/echo",
    )
    .await;
    assert!(body.ends_with("status=403"), "{code} {body}");
    assert!(body.contains("TRACE is refused"), "{body}");
    assert!(!body.contains(SECRET));
    // A guest refused in a loop: the first refusal is written, the rest are counted into
    // one line (a guest cannot flood its tenant's decision log).
    shell(
        c,
        &id,
        "for i in $(seq 30); do curl -s -o /dev/null -X TRACE https://allowed.example/echo; done",
        true,
    )
    .await;
    assert!(inet.requests().iter().all(|r| r.method != "TRACE"));
    let audit = c
        .credential_audit(Some(id.as_str()), None, None, None)
        .await
        .expect("audit");
    let traces: Vec<_> = audit
        .events
        .iter()
        .filter(|e| e.method == "TRACE")
        .map(|e| e.repeated)
        .collect();
    assert_eq!(traces, vec![Some(30), None], "{audit:?}");
    ts.stop().await;
    drop(inet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cleartext_http_to_a_host_whose_credential_requires_tls_is_refused() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    let (_, id) = sandbox_with_api_credential(c).await;
    let (_, body) = curl(
        c,
        &id,
        "-w ' status=%{http_code}'",
        "http://allowed.example/",
    )
    .await;
    assert!(body.ends_with("status=403"), "{body}");
    assert!(
        authorizations(&inet).is_empty(),
        "nothing went out with the credential"
    );
    let audit = c
        .credential_audit(Some(id.as_str()), None, None, None)
        .await
        .expect("audit");
    assert!(
        audit
            .events
            .iter()
            .any(|e| e.decision == space_secrets::AuditDecision::Deny),
        "{audit:?}"
    );
    ts.stop().await;
    drop(inet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_rate_limit_and_scope_are_enforced_from_the_guest() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    let id = sandbox(
        c,
        Some(allow(&[
            "allowed.example",
            "limited.example",
            "expired.example",
        ])),
    )
    .await;
    // Scope: a sandbox-scoped credential wins over the tenant's of the same name.
    c.create_credential(&bearer("api", "allowed.example", "tenant-wide-value-000"))
        .await
        .expect("tenant credential");
    let mut mine = bearer("api", "allowed.example", "this-sandbox-value-111");
    mine.scope = CredentialScope::Sandbox {
        sandbox: id.clone(),
    };
    c.create_credential(&mine)
        .await
        .expect("sandbox credential");
    assert_eq!(
        curl(c, &id, "", "https://allowed.example/").await,
        (0, PAGE.into())
    );
    assert_eq!(
        authorizations(&inet).last().map(String::as_str),
        Some("Bearer this-sandbox-value-111")
    );

    // Rate limit: one request a minute; the second is refused before it leaves.
    let mut limited = bearer("limited", "limited.example", "limited-value-222");
    limited.rule = serde_json::from_value(json!({
        "hosts": ["limited.example"],
        "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
        "rate_limit": {"requests": 1, "per_secs": 60},
    }))
    .expect("rule");
    c.create_credential(&limited).await.expect("limited");
    let status = "-o /dev/null -w '%{http_code}'";
    assert_eq!(
        curl(c, &id, status, "https://limited.example/").await.1,
        "200"
    );
    assert_eq!(
        curl(c, &id, status, "https://limited.example/").await.1,
        "403"
    );

    // Expiry: a credential past its expiry is refused, not silently left out.
    let mut expired = bearer("old", "expired.example", "expired-value-333");
    let now = space_control::db::now_ms();
    expired.expires_at_ms = Some(now + 1_500);
    c.create_credential(&expired).await.expect("expired");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(
        curl(c, &id, status, "https://expired.example/").await.1,
        "403"
    );
    let seen = authorizations(&inet);
    assert_eq!(
        seen.iter().filter(|a| a.contains("limited-value")).count(),
        1,
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|a| a.contains("expired-value")),
        "{seen:?}"
    );
    ts.stop().await;
    drop(inet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateways_come_back_with_their_policy_and_ca_after_a_node_restart() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let id = sandbox(&ts.client, Some(allow(&["allowed.example"]))).await;
    let before = issuer(&ts.client, &id).await;

    // The VMs keep running while the node is down; the new node re-adopts them and opens
    // their gateways again, with the sandbox's policy and CA from its record and CA file.
    let (dir, config) = ts.stop_keep_vms().await;
    let ts = TestServer::start_on(dir, config).await;
    let c = &ts.client;
    assert_eq!(
        curl(c, &id, "", "https://allowed.example/").await,
        (0, PAGE.into())
    );
    assert_eq!(issuer(c, &id).await, before);
    assert_eq!(curl(c, &id, "", "http://other.example/").await.0, 6);
    c.set_egress_policy(&id, &allow(&["other.example"]))
        .await
        .expect("update after restart");
    assert_eq!(
        curl(c, &id, "", "http://other.example/").await,
        (0, PAGE.into())
    );
    ts.stop().await;
    drop(inet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_placeholder_in_the_guest_env_becomes_the_value_only_towards_its_host() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    let mut cred = bearer("API_TOKEN", "allowed.example", SECRET);
    cred.rule = serde_json::from_value(json!({
        "hosts": ["allowed.example"],
        "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
        "placeholder": true,
    }))
    .expect("rule");
    c.create_credential(&cred).await.expect("credential");
    let id = sandbox(c, Some(allow(&["allowed.example", "other.example"]))).await;

    // SDKs that insist on a key in their environment find one; it is not the value.
    let env = shell(c, &id, "echo $API_TOKEN", false).await;
    assert!(env.trim().starts_with("space-placeholder-"), "{env}");
    assert!(!env.contains(SECRET));
    // Towards its host the gateway replaces it with the value…
    let (code, body) = curl(
        c,
        &id,
        "-H \"Authorization: Bearer $API_TOKEN\"",
        "https://allowed.example/",
    )
    .await;
    assert_eq!((code, body.as_str()), (0, PAGE));
    assert_eq!(authorizations(&inet), vec![format!("Bearer {SECRET}")]);
    // …but only where its rule injects it: in another header, or in the query, of a
    // request to its own host's echo endpoint (which would hand the secret back), it is
    // refused and nothing is forwarded.
    let seen = inet.requests().len();
    for args in [
        "-H \"Authorization: Bearer $API_TOKEN\" -H \"X-Echo: $API_TOKEN\"",
        "-H \"Authorization: Bearer $API_TOKEN\" -G --data-urlencode \"q=$API_TOKEN\"",
    ] {
        let (_, body) = curl(
            c,
            &id,
            &format!("{args} -o /dev/null -w '%{{http_code}}'"),
            "https://allowed.example/echo",
        )
        .await;
        assert_eq!(body, "403", "{args}");
    }
    assert_eq!(inet.requests().len(), seen, "nothing went upstream");
    // …and towards any other host a request carrying it is refused, not forwarded.
    let (_, body) = curl(
        c,
        &id,
        "-H \"X-Key: $API_TOKEN\" -o /dev/null -w '%{http_code}'",
        "http://other.example/",
    )
    .await;
    assert_eq!(body, "403", "a placeholder towards another host");
    assert_eq!(authorizations(&inet).len(), 1);
    ts.stop().await;
    drop(inet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allowed_names_work_over_http_https_passed_through_or_terminated_and_http2() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    // allowed.example asks for pass-through; inspected.example is terminated (the default).
    let mut policy = allow(&["inspected.example"]);
    policy.rules.push(
        EgressRule::allow(DomainPattern::parse("allowed.example").expect("pattern"))
            .passed_through(),
    );
    let id = sandbox(c, Some(policy)).await;
    // Pass-through TLS ends at the internet's server: the guest verifies it with that CA.
    c.write_file(
        &id,
        "/tmp/inet-ca.pem",
        Some("root"),
        None,
        inet.ca_pem().to_owned(),
    )
    .await
    .expect("write CA");
    let version = "-o /dev/null -w '%{http_code} %{http_version}'";
    for (flags, url, want) in [
        ("", "http://allowed.example/", "200 1.1"),
        (
            "--http1.1 --cacert /tmp/inet-ca.pem",
            "https://allowed.example/",
            "200 1.1",
        ),
        (
            "--http2 --cacert /tmp/inet-ca.pem",
            "https://allowed.example/",
            "200 2",
        ),
        ("--http1.1", "https://inspected.example/", "200 1.1"),
        ("--http2", "https://inspected.example/", "200 2"),
    ] {
        let (code, out) = curl(c, &id, &format!("{flags} {version}"), url).await;
        assert_eq!((code, out.as_str()), (0, want), "{flags} {url}");
    }
    // Pass-through really is: the guest saw the internet's certificate, not a sandbox leaf.
    let seen = issuer(c, &id).await;
    assert!(!seen.contains("SPACE sandbox"), "{seen}");
    ts.stop().await;
    drop(inet);
}

/// UDP datagrams the guest's kernel has received (`/proc/net/snmp`, `Udp: InDatagrams`).
async fn udp_datagrams_in(c: &SpaceClient, id: &SandboxId) -> u64 {
    let out = shell(c, id, "grep '^Udp: [0-9]' /proc/net/snmp", true).await;
    out.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no UDP counters in {out:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn udp_leaves_only_to_addresses_a_cidr_rule_allows() {
    use space_core::egress::{Destination, PortRange, Protocol};
    use test_support::internet::Listener;
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    // curl's TFTP client is the guest's UDP client (it times out: the internet's UDP 443
    // echoes the request, which is no TFTP answer). What left is counted by the internet,
    // what came back by the guest's kernel.
    // A name allows no UDP, not even to its own address.
    let id = sandbox(c, Some(allow(&["allowed.example"]))).await;
    let before = udp_datagrams_in(c, &id).await;
    assert_eq!(
        curl(c, &id, "-m 3", "tftp://11.0.0.1:443/probe").await.0,
        28
    );
    assert_eq!(inet.hits(Listener::Quic), 0);
    assert_eq!(udp_datagrams_in(c, &id).await, before);

    // A CIDR rule for UDP 443 opens exactly that, live: out, and the echo back in.
    let mut policy = allow(&["allowed.example"]);
    policy.rules.push(
        EgressRule::allow(Destination::Cidr("11.0.0.1/32".parse().expect("cidr")))
            .with_protocols([Protocol::Udp])
            .with_ports([PortRange {
                start: 443,
                end: 443,
            }]),
    );
    c.set_egress_policy(&id, &policy).await.expect("update");
    curl(c, &id, "-m 3", "tftp://11.0.0.1:443/probe").await;
    let hits = inet.hits(Listener::Quic);
    assert!(hits > 0, "the datagram went out");
    let echoed = udp_datagrams_in(c, &id).await;
    assert!(echoed > before, "the echo came back from 11.0.0.1:443");

    // Another port or address of the internet: nothing leaves, nothing comes back.
    assert_eq!(curl(c, &id, "-m 3", "tftp://11.0.0.1:69/probe").await.0, 28);
    assert_eq!(
        curl(c, &id, "-m 3", "tftp://11.0.0.2:443/probe").await.0,
        28
    );
    assert_eq!(inet.hits(Listener::Quic), hits);
    assert_eq!(udp_datagrams_in(c, &id).await, echoed);
    ts.stop().await;
    drop(inet);
}

/// A placeholder credential (Authorization: Bearer) named `name` for allowed.example.
fn placeholder_credential(name: &str, scope: CredentialScope) -> CredentialRequest {
    let mut cred = bearer(name, "allowed.example", SECRET);
    cred.scope = scope;
    cred.rule = serde_json::from_value(json!({
        "hosts": ["allowed.example"],
        "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
        "placeholder": true,
    }))
    .expect("rule");
    cred
}

/// A credential made after the sandbox started is in the environment of its next process;
/// a fork child's new processes get placeholders of their own, and the processes it
/// inherited from its parent keep working with the parent's (issue 12, item 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn placeholders_reach_credentials_made_after_start_and_fork_children() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    let parent = sandbox(c, Some(allow(&["allowed.example"]))).await;
    assert_eq!(
        shell(c, &parent, "echo \"[$API_TOKEN]\"", false)
            .await
            .trim(),
        "[]"
    );
    let cred = c
        .create_credential(&placeholder_credential(
            "API_TOKEN",
            CredentialScope::Sandbox {
                sandbox: parent.clone(),
            },
        ))
        .await
        .expect("credential");
    let in_parent = shell(c, &parent, "echo $API_TOKEN", false)
        .await
        .trim()
        .to_owned();
    assert!(in_parent.starts_with("space-placeholder-"), "{in_parent}");
    let bearer_curl = "-H \"Authorization: Bearer $API_TOKEN\" -o /dev/null -w '%{http_code}'";
    let (_, status) = curl(c, &parent, bearer_curl, "https://allowed.example/").await;
    assert_eq!(status, "200");
    assert_eq!(authorizations(&inet), vec![format!("Bearer {SECRET}")]);

    // The same for the tenant, so a fork child (another sandbox) has it too. A process of
    // the parent that read its placeholder before the fork waits for a file, then uses it.
    c.delete_credential(&cred.id).await.expect("delete");
    c.create_credential(&placeholder_credential(
        "API_TOKEN",
        CredentialScope::Tenant,
    ))
    .await
    .expect("tenant credential");
    let waiter = space_core::process::ProcessSpec::shell(format!(
        "while [ ! -e /tmp/go ]; do sleep 0.2; done; \
         curl -s -m 10 {bearer_curl} https://allowed.example/ > /tmp/inherited"
    ));
    c.start_process(&parent, &waiter)
        .await
        .expect("start the waiting process");
    // It has read its environment (the placeholder) once it runs; it runs once it polls.
    shell(c, &parent, "sleep 1", false).await;
    let children = c
        .fork(
            &parent,
            &space_core::sandbox::ForkRequest {
                count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("fork");
    let child = &children.sandboxes[0].id;
    let in_child = shell(c, child, "echo $API_TOKEN", false)
        .await
        .trim()
        .to_owned();
    assert!(in_child.starts_with("space-placeholder-"), "{in_child}");
    assert_ne!(
        in_child, in_parent,
        "the child has a placeholder of its own"
    );
    let (_, status) = curl(c, child, bearer_curl, "https://allowed.example/").await;
    assert_eq!(status, "200", "the child's own placeholder");
    shell(c, child, "touch /tmp/go", false).await;
    let inherited = shell(
        c,
        child,
        "for i in $(seq 50); do [ -s /tmp/inherited ] && break; sleep 0.2; done; cat /tmp/inherited",
        false,
    )
    .await;
    assert_eq!(inherited.trim(), "200", "the process the child inherited");
    // The parent's placeholder means nothing to another sandbox.
    let stranger = sandbox(c, Some(allow(&["allowed.example"]))).await;
    let (_, status) = curl(
        c,
        &stranger,
        &format!("-H 'Authorization: Bearer {in_parent}' -o /dev/null -w '%{{http_code}}'"),
        "https://allowed.example/",
    )
    .await;
    assert_eq!(status, "403");
    assert_eq!(
        authorizations(&inet),
        vec![format!("Bearer {SECRET}"); 3],
        "parent, child, inherited"
    );
    ts.stop().await;
    drop(inet);
}

/// An allowed host's echo of the injected credential reaches the guest masked: in the body,
/// in a response header, and however the body is cut into chunks (issue 12, item 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_echoed_credential_is_masked_before_the_guest_reads_it() {
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    let (_, id) = sandbox_with_api_credential(c).await;
    for flags in ["--http1.1 -D -", "--http2 -D -"] {
        let (code, seen) = curl(c, &id, flags, "https://allowed.example/echo").await;
        assert_eq!(code, 0, "{seen}");
        assert!(!seen.contains(SECRET), "{flags}: {seen}");
        let masked = format!("Bearer {}", "*".repeat(SECRET.len()));
        let lower = seen.to_ascii_lowercase();
        assert!(
            lower.contains(&format!("authorization: {}", masked.to_ascii_lowercase())),
            "{flags}: the echoed request head: {seen}"
        );
        assert!(
            lower.contains(&format!(
                "{}: {}",
                test_support::internet::ECHO_HEADER,
                masked.to_ascii_lowercase()
            )),
            "{flags}: the echo header: {seen}"
        );
    }
    // Upstream did get the value.
    assert!(authorizations(&inet)
        .iter()
        .all(|a| a == &format!("Bearer {SECRET}")));
    ts.stop().await;
    drop(inet);
}

/// A placeholder in a stream to an address a CIDR rule allows (forwarded as bytes, where no
/// credential is injected) is refused: the stream is cut before it goes upstream, and the
/// cut is audited; the same stream without one passes (issue 12, item 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_placeholder_towards_an_address_allowed_by_cidr_is_refused() {
    use space_core::egress::{Destination, PortRange, Protocol};
    let inet = Internet::start();
    let ts = server(&inet).await;
    let c = &ts.client;
    c.create_credential(&placeholder_credential(
        "API_TOKEN",
        CredentialScope::Tenant,
    ))
    .await
    .expect("credential");
    let mut policy = allow(&["allowed.example"]);
    policy.rules.push(
        EgressRule::allow(Destination::Cidr("11.0.0.1/32".parse().expect("cidr")))
            .with_protocols([Protocol::Tcp])
            .with_ports([PortRange { start: 80, end: 80 }]),
    );
    let id = sandbox(c, Some(policy)).await;
    // By address, without a placeholder: spliced through.
    let (code, body) = curl(c, &id, "", "http://11.0.0.1/").await;
    assert_eq!((code, body.as_str()), (0, PAGE));
    let seen = inet.requests().len();
    for (args, url) in [
        ("-H \"X-Key: $API_TOKEN\"", "http://11.0.0.1/"),
        ("", "\"http://11.0.0.1/?k=$API_TOKEN\""),
    ] {
        let (code, _) = curl(c, &id, args, url).await;
        assert_ne!(code, 0, "{args} {url}");
    }
    assert_eq!(
        inet.requests().len(),
        seen,
        "nothing with a placeholder went upstream"
    );
    let audit = c
        .credential_audit(Some(id.as_str()), None, None, None)
        .await
        .expect("audit");
    assert!(
        audit.events.iter().any(|e| e.host == "11.0.0.1:80"
            && e.decision == space_secrets::AuditDecision::Deny
            && e.reason.as_deref().is_some_and(|r| r.contains("CIDR"))),
        "{audit:?}"
    );
    ts.stop().await;
    drop(inet);
}
