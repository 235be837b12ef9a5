//! Customer keys through the real API, against real key services (PyKMIP's KMIP server, a
//! SoftHSM2 token; `scripts/kms-test-servers`) and real sandboxes (issue 17): registration
//! proves the key; every create, resume, start and fork of the tenant passes the gate; once
//! the customer revokes or destroys its key, they fail with `403 key_unavailable` naming the
//! customer key within the check TTL, while its running sandbox keeps running and another
//! tenant is unaffected; rotation re-wraps data keys under the new version, and what was
//! wrapped before opens after; every check, wrap and unwrap is in the action log.

use std::time::{Duration, Instant};

use space_cli::client::{ClientError, SpaceClient};
use space_control::api::audit::AuditLogParams;
use space_control::service::customer_keys::{self, CustomerKeyRequest, RotateRequest};
use space_core::sandbox::{CreateSandboxRequest, CreateSnapshotRequest, ForkRequest};
use space_core::ErrorCode;
use space_core::{SandboxId, SnapshotKind};
use space_kms::{KeyCredentials, KmsConfig, ProviderConfig};
use space_node_proto::SnapshotRequest;
use test_support::kms::{Identity, KmipServer, SoftHsm, SOFTHSM_MODULE};
use test_support::{bearer_credential, TestServer, TEST_TEMPLATE};
use zeroize::Zeroizing;

/// How long a passed check is trusted in these tests.
const CHECK_TTL: Duration = Duration::from_secs(2);

fn key_services(kmip: &KmipServer, local_dir: &std::path::Path, hsm: bool) -> KmsConfig {
    let mut config = KmsConfig::local_only(local_dir);
    config.providers.insert(
        "corp".into(),
        ProviderConfig::Kmip {
            address: kmip.address(),
            server_name: Some("localhost".into()),
            ca_file: kmip.ca_file.clone(),
            timeout_ms: Some(10_000),
        },
    );
    if hsm {
        config.providers.insert(
            "hsm".into(),
            ProviderConfig::Pkcs11 {
                module: SOFTHSM_MODULE.into(),
                token: None,
            },
        );
    }
    config
}

fn kmip_key(key_id: &str, who: &Identity) -> CustomerKeyRequest {
    CustomerKeyRequest {
        provider: "corp".into(),
        key_id: Some(key_id.into()),
        token: None,
        credentials: KeyCredentials::ClientCertificate {
            certificate_pem: who.certificate_pem.clone(),
            private_key_pem: Zeroizing::new(who.private_key_pem.clone()),
        },
    }
}

/// A PyKMIP server (and SoftHSM2 with `hsm`), a local key service's directory, and a server
/// offering them with a passed check trusted for [`CHECK_TTL`].
async fn servers(hsm: bool) -> (KmipServer, tempfile::TempDir, TestServer) {
    let kmip = KmipServer::start();
    let local = tempfile::tempdir().unwrap();
    let config = key_services(&kmip, local.path(), hsm);
    let ts = TestServer::start_with(|c| {
        c.key_services = config;
        c.customer_key_check_ttl = CHECK_TTL;
    })
    .await;
    (kmip, local, ts)
}

fn is(e: ClientError, status: u16, code: ErrorCode) -> String {
    assert_eq!(e.status(), Some(status), "{e:?}");
    assert_eq!(e.code(), Some(code), "{e:?}");
    e.to_string()
}

async fn create(c: &SpaceClient) -> Result<space_core::SandboxId, ClientError> {
    c.create_sandbox(&CreateSandboxRequest {
        template: TEST_TEMPLATE.into(),
        ..Default::default()
    })
    .await
    .map(|s| s.id)
}

