//! The database layer against real databases: SQLite always, PostgreSQL when
//! `SPACE_TEST_POSTGRES_URL` is set (e.g. `postgres://postgres@127.0.0.1:5433/postgres`).

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use space_control::bootstrap::{api_key_path, bootstrap};
use space_control::db::{
    DbError, DesiredState, SandboxFilter, SandboxRow, SandboxSpec, SandboxTokens,
};
use space_core::sandbox::TimeoutAction;
use space_core::{Resources, SandboxId, TenantId};

fn row(tenant: &TenantId, created_at_ms: i64, labels: &[(&str, &str)]) -> SandboxRow {
    SandboxRow {
        id: SandboxId::generate(),
        tenant_id: tenant.clone(),
        node: "local".into(),
        template: "base".into(),
        template_digest: "sha256:abc".into(),
        spec: SandboxSpec {
            resources: Resources::default(),
            env_keys: vec!["TOKEN".into()],
            forked_from: None,
            from_snapshot: None,
            public_ports: Default::default(),
            on_node_loss: Default::default(),
            checkpoint_interval_secs: None,
            snapshot_storage: Default::default(),
        },
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        desired_state: DesiredState::Running,
        created_at_ms,
        expires_at_ms: created_at_ms + 3_600_000,
        timeout_secs: 3600,
        on_timeout: TimeoutAction::Delete,
        auto_resume: false,
        timed_out_at_ms: None,
        deleted_at_ms: None,
        create_latency_ms: None,
        creating_replica: None,
        suspended_snapshot: None,
        stored_checkpoint: None,
        stored_checkpoint_at_ms: None,
        tokens: Default::default(),
    }
}

#[tokio::test]
async fn migrations_are_idempotent() {
    let all: Vec<i64> = space_control::db::migrations::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(all, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    for t in common::test_dbs().await {
        assert_eq!(t.db.applied_migrations().await.unwrap(), all, "{}", t.label);
        t.db.migrate().await.unwrap();
        assert_eq!(t.db.applied_migrations().await.unwrap(), all, "{}", t.label);
    }
}

#[tokio::test]
async fn tenant_egress_policies_upsert_and_clear_on_every_backend() {
    use space_core::egress::{EgressMode, EgressPolicy};
    for t in common::test_dbs().await {
        let tenant = t.db.create_tenant("egress").await.unwrap();
        assert_eq!(t.db.tenant_egress_policy(&tenant.id).await.unwrap(), None);
        let open = EgressPolicy::allow_all_public();
        t.db.set_tenant_egress_policy(&tenant.id, Some(&open))
            .await
            .unwrap();
        let none = EgressPolicy {
            mode: EgressMode::None,
            rules: vec![],
        };
        // A second set replaces the first (upsert), on SQLite and PostgreSQL alike.
        t.db.set_tenant_egress_policy(&tenant.id, Some(&none))
            .await
            .unwrap();
        assert_eq!(
            t.db.tenant_egress_policy(&tenant.id).await.unwrap(),
            Some(none),
            "{}",
            t.label
        );
        t.db.set_tenant_egress_policy(&tenant.id, None)
            .await
            .unwrap();
        assert_eq!(t.db.tenant_egress_policy(&tenant.id).await.unwrap(), None);
    }
}

#[tokio::test]
async fn sqlite_file_is_created_in_wal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let url = space_control::db::default_sqlite_url(dir.path());
    let db = space_control::db::Db::connect(&url).await.unwrap();
    db.create_tenant("t").await.unwrap();
    assert!(dir.path().join("control.db").exists());
    assert!(
        dir.path().join("control.db-wal").exists(),
        "WAL journal missing"
    );
    db.close().await;
    // Reopening keeps the data.
    let db = space_control::db::Db::connect(&url).await.unwrap();
    assert!(db.tenant_by_name("t").await.unwrap().is_some());
}

#[tokio::test]
async fn tenants() {
    for t in common::test_dbs().await {
        let db = &t.db;
        let a = db.create_tenant("acme").await.unwrap();
        assert!(
            matches!(
                db.create_tenant("acme").await,
                Err(DbError::AlreadyExists(_))
            ),
            "{}",
            t.label
        );
        assert!(matches!(
            db.create_tenant("Bad Name").await,
            Err(DbError::Invalid(_))
        ));
        assert_eq!(db.tenant_by_name("acme").await.unwrap(), Some(a.clone()));
        assert_eq!(db.tenant(&a.id).await.unwrap(), Some(a.clone()));
        assert_eq!(db.tenant_by_name("nobody").await.unwrap(), None);
        db.create_tenant("beta").await.unwrap();
        let names: Vec<_> = db
            .tenants()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.name)
            .collect();
        assert_eq!(names, vec!["acme", "beta"]);
    }
}

#[tokio::test]
async fn api_keys() {
    for t in common::test_dbs().await {
        let db = &t.db;
        let a = db.create_tenant("acme").await.unwrap();
        let b = db.create_tenant("beta").await.unwrap();
        let ka = db.create_api_key(&a.id).await.unwrap();
        let kb = db.create_api_key(&b.id).await.unwrap();
        assert!(ka.plaintext.0.starts_with("space_"));
        assert!(
            !format!("{ka:?}").contains(&ka.plaintext.0),
            "Debug leaks the key"
        );
        assert_eq!(
            db.authenticate(&ka.plaintext.0)
                .await
                .unwrap()
                .map(|t| t.id),
            Some(a.id.clone())
        );
        assert_eq!(
            db.authenticate(&kb.plaintext.0)
                .await
                .unwrap()
                .map(|t| t.id),
            Some(b.id.clone())
        );
        // Unknown, malformed and empty keys.
        let unknown = space_control::keys::generate().plaintext;
        assert_eq!(db.authenticate(&unknown).await.unwrap(), None);
        assert_eq!(db.authenticate("space_x").await.unwrap(), None);
        assert_eq!(db.authenticate("").await.unwrap(), None);
        // Listing shows the prefix only.
        let listed = db.api_keys(Some(&a.id)).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(ka.plaintext.0.starts_with(&listed[0].prefix) && listed[0].prefix.len() < 20);
        assert_eq!(db.api_keys(None).await.unwrap().len(), 2);
        // The E2B format of a key is the same key: it authenticates as the tenant, and a
        // look-alike of the wrong case or length does not.
        use space_control::keys::{in_format, KeyFormat};
        let ka_e2b = in_format(&ka.plaintext.0, KeyFormat::E2b).unwrap();
        assert_eq!(
            db.authenticate(&ka_e2b).await.unwrap().map(|t| t.id),
            Some(a.id.clone())
        );
        assert_eq!(db.authenticate(&ka_e2b.to_uppercase()).await.unwrap(), None);
        assert_eq!(
            db.authenticate(&ka_e2b[..ka_e2b.len() - 1]).await.unwrap(),
            None
        );
        // Revocation by the E2B format's prefix revokes the key in both formats; then by
        // id reports not found.
        let revoked = db.revoke_api_key(&ka_e2b[..12]).await.unwrap();
        assert_eq!(revoked.id, ka.info.id);
        assert!(revoked.revoked_at_ms.is_some());
        assert_eq!(db.authenticate(&ka.plaintext.0).await.unwrap(), None);
        assert_eq!(db.authenticate(&ka_e2b).await.unwrap(), None);
        assert!(matches!(
            db.revoke_api_key(&ka.info.id).await,
            Err(DbError::NotFound(_))
        ));
        assert!(db.authenticate(&kb.plaintext.0).await.unwrap().is_some());
        // Keys need an existing tenant.
        assert!(
            matches!(
                db.create_api_key(&TenantId::generate()).await,
                Err(DbError::NotFound(_))
            ),
            "{}",
            t.label
        );
    }
}

