//! Snapshots, rollback and fork through the HTTP API, on real VMs: a disk snapshot of a
//! running sandbox (it keeps running), undoing `rm -rf` by rolling back to it, a checkpoint
//! that brings a process back as it was, listing, deleting and diffing snapshots, the
//! errors (another sandbox's snapshot, a paused sandbox, a guest that froze itself), and a
//! fork into children that run apart and do not share their random numbers.

use std::time::{Duration, Instant};

use space_cli::client::SpaceClient;

use space_core::sandbox::{
    CreateSandboxRequest, CreateSnapshotRequest, ForkRequest, SandboxOrigin, SnapshotTaken,
};
use space_core::{
    ErrorCode, FileChangeKind, SandboxId, SandboxState, SnapshotKind, SnapshotSchedule,
    SnapshotTrigger,
};
use test_support::{
    api_error, counter, shell, start_counter, wait_until, TestServer, TEST_TEMPLATE,
};

/// A sandbox without scheduled snapshots (so listings hold only what the test took).
fn request() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        snapshots: Some(SnapshotSchedule::disabled()),
        ..Default::default()
    }
}

async fn create(c: &SpaceClient) -> SandboxId {
    c.create_sandbox(&request()).await.expect("create").id
}

async fn sh(c: &SpaceClient, id: &SandboxId, line: &str) -> String {
    shell(c, id, line, false).await
}

