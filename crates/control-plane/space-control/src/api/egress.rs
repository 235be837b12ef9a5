//! `/v1/sandboxes/{id}/egress` and `/v1/egress`: a sandbox's egress policy and the tenant's
//! default ([`crate::service::egress`]).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use space_core::egress::EgressPolicy;
use space_core::ErrorBody;

use super::error::ApiResult;
use super::extract::{ApiJson, SandboxPath};
use super::AppState;
use crate::service::{egress, Caller};

/// The sandbox's egress policy.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/egress-policy",
    tag = "egress",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The policy its gateway enforces", body = EgressPolicy),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_sandbox_egress(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<EgressPolicy>> {
    Ok(Json(egress::sandbox_policy(&st, &tenant, &id).await?))
}

/// Replace the sandbox's egress policy. Takes effect at once, in a running sandbox too:
/// DNS answers and new connections follow the new policy (connections already open are
/// not cut).
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/egress-policy",
    tag = "egress",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = EgressPolicy,
    responses(
        (status = 200, description = "The policy now enforced", body = EgressPolicy),
        (status = 400, description = "Invalid policy, or one reaching beyond the operator's egress ceiling (`egress_beyond_ceiling`); the message names the rule", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_sandbox_egress(
    State(st): State<AppState>,
    tenant: Caller,
    SandboxPath(id): SandboxPath,
    ApiJson(policy): ApiJson<EgressPolicy>,
) -> ApiResult<Json<EgressPolicy>> {
    Ok(Json(
        egress::set_sandbox_policy(&st, &tenant, &id, policy).await?,
    ))
}

/// The tenant's default egress policy for new sandboxes (404 when it has none and new
/// sandboxes get the node's).
#[utoipa::path(
    get,
    path = "/v1/egress-policy",
    tag = "egress",
    responses(
        (status = 200, description = "The tenant's default", body = EgressPolicy),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
        (status = 404, description = "No default set: new sandboxes get the node's", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_tenant_egress(
    State(st): State<AppState>,
    tenant: Caller,
) -> ApiResult<Json<EgressPolicy>> {
    Ok(Json(egress::tenant_policy(&st, &tenant).await?))
}

/// Set the tenant's default egress policy for sandboxes created from now on (existing
/// sandboxes keep theirs).
#[utoipa::path(
    put,
    path = "/v1/egress-policy",
    tag = "egress",
    request_body = EgressPolicy,
    responses(
        (status = 200, description = "The new default", body = EgressPolicy),
        (status = 400, description = "Invalid policy, or one reaching beyond the operator's egress ceiling (`egress_beyond_ceiling`)", body = ErrorBody),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_tenant_egress(
    State(st): State<AppState>,
    tenant: Caller,
    ApiJson(policy): ApiJson<EgressPolicy>,
) -> ApiResult<Json<EgressPolicy>> {
    Ok(Json(egress::set_tenant_policy(&st, &tenant, policy).await?))
}

/// Remove the tenant's default: new sandboxes get the node's.
#[utoipa::path(
    delete,
    path = "/v1/egress-policy",
    tag = "egress",
    responses(
        (status = 204, description = "Removed (or there was none)"),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn clear_tenant_egress(
    State(st): State<AppState>,
    tenant: Caller,
) -> ApiResult<StatusCode> {
    egress::clear_tenant_policy(&st, &tenant).await?;
    Ok(StatusCode::NO_CONTENT)
}
