//! Tenants' quotas and API keys' request rates through the real API, on real sandboxes
//! (issue 12, item 5): a tenant over a limit gets `403 quota_exceeded` naming it — for
//! sandboxes, vCPUs, a fork, snapshot bytes (counted when taken: nothing is written) and
//! credentials — and nothing is made; only the operator sets quotas; a key over its rate
//! gets `429 rate_limited` with `Retry-After`, another key of the tenant does not.

use std::time::Duration;

use space_cli::client::{ClientError, SpaceClient};
use space_core::quota::TenantQuota;
use space_core::sandbox::{CreateSandboxRequest, CreateSnapshotRequest, ForkRequest};
use space_core::{ErrorCode, SnapshotKind};
use test_support::{TestServer, TEST_TEMPLATE};

const TENANT: &str = "quota-tenant";

fn exceeded(e: ClientError, limit: &str) {
    assert_eq!(e.status(), Some(403), "{e:?}");
    assert_eq!(e.code(), Some(ErrorCode::QuotaExceeded), "{e:?}");
    assert!(e.to_string().contains(limit), "{e}");
}

fn credential(name: &str) -> space_control::api::credentials::CredentialRequest {
    test_support::bearer_credential(name, "sk-quota-test-value-0001")
}

async fn create(c: &SpaceClient, vcpus: Option<u32>) -> Result<space_core::SandboxId, ClientError> {
    let mut req = CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    };
    req.resources.vcpus = vcpus;
    c.create_sandbox(&req).await.map(|s| s.id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_over_its_quota_is_refused_and_nothing_is_made() {
    let ts = TestServer::start().await;
    let operator = &ts.client;
    let c = ts.new_tenant_client(TENANT).await;
    let quota = TenantQuota {
        max_sandboxes: Some(1),
        max_vcpus: Some(1),
        max_credentials: Some(1),
        max_snapshot_bytes: Some(1024 * 1024),
        ..Default::default()
    };
    // Only the operator sets quotas, and only valid ones.
    let err = c
        .set_tenant_quota(TENANT, &quota)
        .await
        .expect_err("not the operator");
    assert_eq!(err.status(), Some(403), "{err:?}");
    let err = operator
        .set_tenant_quota(
            TENANT,
            &TenantQuota {
                requests_per_sec: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect_err("a zero rate");
    assert_eq!(err.status(), Some(400), "{err:?}");
    let err = operator
        .tenant_quota("no-such-tenant")
        .await
        .expect_err("404");
    assert_eq!(err.status(), Some(404), "{err:?}");
    let report = operator
        .set_tenant_quota(TENANT, &quota)
        .await
        .expect("set");
    assert_eq!(report.quota.max_sandboxes, Some(1));
    // The defaults fill in what the tenant's own quota leaves out.
    assert_eq!(
        report.quota.max_memory_mib,
        TenantQuota::embedded_default().max_memory_mib
    );

    exceeded(create(&c, Some(2)).await.expect_err("2 vCPUs"), "max_vcpus");
    let id = create(&c, Some(1)).await.expect("the first sandbox");
    exceeded(
        create(&c, Some(1)).await.expect_err("a second"),
        "max_sandboxes",
    );
    let err = c
        .fork(
            &id,
            &ForkRequest {
                count: Some(1),
                ..Default::default()
            },
        )
        .await
        .expect_err("a fork child is a sandbox too");
    exceeded(err, "max_sandboxes");
    for kind in [SnapshotKind::Disk, SnapshotKind::Checkpoint] {
        let err = c
            .create_snapshot(
                &id,
                &CreateSnapshotRequest {
                    kind,
                    label: None,
                    persistent: false,
                },
            )
            .await
            .expect_err("over the snapshot bytes");
        exceeded(err, "max_snapshot_bytes");
    }
    assert!(
        c.snapshots(&id).await.expect("list").snapshots.is_empty(),
        "nothing was taken"
    );
    c.create_credential(&credential("one"))
        .await
        .expect("the first credential");
    exceeded(
        c.create_credential(&credential("two"))
            .await
            .expect_err("a second"),
        "max_credentials",
    );

    let mine = c.my_quota().await.expect("usage");
    assert_eq!(
        (
            mine.usage.sandboxes,
            mine.usage.vcpus,
            mine.usage.credentials
        ),
        (1, 1, 1)
    );
    assert_eq!(
        c.list_sandboxes(&[]).await.expect("list").sandboxes.len(),
        1,
        "the refused made nothing"
    );

    // Raised, it admits again; the operator's own tenant was never limited by it.
    operator
        .set_tenant_quota(
            TENANT,
            &TenantQuota {
                max_sandboxes: Some(2),
                max_vcpus: Some(2),
                ..quota
            },
        )
        .await
        .expect("raise");
    let second = create(&c, Some(1)).await.expect("a second sandbox now");
    operator.clear_tenant_quota(TENANT).await.expect("clear");
    assert_eq!(c.my_quota().await.expect("usage").own, None);
    for id in [id, second] {
        let _ = c.delete_sandbox(&id).await;
    }
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_over_its_rate_gets_429_with_retry_after() {
    let ts = TestServer::start().await;
    let db = &ts.server().state().db;
    let tenant = db.create_tenant(TENANT).await.expect("tenant");
    let key = db
        .create_api_key(&tenant.id)
        .await
        .expect("key")
        .plaintext
        .0;
    let other_key = db
        .create_api_key(&tenant.id)
        .await
        .expect("key")
        .plaintext
        .0;
    ts.client
        .set_tenant_quota(
            TENANT,
            &TenantQuota {
                requests_per_sec: Some(1),
                request_burst: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("set");
    let http = reqwest::Client::new();
    let get = |key: &str| {
        let rb = http
            .get(format!("{}/v1/sandboxes", ts.url()))
            .bearer_auth(key);
        async move { rb.send().await.expect("send") }
    };
    let mut statuses = Vec::new();
    let mut limited = None;
    for _ in 0..5 {
        let r = get(&key).await;
        statuses.push(r.status().as_u16());
        if r.status() == 429 {
            limited = Some(r);
            break;
        }
    }
    let r = limited.unwrap_or_else(|| panic!("never limited: {statuses:?}"));
    assert_eq!(&statuses[..3], &[200, 200, 200], "the burst passes");
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=2).contains(&retry), "{retry}");
    let body: space_core::ErrorBody = r.json().await.expect("error body");
    assert_eq!(body.code, ErrorCode::RateLimited);
    // Another key of the same tenant has a bucket of its own.
    assert_eq!(get(&other_key).await.status(), 200);
    // After the wait, the key is served again.
    tokio::time::sleep(Duration::from_secs(retry)).await;
    assert_eq!(get(&key).await.status(), 200);
    ts.stop().await;
}
