//! `GET /v1/sandboxes/{id}/metrics`: a sandbox's resource samples
//! ([`crate::service::metrics`]), optionally cut to a time range.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use space_core::metrics::SandboxMetrics;
use space_core::ErrorBody;
use utoipa::IntoParams;

use super::error::ApiResult;
use super::extract::{ApiQuery, SandboxPath};
use super::AppState;
use crate::service::{metrics as service, Caller};

/// Query of the metrics endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MetricsQuery {
    /// Only samples taken at or after this time, ms since the Unix epoch.
    pub start_ms: Option<i64>,
    /// Only samples taken at or before this time, ms since the Unix epoch.
    pub end_ms: Option<i64>,
}

/// The sandbox's resource-use samples, oldest first: taken every few seconds while it runs
/// (none while it is paused or stopped), the last hour's kept.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/metrics",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id"), MetricsQuery),
    responses(
        (status = 200, description = "Samples, oldest first", body = SandboxMetrics),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn metrics(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<MetricsQuery>,
) -> ApiResult<Json<SandboxMetrics>> {
    let metrics = service::samples(&st, &tenant, &id, q.start_ms, q.end_ms).await?;
    Ok(Json(SandboxMetrics { metrics }))
}
