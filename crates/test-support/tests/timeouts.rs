//! What a sandbox's timeout does besides deleting it, on real VMs: `on_timeout: pause`
//! keeps memory and processes, `stop` keeps the disk; either happens once (the sandbox then
//! has no deadline), the next call that needs the guest wakes it only with `auto_resume`, a
//! client's resume or start always does, running again renews the deadline, and all of it
//! (node records, database rows) survives a server restart.

use std::time::Duration;

use space_cli::client::SpaceClient;
use space_core::process::ProcessSpec;
use space_core::sandbox::{
    CreateSandboxRequest, PausedBy, SandboxInfo, SandboxOrigin, StoppedBy, TimeoutAction,
};
use space_core::{ErrorCode, SandboxEvent, SandboxId, SandboxState, SnapshotSchedule};
use test_support::{api_error, shell, wait_until, TestServer, TEST_TEMPLATE};

/// The timeout the tests set once a sandbox is ready (a create's timeout runs from the
/// request, and creates are slow on a loaded machine). Long enough to check a woken sandbox
/// before its renewed timeout acts again.
const SHORT_TIMEOUT_SECS: u64 = 5;
/// Longest a timeout may take to act (a reconciler pass, a pause or a stop under TCG).
const ACT_WITHIN: Duration = Duration::from_secs(60);

/// A sandbox whose timeout does `on_timeout`, with a file and a background process in it.
async fn create(c: &SpaceClient, on_timeout: TimeoutAction, auto_resume: bool) -> SandboxId {
    let info = c
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            snapshots: Some(SnapshotSchedule::disabled()),
            on_timeout,
            auto_resume,
            ..Default::default()
        })
        .await
        .expect("create");
    assert_eq!(
        (info.on_timeout, info.auto_resume),
        (on_timeout, auto_resume)
    );
    assert_eq!(info.timed_out_at_ms, None);
    let id = info.id;
    c.write_file(&id, "/home/user/kept.txt", None, None, b"kept".to_vec())
        .await
        .expect("write");
    let mut sleeper = ProcessSpec::argv(["sleep", "3600"]);
    sleeper.tag = Some("sleeper".into());
    c.start_process(&id, &sleeper).await.expect("sleeper");
    id
}

/// Two sandboxes made by [`create`] at once, `(on_timeout, auto_resume)` each, whose
/// timeouts are then set to pass in [`SHORT_TIMEOUT_SECS`].
async fn two_expiring(
    c: &SpaceClient,
    a: (TimeoutAction, bool),
    b: (TimeoutAction, bool),
) -> (SandboxId, SandboxId) {
    let (a, b) = tokio::join!(create(c, a.0, a.1), create(c, b.0, b.1));
    for id in [&a, &b] {
        c.set_timeout(id, SHORT_TIMEOUT_SECS)
            .await
            .expect("timeout");
    }
    (a, b)
}

/// Waits until the timeout has put `id` in `state` and marked it timed out. (The mark
/// follows the pause or stop: the reconciler records it once the action has worked, so a
/// read in between sees the state without it.)
async fn timed_out(ts: &TestServer, id: &SandboxId, state: SandboxState) -> SandboxInfo {
    wait_until(
        ACT_WITHIN,
        &format!("{id} to be {state} and timed out"),
        || async {
            ts.client
                .sandbox(id)
                .await
                .ok()
                .filter(|s| s.state == state && s.timed_out_at_ms.is_some())
        },
    )
    .await
}

/// How many times the sandbox was paused and stopped, from its event log.
async fn pauses_and_stops(c: &SpaceClient, id: &SandboxId) -> (usize, usize) {
    let log = c.events(id).await.expect("events").events;
    let count = |ev| log.iter().filter(|e| e.event == ev).count();
    (count(SandboxEvent::Pause), count(SandboxEvent::Stop))
}