#[tokio::test]
async fn sandbox_tokens_are_renewed_and_revoked() {
    for t in common::test_dbs().await {
        let db = &t.db;
        let a = db.create_tenant("acme").await.unwrap();
        let b = db.create_tenant("beta").await.unwrap();
        let ka = db.create_api_key(&a.id).await.unwrap();
        let (ra, rb) = (row(&a.id, 1, &[]), row(&b.id, 2, &[]));
        db.insert_sandbox(&ra).await.unwrap();
        db.insert_sandbox(&rb).await.unwrap();
        // None handed out yet; renewing never shortens.
        let fresh = db.sandbox_any_tenant(&ra.id).await.unwrap().unwrap().tokens;
        assert_eq!(fresh, SandboxTokens::default(), "{}", t.label);
        let renewed = db.renew_tokens(&ra.id, 5_000).await.unwrap().unwrap();
        assert_eq!((renewed.epoch, renewed.valid_until_ms), (0, 5_000));
        let kept = db.renew_tokens(&ra.id, 4_000).await.unwrap().unwrap();
        assert_eq!(kept.valid_until_ms, 5_000);
        // The sandbox's own revocation: a new epoch, none valid.
        assert!(db.revoke_tokens(&ra.id).await.unwrap());
        let revoked = db.sandbox_any_tenant(&ra.id).await.unwrap().unwrap().tokens;
        assert_eq!((revoked.epoch, revoked.valid_until_ms), (1, 0));
        assert!(!db.revoke_tokens(&SandboxId::generate()).await.unwrap());
        // An API key's revocation moves every sandbox of its tenant on, no other.
        db.revoke_api_key(&ka.info.id).await.unwrap();
        assert_eq!(
            db.sandbox_any_tenant(&ra.id)
                .await
                .unwrap()
                .unwrap()
                .tokens
                .epoch,
            2
        );
        assert_eq!(
            db.sandbox_any_tenant(&rb.id)
                .await
                .unwrap()
                .unwrap()
                .tokens
                .epoch,
            0
        );
        // A deleted sandbox hands out nothing.
        db.mark_deleted(&rb.id, 10).await.unwrap();
        assert_eq!(db.renew_tokens(&rb.id, 9_000).await.unwrap(), None);
    }
}

#[tokio::test]
async fn sandboxes_are_scoped_to_their_tenant() {
    for t in common::test_dbs().await {
        let db = &t.db;
        let a = db.create_tenant("acme").await.unwrap().id;
        let b = db.create_tenant("beta").await.unwrap().id;
        let r1 = row(&a, 1000, &[("team", "x")]);
        let r2 = row(&a, 2000, &[("team", "y")]);
        let r3 = row(&b, 1500, &[]);
        for r in [&r1, &r2, &r3] {
            db.insert_sandbox(r).await.unwrap();
        }
        assert!(
            matches!(db.insert_sandbox(&r1).await, Err(DbError::AlreadyExists(_))),
            "{}",
            t.label
        );
        assert_eq!(
            db.sandbox(&a, &r1.id).await.unwrap().as_ref(),
            Some(&r1),
            "{}",
            t.label
        );
        assert_eq!(
            db.sandbox(&b, &r1.id).await.unwrap(),
            None,
            "other tenant's sandbox must be invisible"
        );
        assert_eq!(
            db.sandbox_any_tenant(&r3.id).await.unwrap().as_ref(),
            Some(&r3)
        );
        // Newest first.
        let ids: Vec<_> = db
            .sandboxes(&a, SandboxFilter::Live)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, vec![r2.id.clone(), r1.id.clone()]);
        // What was made from a template: everyone's, or one tenant's.
        let used = |tenant: Option<TenantId>| async move {
            db.count_using_template("sha256:abc", tenant.as_ref())
                .await
                .unwrap()
        };
        assert_eq!(used(None).await, 3, "{}", t.label);
        assert_eq!(used(Some(a.clone())).await, 2, "{}", t.label);
        assert_eq!(used(Some(b.clone())).await, 1, "{}", t.label);
        assert_eq!(
            db.count_stored_using_template("abc", Some(&b))
                .await
                .unwrap(),
            0,
            "{}",
            t.label
        );
        // A sandbox row from a missing tenant is refused (foreign key).
        assert!(
            db.insert_sandbox(&row(&TenantId::generate(), 1, &[]))
                .await
                .is_err(),
            "{}",
            t.label
        );
    }
}

