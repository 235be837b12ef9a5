//! Resource-use metrics on a real VM through the native API: samples appear while the
//! sandbox runs and are plausible (its vCPUs, memory near its size, root disk near its
//! disk), none are taken while it is paused (and sampling does not wake it), a time range
//! cuts them, and they go with the sandbox.

use std::time::Duration;

use space_core::metrics::SandboxMetric;
use space_core::{ErrorCode, SandboxState};
use test_support::{api_error, test_sandbox, wait_until, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_of_a_running_sandbox() {
    let ts = TestServer::start_with(|c| c.node.metrics_interval = Duration::from_secs(1)).await;
    let c = &ts.client;
    let id = test_sandbox(c).await;
    let res = c.sandbox(&id).await.expect("get").resources;

    let samples: Vec<SandboxMetric> =
        wait_until(Duration::from_secs(60), "three samples", || async {
            let m = c.metrics(&id, None, None).await.expect("metrics").metrics;
            (m.len() >= 3).then_some(m)
        })
        .await;
    let mib = 1u64 << 20;
    for m in &samples {
        assert_eq!(m.cpu_count, res.vcpus, "{m:?}");
        assert!((0.0..=100.0).contains(&m.cpu_used_pct), "{m:?}");
        let mem = u64::from(res.memory_mib) * mib;
        assert!(
            m.mem_total <= mem && m.mem_total >= mem * 7 / 10,
            "{m:?} vs {res:?}"
        );
        assert!(m.mem_used > 0 && m.mem_used < m.mem_total, "{m:?}");
        assert!(m.mem_cache < m.mem_total, "{m:?}");
        let disk = u64::from(res.disk_mib) * mib;
        assert!(
            m.disk_total <= disk && m.disk_total >= disk * 8 / 10,
            "{m:?} vs {res:?}"
        );
        assert!(m.disk_used > 0 && m.disk_used < m.disk_total, "{m:?}");
    }
    assert!(samples
        .windows(2)
        .all(|w| w[0].timestamp_ms < w[1].timestamp_ms));

    // A range cuts the list.
    let since = samples[1].timestamp_ms;
    let cut = c.metrics(&id, Some(since), None).await.expect("metrics");
    assert!(cut.metrics.iter().all(|m| m.timestamp_ms >= since));
    assert!(!cut.metrics.is_empty() && cut.metrics.len() < samples.len() + 5);
    let (status, code, _) = api_error(c.metrics(&id, Some(10), Some(5)).await);
    assert_eq!((status, code), (400, ErrorCode::InvalidRequest));

    // Paused: no samples, and sampling does not wake it.
    c.pause_sandbox(&id).await.expect("pause");
    // A sample already asked for when the pause began may still land.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = c
        .metrics(&id, None, None)
        .await
        .expect("metrics")
        .metrics
        .len();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        c.sandbox(&id).await.expect("get").state,
        SandboxState::Paused
    );
    let after = c
        .metrics(&id, None, None)
        .await
        .expect("metrics")
        .metrics
        .len();
    assert_eq!(before, after, "no samples while paused");

    // Gone with the sandbox.
    c.delete_sandbox(&id).await.expect("delete");
    let (status, code, _) = api_error(c.metrics(&id, None, None).await);
    assert_eq!((status, code), (404, ErrorCode::NotFound));
    ts.stop().await;
}