async fn snapshot(
    c: &SpaceClient,
    id: &SandboxId,
    kind: SnapshotKind,
    label: Option<&str>,
) -> SnapshotTaken {
    c.create_snapshot(
        id,
        &CreateSnapshotRequest {
            kind,
            label: label.map(str::to_owned),
            persistent: false,
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{kind} snapshot: {e}"))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_snapshot_keeps_the_vm_running_and_rollback_undoes_rm_rf() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = create(c).await;
    sh(
        c,
        &id,
        "mkdir -p /home/user/work/sub && echo precious > /home/user/work/a.txt \
         && echo deep > /home/user/work/sub/b.txt",
    )
    .await;
    start_counter(c, &id, "/home/user/counter").await;

    let before = counter(c, &id, "/home/user/counter").await;
    let t0 = now_ms();
    let started = Instant::now();
    let taken = snapshot(c, &id, SnapshotKind::Disk, Some("before rm -rf")).await;
    eprintln!("disk snapshot took {:?}", started.elapsed());
    let t1 = now_ms();
    assert_eq!(taken.guest_pause_ms, None, "a disk snapshot never pauses");
    let snap = taken.snapshot;
    assert_eq!(
        (snap.kind, snap.trigger, snap.sandbox_id.clone()),
        (SnapshotKind::Disk, SnapshotTrigger::Manual, id.clone())
    );
    assert_eq!(snap.label.as_deref(), Some("before rm -rf"));
    assert!((t0..=t1).contains(&snap.created_at_ms), "{snap:?}");
    // The VM kept running through it: same state, and the counter moves on.
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Running
    );
    wait_until(
        Duration::from_secs(20),
        "the counter to advance after the disk snapshot",
        || async { (counter(c, &id, "/home/user/counter").await > before + 5).then_some(()) },
    )
    .await;

    // Listed with kind, time and size.
    let list = c.snapshots(&id).await.expect("list").snapshots;
    assert_eq!(list.len(), 1, "{list:?}");
    let listed = &list[0];
    assert_eq!(
        (listed.id.clone(), listed.kind, listed.created_at_ms),
        (snap.id.clone(), SnapshotKind::Disk, snap.created_at_ms)
    );
    assert!(
        listed.total_bytes > 0,
        "a disk snapshot has a size: {listed:?}"
    );
    assert!(listed.exclusive_bytes <= listed.total_bytes, "{listed:?}");

    // The agent does something destructive; roll back to the snapshot.
    sh(
        c,
        &id,
        "rm -rf /home/user/work && test ! -e /home/user/work && echo gone",
    )
    .await;
    let t = Instant::now();
    let rolled = c.rollback(&id, &snap.id).await.expect("rollback");
    eprintln!("rollback to a disk snapshot took {:?}", t.elapsed());
    assert_eq!(rolled.state, SandboxState::Running);
    assert_eq!(
        rolled.origin,
        Some(SandboxOrigin::Boot),
        "a disk rollback boots"
    );
    assert_eq!(
        sh(
            c,
            &id,
            "cat /home/user/work/a.txt /home/user/work/sub/b.txt"
        )
        .await,
        "precious\ndeep\n"
    );
    // A disk rollback boots: the counter process is gone.
    let procs = c.processes(&id).await.expect("processes");
    assert!(
        !procs
            .iter()
            .any(|p| p.tag.as_deref() == Some("counter") && p.exit.is_none()),
        "{procs:?}"
    );
    // The snapshot is still there (a rollback does not consume it); delete it.
    assert_eq!(c.snapshots(&id).await.expect("list").snapshots.len(), 1);
    c.delete_snapshot(&id, &snap.id).await.expect("delete");
    assert!(c.snapshots(&id).await.expect("list").snapshots.is_empty());
    let (status, code, msg) = api_error(c.delete_snapshot(&id, &snap.id).await);
    assert_eq!((status, code), (404, ErrorCode::NotFound), "{msg}");
    let (status, _, msg) = api_error(c.rollback(&id, &snap.id).await);
    assert_eq!(status, 404, "{msg}");
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Running
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checkpoint_rollback_brings_the_process_back() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = create(c).await;
    // The counter's value lives in the shell's memory; the file only shows it.
    start_counter(c, &id, "/home/user/counter").await;
    wait_until(Duration::from_secs(30), "the counter to pass 5", || async {
        (counter(c, &id, "/home/user/counter").await > 5).then_some(())
    })
    .await;
    let before = counter(c, &id, "/home/user/counter").await;
    let started = Instant::now();
    let taken = snapshot(c, &id, SnapshotKind::Checkpoint, Some("counting")).await;
    eprintln!(
        "checkpoint took {:?}, guest paused {:?} ms, {} bytes",
        started.elapsed(),
        taken.guest_pause_ms,
        taken.snapshot.total_bytes
    );
    let checkpoint = taken.snapshot;
    assert_eq!(checkpoint.kind, SnapshotKind::Checkpoint);
    assert!(
        taken.guest_pause_ms.is_some(),
        "a checkpoint reports the guest's pause"
    );
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Running
    );
    let at_checkpoint = counter(c, &id, "/home/user/counter").await;
    assert!(at_checkpoint >= before);

    // Change the memory state: kill the counter (its `i` is gone with it), reset the file,
    // leave a file that did not exist at the checkpoint.
    let procs = c.processes(&id).await.expect("processes");
    let pid = procs
        .iter()
        .find(|p| p.tag.as_deref() == Some("counter") && p.exit.is_none())
        .expect("counter process")
        .id;
    c.signal(&id, pid, 9).await.expect("kill the counter");
    wait_until(Duration::from_secs(20), "the counter to die", || async {
        c.process(&id, pid).await.ok().and_then(|p| p.exit)
    })
    .await;
    sh(
        c,
        &id,
        "echo 0 > /home/user/counter; echo later > /home/user/later.txt",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counter(c, &id, "/home/user/counter").await, 0);

    let t = Instant::now();
    let rolled = c.rollback(&id, &checkpoint.id).await.expect("rollback");
    eprintln!("rollback to a checkpoint took {:?}", t.elapsed());
    assert_eq!(rolled.state, SandboxState::Running);
    assert_eq!(
        rolled.origin,
        Some(SandboxOrigin::Checkpoint {
            sandbox_id: id.clone(),
            snapshot_id: Some(checkpoint.id.clone())
        })
    );
    // The process runs again, counting on from where it was at the checkpoint.
    let p = c
        .process(&id, pid)
        .await
        .expect("the counter process is back");
    assert!(p.exit.is_none(), "{p:?}");
    let first = counter(c, &id, "/home/user/counter").await;
    assert!(
        first >= before,
        "the counter restarted instead of going on: {first} < {before}"
    );
    wait_until(
        Duration::from_secs(20),
        "the restored counter to advance",
        || async { (counter(c, &id, "/home/user/counter").await > first).then_some(()) },
    )
    .await;
    let later = sh(
        c,
        &id,
        "cat /home/user/later.txt 2>/dev/null || echo absent",
    )
    .await;
    assert_eq!(later, "absent\n", "the disk went back with the memory");

    // Rolling back to a checkpoint also works from stopped.
    c.stop_sandbox(&id).await.expect("stop");
    let rolled = c.rollback(&id, &checkpoint.id).await.expect("rollback");
    assert_eq!(rolled.state, SandboxState::Running);
    assert!(c
        .process(&id, pid)
        .await
        .expect("back again")
        .exit
        .is_none());
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn diff_lists_added_removed_and_modified_files() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = create(c).await;
    sh(
        c,
        &id,
        "mkdir -p /home/user/d && echo short > /home/user/d/modified.txt \
         && echo bye > /home/user/d/removed.txt && mkdir /home/user/d/olddir",
    )
    .await;
    let a = snapshot(c, &id, SnapshotKind::Disk, Some("a"))
        .await
        .snapshot;
    sh(
        c,
        &id,
        "echo 'a much longer line than before' > /home/user/d/modified.txt \
         && rm /home/user/d/removed.txt && rmdir /home/user/d/olddir \
         && echo hi > /home/user/d/added.txt",
    )
    .await;
    let b = snapshot(c, &id, SnapshotKind::Disk, Some("b"))
        .await
        .snapshot;

    let diff = c
        .diff_snapshots(&id, &a.id, &b.id, None)
        .await
        .expect("diff");
    assert_eq!(
        (diff.from.clone(), diff.to.clone()),
        (a.id.clone(), b.id.clone())
    );
    assert!(!diff.truncated);
    let kind_of = |path: &str| {
        diff.changes
            .iter()
            .find(|ch| ch.path == path)
            .map(|ch| ch.kind)
    };
    assert_eq!(
        kind_of("/home/user/d/added.txt"),
        Some(FileChangeKind::Added),
        "{diff:#?}"
    );
    assert_eq!(
        kind_of("/home/user/d/removed.txt"),
        Some(FileChangeKind::Removed),
        "{diff:#?}"
    );
    assert_eq!(
        kind_of("/home/user/d/olddir"),
        Some(FileChangeKind::Removed),
        "{diff:#?}"
    );
    assert_eq!(
        kind_of("/home/user/d/modified.txt"),
        Some(FileChangeKind::Modified),
        "{diff:#?}"
    );
    let modified = diff
        .changes
        .iter()
        .find(|ch| ch.path == "/home/user/d/modified.txt")
        .unwrap();
    assert_eq!(
        (modified.size_before, modified.size_after),
        (Some(6), Some(31))
    );
    // The other way round, added and removed swap.
    let back = c
        .diff_snapshots(&id, &b.id, &a.id, None)
        .await
        .expect("diff");
    assert!(back
        .changes
        .iter()
        .any(|ch| ch.path == "/home/user/d/added.txt" && ch.kind == FileChangeKind::Removed));
    // A limit cuts the list and says so.
    let cut = c
        .diff_snapshots(&id, &a.id, &b.id, Some(1))
        .await
        .expect("diff");
    assert_eq!(cut.changes.len(), 1);
    assert!(cut.truncated);
    // Malformed ids are 400; a snapshot this sandbox does not have is 404.
    let (status, code, _) = api_error(c.diff_snapshots(&id, "snap-nope", &b.id, None).await);
    assert_eq!((status, code), (400, ErrorCode::InvalidRequest));
    let other = create(c).await;
    let theirs = snapshot(c, &other, SnapshotKind::Disk, None).await.snapshot;
    let (status, _, msg) = api_error(c.diff_snapshots(&id, &a.id, &theirs.id, None).await);
    assert_eq!(status, 404, "{msg}");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_of_other_sandboxes_and_of_paused_ones_are_refused() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let (a, b) = tokio::join!(create(c), create(c));
    sh(c, &a, "echo mine > /home/user/owner.txt").await;
    let snap_a = snapshot(c, &a, SnapshotKind::Disk, None).await.snapshot;

    // Rolling b back to a's snapshot is a 404, and b is untouched.
    let (status, code, msg) = api_error(c.rollback(&b, &snap_a.id).await);
    assert_eq!((status, code), (404, ErrorCode::NotFound), "{msg}");
    assert!(msg.contains(snap_a.id.as_str()), "{msg}");
    assert_eq!(
        c.sandbox(&b).await.expect("get").state,
        SandboxState::Running
    );
    let (status, _, _) = api_error(c.delete_snapshot(&b, &snap_a.id).await);
    assert_eq!(status, 404);
    // Another tenant, with the right sandbox and snapshot ids: 404 as well.
    let other = ts.new_tenant_client("other").await;
    let (status, _, _) = api_error(other.rollback(&a, &snap_a.id).await);
    assert_eq!(status, 404);
    assert_eq!(c.snapshots(&a).await.expect("list").snapshots.len(), 1);
    // Malformed snapshot ids are 400.
    let (status, code, _) = api_error(c.rollback(&a, "snap-../../x").await);
    assert_eq!((status, code), (400, ErrorCode::InvalidRequest));
    let (status, code, _) = api_error(c.delete_snapshot(&a, "../../etc").await);
    assert_eq!((status, code), (400, ErrorCode::InvalidRequest));

    // A paused sandbox: neither kind of snapshot (409 naming the state), nothing listed.
    c.pause_sandbox(&b).await.expect("pause");
    for kind in [SnapshotKind::Disk, SnapshotKind::Checkpoint] {
        let (status, code, msg) = api_error(
            c.create_snapshot(
                &b,
                &CreateSnapshotRequest {
                    kind,
                    ..Default::default()
                },
            )
            .await,
        );
        assert_eq!((status, code), (409, ErrorCode::Conflict), "{kind}: {msg}");
        assert!(msg.contains("paused"), "{kind}: {msg}");
    }
    assert!(c.snapshots(&b).await.expect("list").snapshots.is_empty());
    assert_eq!(
        c.sandbox(&b).await.expect("get").state,
        SandboxState::Paused
    );
    // A stopped sandbox can have its disk snapshotted (no guest to freeze).
    c.stop_sandbox(&b).await.expect("stop");
    let cold = snapshot(c, &b, SnapshotKind::Disk, None).await;
    assert_eq!(cold.snapshot.kind, SnapshotKind::Disk);
    let (status, _, msg) = api_error(
        c.create_snapshot(
            &b,
            &CreateSnapshotRequest {
                kind: SnapshotKind::Checkpoint,
                label: None,
                persistent: false,
            },
        )
        .await,
    );
    assert_eq!(status, 409, "{msg}");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fork_makes_independent_children_with_their_own_randomness() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let mut req = request();
    req.env.insert("PROJECT".into(), "apollo".into());
    req.labels.insert("team".into(), "blue".into());
    let parent = c.create_sandbox(&req).await.expect("create").id;
    sh(c, &parent, "echo from-parent > /home/user/shared.txt").await;

    let t = Instant::now();
    let forked = c
        .fork(
            &parent,
            &ForkRequest {
                count: Some(2),
                labels: [("branch".to_owned(), "try".to_owned())].into(),
                ..Default::default()
            },
        )
        .await
        .expect("fork");
    eprintln!("fork into 2 took {:?}", t.elapsed());
    let kids: Vec<_> = forked.sandboxes;
    assert_eq!(kids.len(), 2);
    assert_ne!(kids[0].id, kids[1].id);
    for k in &kids {
        assert_ne!(k.id, parent);
        assert_eq!(k.state, SandboxState::Running);
        assert_eq!(k.template, TEST_TEMPLATE);
        assert_eq!(k.env_keys, vec!["PROJECT".to_owned()]);
        assert_eq!(k.labels.get("team").map(String::as_str), Some("blue"));
        assert_eq!(k.labels.get("branch").map(String::as_str), Some("try"));
        assert_eq!(k.forked_from.as_ref(), Some(&parent));
        assert!(
            matches!(&k.origin, Some(SandboxOrigin::Checkpoint { sandbox_id, .. }) if *sandbox_id == parent),
            "{:?}",
            k.origin
        );
        // The parent's disk and environment, the child's own identity.
        assert_eq!(
            sh(
                c,
                &k.id,
                "cat /home/user/shared.txt; echo $PROJECT; hostname"
            )
            .await,
            format!("from-parent\napollo\n{}\n", k.id)
        );
        assert_eq!(c.sandbox(&k.id).await.expect("get").id, k.id);
    }
    // The children are listed with the caller's sandboxes, found by their labels.
    let listed = c
        .list_sandboxes(&[("branch", "try")])
        .await
        .expect("list")
        .sandboxes;
    assert_eq!(listed.len(), 2);
    // The parent runs on, untouched; nothing of the fork's transient checkpoint is left.
    assert_eq!(
        c.sandbox(&parent).await.expect("get").state,
        SandboxState::Running
    );
    assert!(c
        .snapshots(&parent)
        .await
        .expect("list")
        .snapshots
        .is_empty());

    // Separate disks.
    sh(c, &kids[0].id, "echo zero > /home/user/own.txt").await;
    sh(c, &kids[1].id, "echo one > /home/user/own.txt").await;
    assert_eq!(sh(c, &kids[0].id, "cat /home/user/own.txt").await, "zero\n");
    assert_eq!(sh(c, &kids[1].id, "cat /home/user/own.txt").await, "one\n");
    assert_eq!(
        sh(
            c,
            &parent,
            "cat /home/user/own.txt 2>/dev/null || echo none"
        )
        .await,
        "none\n"
    );
    // Restored uniqueness: the two children do not produce the same random bytes.
    let random = "head -c 32 /dev/urandom | od -x";
    let (r0, r1) = tokio::join!(sh(c, &kids[0].id, random), sh(c, &kids[1].id, random));
    assert!(r0.len() > 32, "{r0}");
    assert_ne!(r0, r1, "two forks produced the same random bytes");

    // Fork of a checkpoint: one child; of a disk snapshot: 400.
    let cp = snapshot(c, &parent, SnapshotKind::Checkpoint, None)
        .await
        .snapshot;
    let disk = snapshot(c, &parent, SnapshotKind::Disk, None)
        .await
        .snapshot;
    let (status, code, msg) = api_error(
        c.fork(
            &parent,
            &ForkRequest {
                snapshot: Some(disk.id.clone()),
                ..Default::default()
            },
        )
        .await,
    );
    assert_eq!((status, code), (400, ErrorCode::InvalidRequest), "{msg}");
    let from_cp = c
        .fork(
            &parent,
            &ForkRequest {
                snapshot: Some(cp.id.clone()),
                ..Default::default()
            },
        )
        .await
        .expect("fork from checkpoint")
        .sandboxes;
    assert_eq!(from_cp.len(), 1);
    assert_eq!(
        from_cp[0].origin,
        Some(SandboxOrigin::Checkpoint {
            sandbox_id: parent.clone(),
            snapshot_id: Some(cp.id.clone())
        })
    );
    assert_eq!(
        sh(c, &from_cp[0].id, "cat /home/user/shared.txt").await,
        "from-parent\n"
    );
    // A failed fork leaves no children behind.
    let before = c.list_sandboxes(&[]).await.expect("list").sandboxes.len();
    let (status, _, _) = api_error(
        c.fork(
            &parent,
            &ForkRequest {
                snapshot: Some(space_core::SnapshotId::generate()),
                ..Default::default()
            },
        )
        .await,
    );
    assert_eq!(status, 404);
    assert_eq!(
        c.list_sandboxes(&[]).await.expect("list").sandboxes.len(),
        before
    );

    // Fork of a deleted sandbox: 404.
    c.delete_sandbox(&parent).await.expect("delete");
    let (status, code, msg) = api_error(c.fork(&parent, &ForkRequest::default()).await);
    assert_eq!((status, code), (404, ErrorCode::NotFound), "{msg}");
    // The children outlive their parent.
    assert_eq!(sh(c, &kids[0].id, "cat /home/user/own.txt").await, "zero\n");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guest_that_froze_itself_gets_a_clear_conflict() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = create(c).await;
    // The busybox template links every applet of the host's busybox; Debian's has fsfreeze
    // (spelled `fsfreeze --freeze`, not util-linux's `-f`).
    if sh(c, &id, "command -v fsfreeze || true")
        .await
        .trim()
        .is_empty()
    {
        eprintln!("skipping: the template's busybox has no fsfreeze applet");
        ts.stop().await;
        return;
    }
    shell(c, &id, "fsfreeze --freeze /", true).await;
    let t = Instant::now();
    let (status, code, msg) = api_error(
        c.create_snapshot(
            &id,
            &CreateSnapshotRequest {
                kind: SnapshotKind::Disk,
                label: None,
                persistent: false,
            },
        )
        .await,
    );
    eprintln!("refused after {:?}: {msg}", t.elapsed());
    assert_eq!((status, code), (409, ErrorCode::Conflict), "{msg}");
    assert!(msg.contains("freeze"), "{msg}");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "the refusal took {:?}",
        t.elapsed()
    );
    // Nothing half-made is listed, and the sandbox still runs and serves exec (which
    // does not write to the frozen disk).
    assert!(c.snapshots(&id).await.expect("list").snapshots.is_empty());
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Running
    );
    shell(c, &id, "fsfreeze --unfreeze /", true).await;
    sh(c, &id, "echo thawed > /home/user/after.txt").await;
    let ok = snapshot(c, &id, SnapshotKind::Disk, None).await;
    assert_eq!(ok.snapshot.kind, SnapshotKind::Disk);
    assert_eq!(c.snapshots(&id).await.expect("list").snapshots.len(), 1);
    ts.stop().await;
}
