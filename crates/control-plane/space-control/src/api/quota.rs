//! Quotas at the API (issue 12, item 5): `GET /v1/quota` (the caller's limits and usage),
//! `GET|PUT|DELETE /v1/tenants/{tenant}/quota` (the operator's), the admission checks the
//! create, fork, snapshot and credential handlers call (`403 quota_exceeded` naming the
//! limit), the diff cap, and the per-key request rate (`429 rate_limited`, `Retry-After`).

use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use axum::Json;
use serde::{Deserialize, Serialize};
use space_core::error::ErrorBody;
use space_core::quota::{QuotaExceeded, QuotaLimit, QuotaUsage, TenantQuota};
use space_core::{ErrorCode, Resources, TenantId};
use utoipa::ToSchema;

use super::error::{ApiError, ApiResult};
use super::extract::ApiJson;
use super::AppState;
use crate::db::SandboxFilter;
use crate::service::Caller;

const MIB: u64 = 1024 * 1024;

/// A tenant's limits and what it holds.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct QuotaReport {
    /// The tenant.
    pub tenant: String,
    /// The limits in effect: its own over the operator's defaults (absent: unlimited).
    pub quota: TenantQuota,
    /// Its own quota, as the operator set it (absent: the defaults apply throughout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own: Option<TenantQuota>,
    /// What it holds now.
    pub usage: QuotaUsage,
}

impl From<QuotaExceeded> for ApiError {
    fn from(e: QuotaExceeded) -> Self {
        ApiError::new(ErrorCode::QuotaExceeded, e.to_string())
    }
}

impl AppState {
    /// The limits in effect for `tenant`.
    pub async fn quota_of(&self, tenant: &TenantId) -> ApiResult<TenantQuota> {
        Ok(self
            .db
            .tenant_quota(tenant)
            .await?
            .unwrap_or_default()
            .over(&self.quotas.defaults))
    }

    /// Tells the node the tenant's limit of open egress connections (its gateways enforce
    /// it): the effective one if the tenant has a quota of its own (`own`), else the default.
    pub(crate) async fn apply_connection_limit(
        &self,
        tenant: &TenantId,
        own: Option<&TenantQuota>,
    ) -> ApiResult<()> {
        let limit = own.map(|q| q.over(&self.quotas.defaults).max_connections);
        for node in self.nodes.all() {
            node.set_tenant_connections(tenant, limit).await?;
        }
        Ok(())
    }

    /// At start: the operator's default connection limit and every tenant's own, on the
    /// node.
    pub async fn apply_connection_limits(&self) -> ApiResult<()> {
        for node in self.nodes.all() {
            node.set_default_connections(self.quotas.defaults.max_connections)
                .await?;
        }
        for (tenant, quota) in self.db.tenant_quotas().await? {
            self.apply_connection_limit(&tenant, Some(&quota)).await?;
        }
        Ok(())
    }

    /// What `tenant` holds: sandboxes and their resources (from the database), credentials
    /// (from the node), snapshot bytes (its snapshots' logical sizes, and those being taken).
    pub async fn usage_of(&self, tenant: &TenantId) -> ApiResult<QuotaUsage> {
        let mut usage = self.sandbox_usage(tenant).await?;
        usage.credentials = self.credentials_of(tenant).await?;
        usage.snapshot_bytes = self.snapshot_bytes_of(tenant).await?;
        Ok(usage)
    }

    async fn sandbox_usage(&self, tenant: &TenantId) -> ApiResult<QuotaUsage> {
        let rows = self.db.sandboxes(tenant, SandboxFilter::Live).await?;
        Ok(QuotaUsage {
            sandboxes: rows.len() as u64,
            vcpus: rows.iter().map(|r| u64::from(r.spec.resources.vcpus)).sum(),
            memory_mib: rows
                .iter()
                .map(|r| u64::from(r.spec.resources.memory_mib))
                .sum(),
            ..Default::default()
        })
    }

    async fn credentials_of(&self, tenant: &TenantId) -> ApiResult<u64> {
        Ok(self.db.count_credentials(tenant).await?)
    }

