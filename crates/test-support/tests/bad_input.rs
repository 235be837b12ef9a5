//! Every kind of bad input gets a clear error with a machine-readable code, and loses nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use space_core::process::ProcessSpec;
use space_core::sandbox::{CreateSandboxRequest, ResourcesRequest};
use space_core::ErrorCode;
use test_support::{TestServer, TEST_TEMPLATE};

fn busybox() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_without_a_sandbox() {
    let ts = TestServer::start().await;
    let c = &ts.client;

    // missing or bad API key
    for key in [
        None,
        Some("space_0000000000000000000000000000000000000000000000000000000000000000"),
        Some("garbage"),
    ] {
        let err = ts
            .client_with_key(key)
            .templates()
            .await
            .expect_err("must be refused");
        assert_eq!(
            err.code(),
            Some(ErrorCode::Unauthenticated),
            "{key:?}: {err}"
        );
        assert_eq!(err.status(), Some(401));
    }

    // unknown template
    let err = c
        .create_sandbox(&CreateSandboxRequest {
            template: "no-such-template".into(),
            ..Default::default()
        })
        .await
        .expect_err("unknown template");
    assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");

    // malformed id
    let err = c.sandbox("not-a-sandbox-id").await.expect_err("malformed");
    assert_eq!(err.code(), Some(ErrorCode::InvalidRequest), "{err}");
    let err = c
        .sandbox("sbx-../../../etc/passwd")
        .await
        .expect_err("malformed");
    assert!(
        matches!(
            err.code(),
            Some(ErrorCode::InvalidRequest) | Some(ErrorCode::NotFound)
        ),
        "{err}"
    );

    // well-formed but unknown id
    let err = c
        .sandbox("sbx-00000000000000000000")
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), Some(ErrorCode::NotFound));

    // resources out of bounds, and beyond what the node has
    let mut req = busybox();
    req.resources = ResourcesRequest {
        vcpus: Some(64),
        ..Default::default()
    };
    assert_eq!(
        c.create_sandbox(&req).await.expect_err("vcpus").code(),
        Some(ErrorCode::InvalidRequest)
    );
    req.resources = ResourcesRequest {
        memory_mib: Some(65536),
        ..Default::default()
    };
    let err = c
        .create_sandbox(&req)
        .await
        .expect_err("memory beyond capacity");
    assert_eq!(err.code(), Some(ErrorCode::InsufficientCapacity), "{err}");
    assert_eq!(err.status(), Some(507));

    // bad labels, env, timeout
    let mut req = busybox();
    req.labels = BTreeMap::from([("bad key!".into(), "v".into())]);
    assert_eq!(
        c.create_sandbox(&req).await.expect_err("label").code(),
        Some(ErrorCode::InvalidRequest)
    );
    let mut req = busybox();
    req.env = BTreeMap::from([("1X".into(), "v".into())]);
    assert_eq!(
        c.create_sandbox(&req).await.expect_err("env").code(),
        Some(ErrorCode::InvalidRequest)
    );
    let mut req = busybox();
    req.timeout_secs = Some(0);
    assert_eq!(
        c.create_sandbox(&req).await.expect_err("timeout").code(),
        Some(ErrorCode::InvalidRequest)
    );

    // nothing was created by any of that
    assert!(c
        .list_sandboxes(&[])
        .await
        .expect("list")
        .sandboxes
        .is_empty());
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_against_a_sandbox() {
    let ts = TestServer::start_with(|cfg| cfg.max_upload_bytes = 1 << 20).await;
    let c = &ts.client;
    let id = c.create_sandbox(&busybox()).await.expect("create").id;

    // another tenant cannot see or touch it
    let other = ts.new_tenant_client("other").await;
    for err in [
        other.sandbox(&id).await.expect_err("get"),
        other.delete_sandbox(&id).await.expect_err("delete"),
        other
            .run(&id, &ProcessSpec::argv(["true"]))
            .await
            .expect_err("exec"),
        other
            .read_file_bytes(&id, "/etc/passwd", None)
            .await
            .expect_err("read"),
    ] {
        assert_eq!(err.code(), Some(ErrorCode::NotFound), "{err}");
    }
    assert!(other
        .list_sandboxes(&[])
        .await
        .expect("list")
        .sandboxes
        .is_empty());

    // path traversal in file APIs
    for path in [
        "../../etc/shadow",
        "/home/user/../../etc/shadow",
        "a/../../b",
        "x\0y",
    ] {
        let err = c.read_file_bytes(&id, path, None).await.expect_err(path);
        assert!(
            matches!(
                err.code(),
                Some(ErrorCode::InvalidPath) | Some(ErrorCode::InvalidRequest)
            ),
            "{path:?}: {err}"
        );
        let err = c
            .write_file(&id, path, None, None, b"x".to_vec())
            .await
            .expect_err(path);
        assert!(
            matches!(
                err.code(),
                Some(ErrorCode::InvalidPath) | Some(ErrorCode::InvalidRequest)
            ),
            "{path:?}: {err}"
        );
    }
    // permissions inside the guest are the user's
    let err = c
        .write_file(&id, "/etc/owned", None, None, b"x".to_vec())
        .await
        .expect_err("user cannot write /etc");
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");

    // oversize upload: refused, and the old content is intact (atomic replace)
    c.write_file(&id, "keep.txt", None, None, b"original".to_vec())
        .await
        .expect("write");
    let err = c
        .write_file(&id, "keep.txt", None, None, vec![b'x'; 2 << 20])
        .await
        .expect_err("oversize");
    assert_eq!(err.code(), Some(ErrorCode::PayloadTooLarge), "{err}");
    assert_eq!(err.status(), Some(413));
    assert_eq!(
        c.read_file_bytes(&id, "keep.txt", None)
            .await
            .expect("read"),
        b"original"
    );

    // exec of a missing binary
    let err = c
        .run(&id, &ProcessSpec::argv(["/no/such/binary"]))
        .await
        .expect_err("missing binary");
    assert_eq!(err.code(), Some(ErrorCode::ExecFailed), "{err}");
    // bad process specs
    let err = c
        .run(&id, &ProcessSpec::default())
        .await
        .expect_err("empty spec");
    assert_eq!(err.code(), Some(ErrorCode::InvalidRequest), "{err}");

    // a command that never ends is killed by its timeout
    let mut spec = ProcessSpec::argv(["sleep", "1000"]);
    spec.timeout_ms = Some(1500);
    let out = tokio::time::timeout(Duration::from_secs(60), c.run(&id, &spec))
        .await
        .expect("timeout honoured")
        .expect("run");
    assert!(out.status.timed_out, "{:?}", out.status);
    assert_eq!(out.status.signal, Some(9));

    // a client that disconnects mid-stream: the process goes on, the sandbox is fine,
    // and a new reader picks up the output where the first one left
    let p = c
        .start_process(
            &id,
            &ProcessSpec::shell("for i in 1 2 3 4 5; do echo line$i; sleep 0.3; done"),
        )
        .await
        .expect("start");
    let mut stream = c.output(&id, p.id, None).await.expect("output");
    let first = stream.next().await.expect("an event").expect("ok");
    drop(stream);
    let mut text = String::new();
    let mut stream = c
        .output(&id, p.id, Some(first.seq()))
        .await
        .expect("reconnect");
    let mut exit = None;
    while let Some(ev) = stream.next().await {
        let ev = ev.expect("event");
        if let Some((_, bytes)) = ev.bytes() {
            text.push_str(&String::from_utf8_lossy(&bytes));
        }
        if let space_core::process::OutputEvent::Exit { status, .. } = ev {
            exit = Some(status);
        }
    }
    assert_eq!(text, "line1\nline2\nline3\nline4\nline5\n");
    assert_eq!(exit.and_then(|s| s.exit_code), Some(0));
    assert_eq!(
        c.run(&id, &ProcessSpec::argv(["echo", "still fine"]))
            .await
            .expect("run")
            .stdout_str(),
        "still fine\n"
    );

    // deleting twice: the second is a clear not_found
    c.delete_sandbox(&id).await.expect("delete");
    assert_eq!(
        c.delete_sandbox(&id).await.expect_err("again").code(),
        Some(ErrorCode::NotFound)
    );
    ts.stop().await;
}