#[tokio::test]
async fn sandbox_lifecycle_updates() {
    for t in common::test_dbs().await {
        let db = &t.db;
        let a = db.create_tenant("acme").await.unwrap().id;
        let r1 = row(&a, 1000, &[]);
        let r2 = row(&a, 2000, &[]);
        db.insert_sandbox(&r1).await.unwrap();
        db.insert_sandbox(&r2).await.unwrap();

        let spec = SandboxSpec {
            resources: Resources {
                vcpus: 2,
                ..Resources::default()
            },
            env_keys: vec!["A".into()],
            forked_from: None,
            from_snapshot: None,
            public_ports: space_core::sandbox::PublicPorts::Only(vec![8000]),
            on_node_loss: space_core::sandbox::OnNodeLoss::Restore,
            checkpoint_interval_secs: Some(60),
            snapshot_storage: Default::default(),
        };
        db.set_created(&r1.id, "sha256:new", &spec, 1234)
            .await
            .unwrap();
        let got = db.sandbox(&a, &r1.id).await.unwrap().unwrap();
        assert_eq!(
            (
                got.template_digest.as_str(),
                got.create_latency_ms,
                &got.spec
            ),
            ("sha256:new", Some(1234), &spec)
        );

        assert!(db.set_timeout(&r1.id, 90, 9_000).await.unwrap());
        let got = db.sandbox(&a, &r1.id).await.unwrap().unwrap();
        assert_eq!((got.expires_at_ms, got.timeout_secs), (99_000, 90));

        // Exactly one caller wins the delete.
        assert!(db.mark_deleted(&r1.id, 5000).await.unwrap(), "{}", t.label);
        assert!(!db.mark_deleted(&r1.id, 6000).await.unwrap());
        let deleted = db.sandbox(&a, &r1.id).await.unwrap().unwrap();
        assert_eq!(
            (deleted.desired_state, deleted.deleted_at_ms),
            (DesiredState::Deleted, Some(5000))
        );
        assert!(
            !db.set_timeout(&r1.id, 1, 0).await.unwrap(),
            "expiry of a deleted sandbox must not change"
        );
        assert!(!db.renew_timeout(&r1.id, 0).await.unwrap());
        assert!(!db.mark_timed_out(&r1.id, i64::MAX).await.unwrap());

        let live: Vec<_> = db
            .live_sandboxes()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(live, vec![r2.id.clone()]);
        let deleted: Vec<_> = db
            .sandboxes(&a, SandboxFilter::Deleted)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(deleted, vec![r1.id.clone()]);
        let all: Vec<_> = db
            .sandboxes(&a, SandboxFilter::All)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(all, vec![r2.id.clone(), r1.id.clone()]);
    }
}

#[tokio::test]
async fn timeout_actions_and_the_timed_out_mark_survive_a_reopen() {
    for t in common::test_dbs().await {
        let db = &t.db;
        let a = db.create_tenant("ttl").await.unwrap().id;
        let r = SandboxRow {
            on_timeout: TimeoutAction::Pause,
            auto_resume: true,
            timeout_secs: 20,
            expires_at_ms: 21_000,
            ..row(&a, 1000, &[])
        };
        db.insert_sandbox(&r).await.unwrap();
        assert_eq!(
            db.sandbox(&a, &r.id).await.unwrap().unwrap(),
            r,
            "{}",
            t.label
        );

        // Not due yet: the mark is refused (a renewal that moved the deadline wins).
        assert!(!db.mark_timed_out(&r.id, 20_999).await.unwrap());
        assert!(db.mark_timed_out(&r.id, 21_000).await.unwrap());
        assert!(!db.mark_timed_out(&r.id, 22_000).await.unwrap(), "once");
        let got = db.sandbox(&a, &r.id).await.unwrap().unwrap();
        assert_eq!(got.timed_out_at_ms, Some(21_000));

        // Running again: a new deadline from the stored duration, no longer timed out.
        assert!(db.renew_timeout(&r.id, 50_000).await.unwrap());
        let got = db.sandbox(&a, &r.id).await.unwrap().unwrap();
        assert_eq!((got.expires_at_ms, got.timed_out_at_ms), (70_000, None));

        // `PUT /timeout` stores the duration the next renewal uses.
        assert!(db.mark_timed_out(&r.id, 80_000).await.unwrap());
        assert!(db.set_timeout(&r.id, 5, 90_000).await.unwrap());
        let got = db.sandbox(&a, &r.id).await.unwrap().unwrap();
        assert_eq!(
            (got.expires_at_ms, got.timeout_secs, got.timed_out_at_ms),
            (95_000, 5, None)
        );
        assert!(db.renew_timeout(&r.id, 100_000).await.unwrap());
        assert_eq!(
            db.sandbox(&a, &r.id).await.unwrap().unwrap().expires_at_ms,
            105_000
        );
        // A wake's renewal lasts at least its floor, and the stored duration is kept.
        assert!(db.renew_timeout_at_least(&r.id, 100_000, 60).await.unwrap());
        let got = db.sandbox(&a, &r.id).await.unwrap().unwrap();
        assert_eq!((got.expires_at_ms, got.timeout_secs), (160_000, 5));
        assert!(db.renew_timeout_at_least(&r.id, 100_000, 1).await.unwrap());
        let got = db.sandbox(&a, &r.id).await.unwrap().unwrap();
        assert_eq!(got.expires_at_ms, 105_000);
        // Expiring now moves the deadline and keeps the duration for the next renewal.
        assert!(db.expire_now(&r.id, 101_000).await.unwrap());
        let got = db.sandbox(&a, &r.id).await.unwrap().unwrap();
        assert_eq!(
            (got.expires_at_ms, got.timeout_secs, got.timed_out_at_ms),
            (101_000, 5, None)
        );
        assert!(db.renew_timeout(&r.id, 100_000).await.unwrap());
        assert!(db.mark_timed_out(&r.id, 105_000).await.unwrap());
        let before = db.sandbox(&a, &r.id).await.unwrap().unwrap();

        // All of it is in the database, not in this process.
        let again = t.reopen().await;
        assert_eq!(
            again.sandbox(&a, &r.id).await.unwrap().unwrap(),
            before,
            "{}",
            t.label
        );
        assert_eq!(
            (
                before.on_timeout,
                before.auto_resume,
                before.timed_out_at_ms
            ),
            (TimeoutAction::Pause, true, Some(105_000))
        );
    }
}

