//! Many nodes on one machine: two control-plane replicas on one database (PostgreSQL in
//! the suite) and three node processes, each in a network namespace of its own with its
//! own data directory and store, joined with one-time tokens. Everything real: VMs,
//! mutual TLS, heartbeats over veths.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use space_control::api::credentials::{CredentialRequest, CredentialScope};
use space_core::cluster::NodeState;
use space_core::files::watch::{WatchEvent, WatchRequest};
use space_core::process::{ProcessSpec, PtySize};
use space_core::sandbox::{CreateSandboxRequest, ForkRequest};
use space_core::{ErrorCode, SandboxState};
use space_node_proto::cluster::{
    Heartbeat, HeartbeatReply, JoinToken, LiveSandbox, HEARTBEAT_PATH,
};
use space_node_proto::identity::{ClusterCa, Identity, PeerRole, PEER_VALIDITY};
use test_support::cluster::{Cluster, HEARTBEAT_TIMEOUT};
use test_support::{shell, wait_until, TEST_TEMPLATE};

fn create_request() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sandboxes_spread_serve_through_either_replica_and_survive_a_lost_node() {
    let mut cluster = Cluster::start(2, 3).await;
    eprintln!("cluster on {}", cluster.backend);
    let (a, b) = (&cluster.clients[0], &cluster.clients[1]);

    // The E2B surface of either replica reaches a sandbox on any node: created through
    // one replica's E2B API, its envd (processes, files) answered through the other's.
    let http = reqwest::Client::new();
    let e2b_key = cluster.api_key.replacen("space_", "e2b_", 1);
    let created: serde_json::Value = http
        .post(format!("{}/sandboxes", cluster.replicas[0].url()))
        .header("X-API-Key", &e2b_key)
        .json(&serde_json::json!({"templateID": TEST_TEMPLATE}))
        .send()
        .await
        .expect("E2B create")
        .json()
        .await
        .expect("json");
    let e2b_id = created["sandboxID"].as_str().expect("sandboxID").to_owned();
    let token = created["envdAccessToken"]
        .as_str()
        .expect("token")
        .to_owned();
    let listed = http
        .post(format!(
            "{}/process.Process/List",
            cluster.replicas[1].url()
        ))
        .header("E2b-Sandbox-Id", &e2b_id)
        .header("X-Access-Token", &token)
        .header("Content-Type", "application/json")
        .header("Connect-Protocol-Version", "1")
        .body("{}")
        .send()
        .await
        .expect("envd list");
    assert_eq!(listed.status(), 200, "{:?}", listed.text().await);
    let e2b_sb: space_core::SandboxId = e2b_id.parse().expect("id");
    b.write_file(
        &e2b_sb,
        "/home/user/e2b.txt",
        None,
        None,
        b"through E2B".to_vec(),
    )
    .await
    .expect("write");
    let read = http
        .get(format!(
            "{}/files?path=/home/user/e2b.txt&username=user",
            cluster.replicas[1].url()
        ))
        .header("E2b-Sandbox-Id", &e2b_id)
        .header("X-Access-Token", &token)
        .send()
        .await
        .expect("envd read");
    assert_eq!(read.status(), 200);
    assert_eq!(read.bytes().await.expect("body").as_ref(), b"through E2B");
    a.delete_sandbox(e2b_id.as_str()).await.expect("delete");

    // Placement prefers a node that has the template's memory image (a restore, not a
    // boot). Warm each node once, with the other two cordoned: the create goes to the one
    // open node, whichever replica it reaches.
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    for (i, open) in names.iter().enumerate() {
        for other in names.iter().filter(|n| *n != open) {
            a.set_node_cordoned(other, true).await.expect("cordon");
        }
        let sb = cluster.clients[i % 2]
            .create_sandbox(&create_request())
            .await
            .expect("create with two nodes cordoned");
        assert_eq!(&sb.node, open, "placed on a cordoned node");
        for other in names.iter().filter(|n| *n != open) {
            let info = b.set_node_cordoned(other, false).await.expect("uncordon");
            assert_eq!(info.state, NodeState::Ready);
        }
        a.delete_sandbox(sb.id.as_str()).await.expect("delete");
    }
    // Now equally warm: creates through both replicas spread over the three nodes.
    let mut ids = Vec::new();
    for i in 0..3 {
        let c = &cluster.clients[i % 2];
        ids.push(
            c.create_sandbox(&create_request())
                .await
                .expect("create")
                .id,
        );
    }
    let mut placed = BTreeSet::new();
    for id in &ids {
        placed.insert(a.sandbox(id).await.expect("get").node);
    }
    assert_eq!(placed.len(), 3, "one sandbox per node: {placed:?}");

    // Every sandbox answers through the replica that did not create it: processes and
    // files both ways.
    for (i, id) in ids.iter().enumerate() {
        let other = &cluster.clients[(i + 1) % 2];
        let out = shell(other, id, "echo hello from $(hostname)", false).await;
        assert!(out.starts_with("hello from"), "{out}");
        let body = bytes::Bytes::from(vec![b'x'; 256 * 1024]);
        other
            .write_file(id, "/home/user/blob", None, None, body.clone())
            .await
            .expect("write");
        let back = cluster.clients[i % 2]
            .read_file_bytes(id, "/home/user/blob", None)
            .await
            .expect("read");
        assert_eq!(back.len(), body.len());
    }
    // Watches, PTYs, ports and forks through the other replica too.
    let id = &ids[0];
    shell(a, id, "mkdir -p /home/user/watched", false).await;
    let mut events = b
        .watch(
            id,
            &WatchRequest {
                path: "/home/user/watched".into(),
                recursive: false,
                user: None,
            },
        )
        .await
        .expect("watch through the other replica");
    assert_eq!(
        events.next().await.expect("started").expect("event"),
        WatchEvent::Started { seq: 1 }
    );
    a.write_file(id, "/home/user/watched/new.txt", None, None, b"x".to_vec())
        .await
        .expect("write");
    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(ev) = events.next().await {
            if let Ok(WatchEvent::Change { name, .. }) = ev {
                if name == "new.txt" {
                    return true;
                }
            }
        }
        false
    })
    .await
    .expect("a change within 30 s");
    assert!(seen, "the watch saw the write");
    let tty = b
        .run(
            id,
            &ProcessSpec {
                shell: Some("tty".into()),
                pty: Some(PtySize { rows: 24, cols: 80 }),
                ..Default::default()
            },
        )
        .await
        .expect("pty process");
    assert!(
        String::from_utf8_lossy(&tty.stdout).contains("/dev/pts"),
        "{:?}",
        String::from_utf8_lossy(&tty.stdout)
    );
    shell(
        a,
        id,
        "mkdir -p www && echo 'port through a replica' > www/index.html",
        false,
    )
    .await;
    a.start_process(id, &ProcessSpec::shell("exec httpd -f -p 8000 -h www"))
        .await
        .expect("httpd");
    let replica_port = cluster.replicas[1].addr().port();
    let replica_url = cluster.replicas[1].url();
    let body = wait_until(
        Duration::from_secs(30),
        "the port through the other replica",
        || {
            let (http, key, url) = (http.clone(), e2b_key.clone(), replica_url.clone());
            async move {
                let r = http
                    .get(format!("{url}/index.html"))
                    .header(
                        "Host",
                        format!(
                            "8000-{id}.{}:{replica_port}",
                            test_support::e2b::TEST_DOMAIN
                        ),
                    )
                    .header("X-API-Key", key)
                    .send()
                    .await
                    .ok()?;
                (r.status() == 200).then_some(())?;
                r.text().await.ok()
            }
        },
    )
    .await;
    assert_eq!(body.trim(), "port through a replica");
    let children = b
        .fork(
            id,
            &ForkRequest {
                count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect("fork through the other replica");
    let child = &children.sandboxes[0];
    assert_eq!(
        child.node,
        a.sandbox(id).await.unwrap().node,
        "children stay with their parent"
    );
    assert_eq!(
        shell(a, &child.id, "cat www/index.html", false)
            .await
            .trim(),
        "port through a replica"
    );
    a.delete_sandbox(child.id.as_str())
        .await
        .expect("delete child");

    // Lifecycle through the other replica.
    b.pause_sandbox(&ids[0]).await.expect("pause");
    assert_eq!(
        a.sandbox(&ids[0]).await.unwrap().state,
        SandboxState::Paused
    );
    a.resume_sandbox(&ids[0]).await.expect("resume");
    let snap = b
        .create_snapshot(&ids[0], &Default::default())
        .await
        .expect("snapshot");
    a.rollback(&ids[0], &snap.snapshot.id)
        .await
        .expect("rollback");

    // A node that stops heartbeating is declared lost, and so are its sandboxes; a
    // sandbox deleted meanwhile is recorded; when the node returns it is fenced, rejoins,
    // is reconciled (the deleted one goes from it) and serves again.
    let victim_id = ids[2].clone();
    let victim = a.sandbox(&victim_id).await.unwrap().node;
    // One more on the victim (the others cordoned for it), to be deleted while it is lost.
    for other in names.iter().filter(|n| **n != victim) {
        a.set_node_cordoned(other, true).await.expect("cordon");
    }
    let doomed = b.create_sandbox(&create_request()).await.expect("create");
    assert_eq!(doomed.node, victim);
    for other in names.iter().filter(|n| **n != victim) {
        a.set_node_cordoned(other, false).await.expect("uncordon");
    }
    let before = cluster
        .wait_nodes(3, |n| n.state == NodeState::Ready)
        .await
        .into_iter()
        .find(|n| n.name == victim)
        .expect("victim listed")
        .generation;
    assert!(
        cluster
            .node(&victim)
            .data_dir
            .join("store/sandboxes")
            .join(doomed.id.as_str())
            .exists(),
        "the sandbox's files are on its node"
    );
    cluster.node(&victim).freeze();
    let lost = wait_until(
        HEARTBEAT_TIMEOUT * 5,
        "the silent node to be lost",
        || async {
            let list = a.nodes().await.ok()?;
            list.nodes
                .into_iter()
                .find(|n| n.name == victim && n.state == NodeState::Lost)
        },
    )
    .await;
    assert!(lost.generation > before, "a loss bumps the generation");
    let seen = b
        .sandbox(&victim_id)
        .await
        .expect("get through the other replica");
    assert_eq!(seen.state, SandboxState::Lost, "{seen:?}");
    let err = a
        .run(&victim_id, &space_core::process::ProcessSpec::shell("true"))
        .await
        .expect_err("a lost node's sandbox cannot run processes");
    assert_eq!(err.code(), Some(ErrorCode::NodeUnavailable), "{err}");
    a.delete_sandbox(doomed.id.as_str())
        .await
        .expect("delete is recorded while the node is lost");
    assert_eq!(
        a.sandbox(&doomed.id).await.unwrap().state,
        SandboxState::Deleted
    );
    // New creates avoid the lost node.
    let elsewhere = b.create_sandbox(&create_request()).await.expect("create");
    assert_ne!(elsewhere.node, victim);
    a.delete_sandbox(elsewhere.id.as_str())
        .await
        .expect("delete");

    cluster.node(&victim).thaw();
    let back = wait_until(Duration::from_secs(60), "the node to rejoin", || async {
        let list = a.nodes().await.ok()?;
        list.nodes
            .into_iter()
            .find(|n| n.name == victim && n.state == NodeState::Ready)
    })
    .await;
    assert!(back.generation >= lost.generation);
    let again = shell(b, &victim_id, "echo back", false).await;
    assert_eq!(again.trim(), "back");
    // Reconciled before it served again: the sandbox deleted meanwhile is gone from it.
    let on_victim = cluster
        .node(&victim)
        .data_dir
        .join("store/sandboxes")
        .join(doomed.id.as_str());
    wait_until(
        Duration::from_secs(30),
        "the deleted sandbox to go from its node",
        || async { (!on_victim.exists()).then_some(()) },
    )
    .await;
    cluster.add_replica().await; // a third replica sees the same cluster at once
    let third = cluster.clients.last().expect("client");
    assert_eq!(third.nodes().await.expect("nodes").nodes.len(), 3);
    assert_eq!(
        third.sandbox(&ids[1]).await.expect("get").state,
        SandboxState::Running
    );
    cluster.stop().await;
}

/// A heartbeat over `tls` to the cluster listener at `addr` (from the host).
async fn heartbeat_as(
    tls: rustls::ClientConfig,
    addr: std::net::SocketAddr,
    hb: &Heartbeat,
) -> (u16, serde_json::Value) {
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .resolve(space_node_proto::identity::CONTROL_PLANE_DNS_NAME, addr)
        .build()
        .expect("client");
    let resp = client
        .post(format!(
            "https://{}:{}{HEARTBEAT_PATH}",
            space_node_proto::identity::CONTROL_PLANE_DNS_NAME,
            addr.port()
        ))
        .json(hb)
        .send()
        .await
        .expect("send");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or_default())
}