/// Creates until the gate refuses (at most the check TTL and a margin after `since`).
async fn refused_within_ttl(c: &SpaceClient, since: Instant) -> String {
    loop {
        match create(c).await {
            Err(e) => {
                let elapsed = since.elapsed();
                assert!(
                    elapsed < CHECK_TTL + Duration::from_secs(3),
                    "refused only after {elapsed:?}"
                );
                return is(e, 403, ErrorCode::KeyUnavailable);
            }
            Ok(id) => {
                assert!(
                    since.elapsed() < CHECK_TTL + Duration::from_secs(3),
                    "still created after the TTL"
                );
                c.delete_sandbox(&id).await.expect("delete");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revoked_customer_key_stops_its_tenant_and_no_other() {
    let (kmip, _local, ts) = servers(false).await;
    let a = ts.new_tenant_client("byok-a").await;
    let b = ts.new_tenant_client("byok-b").await;
    let alice = kmip.issue("byok-a", &[]);
    let key = kmip.create_key(&alice);

    let services = a.key_services().await.unwrap();
    let kinds: Vec<(String, String)> = services.into_iter().map(|s| (s.name, s.kind)).collect();
    assert!(kinds.contains(&("corp".into(), "kmip".into())), "{kinds:?}");
    assert!(
        kinds.contains(&("local".into(), "local".into())),
        "{kinds:?}"
    );

    // Bad registrations: each a clear error, nothing stored.
    is(
        a.customer_key().await.unwrap_err(),
        404,
        ErrorCode::NotFound,
    );
    let mut unknown = kmip_key(&key, &alice);
    unknown.provider = "nope".into();
    assert!(is(
        a.set_customer_key(&unknown).await.unwrap_err(),
        400,
        ErrorCode::InvalidRequest
    )
    .contains("corp"));
    let mut no_id = kmip_key(&key, &alice);
    no_id.key_id = None;
    is(
        a.set_customer_key(&no_id).await.unwrap_err(),
        400,
        ErrorCode::InvalidRequest,
    );
    let mut no_credentials = kmip_key(&key, &alice);
    no_credentials.credentials = KeyCredentials::None;
    is(
        a.set_customer_key(&no_credentials).await.unwrap_err(),
        400,
        ErrorCode::InvalidRequest,
    );
    let missing = is(
        a.set_customer_key(&kmip_key("4242", &alice))
            .await
            .unwrap_err(),
        403,
        ErrorCode::KeyUnavailable,
    );
    assert!(missing.contains("corp key \"4242\""), "{missing}");
    let mut local_named = kmip_key(&key, &alice);
    local_named.provider = "local".into();
    local_named.credentials = KeyCredentials::None;
    is(
        a.set_customer_key(&local_named).await.unwrap_err(),
        400,
        ErrorCode::InvalidRequest,
    );
    is(
        a.customer_key().await.unwrap_err(),
        404,
        ErrorCode::NotFound,
    );

    // A credential stored before the key is registered, one after, and another tenant's.
    let c1 = a
        .create_credential(&bearer_credential("before", "sk-byok-marker-0001"))
        .await
        .unwrap();
    // Registered: the view never shows the credentials.
    let view = a.set_customer_key(&kmip_key(&key, &alice)).await.unwrap();
    let c2 = a
        .create_credential(&bearer_credential("after", "sk-byok-marker-0002"))
        .await
        .unwrap();
    b.create_credential(&bearer_credential("other", "sk-byok-other-0001"))
        .await
        .unwrap();
    assert_eq!(view.current_version, 1);
    assert_eq!(view.versions[0].credentials, "client_certificate");
    let shown = serde_json::to_string(&a.customer_key().await.unwrap()).unwrap();
    assert!(
        !shown.contains("PRIVATE KEY") && !shown.contains("BEGIN"),
        "{shown}"
    );
    is(
        a.set_customer_key(&kmip_key(&key, &alice))
            .await
            .unwrap_err(),
        409,
        ErrorCode::Conflict,
    );

    // A data key wrapped under version 1 (what sealed artifacts will hold).
    let st = ts.server().state();
    let tenant_a = st.db.tenant_by_name("byok-a").await.unwrap().unwrap().id;
    let (dk_id, dk) = customer_keys::new_data_key(st, &tenant_a, "test:artifact")
        .await
        .unwrap()
        .expect("a data key");

    // Both of tenant a's values are sealed under data keys of its customer key: neither is
    // anywhere in the database's files (tenant b's, under the control plane's key, neither).
    for id in [&c1.id, &c2.id] {
        let id: space_secrets::CredentialId = id.parse().unwrap();
        let stored = st.db.credential(&tenant_a, &id).await.unwrap().unwrap();
        assert!(stored.sealed_value.starts_with("customer-key:dk-"), "{id}");
    }
    assert_eq!(
        found_outside_disks(&ts.data_dir, b"sk-byok-marker"),
        Vec::<std::path::PathBuf>::new()
    );
    assert_eq!(
        found_outside_disks(&ts.data_dir, b"sk-byok-other"),
        Vec::<std::path::PathBuf>::new()
    );
    let node = st.nodes.all().remove(0);
    space_control::service::credentials::sync_node(st, node.as_ref())
        .await
        .unwrap();
    assert_eq!(node.credentials().await.unwrap().len(), 3);

    let running = create(&a).await.expect("create under a usable key");
    let paused = create(&a).await.expect("create");
    a.pause_sandbox(&paused).await.expect("pause");
    let other = create(&b).await.expect("tenant b");

    // Rotation to a second key: the data key is re-wrapped, and opens to the same bytes.
    let key2 = kmip.create_key(&alice);
    let rotation = a
        .rotate_customer_key(&RotateRequest {
            key_id: Some(key2.clone()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rotation.customer_key.current_version, 2);
    // Three credential values' and the artifact key of the tenant's sandboxes.
    assert_eq!((rotation.rewrapped, rotation.not_rewrapped), (4, 0));
    assert_eq!(rotation.customer_key.versions[1].data_keys, 4);
    assert_eq!(rotation.customer_key.versions[0].data_keys, 0);
    // Version 1's key can go now: nothing depends on it.
    kmip.revoke_key(&alice, &key);
    let back = customer_keys::open_data_key(st, &tenant_a, &dk_id)
        .await
        .unwrap();
    assert_eq!(back.expose(), dk.expose());

    // The customer revokes the current key.
    kmip.revoke_key(&alice, &key2);
    let revoked_at = Instant::now();
    let message = refused_within_ttl(&a, revoked_at).await;
    assert!(
        message.contains("customer key version 2")
            && message.contains(&format!("corp key \"{key2}\"")),
        "{message}"
    );
    assert!(!message.contains("PRIVATE"), "{message}");
    // Resume, start and fork: refused too; the data key no longer opens.
    is(
        a.resume_sandbox(&paused).await.unwrap_err(),
        403,
        ErrorCode::KeyUnavailable,
    );
    is(
        a.fork(&running, &ForkRequest::default()).await.unwrap_err(),
        403,
        ErrorCode::KeyUnavailable,
    );
    // A refused fork leaves no child behind.
    let mut ids: Vec<SandboxId> = a
        .list_sandboxes(&[])
        .await
        .unwrap()
        .sandboxes
        .into_iter()
        .map(|s| s.id)
        .collect();
    ids.sort();
    let mut expected = vec![running.clone(), paused.clone()];
    expected.sort();
    assert_eq!(ids, expected);
    a.stop_sandbox(&paused).await.expect("stop needs no key");
    is(
        a.start_sandbox(&paused).await.unwrap_err(),
        403,
        ErrorCode::KeyUnavailable,
    );
    let e = customer_keys::open_data_key(st, &tenant_a, &dk_id)
        .await
        .unwrap_err();
    assert_eq!(e.body.code, ErrorCode::KeyUnavailable, "{e:?}");
    // The running sandbox keeps running and answers, but is no longer checkpointed: not
    // through the API, and not by the node itself once the watch has withdrawn the
    // tenant's artifact key from it (scheduled checkpoints).
    let out = test_support::shell(&a, &running, "echo still-here", false).await;
    assert!(out.contains("still-here"), "{out}");
    let checkpoint = CreateSnapshotRequest {
        kind: SnapshotKind::Checkpoint,
        ..Default::default()
    };
    is(
        a.create_snapshot(&running, &checkpoint).await.unwrap_err(),
        403,
        ErrorCode::KeyUnavailable,
    );
    let node_checkpoint = || {
        node.take_snapshot(
            &running,
            SnapshotRequest {
                kind: SnapshotKind::Checkpoint,
                label: None,
                persistent: None,
            },
        )
    };
    loop {
        match node_checkpoint().await {
            Ok(taken) => {
                assert!(
                    revoked_at.elapsed() < CHECK_TTL + Duration::from_secs(5),
                    "the node still checkpoints {:?} after the revocation",
                    revoked_at.elapsed()
                );
                node.delete_snapshot(&running, &taken.snapshot.id)
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::KeyUnavailable, "{e:?}");
                break;
            }
        }
    }
    // The leader's watch drops tenant a's credential values from the node (nobody can open
    // them now) within the check TTL, and keeps b's; a sync does the same.
    let held = || async {
        let mut names: Vec<String> = node
            .credentials()
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.name.as_str().to_owned())
            .collect();
        names.sort();
        names
    };
    let deadline = revoked_at + CHECK_TTL + Duration::from_secs(5);
    while held().await != vec!["other".to_owned()] {
        assert!(Instant::now() < deadline, "still held: {:?}", held().await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    space_control::service::credentials::sync_node(st, node.as_ref())
        .await
        .unwrap();
    assert_eq!(held().await, vec!["other".to_owned()]);
    // Another tenant is unaffected.
    let b2 = create(&b).await.expect("tenant b creates");
    b.fork(&other, &ForkRequest::default())
        .await
        .expect("tenant b forks");
    b.delete_sandbox(&b2).await.unwrap();

    // Every check, wrap, unwrap and refusal is in tenant a's action log.
    let log = a
        .audit_log(&AuditLogParams {
            limit: Some(1000),
            ..Default::default()
        })
        .await
        .unwrap();
    let has = |action: &str, outcome: &str| {
        log.records
            .iter()
            .any(|r| r.action == action && r.outcome == outcome)
    };
    assert!(has("customer_key.check", "ok"));
    assert!(has("customer_key.check", "key_unavailable"));
    assert!(has("customer_key.wrap", "ok"));
    assert!(has("customer_key.unwrap", "ok"));
    assert!(has("customer_key.unwrap", "key_unavailable"));
    let text = serde_json::to_string(&log.records).unwrap();
    assert!(
        !text.contains(&hex_of(dk.expose())),
        "a data key in the audit log"
    );

    // Removing the key is refused while a data key depends on it.
    is(
        a.remove_customer_key().await.unwrap_err(),
        409,
        ErrorCode::Conflict,
    );
    customer_keys::forget_data_key(st, &tenant_a, &dk_id)
        .await
        .unwrap();
    is(
        a.remove_customer_key().await.unwrap_err(),
        409,
        ErrorCode::Conflict,
    );
    a.delete_credential(c1.id.as_str()).await.unwrap();
    a.delete_credential(c2.id.as_str()).await.unwrap();
    // Its sandboxes' artifacts at rest are under the key too.
    is(
        a.remove_customer_key().await.unwrap_err(),
        409,
        ErrorCode::Conflict,
    );
    a.delete_sandbox(&running).await.unwrap();
    a.delete_sandbox(&paused).await.unwrap();
    // Once the node has let go of them (their snapshots with them).
    test_support::wait_until_ok(
        Duration::from_secs(30),
        "the customer key to be removable",
        || a.remove_customer_key(),
    )
    .await;
    create(&a)
        .await
        .expect("a tenant without a customer key is not gated");
    ts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_hsm_key_destroyed_in_softhsm_stops_its_tenant() {
    let hsm = SoftHsm::create();
    hsm.init_token("byok-hsm", "4321");
    hsm.create_key("byok-hsm", "4321", "space-data");
    let (_kmip, local, ts) = servers(true).await;
    let a = ts.new_tenant_client("byok-hsm").await;
    let request = |pin: &str| CustomerKeyRequest {
        provider: "hsm".into(),
        key_id: Some("space-data".into()),
        token: Some("byok-hsm".into()),
        credentials: KeyCredentials::Pin {
            pin: Zeroizing::new(pin.into()),
        },
    };
    is(
        a.set_customer_key(&request("0000")).await.unwrap_err(),
        403,
        ErrorCode::KeyUnavailable,
    );
    let mut no_token = request("4321");
    no_token.token = None;
    is(
        a.set_customer_key(&no_token).await.unwrap_err(),
        400,
        ErrorCode::InvalidRequest,
    );
    a.set_customer_key(&request("4321")).await.unwrap();
    let id = create(&a).await.expect("create");

    // The local key service: a tenant gets a key made for it, and it gates as well.
    let c = ts.new_tenant_client("byok-local").await;
    let view = c
        .set_customer_key(&CustomerKeyRequest {
            provider: "local".into(),
            key_id: None,
            token: None,
            credentials: KeyCredentials::None,
        })
        .await
        .unwrap();
    let local_key = view.versions[0].key_id.clone();
    assert!(local.path().join(format!("{local_key}.key")).exists());

    hsm.destroy_key("byok-hsm", "4321", "space-data");
    let message = refused_within_ttl(&a, Instant::now()).await;
    assert!(message.contains("hsm key \"space-data\""), "{message}");
    is(
        a.check_customer_key().await.unwrap_err(),
        403,
        ErrorCode::KeyUnavailable,
    );
    let out = test_support::shell(&a, &id, "echo alive", false).await;
    assert!(out.contains("alive"), "{out}");

    // The operator disables the local key: its tenant stops too.
    create(&c).await.expect("create under the local key");
    let st = ts.server().state();
    st.customer_keys
        .services()
        .local("local")
        .unwrap()
        .disable(&local_key)
        .unwrap();
    refused_within_ttl(&c, Instant::now()).await;
    ts.stop().await;
}

/// ROT13: what crosses the API instead of a marker, so the marker itself exists only where
/// the guest writes it (no request, log line or audit record holds it).
fn rot13(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            'a'..='z' => (((c as u8 - b'a') + 13) % 26 + b'a') as char,
            'A'..='Z' => (((c as u8 - b'A') + 13) % 26 + b'A') as char,
            other => other,
        })
        .collect()
}

/// Shell that turns ROT13 text back into its plaintext, in the guest.
fn unrot(s: &str) -> String {
    format!("$(echo {} | tr A-Za-z N-ZA-Mn-za-m)", rot13(s))
}

/// Files under `dir` that hold `needle`, but for sandboxes' live disks (see `is_disk`).
fn found_outside_disks(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut hits = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return hits;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            hits.extend(found_outside_disks(&path, needle));
        } else if kind.is_file() && !is_disk(&path) {
            if let Ok(bytes) = std::fs::read(&path) {
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    hits.push(path);
                }
            }
        }
    }
    hits
}

/// A sandbox's live disk (`sandboxes/<id>/disk.raw`): the one place a sandbox's data is
/// not sealed. A snapshot's disk is not one of these.
fn is_disk(path: &std::path::Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == space_storage::SANDBOX_DISK_FILE)
        && path
            .parent()
            .and_then(|p| p.parent())
            .and_then(|p| p.file_name())
            .is_some_and(|n| n == "sandboxes")
}

/// Every file named `name` under `dir`.
fn files_named(dir: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(files_named(&path, name));
        } else if entry.file_name() == name {
            found.push(path);
        }
    }
    found
}