#[tokio::test]
async fn rows_from_before_timeout_actions_keep_their_timeout() {
    use space_control::db::migrations::{CREATE_MIGRATIONS_TABLE, MIGRATIONS};
    for empty in common::empty_dbs().await {
        // The schema as it was before migration 4, with one sandbox of a 90 s timeout.
        let mut setup = vec![CREATE_MIGRATIONS_TABLE.to_owned()];
        for m in MIGRATIONS.iter().filter(|m| m.version < 4) {
            setup.extend(m.statements.iter().map(|s| s.to_string()));
            setup.push(format!(
                "INSERT INTO schema_migrations (version, description, applied_at_ms) VALUES ({}, 'old', 0)",
                m.version
            ));
        }
        let tenant = TenantId::generate();
        let id = SandboxId::generate();
        setup.push(format!(
            "INSERT INTO tenants (id, name, created_at_ms) VALUES ('{tenant}', 'old', 0)"
        ));
        setup.push(format!(
            "INSERT INTO sandboxes (id, tenant_id, node, template, template_digest, spec, labels, desired_state, created_at_ms, expires_at_ms) \
             VALUES ('{id}', '{tenant}', 'local', 'base', 'd', '{{\"resources\":{{\"vcpus\":1,\"memory_mib\":512,\"disk_mib\":4096}},\"env_keys\":[]}}', '{{}}', 'running', 1000, 91000)"
        ));
        for sql in &setup {
            common::run_admin(&empty.url, sql).await;
        }
        let db = space_control::db::Db::connect(&empty.url).await.unwrap();
        let got = db.sandbox(&tenant, &id).await.unwrap().unwrap();
        assert_eq!(
            (
                got.timeout_secs,
                got.on_timeout,
                got.auto_resume,
                got.timed_out_at_ms
            ),
            (90, TimeoutAction::Delete, false, None),
            "{}",
            empty.label
        );
    }
}

#[tokio::test]
async fn bootstrap_creates_one_key_once() {
    for t in common::test_dbs().await {
        let dir = tempfile::tempdir().unwrap();
        let key = bootstrap(&t.db, dir.path())
            .await
            .unwrap()
            .expect("first start creates a key");
        let path = api_key_path(dir.path());
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), key);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let tenant = t.db.authenticate(&key).await.unwrap().unwrap();
        assert_eq!(tenant.name, "default");
        assert!(
            bootstrap(&t.db, dir.path()).await.unwrap().is_none(),
            "{}",
            t.label
        );
    }
}

#[tokio::test]
async fn concurrent_writers_do_not_fail() {
    // SQLite has one writer at a time: busy_timeout must make writers wait, not fail.
    for t in common::test_dbs().await {
        let a = t.db.create_tenant("acme").await.unwrap().id;
        let mut tasks = Vec::new();
        for i in 0..32 {
            let db = t.db.clone();
            let a = a.clone();
            tasks.push(tokio::spawn(async move {
                let r = row(&a, i, &[]);
                db.insert_sandbox(&r).await.unwrap();
                db.mark_deleted(&r.id, i).await.unwrap()
            }));
        }
        for task in tasks {
            assert!(task.await.unwrap());
        }
        assert_eq!(
            t.db.sandboxes(&a, SandboxFilter::Deleted)
                .await
                .unwrap()
                .len(),
            32
        );
    }
}

