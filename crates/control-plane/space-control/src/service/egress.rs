//! Egress policies: each sandbox's (changed while it runs: its gateway enforces the new one
//! from the next DNS query or connection on) and the tenant's default for new sandboxes.
//!
//! A sandbox's policy comes from its create request, else the tenant's default, else the
//! node's (mode `none`: no network). Forks inherit their parent's.

use space_core::egress::EgressPolicy;
use space_core::SandboxId;

use super::Caller;
use crate::api::error::{ApiError, ApiResult};
use crate::api::AppState;

/// A sandbox's egress policy in force.
pub async fn sandbox_policy(
    st: &AppState,
    caller: &Caller,
    id: &SandboxId,
) -> ApiResult<EgressPolicy> {
    let row = st.live_sandbox(&caller.id, id).await?;
    let view = st
        .node_of(&row)
        .await?
        .sandbox(id)
        .await?
        .ok_or_else(|| ApiError::sandbox_not_found(id))?;
    Ok(view.egress)
}

/// Replaces a sandbox's egress policy (checked against its node's ceiling); returns the
/// policy in force.
pub async fn set_sandbox_policy(
    st: &AppState,
    caller: &Caller,
    id: &SandboxId,
    policy: EgressPolicy,
) -> ApiResult<EgressPolicy> {
    let row = st.live_sandbox(&caller.id, id).await?;
    let view = st
        .node_of(&row)
        .await?
        .set_egress_policy(id, policy)
        .await?;
    tracing::info!(sandbox = %id, tenant = %caller.name, "egress policy replaced");
    Ok(view.egress)
}

/// The caller's default policy for new sandboxes, or 404.
pub async fn tenant_policy(st: &AppState, caller: &Caller) -> ApiResult<EgressPolicy> {
    st.db
        .tenant_egress_policy(&caller.id)
        .await?
        .ok_or_else(|| ApiError::not_found("this tenant has no default egress policy"))
}

/// Sets the caller's default policy for new sandboxes (checked against a node's ceiling).
pub async fn set_tenant_policy(
    st: &AppState,
    caller: &Caller,
    policy: EgressPolicy,
) -> ApiResult<EgressPolicy> {
    st.nodes.any()?.check_egress_policy(&policy).await?;
    st.db
        .set_tenant_egress_policy(&caller.id, Some(&policy))
        .await?;
    Ok(policy)
}

/// Removes the caller's default policy (new sandboxes get the node's).
pub async fn clear_tenant_policy(st: &AppState, caller: &Caller) -> ApiResult<()> {
    st.db.set_tenant_egress_policy(&caller.id, None).await?;
    Ok(())
}