fn no_client_cert(ca_pem: &str) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("pem")).expect("root");
    }
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth()
}

use rustls::pki_types::pem::PemObject as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_reused_and_misdirected_membership_is_refused_and_changes_nothing() {
    let cluster = Cluster::start(1, 1).await;
    let a = &cluster.clients[0];
    let node = &cluster.nodes[0];
    let joined = space_node_agent::membership::load(&node.identity_dir()).expect("identity");
    let addr = cluster.replicas[0]
        .cluster_addr()
        .expect("cluster listener");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], addr.port()));
    let dir = tempfile::tempdir().expect("tmp");
    let cp = addr.to_string();

    // A spent token, a forged one, an expired-looking unknown one: refused, nothing joined.
    let spent = cluster.join_token().await;
    let first = space_node_agent::membership::join(
        &dir.path().join("x"),
        &cp,
        &JoinToken::parse(&spent).unwrap(),
        "node-x",
        "10.9.9.9:7443",
    )
    .await;
    assert!(first.is_ok(), "{:?}", first.err());
    let again = space_node_agent::membership::join(
        &dir.path().join("y"),
        &cp,
        &JoinToken::parse(&spent).unwrap(),
        "node-y",
        "10.9.9.9:7443",
    )
    .await
    .err()
    .expect("a token joins once");
    assert!(again.to_string().contains("already used"), "{again}");
    let mut forged = JoinToken::parse(&cluster.join_token().await).unwrap();
    forged.secret = "0".repeat(64);
    let err = space_node_agent::membership::join(
        &dir.path().join("z"),
        &cp,
        &forged,
        "node-z",
        "10.9.9.9:7443",
    )
    .await
    .err()
    .expect("forged");
    assert!(err.to_string().contains("not valid"), "{err}");
    // A token pinning another CA never reaches this control plane: the TLS check fails.
    let mut other_ca = JoinToken::parse(&cluster.join_token().await).unwrap();
    other_ca.ca_fingerprint = ClusterCa::generate().unwrap().fingerprint().unwrap();
    let err = space_node_agent::membership::join(
        &dir.path().join("w"),
        &cp,
        &other_ca,
        "node-w",
        "10.9.9.9:7443",
    )
    .await
    .err()
    .expect("another cluster's pin");
    assert!(err.to_string().contains("CA"), "{err}");
    let names: Vec<String> = a
        .nodes()
        .await
        .unwrap()
        .nodes
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, vec!["node-a".to_owned(), "node-x".to_owned()]);
    a.remove_node("node-x")
        .await
        .expect("remove the node that never ran");

    // A node that claims a sandbox it does not own: its row is left alone.
    let sb = a.create_sandbox(&create_request()).await.expect("create");
    let status = cluster.replicas[0]
        .state()
        .nodes
        .get("node-a")
        .unwrap()
        .status()
        .await
        .unwrap();
    let foreign = space_core::SandboxId::generate();
    let hb = Heartbeat {
        generation: joined.state.generation,
        status: status.clone(),
        sandboxes: vec![
            LiveSandbox {
                id: sb.id.clone(),
                state: SandboxState::Running,
            },
            LiveSandbox {
                id: foreign.clone(),
                state: SandboxState::Running,
            },
        ],
    };
    let node_tls =
        space_node_proto::identity::node_client_config(&joined.identity, &joined.ca_pem).unwrap();
    let (code, body) = heartbeat_as(node_tls.clone(), addr, &hb).await;
    assert_eq!(code, 200, "{body}");
    let reply: HeartbeatReply = serde_json::from_value(body).unwrap();
    assert_eq!(reply.not_yours, vec![foreign]);

    // A create replayed to the node (the same sandbox id sent again) is refused, not run
    // twice; the sandbox is untouched.
    let remote = cluster.replicas[0]
        .state()
        .nodes
        .get("node-a")
        .expect("node-a");
    let tenant = cluster.replicas[0]
        .state()
        .db
        .sandbox_any_tenant(&sb.id)
        .await
        .expect("db")
        .expect("row")
        .tenant_id;
    let replayed = remote
        .create_sandbox(space_node_proto::CreateSandbox {
            id: sb.id.clone(),
            template: TEST_TEMPLATE.into(),
            template_digest: None,
            resources: Default::default(),
            settings: space_node_proto::SandboxSettings::new(tenant),
        })
        .await
        .expect_err("a create sent twice");
    assert_eq!(replayed.code(), ErrorCode::AlreadyExists, "{replayed}");

    // An expired certificate of this very node: refused.
    let expired = cluster_ca(&cluster)
        .issue_at(
            &PeerRole::Node("node-a".into()),
            std::time::SystemTime::now() - Duration::from_secs(7200),
            Duration::from_secs(600),
        )
        .expect("expired identity");
    let expired_tls =
        space_node_proto::identity::node_client_config(&expired, &joined.ca_pem).unwrap();
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(expired_tls)
        .resolve(space_node_proto::identity::CONTROL_PLANE_DNS_NAME, addr)
        .build()
        .unwrap();
    let sent = client
        .post(format!(
            "https://{}:{}{HEARTBEAT_PATH}",
            space_node_proto::identity::CONTROL_PLANE_DNS_NAME,
            addr.port()
        ))
        .json(&hb)
        .send()
        .await;
    assert!(
        sent.is_err() || sent.as_ref().is_ok_and(|r| r.status().as_u16() == 403),
        "an expired certificate: {sent:?}"
    );

    // A replayed heartbeat of an old generation is fenced.
    let old = Heartbeat {
        generation: joined.state.generation.saturating_sub(1),
        ..hb.clone()
    };
    let (code, body) = heartbeat_as(node_tls, addr, &old).await;
    assert_eq!(
        (code, body["code"].as_str()),
        (409, Some("node_fenced")),
        "{body}"
    );

    // No certificate, or a control-plane certificate acting as a node: 403.
    let (code, _) = heartbeat_as(no_client_cert(&joined.ca_pem), addr, &hb).await;
    assert_eq!(code, 403);
    let ca_dir_ca = cluster_ca(&cluster);
    let cp_id: Identity = ca_dir_ca
        .issue(&PeerRole::ControlPlane, PEER_VALIDITY)
        .unwrap();
    let cp_tls =
        space_node_proto::identity::node_client_config(&cp_id, ca_dir_ca.cert_pem()).unwrap();
    let (code, body) = heartbeat_as(cp_tls, addr, &hb).await;
    assert_eq!(code, 403, "{body}");
    // A certificate of another cluster does not finish the handshake.
    let stranger = ClusterCa::generate().unwrap();
    let stranger_id = stranger
        .issue(&PeerRole::Node("node-a".into()), PEER_VALIDITY)
        .unwrap();
    let stranger_tls =
        space_node_proto::identity::node_client_config(&stranger_id, &joined.ca_pem).unwrap();
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(stranger_tls)
        .resolve(space_node_proto::identity::CONTROL_PLANE_DNS_NAME, addr)
        .build()
        .unwrap();
    let sent = client
        .post(format!(
            "https://{}:{}{HEARTBEAT_PATH}",
            space_node_proto::identity::CONTROL_PLANE_DNS_NAME,
            addr.port()
        ))
        .json(&hb)
        .send()
        .await;
    assert!(
        sent.is_err() || sent.as_ref().is_ok_and(|r| r.status().as_u16() == 403),
        "{sent:?}"
    );
    // Nothing changed: the node is ready at its generation and the sandbox runs.
    let n = a.nodes().await.unwrap().nodes.remove(0);
    assert_eq!(
        (n.state, n.generation),
        (NodeState::Ready, joined.state.generation)
    );
    assert_eq!(shell(a, &sb.id, "echo ok", false).await.trim(), "ok");
    cluster.stop().await;
}

