//! The snapshot, fork and idleness routes against a real `spaced agent` on the development
//! channel: the daemon's own checks of host input, and what the development channel does
//! (it never freezes, renames or reseeds the machine it runs on, and has no workload
//! cgroup). The guest-side effects are tested on real VMs in `test-support/tests/guest_ops.rs`.

mod common;

use common::*;
use http::{Method, StatusCode};
use serde_json::json;
use space_core::process::ProcessSpec;
use space_guest_proto::{routes, Activity, GuestMetrics, IdentityRequest};

#[tokio::test]
async fn host_input_is_checked() {
    let agent = Agent::start();
    let c = agent.connect().await;
    for body in [
        json!({ "timeout_ms": 0 }),
        json!({ "timeout_ms": 30_001 }),
        json!({ "timeout_ms": -1 }),
        json!({ "timeout_ms": 10, "extra": true }),
        json!({}),
    ] {
        c.expect_error(
            Method::POST,
            routes::FS_FREEZE,
            full(body.to_string()),
            400,
            "invalid_request",
        )
        .await;
    }
    let good = IdentityRequest::new(&[1u8; 32], "sbx-x", 1_700_000_000_000);
    for bad in [
        IdentityRequest::new(&[1u8; 31], "sbx-x", 1),
        IdentityRequest::new(&[1u8; 513], "sbx-x", 1),
        IdentityRequest {
            entropy: "%%%%".repeat(20),
            ..good.clone()
        },
        IdentityRequest::new(&[1u8; 32], "bad host", 1),
        IdentityRequest::new(&[1u8; 32], "", 1),
        IdentityRequest::new(&[1u8; 32], "sbx-x", -5),
    ] {
        let msg = c
            .expect_error(
                Method::POST,
                routes::IDENTITY,
                full(serde_json::to_vec(&bad).unwrap()),
                400,
                "invalid_request",
            )
            .await;
        assert!(!msg.is_empty());
    }
    c.expect_error(
        Method::POST,
        routes::IDENTITY,
        full(vec![b' '; 2 << 20]),
        413,
        "payload_too_large",
    )
    .await;
}

#[tokio::test]
async fn development_channel_changes_nothing_and_counts_requests() {
    let agent = Agent::start();
    let c = agent.connect().await;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();

    let (s, a) = c.get::<Activity>(routes::ACTIVITY).await;
    assert_eq!(s, StatusCode::OK);

    // Housekeeping (freeze, thaw, identity, health, metrics): accepted, changes nothing
    // here, not counted.
    let (s, _, _) = c
        .call(
            Method::POST,
            routes::FS_FREEZE,
            full(json!({ "timeout_ms": 1000 }).to_string()),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = c.call(Method::POST, routes::FS_THAW, empty()).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let id = IdentityRequest::new(&[9u8; 64], "sbx-not-applied", 1);
    let (s, _, _) = c
        .call(
            Method::POST,
            routes::IDENTITY,
            full(serde_json::to_vec(&id).unwrap()),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        hostname
    );
    // No workload cgroup on the development channel.
    c.expect_error(
        Method::POST,
        routes::WORKLOAD_FREEZE,
        empty(),
        409,
        "conflict",
    )
    .await;
    let (s, _, _) = c.call(Method::POST, routes::WORKLOAD_THAW, empty()).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let _ = c.get::<serde_json::Value>(routes::HEALTH).await;
    let (s, m) = c.get::<GuestMetrics>(routes::METRICS).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        m.cpu_count >= 1 && m.cpu_busy_ticks <= m.cpu_total_ticks,
        "{m:?}"
    );
    assert!(m.mem_available_bytes <= m.mem_total_bytes, "{m:?}");
    assert!(
        m.disk_used_bytes <= m.disk_total_bytes && m.disk_total_bytes > 0,
        "{m:?}"
    );
    let (_, later) = c.get::<GuestMetrics>(routes::METRICS).await;
    assert!(
        later.cpu_total_ticks >= m.cpu_total_ticks,
        "ticks are cumulative"
    );
    let (_, b) = c.get::<Activity>(routes::ACTIVITY).await;
    assert_eq!(b.api_requests, a.api_requests, "{a:?} -> {b:?}");

    // Real use counts, including requests that fail.
    let run = c.run(&ProcessSpec::shell("sleep 0.2")).await;
    assert_eq!(run.exit, exited(0));
    c.expect_error(Method::GET, "/v1/nope", empty(), 404, "not_found")
        .await;
    let (_, d) = c.get::<Activity>(routes::ACTIVITY).await;
    assert!(d.api_requests >= b.api_requests + 3, "{b:?} -> {d:?}");
}
