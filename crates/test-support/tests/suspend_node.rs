//! Suspend and resume on the node itself, on real VMs, through the single-machine
//! default's object store (a local directory): the stored snapshot's artifacts, a suspend
//! given up, a sandbox freed then restored under its own id with its files and a process
//! that counts on from where it was, and a damaged artifact refused with nothing left.
//! (The control plane drives the same operations through `/v1`; the reconciler is off here
//! because the test plays the control plane.)

use std::time::Duration;

use space_core::sandbox::CreateSandboxRequest;
use space_core::{ErrorCode, SandboxId, SandboxState, SnapshotId};
use space_node::suspend::{ARTIFACTS, MEMORY_ARTIFACT};
use space_node::{Node, NodeError};
use space_node_proto::api::NodeApi;
use space_node_proto::{ResumeSandbox, SnapshotOwner, StoredSnapshot, SuspendSandbox};
use test_support::{counter, shell, start_counter, wait_until, TestServer, TEST_TEMPLATE};

async fn suspend(n: &Node, id: &SandboxId) -> StoredSnapshot {
    let tenant = n.sandbox(id).and_then(|r| r.tenant).expect("tenant");
    n.suspend(SuspendSandbox {
        id: id.clone(),
        snapshot: SnapshotId::generate(),
        owner: SnapshotOwner {
            tenant,
            labels: Default::default(),
        },
    })
    .await
    .expect("suspend")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_suspended_sandbox_comes_back_under_its_id_with_its_files_and_processes() {
    let ts = TestServer::start_with(|c| c.run_reconciler = false).await;
    let c = &ts.client;
    let n = ts.server().local_node().clone();
    let id = c
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("create")
        .id;
    let tenant = n.sandbox(&id).and_then(|r| r.tenant).expect("tenant");
    shell(c, &id, "echo before-suspend > /home/user/kept.txt", false).await;
    start_counter(c, &id, "/home/user/count").await;

    // Suspended, then given up: it runs on.
    let first = suspend(&n, &id).await;
    assert_eq!(n.sandbox(&id).unwrap().state, SandboxState::Suspending);
    let names: Vec<&str> = first.artifacts.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ARTIFACTS.to_vec());
    assert!(
        first.memory_bytes > 0 && first.disk_changed_blocks > 0,
        "{first:?}"
    );
    n.abort_suspend(&id).await.expect("abort");
    let before = counter(c, &id, "/home/user/count").await;
    wait_until(Duration::from_secs(30), "the counter to run on", || async {
        (counter(c, &id, "/home/user/count").await > before).then_some(())
    })
    .await;

    // Suspended for good: the node frees it, then restores it from the stored snapshot.
    let stored = suspend(&n, &id).await;
    let at_suspend = n.sandbox(&id).unwrap();
    assert_eq!(at_suspend.state, SandboxState::Suspending);
    n.delete(&id).await.expect("free the suspended sandbox");
    assert!(n
        .sandbox(&id)
        .is_none_or(|r| r.state == SandboxState::Deleted));
    let resumed = n
        .resume_suspended(ResumeSandbox {
            suspended: stored.clone(),
            tenant: tenant.clone(),
            seal_at_rest: false,
        })
        .await
        .expect("resume");
    assert_eq!(resumed.id, id);
    assert_eq!(resumed.state, SandboxState::Running);
    assert_eq!(
        shell(c, &id, "cat /home/user/kept.txt", false).await.trim(),
        "before-suspend"
    );
    // The counter carries on from its count at the suspend, not from zero.
    let after = counter(c, &id, "/home/user/count").await;
    assert!(after > before, "{after} after, {before} before the suspend");
    wait_until(
        Duration::from_secs(30),
        "the restored counter to run",
        || async { (counter(c, &id, "/home/user/count").await > after).then_some(()) },
    )
    .await;
    // A second resume of the same id is refused: it is here already.
    let twice = n
        .resume_suspended(ResumeSandbox {
            suspended: stored.clone(),
            tenant: tenant.clone(),
            seal_at_rest: false,
        })
        .await
        .expect_err("resumed twice");
    assert_eq!(twice.code(), ErrorCode::AlreadyExists);

    // A damaged artifact: the resume refuses it and leaves nothing behind.
    let damaged = suspend(&n, &id).await;
    n.delete(&id).await.expect("free");
    let memory = damaged
        .artifacts
        .iter()
        .find(|a| a.name == MEMORY_ARTIFACT)
        .expect("memory artifact");
    let file = ts.data_dir.join("objects").join(&memory.key);
    let mut bytes = std::fs::read(&file).expect("stored memory");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&file, &bytes).expect("damage it");
    let err = n
        .resume_suspended(ResumeSandbox {
            suspended: damaged.clone(),
            tenant: tenant.clone(),
            seal_at_rest: false,
        })
        .await
        .expect_err("a damaged artifact");
    assert!(matches!(err, NodeError::SnapshotCorrupt(_)), "{err}");
    assert_eq!(err.code(), ErrorCode::SnapshotCorrupt);
    assert!(n
        .sandbox(&id)
        .is_none_or(|r| r.state == SandboxState::Deleted));
    assert!(
        !ts.data_dir
            .join("store/sandboxes")
            .join(id.as_str())
            .join("disk.raw")
            .exists(),
        "nothing of it is left"
    );
    // Cut short past what the manifest can tell (its digest made to match): the download
    // passes, the restore refuses it, and again nothing is left; the intact one then
    // resumes under the same id.
    bytes[mid] ^= 0xff;
    let cut = &bytes[..mid];
    std::fs::write(&file, cut).expect("cut it");
    let mut forged = damaged.clone();
    for a in forged
        .artifacts
        .iter_mut()
        .filter(|a| a.name == MEMORY_ARTIFACT)
    {
        use sha2::Digest;
        a.sha256 = hex::encode(sha2::Sha256::digest(cut));
        a.size = cut.len() as u64;
    }
    n.resume_suspended(ResumeSandbox {
        suspended: forged,
        tenant: tenant.clone(),
        seal_at_rest: false,
    })
    .await
    .expect_err("a damaged state");
    assert!(n
        .sandbox(&id)
        .is_none_or(|r| r.state == SandboxState::Deleted));
    std::fs::write(&file, &bytes).expect("mend it");
    n.resume_suspended(ResumeSandbox {
        suspended: damaged.clone(),
        tenant: tenant.clone(),
        seal_at_rest: false,
    })
    .await
    .expect("the intact snapshot resumes after a failed resume");
    assert_eq!(
        shell(c, &id, "cat /home/user/kept.txt", false).await.trim(),
        "before-suspend"
    );
    n.delete(&id).await.expect("free");
    // Another tenant cannot resume it.
    let foreign = n
        .resume_suspended(ResumeSandbox {
            suspended: stored,
            tenant: space_core::TenantId::generate(),
            seal_at_rest: false,
        })
        .await
        .expect_err("another tenant");
    assert_eq!(foreign.code(), ErrorCode::SnapshotCorrupt);
    ts.stop().await;
}
