//! End to end through every layer: create a sandbox from a template, run commands, move
//! files, delete it, and find nothing left behind.

use std::collections::BTreeMap;

use space_core::process::ProcessSpec;
use space_core::sandbox::CreateSandboxRequest;
use space_core::SandboxState;
use test_support::{TestServer, TEST_TEMPLATE};

fn create_request() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        env: BTreeMap::from([("GREETING".into(), "hello from env".into())]),
        labels: BTreeMap::from([
            ("team".into(), "infra".into()),
            ("purpose".into(), "basics".into()),
        ]),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_exec_files_delete() {
    let ts = TestServer::start().await;
    let c = &ts.client;

    let templates = c.templates().await.expect("templates");
    assert!(
        templates.iter().any(|t| t.name == TEST_TEMPLATE),
        "{templates:?}"
    );

    let sb = c.create_sandbox(&create_request()).await.expect("create");
    assert_eq!(sb.state, SandboxState::Running);
    assert!(sb.create_latency_ms.is_some_and(|ms| ms > 0));
    assert_eq!(sb.env_keys, vec!["GREETING".to_owned()]);
    let id = sb.id.clone();

    // get and list with label filters
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Running
    );
    let listed = c.list_sandboxes(&[("team", "infra")]).await.expect("list");
    assert!(listed.sandboxes.iter().any(|s| s.id == id));
    let none = c.list_sandboxes(&[("team", "other")]).await.expect("list");
    assert!(none.sandboxes.iter().all(|s| s.id != id));

    // exec: stdout/stderr apart, env, default user, exit code
    let out = c
        .run(
            &id,
            &ProcessSpec::shell(
                "echo out; echo err >&2; echo \"$GREETING\"; id -u; hostname; exit 3",
            ),
        )
        .await
        .expect("run");
    assert_eq!(
        out.stdout_str(),
        format!("out\nhello from env\n1000\n{id}\n")
    );
    assert_eq!(out.stderr_str(), "err\n");
    assert_eq!(out.status.exit_code, Some(3));

    // root when asked, cwd
    let mut spec = ProcessSpec::argv(["sh", "-c", "id -u; pwd"]);
    spec.user = Some("root".into());
    spec.cwd = Some("/tmp".into());
    assert_eq!(
        c.run(&id, &spec).await.expect("run").stdout_str(),
        "0\n/tmp\n"
    );

    // files: write, read, stat, list, mkdir, rename, remove
    let body = b"line one\nline two\n".to_vec();
    let st = c
        .write_file(&id, "notes/a.txt", None, Some(0o600), body.clone())
        .await
        .expect("write");
    assert_eq!(st.path, "/home/user/notes/a.txt");
    assert_eq!(st.size, body.len() as u64);
    assert_eq!(st.mode & 0o777, 0o600);
    assert_eq!(st.uid, 1000);
    assert_eq!(
        c.read_file_bytes(&id, "/home/user/notes/a.txt", None)
            .await
            .expect("read"),
        body
    );
    let out = c
        .run(&id, &ProcessSpec::shell("cat ~/notes/a.txt | wc -l"))
        .await
        .expect("run");
    assert_eq!(out.stdout_str().trim(), "2");

    c.mkdir(
        &id,
        &space_core::files::MkdirRequest {
            path: "/home/user/deep/er/dir".into(),
            mode: None,
            user: None,
        },
    )
    .await
    .expect("mkdir -p");
    c.rename(
        &id,
        &space_core::files::RenameRequest {
            from: "notes/a.txt".into(),
            to: "deep/er/dir/b.txt".into(),
            user: None,
        },
    )
    .await
    .expect("rename");
    let list = c
        .list_files(&id, "/home/user/deep", Some(3), None)
        .await
        .expect("list");
    let paths: Vec<_> = list.entries.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"/home/user/deep/er/dir/b.txt"), "{paths:?}");
    let err = c
        .stat(&id, "notes/a.txt", None)
        .await
        .expect_err("moved away");
    assert_eq!(err.code(), Some(space_core::ErrorCode::NotFound));
    c.remove_file(&id, "/home/user/deep", true, None)
        .await
        .expect("rm -r");
    assert!(c.stat(&id, "/home/user/deep", None).await.is_err());

    // console log has the daemon's messages (the sandbox was restored from the template's
    // memory image, so there was no boot: the daemon logs the restored identity instead)
    let console = c.console(&id, Some(64 * 1024)).await.expect("console");
    assert!(console.contains("identity restored"), "console: {console}");

    // delete: gone, and nothing left on the node
    c.delete_sandbox(&id).await.expect("delete");
    // The record stays, marked deleted, for auditing; the sandbox is gone.
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Deleted
    );
    assert!(c
        .list_sandboxes(&[])
        .await
        .expect("list")
        .sandboxes
        .is_empty());
    assert!(!ts.data_dir.join("run").join(id.as_str()).exists());
    assert!(!ts
        .data_dir
        .join("store/sandboxes")
        .join(id.as_str())
        .exists());
    assert!(test_support::leaks::sandbox_vmm_processes()
        .iter()
        .all(|(_, cmd)| !cmd.contains(id.as_str())));
    ts.stop().await;
}