/// Whether the tagged `sleep 3600` is still running.
async fn sleeper_runs(c: &SpaceClient, id: &SandboxId) -> bool {
    let procs = c.processes(id).await.expect("processes");
    procs
        .iter()
        .any(|p| p.tag.as_deref() == Some("sleeper") && p.exit.is_none())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Checks the sandbox runs with a fresh deadline: at least the timeout after `since_ms`.
async fn runs_with_a_new_deadline(c: &SpaceClient, id: &SandboxId, since_ms: i64) {
    let info = c.sandbox(id).await.expect("get");
    assert_eq!(info.state, SandboxState::Running, "{info:?}");
    assert_eq!(info.timed_out_at_ms, None, "{info:?}");
    assert_eq!(info.timeout_secs, SHORT_TIMEOUT_SECS);
    assert!(
        info.expires_at_ms >= since_ms + (SHORT_TIMEOUT_SECS * 1000) as i64,
        "deadline {} not renewed from {since_ms}",
        info.expires_at_ms
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_timeout_keeps_processes_and_only_auto_resume_wakes_on_the_next_call() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let (auto, manual) = two_expiring(
        c,
        (TimeoutAction::Pause, true),
        (TimeoutAction::Pause, false),
    )
    .await;
    for id in [&auto, &manual] {
        let info = timed_out(&ts, id, SandboxState::Paused).await;
        assert_eq!(info.paused_by, Some(PausedBy::Timeout));
    }
    // Once: long past the deadline nothing happens again.
    tokio::time::sleep(Duration::from_secs(2 * SHORT_TIMEOUT_SECS)).await;
    for id in [&auto, &manual] {
        let info = c.sandbox(id).await.expect("get");
        assert_eq!(
            (info.state, info.paused_by),
            (SandboxState::Paused, Some(PausedBy::Timeout))
        );
        assert_eq!(pauses_and_stops(c, id).await, (1, 0));
    }

    // Without auto_resume, calls that need the guest are refused like a client pause's.
    let (status, code, msg) = api_error(c.run(&manual, &ProcessSpec::shell("true")).await);
    assert_eq!((status, code), (409, ErrorCode::Conflict), "{msg}");
    assert!(msg.contains("paused"), "{msg}");
    let (status, _, msg) = api_error(c.read_file_bytes(&manual, "kept.txt", None).await);
    assert_eq!(status, 409, "{msg}");
    assert_eq!(
        c.sandbox(&manual).await.expect("get").state,
        SandboxState::Paused
    );

    // With it, the next exec resumes the sandbox: processes kept, a new deadline.
    let before = now_ms();
    assert_eq!(
        shell(c, &auto, "cat /home/user/kept.txt", false).await,
        "kept"
    );
    runs_with_a_new_deadline(c, &auto, before).await;
    assert!(sleeper_runs(c, &auto).await, "the pause kept the process");

    // A client resume always works, and renews the deadline too...
    let before = now_ms();
    let resumed = c.resume_sandbox(&manual).await.expect("resume");
    assert_eq!(resumed.timed_out_at_ms, None);
    assert!(resumed.expires_at_ms >= before + (SHORT_TIMEOUT_SECS * 1000) as i64);
    assert!(sleeper_runs(c, &manual).await);
    // ...after which the timeout acts again.
    timed_out(&ts, &manual, SandboxState::Paused).await;
    assert_eq!(pauses_and_stops(c, &manual).await, (2, 0));
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_timeout_keeps_the_disk_and_the_next_call_boots_it() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = create(c, TimeoutAction::Stop, true).await;
    c.set_timeout(&id, SHORT_TIMEOUT_SECS)
        .await
        .expect("timeout");
    let info = timed_out(&ts, &id, SandboxState::Stopped).await;
    assert_eq!(
        (info.stopped_by, info.origin),
        (Some(StoppedBy::Timeout), None)
    );
    assert!(!ts
        .data_dir
        .join("run")
        .join(id.as_str())
        .join("vmm.pid")
        .exists());
    tokio::time::sleep(Duration::from_secs(2 * SHORT_TIMEOUT_SECS)).await;
    assert_eq!(pauses_and_stops(c, &id).await, (0, 1), "stopped once");

    // The next file read boots it on its disk: the file is there, the process is not.
    let before = now_ms();
    assert_eq!(
        c.read_file_bytes(&id, "/home/user/kept.txt", None)
            .await
            .expect("read boots it"),
        b"kept"
    );
    runs_with_a_new_deadline(c, &id, before).await;
    let info = c.sandbox(&id).await.expect("get");
    assert_eq!(
        (info.origin, info.stopped_by),
        (Some(SandboxOrigin::Boot), None)
    );
    assert!(!sleeper_runs(c, &id).await, "a stop ends processes");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timed_out_sandboxes_survive_a_server_restart() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let (paused, stopped) =
        two_expiring(c, (TimeoutAction::Pause, true), (TimeoutAction::Stop, true)).await;
    let before_paused = timed_out(&ts, &paused, SandboxState::Paused).await;
    let before_stopped = timed_out(&ts, &stopped, SandboxState::Stopped).await;

    let (data_dir, config) = ts.stop_keep_vms().await;
    let ts = TestServer::start_on(data_dir, config).await;
    let c = &ts.client;
    // Node records (who paused or stopped it) and rows (action, flag, timeout, the mark).
    let info = c.sandbox(&paused).await.expect("get paused");
    assert_eq!(info.paused_by, Some(PausedBy::Timeout));
    let info_stopped = c.sandbox(&stopped).await.expect("get stopped");
    assert_eq!(info_stopped.stopped_by, Some(StoppedBy::Timeout));
    for (before, after) in [(&before_paused, &info), (&before_stopped, &info_stopped)] {
        assert_eq!(after.state, before.state);
        assert_eq!(
            (
                after.on_timeout,
                after.auto_resume,
                after.timeout_secs,
                after.timed_out_at_ms,
                after.expires_at_ms
            ),
            (
                before.on_timeout,
                true,
                SHORT_TIMEOUT_SECS,
                before.timed_out_at_ms,
                before.expires_at_ms
            )
        );
    }
    // The restarted reconciler does not act on them again.
    tokio::time::sleep(Duration::from_secs(2 * SHORT_TIMEOUT_SECS)).await;
    assert_eq!(pauses_and_stops(c, &paused).await, (1, 0));
    assert_eq!(pauses_and_stops(c, &stopped).await, (0, 1));

    let before = now_ms();
    assert_eq!(shell(c, &paused, "echo awake", false).await, "awake\n");
    runs_with_a_new_deadline(c, &paused, before).await;
    assert!(sleeper_runs(c, &paused).await, "paused across the restart");
    let before = now_ms();
    assert_eq!(
        shell(c, &stopped, "cat /home/user/kept.txt", false).await,
        "kept"
    );
    runs_with_a_new_deadline(c, &stopped, before).await;
    ts.stop().await;
}