/// The sealed disk of snapshot `snap`, once sealed: a snapshot's disk is sealed moments
/// after the call that took it returns, and its reflink removed at the same moment.
async fn sealed_disk_of(
    data_dir: &std::path::Path,
    snap: &space_core::SnapshotId,
) -> std::path::PathBuf {
    let disk = test_support::wait_until(
        Duration::from_secs(30),
        "the snapshot's disk to be sealed",
        || async {
            let found: Vec<_> = files_named(data_dir, space_storage::SNAPSHOT_SEALED_DISK_FILE)
                .into_iter()
                .filter(|p| p.to_string_lossy().contains(snap.as_str()))
                .collect();
            let reflink =
                |p: &std::path::Path| p.with_file_name(space_storage::SNAPSHOT_DISK_FILE).exists();
            match found.as_slice() {
                [one] if !reflink(one) => Some(one.clone()),
                _ => None,
            }
        },
    )
    .await;
    assert!(sealed(&disk), "{} is not sealed", disk.display());
    disk
}

fn sealed(path: &std::path::Path) -> bool {
    space_envelope::is_sealed_file(path).unwrap_or(false)
}

/// The marker the holder process keeps in memory only, asked for through a file.
async fn memory_marker(c: &SpaceClient, id: &space_core::SandboxId) -> String {
    test_support::shell(
        c,
        id,
        "rm -f /home/user/dumped; touch /home/user/dump",
        false,
    )
    .await;
    test_support::wait_until(Duration::from_secs(30), "the holder to answer", || async {
        let bytes = c
            .read_file_bytes(id, "/home/user/dumped", None)
            .await
            .ok()?;
        let text = String::from_utf8_lossy(&bytes).trim().to_owned();
        (!text.is_empty()).then_some(text)
    })
    .await
}

