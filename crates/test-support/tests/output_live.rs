//! Live-only process output on a real VM through the native API
//! (`GET …/processes/{pid}/output?live=true`): `started` first, then only what the process
//! prints after the request; for a process that has exited, `started` and `exit`.

use futures::StreamExt;
use space_core::process::{OutputEvent, ProcessSpec};
use test_support::{test_sandbox, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_output_in_a_vm() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = test_sandbox(c).await;
    let mut spec = ProcessSpec::shell("echo before; read l; echo \"after $l\"");
    spec.stdin = true;
    let info = c.start_process(&id, &spec).await.expect("start");

    // Follow the replay until the past is there.
    let mut replay = c.output(&id, info.id, None).await.expect("output");
    while let Some(ev) = replay.next().await {
        if matches!(ev.expect("event"), OutputEvent::Data { .. }) {
            break;
        }
    }
    drop(replay);

    let mut live = c.output_live(&id, info.id).await.expect("live output");
    let first = live.next().await.expect("started").expect("started");
    assert_eq!(
        first,
        OutputEvent::Started {
            seq: 1,
            id: info.id,
            pid: info.pid
        }
    );
    c.write_stdin(&id, info.id, b"now\n".to_vec(), true)
        .await
        .expect("stdin");
    let mut stdout = Vec::new();
    let mut exit = None;
    while let Some(ev) = live.next().await {
        match ev.expect("event") {
            ev @ OutputEvent::Data { .. } => stdout.extend(ev.bytes().expect("data").1),
            OutputEvent::Exit { status, .. } => exit = Some(status),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(String::from_utf8_lossy(&stdout), "after now\n");
    assert_eq!(exit.expect("exit").exit_code, Some(0));

    let late: Vec<OutputEvent> = c
        .output_live(&id, info.id)
        .await
        .expect("live output")
        .map(|e| e.expect("event"))
        .collect()
        .await;
    assert!(
        matches!(
            late[..],
            [OutputEvent::Started { .. }, OutputEvent::Exit { .. }]
        ),
        "{late:?}"
    );
    ts.stop().await;
}
