//! Ten sandboxes created at once and used side by side.

use sha2::Digest;
use space_core::process::ProcessSpec;
use space_core::sandbox::CreateSandboxRequest;
use space_core::SandboxState;
use test_support::{TestServer, TEST_TEMPLATE};

const SANDBOXES: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_sandboxes_concurrently() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let requests: Vec<_> = (0..SANDBOXES)
        .map(|i| {
            let mut req = CreateSandboxRequest {
                template: TEST_TEMPLATE.into(),
                ..Default::default()
            };
            req.labels.insert("batch".into(), "ten".into());
            req.env.insert("INDEX".into(), i.to_string());
            req
        })
        .collect();
    let creates = requests.iter().map(|req| c.create_sandbox(req));
    let sandboxes: Vec<_> = futures::future::join_all(creates)
        .await
        .into_iter()
        .map(|r| r.expect("create"))
        .collect();
    assert!(sandboxes.iter().all(|s| s.state == SandboxState::Running));
    let listed = c.list_sandboxes(&[("batch", "ten")]).await.expect("list");
    assert_eq!(listed.sandboxes.len(), SANDBOXES);

    // Use them all at once: each writes its own data, runs a command that reads it back.
    let work = sandboxes.iter().enumerate().map(|(i, sb)| async move {
        let data: Vec<u8> = (0..256 * 1024).map(|n| (n * (i + 7)) as u8).collect();
        c.write_file(&sb.id, "data.bin", None, None, data.clone())
            .await
            .expect("write");
        let out = c
            .run(
                &sb.id,
                &ProcessSpec::shell("echo $INDEX $(hostname); sha256sum data.bin"),
            )
            .await
            .expect("run");
        let text = out.stdout_str();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(format!("{i} {}", sb.id).as_str()));
        let expected = hex::encode(sha2::Sha256::digest(&data));
        assert!(
            lines.next().is_some_and(|l| l.starts_with(&expected)),
            "{text}"
        );
        assert_eq!(
            c.read_file_bytes(&sb.id, "data.bin", None)
                .await
                .expect("read"),
            data
        );
    });
    futures::future::join_all(work).await;

    futures::future::join_all(sandboxes.iter().map(|sb| c.delete_sandbox(&sb.id)))
        .await
        .into_iter()
        .for_each(|r| r.expect("delete"));
    assert!(c
        .list_sandboxes(&[("batch", "ten")])
        .await
        .expect("list")
        .sandboxes
        .is_empty());
    ts.stop().await;
}
