//! The lifecycle through the HTTP API, on real VMs: pause and resume (processes keep
//! running), stop and start (files stay, processes go), illegal transitions as `409`, the
//! event log (listed and followed), idle auto-pause woken by the next call, the timeout of
//! paused and stopped sandboxes, and tenant scoping of every lifecycle endpoint.

use std::time::{Duration, Instant};

use futures::StreamExt;
use space_cli::client::{ClientError, SpaceClient};
use space_core::process::ProcessSpec;
use space_core::sandbox::{
    CreateSandboxRequest, CreateSnapshotRequest, ForkRequest, PausedBy, SandboxOrigin,
};
use space_core::{
    ErrorCode, LifecycleEntry, SandboxEvent, SandboxId, SandboxState, SnapshotId, SnapshotKind,
    SnapshotSchedule,
};
use test_support::{api_error, shell, wait_until, TestServer, TEST_TEMPLATE};

/// A sandbox without scheduled snapshots (so the event log holds only what the test does).
async fn create(c: &SpaceClient) -> SandboxId {
    c.create_sandbox(&CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        snapshots: Some(SnapshotSchedule::disabled()),
        ..Default::default()
    })
    .await
    .expect("create")
    .id
}

/// Runs a shell line to completion; returns stdout, asserting success.
async fn sh(c: &SpaceClient, id: &SandboxId, line: &str) -> String {
    shell(c, id, line, false).await
}