async fn disk_marker(c: &SpaceClient, id: &space_core::SandboxId) -> String {
    let bytes = c
        .read_file_bytes(id, "/home/user/marker.txt", None)
        .await
        .unwrap();
    String::from_utf8_lossy(&bytes).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenants_artifacts_at_rest_are_sealed_under_its_key() {
    let (kmip, _local, ts) = servers(false).await;
    let a = ts.new_tenant_client("seal-a").await;
    let alice = kmip.issue("seal-a", &[]);
    let key = kmip.create_key(&alice);
    a.set_customer_key(&kmip_key(&key, &alice)).await.unwrap();
    let unique = hex_of(&rand::random::<[u8; 8]>());
    let (in_memory, on_disk) = (
        format!("SPACE-MEMORY-MARKER-{unique}"),
        format!("SPACE-DISK-MARKER-{unique}"),
    );

    // A marker on the disk, and one only in a process's memory.
    // And one in its environment, which a persistent snapshot's source carries.
    let in_env = format!("SPACE-ENV-MARKER-{unique}");
    let id = a
        .create_sandbox(&CreateSandboxRequest {
            template: TEST_TEMPLATE.into(),
            env: [("SEALED_ENV".to_owned(), in_env.clone())].into(),
            ..Default::default()
        })
        .await
        .expect("create")
        .id;
    test_support::shell(
        &a,
        &id,
        &format!("echo {} > /home/user/marker.txt && sync", unrot(&on_disk)),
        false,
    )
    .await;
    a.start_process(
        &id,
        &space_core::process::ProcessSpec::shell(format!(
            "M={}; while true; do if [ -e /home/user/dump ]; then echo $M > /home/user/dumped; rm -f /home/user/dump; fi; sleep 0.2; done",
            unrot(&in_memory)
        )),
    )
    .await
    .unwrap();
    assert_eq!(memory_marker(&a, &id).await, in_memory);
    test_support::shell(&a, &id, "rm -f /home/user/dumped; sync", false).await;

    // A checkpoint: its saved state is sealed, and the memory marker is nowhere in the data
    // directory (store, database, logs); the disk marker only on disks.
    let checkpoint = CreateSnapshotRequest {
        kind: SnapshotKind::Checkpoint,
        ..Default::default()
    };
    let first = a.create_snapshot(&id, &checkpoint).await.unwrap().snapshot;
    let states = files_named(&ts.data_dir, space_storage::SNAPSHOT_STATE_FILE);
    assert!(!states.is_empty());
    for state in &states {
        if state.to_string_lossy().contains(first.id.as_str()) {
            assert!(sealed(state), "{} is not sealed", state.display());
        }
    }
    // Its disk too: a sealed delta, no reflink (sealed moments after the call returns).
    sealed_disk_of(&ts.data_dir, &first.id).await;
    let hits = found_outside_disks(&ts.data_dir, in_memory.as_bytes());
    assert!(hits.is_empty(), "the memory marker at rest in {hits:?}");
    let hits = found_outside_disks(&ts.data_dir, on_disk.as_bytes());
    assert!(hits.is_empty(), "the disk marker at rest in {hits:?}");

    // Rollback restores both.
    test_support::shell(&a, &id, "echo changed > /home/user/marker.txt", false).await;
    a.rollback(&id, &first.id).await.expect("rollback");
    assert_eq!(memory_marker(&a, &id).await, in_memory);
    assert_eq!(disk_marker(&a, &id).await, on_disk);
    test_support::shell(&a, &id, "rm -f /home/user/dumped; sync", false).await;

    // A damaged saved state is refused before the sandbox gives up its VM: a flipped byte,
    // a cut, another checkpoint's state in its place. The sandbox runs on meanwhile.
    let second = a.create_snapshot(&id, &checkpoint).await.unwrap().snapshot;
    let state_of = |snap: &space_core::SnapshotId| {
        files_named(&ts.data_dir, space_storage::SNAPSHOT_STATE_FILE)
            .into_iter()
            .find(|p| p.to_string_lossy().contains(snap.as_str()))
            .expect("the checkpoint's state")
    };
    let (state1, state2) = (state_of(&first.id), state_of(&second.id));
    let original = std::fs::read(&state2).unwrap();
    let mut flipped = original.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    let cut = original[..original.len() - 100].to_vec();
    let other = std::fs::read(&state1).unwrap();
    for (what, bytes) in [("flipped", &flipped), ("cut", &cut), ("swapped", &other)] {
        std::fs::write(&state2, bytes).unwrap();
        let message = is(
            a.rollback(&id, &second.id).await.unwrap_err(),
            502,
            ErrorCode::SnapshotCorrupt,
        );
        eprintln!("{what}: {message}");
        let out = test_support::shell(&a, &id, "echo running-on", false).await;
        assert!(out.contains("running-on"), "{what}: {out}");
    }
    std::fs::write(&state2, &original).unwrap();
    // The same for its sealed disk: refused before anything is given up, nothing left over.
    let disk2 = sealed_disk_of(&ts.data_dir, &second.id).await;
    let original_disk = std::fs::read(&disk2).unwrap();
    let mut flipped = original_disk.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    let cut = original_disk[..original_disk.len() - 100].to_vec();
    for (what, bytes) in [("flipped", &flipped), ("cut", &cut)] {
        std::fs::write(&disk2, bytes).unwrap();
        let message = is(
            a.rollback(&id, &second.id).await.unwrap_err(),
            502,
            ErrorCode::SnapshotCorrupt,
        );
        eprintln!("disk {what}: {message}");
        let out = test_support::shell(&a, &id, "echo running-on", false).await;
        assert!(out.contains("running-on"), "disk {what}: {out}");
    }
    std::fs::write(&disk2, &original_disk).unwrap();
    a.rollback(&id, &second.id)
        .await
        .expect("the intact state restores");
    assert_eq!(memory_marker(&a, &id).await, in_memory);
    test_support::shell(&a, &id, "rm -f /home/user/dumped; sync", false).await;

    // A disk snapshot is sealed the same way, and two sealed disks still diff.
    test_support::shell(&a, &id, "echo new > /home/user/added.txt && sync", false).await;
    let disk_snapshot = CreateSnapshotRequest {
        kind: SnapshotKind::Disk,
        ..Default::default()
    };
    let third = a
        .create_snapshot(&id, &disk_snapshot)
        .await
        .unwrap()
        .snapshot;
    sealed_disk_of(&ts.data_dir, &third.id).await;
    let diff = a
        .diff_snapshots(&id, &second.id, &third.id, None)
        .await
        .expect("diff of sealed disks");
    assert!(
        diff.changes
            .iter()
            .any(|c| c.path == "/home/user/added.txt"),
        "{diff:?}"
    );
    let hits = found_outside_disks(&ts.data_dir, on_disk.as_bytes());
    assert!(hits.is_empty(), "the disk marker at rest in {hits:?}");

    // A suspend: the node keeps nothing, what object storage holds is sealed, and neither
    // marker is anywhere in the data directory; the resume brings both back.
    a.suspend_sandbox(&id).await.expect("suspend");
    let objects = ts.data_dir.join("objects");
    let stored: Vec<_> = space_node_proto::snapshot::artifacts::ALL
        .iter()
        .flat_map(|name| files_named(&objects, name))
        .collect();
    assert!(stored.len() >= 4, "{stored:?}");
    for artifact in &stored {
        assert!(sealed(artifact), "{} is not sealed", artifact.display());
    }
    for marker in [&in_memory, &on_disk] {
        let hits = found_outside_disks(&ts.data_dir, marker.as_bytes());
        assert!(hits.is_empty(), "{marker} at rest in {hits:?}");
    }
    a.resume_sandbox(&id).await.expect("resume");
    assert_eq!(memory_marker(&a, &id).await, in_memory);
    assert_eq!(disk_marker(&a, &id).await, on_disk);
    // What the resume brought back is kept sealed; the disk it rebuilt is gone.
    for marker in [&in_memory, &on_disk] {
        let hits = found_outside_disks(&ts.data_dir, marker.as_bytes());
        assert!(
            hits.is_empty(),
            "{marker} at rest after the resume in {hits:?}"
        );
    }
    test_support::shell(&a, &id, "rm -f /home/user/dumped; sync", false).await;

    // A persistent checkpoint, a sandbox made from it, and a fork of three (its memory image
    // and every child on one rebuilt disk): the markers come back, and none is left at rest.
    let kept = a
        .create_snapshot(
            &id,
            &CreateSnapshotRequest {
                kind: SnapshotKind::Checkpoint,
                persistent: true,
                ..Default::default()
            },
        )
        .await
        .unwrap()
        .snapshot;
    sealed_disk_of(&ts.data_dir, &kept.id).await;
    let made = a
        .create_sandbox(&CreateSandboxRequest {
            snapshot: Some(kept.id.clone()),
            ..Default::default()
        })
        .await
        .expect("a sandbox from the sealed checkpoint")
        .id;
    assert_eq!(disk_marker(&a, &made).await, on_disk);
    assert_eq!(memory_marker(&a, &made).await, in_memory);
    // Its source's env is sealed at rest, and the new sandbox gets it.
    let sources = files_named(&ts.data_dir, space_storage::SNAPSHOT_SOURCE_FILE);
    assert!(!sources.is_empty());
    for source in &sources {
        let bytes = std::fs::read(source).unwrap();
        assert!(
            !bytes.windows(in_env.len()).any(|w| w == in_env.as_bytes()),
            "the env marker in {}",
            source.display()
        );
    }
    let out = test_support::shell(&a, &made, "echo \"env:$SEALED_ENV\"", false).await;
    assert!(out.contains(&format!("env:{in_env}")), "{out}");
    a.delete_sandbox(&made).await.unwrap();
    let forked = a
        .fork(
            &id,
            &ForkRequest {
                count: Some(3),
                ..Default::default()
            },
        )
        .await
        .expect("a fork of three");
    assert_eq!(forked.sandboxes.len(), 3);
    for child in &forked.sandboxes {
        assert_eq!(disk_marker(&a, &child.id).await, on_disk);
    }
    for child in &forked.sandboxes {
        a.delete_sandbox(&child.id).await.unwrap();
    }
    for marker in [&in_memory, &on_disk] {
        let hits = found_outside_disks(&ts.data_dir, marker.as_bytes());
        assert!(
            hits.is_empty(),
            "{marker} at rest after the fork in {hits:?}"
        );
    }

    // A crash between a snapshot's commit and its seal leaves its disk as a plaintext
    // reflink: the node seals it as soon as it holds the tenant's key again (here: the
    // restarted server's first loan, lent before the next operation).
    let fourth = a
        .create_snapshot(&id, &disk_snapshot)
        .await
        .unwrap()
        .snapshot;
    let fourth_sealed = sealed_disk_of(&ts.data_dir, &fourth.id).await;
    std::fs::remove_file(&fourth_sealed).unwrap();
    let live_disk = files_named(&ts.data_dir, space_storage::SANDBOX_DISK_FILE)
        .into_iter()
        .find(|p| p.parent().is_some_and(|d| d.ends_with(id.as_str())))
        .expect("the sandbox's live disk");
    let leftover = fourth_sealed.with_file_name(space_storage::SNAPSHOT_DISK_FILE);
    std::fs::copy(&live_disk, &leftover).unwrap();
    let (data_dir, config) = ts.stop_keep_vms().await;
    let ts = TestServer::start_on(data_dir, config).await;
    let a = ts.client_with_key(Some(a.api_key().unwrap()));
    a.create_snapshot(&id, &disk_snapshot)
        .await
        .expect("a snapshot after the restart");
    sealed_disk_of(&ts.data_dir, &fourth.id).await;
    let hits = found_outside_disks(&ts.data_dir, on_disk.as_bytes());
    assert!(
        hits.is_empty(),
        "the disk marker at rest after the restart in {hits:?}"
    );

    // The key service unreachable: a checkpoint fails clearly once this replica's copy of
    // the artifact key has expired, and nothing new is written at rest.
    let states_before = files_named(&ts.data_dir, space_storage::SNAPSHOT_STATE_FILE).len();
    drop(kmip);
    tokio::time::sleep(CHECK_TTL + Duration::from_millis(500)).await;
    is(
        a.create_snapshot(&id, &checkpoint).await.unwrap_err(),
        503,
        ErrorCode::KeyServiceUnavailable,
    );
    assert_eq!(
        files_named(&ts.data_dir, space_storage::SNAPSHOT_STATE_FILE).len(),
        states_before
    );
    let out = test_support::shell(&a, &id, "echo still-running", false).await;
    assert!(out.contains("still-running"), "{out}");
    ts.stop().await;
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