/// The action log on every backend: appends racing on one tenant's chain all land, in one
/// unbroken chain; an edited, removed or reordered record is caught by the verifier; pruning
/// leaves an anchor the rest verifies from; tenants' chains are apart.
#[tokio::test]
async fn the_action_log_is_one_verifiable_chain_per_tenant() {
    use space_control::db::{AuditQuery, NewAuditRecord};
    use space_core::audit::{verify, ChainError};
    for t in common::test_dbs().await {
        let a = t.db.create_tenant("audit-a").await.unwrap();
        let b = t.db.create_tenant("audit-b").await.unwrap();
        let appends = (0..24).map(|i| {
            let db = t.db.clone();
            let tenant = if i % 3 == 0 {
                b.id.clone()
            } else {
                a.id.clone()
            };
            tokio::spawn(async move {
                let target = format!("/v1/sandboxes/sbx-{i}");
                db.append_audit(&NewAuditRecord {
                    tenant: &tenant,
                    ts_ms: 1_000 + i,
                    api_key_id: Some("key-1"),
                    action: "POST /v1/sandboxes/{id}/pause",
                    target: &target,
                    outcome: "ok",
                    status: 200,
                })
                .await
            })
        });
        for r in futures::future::join_all(appends).await {
            r.unwrap().unwrap_or_else(|e| panic!("{}: {e}", t.label));
        }
        let all = AuditQuery {
            limit: 1000,
            ..Default::default()
        };
        let records = t.db.audit_records(&a.id, &all).await.unwrap();
        assert_eq!(records.len(), 16, "{}", t.label);
        assert_eq!(verify(a.id.as_str(), None, &records), Ok(16), "{}", t.label);
        let theirs = t.db.audit_records(&b.id, &all).await.unwrap();
        assert_eq!(verify(b.id.as_str(), None, &theirs), Ok(8), "{}", t.label);

        // Filters and paging.
        let page =
            t.db.audit_records(
                &a.id,
                &AuditQuery {
                    after_seq: Some(4),
                    limit: 5,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            page.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![5, 6, 7, 8, 9]
        );
        let one =
            t.db.audit_records(
                &a.id,
                &AuditQuery {
                    target_prefix: Some("/v1/sandboxes/sbx-1".into()),
                    limit: 100,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(
            !one.is_empty()
                && one
                    .iter()
                    .all(|r| r.target.starts_with("/v1/sandboxes/sbx-1"))
        );

        // Tampering straight in the database is caught.
        let mut edited = records.clone();
        edited[3].outcome = "forbidden".into();
        assert_eq!(
            verify(a.id.as_str(), None, &edited),
            Err(ChainError::Altered { seq: 4 })
        );
        let mut cut = records.clone();
        cut.remove(7);
        assert!(matches!(
            verify(a.id.as_str(), None, &cut),
            Err(ChainError::Gap { .. })
        ));

        // Pruning what is older than record 6's time leaves an anchor at the last removed.
        let cutoff = records[5].ts_ms;
        let removed = t.db.prune_audit(cutoff).await.unwrap();
        assert!(removed > 0, "{}", t.label);
        let anchor = t.db.audit_anchor(&a.id).await.unwrap().expect("anchor");
        let kept = t.db.audit_records(&a.id, &all).await.unwrap();
        assert_eq!(kept.first().map(|r| r.seq), Some(anchor.seq + 1));
        assert_eq!(
            verify(a.id.as_str(), Some(&anchor), &kept),
            Ok(kept.len() as u64),
            "{}",
            t.label
        );
        // Appending after a prune continues the chain.
        t.db.append_audit(&NewAuditRecord {
            tenant: &a.id,
            ts_ms: 9_999,
            api_key_id: None,
            action: "api_key.revoke",
            target: "key-1",
            outcome: "ok",
            status: 0,
        })
        .await
        .unwrap();
        let kept = t.db.audit_records(&a.id, &all).await.unwrap();
        assert_eq!(
            verify(a.id.as_str(), Some(&anchor), &kept),
            Ok(kept.len() as u64)
        );
    }
}

#[tokio::test]
async fn join_tokens_are_spent_once_and_nodes_are_fenced_by_generation() {
    use space_control::db::{JoinTokenError, MembershipError, NewNode, NodeLiveness, RemoveNode};
    use space_core::{NodeCapacity, SandboxState};
    use space_node_proto::NodeStatus;
    let status = NodeStatus {
        capacity: NodeCapacity {
            vcpus: 4,
            memory_mib: 4096,
            disk_mib: 10_000,
        },
        used: NodeCapacity {
            vcpus: 0,
            memory_mib: 0,
            disk_mib: 0,
        },
        sandboxes: 0,
        memory_images: Default::default(),
        templates: Default::default(),
        templates_fetched: 0,
        pool_ready: Default::default(),
        credentials_revision: 0,
    };
    for t in common::test_dbs().await {
        let (db, label) = (&t.db, t.label);
        let far = space_control::db::now_ms() + 60_000;
        db.create_join_token("t1", "hash1", far).await.unwrap();
        db.create_join_token("t2", "hash2", 1).await.unwrap();
        let n1 = NewNode {
            name: "n1",
            address: "10.0.0.1:7443",
            cert_fingerprint: "sha256:c1",
        };
        // Wrong secret and unknown id read the same; an expired token; spent once only,
        // even by two joins at once; a refused join records nothing.
        assert_eq!(
            db.join_node("t1", "nope", &n1).await.unwrap(),
            Err(JoinTokenError::Invalid),
            "{label}"
        );
        assert_eq!(
            db.join_node("zz", "hash1", &n1).await.unwrap(),
            Err(JoinTokenError::Invalid)
        );
        assert_eq!(
            db.join_node("t2", "hash2", &n1).await.unwrap(),
            Err(JoinTokenError::Expired)
        );
        assert!(db.node("n1").await.unwrap().is_none());
        let (a, b) = tokio::join!(
            db.join_node("t1", "hash1", &n1),
            db.join_node("t1", "hash1", &n1)
        );
        let outcomes = [a.unwrap(), b.unwrap()];
        assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 1, "{label}");
        assert!(outcomes.contains(&Err(JoinTokenError::Used)));
        let listed = db.join_tokens().await.unwrap();
        assert!(listed.iter().any(|t| t.id == "t1" && t.used.is_some()));

        // A node joins at generation 1 and heartbeats; sandboxes not placed on it are left.
        let row_n1 = db.node("n1").await.unwrap().unwrap();
        assert_eq!(
            (row_n1.generation, row_n1.liveness, row_n1.cordoned),
            (1, NodeLiveness::Ready, false)
        );
        let tenant = db.create_tenant("acme").await.unwrap();
        let mut mine = row(&tenant.id, 1, &[]);
        mine.node = "n1".into();
        let mut theirs = row(&tenant.id, 2, &[]);
        theirs.node = "n2".into();
        db.insert_sandbox(&mine).await.unwrap();
        db.insert_sandbox(&theirs).await.unwrap();
        let claims = [
            (mine.id.clone(), SandboxState::Running),
            (theirs.id.clone(), SandboxState::Paused),
        ];
        let not_yours = db
            .node_heartbeat("n1", 1, "sha256:c1", &status, &claims)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(not_yours, vec![theirs.id.clone()], "{label}");
        assert_eq!(
            db.node("n1").await.unwrap().unwrap().status,
            Some(status.clone())
        );
        // Another certificate, an unknown node, a wrong generation: not counted.
        assert_eq!(
            db.node_heartbeat("n1", 1, "sha256:other", &status, &[])
                .await
                .unwrap(),
            Err(MembershipError::StaleCertificate("n1".into()))
        );
        assert_eq!(
            db.node_heartbeat("n9", 1, "sha256:c1", &status, &[])
                .await
                .unwrap(),
            Err(MembershipError::UnknownNode("n9".into()))
        );
        assert!(matches!(
            db.node_heartbeat("n1", 7, "sha256:c1", &status, &[])
                .await
                .unwrap(),
            Err(MembershipError::Fenced { current: 1, .. })
        ));

        // Declared lost once (a second sweep finds nothing), generation bumped: its
        // heartbeats are fenced until it rejoins, and a rejoin is finished once.
        assert_eq!(
            db.mark_lost_nodes(far).await.unwrap(),
            vec!["n1".to_owned()]
        );
        assert!(db.mark_lost_nodes(far).await.unwrap().is_empty());
        let lost = db.node("n1").await.unwrap().unwrap();
        assert_eq!((lost.liveness, lost.generation), (NodeLiveness::Lost, 2));
        assert!(matches!(
            db.node_heartbeat("n1", 1, "sha256:c1", &status, &[])
                .await
                .unwrap(),
            Err(MembershipError::Fenced {
                presented: 1,
                current: 2,
                ..
            })
        ));
        assert!(matches!(
            db.check_rejoin("n1", 1, "sha256:other").await.unwrap(),
            Err(MembershipError::StaleCertificate(_))
        ));
        let back = db
            .check_rejoin("n1", 1, "sha256:c1")
            .await
            .unwrap()
            .unwrap();
        assert!(db.finish_rejoin("n1", back.generation).await.unwrap());
        assert!(!db.finish_rejoin("n1", back.generation).await.unwrap());
        assert!(db
            .node_heartbeat("n1", 2, "sha256:c1", &status, &[])
            .await
            .unwrap()
            .is_ok());
        // Ready again: nothing to rejoin.
        assert!(db
            .check_rejoin("n1", 2, "sha256:c1")
            .await
            .unwrap()
            .is_err());

        // Joining again (a new token) replaces the certificate, fences the old generation.
        db.create_join_token("t3", "hash3", far).await.unwrap();
        let again = db
            .join_node(
                "t3",
                "hash3",
                &NewNode {
                    cert_fingerprint: "sha256:c2",
                    ..n1.clone()
                },
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.generation, 3);
        assert!(db
            .node_heartbeat("n1", 2, "sha256:c1", &status, &[])
            .await
            .unwrap()
            .is_err());

        // Cordon; removal only once it holds nothing.
        assert!(db.set_node_cordoned("n1", true).await.unwrap());
        assert!(db.node("n1").await.unwrap().unwrap().cordoned);
        assert!(!db.set_node_cordoned("n9", true).await.unwrap());
        assert_eq!(
            db.remove_node("n1").await.unwrap(),
            RemoveNode::HoldsSandboxes(1)
        );
        db.mark_deleted(&mine.id, 10).await.unwrap();
        assert_eq!(db.remove_node("n1").await.unwrap(), RemoveNode::Removed);
        assert_eq!(db.remove_node("n1").await.unwrap(), RemoveNode::NotFound);
    }
}

#[tokio::test]
async fn replicas_heartbeat_die_and_are_forgotten_with_what_they_held() {
    use space_control::db::{IdempotencyState, NewIdempotencyKey, QuotaHoldKind, ReplicaId};
    use std::time::Duration;
    for t in common::test_dbs().await {
        let db = &t.db;
        let tenant = db.create_tenant("acme").await.unwrap().id;
        let (a, b) = (ReplicaId::generate(), ReplicaId::generate());
        db.register_replica(&a, "host-a").await.unwrap();
        db.register_replica(&b, "host-b").await.unwrap();
        assert!(db.heartbeat_replica(&a).await.unwrap(), "{}", t.label);
        let live = db.live_replicas(Duration::from_secs(60)).await.unwrap();
        assert!(live.contains(&a) && live.contains(&b), "{}", t.label);
        // What b holds: snapshot bytes, a diff, an unfinished idempotent request.
        db.hold_quota(&tenant, QuotaHoldKind::SnapshotBytes, 300, &b)
            .await
            .unwrap();
        let diff = db
            .hold_quota(&tenant, QuotaHoldKind::Diff, 1, &b)
            .await
            .unwrap();
        db.hold_quota(&tenant, QuotaHoldKind::SnapshotBytes, 200, &a)
            .await
            .unwrap();
        assert_eq!(
            db.quota_held(&tenant, QuotaHoldKind::SnapshotBytes)
                .await
                .unwrap(),
            (500, 2),
            "{}",
            t.label
        );
        for (key, replica) in [("k-b", &b), ("k-a", &a)] {
            let claimed = db
                .claim_idempotency_key(&NewIdempotencyKey {
                    tenant_id: &tenant,
                    key,
                    token: key,
                    method: "POST",
                    path: "/v1/sandboxes",
                    fingerprint: "f",
                    now_ms: space_control::db::now_ms(),
                    replica,
                })
                .await
                .unwrap();
            assert!(claimed);
        }
        let row = db.idempotency_key(&tenant, "k-b").await.unwrap().unwrap();
        assert_eq!(row.replica.as_ref(), Some(&b));
        assert_eq!(row.state, IdempotencyState::InProgress);
        // Nobody is dead yet.
        assert!(db
            .forget_dead_replicas(Duration::from_secs(60))
            .await
            .unwrap()
            .is_empty());
        // b goes silent; a heartbeats. With a timeout shorter than b's silence, b is dead.
        tokio::time::sleep(Duration::from_millis(300)).await;
        db.heartbeat_replica(&a).await.unwrap();
        assert!(!db
            .replica_alive(&b, Duration::from_millis(200))
            .await
            .unwrap());
        assert!(db
            .replica_alive(&a, Duration::from_millis(200))
            .await
            .unwrap());
        let forgotten = db
            .forget_dead_replicas(Duration::from_millis(200))
            .await
            .unwrap();
        assert_eq!(forgotten, vec![b.clone()], "{}", t.label);
        assert_eq!(
            db.quota_held(&tenant, QuotaHoldKind::SnapshotBytes)
                .await
                .unwrap(),
            (200, 1),
            "b's holds went with it ({})",
            t.label
        );
        assert_eq!(
            db.quota_held(&tenant, QuotaHoldKind::Diff).await.unwrap(),
            (0, 0)
        );
        db.release_quota_hold(&diff).await.unwrap(); // already gone: no error
        assert!(db.idempotency_key(&tenant, "k-b").await.unwrap().is_none());
        assert!(db.idempotency_key(&tenant, "k-a").await.unwrap().is_some());
        // b comes back: its heartbeat finds no row, and it registers again.
        assert!(!db.heartbeat_replica(&b).await.unwrap());
        db.register_replica(&b, "host-b").await.unwrap();
        assert!(db.heartbeat_replica(&b).await.unwrap());
        // A graceful leave removes a replica and what it holds at once.
        db.remove_replica(&a).await.unwrap();
        assert_eq!(
            db.quota_held(&tenant, QuotaHoldKind::SnapshotBytes)
                .await
                .unwrap(),
            (0, 0)
        );
        let ids: Vec<ReplicaId> = db
            .replicas()
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, vec![b.clone()], "{}", t.label);
    }
}

#[tokio::test]
async fn request_buckets_are_shared_and_refill_at_their_rate() {
    use space_control::db::RateDecision;
    for t in common::test_dbs().await {
        // Two handles on one database: two replicas.
        let other = t.reopen().await;
        let key = format!("key-{}", t.label);
        // Burst of 3 at 2/s, taken alternately through both.
        for i in 0..3 {
            let db = if i % 2 == 0 { &t.db } else { &other };
            assert_eq!(
                db.take_request(&key, 2, 3).await.unwrap(),
                RateDecision::Allowed,
                "{} request {i}",
                t.label
            );
        }
        let RateDecision::Limited(wait) = other.take_request(&key, 2, 3).await.unwrap() else {
            panic!(
                "the fourth request of a burst of three is limited ({})",
                t.label
            );
        };
        assert!(
            wait <= std::time::Duration::from_millis(500),
            "{wait:?} ({})",
            t.label
        );
        tokio::time::sleep(wait + std::time::Duration::from_millis(50)).await;
        assert_eq!(
            t.db.take_request(&key, 2, 3).await.unwrap(),
            RateDecision::Allowed,
            "refilled ({})",
            t.label
        );
        // Another key has a bucket of its own.
        assert_eq!(
            other.take_request("another", 2, 3).await.unwrap(),
            RateDecision::Allowed
        );
        assert_eq!(
            t.db.prune_rate_buckets(std::time::Duration::from_secs(3600))
                .await
                .unwrap(),
            0
        );
        other.close().await;
    }
}

#[tokio::test]
async fn admission_and_leader_locks_exclude_other_replicas() {
    use std::time::Duration;
    for t in common::test_dbs().await {
        let other = t.reopen().await;
        let tenant = TenantId::generate();
        let held = t.db.admission_lock(&tenant).await.unwrap();
        let contender = {
            let (other, tenant) = (other.clone(), tenant.clone());
            tokio::spawn(async move {
                let _lock = other.admission_lock(&tenant).await.unwrap();
                tokio::time::Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !contender.is_finished(),
            "{}: the second admission waits",
            t.label
        );
        let released = tokio::time::Instant::now();
        drop(held);
        let got = tokio::time::timeout(Duration::from_secs(10), contender)
            .await
            .expect("the waiter gets the lock")
            .unwrap();
        assert!(got >= released);
        // Another tenant's admission does not wait.
        let a = t.db.admission_lock(&tenant).await.unwrap();
        let b = tokio::time::timeout(
            Duration::from_secs(5),
            other.admission_lock(&TenantId::generate()),
        )
        .await
        .expect("another tenant's lock is free")
        .unwrap();
        drop((a, b));
        if t.label == "postgres" {
            // One leader at a time; the lead passes on when its holder lets go.
            let mut lead = t.db.try_lead().await.unwrap().expect("first leads");
            assert!(other.try_lead().await.unwrap().is_none());
            assert!(lead.still_held().await);
            lead.release().await;
            let next = other.try_lead().await.unwrap().expect("the lead passed on");
            next.release().await;
        }
        other.close().await;
    }
}

#[tokio::test]
async fn the_credential_catalog_keeps_one_name_per_scope_and_counts_changes() {
    use space_control::db::StoredCredential;
    use space_secrets::{Credential, CredentialId, Scope};
    for t in common::test_dbs().await {
        let db = &t.db;
        let tenant = db.create_tenant("acme").await.unwrap().id;
        let other = db.create_tenant("other").await.unwrap().id;
        let make = |tenant: &TenantId, name: &str| {
            StoredCredential {
            credential: Credential {
                id: CredentialId::generate(),
                name: name.parse().unwrap(),
                scope: Scope::Tenant {
                    tenant: tenant.clone(),
                },
                rule: serde_json::from_value(serde_json::json!({
                    "hosts": ["api.example.com"],
                    "injection": {"kind": "header", "name": "Authorization", "template": "Bearer {}"},
                }))
                .unwrap(),
                created_at_ms: 1,
                expires_at_ms: None,
            },
            sealed_value: "c2VhbGVk".into(),
        }
        };
        assert_eq!(db.credential_revision().await.unwrap(), 0, "{}", t.label);
        let gh = make(&tenant, "github");
        assert_eq!(db.put_credential(&gh, false).await.unwrap(), 1);
        // The same name in the same scope is taken; in another tenant it is not.
        assert!(matches!(
            db.put_credential(&make(&tenant, "github"), false).await,
            Err(DbError::AlreadyExists(_))
        ));
        db.put_credential(&make(&other, "github"), false)
            .await
            .unwrap();
        // Replacing keeps the id; replacing one that is gone is not found.
        let mut renamed = gh.clone();
        renamed.credential.name = "gh".parse().unwrap();
        assert_eq!(db.put_credential(&renamed, true).await.unwrap(), 3);
        assert!(matches!(
            db.put_credential(&make(&tenant, "nope"), true).await,
            Err(DbError::NotFound(_))
        ));
        let mine = db.credentials_of(&tenant).await.unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].credential.name.as_str(), "gh");
        assert_eq!(db.count_credentials(&other).await.unwrap(), 1);
        // Another tenant's id is not found, not deleted.
        assert_eq!(
            db.delete_credential(&other, &gh.credential.id)
                .await
                .unwrap(),
            None
        );
        assert!(db
            .credential(&other, &gh.credential.id)
            .await
            .unwrap()
            .is_none());
        assert_eq!(
            db.delete_credential(&tenant, &gh.credential.id)
                .await
                .unwrap(),
            Some(4)
        );
        let (rev, all) = db.credential_catalog().await.unwrap();
        assert_eq!((rev, all.len()), (4, 1), "{}", t.label);
    }
}

/// A persistent snapshot in object storage: listed only once committed, only to its
/// tenant, never collected while it stands (whatever becomes of its sandbox), collected
/// once dropped.
#[tokio::test]
async fn stored_persistent_snapshots_stand_until_dropped() {
    use space_control::db::ReplicaId;
    use space_core::snapshot::{SnapshotKind, SnapshotTrigger};
    use space_core::{SnapshotId, SnapshotInfo};
    use space_node_proto::{SnapshotOrigin, StoredArtifact, StoredSettings, StoredSnapshot};
    for t in common::test_dbs().await {
        let db = &t.db;
        let a = db.create_tenant("keeper").await.unwrap().id;
        let b = db.create_tenant("other").await.unwrap().id;
        let sandbox = row(&a, 1000, &[]);
        db.insert_sandbox(&sandbox).await.unwrap();
        let replica = ReplicaId::from_stored("replica-1".into());
        let live = std::collections::HashSet::from([replica.clone()]);
        let snap = SnapshotId::generate();
        db.begin_stored_snapshot(&snap, &sandbox.id, &a, "node-a", &replica)
            .await
            .unwrap();
        assert!(
            db.stored_persistents(&a).await.unwrap().is_empty(),
            "uploading: not listed"
        );
        let manifest = StoredSnapshot {
            snapshot: snap.clone(),
            sandbox_id: sandbox.id.clone(),
            template: "base".into(),
            template_digest: "sha256:abc".into(),
            resources: Resources::default(),
            artifacts: vec![StoredArtifact {
                name: "disk.delta.zst".into(),
                key: format!("snapshots/{snap}/disk.delta.zst"),
                size: 10,
                sha256: "0".repeat(64),
                sealed: true,
            }],
            settings: StoredSettings::default(),
            memory_bytes: 0,
            disk_changed_blocks: 1,
            history: vec![],
        };
        let info = SnapshotInfo {
            id: snap.clone(),
            sandbox_id: sandbox.id.clone(),
            kind: SnapshotKind::Disk,
            trigger: SnapshotTrigger::Manual,
            created_at_ms: 1,
            exclusive_bytes: 0,
            total_bytes: 0,
            label: Some("keep".into()),
            persistent: true,
            stored: true,
        };
        let origin = SnapshotOrigin {
            sandbox_id: sandbox.id.clone(),
            tenant: Some(a.clone()),
            template: "base".into(),
            template_digest: "sha256:abc".into(),
            resources: Resources::default(),
            env_keys: vec!["TOKEN".into()],
            labels: BTreeMap::new(),
        };
        assert!(
            db.commit_stored_persistent(&manifest, &info, &origin)
                .await
                .unwrap(),
            "{}",
            t.label
        );
        assert!(
            !db.commit_stored_persistent(&manifest, &info, &origin)
                .await
                .unwrap(),
            "committed once"
        );
        let listed = db.stored_persistents(&a).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (&listed[0].info, &listed[0].origin, &listed[0].manifest),
            (&info, &origin, &manifest)
        );
        assert!(db.stored_persistents(&b).await.unwrap().is_empty());
        assert!(
            db.stored_persistent(&b, &snap).await.unwrap().is_none(),
            "another tenant's is none"
        );
        assert!(db.stored_persistent(&a, &snap).await.unwrap().is_some());

        // Its sandbox deleted: it stands.
        assert!(db.mark_deleted(&sandbox.id, 5000).await.unwrap());
        let collect = db.stored_snapshots_to_collect(&live, 10).await.unwrap();
        assert!(
            collect.iter().all(|s| s.id != snap),
            "{}: a standing one is never collected",
            t.label
        );

        assert!(
            !db.drop_stored_persistent(&b, &snap).await.unwrap(),
            "not another tenant's to drop"
        );
        assert!(db.drop_stored_persistent(&a, &snap).await.unwrap());
        assert!(!db.drop_stored_persistent(&a, &snap).await.unwrap());
        assert!(db.stored_persistents(&a).await.unwrap().is_empty());
        let collect = db.stored_snapshots_to_collect(&live, 10).await.unwrap();
        assert!(collect.iter().any(|s| s.id == snap), "dropped: collected");
        db.delete_stored_snapshot(&snap).await.unwrap();
        assert!(db.stored_snapshot(&snap).await.unwrap().is_none());
    }
}

