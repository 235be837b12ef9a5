//! Many nodes on one machine: two control-plane replicas on one database (PostgreSQL in
//! the suite) and three node processes, each in a network namespace of its own with its
//! own data directory and store, joined with one-time tokens. Everything real: VMs,
//! mutual TLS, heartbeats over veths.

use std::collections::BTreeSet;
use std::time::Duration;

use space_core::cluster::NodeState;
use space_core::sandbox::CreateSandboxRequest;
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

    // The surviving replica sees one consistent cluster: every sandbox a node holds has a
    // live row, none twice; creates the dead replica left are adopted once they run; the
    // delete it recorded is finished on the node; the paused one is paused or running.
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
            let recorded = live
                .iter()
                .filter(|r| ids.contains(&r.id))
                .all(|r| r.create_latency_ms.is_some());
            (ids.len() == on_nodes.len() && ids.is_subset(&rows) && stable && recorded)
                .then_some((live, ids))
        },
    )
    .await;
    let (live, on_nodes) = converged;
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
    // A live row without a sandbox on a node is a create that never reached one: shown
    // as creating (until the grace passes), never as a duplicate.
    for row in live.iter().filter(|r| !on_nodes.contains(&r.id)) {
        let info = a.sandbox(&row.id).await.expect("get");
        assert_eq!(info.state, SandboxState::Creating, "{info:?}");
    }
    cluster.stop().await;
}
