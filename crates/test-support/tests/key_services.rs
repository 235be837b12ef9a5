//! The key services customer keys live in, against real ones: PyKMIP's KMIP server and a
//! SoftHSM2 token (installed by `scripts/kms-test-servers`), and the command protocol through
//! a helper standing in for a cloud KMS (none is reachable here). Each wraps and unwraps,
//! binds the context, refuses tampered wrapped keys, and says `KeyUnavailable` once the
//! customer revokes or destroys the key.

use std::time::Duration;

use space_kms::command::CommandService;
use space_kms::kmip::KmipService;
use space_kms::pkcs11::Pkcs11Service;
use space_kms::{
    check_round_trip, unwrap_data_key, DataKey, KeyAccess, KeyCredentials, KeyService, KmsError,
    Unavailable,
};
use test_support::kms::{KmipServer, SoftHsm, SOFTHSM_MODULE};
use zeroize::Zeroizing;

fn unavailable(r: Result<impl std::fmt::Debug, KmsError>) -> Unavailable {
    match r {
        Err(KmsError::KeyUnavailable { reason, .. }) => reason,
        other => panic!("expected KeyUnavailable, got {other:?}"),
    }
}

/// What every service must do with a usable key: round trips, context binding, tampering.
async fn wraps_and_binds(service: &dyn KeyService, access: &KeyAccess) -> Vec<u8> {
    check_round_trip(service, access, b"probe").await.unwrap();
    let dk = DataKey::generate();
    let context = b"tenant tnt-a / data key dk-1";
    let wrapped = service.wrap(access, &dk, context).await.unwrap();
    assert!(wrapped.len() >= 48, "{} bytes", wrapped.len());
    assert!(
        !wrapped
            .windows(8)
            .any(|w| dk.expose().windows(8).any(|k| k == w)),
        "the wrapped key contains the plaintext"
    );
    let back = unwrap_data_key(service, access, &wrapped, context)
        .await
        .unwrap();
    assert_eq!(back.expose(), dk.expose());
    // Two wraps of one key differ (fresh nonces).
    assert_ne!(service.wrap(access, &dk, context).await.unwrap(), wrapped);
    // Another context, a flipped byte, a cut: refused.
    let r = unwrap_data_key(service, access, &wrapped, b"tenant tnt-b / data key dk-1").await;
    assert!(matches!(r, Err(KmsError::WrappedKeyRejected)), "{r:?}");
    for i in [0, 13, wrapped.len() - 1] {
        let mut bad = wrapped.clone();
        bad[i] ^= 0x40;
        let r = unwrap_data_key(service, access, &bad, context).await;
        assert!(
            matches!(r, Err(KmsError::WrappedKeyRejected)),
            "byte {i}: {r:?}"
        );
    }
    assert!(
        unwrap_data_key(service, access, &wrapped[..wrapped.len() - 1], context)
            .await
            .is_err()
    );
    wrapped
}

#[tokio::test]
async fn kmip_wraps_on_the_server_and_a_revoked_or_destroyed_key_stops() {
    let server = KmipServer::start();
    let alice = server.issue("tenant-a", &[]);
    let key = server.create_key(&alice);
    let kmip = KmipService::new(
        &server.address(),
        Some("localhost"),
        &server.ca_file,
        Some(Duration::from_secs(10)),
    )
    .unwrap();
    let access = |id: &str, who: &test_support::kms::Identity| KeyAccess {
        key_id: id.into(),
        token: None,
        credentials: KeyCredentials::ClientCertificate {
            certificate_pem: who.certificate_pem.clone(),
            private_key_pem: Zeroizing::new(who.private_key_pem.clone()),
        },
    };
    let a = access(&key, &alice);
    let wrapped = wraps_and_binds(&kmip, &a).await;

    // Another identity of the same CA may not use tenant-a's key.
    let mallory = server.issue("tenant-m", &[]);
    let r = kmip
        .unwrap(
            &access(&key, &mallory),
            &wrapped,
            b"tenant tnt-a / data key dk-1",
        )
        .await;
    assert!(matches!(r, Err(KmsError::KeyUnavailable { .. })), "{r:?}");
    // No credentials, or the wrong kind: refused before dialling.
    let none = KeyAccess {
        credentials: KeyCredentials::None,
        ..a.clone()
    };
    assert!(matches!(
        kmip.wrap(&none, &DataKey::generate(), b"c").await,
        Err(KmsError::InvalidAccess(_))
    ));
    // A key that does not exist.
    assert_eq!(
        unavailable(
            kmip.wrap(&access("999", &alice), &DataKey::generate(), b"c")
                .await
        ),
        Unavailable::NotFound
    );

    // The customer revokes: neither wrap nor unwrap, at once (nothing is cached).
    server.revoke_key(&alice, &key);
    assert_eq!(
        unavailable(
            kmip.unwrap(&a, &wrapped, b"tenant tnt-a / data key dk-1")
                .await
        ),
        Unavailable::Revoked
    );
    assert_eq!(
        unavailable(kmip.wrap(&a, &DataKey::generate(), b"c").await),
        Unavailable::Revoked
    );

    // A second key, destroyed: not found.
    let key2 = server.create_key(&alice);
    let a2 = access(&key2, &alice);
    let wrapped2 = kmip.wrap(&a2, &DataKey::generate(), b"ctx").await.unwrap();
    server.destroy_key(&alice, &key2);
    assert_eq!(
        unavailable(kmip.unwrap(&a2, &wrapped2, b"ctx").await),
        Unavailable::NotFound
    );

    // The server gone: unreachable, which callers retry.
    let address = server.address();
    let ca = server.ca_file.clone();
    let keep_ca = tempfile::tempdir().unwrap();
    let ca_copy = keep_ca.path().join("ca.pem");
    std::fs::copy(&ca, &ca_copy).unwrap();
    drop(server);
    let kmip = KmipService::new(
        &address,
        Some("localhost"),
        &ca_copy,
        Some(Duration::from_secs(2)),
    )
    .unwrap();
    let r = kmip
        .unwrap(&a, &wrapped, b"tenant tnt-a / data key dk-1")
        .await;
    assert!(matches!(&r, Err(e) if e.is_retryable()), "{r:?}");
}

