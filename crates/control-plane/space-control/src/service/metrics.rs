//! A sandbox's resource use over time: the samples its node takes while it runs
//! (`space_guest_client::metrics`), optionally cut to a time range.

use space_core::metrics::SandboxMetric;
use space_core::SandboxId;

use super::Caller;
use crate::api::error::{ApiError, ApiResult};
use crate::api::AppState;

/// The samples of a sandbox taken between `start_ms` and `end_ms` (inclusive; open when
/// not given), oldest first.
pub async fn samples(
    st: &AppState,
    caller: &Caller,
    id: &SandboxId,
    start_ms: Option<i64>,
    end_ms: Option<i64>,
) -> ApiResult<Vec<SandboxMetric>> {
    let start = start_ms.unwrap_or(i64::MIN);
    let end = end_ms.unwrap_or(i64::MAX);
    if start > end {
        return Err(ApiError::invalid("start_ms is after end_ms"));
    }
    let row = st.live_sandbox(&caller.id, id).await?;
    let mut metrics = st.node_of(&row).await?.metrics(id).await?;
    metrics.retain(|m| (start..=end).contains(&m.timestamp_ms));
    Ok(metrics)
}
