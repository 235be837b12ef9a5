//! The node protocol end to end, on a real VM: a node agent in front of a test server's
//! node, and the control plane's `RemoteNode` client of it over mutual TLS on loopback.
//! Every call of `NodeApi` that a sandbox's life needs goes through the agent; guest calls
//! (processes, output streams, files both ways, stat) go through its relay. Bad peers are
//! refused: a node's certificate acting as the control plane, another cluster's
//! certificate, an expired one, an agent that is not the node asked for, and malformed calls.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;
use space_core::process::{OutputEvent, OutputStream, ProcessSpec};
use space_core::{ErrorCode, SandboxId, SandboxState, SnapshotKind, TenantId};
use space_node_proto::api::NodeApi;
use space_node_proto::identity::{ClusterCa, PeerRole, PEER_VALIDITY};
use space_node_proto::{
    CreateSandbox, NodeCallError, PauseCause, SandboxSettings, SnapshotRequest,
};
use test_support::node_agent::{upload_body, AgentFixture};
use test_support::{TestServer, TEST_TEMPLATE};

fn settings() -> SandboxSettings {
    SandboxSettings {
        env: BTreeMap::from([("GREETING".into(), "hello".into())]),
        ..SandboxSettings::new(TenantId::generate())
    }
}

async fn run(guest: &space_guest_client::GuestClient, line: &str) -> (String, i32) {
    let info = guest
        .start_process(&ProcessSpec::shell(line))
        .await
        .expect("start");
    let mut events = guest.output(info.id, None).await.expect("output");
    let mut out = String::new();
    while let Some(ev) = events.next().await {
        let ev = ev.expect("event");
        if let Some((OutputStream::Stdout, bytes)) = ev.bytes() {
            out.push_str(&String::from_utf8_lossy(&bytes));
        }
        if let OutputEvent::Exit { status, .. } = ev {
            return (out, status.exit_code.unwrap_or(-1));
        }
    }
    panic!("no exit event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sandbox_lives_its_life_through_the_node_agent() {
    // The reconciler would delete sandboxes the database does not know: these are made
    // through the node protocol directly.
    let ts = TestServer::start_with(|c| c.run_reconciler = false).await;
    let node: Arc<dyn NodeApi> = Arc::new(ts.server().local_node().clone());
    let agent = AgentFixture::serve(node, "local").await;
    let remote = agent.client();

    let status = remote.status().await.expect("status");
    assert!(status.capacity.vcpus > 0, "{status:?}");
    let template = remote.template(TEST_TEMPLATE).await.expect("template");
    assert!(matches!(
        remote.template("no-such-template").await,
        Err(NodeCallError::TemplateNotFound { .. })
    ));

    let id = SandboxId::generate();
    let view = remote
        .create_sandbox(CreateSandbox {
            id: id.clone(),
            template: TEST_TEMPLATE.into(),
            template_digest: None,
            resources: Default::default(),
            settings: settings(),
        })
        .await
        .expect("create through the agent");
    assert_eq!(view.state, SandboxState::Running);
    assert_eq!(view.template_digest, template.digest);
    assert!(remote
        .sandboxes()
        .await
        .expect("list")
        .iter()
        .any(|v| v.id == id));

    // Guest calls through the relay: a process and its output stream, the environment.
    let guest = remote.guest(&id).await.expect("guest through the relay");
    let (out, code) = run(&guest, "echo $GREETING from $(hostname)").await;
    assert_eq!(code, 0);
    assert!(out.starts_with("hello from"), "{out:?}");
    let (_, code) = run(&guest, "exit 3").await;
    assert_eq!(code, 3);

    // A 4 MiB file up and down, streamed both ways.
    let data: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let stat = guest
        .write_file(
            "/home/user/big.bin",
            None,
            None,
            &BTreeMap::new(),
            upload_body(&Bytes::from(data.clone())),
        )
        .await
        .expect("write through the relay");
    assert_eq!(stat.size, data.len() as u64);
    let (size, mut body) = guest
        .read_file("/home/user/big.bin", None)
        .await
        .expect("read through the relay");
    assert_eq!(size, Some(data.len() as u64));
    let mut back = Vec::new();
    while let Some(chunk) = body.next().await {
        back.extend_from_slice(&chunk.expect("chunk"));
    }
    assert!(back == data, "the file came back different");
    // A guest's refusal crosses the relay as it is.
    let missing = guest.stat("/no/such/file", None).await.unwrap_err();
    assert!(
        matches!(&missing, space_guest_client::GuestError::Remote { body, .. } if body.code == ErrorCode::NotFound),
        "{missing}"
    );

    // Lifecycle and snapshots.
    let mut feed = remote.subscribe_events().await.expect("event feed");
    let paused = remote.pause(&id, PauseCause::User).await.expect("pause");
    assert_eq!(paused.state, SandboxState::Paused);
    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(n) = feed.next().await {
            if let space_node_proto::api::EventNotice::Entry(e) = n {
                if e.sandbox_id == id && e.to == SandboxState::Paused {
                    return true;
                }
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(seen, "the pause reached the event feed");
    let conflict = remote.pause(&id, PauseCause::User).await.unwrap_err();
    assert_eq!(conflict.code(), ErrorCode::Conflict, "{conflict}");
    remote.resume(&id).await.expect("resume");
    let taken = remote
        .take_snapshot(
            &id,
            SnapshotRequest {
                kind: SnapshotKind::Disk,
                label: Some("through the agent".into()),
                persistent: None,
            },
        )
        .await
        .expect("disk snapshot");
    assert!(remote
        .snapshots(&id)
        .await
        .expect("snapshots")
        .iter()
        .any(|s| s.id == taken.snapshot.id));
    assert!(!remote.events(&id).await.expect("log").is_empty());

    remote.delete(&id).await.expect("delete");
    // Idempotent: deleting again is no error.
    remote.delete(&id).await.expect("delete again");
    assert!(matches!(
        remote.guest(&id).await,
        Err(NodeCallError::SandboxNotFound { .. }) | Err(NodeCallError::Refused { .. })
    ));
    agent.stop().await;
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_control_plane_of_the_cluster_is_served() {
    let ts = TestServer::start_with(|c| c.run_reconciler = false).await;
    let node: Arc<dyn NodeApi> = Arc::new(ts.server().local_node().clone());
    let agent = AgentFixture::serve(node, "local").await;
    let before = agent
        .client()
        .sandboxes()
        .await
        .expect("the control plane is served");

    // A node's certificate, valid in this cluster, cannot act as the control plane.
    let node_id = agent
        .ca
        .issue(&PeerRole::Node("n2".into()), PEER_VALIDITY)
        .expect("node identity");
    let err = agent
        .client_as(&node_id, "local")
        .sandboxes()
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Forbidden, "{err}");
    assert!(
        err.to_string().contains("cannot act as the control plane"),
        "{err}"
    );

    // Another cluster's control plane: the handshake fails.
    let other = ClusterCa::generate().expect("other CA");
    let stranger = other
        .issue(&PeerRole::ControlPlane, PEER_VALIDITY)
        .expect("stranger");
    let err = agent
        .client_as(&stranger, "local")
        .status()
        .await
        .unwrap_err();
    assert!(matches!(err, NodeCallError::Unavailable { .. }), "{err}");

    // An expired control-plane certificate: the handshake fails.
    let expired = agent
        .ca
        .issue_at(
            &PeerRole::ControlPlane,
            SystemTime::now() - Duration::from_secs(7200),
            Duration::from_secs(600),
        )
        .expect("expired identity");
    let err = agent
        .client_as(&expired, "local")
        .status()
        .await
        .unwrap_err();
    assert!(matches!(err, NodeCallError::Unavailable { .. }), "{err}");

    // The agent is not the node the control plane meant to reach: its name is checked.
    let err = agent
        .client_as(&agent.control_plane_identity(), "n3")
        .status()
        .await
        .unwrap_err();
    assert!(matches!(err, NodeCallError::Unavailable { .. }), "{err}");
    assert_eq!(err.code().http_status(), 503);

    // Nothing changed on the node.
    assert_eq!(agent.client().sandboxes().await.expect("list"), before);
    agent.stop().await;
    ts.stop().await;
}
