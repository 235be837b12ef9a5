//! The `space` binary and `SpaceClient` against a real server (no VM needed): exit codes,
//! the `error: <message> (<code>)` format, key administration, JSON output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use space_cli::client::{ClientError, SpaceClient};
use space_control::{Server, ServerConfig};
use space_core::{ErrorCode, SandboxId};

/// Node data directories must be on btrfs: use the test suite's shared store
/// (`$SPACE_TEST_ROOT`, default `/var/tmp/space-test`), mounted once under a lock.
fn shared_store_root() -> &'static Path {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::var_os("SPACE_TEST_ROOT")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/tmp/space-test"));
        std::fs::create_dir_all(&root).unwrap();
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join(".setup.lock"))
            .unwrap();
        fs4::fs_std::FileExt::lock_exclusive(&lock).unwrap();
        let store = space_storage::Store::open(&root, 32 << 30).unwrap();
        let _ = fs4::fs_std::FileExt::unlock(&lock);
        store.root().to_owned()
    })
}

/// Removes the data directory even when the test fails.
struct DataDir(PathBuf);

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn start() -> (Server, DataDir) {
    let id = SandboxId::generate();
    let name = &id.as_str()[4..14];
    let dir = DataDir(shared_store_root().join("nodes").join(format!("cli{name}")));
    std::fs::create_dir_all(&dir.0).unwrap();
    let mut cfg = ServerConfig::new(&dir.0);
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    (Server::start(cfg).await.unwrap(), dir)
}

/// Runs `space` (on a blocking thread: the server runs on this runtime).
async fn space(server: &Server, dir: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_space"));
    cmd.env_remove("SPACE_API_KEY")
        .env_remove("SPACE_URL")
        .env_remove("SPACE_DATA_DIR");
    cmd.arg("--url")
        .arg(server.url())
        .arg("--data-dir")
        .arg(dir)
        .args(args);
    tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap()
}

/// Runs `space args…` (no server needed) with `input` on stdin.
async fn space_with_stdin(args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_space"));
    cmd.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let input = input.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = cmd.spawn().unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test]