#[tokio::test]
async fn pkcs11_wraps_in_the_token_and_checks_each_calls_own_pin() {
    let hsm = SoftHsm::create();
    hsm.init_token("tenant-a", "1111");
    hsm.init_token("tenant-b", "2222");
    hsm.create_key("tenant-a", "1111", "space-data");
    hsm.create_key("tenant-b", "2222", "space-data");
    let service = Pkcs11Service::new(SOFTHSM_MODULE.as_ref(), None).unwrap();
    let access = |token: &str, pin: &str, label: &str| KeyAccess {
        key_id: label.into(),
        token: Some(token.into()),
        credentials: KeyCredentials::Pin {
            pin: Zeroizing::new(pin.into()),
        },
    };
    let a = access("tenant-a", "1111", "space-data");
    let wrapped = wraps_and_binds(&service, &a).await;

    // Right after a good login, a wrong PIN for the same token is still refused (every call
    // logs in with its own PIN), and so is tenant-b's key with tenant-a's PIN.
    assert_eq!(
        unavailable(
            service
                .unwrap(
                    &access("tenant-a", "0000", "space-data"),
                    &wrapped,
                    b"tenant tnt-a / data key dk-1"
                )
                .await
        ),
        Unavailable::NotPermitted
    );
    assert_eq!(
        unavailable(
            service
                .wrap(
                    &access("tenant-b", "1111", "space-data"),
                    &DataKey::generate(),
                    b"c"
                )
                .await
        ),
        Unavailable::NotPermitted
    );
    // Tenant-b's key does not open tenant-a's wrapped key.
    let r = unwrap_data_key(
        &service,
        &access("tenant-b", "2222", "space-data"),
        &wrapped,
        b"tenant tnt-a / data key dk-1",
    )
    .await;
    assert!(matches!(r, Err(KmsError::WrappedKeyRejected)), "{r:?}");
    assert_eq!(
        unavailable(
            service
                .wrap(
                    &access("no-such-token", "1", "k"),
                    &DataKey::generate(),
                    b"c"
                )
                .await
        ),
        Unavailable::NotFound
    );
    assert_eq!(
        unavailable(
            service
                .wrap(
                    &access("tenant-a", "1111", "other"),
                    &DataKey::generate(),
                    b"c"
                )
                .await
        ),
        Unavailable::NotFound
    );

    // The customer destroys the key: nothing it wrapped unwraps any more.
    hsm.destroy_key("tenant-a", "1111", "space-data");
    assert_eq!(
        unavailable(
            service
                .unwrap(&a, &wrapped, b"tenant tnt-a / data key dk-1")
                .await
        ),
        Unavailable::NotFound
    );
}

#[tokio::test]
async fn a_helper_command_wraps_and_its_verdicts_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("k1.key"), [7u8; 32]).unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("SPACE_TEST_PYKMIP")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo.join("target/kms/pykmip"))
        .join("bin/python");
    let service = CommandService::new(
        python,
        vec![
            repo.join("tests/kms/cloud_kms_helper.py")
                .display()
                .to_string(),
            dir.path().display().to_string(),
        ],
        Some(Duration::from_secs(20)),
    )
    .unwrap();
    let a = KeyAccess {
        key_id: "k1".into(),
        token: None,
        credentials: KeyCredentials::None,
    };
    let wrapped = wraps_and_binds(&service, &a).await;
    let missing = KeyAccess {
        key_id: "k2".into(),
        ..a.clone()
    };
    assert_eq!(
        unavailable(service.wrap(&missing, &DataKey::generate(), b"c").await),
        Unavailable::NotFound
    );
    std::fs::write(dir.path().join("down"), b"").unwrap();
    let r = service
        .unwrap(&a, &wrapped, b"tenant tnt-a / data key dk-1")
        .await;
    assert!(matches!(&r, Err(e) if e.is_retryable()), "{r:?}");
    std::fs::remove_file(dir.path().join("down")).unwrap();
    std::fs::write(dir.path().join("k1.revoked"), b"").unwrap();
    assert_eq!(
        unavailable(
            service
                .unwrap(&a, &wrapped, b"tenant tnt-a / data key dk-1")
                .await
        ),
        Unavailable::Revoked
    );
}
