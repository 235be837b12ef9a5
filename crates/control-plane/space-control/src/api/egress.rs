//! Egress policies: each sandbox's (changed while it runs: its gateway enforces the new one
//! from the next DNS query or connection on) and the tenant's default for new sandboxes.
//!
//! A sandbox's policy comes from its create request, else the tenant's default, else the
//! node's (mode `none`: no network). Forks inherit their parent's.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use space_core::egress::EgressPolicy;
use space_core::ErrorBody;

use super::auth::AuthTenant;
use super::error::{ApiError, ApiResult};
use super::extract::{ApiJson, SandboxPath};
use super::AppState;

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
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
) -> ApiResult<Json<EgressPolicy>> {
    let row = st.live_sandbox(&tenant.id, &id).await?;
    let view = st
        .node_of(&row)
        .await?
        .sandbox(&id)
        .await?
        .ok_or_else(|| ApiError::sandbox_not_found(&id))?;
    Ok(Json(view.egress))
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
    tenant: AuthTenant,
    SandboxPath(id): SandboxPath,
    ApiJson(policy): ApiJson<EgressPolicy>,
) -> ApiResult<Json<EgressPolicy>> {
    let row = st.live_sandbox(&tenant.id, &id).await?;
    let view = st
        .node_of(&row)
        .await?
        .set_egress_policy(&id, policy)
        .await?;
    tracing::info!(sandbox = %id, tenant = %tenant.name, "egress policy replaced");
    Ok(Json(view.egress))
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
    tenant: AuthTenant,
) -> ApiResult<Json<EgressPolicy>> {
    st.db
        .tenant_egress_policy(&tenant.id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("this tenant has no default egress policy"))
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
    tenant: AuthTenant,
    ApiJson(policy): ApiJson<EgressPolicy>,
) -> ApiResult<Json<EgressPolicy>> {
    st.nodes.any()?.check_egress_policy(&policy).await?;
    st.db
        .set_tenant_egress_policy(&tenant.id, Some(&policy))
        .await?;
    Ok(Json(policy))
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
    tenant: AuthTenant,
) -> ApiResult<StatusCode> {
    st.db.set_tenant_egress_policy(&tenant.id, None).await?;
    Ok(StatusCode::NO_CONTENT)
}