/// The template's network clients (Debian's curl and openssl, with their libraries and
/// glibc) run as the default user, and the CA bundle they use by default is in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curl_and_openssl_run() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let sb = c.create_sandbox(&create_request()).await.expect("create");
    let id = sb.id.clone();

    let curl = c
        .run(&id, &ProcessSpec::argv(["curl", "--version"]))
        .await
        .expect("run curl");
    assert_eq!(
        curl.status.exit_code,
        Some(0),
        "curl --version: {}{}",
        curl.stdout_str(),
        curl.stderr_str()
    );
    let version = curl.stdout_str();
    assert!(
        version
            .lines()
            .next()
            .is_some_and(|l| l.contains("OpenSSL/")),
        "{version}"
    );
    let features: Vec<&str> = version
        .lines()
        .find_map(|l| l.strip_prefix("Features:"))
        .unwrap_or_else(|| panic!("no features: {version}"))
        .split_whitespace()
        .collect();
    for f in ["HTTP2", "SSL"] {
        assert!(features.contains(&f), "no {f} in {features:?}");
    }

    let openssl = c
        .run(&id, &ProcessSpec::shell("openssl version; id -u"))
        .await
        .expect("run openssl");
    assert_eq!(
        openssl.status.exit_code,
        Some(0),
        "openssl version: {}{}",
        openssl.stdout_str(),
        openssl.stderr_str()
    );
    let out = openssl.stdout_str();
    assert!(out.starts_with("OpenSSL 3."), "{out}");
    assert!(out.ends_with("\n1000\n"), "not the default user: {out}");

    // Where the node installs the sandbox's CA, and where curl and openssl look for it.
    let ca = c
        .run(
            &id,
            &ProcessSpec::shell(
                "test -f /etc/ssl/certs/ca-certificates.crt \
                 && test -d /usr/local/share/ca-certificates \
                 && readlink /usr/lib/ssl/cert.pem",
            ),
        )
        .await
        .expect("run");
    assert_eq!(
        ca.stdout_str(),
        "/etc/ssl/certs/ca-certificates.crt\n",
        "{}",
        ca.stderr_str()
    );
    assert_eq!(ca.status.exit_code, Some(0));

    c.delete_sandbox(&id).await.expect("delete");
    ts.stop().await;
}

/// The template's bash (Debian's, with its libraries) runs as a login shell for the
/// default user: the E2B SDKs start every command as `/bin/bash -l -c …`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bash_runs() {
    let ts = TestServer::start().await;
    let c = &ts.client;
    let id = c
        .create_sandbox(&create_request())
        .await
        .expect("create")
        .id;

    let bash = c
        .run(
            &id,
            &ProcessSpec::argv([
                "/bin/bash",
                "-l",
                "-c",
                "echo $BASH_VERSION; shopt -q login_shell && echo login; id -u",
            ]),
        )
        .await
        .expect("run bash");
    assert_eq!(
        bash.status.exit_code,
        Some(0),
        "bash: {}{}",
        bash.stdout_str(),
        bash.stderr_str()
    );
    let out = bash.stdout_str();
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.first().is_some_and(|v| v.starts_with("5.")),
        "not bash 5: {out}"
    );
    assert_eq!(lines[1..], ["login", "1000"], "{out}");

    c.delete_sandbox(&id).await.expect("delete");
    ts.stop().await;
}
