//! Persistent snapshots and sandboxes created from snapshots, on real VMs: a checkpoint
//! taken `persistent` outlives its sandbox and a server restart, and two sandboxes created
//! from it at once each find the file and the running process it held, unique (hostname,
//! random numbers) and with their own env and labels; a disk snapshot boots new sandboxes
//! with its files, from a live sandbox and after that sandbox is gone; snapshots are the
//! tenant's alone; a deleted snapshot is gone for good.

use std::collections::BTreeMap;
use std::time::Duration;

use space_cli::client::SpaceClient;
use space_core::process::ProcessSpec;
use space_core::sandbox::{
    CreateSandboxRequest, CreateSnapshotRequest, ResourcesRequest, SandboxInfo, SandboxOrigin,
};
use space_core::{ErrorCode, SandboxId, SandboxState, SnapshotId, SnapshotKind, SnapshotSchedule};
use test_support::{
    api_error, counter, shell, start_counter, wait_until, TestServer, TEST_TEMPLATE,
};

/// The file the counter process shows its count in.
const COUNTER: &str = "/home/user/counter";

/// A sandbox without scheduled snapshots (so listings hold only what the test took), with
/// `X=1` in its env, label `app=a` and `/home/user/kept.txt`.
async fn source(c: &SpaceClient) -> SandboxId {
    let id = c
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            snapshots: Some(SnapshotSchedule::disabled()),
            env: BTreeMap::from([("X".to_owned(), "1".to_owned())]),
            labels: BTreeMap::from([("app".to_owned(), "a".to_owned())]),
            ..Default::default()
        })
        .await
        .expect("create")
        .id;
    c.write_file(&id, "/home/user/kept.txt", None, None, b"kept".to_vec())
        .await
        .expect("write");
    id
}

