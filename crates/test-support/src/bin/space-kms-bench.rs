//! Issue 17's key service figures: what one wrap, one unwrap and one check (a wrap and an
//! unwrap of a throwaway data key: what the gate of every start, resume and restore costs
//! once per check TTL) take at each kind of key service, against real ones — PyKMIP's KMIP
//! server over mutual TLS on loopback, a SoftHSM2 token through its PKCS#11 module, and the
//! built-in local service (`scripts/kms-test-servers` installs the first two).
//!
//! Run with `./scripts/bench-kms [samples]` (default 200). Prints percentiles; every figure
//! is measured.

use std::time::{Duration, Instant};

use space_kms::kmip::KmipService;
use space_kms::local::LocalService;
use space_kms::pkcs11::Pkcs11Service;
use space_kms::{check_round_trip, DataKey, KeyAccess, KeyCredentials, KeyService};
use test_support::bench::ms;
use test_support::kms::{KmipServer, SoftHsm, SOFTHSM_MODULE};
use test_support::percentile as pct;
use zeroize::Zeroizing;

fn report(name: &str, samples: &mut [f64]) {
    let (p50, p90, p99) = (pct(samples, 0.5), pct(samples, 0.9), pct(samples, 0.99));
    println!(
        "{name:<34} n={:<4} p50={p50:>8.2}ms p90={p90:>8.2}ms p99={p99:>8.2}ms",
        samples.len()
    );
}

async fn measure(kind: &str, service: &dyn KeyService, access: &KeyAccess, samples: usize) {
    let context = b"space/data-key/v1:tnt-bench:dk-bench";
    // One call first: a connection's or a module's first use is not what steady state costs.
    check_round_trip(service, access, context)
        .await
        .expect("warm-up");
    let (mut wrap, mut unwrap, mut check) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples {
        let dk = DataKey::generate();
        let t = Instant::now();
        let wrapped = service.wrap(access, &dk, context).await.expect("wrap");
        wrap.push(ms(t.elapsed()));
        let t = Instant::now();
        let back = service
            .unwrap(access, &wrapped, context)
            .await
            .expect("unwrap");
        unwrap.push(ms(t.elapsed()));
        assert_eq!(back.expose(), dk.expose());
        let t = Instant::now();
        check_round_trip(service, access, context)
            .await
            .expect("check");
        check.push(ms(t.elapsed()));
    }
    report(&format!("{kind}: wrap"), &mut wrap);
    report(&format!("{kind}: unwrap"), &mut unwrap);
    report(&format!("{kind}: check (wrap + unwrap)"), &mut check);
}

#[tokio::main]
async fn main() {
    let samples: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("samples: a number"))
        .unwrap_or(200);

    let dir = tempfile::tempdir().expect("temporary directory");
    let local = LocalService::new(dir.path().join("local-kms"));
    local.create("bench").expect("local key");
    let access = KeyAccess {
        key_id: "bench".into(),
        token: None,
        credentials: KeyCredentials::None,
    };
    measure("local", &local, &access, samples).await;

    let hsm = SoftHsm::create();
    hsm.init_token("bench", "1234");
    hsm.create_key("bench", "1234", "space-data");
    let pkcs11 = Pkcs11Service::new(SOFTHSM_MODULE.as_ref(), None).expect("SoftHSM2 module");
    let access = KeyAccess {
        key_id: "space-data".into(),
        token: Some("bench".into()),
        credentials: KeyCredentials::Pin {
            pin: Zeroizing::new("1234".into()),
        },
    };
    measure("pkcs11 (SoftHSM2)", &pkcs11, &access, samples).await;

    let server = KmipServer::start();
    let who = server.issue("bench", &[]);
    let key = server.create_key(&who);
    let kmip = KmipService::new(
        &server.address(),
        Some("localhost"),
        &server.ca_file,
        Some(Duration::from_secs(10)),
    )
    .expect("KMIP service");
    let access = KeyAccess {
        key_id: key,
        token: None,
        credentials: KeyCredentials::ClientCertificate {
            certificate_pem: who.certificate_pem.clone(),
            private_key_pem: Zeroizing::new(who.private_key_pem.clone()),
        },
    };
    measure("kmip (PyKMIP, mutual TLS)", &kmip, &access, samples).await;
}