fn cluster_ca(cluster: &Cluster) -> ClusterCa {
    space_control::cluster::authority::load(&cluster.ca_dir()).expect("CA")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_mid_operations_loses_nothing() {
    let cluster = Cluster::start(1, 2).await;
    let a = &cluster.clients[0];
    let to_delete = a
        .create_sandbox(&create_request())
        .await
        .expect("create")
        .id;
    let to_pause = a
        .create_sandbox(&create_request())
        .await
        .expect("create")
        .id;
    let mut child = cluster.child_replica().await;
    let c = child.client.clone();
    // Creates, a delete and a pause through the child replica, killed while they run.
    let mut work = Vec::new();
    for _ in 0..3 {
        let c = c.clone();
        work.push(tokio::spawn(async move {
            c.create_sandbox(&create_request()).await.map(|s| s.id).ok()
        }));
    }
    let deleting = {
        let (c, id) = (c.clone(), to_delete.clone());
        tokio::spawn(async move { c.delete_sandbox(id.as_str()).await.is_ok() })
    };
    let pausing = {
        let (c, id) = (c.clone(), to_pause.clone());
        tokio::spawn(async move { c.pause_sandbox(&id).await.is_ok() })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    child.kill().await;
    for w in work {
        let _ = w.await;
    }
    let _ = deleting.await;
    let _ = pausing.await;

    // The surviving replica sees one consistent cluster once the dead one's heartbeat has
    // lapsed: every sandbox a node holds has a live row, none twice; every live row has its
    // sandbox (creates the dead replica left are adopted if the node made them, undone if
    // not: none stays `creating`); the delete it recorded is finished on the node; the
    // paused one is paused or running.
    let state = cluster.replicas[0].state();
    let converged = wait_until(
        Duration::from_secs(120),
        "the cluster to converge",
        || async {
            let live = state.db.live_sandboxes().await.ok()?;
            let mut on_nodes = Vec::new();
            for name in ["node-a", "node-b"] {
                let node = state.nodes.get(name).ok()?;
                on_nodes.extend(
                    node.sandboxes()
                        .await
                        .ok()?
                        .into_iter()
                        .filter(|v| v.state != SandboxState::Deleted)
                        .map(|v| (v.id, v.state)),
                );
            }
            let ids: BTreeSet<_> = on_nodes.iter().map(|(id, _)| id.clone()).collect();
            let rows: BTreeSet<_> = live.iter().map(|r| r.id.clone()).collect();
            let stable = on_nodes
                .iter()
                .all(|(_, s)| matches!(s, SandboxState::Running | SandboxState::Paused));
            let recorded = live.iter().all(|r| r.create_latency_ms.is_some());
            (ids.len() == on_nodes.len() && ids == rows && stable && recorded)
                .then_some((live, ids))
        },
    )
    .await;
    let (_live, on_nodes) = converged;
    let deleted = state
        .db
        .sandbox_any_tenant(&to_delete)
        .await
        .unwrap()
        .expect("row kept");
    if deleted.desired_state == space_control::db::DesiredState::Deleted {
        assert!(
            !on_nodes.contains(&to_delete),
            "the delete was finished on its node"
        );
    }
    let paused = a.sandbox(&to_pause).await.expect("get");
    assert!(
        matches!(paused.state, SandboxState::Paused | SandboxState::Running),
        "{paused:?}"
    );
    // The dead replica is forgotten; the survivor leads.
    let replicas = wait_until(
        Duration::from_secs(60),
        "the dead replica to be forgotten",
        || async {
            let rows = state.db.replicas().await.ok()?;
            (rows.len() == 1).then_some(rows)
        },
    )
    .await;
    assert_eq!(&replicas[0].id, state.replica.id());
    assert!(state.replica.leads().await);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_share_quotas_request_rates_and_the_lead() {
    let mut cluster = Cluster::start(2, 1).await;
    let db = cluster.replicas[0].state().db.clone();
    let tenant = db.create_tenant("shared").await.expect("tenant");
    let key = db
        .create_api_key(&tenant.id)
        .await
        .expect("key")
        .plaintext
        .0;
    let rate_key = db
        .create_api_key(&tenant.id)
        .await
        .expect("key")
        .plaintext
        .0;
    let through = |i: usize, key: &str| {
        space_cli::client::SpaceClient::new(&cluster.replicas[i].url(), Some(key.to_owned()))
            .expect("client")
    };
    cluster.clients[0]
        .set_tenant_quota(
            "shared",
            &space_core::quota::TenantQuota {
                max_sandboxes: Some(1),
                requests_per_sec: Some(1),
                request_burst: Some(4),
                ..Default::default()
            },
        )
        .await
        .expect("quota");

    // One sandbox allowed: two creates at once, one through each replica, and exactly one
    // is admitted (the tenant's admission lock is the database's, not a replica's).
    let (c0, c1) = (through(0, &key), through(1, &key));
    let req = create_request();
    let (r0, r1) = tokio::join!(c0.create_sandbox(&req), c1.create_sandbox(&req));
    let outcomes = [r0, r1];
    let made: Vec<_> = outcomes.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(made.len(), 1, "{outcomes:?}");
    let refused = outcomes
        .iter()
        .find_map(|r| r.as_ref().err())
        .expect("one refused");
    assert_eq!(refused.code(), Some(ErrorCode::QuotaExceeded), "{refused}");

    if cluster.backend != "postgres" {
        // SQLite serves one replica: request buckets and the lead are that replica's.
        eprintln!("on SQLite: not checking shared request buckets and the lead");
        cluster.stop().await;
        return;
    }
    // One request bucket per key, whichever replica takes the request: a burst of four
    // spread over both replicas, then 429 on either.
    let mut statuses = Vec::new();
    for i in 0..6 {
        let r = reqwest::Client::new()
            .get(format!("{}/v1/sandboxes", cluster.replicas[i % 2].url()))
            .bearer_auth(&rate_key)
            .send()
            .await
            .expect("send");
        statuses.push(r.status().as_u16());
    }
    assert_eq!(&statuses[..4], &[200, 200, 200, 200], "{statuses:?}");
    assert_eq!(&statuses[4..], &[429, 429], "{statuses:?}");

    // One leader at a time; when it leaves, the other takes over.
    let leads: Vec<bool> = futures::future::join_all(
        cluster
            .replicas
            .iter()
            .map(|r| async move { r.state().replica.leads().await }),
    )
    .await;
    assert_eq!(leads.iter().filter(|l| **l).count(), 1, "{leads:?}");
    let leader = leads.iter().position(|l| *l).expect("a leader");
    let follower = cluster.replicas[1 - leader].state().replica.clone();
    cluster.clients.remove(leader);
    cluster.replicas.remove(leader).shutdown().await;
    wait_until(
        Duration::from_secs(30),
        "the other replica to lead",
        || async { follower.leads().await.then_some(()) },
    )
    .await;
    let tenant_client =
        space_cli::client::SpaceClient::new(&cluster.replicas[0].url(), Some(key.clone()))
            .expect("client");
    for sb in made {
        tenant_client
            .delete_sandbox(sb.id.as_str())
            .await
            .expect("delete");
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_reach_every_node_whenever_it_joined() {
    let mut cluster = Cluster::start(2, 1).await;
    let (a, b) = (cluster.clients[0].clone(), cluster.clients[1].clone());
    let request = |name: &str| test_support::bearer_credential(name, &format!("sk-{name}-0001"));
    let first = a
        .create_credential(&request("first"))
        .await
        .expect("create through one replica");
    // Listed through the other replica (the catalog is the database's).
    let listed = b.credentials().await.expect("list");
    assert_eq!(listed.credentials.len(), 1);
    assert_eq!(listed.credentials[0].id, first.id);

    // A node that joins afterwards is synced at its first heartbeats.
    cluster.add_node("node-b").await;
    let state = cluster.replicas[0].state().clone();
    let held = |name: &'static str| {
        let state = state.clone();
        async move {
            let node = state.nodes.get(name).ok()?;
            let ids: BTreeSet<String> = node
                .credentials()
                .await
                .ok()?
                .into_iter()
                .map(|c| c.id.to_string())
                .collect();
            let revision = node.status().await.ok()?.credentials_revision;
            Some((ids, revision))
        }
    };
    let catalog = || async { state.db.credential_revision().await.ok() };
    wait_until(
        Duration::from_secs(60),
        "node-b to get the credential",
        || async {
            let (ids, rev) = held("node-b").await?;
            (ids.contains(&first.id) && Some(rev) == catalog().await).then_some(())
        },
    )
    .await;

    // A change a node misses (frozen) reaches it when it is back: the deleted credential
    // goes, the new one comes; the other node took both at once.
    cluster.node("node-a").freeze();
    let second = b
        .create_credential(&request("second"))
        .await
        .expect("create while a node is away");
    a.delete_credential(&first.id).await.expect("delete");
    let (ids, _) = held("node-b").await.expect("node-b answers");
    assert!(
        ids.contains(&second.id) && !ids.contains(&first.id),
        "{ids:?}"
    );
    cluster.node("node-a").thaw();
    wait_until(Duration::from_secs(90), "node-a to be synced", || async {
        let (ids, rev) = held("node-a").await?;
        (ids.contains(&second.id) && !ids.contains(&first.id) && Some(rev) == catalog().await)
            .then_some(())
    })
    .await;
    // Bad input is refused and changes nothing: a duplicate name, a bad rule.
    let err = a
        .create_credential(&request("second"))
        .await
        .expect_err("a name is unique in its scope");
    assert_eq!(err.code(), Some(ErrorCode::AlreadyExists), "{err}");
    assert_eq!(b.credentials().await.expect("list").credentials.len(), 1);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_suspended_on_one_node_resumes_on_another() {
    let mut cluster = Cluster::start_with_objects(1, 2).await;
    let a = cluster.clients[0].clone();
    let objects =
        space_objects::Objects::open(&cluster.object_store().expect("the cluster's object store"))
            .expect("objects");
    // Made on node-a.
    a.set_node_cordoned("node-b", true).await.expect("cordon b");
    let mut req = create_request();
    req.labels.insert("team".into(), "agents".into());
    req.egress = Some(
        serde_json::from_value(serde_json::json!({
            "mode": "allowlist",
            "rules": [{"action": "allow", "destination": {"domain": "example.com"}}]
        }))
        .expect("policy"),
    );
    // A credential whose placeholder the guest holds: it must mean the same on node-b.
    a.create_credential(&CredentialRequest {
        name: "API_TOKEN".into(),
        scope: CredentialScope::Tenant,
        rule: serde_json::from_value(serde_json::json!({
            "hosts": ["example.com"],
            "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
            "placeholder": true,
        }))
        .expect("rule"),
        expires_at_ms: None,
        value: "the-secret-value".into(),
    })
    .await
    .expect("credential");
    let sb = a.create_sandbox(&req).await.expect("create");
    assert_eq!(sb.node, "node-a");
    a.set_node_cordoned("node-b", false)
        .await
        .expect("uncordon b");
    let id = sb.id.clone();
    shell(&a, &id, "echo written-on-a > /home/user/kept.txt", false).await;
    let placeholder = shell(&a, &id, "echo $API_TOKEN | tee /home/user/token", false).await;
    assert!(
        placeholder.trim().starts_with("space-placeholder-"),
        "{placeholder}"
    );
    test_support::start_counter(&a, &id, "/home/user/count").await;

    // node-a's software killed in the middle of the suspend: nothing is committed, what
    // was uploaded is collected, and when node-a is back the sandbox runs on there. Its
    // uplink is slowed to 8 Mbit/s so the upload (~100 MB) lasts well over a minute: the
    // kill lands in it on any machine (unslowed, a fast one finished it in 1.1 s).
    cluster.node("node-a").network.set_uplink_rate(Some(8));
    let suspending = {
        let a = a.clone();
        let id = id.clone();
        tokio::spawn(async move { a.suspend_sandbox(&id).await })
    };
    wait_until(Duration::from_secs(60), "the suspend to begin", || async {
        let info = a.sandbox(&id).await.ok()?;
        (info.state == SandboxState::Suspending).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.node_mut("node-a").kill().await;
    cluster.node("node-a").network.set_uplink_rate(None);
    let failed = suspending.await.expect("task");
    assert!(
        failed.is_err(),
        "the suspend cannot have finished: {failed:?}"
    );
    let st = cluster.replicas[0].state().clone();
    assert!(st
        .db
        .sandbox_any_tenant(&id)
        .await
        .unwrap()
        .unwrap()
        .suspended_snapshot
        .is_none());
    let prefix = space_objects::ObjectKey::parse("snapshots").unwrap();
    wait_until(
        Duration::from_secs(60),
        "partial uploads to be collected",
        || async { objects.list(&prefix).await.ok()?.is_empty().then_some(()) },
    )
    .await;
    cluster.node_mut("node-a").restart().await;
    wait_until(
        Duration::from_secs(120),
        "the sandbox to run again on node-a",
        || async {
            let info = a.sandbox(&id).await.ok()?;
            (info.state == SandboxState::Running && info.node == "node-a").then_some(())
        },
    )
    .await;
    let before = test_support::counter(&a, &id, "/home/user/count").await;
    wait_until(Duration::from_secs(30), "its counter to run on", || async {
        (test_support::counter(&a, &id, "/home/user/count").await > before).then_some(())
    })
    .await;

    // Suspended for good: node-a frees it; node-a cordoned, the resume lands on node-b.
    let suspended = a.suspend_sandbox(&id).await.expect("suspend");
    assert_eq!(suspended.state, SandboxState::Suspended);
    let node_a = st.nodes.get("node-a").expect("node-a");
    assert!(node_a
        .sandbox(&id)
        .await
        .expect("node-a answers")
        .is_none_or(|v| v.state == SandboxState::Deleted));
    let at_suspend = before;
    a.set_node_cordoned("node-a", true).await.expect("cordon a");
    let resumed = a.resume_sandbox(&id).await.expect("resume");
    assert_eq!(resumed.state, SandboxState::Running);
    assert_eq!(resumed.node, "node-b", "resumed where there is room");
    assert_eq!(
        resumed.labels.get("team").map(String::as_str),
        Some("agents")
    );
    assert_eq!(resumed.egress, sb.egress);
    assert_eq!(
        shell(&a, &id, "cat /home/user/kept.txt", false)
            .await
            .trim(),
        "written-on-a"
    );
    // node-b gives the sandbox the placeholder it had on node-a: the one its processes
    // hold still opens the credential there.
    assert_eq!(
        shell(&a, &id, "cat /home/user/token", false).await,
        placeholder
    );
    assert_eq!(shell(&a, &id, "echo $API_TOKEN", false).await, placeholder);
    let on_b = test_support::counter(&a, &id, "/home/user/count").await;
    assert!(
        on_b > at_suspend,
        "the count carried over: {on_b} after {at_suspend}"
    );
    wait_until(
        Duration::from_secs(30),
        "the counter to run on node-b",
        || async {
            (test_support::counter(&a, &id, "/home/user/count").await > on_b).then_some(())
        },
    )
    .await;
    a.set_node_cordoned("node-a", false)
        .await
        .expect("uncordon a");
    cluster.stop().await;
}

/// Ten suspended sandboxes resumed at once on a node that has never had their template:
/// it fetches the template (and the kernel bundle it boots) from the object store once,
/// counted at the S3 server, and every one of them runs with its files. Then that node is
/// drained: every sandbox moves back, as it was (running, or paused); a stopped one cannot
/// and says so. Last, ten creates at once on a third node that lacks the template: one
/// download, one memory image, ten sandboxes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_template_is_fetched_once_per_node_and_a_drain_moves_every_sandbox() {
    const SANDBOXES: usize = 10;
    let mut cluster = Cluster::start_with_objects(1, 1).await;
    let a = cluster.clients[0].clone();
    let st = cluster.replicas[0].state().clone();
    let template = st.nodes.template(TEST_TEMPLATE).await.expect("template");
    let objects =
        space_objects::Objects::open(&cluster.object_store().expect("the cluster's object store"))
            .expect("objects");
    // node-a publishes its templates as it starts.
    let manifest =
        space_objects::ObjectKey::join(&["templates", &template.digest, "template.json"])
            .expect("key");
    wait_until(
        Duration::from_secs(180),
        "node-a to publish the template",
        || async { objects.size(&manifest).await.ok()?.map(|_| ()) },
    )
    .await;

    let ids: Vec<_> = futures::future::join_all((0..SANDBOXES).map(|_| {
        let a = a.clone();
        async move {
            a.create_sandbox(&create_request())
                .await
                .expect("create")
                .id
        }
    }))
    .await;
    futures::future::join_all(ids.iter().enumerate().map(|(i, id)| {
        let a = a.clone();
        async move {
            shell(&a, id, &format!("echo sandbox-{i} > /home/user/who"), false).await;
            let s = a.suspend_sandbox(id).await.expect("suspend");
            assert_eq!(s.state, SandboxState::Suspended);
        }
    }))
    .await;

    cluster.add_node_without_template("node-c").await;
    cluster.wait_nodes(2, |n| n.state == NodeState::Ready).await;
    let node_c = st.nodes.get("node-c").expect("node-c");
    let status = node_c.status().await.expect("node-c status");
    assert!(
        !status.templates.contains(&template.digest),
        "node-c starts without the template"
    );
    a.set_node_cordoned("node-a", true).await.expect("cordon a");
    let garage = cluster.garage();
    let images_before = garage.requests("GET", "/rootfs.ext4.zst");
    let kernels_before = garage.requests("GET", "/vmlinuz");

    let resumed = futures::future::join_all(ids.iter().map(|id| {
        let a = a.clone();
        async move { a.resume_sandbox(id).await.expect("resume") }
    }))
    .await;
    for r in &resumed {
        assert_eq!(r.state, SandboxState::Running);
        assert_eq!(r.node, "node-c");
    }
    assert_eq!(
        garage.requests("GET", "/rootfs.ext4.zst") - images_before,
        1,
        "one download of the template image for ten resumes"
    );
    assert_eq!(
        garage.requests("GET", "/vmlinuz") - kernels_before,
        1,
        "one download of the kernel bundle"
    );
    let status = node_c.status().await.expect("node-c status");
    assert!(status.templates.contains(&template.digest));
    assert_eq!(
        status.templates_fetched, 2,
        "the template and its kernel bundle"
    );
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            shell(&a, id, "cat /home/user/who", false).await.trim(),
            format!("sandbox-{i}")
        );
    }
    // A create there now boots from what it fetched: no download.
    let sb = a.create_sandbox(&create_request()).await.expect("create");
    assert_eq!(sb.node, "node-c");
    assert_eq!(
        garage.requests("GET", "/rootfs.ext4.zst") - images_before,
        1
    );

    // Drained: everything moves to node-a, as it was.
    a.set_node_cordoned("node-a", false)
        .await
        .expect("uncordon a");
    let paused = &ids[0];
    a.pause_sandbox(paused).await.expect("pause");
    a.stop_sandbox(&sb.id).await.expect("stop");
    let report = a.drain_node("node-c").await.expect("drain");
    assert_eq!(report.moved.len(), SANDBOXES, "{report:?}");
    for m in &report.moved {
        assert_eq!(m.node, "node-a");
        let want = if m.id == *paused {
            SandboxState::Paused
        } else {
            SandboxState::Running
        };
        assert_eq!(m.state, want, "{}", m.id);
        let info = a.sandbox(&m.id).await.expect("sandbox");
        assert_eq!((info.node.as_str(), info.state), ("node-a", want));
    }
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert_eq!(report.failed[0].id, sb.id);
    assert_eq!(report.failed[0].state, SandboxState::Stopped);
    assert_eq!(report.failed[0].code, ErrorCode::Conflict);
    a.resume_sandbox(paused)
        .await
        .expect("resume the paused one");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            shell(&a, id, "cat /home/user/who", false).await.trim(),
            format!("sandbox-{i}")
        );
    }
    let nodes = cluster.wait_nodes(2, |_| true).await;
    let c = nodes.iter().find(|n| n.name == "node-c").expect("node-c");
    assert_eq!(
        c.state,
        NodeState::Cordoned,
        "a drained node stays cordoned"
    );
    let missing = a.drain_node("node-zz").await.expect_err("no such node");
    assert_eq!(missing.code(), Some(ErrorCode::NotFound), "{missing}");

    // Ten creates at once of a template a node has never had: one download of it, one
    // memory image, ten sandboxes.
    cluster.add_node_without_template("node-d").await;
    cluster
        .wait_nodes(3, |n| n.name != "node-d" || n.state == NodeState::Ready)
        .await;
    a.set_node_cordoned("node-a", true).await.expect("cordon a");
    let node_d = st.nodes.get("node-d").expect("node-d");
    let garage = cluster.garage();
    let images_before = garage.requests("GET", "/rootfs.ext4.zst");
    let burst = std::time::Instant::now();
    let created = futures::future::join_all((0..SANDBOXES).map(|_| {
        let a = a.clone();
        async move {
            let started = std::time::Instant::now();
            let sb = a.create_sandbox(&create_request()).await.expect("create");
            (sb, started.elapsed().as_secs_f64() * 1000.0)
        }
    }))
    .await;
    let burst_ms = burst.elapsed().as_millis();
    let mut latencies: Vec<f64> = created.iter().map(|c| c.1).collect();
    for (sb, _) in &created {
        assert_eq!(sb.node, "node-d", "{}", sb.id);
    }
    assert_eq!(
        garage.requests("GET", "/rootfs.ext4.zst") - images_before,
        1,
        "one download of the template image for ten creates"
    );
    let status = node_d.status().await.expect("node-d status");
    assert_eq!(status.templates_fetched, 2, "the template and its kernel");
    assert_eq!(
        status.memory_images.len(),
        1,
        "one memory image for ten creates: {:?}",
        status.memory_images
    );
    for (i, (sb, _)) in created.iter().enumerate() {
        assert_eq!(
            shell(&a, &sb.id, &format!("echo burst-{i}"), false)
                .await
                .trim(),
            format!("burst-{i}")
        );
    }
    println!(
        "ten creates of a template node-d lacked: {burst_ms} ms in all, each p50 {:.0} ms, p90 {:.0} ms",
        test_support::percentile(&mut latencies, 0.5),
        test_support::percentile(&mut latencies, 0.9)
    );

    // A build with COPY on a remote node (node-d, the first ready one): its files go to the
    // object store, and the node fetches them when the step needs them.
    let (archive, sha256) = tar_of(&[("hello.txt", b"copied across the cluster\n")]);
    let bad = a
        .put_build_files(&sha256, b"something else".to_vec())
        .await
        .expect_err("not the archive its name says");
    assert_eq!(bad.code(), Some(ErrorCode::InvalidRequest), "{bad}");
    let files_key = space_objects::ObjectKey::build_files(&sha256).expect("key");
    assert_eq!(objects.stat(&files_key).await.expect("stat"), None);
    a.put_build_files(&sha256, archive).await.expect("upload");
    assert!(objects.stat(&files_key).await.expect("stat").is_some());
    let events = test_support::follow_build(
        &a,
        &serde_json::json!({
            "name": "copied", "from_template": TEST_TEMPLATE,
            "steps": [{"copy": {"files": sha256, "dest": "/srv/copied"}}],
        }),
    )
    .await;
    assert!(
        matches!(
            events.last(),
            Some(space_core::template::TemplateBuildEvent::Ready { .. })
        ),
        "{events:?}"
    );
    assert!(
        format!("{events:?}").contains("from the object store"),
        "{events:?}"
    );
    let sb = a
        .create_sandbox(&CreateSandboxRequest {
            template: "copied".into(),
            ..Default::default()
        })
        .await
        .expect("create");
    assert_eq!(sb.node, "node-d");
    assert_eq!(
        shell(&a, &sb.id, "cat /srv/copied/hello.txt", false).await,
        "copied across the cluster\n"
    );

    // E2B's template builder, its requests spread over two replicas: what one was asked and
    // sent, the other finds (the object store holds both).
    cluster.add_replica().await;
    let (one, two) = (cluster.replicas[0].url(), cluster.replicas[1].url());
    let http = reqwest::Client::new();
    let key = cluster.api_key.clone();
    let e2b = |method: reqwest::Method, url: String| {
        http.request(method, url).header("X-API-KEY", key.clone())
    };
    let json_of = |r: reqwest::Response| async move {
        let status = r.status();
        let body: serde_json::Value = r.json().await.expect("a JSON answer");
        assert!(status.is_success(), "{status}: {body}");
        body
    };
    let asked = json_of(
        e2b(reqwest::Method::POST, format!("{one}/v3/templates"))
            .json(&serde_json::json!({"name": "e2b-across"}))
            .send()
            .await
            .expect("ask"),
    )
    .await;
    let (tid, bid) = (
        asked["templateID"]
            .as_str()
            .expect("template id")
            .to_owned(),
        asked["buildID"].as_str().expect("build id").to_owned(),
    );
    let (upload, hash) = tar_of(&[("hello.txt", b"sent to one, built by the other\n")]);
    let link = json_of(
        e2b(
            reqwest::Method::GET,
            format!("{two}/templates/{tid}/files/{hash}"),
        )
        .send()
        .await
        .expect("files link"),
    )
    .await;
    assert_eq!(link["present"], false, "{link}");
    let put = http
        .put(link["url"].as_str().expect("upload url"))
        .body(upload)
        .send()
        .await
        .expect("upload");
    assert!(put.status().is_success(), "{}", put.status());
    let link = json_of(
        e2b(
            reqwest::Method::GET,
            format!("{one}/templates/{tid}/files/{hash}"),
        )
        .send()
        .await
        .expect("files link"),
    )
    .await;
    assert_eq!(
        link["present"], true,
        "the other replica sees the upload: {link}"
    );
    let started = e2b(
        reqwest::Method::POST,
        format!("{two}/v2/templates/{tid}/builds/{bid}"),
    )
    .json(&serde_json::json!({
        "fromTemplate": TEST_TEMPLATE,
        "steps": [{"type": "COPY", "args": ["hello.txt", "/home/user/e2b/", "", ""], "filesHash": hash}],
    }))
    .send()
    .await
    .expect("start");
    assert!(started.status().is_success(), "{}", started.status());
    let status = wait_until(Duration::from_secs(300), "the E2B build to end", || async {
        let r = e2b(
            reqwest::Method::GET,
            format!("{one}/templates/{tid}/builds/{bid}/status"),
        )
        .send()
        .await
        .ok()?;
        let body: serde_json::Value = r.json().await.ok()?;
        matches!(body["status"].as_str(), Some("ready" | "error")).then_some(body)
    })
    .await;
    assert_eq!(status["status"], "ready", "{status}");
    let sb = a
        .create_sandbox(&CreateSandboxRequest {
            template: "e2b-across".into(),
            ..Default::default()
        })
        .await
        .expect("create");
    assert_eq!(
        shell(&a, &sb.id, "cat /home/user/e2b/hello.txt", false).await,
        "sent to one, built by the other\n"
    );
    cluster.stop().await;
}

/// A tar of `files` (name, content) and its SHA-256, as `PUT /v1/templates/files` takes it.
fn tar_of(files: &[(&str, &[u8])]) -> (Vec<u8>, String) {
    use sha2::Digest;
    let mut tar = tar::Builder::new(Vec::new());
    for (name, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, name, *content)
            .expect("tar entry");
    }
    let bytes = tar.into_inner().expect("tar");
    let sha = hex::encode(sha2::Sha256::digest(&bytes));
    (bytes, sha)
}

/// A sandbox whose policy is `on_node_loss: restore` keeps a checkpoint in object storage;
/// when its node is cut off and declared lost it is restored on another node from that
/// checkpoint. The cut-off node, alive all along, paused its copy before it could be
/// declared lost (it fences itself), and when it is back it drops that copy before it
/// serves again. A sandbox with the default policy on the same node stays `lost` until its
/// node returns, and runs on there untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_nodes_restorable_sandbox_comes_back_on_another_node() {
    use space_core::sandbox::OnNodeLoss;
    let cluster = Cluster::start_with_objects(1, 2).await;
    let a = cluster.clients[0].clone();
    let st = cluster.replicas[0].state().clone();

    // Bad policies are refused.
    let mut bad = create_request();
    bad.checkpoint_interval_secs = Some(60);
    let e = a
        .create_sandbox(&bad)
        .await
        .expect_err("an interval without restore");
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");
    bad.on_node_loss = OnNodeLoss::Restore;
    bad.checkpoint_interval_secs = Some(1);
    let e = a
        .create_sandbox(&bad)
        .await
        .expect_err("an interval too short");
    assert_eq!(e.code(), Some(ErrorCode::InvalidRequest), "{e}");

    a.set_node_cordoned("node-b", true).await.expect("cordon b");
    let mut req = create_request();
    req.on_node_loss = OnNodeLoss::Restore;
    // Long enough that the test's own calls mostly fall between two checkpoints (the
    // sandbox is `checkpointing` for each one's final pass; the upload does not stop it).
    req.checkpoint_interval_secs = Some(20);
    let sb = a.create_sandbox(&req).await.expect("create");
    let plain = a.create_sandbox(&create_request()).await.expect("create");
    // Restorable, but with no checkpoint before the loss: fenced, never restored, resumed
    // by its node when it is back.
    req.checkpoint_interval_secs = Some(3600);
    let young = a.create_sandbox(&req).await.expect("create");
    assert_eq!(
        (sb.node.as_str(), plain.node.as_str(), young.node.as_str()),
        ("node-a", "node-a", "node-a")
    );
    assert_eq!(sb.on_node_loss, OnNodeLoss::Restore);
    a.set_node_cordoned("node-b", false)
        .await
        .expect("uncordon b");
    shell(
        &a,
        &sb.id,
        "echo before-the-loss > /home/user/kept.txt && sync",
        false,
    )
    .await;
    let written = space_control::db::now_ms();
    wait_until(
        Duration::from_secs(90),
        "a checkpoint stored after the write",
        || async {
            let info = a.sandbox(&sb.id).await.ok()?;
            (info.stored_checkpoint_at_ms? > written && info.state == SandboxState::Running)
                .then_some(())
        },
    )
    .await;

    // node-a is cut off: alive, its VMs running, but no heartbeat reaches the control
    // plane.
    cluster.node("node-a").network.set_connected(false);
    wait_until(
        Duration::from_secs(120),
        "the sandbox to be restored on node-b",
        || async {
            let info = a.sandbox(&sb.id).await.ok()?;
            (info.state == SandboxState::Running && info.node == "node-b").then_some(())
        },
    )
    .await;
    assert_eq!(
        shell(&a, &sb.id, "cat /home/user/kept.txt", false)
            .await
            .trim(),
        "before-the-loss"
    );
    assert_eq!(
        a.sandbox(&plain.id).await.expect("plain").state,
        SandboxState::Lost,
        "no restore policy: lost until its node returns"
    );

    // node-a paused its copy of the restorable sandbox itself, and only that one.
    let log = cluster.node("node-a").log();
    assert!(
        log.lines()
            .any(|l| l.contains("sandbox paused (fenced)") && l.contains(sb.id.as_str())),
        "node-a fenced the restorable sandbox:\n{log}"
    );
    assert!(
        !log.lines()
            .any(|l| l.contains("(fenced)") && l.contains(plain.id.as_str())),
        "the plain sandbox runs on"
    );

    assert!(
        log.lines()
            .any(|l| l.contains("sandbox paused (fenced)") && l.contains(young.id.as_str())),
        "node-a fenced the restorable sandbox without a checkpoint too"
    );
    assert_eq!(
        a.sandbox(&young.id).await.expect("young").state,
        SandboxState::Lost,
        "no checkpoint to restore from: lost until its node returns"
    );

    // node-a is back: reconciled before it serves, it drops its copy of the restored
    // sandbox; the other two are back, the fenced one resumed by its node.
    cluster.node("node-a").network.set_connected(true);
    wait_until(
        Duration::from_secs(120),
        "node-a to serve again with the plain and the fenced sandbox",
        || async {
            let plain = a.sandbox(&plain.id).await.ok()?;
            let young = a.sandbox(&young.id).await.ok()?;
            (plain.state == SandboxState::Running && young.state == SandboxState::Running)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        shell(&a, &young.id, "echo awake", false).await.trim(),
        "awake"
    );
    let node_a = st.nodes.get("node-a").expect("node-a");
    assert!(
        node_a
            .sandbox(&sb.id)
            .await
            .expect("node-a answers")
            .is_none_or(|v| v.state == SandboxState::Deleted),
        "node-a never runs the restored sandbox again"
    );
    let info = a.sandbox(&sb.id).await.expect("sandbox");
    assert_eq!(info.node, "node-b");
    assert!(
        matches!(
            info.state,
            SandboxState::Running | SandboxState::Checkpointing
        ),
        "{:?}: running, or having its next checkpoint taken",
        info.state
    );
    cluster.stop().await;
}

/// A sandbox whose `snapshot_storage` is `object_store` has its persistent snapshots (a
/// checkpoint and a disk snapshot) uploaded before the call returns; they stay listed and
/// usable once the node that took them is lost: new sandboxes are made from them on another
/// node, which downloads each once however many creates need it. A tampered artifact is
/// refused; deleting a stored snapshot drops it everywhere and its objects are collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stored_persistent_snapshots_outlive_their_node() {
    use space_core::sandbox::{CreateSnapshotRequest, SnapshotStorage};
    use space_core::SnapshotKind;
    use space_objects::ObjectKey;
    let mut cluster = Cluster::start_with_objects(1, 2).await;
    let a = cluster.clients[0].clone();
    let st = cluster.replicas[0].state().clone();
    let objects = st.objects.clone().expect("an object store");

    a.set_node_cordoned("node-b", true).await.expect("cordon b");
    let mut req = create_request();
    req.snapshot_storage = SnapshotStorage::ObjectStore;
    let sb = a.create_sandbox(&req).await.expect("create");
    assert_eq!(sb.snapshot_storage, SnapshotStorage::ObjectStore);
    let plain = a.create_sandbox(&create_request()).await.expect("create");
    assert_eq!(
        (sb.node.as_str(), plain.node.as_str()),
        ("node-a", "node-a")
    );
    shell(
        &a,
        &sb.id,
        "echo taken-on-a > /home/user/kept.txt && sync",
        false,
    )
    .await;
    let persistent = |kind| CreateSnapshotRequest {
        kind,
        label: Some("keep".into()),
        persistent: true,
    };
    let checkpoint = a
        .create_snapshot(&sb.id, &persistent(SnapshotKind::Checkpoint))
        .await
        .expect("persistent checkpoint")
        .snapshot;
    let disk = a
        .create_snapshot(&sb.id, &persistent(SnapshotKind::Disk))
        .await
        .expect("persistent disk snapshot")
        .snapshot;
    assert!(checkpoint.stored && checkpoint.persistent, "{checkpoint:?}");
    assert!(disk.stored && disk.persistent, "{disk:?}");
    // Only persistent snapshots of such a sandbox are stored; other sandboxes' never.
    let transient = a
        .create_snapshot(
            &sb.id,
            &CreateSnapshotRequest {
                kind: SnapshotKind::Disk,
                ..Default::default()
            },
        )
        .await
        .expect("snapshot")
        .snapshot;
    assert!(!transient.stored);
    let local = a
        .create_snapshot(&plain.id, &persistent(SnapshotKind::Disk))
        .await
        .expect("snapshot")
        .snapshot;
    assert!(local.persistent && !local.stored);

    // node-a is lost: its stored snapshots stay listed, its other ones do not.
    cluster.node_mut("node-a").kill().await;
    wait_until(Duration::from_secs(120), "node-a to be lost", || async {
        let nodes = a.nodes().await.ok()?;
        let n = nodes.nodes.iter().find(|n| n.name == "node-a")?;
        (n.state == NodeState::Lost).then_some(())
    })
    .await;
    a.set_node_cordoned("node-b", false)
        .await
        .expect("uncordon b");
    let listed: BTreeSet<_> = a
        .tenant_snapshots(None::<&str>, None)
        .await
        .expect("list")
        .snapshots
        .into_iter()
        .map(|s| (s.id, s.stored))
        .collect();
    assert_eq!(
        listed,
        BTreeSet::from([(checkpoint.id.clone(), true), (disk.id.clone(), true)]),
        "only the stored snapshots are listed while their node is lost"
    );
    assert!(a.tenant_snapshot(&checkpoint.id).await.expect("get").stored);

    // A tampered artifact is refused, and nothing is made of it.
    let disk_key = ObjectKey::snapshot_artifact(disk.id.as_str(), "disk.delta.zst").expect("key");
    objects
        .put_bytes(&disk_key, bytes::Bytes::from_static(b"not a delta"))
        .await
        .expect("tamper");
    let from_disk = CreateSandboxRequest {
        snapshot: Some(disk.id.clone()),
        ..Default::default()
    };
    let e = a
        .create_sandbox(&from_disk)
        .await
        .expect_err("a tampered snapshot");
    assert_eq!(e.code(), Some(ErrorCode::SnapshotCorrupt), "{e}");

    // Two creates from the stored checkpoint at once: both on node-b, one download.
    let garage = cluster.garage();
    let memory_suffix = format!("{}/memory.zst", checkpoint.id);
    let before = garage.requests("GET", &memory_suffix);
    let from_checkpoint = CreateSandboxRequest {
        snapshot: Some(checkpoint.id.clone()),
        ..Default::default()
    };
    let (one, two) = tokio::join!(
        a.create_sandbox(&from_checkpoint),
        a.create_sandbox(&from_checkpoint)
    );
    for made in [
        one.expect("create from the checkpoint"),
        two.expect("again"),
    ] {
        assert_eq!(made.node, "node-b");
        assert_eq!(
            shell(&a, &made.id, "cat /home/user/kept.txt", false)
                .await
                .trim(),
            "taken-on-a"
        );
    }
    assert_eq!(
        garage.requests("GET", &memory_suffix) - before,
        1,
        "one download of the checkpoint's memory for both creates"
    );

    // Deleted: gone from the listing, from node-b, and from object storage.
    a.delete_tenant_snapshot(&checkpoint.id)
        .await
        .expect("delete");
    let e = a
        .tenant_snapshot(&checkpoint.id)
        .await
        .expect_err("deleted");
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    let node_b = st.nodes.get("node-b").expect("node-b");
    assert!(
        node_b
            .persistent_snapshot(&checkpoint.id)
            .await
            .expect("node-b answers")
            .is_none(),
        "node-b's copy is gone"
    );
    let prefix = ObjectKey::snapshot_prefix(checkpoint.id.as_str()).expect("prefix");
    wait_until(
        Duration::from_secs(60),
        "the deleted snapshot's objects to be collected",
        || async { objects.list(&prefix).await.ok()?.is_empty().then_some(()) },
    )
    .await;
    cluster.stop().await;
}
