//! Customer keys and the data keys wrapped under them (`service::customer_keys` decides;
//! this stores).
//!
//! - `customer_keys`: a tenant's one customer key, and which of its versions is current.
//! - `customer_key_versions`: each version's key service, the key's id there (in clear, for
//!   listings), and how SPACE reaches it, sealed under the control plane's credential key.
//! - `data_keys`: one per artifact sealed at rest: the data key *wrapped* by a version of
//!   the tenant's customer key (never in plaintext), and what it seals. A rotation re-wraps
//!   each row under the new version, one conditional update at a time, so two replicas
//!   rotating at once never lose a row.

use space_core::TenantId;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{now_ms, unique_violation, Db, DbError};

/// A version of a customer key as stored.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredKeyVersion {
    /// 1, 2, … (a rotation adds one).
    pub version: i64,
    /// The operator's key service it is at.
    pub provider: String,
    /// The key's id there.
    pub key_id: String,
    /// How SPACE reaches it (`KeyAccess` as JSON), sealed.
    pub sealed_access: String,
    /// When it was added.
    pub created_at_ms: i64,
}

impl std::fmt::Debug for StoredKeyVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredKeyVersion")
            .field("version", &self.version)
            .field("provider", &self.provider)
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

/// A tenant's customer key as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredCustomerKey {
    /// Whose.
    pub tenant: TenantId,
    /// The version new data keys are wrapped under.
    pub current_version: i64,
    /// Every version, oldest first.
    pub versions: Vec<StoredKeyVersion>,
    /// When it was registered.
    pub created_at_ms: i64,
    /// When it last changed (a rotation).
    pub updated_at_ms: i64,
}

impl StoredCustomerKey {
    /// The current version.
    pub fn current(&self) -> Option<&StoredKeyVersion> {
        self.version(self.current_version)
    }

    /// Version `v`.
    pub fn version(&self, v: i64) -> Option<&StoredKeyVersion> {
        self.versions.iter().find(|k| k.version == v)
    }
}

/// A data key as stored: wrapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataKeyRow {
    /// `dk-…`.
    pub id: String,
    /// Whose.
    pub tenant: TenantId,
    /// The customer key version that wrapped it.
    pub key_version: i64,
    /// The wrapped key (base64).
    pub wrapped: String,
    /// What it seals (e.g. `credential:crd-…`, `snapshot:…`).
    pub artifact: String,
    /// When it was made.
    pub created_at_ms: i64,
}

/// What removing a customer key did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CustomerKeyRemoval {
    /// Removed.
    Removed,
    /// The tenant has none.
    NotFound,
    /// Data keys are still wrapped under it (their count): removing it would make their
    /// artifacts unreadable.
    InUse(u64),
}

