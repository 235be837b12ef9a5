//! The warm pool on real VMs: a create takes a ready member, the member is made unique
//! (RNG, hostname) before it is handed out, and the pool refills in the background.

use std::collections::BTreeSet;
use std::time::Duration;

use space_core::sandbox::{CreateSandboxRequest, SandboxOrigin};
use space_core::SandboxId;
use test_support::{shell, wait_until, TestServer, TEST_TEMPLATE};

const POOL: usize = 2;

fn request() -> CreateSandboxRequest {
    CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    }
}

async fn wait_pool_ready(ts: &TestServer, ready: usize) {
    wait_until(
        Duration::from_secs(120),
        "the warm pool to fill",
        || async {
            let pools = ts.client.pool().await.ok()?;
            let shape = pools.pools.iter().find(|p| p.template == TEST_TEMPLATE)?;
            (shape.ready >= ready && shape.target == POOL).then_some(())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_take_unique_members_from_the_warm_pool() {
    let ts = TestServer::start_with(|c| c.node.pool_size = POOL).await;
    let c = &ts.client;

    // Nothing asked for yet: the first create restores from the memory image (built now),
    // and tells the pool which shape to keep warm.
    let first = c.create_sandbox(&request()).await.expect("create");
    assert_eq!(
        first.origin,
        Some(SandboxOrigin::TemplateImage { pooled: false })
    );
    wait_pool_ready(&ts, POOL).await;
    // The pool is node-wide state: another tenant may not see it.
    let other = ts.new_tenant_client("not-the-operator").await;
    let err = other.pool().await.expect_err("only the operator's tenant");
    assert_eq!(err.status(), Some(403), "{err:?}");

    let mut ids: Vec<SandboxId> = vec![first.id.clone()];
    for _ in 0..POOL {
        let sb = c.create_sandbox(&request()).await.expect("create");
        assert_eq!(
            sb.origin,
            Some(SandboxOrigin::TemplateImage { pooled: true }),
            "a ready member of the same shape must be used"
        );
        ids.push(sb.id);
    }

    // Restored uniqueness: own hostname (one /etc/hosts line for it, none left from the
    // member's warm-up name) and RNG output no sibling shares.
    let mut randoms = BTreeSet::new();
    for id in &ids {
        let out = shell(
            c,
            id,
            "hostname; grep -c 'space hostname' /etc/hosts; grep -c pool- /etc/hosts || true; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'",
            true,
        )
        .await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], id.as_str(), "hostname of {id}");
        assert_eq!(lines[1], "1", "one hostname line in /etc/hosts of {id}");
        assert_eq!(
            lines[2], "0",
            "no pool member name left in /etc/hosts of {id}"
        );
        assert!(
            randoms.insert(lines[3].to_owned()),
            "{id} repeats a sibling's random bytes"
        );
    }

    // The pool refills behind the creates.
    wait_pool_ready(&ts, POOL).await;
    for id in &ids {
        c.delete_sandbox(id).await.expect("delete");
    }
    ts.stop().await;
}
