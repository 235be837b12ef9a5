//! Timeouts (TTL) delete sandboxes automatically; PTYs, stdin, signals and large files work.

use std::time::Duration;

use futures::StreamExt;
use sha2::Digest;
use space_core::process::{OutputEvent, ProcessSpec, PtySize};
use space_core::sandbox::CreateSandboxRequest;
use test_support::{wait_until, TestServer, TEST_TEMPLATE};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timeout_deletes_and_can_be_extended() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let short = CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        timeout_secs: Some(3),
        ..Default::default()
    };
    // `b` gets time enough to be extended even when creates are slow (a loaded CI machine):
    // its timeout runs from the request, not from when the sandbox is ready.
    let longer = CreateSandboxRequest {
        timeout_secs: Some(15),
        ..short.clone()
    };
    let (a, b) = tokio::join!(c.create_sandbox(&short), c.create_sandbox(&longer));
    let (a, b) = (a.expect("create").id, b.expect("create"));
    let first_expiry_ms = b.expires_at_ms;
    let b = b.id;
    let extended = c.set_timeout(&b, 600).await.expect("extend");
    assert!(extended.expires_at_ms > extended.created_at_ms + 500_000);

    wait_until(
        Duration::from_secs(60),
        "the timeout to delete the sandbox",
        || async {
            c.sandbox(&a)
                .await
                .ok()
                .filter(|s| s.state == space_core::SandboxState::Deleted)
        },
    )
    .await;
    assert!(!ts.data_dir.join("run").join(a.as_str()).exists());
    // Past `b`'s first deadline (and a reconciler pass), it lives on.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let wait_ms = (first_expiry_ms + 3_000 - now_ms).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    let b_now = c.sandbox(&b).await.expect("the extended sandbox lives on");
    assert_eq!(b_now.state, space_core::SandboxState::Running);
    c.delete_sandbox(&b).await.expect("delete");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pty_stdin_signals_and_large_files() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = c
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("create")
        .id;

    // PTY: size, resize, typed input. Type only at the prompt: an interactive shell may
    // swallow type-ahead while it queries the terminal.
    let mut spec = ProcessSpec::argv(["sh"]);
    spec.pty = Some(PtySize { rows: 24, cols: 80 });
    spec.stdin = true;
    let p = c.start_process(&id, &spec).await.expect("pty");
    let mut events = c.output(&id, p.id, None).await.expect("output");
    let mut screen = String::new();
    let mut code = None;
    let mut step = 0;
    while let Some(ev) = events.next().await {
        let ev = ev.expect("event");
        if let Some((_, b)) = ev.bytes() {
            screen.push_str(&String::from_utf8_lossy(&b));
        }
        if let OutputEvent::Exit { status, .. } = ev {
            code = status.exit_code;
            break;
        }
        if step == 0 && screen.contains("$ ") {
            c.write_stdin(&id, p.id, b"stty size\n".to_vec(), false)
                .await
                .expect("stdin");
            step = 1;
        } else if step == 1 && screen.contains("24 80") && screen.trim_end().ends_with('$')
            || step == 1 && screen.matches("$ ").count() >= 2
        {
            c.resize(
                &id,
                p.id,
                PtySize {
                    rows: 50,
                    cols: 132,
                },
            )
            .await
            .expect("resize");
            c.write_stdin(&id, p.id, b"stty size; exit 7\n".to_vec(), false)
                .await
                .expect("stdin");
            step = 2;
        }
    }
    assert!(
        screen.contains("24 80") && screen.contains("50 132"),
        "{screen}"
    );
    assert_eq!(code, Some(7));

    // stdin streaming into a pipe
    let mut spec = ProcessSpec::argv(["wc", "-c"]);
    spec.stdin = true;
    let p = c.start_process(&id, &spec).await.expect("wc");
    c.write_stdin(&id, p.id, vec![b'z'; 300_000], true)
        .await
        .expect("stdin");
    let mut text = String::new();
    let mut events = c.output(&id, p.id, None).await.expect("output");
    while let Some(ev) = events.next().await {
        if let Some((_, b)) = ev.expect("event").bytes() {
            text.push_str(&String::from_utf8_lossy(&b));
        }
    }
    assert_eq!(text.trim(), "300000");

    // background process, listed, then signalled
    let mut spec = ProcessSpec::argv(["sleep", "300"]);
    spec.tag = Some("sleeper".into());
    let p = c.start_process(&id, &spec).await.expect("sleep");
    let listed = c.processes(&id).await.expect("list");
    assert!(listed
        .iter()
        .any(|q| q.id == p.id && q.tag.as_deref() == Some("sleeper") && q.exit.is_none()));
    c.signal(&id, p.id, 15).await.expect("signal");
    let done = wait_until(Duration::from_secs(30), "sleep to exit", || async {
        c.process(&id, p.id).await.ok().and_then(|q| q.exit)
    })
    .await;
    assert_eq!(done.signal, Some(15));

    // a large file, streamed both ways
    let data: Vec<u8> = (0..32u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let st = c
        .write_file(&id, "/tmp/big.bin", None, None, data.clone())
        .await
        .expect("upload");
    assert_eq!(st.size, data.len() as u64);
    let out = c
        .run(&id, &ProcessSpec::argv(["sha256sum", "/tmp/big.bin"]))
        .await
        .expect("sha");
    assert!(out
        .stdout_str()
        .starts_with(&hex::encode(sha2::Sha256::digest(&data))));
    let back = c
        .read_file_bytes(&id, "/tmp/big.bin", None)
        .await
        .expect("download");
    assert!(back == data, "downloaded bytes differ");

    c.delete_sandbox(&id).await.expect("delete");
    ts.stop().await;
}