/// Actions are recorded while other writes go on (on SQLite a read-then-write append is
/// refused at once when another writer commits in between): none is lost.
#[tokio::test]
async fn audit_appends_survive_concurrent_writers() {
    use space_control::db::NewAuditRecord;
    for t in common::test_dbs().await {
        let db = t.db.clone();
        let tenant = db.create_tenant("audited").await.unwrap().id;
        let writer = {
            let db = db.clone();
            tokio::spawn(async move {
                for i in 0..200 {
                    db.create_tenant(&format!("busy-{i}")).await.unwrap();
                }
            })
        };
        let appends: Vec<_> = (0..8)
            .map(|i| {
                let (db, tenant) = (db.clone(), tenant.clone());
                tokio::spawn(async move {
                    for j in 0..10 {
                        let target = format!("/v1/sandboxes/{i}-{j}");
                        db.append_audit(&NewAuditRecord {
                            tenant: &tenant,
                            ts_ms: 1,
                            api_key_id: None,
                            action: "POST /v1/sandboxes",
                            target: &target,
                            outcome: "ok",
                            status: 201,
                        })
                        .await
                        .expect("recorded");
                    }
                })
            })
            .collect();
        for a in appends {
            a.await.unwrap();
        }
        writer.await.unwrap();
        let recorded = db
            .audit_records(
                &tenant,
                &space_control::db::AuditQuery {
                    limit: 1000,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(recorded.len(), 80, "{}", t.label);
    }
}

#[tokio::test]
async fn customer_keys_rotate_and_their_data_keys_are_rewrapped_once() {
    use space_control::db::{CustomerKeyRemoval, DataKeyRow, StoredKeyVersion};
    for t in common::test_dbs().await {
        let db = &t.db;
        let tenant = db.create_tenant("byok").await.unwrap().id;
        let other = db.create_tenant("plain").await.unwrap().id;
        let version = |v: i64, key: &str| StoredKeyVersion {
            version: v,
            provider: "corp".into(),
            key_id: key.into(),
            sealed_access: format!("sealed-{v}"),
            created_at_ms: v,
        };
        assert!(
            db.customer_key(&tenant).await.unwrap().is_none(),
            "{}",
            t.label
        );
        db.insert_customer_key(&tenant, &version(1, "k1"))
            .await
            .unwrap();
        assert!(
            db.insert_customer_key(&tenant, &version(1, "again"))
                .await
                .is_err(),
            "{}",
            t.label
        );
        for (i, v) in [1, 1, 1].iter().enumerate() {
            db.insert_data_key(&DataKeyRow {
                id: format!("dk-{i}"),
                tenant: tenant.clone(),
                key_version: *v,
                wrapped: "d3JhcHBlZA==".into(),
                artifact: format!("credential crd-{i}"),
                created_at_ms: 1,
            })
            .await
            .unwrap();
        }
        // A rotation that lost the race is refused; the winner's version is current.
        assert!(db
            .add_customer_key_version(&tenant, 1, &version(2, "k2"))
            .await
            .unwrap());
        assert!(!db
            .add_customer_key_version(&tenant, 1, &version(2, "k3"))
            .await
            .unwrap());
        let key = db.customer_key(&tenant).await.unwrap().unwrap();
        assert_eq!(key.current_version, 2, "{}", t.label);
        assert_eq!(key.current().unwrap().key_id, "k2", "{}", t.label);
        assert_eq!(key.versions.len(), 2, "{}", t.label);
        // Re-wrapping: each row once, conditionally.
        let todo = db.data_keys_not_under(&tenant, 2, 10).await.unwrap();
        assert_eq!(todo.len(), 3, "{}", t.label);
        assert!(db.rewrap_data_key("dk-0", 1, 2, "bmV3").await.unwrap());
        assert!(!db.rewrap_data_key("dk-0", 1, 2, "bmV3").await.unwrap());
        assert_eq!(
            db.data_keys_not_under(&tenant, 2, 10).await.unwrap().len(),
            2
        );
        assert_eq!(
            db.data_key_counts(&tenant).await.unwrap(),
            vec![(1, 2), (2, 1)],
            "{}",
            t.label
        );
        assert_eq!(
            db.data_key(&tenant, "dk-0").await.unwrap().unwrap().wrapped,
            "bmV3"
        );
        // Another tenant sees none of it.
        assert!(
            db.data_key(&other, "dk-0").await.unwrap().is_none(),
            "{}",
            t.label
        );
        assert!(!db.delete_data_key(&other, "dk-1").await.unwrap());
        // Removal waits for the last data key.
        assert_eq!(
            db.remove_customer_key(&tenant).await.unwrap(),
            CustomerKeyRemoval::InUse(3)
        );
        for i in 0..3 {
            assert!(db
                .delete_data_key(&tenant, &format!("dk-{i}"))
                .await
                .unwrap());
        }
        assert_eq!(
            db.remove_customer_key(&tenant).await.unwrap(),
            CustomerKeyRemoval::Removed
        );
        assert_eq!(
            db.remove_customer_key(&tenant).await.unwrap(),
            CustomerKeyRemoval::NotFound
        );
    }
}