fn version_row(row: &AnyRow) -> Result<StoredKeyVersion, DbError> {
    Ok(StoredKeyVersion {
        version: row.try_get("version")?,
        provider: row.try_get("provider")?,
        key_id: row.try_get("key_id")?,
        sealed_access: row.try_get("sealed_access")?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

fn data_key_row(row: &AnyRow) -> Result<DataKeyRow, DbError> {
    let tenant: String = row.try_get("tenant_id")?;
    Ok(DataKeyRow {
        id: row.try_get("id")?,
        tenant: tenant
            .parse()
            .map_err(|e: space_core::IdError| DbError::Corrupt {
                table: "data_keys",
                reason: e.to_string(),
            })?,
        key_version: row.try_get("key_version")?,
        wrapped: row.try_get("wrapped")?,
        artifact: row.try_get("artifact")?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

const DATA_KEY_COLUMNS: &str = "id, tenant_id, key_version, wrapped, artifact, created_at_ms";

impl Db {
    /// `tenant`'s customer key, with every version.
    pub async fn customer_key(
        &self,
        tenant: &TenantId,
    ) -> Result<Option<StoredCustomerKey>, DbError> {
        let Some(row) = sqlx::query(
            "SELECT current_version, created_at_ms, updated_at_ms FROM customer_keys WHERE tenant_id = $1",
        )
        .bind(tenant.as_str())
        .fetch_optional(self.pool())
        .await?
        else {
            return Ok(None);
        };
        let versions = sqlx::query(
            "SELECT version, provider, key_id, sealed_access, created_at_ms FROM customer_key_versions WHERE tenant_id = $1 ORDER BY version",
        )
        .bind(tenant.as_str())
        .fetch_all(self.pool())
        .await?
        .iter()
        .map(version_row)
        .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(StoredCustomerKey {
            tenant: tenant.clone(),
            current_version: row.try_get("current_version")?,
            versions,
            created_at_ms: row.try_get("created_at_ms")?,
            updated_at_ms: row.try_get("updated_at_ms")?,
        }))
    }

    /// Every tenant with a customer key.
    pub async fn tenants_with_customer_keys(&self) -> Result<Vec<TenantId>, DbError> {
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT tenant_id FROM customer_keys ORDER BY tenant_id")
                .fetch_all(self.pool())
                .await?;
        ids.iter()
            .map(|id| {
                id.parse()
                    .map_err(|e: space_core::IdError| DbError::Corrupt {
                        table: "customer_keys",
                        reason: e.to_string(),
                    })
            })
            .collect()
    }

    /// Registers `tenant`'s customer key with its first version; [`DbError::AlreadyExists`]
    /// if the tenant has one.
    pub async fn insert_customer_key(
        &self,
        tenant: &TenantId,
        first: &StoredKeyVersion,
    ) -> Result<(), DbError> {
        let now = now_ms();
        let mut tx = self.pool().begin().await?;
        sqlx::query("INSERT INTO customer_keys (tenant_id, current_version, created_at_ms, updated_at_ms) VALUES ($1, $2, $3, $3)")
            .bind(tenant.as_str())
            .bind(first.version)
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(|e| unique_violation(e, || format!("a customer key of tenant {tenant}")))?;
        insert_version(&mut tx, tenant, first).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Adds version `next` and makes it current, if the current version is still
    /// `expected` (another rotation did not win meanwhile). `false`: it was not.
    pub async fn add_customer_key_version(
        &self,
        tenant: &TenantId,
        expected: i64,
        next: &StoredKeyVersion,
    ) -> Result<bool, DbError> {
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query("UPDATE customer_keys SET current_version = $1, updated_at_ms = $2 WHERE tenant_id = $3 AND current_version = $4")
            .bind(next.version)
            .bind(now_ms())
            .bind(tenant.as_str())
            .bind(expected)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if moved != 1 {
            return Ok(false);
        }
        insert_version(&mut tx, tenant, next).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Removes `tenant`'s customer key, unless data keys are still wrapped under it.
    pub async fn remove_customer_key(
        &self,
        tenant: &TenantId,
    ) -> Result<CustomerKeyRemoval, DbError> {
        let mut tx = self.pool().begin().await?;
        let in_use: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM data_keys WHERE tenant_id = $1")
            .bind(tenant.as_str())
            .fetch_one(&mut *tx)
            .await?;
        if in_use > 0 {
            return Ok(CustomerKeyRemoval::InUse(
                u64::try_from(in_use).unwrap_or(0),
            ));
        }
        let gone = sqlx::query("DELETE FROM customer_keys WHERE tenant_id = $1")
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if gone == 0 {
            return Ok(CustomerKeyRemoval::NotFound);
        }
        sqlx::query("DELETE FROM customer_key_versions WHERE tenant_id = $1")
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(CustomerKeyRemoval::Removed)
    }

    /// Stores a wrapped data key.
    pub async fn insert_data_key(&self, row: &DataKeyRow) -> Result<(), DbError> {
        sqlx::query("INSERT INTO data_keys (id, tenant_id, key_version, wrapped, artifact, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(&row.id)
            .bind(row.tenant.as_str())
            .bind(row.key_version)
            .bind(&row.wrapped)
            .bind(&row.artifact)
            .bind(row.created_at_ms)
            .execute(self.pool())
            .await
            .map_err(|e| unique_violation(e, || format!("data key {}", row.id)))?;
        Ok(())
    }

    /// `tenant`'s data key `id`.
    pub async fn data_key(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<DataKeyRow>, DbError> {
        sqlx::query(&format!(
            "SELECT {DATA_KEY_COLUMNS} FROM data_keys WHERE id = $1 AND tenant_id = $2"
        ))
        .bind(id)
        .bind(tenant.as_str())
        .fetch_optional(self.pool())
        .await?
        .as_ref()
        .map(data_key_row)
        .transpose()
    }

    /// Forgets data key `id` (its artifact is gone).
    pub async fn delete_data_key(&self, tenant: &TenantId, id: &str) -> Result<bool, DbError> {
        Ok(
            sqlx::query("DELETE FROM data_keys WHERE id = $1 AND tenant_id = $2")
                .bind(id)
                .bind(tenant.as_str())
                .execute(self.pool())
                .await?
                .rows_affected()
                == 1,
        )
    }

    /// Up to `limit` of `tenant`'s data keys wrapped under a version other than `version`.
    pub async fn data_keys_not_under(
        &self,
        tenant: &TenantId,
        version: i64,
        limit: i64,
    ) -> Result<Vec<DataKeyRow>, DbError> {
        sqlx::query(&format!(
            "SELECT {DATA_KEY_COLUMNS} FROM data_keys WHERE tenant_id = $1 AND key_version <> $2 ORDER BY id LIMIT $3"
        ))
        .bind(tenant.as_str())
        .bind(version)
        .bind(limit)
        .fetch_all(self.pool())
        .await?
        .iter()
        .map(data_key_row)
        .collect()
    }

    /// Replaces data key `id`'s wrapping (was under `from`, now under `to`), if nobody
    /// re-wrapped it meanwhile. `false`: somebody did.
    pub async fn rewrap_data_key(
        &self,
        id: &str,
        from: i64,
        to: i64,
        wrapped: &str,
    ) -> Result<bool, DbError> {
        Ok(sqlx::query("UPDATE data_keys SET key_version = $1, wrapped = $2 WHERE id = $3 AND key_version = $4")
            .bind(to)
            .bind(wrapped)
            .bind(id)
            .bind(from)
            .execute(self.pool())
            .await?
            .rows_affected()
            == 1)
    }

    /// How many of `tenant`'s data keys each version wraps: `(version, count)`.
    pub async fn data_key_counts(&self, tenant: &TenantId) -> Result<Vec<(i64, u64)>, DbError> {
        let rows = sqlx::query("SELECT key_version, COUNT(*) AS n FROM data_keys WHERE tenant_id = $1 GROUP BY key_version ORDER BY key_version")
            .bind(tenant.as_str())
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| {
                let n: i64 = r.try_get("n")?;
                Ok((r.try_get("key_version")?, u64::try_from(n).unwrap_or(0)))
            })
            .collect()
    }
}

async fn insert_version(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    tenant: &TenantId,
    v: &StoredKeyVersion,
) -> Result<(), DbError> {
    sqlx::query("INSERT INTO customer_key_versions (tenant_id, version, provider, key_id, sealed_access, created_at_ms) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(tenant.as_str())
        .bind(v.version)
        .bind(&v.provider)
        .bind(&v.key_id)
        .bind(&v.sealed_access)
        .bind(v.created_at_ms)
        .execute(&mut **tx)
        .await
        .map_err(|e| unique_violation(e, || format!("version {} of tenant {tenant}'s customer key", v.version)))?;
    Ok(())
}
