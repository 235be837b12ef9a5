//! Polling helpers so integration tests read like scenarios.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 100 ms until it returns `Some`, or panics after `timeout` with `what`.
pub async fn wait_until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_until_ok(timeout, what, || {
        let checked = check();
        async move { checked.await.ok_or(NotYet) }
    })
    .await
}

/// What a [`wait_until`] check that has no error to give reports.
#[derive(Debug)]
struct NotYet;

/// Polls `attempt` every 100 ms until it succeeds, or panics after `timeout` with `what` and
/// the last error (so a failure in CI says why, not only that it timed out).
pub async fn wait_until_ok<T, E, F, Fut>(timeout: Duration, what: &str, mut attempt: F) -> T
where
    E: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match attempt().await {
            Ok(v) => return v,
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}; the last attempt: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
