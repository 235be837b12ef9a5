//! Tenants' own quotas (over the operator's defaults; see [`space_core::quota`]).

use space_core::quota::TenantQuota;
use space_core::TenantId;

use super::tenants::TenantDocument;
use super::{Db, DbError};

impl Db {
    /// The tenant's own quota, if the operator set one.
    pub async fn tenant_quota(&self, tenant: &TenantId) -> Result<Option<TenantQuota>, DbError> {
        self.tenant_document(TenantDocument::QUOTA, tenant).await
    }

    /// Every tenant's own quota.
    pub async fn tenant_quotas(&self) -> Result<Vec<(TenantId, TenantQuota)>, DbError> {
        self.tenant_documents(TenantDocument::QUOTA).await
    }

    /// Sets (`Some`) or clears (`None`: the operator's defaults) the tenant's own quota.
    /// What the tenant holds already is kept; only new admissions are checked against it.
    pub async fn set_tenant_quota(
        &self,
        tenant: &TenantId,
        quota: Option<&TenantQuota>,
    ) -> Result<(), DbError> {
        self.set_tenant_document(TenantDocument::QUOTA, tenant, quota)
            .await
    }
}