/// A background counter: `/home/user/counter` goes up ten times a second.
const COUNTER: &str = "/home/user/counter";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pause_and_resume_keep_processes_running() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = create(c).await;
    let pid = test_support::start_counter(c, &id, COUNTER).await;

    let before_pause = test_support::counter(c, &id, COUNTER).await;
    let paused = c.pause_sandbox(&id).await.expect("pause");
    assert_eq!(paused.state, SandboxState::Paused);
    assert_eq!(paused.paused_by, Some(PausedBy::User));

    // A paused sandbox does not serve its guest: 409 naming the state, not a silent resume.
    let (status, code, msg) = api_error(c.run(&id, &ProcessSpec::shell("true")).await);
    assert_eq!((status, code), (409, ErrorCode::Conflict), "{msg}");
    assert!(msg.contains("paused"), "{msg}");
    let (status, _, msg) = api_error(c.read_file_bytes(&id, "/etc/hostname", None).await);
    assert_eq!(status, 409, "{msg}");
    // Illegal transitions name the current state.
    let (status, code, msg) = api_error(c.pause_sandbox(&id).await);
    assert_eq!((status, code), (409, ErrorCode::Conflict));
    assert_eq!(msg, "cannot pause a sandbox that is paused");
    let (status, _, msg) = api_error(c.start_sandbox(&id).await);
    assert_eq!(
        (status, msg.as_str()),
        (409, "cannot start a sandbox that is paused")
    );
    let got = c.sandbox(&id).await.expect("get");
    assert_eq!(
        (got.state, got.paused_by),
        (SandboxState::Paused, Some(PausedBy::User))
    );
    // Time passes while paused; the counter does not (it ticks ~5-10 times a second when
    // running: 8 s would add 40 or more).
    tokio::time::sleep(Duration::from_secs(8)).await;

    let resumed = c.resume_sandbox(&id).await.expect("resume");
    assert_eq!(
        (resumed.state, resumed.paused_by),
        (SandboxState::Running, None)
    );
    let right_after = test_support::counter(c, &id, COUNTER).await;
    assert!(
        right_after < before_pause + 30,
        "the counter ran while paused: {before_pause} -> {right_after}"
    );
    assert_eq!(sh(c, &id, "echo alive").await, "alive\n");
    let p = c.process(&id, pid).await.expect("process");
    assert!(
        p.exit.is_none(),
        "the background process died across pause: {p:?}"
    );
    wait_until(
        Duration::from_secs(20),
        "the counter to advance after resume",
        || async { (test_support::counter(c, &id, COUNTER).await > right_after).then_some(()) },
    )
    .await;
    let (status, _, msg) = api_error(c.resume_sandbox(&id).await);
    assert_eq!(
        (status, msg.as_str()),
        (409, "cannot resume a sandbox that is running")
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_and_start_keep_files_but_not_processes() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = create(c).await;
    c.write_file(
        &id,
        "/home/user/kept.txt",
        None,
        None,
        b"still here".to_vec(),
    )
    .await
    .expect("write");
    sh(c, &id, "echo appended >> /home/user/kept.txt").await;
    let mut spec = ProcessSpec::argv(["sleep", "3600"]);
    spec.tag = Some("sleeper".into());
    c.start_process(&id, &spec).await.expect("sleeper");

    let stopped = c.stop_sandbox(&id).await.expect("stop");
    assert_eq!(stopped.state, SandboxState::Stopped);
    assert_eq!(stopped.origin, None, "a stopped sandbox has no VM");
    assert!(
        !ts.data_dir
            .join("run")
            .join(id.as_str())
            .join("vmm.pid")
            .exists(),
        "the VM of a stopped sandbox is gone"
    );
    let (status, code, msg) = api_error(c.run(&id, &ProcessSpec::shell("true")).await);
    assert_eq!((status, code), (409, ErrorCode::Conflict));
    assert!(msg.contains("stopped"), "{msg}");
    let (status, _, msg) = api_error(c.stop_sandbox(&id).await);
    assert_eq!(
        (status, msg.as_str()),
        (409, "cannot stop a sandbox that is stopped")
    );
    let (status, _, msg) = api_error(c.pause_sandbox(&id).await);
    assert_eq!(
        (status, msg.as_str()),
        (409, "cannot pause a sandbox that is stopped")
    );
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Stopped
    );

    let started = c.start_sandbox(&id).await.expect("start");
    assert_eq!(started.state, SandboxState::Running);
    assert_eq!(started.origin, Some(SandboxOrigin::Boot));
    assert_eq!(
        c.read_file_bytes(&id, "/home/user/kept.txt", None)
            .await
            .expect("read"),
        b"still hereappended\n"
    );
    let procs = c.processes(&id).await.expect("processes");
    assert!(
        !procs
            .iter()
            .any(|p| p.tag.as_deref() == Some("sleeper") && p.exit.is_none()),
        "a process survived stop/start: {procs:?}"
    );
    assert_eq!(
        sh(c, &id, "pgrep -f 'sleep 3600' || echo none").await,
        "none\n"
    );
    // And it can be stopped while paused, and deleted while stopped.
    c.pause_sandbox(&id).await.expect("pause");
    assert_eq!(
        c.stop_sandbox(&id).await.expect("stop paused").state,
        SandboxState::Stopped
    );
    c.delete_sandbox(&id).await.expect("delete stopped");
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Deleted
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_list_and_follow_the_transitions() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let t0 = now_ms();
    let id = create(c).await;
    let mut follow = c.follow_events(&id).await.expect("follow");
    let followed = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(e) = follow.next().await {
            got.push(e.expect("entry"));
        }
        got
    });

    c.pause_sandbox(&id).await.expect("pause");
    c.resume_sandbox(&id).await.expect("resume");
    c.stop_sandbox(&id).await.expect("stop");
    c.start_sandbox(&id).await.expect("start");
    let _ = c.pause_sandbox(&id).await; // ok
    let _ = c.pause_sandbox(&id).await; // refused: no entry
    let t1 = now_ms();

    let log = c.events(&id).await.expect("events").events;
    let steps = |log: &[LifecycleEntry]| -> Vec<(SandboxEvent, SandboxState, SandboxState)> {
        log.iter().map(|e| (e.event, e.from, e.to)).collect()
    };
    use SandboxEvent as E;
    use SandboxState as S;
    let expected = vec![
        (E::Ready, S::Creating, S::Running),
        (E::Pause, S::Running, S::Pausing),
        (E::Done, S::Pausing, S::Paused),
        (E::Resume, S::Paused, S::Resuming),
        (E::Done, S::Resuming, S::Running),
        (E::Stop, S::Running, S::Stopping),
        (E::Done, S::Stopping, S::Stopped),
        (E::Start, S::Stopped, S::Starting),
        (E::Done, S::Starting, S::Running),
        (E::Pause, S::Running, S::Pausing),
        (E::Done, S::Pausing, S::Paused),
    ];
    assert_eq!(steps(&log), expected, "{log:#?}");
    assert!(log.iter().all(|e| e.sandbox_id == id));
    assert!(
        log.windows(2).all(|w| w[0].at_ms <= w[1].at_ms),
        "timestamps go back: {log:#?}"
    );
    assert!(
        log.first().unwrap().at_ms >= t0 && log.last().unwrap().at_ms <= t1,
        "timestamps outside the test: {t0}..{t1} {log:#?}"
    );

    // The follower saw the same, then the delete, and its stream ended.
    c.delete_sandbox(&id).await.expect("delete");
    let got = tokio::time::timeout(Duration::from_secs(60), followed)
        .await
        .expect("the followed stream ends once the sandbox is deleted")
        .expect("follower");
    let mut with_delete = expected.clone();
    with_delete.push((E::Delete, S::Paused, S::Deleting));
    with_delete.push((E::Done, S::Deleting, S::Deleted));
    assert_eq!(steps(&got), with_delete, "{got:#?}");
    // A deleted sandbox keeps its log; following it ends at once.
    let after = c
        .events(&id)
        .await
        .expect("events of a deleted sandbox")
        .events;
    assert_eq!(steps(&after), with_delete);
    let started = Instant::now();
    let replay: Vec<_> = c
        .follow_events(&id)
        .await
        .expect("follow deleted")
        .collect()
        .await;
    assert_eq!(replay.len(), with_delete.len());
    assert!(started.elapsed() < Duration::from_secs(5));
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_tenants_and_unknown_sandboxes_get_404_everywhere() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = create(c).await;
    let snap = c
        .create_snapshot(
            &id,
            &CreateSnapshotRequest {
                kind: SnapshotKind::Disk,
                label: None,
                persistent: false,
            },
        )
        .await
        .expect("snapshot")
        .snapshot
        .id;
    let other = ts.new_tenant_client("other").await;
    let unknown = SandboxId::generate();

    for (who, client, target) in [
        ("another tenant", &other, &id),
        ("the owner, unknown id", c, &unknown),
    ] {
        let expect_404 = |what: &str, r: Result<(), ClientError>| {
            let (status, code, msg) = api_error(r);
            assert_eq!(
                (status, code),
                (404, ErrorCode::NotFound),
                "{who}: {what}: {msg}"
            );
            assert_eq!(msg, format!("sandbox {target} not found"), "{who}: {what}");
        };
        expect_404("pause", client.pause_sandbox(target).await.map(drop));
        expect_404("resume", client.resume_sandbox(target).await.map(drop));
        expect_404("stop", client.stop_sandbox(target).await.map(drop));
        expect_404("start", client.start_sandbox(target).await.map(drop));
        expect_404("rollback", client.rollback(target, &snap).await.map(drop));
        expect_404(
            "fork",
            client
                .fork(
                    target,
                    &ForkRequest {
                        count: Some(1),
                        ..Default::default()
                    },
                )
                .await
                .map(drop),
        );
        expect_404("events", client.events(target).await.map(drop));
        expect_404("follow", client.follow_events(target).await.map(drop));
        expect_404("snapshots", client.snapshots(target).await.map(drop));
        expect_404(
            "snapshot",
            client
                .create_snapshot(
                    target,
                    &CreateSnapshotRequest {
                        kind: SnapshotKind::Checkpoint,
                        label: None,
                        persistent: false,
                    },
                )
                .await
                .map(drop),
        );
        expect_404(
            "delete snapshot",
            client.delete_snapshot(target, &snap).await,
        );
        expect_404(
            "diff",
            client
                .diff_snapshots(target, &snap, &snap, None)
                .await
                .map(drop),
        );
    }
    // Nothing the other tenant tried touched the sandbox or its snapshot.
    let info = c.sandbox(&id).await.expect("get");
    assert_eq!(info.state, SandboxState::Running);
    let snaps = c.snapshots(&id).await.expect("snapshots").snapshots;
    assert_eq!(snaps.iter().map(|s| &s.id).collect::<Vec<_>>(), vec![&snap]);
    // A well-formed snapshot id this sandbox does not have is a 404 that names it.
    let stranger = SnapshotId::generate();
    let (status, code, msg) = api_error(c.rollback(&id, &stranger).await);
    assert_eq!((status, code), (404, ErrorCode::NotFound));
    assert!(msg.contains(stranger.as_str()), "{msg}");
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Running,
        "a refused rollback leaves the sandbox running"
    );
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_sandbox_pauses_itself_and_the_next_call_wakes_it() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = c
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            snapshots: Some(SnapshotSchedule::disabled()),
            auto_pause_secs: Some(space_core::sandbox::MIN_AUTO_PAUSE_SECS),
            ..Default::default()
        })
        .await
        .expect("create")
        .id;
    assert_eq!(
        c.sandbox(&id).await.expect("get").auto_pause_secs,
        Some(space_core::sandbox::MIN_AUTO_PAUSE_SECS)
    );
    c.write_file(&id, "/home/user/note.txt", None, None, b"kept".to_vec())
        .await
        .expect("write");
    let idle = wait_until(
        Duration::from_secs(90),
        "the idle sandbox to pause",
        || async {
            c.sandbox(&id)
                .await
                .ok()
                .filter(|s| s.state == SandboxState::Paused)
        },
    )
    .await;
    assert_eq!(idle.paused_by, Some(PausedBy::Idle));
    let log = c.events(&id).await.expect("events").events;
    assert!(
        log.iter()
            .any(|e| e.event == SandboxEvent::Pause && e.to == SandboxState::Pausing),
        "{log:#?}"
    );
    // Any call that needs the guest wakes it: a file read, then an exec.
    assert_eq!(
        c.read_file_bytes(&id, "/home/user/note.txt", None)
            .await
            .expect("read wakes it"),
        b"kept"
    );
    assert_eq!(sh(c, &id, "echo awake").await, "awake\n");
    let info = c.sandbox(&id).await.expect("get");
    assert_eq!((info.state, info.paused_by), (SandboxState::Running, None));
    // Running again renewed its deadline: its timeout counts from the wake.
    assert!(
        info.expires_at_ms > info.created_at_ms + (info.timeout_secs * 1000) as i64,
        "{info:?}"
    );
    // A client pause is not undone by calls.
    c.pause_sandbox(&id).await.expect("pause");
    let (status, _, _) = api_error(c.run(&id, &ProcessSpec::shell("true")).await);
    assert_eq!(status, 409);
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_timeout_deletes_paused_and_stopped_sandboxes() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let (paused, stopped) = tokio::join!(create(c), create(c));
    c.pause_sandbox(&paused).await.expect("pause");
    c.stop_sandbox(&stopped).await.expect("stop");
    for id in [&paused, &stopped] {
        c.set_timeout(id, 1).await.expect("timeout");
    }
    for id in [&paused, &stopped] {
        ts.wait_state(id, SandboxState::Deleted, Duration::from_secs(60))
            .await;
        assert!(!ts
            .data_dir
            .join("store/sandboxes")
            .join(id.as_str())
            .exists());
    }
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retried_lifecycle_calls_with_an_idempotency_key_run_once() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = create(c).await;
    let http = reqwest::Client::new();
    let post = |path: String, key: Option<&'static str>, body: &'static str| {
        let mut req = http
            .post(format!("{}/v1/sandboxes/{id}/{path}", ts.url()))
            .bearer_auth(&ts.api_key)
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            req = req.header("Idempotency-Key", k);
        }
        async move {
            let resp = req.send().await.expect("send");
            let replayed = resp.headers().contains_key("idempotent-replayed");
            (
                resp.status().as_u16(),
                replayed,
                resp.text().await.expect("body"),
            )
        }
    };
    // A retried pause answers like the first one instead of "cannot pause ... paused".
    let first = post("pause".into(), Some("pause-1"), "").await;
    assert_eq!((first.0, first.1), (200, false), "{}", first.2);
    let again = post("pause".into(), Some("pause-1"), "").await;
    assert_eq!((again.0, again.1), (200, true));
    assert_eq!(again.2, first.2);
    let fresh = post("pause".into(), None, "").await;
    assert_eq!(fresh.0, 409, "{}", fresh.2);
    c.resume_sandbox(&id).await.expect("resume");

    // A retried fork makes its children once.
    let body = r#"{"count":1,"labels":{"retry":"yes"}}"#;
    let first = post("fork".into(), Some("fork-1"), body).await;
    assert_eq!(first.0, 201, "{}", first.2);
    let again = post("fork".into(), Some("fork-1"), body).await;
    assert_eq!((again.0, again.1, &again.2), (201, true, &first.2));
    let kids = c
        .list_sandboxes(&[("retry", "yes")])
        .await
        .expect("list")
        .sandboxes;
    assert_eq!(kids.len(), 1, "{kids:?}");
    ts.stop().await;
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
