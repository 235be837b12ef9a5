//! A template's start command, as E2B's templates have it: started and found ready (its
//! ready check passing) before the template's memory image is saved, so every sandbox of
//! it starts with the process running, with the template's env and user; started again
//! when a sandbox boots cold (stopped and started); a command that fails, or a check that
//! never passes, fails the build (`start_failed`) with nothing named; a bad one is refused.

use serde_json::json;
use space_core::sandbox::CreateSandboxRequest;
use space_core::template::{TemplateBuildErrorCode, TemplateBuildEvent};
use space_core::SandboxState;
use test_support::{shell, TestServer, TEST_TEMPLATE};

fn failure(events: &[TemplateBuildEvent]) -> Option<(TemplateBuildErrorCode, String)> {
    match events.last() {
        Some(TemplateBuildEvent::Failed { error }) => Some((error.code, error.message.clone())),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_command_runs_in_every_sandbox_from_the_start() {
    let server = TestServer::start().await;
    let c = &server.client;

    // The service: counts its starts (on the root disk: /tmp is memory), writes what it runs
    // as, then is ready once its flag exists (after a second, so the check runs again).
    let service = "echo \"started $SVC_MODE as $(id -un)\"; echo x >> /srv/svc/starts; \
                   echo \"$SVC_MODE $(id -un) $(pwd)\" > /tmp/svc-info; echo $$ > /tmp/svc.pid; \
                   sleep 1; touch /tmp/svc-ready; while :; do sleep 1; done";
    let events = test_support::follow_build(
        c,
        &json!({
            "name": "svc", "from_template": TEST_TEMPLATE,
            "steps": [{"env": {"SVC_MODE": "on"}}, {"run": "mkdir -p /srv/svc && chown user /srv/svc"}, {"workdir": "/srv/svc"}],
            "start": {"command": service, "ready": "test -f /tmp/svc-ready"},
        }),
    )
    .await;
    let log = test_support::build_log(&events);
    assert!(
        matches!(events.last(), Some(TemplateBuildEvent::Ready { .. })),
        "{events:?}"
    );
    assert!(log.contains("start | started on as"), "{log}");
    assert!(log.contains("start command ready after"), "{log}");
    let tpl = c.template("svc").await.expect("template");
    assert_eq!(
        tpl.start.as_ref().map(|s| s.ready.is_some()),
        Some(true),
        "{tpl:?}"
    );

    // Two sandboxes: both have the one process the memory image holds, running and ready.
    let mut pids = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let sbx = c
            .create_sandbox(&CreateSandboxRequest {
                template: "svc".into(),
                ..Default::default()
            })
            .await
            .expect("create");
        let out = shell(
            c,
            &sbx.id,
            "cat /tmp/svc-info /srv/svc/starts; test -f /tmp/svc-ready && kill -0 $(cat /tmp/svc.pid) && echo alive",
            false,
        )
        .await;
        let user = out.lines().next().unwrap_or_default().to_owned();
        assert!(
            user.starts_with("on ") && user.ends_with(" /srv/svc"),
            "{out}"
        );
        assert!(out.ends_with("x\nalive\n"), "{out}");
        let procs = c.processes(&sbx.id).await.expect("processes");
        let start = procs
            .iter()
            .find(|p| p.tag.as_deref() == Some("start"))
            .unwrap_or_else(|| panic!("no start process in {procs:?}"));
        pids.push(start.pid);
        ids.push(sbx.id);
    }
    assert_eq!(pids[0], pids[1], "both restored from the one memory image");

    // A cold boot (stopped, started) runs it again: a second start counted.
    let id = &ids[0];
    c.stop_sandbox(id).await.expect("stop");
    server
        .wait_state(
            id,
            SandboxState::Stopped,
            std::time::Duration::from_secs(60),
        )
        .await;
    c.start_sandbox(id).await.expect("start");
    server
        .wait_state(
            id,
            SandboxState::Running,
            std::time::Duration::from_secs(120),
        )
        .await;
    let out = shell(
        c,
        id,
        "wc -l < /srv/svc/starts; test -f /tmp/svc-ready && kill -0 $(cat /tmp/svc.pid) && echo alive",
        false,
    )
    .await;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["2", "alive"],
        "{out}"
    );

    // A start command that fails, and one never ready: the build fails, nothing named.
    let failing = test_support::follow_build(
        c,
        &json!({"name": "svc-bad", "from_template": TEST_TEMPLATE,
               "start": {"command": "echo about to fail; exit 3"}}),
    )
    .await;
    let (code, message) = failure(&failing).unwrap_or_else(|| panic!("{failing:?}"));
    assert_eq!(code, TemplateBuildErrorCode::StartFailed);
    assert!(message.contains("exited with code 3"), "{message}");
    assert!(test_support::build_log(&failing).contains("start | about to fail"));
    let never = test_support::follow_build(
        c,
        &json!({"name": "svc-never", "from_template": TEST_TEMPLATE,
               "start": {"command": "sleep 1000", "ready": "false", "ready_timeout_secs": 3}}),
    )
    .await;
    let (code, message) = failure(&never).unwrap_or_else(|| panic!("{never:?}"));
    assert_eq!(code, TemplateBuildErrorCode::StartFailed);
    assert!(message.contains("not ready within 3 s"), "{message}");
    for name in ["svc-bad", "svc-never"] {
        let e = c.template(name).await.unwrap_err();
        assert_eq!(
            e.code().map(|c| format!("{c:?}")).as_deref(),
            Some("NotFound")
        );
    }

    // Refused before anything runs.
    for bad in [
        json!({"name": "x", "from_template": TEST_TEMPLATE, "start": {"command": ""}}),
        json!({"name": "x", "from_template": TEST_TEMPLATE, "start": {"command": "x", "ready": ""}}),
        json!({"name": "x", "from_template": TEST_TEMPLATE, "start": {"command": "x", "ready_timeout_secs": 0}}),
        json!({"name": "x", "from_template": TEST_TEMPLATE, "start": {"command": "x", "bogus": 1}}),
    ] {
        let e = c.build_template(&bad).await.unwrap_err();
        assert_eq!(
            e.code().map(|c| format!("{c:?}")).as_deref(),
            Some("InvalidRequest"),
            "{bad}"
        );
    }
}