async fn snapshot(
    c: &SpaceClient,
    id: &SandboxId,
    kind: SnapshotKind,
    persistent: bool,
) -> SnapshotId {
    let taken = c
        .create_snapshot(
            id,
            &CreateSnapshotRequest {
                kind,
                label: Some(format!("{kind} {persistent}")),
                persistent,
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{kind} snapshot: {e}"));
    assert_eq!(taken.snapshot.persistent, persistent);
    taken.snapshot.id
}

/// A create from `snap` with `Y=2` and label `child=<n>`.
fn from_snapshot(snap: &SnapshotId, n: u32) -> CreateSandboxRequest {
    CreateSandboxRequest {
        snapshot: Some(snap.clone()),
        env: BTreeMap::from([("Y".to_owned(), "2".to_owned())]),
        labels: BTreeMap::from([("child".to_owned(), n.to_string())]),
        snapshots: Some(SnapshotSchedule::disabled()),
        ..Default::default()
    }
}

/// Ids of the tenant's snapshots, as listed.
async fn listed(c: &SpaceClient) -> Vec<SnapshotId> {
    let list = c
        .tenant_snapshots(None::<&SandboxId>, None)
        .await
        .expect("list");
    list.snapshots.into_iter().map(|s| s.id).collect()
}

/// Checks a sandbox made from a snapshot of `src`: the snapshot's file, template and labels,
/// the request's env on top of the snapshot's, its own hostname.
async fn check_child(
    c: &SpaceClient,
    child: &SandboxInfo,
    src: &SandboxId,
    snap: &SnapshotId,
    n: u32,
) {
    let id = &child.id;
    assert_eq!(child.state, SandboxState::Running, "{child:?}");
    assert_eq!(child.from_snapshot.as_ref(), Some(snap));
    assert_eq!(child.template, TEST_TEMPLATE);
    assert_eq!(
        child.labels,
        BTreeMap::from([
            ("app".to_owned(), "a".to_owned()),
            ("child".to_owned(), n.to_string())
        ])
    );
    assert_eq!(child.env_keys, vec!["X".to_owned(), "Y".to_owned()]);
    assert_eq!(shell(c, id, "cat /home/user/kept.txt", false).await, "kept");
    assert_eq!(shell(c, id, "echo $X $Y", false).await, "1 2\n");
    assert_eq!(shell(c, id, "hostname", false).await, format!("{id}\n"));
    assert_ne!(id, src);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_persistent_checkpoint_outlives_its_sandbox_and_a_restart_and_starts_sandboxes() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let src = source(c).await;
    start_counter(c, &src, COUNTER).await;
    let snap = snapshot(c, &src, SnapshotKind::Checkpoint, true).await;
    let gone = snapshot(c, &src, SnapshotKind::Disk, false).await;
    // The source kept running through the checkpoint (its workload was frozen and thawed).
    let at = counter(c, &src, COUNTER).await;
    wait_until(
        Duration::from_secs(30),
        "the source's counter to go on",
        || async { (counter(c, &src, COUNTER).await > at).then_some(()) },
    )
    .await;
    assert_eq!(
        listed(c).await,
        vec![gone.clone(), snap.clone()],
        "newest first"
    );

    c.delete_sandbox(&src).await.expect("delete the source");
    // Kept after its sandbox: listed, found, and alone (the other snapshot went with it).
    assert_eq!(listed(c).await, vec![snap.clone()]);
    let info = c.tenant_snapshot(&snap).await.expect("get");
    assert_eq!(
        (info.sandbox_id.clone(), info.kind, info.persistent),
        (src.clone(), SnapshotKind::Checkpoint, true)
    );
    let by_sandbox = c
        .tenant_snapshots(Some(&src), None)
        .await
        .expect("by sandbox");
    let ids: Vec<&SnapshotId> = by_sandbox.snapshots.iter().map(|s| &s.id).collect();
    assert_eq!(
        ids,
        vec![&snap],
        "sizes may move as btrfs settles; the ids do not"
    );
    let by_label = c
        .tenant_snapshots(None::<&SandboxId>, Some("checkpoint true"))
        .await
        .expect("by label");
    assert_eq!(by_label.snapshots.len(), 1);
    let (status, _, _) = api_error(c.tenant_snapshot(&gone).await);
    assert_eq!(status, 404);

    // A server restart between the snapshot and the creates.
    let (data_dir, config) = ts.stop_keep_vms().await;
    let ts = TestServer::start_on(data_dir, config).await;
    let c = &ts.client;
    assert_eq!(listed(c).await, vec![snap.clone()]);

    let (req_a, req_b) = (from_snapshot(&snap, 1), from_snapshot(&snap, 2));
    let (a, b) = tokio::join!(c.create_sandbox(&req_a), c.create_sandbox(&req_b));
    let (a, b) = (a.expect("create a"), b.expect("create b"));
    for (child, n) in [(&a, 1), (&b, 2)] {
        assert_eq!(
            child.origin,
            Some(SandboxOrigin::Checkpoint {
                sandbox_id: src.clone(),
                snapshot_id: Some(snap.clone())
            })
        );
        check_child(c, child, &src, &snap, n).await;
        // The process started before the checkpoint runs on in each.
        let procs = c.processes(&child.id).await.expect("processes");
        assert!(
            procs
                .iter()
                .any(|p| p.tag.as_deref() == Some("counter") && p.exit.is_none()),
            "{procs:?}"
        );
        let at = counter(c, &child.id, COUNTER).await;
        assert!(at > 0);
        wait_until(
            Duration::from_secs(30),
            "the child's counter to go on",
            || async { (counter(c, &child.id, COUNTER).await > at).then_some(()) },
        )
        .await;
    }
    // Each was made unique: their random numbers differ.
    let random = "head -c 16 /dev/urandom | od -An -tx1";
    assert_ne!(
        shell(c, &a.id, random, false).await,
        shell(c, &b.id, random, false).await
    );

    // Deleting the snapshot: gone from every route; the sandboxes made from it live on.
    c.delete_tenant_snapshot(&snap).await.expect("delete");
    let (status, code, _) = api_error(c.delete_tenant_snapshot(&snap).await);
    assert_eq!((status, code), (404, ErrorCode::NotFound));
    assert!(listed(c).await.is_empty());
    let (status, _, _) = api_error(c.create_sandbox(&from_snapshot(&snap, 3)).await);
    assert_eq!(status, 404);
    assert_eq!(
        shell(c, &a.id, "cat /home/user/kept.txt", false).await,
        "kept"
    );
    assert!(!ts
        .data_dir
        .join("store/snapshots")
        .join(snap.as_str())
        .exists());
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_snapshots_boot_new_sandboxes_and_are_the_tenants_alone() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let other = ts.new_tenant_client("other").await;
    let src = source(c).await;
    let mut sleeper = ProcessSpec::argv(["sleep", "3600"]);
    sleeper.tag = Some("sleeper".into());
    c.start_process(&src, &sleeper).await.expect("sleeper");
    let plain = snapshot(c, &src, SnapshotKind::Disk, false).await;
    let kept = snapshot(c, &src, SnapshotKind::Disk, true).await;

    // Only with `snapshot` alone.
    let mut bad = from_snapshot(&kept, 0);
    bad.template = TEST_TEMPLATE.into();
    let (status, code, msg) = api_error(c.create_sandbox(&bad).await);
    assert_eq!((status, code), (400, ErrorCode::InvalidRequest), "{msg}");
    let mut bad = from_snapshot(&kept, 0);
    bad.resources = ResourcesRequest {
        vcpus: Some(2),
        ..Default::default()
    };
    assert_eq!(api_error(c.create_sandbox(&bad).await).0, 400);
    let (status, _, _) = api_error(
        c.create_sandbox(&from_snapshot(&SnapshotId::generate(), 0))
            .await,
    );
    assert_eq!(status, 404);

    // Another tenant sees none of it, by any route.
    assert!(listed(&other).await.is_empty());
    for snap in [&plain, &kept] {
        assert_eq!(api_error(other.tenant_snapshot(snap).await).0, 404);
        assert_eq!(api_error(other.delete_tenant_snapshot(snap).await).0, 404);
        assert_eq!(
            api_error(other.create_sandbox(&from_snapshot(snap, 0)).await).0,
            404
        );
    }
    assert_eq!(api_error(other.snapshots(&src).await).0, 404);

    // From a (not persistent) snapshot of the live sandbox: its disk, booted.
    let one = c
        .create_sandbox(&from_snapshot(&plain, 1))
        .await
        .expect("create from live");
    assert_eq!(one.origin, Some(SandboxOrigin::Boot));
    check_child(c, &one, &src, &plain, 1).await;
    assert_eq!(
        shell(c, &one.id, "pgrep -f 'sleep 3600' || echo none", false).await,
        "none\n",
        "a disk snapshot brings no processes"
    );

    // From the persistent one after the sandbox is gone.
    c.delete_sandbox(&src).await.expect("delete the source");
    assert_eq!(listed(c).await, vec![kept.clone()]);
    assert!(listed(&other).await.is_empty());
    assert_eq!(api_error(other.tenant_snapshot(&kept).await).0, 404);
    assert_eq!(api_error(other.delete_tenant_snapshot(&kept).await).0, 404);
    let two = c
        .create_sandbox(&from_snapshot(&kept, 2))
        .await
        .expect("create from kept");
    check_child(c, &two, &src, &kept, 2).await;
    // The new sandbox's own snapshots list with the persistent one.
    let own = snapshot(c, &two.id, SnapshotKind::Disk, false).await;
    assert_eq!(listed(c).await, vec![own, kept.clone()]);
    // The per-sandbox routes of a deleted sandbox stay 404; the tenant route deletes.
    assert_eq!(api_error(c.delete_snapshot(&src, &kept).await).0, 404);
    c.delete_tenant_snapshot(&kept).await.expect("delete");
    assert_eq!(api_error(c.tenant_snapshot(&kept).await).0, 404);
    ts.stop().await;
}
