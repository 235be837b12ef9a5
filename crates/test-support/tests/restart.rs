//! After `space server` restarts, running sandboxes are re-adopted and still usable; those
//! whose VMM died meanwhile are failed with the reason; nothing is orphaned.

use std::time::Duration;

use space_core::process::ProcessSpec;
use space_core::sandbox::CreateSandboxRequest;
use space_core::SandboxState;
use test_support::{TestServer, TEST_TEMPLATE};

fn busybox() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_readopts_running_and_fails_dead() {
    let ts = TestServer::start().await;
    let req = busybox();
    let (a, b) = tokio::join!(
        ts.client.create_sandbox(&req),
        ts.client.create_sandbox(&req)
    );
    let (a, b) = (a.expect("create a").id, b.expect("create b").id);
    ts.client
        .write_file(&a, "state.txt", None, None, b"survives".to_vec())
        .await
        .expect("write");
    let bg = ts
        .client
        .start_process(&a, &ProcessSpec::argv(["sleep", "600"]))
        .await
        .expect("background");

    let (data_dir, config) = ts.stop_keep_vms().await;
    // While the server is down, b's VMM dies.
    let pid: i32 = std::fs::read_to_string(data_dir.join("run").join(b.as_str()).join("vmm.pid"))
        .expect("pidfile")
        .trim()
        .parse()
        .expect("pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");

    let ts = TestServer::start_on(data_dir, config).await;
    let c = &ts.client;
    let info = c.sandbox(&a).await.expect("get a");
    assert_eq!(info.state, SandboxState::Running);
    assert_eq!(
        c.read_file_bytes(&a, "state.txt", None)
            .await
            .expect("read"),
        b"survives"
    );
    let out = c
        .run(&a, &ProcessSpec::argv(["echo", "after restart"]))
        .await
        .expect("run");
    assert_eq!(out.stdout_str(), "after restart\n");
    let procs = c.processes(&a).await.expect("processes");
    assert!(
        procs.iter().any(|p| p.id == bg.id && p.exit.is_none()),
        "background process survives: {procs:?}"
    );

    let info = ts
        .wait_state(&b, SandboxState::Failed, Duration::from_secs(30))
        .await;
    assert!(
        info.failure_reason
            .as_deref()
            .unwrap_or("")
            .to_lowercase()
            .contains("vmm"),
        "{info:?}"
    );

    c.delete_sandbox(&a).await.expect("delete a");
    c.delete_sandbox(&b).await.expect("delete b (failed)");
    assert!(test_support::leftover_sandbox_dirs()
        .iter()
        .all(|d| !d.starts_with(&ts.data_dir)));
    ts.stop().await;
}

/// A node upgraded from the version that kept credentials only on the node: at the first
/// start with the catalog, they move into it (listed, usable), and the node is synced; a
/// credential of a tenant the database does not know is not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn credentials_kept_by_the_node_move_into_the_catalog_once() {
    use space_secrets::{Credential, CredentialId, Scope, SecretValue};
    let ts = TestServer::start().await;
    let st = ts.server().state().clone();
    let tenant = st
        .db
        .tenant_by_name("default")
        .await
        .expect("db")
        .expect("the operator's tenant")
        .id;
    let rule = serde_json::from_value(serde_json::json!({
        "hosts": ["api.example.com"],
        "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
    }))
    .expect("rule");
    let made = |tenant: space_core::TenantId, name: &str| Credential {
        id: CredentialId::generate(),
        name: name.parse().expect("name"),
        scope: Scope::Tenant { tenant },
        rule: Clone::clone(&rule),
        created_at_ms: 1,
        expires_at_ms: None,
    };
    let old = made(tenant, "from-before");
    let stranger = made(space_core::TenantId::generate(), "unknown-tenant");
    // As the old version stored them: on the node, with no catalog revision yet.
    let node = ts.server().local_node().clone();
    for c in [&old, &stranger] {
        node.credentials()
            .put(
                c.clone(),
                SecretValue::new("sk-old-0001".into()).expect("value"),
            )
            .await
            .expect("put on the node");
    }
    assert_eq!(st.db.credential_revision().await.expect("rev"), 0);
    let (dir, config) = ts.stop_keep_vms().await;
    let ts = TestServer::start_on(dir, config).await;
    let listed = ts.client.credentials().await.expect("list");
    let ids: Vec<String> = listed.credentials.iter().map(|c| c.id.clone()).collect();
    assert_eq!(ids, vec![old.id.to_string()]);
    let on_node: Vec<CredentialId> = ts
        .server()
        .local_node()
        .credentials()
        .list()
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(
        on_node,
        vec![old.id.clone()],
        "the node is synced with the catalog"
    );
    // Once only: deleting it through the API is not undone by the next start.
    ts.client
        .delete_credential(&old.id.to_string())
        .await
        .expect("delete");
    let (dir, config) = ts.stop_keep_vms().await;
    let ts = TestServer::start_on(dir, config).await;
    assert!(ts
        .client
        .credentials()
        .await
        .expect("list")
        .credentials
        .is_empty());
    ts.stop().await;
}
