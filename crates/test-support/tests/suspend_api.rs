//! Suspend and resume through `/v1` on the single-machine default (its object store a
//! local directory), on real VMs: a suspended sandbox holds nothing on the node, is listed
//! `suspended`, refuses calls that need its guest until resumed (unless it wakes itself,
//! `auto_resume`), and comes back with its files, its counting process, its labels and
//! policy; its stored snapshot is collected once nothing needs it; a suspended sandbox can
//! be deleted.

use std::time::Duration;

use space_core::sandbox::CreateSandboxRequest;
use space_core::{ErrorCode, SandboxState};
use test_support::{counter, shell, start_counter, wait_until, TestServer, TEST_TEMPLATE};

/// How many stored snapshots have objects in the local store (a directory emptied of its
/// objects does not count).
fn stored_objects(ts: &TestServer) -> usize {
    let dir = ts.data_dir.join("objects").join("snapshots");
    std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_dir(e.path()).is_ok_and(|mut files| files.next().is_some())
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suspend_frees_the_node_and_resume_brings_everything_back() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let node = ts.server().local_node().clone();
    let mut req = CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    };
    req.labels.insert("team".into(), "agents".into());
    req.egress = Some(
        serde_json::from_value(serde_json::json!({
            "mode": "allowlist",
            "rules": [{"action": "allow", "destination": {"domain": "example.com"}}]
        }))
        .expect("policy"),
    );
    let sb = c.create_sandbox(&req).await.expect("create");
    let id = sb.id.clone();
    shell(c, &id, "echo kept > /home/user/kept.txt", false).await;
    start_counter(c, &id, "/home/user/count").await;

    let suspended = c.suspend_sandbox(&id).await.expect("suspend");
    assert_eq!(suspended.state, SandboxState::Suspended, "{suspended:?}");
    assert_eq!(stored_objects(&ts), 1, "one stored snapshot");
    assert!(
        node.sandbox(&id)
            .is_none_or(|r| r.state == SandboxState::Deleted),
        "the node holds nothing of it"
    );
    let listed = c.list_sandboxes(&[]).await.expect("list");
    assert_eq!(listed.sandboxes[0].state, SandboxState::Suspended);
    // Its guest is not there: a clear 409, not a hang or a 500.
    let err = c
        .run(&id, &space_core::process::ProcessSpec::shell("true"))
        .await
        .expect_err("suspended");
    assert_eq!(err.code(), Some(ErrorCode::Conflict), "{err}");
    assert!(err.to_string().contains("suspended"), "{err}");
    let twice = c.suspend_sandbox(&id).await.expect_err("suspended twice");
    assert_eq!(twice.code(), Some(ErrorCode::Conflict));

    let before = counter(c, &id, "/home/user/count").await;
    let resumed = c.resume_sandbox(&id).await.expect("resume");
    assert_eq!(resumed.state, SandboxState::Running, "{resumed:?}");
    assert_eq!(
        resumed.labels.get("team").map(String::as_str),
        Some("agents")
    );
    assert_eq!(resumed.egress, sb.egress, "its egress policy came back");
    assert_eq!(
        shell(c, &id, "cat /home/user/kept.txt", false).await.trim(),
        "kept"
    );
    let after = counter(c, &id, "/home/user/count").await;
    assert!(after >= before, "{after} after, {before} at the suspend");
    wait_until(Duration::from_secs(30), "the counter to run on", || async {
        (counter(c, &id, "/home/user/count").await > after).then_some(())
    })
    .await;
    // Nothing needs the stored snapshot any more: the leader collects it.
    wait_until(
        Duration::from_secs(30),
        "the stored snapshot to be collected",
        || async { (stored_objects(&ts) == 0).then_some(()) },
    )
    .await;

    // A suspended sandbox can be deleted; its snapshot goes too.
    c.suspend_sandbox(&id).await.expect("suspend again");
    c.delete_sandbox(id.as_str())
        .await
        .expect("delete suspended");
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Deleted
    );
    wait_until(
        Duration::from_secs(30),
        "its stored snapshot to be collected",
        || async { (stored_objects(&ts) == 0).then_some(()) },
    )
    .await;
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_suspended_sandbox_with_auto_resume_wakes_for_a_call() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let sb = c
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            auto_resume: true,
            ..Default::default()
        })
        .await
        .expect("create");
    shell(c, &sb.id, "echo here > /home/user/f", false).await;
    assert_eq!(
        c.suspend_sandbox(&sb.id).await.expect("suspend").state,
        SandboxState::Suspended
    );
    // The call that needs the guest resumes it.
    assert_eq!(
        shell(c, &sb.id, "cat /home/user/f", false).await.trim(),
        "here"
    );
    assert_eq!(
        c.sandbox(&sb.id).await.expect("get").state,
        SandboxState::Running
    );
    ts.stop().await;
}

/// On the single-machine default, a persistent snapshot of a sandbox whose
/// `snapshot_storage` is `object_store` goes to the local object store too: once its
/// sandbox is deleted and the node has lost its own copy, a sandbox is still made from it
/// (fetched back from the store); deleting it removes its objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stored_persistent_snapshot_is_made_again_from_the_local_store() {
    use space_core::sandbox::{CreateSnapshotRequest, SnapshotStorage};
    use space_core::SnapshotKind;
    let ts = TestServer::start().await;
    let c = &ts.client;
    let node = ts.server().local_node().clone();
    let req = CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        snapshot_storage: SnapshotStorage::ObjectStore,
        ..Default::default()
    };
    let sb = c.create_sandbox(&req).await.expect("create");
    shell(c, &sb.id, "echo kept > /home/user/kept.txt && sync", false).await;
    start_counter(c, &sb.id, "/home/user/count").await;
    let snap = c
        .create_snapshot(
            &sb.id,
            &CreateSnapshotRequest {
                kind: SnapshotKind::Checkpoint,
                label: None,
                persistent: true,
            },
        )
        .await
        .expect("persistent checkpoint")
        .snapshot;
    assert!(snap.stored, "{snap:?}");
    assert_eq!(stored_objects(&ts), 1, "one stored snapshot");
    c.delete_sandbox(&sb.id).await.expect("delete");
    // The node loses its copy (as a node whose disk was replaced would).
    node.delete_persistent_snapshot(&snap.id)
        .await
        .expect("the node's copy");
    let listed = c.tenant_snapshot(&snap.id).await.expect("still listed");
    assert!(listed.stored && listed.persistent);

    let made = c
        .create_sandbox(&CreateSandboxRequest {
            snapshot: Some(snap.id.clone()),
            ..Default::default()
        })
        .await
        .expect("create from the stored snapshot");
    assert_eq!(
        shell(c, &made.id, "cat /home/user/kept.txt", false)
            .await
            .trim(),
        "kept"
    );
    let first = counter(c, &made.id, "/home/user/count").await;
    wait_until(
        Duration::from_secs(30),
        "the process to count on",
        || async { (counter(c, &made.id, "/home/user/count").await > first).then_some(()) },
    )
    .await;

    c.delete_tenant_snapshot(&snap.id).await.expect("delete");
    let e = c.tenant_snapshot(&snap.id).await.expect_err("deleted");
    assert_eq!(e.code(), Some(ErrorCode::NotFound), "{e}");
    wait_until(
        Duration::from_secs(60),
        "the snapshot's objects to be collected",
        || async { (stored_objects(&ts) == 0).then_some(()) },
    )
    .await;
}