    async fn snapshot_bytes_of(&self, tenant: &TenantId) -> ApiResult<u64> {
        let taken: u64 = crate::service::snapshots::tenant_snapshots(self, tenant)
            .await?
            .iter()
            .map(|s| s.total_bytes)
            .sum();
        Ok(taken.saturating_add(self.quotas.snapshot_reserved(tenant).await?))
    }

    /// Admits `sandboxes` new sandboxes of `resources` each for `tenant`, or refuses with
    /// the limit they would pass. Call with [`super::super::quotas::Quotas::admission`] held
    /// until their rows are in the database.
    pub async fn admit_sandboxes(
        &self,
        tenant: &TenantId,
        resources: Resources,
        sandboxes: u64,
    ) -> ApiResult<()> {
        let quota = self.quota_of(tenant).await?;
        let usage = self.sandbox_usage(tenant).await?;
        usage.admit(
            &quota,
            &[
                (QuotaLimit::Sandboxes, sandboxes),
                (
                    QuotaLimit::Vcpus,
                    u64::from(resources.vcpus).saturating_mul(sandboxes),
                ),
                (
                    QuotaLimit::MemoryMib,
                    u64::from(resources.memory_mib).saturating_mul(sandboxes),
                ),
            ],
        )?;
        Ok(())
    }

    /// Admits one more credential for `tenant` (hold its admission while storing it).
    pub async fn admit_credential(&self, tenant: &TenantId) -> ApiResult<()> {
        let quota = self.quota_of(tenant).await?;
        let usage = QuotaUsage {
            credentials: self.credentials_of(tenant).await?,
            ..Default::default()
        };
        usage.admit(&quota, &[(QuotaLimit::Credentials, 1)])?;
        Ok(())
    }

    /// Admits a snapshot of a sandbox of `resources` (`memory`: a checkpoint, which saves
    /// its RAM too) and reserves the bytes it will take until the returned guard is dropped
    /// (by then the snapshot is listed, or was not taken): bytes count when a snapshot is
    /// taken, not once the store has filled.
    pub async fn admit_snapshot(
        &self,
        tenant: &TenantId,
        resources: Resources,
        memory: bool,
    ) -> ApiResult<crate::quotas::QuotaHold> {
        let _admission = self.quotas.admission(tenant).await?;
        let quota = self.quota_of(tenant).await?;
        let mut asked = u64::from(resources.disk_mib).saturating_mul(MIB);
        if memory {
            asked = asked.saturating_add(u64::from(resources.memory_mib).saturating_mul(MIB));
        }
        let usage = QuotaUsage {
            snapshot_bytes: self.snapshot_bytes_of(tenant).await?,
            ..Default::default()
        };
        usage.admit(&quota, &[(QuotaLimit::SnapshotBytes, asked)])?;
        Ok(self.quotas.reserve_snapshot(tenant, asked).await?)
    }

    /// A permit for one of `tenant`'s snapshot diffs, or `429 rate_limited`.
    pub async fn diff_permit(
        &self,
        tenant: &TenantId,
    ) -> ApiResult<Option<crate::quotas::QuotaHold>> {
        let Some(max) = self.quota_of(tenant).await?.max_concurrent_diffs else {
            return Ok(None);
        };
        match self.quotas.diff_permit(tenant, max).await? {
            Some(permit) => Ok(Some(permit)),
            None => Err(ApiError::rate_limited(
                format!(
                    "the tenant already computes {max} snapshot diffs at once (quota max_concurrent_diffs); retry when one is done"
                ),
                Duration::from_secs(1),
            )),
        }
    }
}

/// The caller's limits and usage.
#[utoipa::path(
    get,
    path = "/v1/quota",
    tag = "quotas",
    responses(
        (status = 200, description = "Limits and usage", body = QuotaReport),
        (status = 401, description = "Missing or unknown API key", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn my_quota(State(st): State<AppState>, tenant: Caller) -> ApiResult<Json<QuotaReport>> {
    report(&st, &tenant.id, tenant.name.clone()).await.map(Json)
}

async fn report(st: &AppState, id: &TenantId, name: String) -> ApiResult<QuotaReport> {
    Ok(QuotaReport {
        tenant: name,
        quota: st.quota_of(id).await?,
        own: st.db.tenant_quota(id).await?,
        usage: st.usage_of(id).await?,
    })
}

/// The operator's tenant by name, or 404.
async fn named_tenant(st: &AppState, caller: &Caller, name: &str) -> ApiResult<TenantId> {
    caller.require_operator()?;
    st.db
        .tenant_by_name(name)
        .await?
        .map(|t| t.id)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "tenant {} not found",
                space_core::error::excerpt(name, 64)
            ))
        })
}

