//! `GET /v1/metrics`: CPU, memory and root-disk use (see `metrics`).

use axum::Json;
use space_guest_proto::GuestMetrics;

use crate::error::ApiError;
use crate::metrics;

pub(super) async fn metrics() -> Result<Json<GuestMetrics>, ApiError> {
    Ok(Json(tokio::task::spawn_blocking(metrics::sample).await?))
}