async fn commands_report_errors_with_codes_and_exit_status() {
    let (server, dir) = start().await;

    // The key file in the data directory is used by default.
    let out = space(&server, &dir.0, &["sandbox", "list"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no sandboxes"));

    let out = space(&server, &dir.0, &["--json", "template", "list"]).await;
    assert!(out.status.success());
    let templates: Vec<space_core::template::TemplateInfo> =
        serde_json::from_slice(&out.stdout).unwrap();
    assert!(templates.is_empty());

    let missing = SandboxId::generate();
    let out = space(&server, &dir.0, &["sandbox", "get", missing.as_str()]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim(),
        format!("error: sandbox {missing} not found (not_found)")
    );

    let out = space(
        &server,
        &dir.0,
        &["--api-key", "space_nope", "sandbox", "list"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("(unauthenticated)"),
        "{}",
        text(&out.stderr)
    );

    let out = space(
        &server,
        &dir.0,
        &["sandbox", "create", "--template", "nope"],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim(),
        "error: template 'nope' not found (not_found)"
    );

    let out = space(
        &server,
        &dir.0,
        &["files", "stat", missing.as_str(), "../etc/passwd"],
    )
    .await;
    assert!(
        text(&out.stderr).contains("(invalid_path)"),
        "{}",
        text(&out.stderr)
    );

    let out = space(&server, &dir.0, &["exec", missing.as_str(), "--", "true"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("(not_found)"));

    server.shutdown().await;
}

#[tokio::test]
async fn key_create_makes_a_working_key_for_another_tenant() {
    let (server, dir) = start().await;
    let out = space(&server, &dir.0, &["key", "create", "--tenant", "acme"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key = text(&out.stdout).trim().to_owned();
    assert!(key.starts_with("space_"));

    let acme = SpaceClient::new(&server.url(), Some(key.clone())).unwrap();
    assert!(acme.list_sandboxes(&[]).await.unwrap().sandboxes.is_empty());

    // The E2B format of that key (what every E2B SDK accepts) is the same key.
    let converted = space_with_stdin(&["key", "convert", "--format", "e2b"], &key).await;
    assert!(converted.status.success(), "{}", text(&converted.stderr));
    let e2b_key = text(&converted.stdout).trim().to_owned();
    assert_eq!(e2b_key, format!("e2b_{}", &key["space_".len()..]));
    let back = space_with_stdin(&["key", "convert", "--format", "space"], &e2b_key).await;
    assert_eq!(text(&back.stdout).trim(), key);
    let junk = space_with_stdin(&["key", "convert"], "e2b_XYZ\n").await;
    assert_eq!(junk.status.code(), Some(1));
    assert!(
        text(&junk.stderr).contains("no API key"),
        "{}",
        text(&junk.stderr)
    );
    let same = SpaceClient::new(&server.url(), Some(e2b_key)).unwrap();
    assert!(same.list_sandboxes(&[]).await.unwrap().sandboxes.is_empty());

    // `--format e2b` mints a key printed in that format.
    let out = space(
        &server,
        &dir.0,
        &["key", "create", "--tenant", "acme", "--format", "e2b"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let minted = text(&out.stdout).trim().to_owned();
    assert!(minted.starts_with("e2b_") && minted.len() == 68, "{minted}");
    let minted = SpaceClient::new(&server.url(), Some(minted)).unwrap();
    assert!(minted
        .list_sandboxes(&[])
        .await
        .unwrap()
        .sandboxes
        .is_empty());

    let out = space(&server, &dir.0, &["--json", "key", "list"]).await;
    let keys: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed = keys.as_array().unwrap();
    assert_eq!(listed.len(), 3);
    assert!(
        !text(&out.stdout).contains(&key),
        "listing must not show keys"
    );
    let acme_key_id = listed
        .iter()
        .find(|k| k["tenant"] == "acme" && key.starts_with(k["prefix"].as_str().unwrap()))
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let out = space(&server, &dir.0, &["key", "revoke", &acme_key_id]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = acme.list_sandboxes(&[]).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Unauthenticated));

    // A database the server's user owns is not opened by another (SQLite's side files
    // would lock the server out of it).
    if nix::unistd::geteuid().is_root() {
        let db = dir.0.join("control.db");
        std::os::unix::fs::chown(&db, Some(4343), None).unwrap();
        let out = space(&server, &dir.0, &["key", "list"]).await;
        assert!(!out.status.success());
        assert!(
            text(&out.stderr).contains("belongs to 4343"),
            "{}",
            text(&out.stderr)
        );
        std::os::unix::fs::chown(&db, Some(0), None).unwrap();
    }
    server.shutdown().await;
}

#[tokio::test]
async fn client_maps_errors_to_codes() {
    let (server, _dir) = start().await;
    let key = std::fs::read_to_string(server.api_key_file())
        .unwrap()
        .trim()
        .to_owned();
    let client = SpaceClient::new(&server.url(), Some(key)).unwrap();
    assert_eq!(client.health().await.unwrap()["status"], "ok");
    assert!(client.openapi().await.unwrap()["paths"].is_object());
    assert!(client.templates().await.unwrap().is_empty());

    // Ids are percent-encoded: a hostile id cannot reach another route.
    let err = client.sandbox("../../healthz").await.unwrap_err();
    assert_eq!(
        (err.status(), err.code()),
        (Some(400), Some(ErrorCode::InvalidRequest))
    );
    let err = client
        .delete_sandbox(&SandboxId::generate())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::NotFound));
    let err = client
        .stat(&SandboxId::generate(), "a/../../b", None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidPath));
    assert!(matches!(err, ClientError::Api { status: 400, .. }));

    let nobody = SpaceClient::new(&server.url(), None).unwrap();
    assert_eq!(
        nobody.list_sandboxes(&[]).await.unwrap_err().code(),
        Some(ErrorCode::Unauthenticated)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn lifecycle_and_snapshot_commands_report_errors() {
    let (server, dir) = start().await;
    let missing = SandboxId::generate();
    let snap = space_core::SnapshotId::generate();
    let id = missing.as_str();
    for args in [
        vec!["sandbox", "pause", id],
        vec!["sandbox", "resume", id],
        vec!["sandbox", "stop", id],
        vec!["sandbox", "start", id],
        vec!["sandbox", "rollback", id, snap.as_str()],
        vec!["sandbox", "fork", id, "--count", "2"],
        vec!["sandbox", "events", id],
        vec!["sandbox", "events", id, "--follow"],
        vec!["snapshot", "list", id],
        vec!["snapshot", "create", id, "--checkpoint", "--label", "x"],
        vec!["snapshot", "diff", id, snap.as_str(), snap.as_str()],
    ] {
        let out = space(&server, &dir.0, &args).await;
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            text(&out.stderr).trim(),
            format!("error: sandbox {missing} not found (not_found)"),
            "{args:?}"
        );
    }
    // `snapshot rm` goes on after a failure and reports each one.
    let out = space(
        &server,
        &dir.0,
        &["snapshot", "rm", id, "not-a-snapshot", snap.as_str()],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("bad snapshot id \"not-a-snapshot\""), "{err}");
    assert!(err.contains("(not_found)"), "{err}");
    // Bad ids are refused before any request.
    let out = space(&server, &dir.0, &["sandbox", "rollback", id, "nope"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("bad snapshot id"));
    let out = space(&server, &dir.0, &["sandbox", "fork", id, "--count", "99"]).await;
    assert!(
        text(&out.stderr).contains("count must be between 1 and 16, got 99 (invalid_request)"),
        "{}",
        text(&out.stderr)
    );

    // The pool of a node that has not been asked for anything is empty.
    let out = space(&server, &dir.0, &["--json", "pool"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pools: space_core::sandbox::PoolStatusList = serde_json::from_slice(&out.stdout).unwrap();
    assert!(pools.pools.is_empty());
    let out = space(&server, &dir.0, &["pool"]).await;
    assert!(out.status.success());
    assert!(text(&out.stderr).contains("warm pool is empty"));
    server.shutdown().await;
}

#[tokio::test]
async fn egress_and_credential_commands_round_trip() {
    let (server, dir) = start().await;
    let run = |args: &'static [&'static str]| space(&server, &dir.0, args);

    let out = run(&[
        "egress",
        "set-default",
        "--allow",
        "*.github.com",
        "--deny",
        "gist.github.com",
    ])
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(&["egress", "get-default"]).await;
    let policy: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(policy["mode"], "allowlist");
    assert_eq!(policy["rules"].as_array().unwrap().len(), 2);
    let out = run(&["egress", "clear-default"]).await;
    assert!(out.status.success());
    let out = run(&["egress", "get-default"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("(not_found)"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["egress", "set-default", "--allow", "a b"]).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "a bad domain is refused before sending"
    );

    // The value comes from a file (or stdin), never the command line, and never comes back.
    let value = "ghp_cli_test_value_4d3c2b1a";
    std::fs::write(dir.0.join("value"), format!("{value}\n")).unwrap();
    let value_file = dir.0.join("value").display().to_string();
    let rule = r#"{"hosts": ["api.github.com"], "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"}}"#;
    let out = space(
        &server,
        &dir.0,
        &[
            "credential",
            "create",
            "--name",
            "github",
            "--rule",
            rule,
            "--value-file",
            &value_file,
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains(value));
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    let out = run(&["credential", "list"]).await;
    assert!(text(&out.stdout).contains(&id) && !text(&out.stdout).contains(value));
    let out = run(&["audit", "credentials", "--limit", "10"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = space(&server, &dir.0, &["credential", "rm", &id]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = space(&server, &dir.0, &["credential", "get", &id]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("(not_found)"));
    server.shutdown().await;
}