/// A tenant's limits and usage (the operator's tenant only).
#[utoipa::path(
    get,
    path = "/v1/tenants/{tenant}/quota",
    tag = "quotas",
    params(("tenant" = String, Path, description = "Tenant name")),
    responses(
        (status = 200, description = "Limits and usage", body = QuotaReport),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
        (status = 404, description = "No such tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn get_tenant_quota(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<QuotaReport>> {
    let id = named_tenant(&st, &caller, &name).await?;
    report(&st, &id, name).await.map(Json)
}

/// Sets a tenant's own quota, field by field over the operator's defaults (the operator's
/// tenant only). What the tenant holds already is kept; new admissions are checked.
#[utoipa::path(
    put,
    path = "/v1/tenants/{tenant}/quota",
    tag = "quotas",
    params(("tenant" = String, Path, description = "Tenant name")),
    request_body = TenantQuota,
    responses(
        (status = 200, description = "Set", body = QuotaReport),
        (status = 400, description = "Bad quota", body = ErrorBody),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
        (status = 404, description = "No such tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn set_tenant_quota(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(quota): ApiJson<TenantQuota>,
) -> ApiResult<Json<QuotaReport>> {
    let id = named_tenant(&st, &caller, &name).await?;
    quota.validate().map_err(ApiError::invalid)?;
    st.db.set_tenant_quota(&id, Some(&quota)).await?;
    st.quotas.forget_cached(&id);
    st.apply_connection_limit(&id, Some(&quota)).await?;
    tracing::info!(tenant = %name, ?quota, "tenant quota set");
    report(&st, &id, name).await.map(Json)
}

/// Clears a tenant's own quota: the operator's defaults apply (the operator's tenant only).
#[utoipa::path(
    delete,
    path = "/v1/tenants/{tenant}/quota",
    tag = "quotas",
    params(("tenant" = String, Path, description = "Tenant name")),
    responses(
        (status = 204, description = "Cleared"),
        (status = 403, description = "Not the operator's tenant", body = ErrorBody),
        (status = 404, description = "No such tenant", body = ErrorBody),
    ),
    security(("api_key" = []))
)]
pub async fn clear_tenant_quota(
    State(st): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    let id = named_tenant(&st, &caller, &name).await?;
    st.db.set_tenant_quota(&id, None).await?;
    st.quotas.forget_cached(&id);
    st.apply_connection_limit(&id, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How long a tenant's request rate is read from a cached quota (a change through the API
/// applies at once in this process).
const RATE_QUOTA_TTL: Duration = Duration::from_secs(5);

/// The per-key request rate (layer it just inside authentication): a key past its bucket
/// gets `429 rate_limited` with `Retry-After`, before anything else runs.
pub async fn rate_limit(
    State(st): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(auth) = req.extensions().get::<Caller>().cloned() else {
        return Ok(next.run(req).await);
    };
    let quota = match st.quotas.cached(&auth.id, RATE_QUOTA_TTL) {
        Some(q) => q,
        None => {
            let q = st.quota_of(&auth.id).await?;
            st.quotas.cache(&auth.id, q);
            q
        }
    };
    if let Some(rate) = quota.requests_per_sec {
        let burst = quota.request_burst.unwrap_or(rate);
        if let crate::db::RateDecision::Limited(wait) =
            st.quotas.take_request(&auth.key_id, rate, burst).await?
        {
            return Err(ApiError::rate_limited(
                format!("this API key is over its request rate ({rate}/s, bursts of {burst}); retry after the time in Retry-After"),
                wait,
            ));
        }
    }
    Ok(next.run(req).await)
}
