//! Polling helpers so integration tests read like scenarios.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 100 ms until it returns `Some`, or panics after `timeout` with `what`.
pub async fn wait_until<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
