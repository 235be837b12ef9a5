//! Tenants and their API keys.

use space_core::egress::EgressPolicy;
use space_core::TenantId;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{now_ms, unique_violation, Db, DbError};
use crate::keys;

/// A tenant: owns API keys and sandboxes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Id.
    pub id: TenantId,
    /// Unique, human-chosen name.
    pub name: String,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
}

/// An API key as listed (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyInfo {
    /// Key id (not secret).
    pub id: String,
    /// Owner.
    pub tenant_id: TenantId,
    /// Non-secret display prefix, e.g. `space_1a2b3c4d`.
    pub prefix: String,
    /// ms since the Unix epoch.
    pub created_at_ms: i64,
    /// Set once revoked.
    pub revoked_at_ms: Option<i64>,
}

/// A key just created: the plaintext exists only here.
#[derive(Debug, Clone)]
pub struct NewApiKey {
    /// What was stored.
    pub info: ApiKeyInfo,
    /// `space_...`: show once, never store or log.
    pub plaintext: Plaintext,
}

/// A secret string whose `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Plaintext(pub String);

impl std::fmt::Debug for Plaintext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Plaintext(***)")
    }
}

/// A table holding one JSON document per tenant (`tenant_id`, the document's column,
/// `updated_at_ms`). Names are constants: nothing from a request is ever spliced into SQL.
#[derive(Debug, Clone, Copy)]
pub(super) struct TenantDocument {
    pub(super) table: &'static str,
    pub(super) column: &'static str,
}

impl TenantDocument {
    /// A tenant's default egress policy.
    pub(super) const EGRESS_POLICY: TenantDocument = TenantDocument {
        table: "tenant_egress_policies",
        column: "policy",
    };
    /// A tenant's own quota.
    pub(super) const QUOTA: TenantDocument = TenantDocument {
        table: "tenant_quotas",
        column: "quota",
    };
}

/// Longest tenant name.
pub const MAX_TENANT_NAME: usize = 64;

/// A tenant name: 1-64 of `[a-z0-9_-]`.
pub fn validate_tenant_name(name: &str) -> Result<(), DbError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TENANT_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(DbError::Invalid(format!(
            "tenant name {name:?} must be 1-{MAX_TENANT_NAME} of [a-z0-9_-]"
        )))
    }
}

fn tenant_from_row(row: &AnyRow) -> Result<Tenant, DbError> {
    let id: String = row.try_get("id")?;
    Ok(Tenant {
        id: id.parse().map_err(|e| DbError::Corrupt {
            table: "tenants",
            reason: format!("{e}"),
        })?,
        name: row.try_get("name")?,
        created_at_ms: row.try_get("created_at_ms")?,
    })
}

fn key_from_row(row: &AnyRow) -> Result<ApiKeyInfo, DbError> {
    let tenant: String = row.try_get("tenant_id")?;
    Ok(ApiKeyInfo {
        id: row.try_get("id")?,
        tenant_id: tenant.parse().map_err(|e| DbError::Corrupt {
            table: "api_keys",
            reason: format!("{e}"),
        })?,
        prefix: row.try_get("prefix")?,
        created_at_ms: row.try_get("created_at_ms")?,
        revoked_at_ms: row.try_get("revoked_at_ms")?,
    })
}

impl Db {
    /// The tenant's default egress policy, if it set one.
    pub async fn tenant_egress_policy(
        &self,
        tenant: &TenantId,
    ) -> Result<Option<EgressPolicy>, DbError> {
        self.tenant_document(TenantDocument::EGRESS_POLICY, tenant)
            .await
    }

    /// Sets (`Some`) or clears (`None`: back to the node's default) the tenant's default
    /// egress policy. Sandboxes already made keep theirs.
    pub async fn set_tenant_egress_policy(
        &self,
        tenant: &TenantId,
        policy: Option<&EgressPolicy>,
    ) -> Result<(), DbError> {
        self.set_tenant_document(TenantDocument::EGRESS_POLICY, tenant, policy)
            .await
    }

    /// A tenant's JSON document in `doc`'s table, if it has one. Deserialising validates: a
    /// row that no longer validates is reported, not used.
    pub(super) async fn tenant_document<T: serde::de::DeserializeOwned>(
        &self,
        doc: TenantDocument,
        tenant: &TenantId,
    ) -> Result<Option<T>, DbError> {
        let row = sqlx::query(&format!(
            "SELECT {} AS doc FROM {} WHERE tenant_id = $1",
            doc.column, doc.table
        ))
        .bind(tenant.as_str())
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            let json: String = r.try_get("doc")?;
            serde_json::from_str(&json).map_err(|e| DbError::Corrupt {
                table: doc.table,
                reason: e.to_string(),
            })
        })
        .transpose()
    }

    /// Every tenant's JSON document in `doc`'s table (a row that no longer validates is
    /// reported, not skipped).
    pub(super) async fn tenant_documents<T: serde::de::DeserializeOwned>(
        &self,
        doc: TenantDocument,
    ) -> Result<Vec<(TenantId, T)>, DbError> {
        let rows = sqlx::query(&format!(
            "SELECT tenant_id, {} AS doc FROM {} ORDER BY tenant_id",
            doc.column, doc.table
        ))
        .fetch_all(self.pool())
        .await?;
        let corrupt = |reason: String| DbError::Corrupt {
            table: doc.table,
            reason,
        };
        rows.iter()
            .map(|r| {
                let tenant: String = r.try_get("tenant_id")?;
                let json: String = r.try_get("doc")?;
                let tenant = tenant.parse().map_err(|e| corrupt(format!("{e}")))?;
                let value = serde_json::from_str(&json).map_err(|e| corrupt(e.to_string()))?;
                Ok((tenant, value))
            })
            .collect()
    }

    /// Sets (`Some`, an upsert) or clears (`None`) a tenant's JSON document in `doc`'s table.
    pub(super) async fn set_tenant_document<T: serde::Serialize>(
        &self,
        doc: TenantDocument,
        tenant: &TenantId,
        value: Option<&T>,
    ) -> Result<(), DbError> {
        match value {
            Some(v) => {
                let json = serde_json::to_string(v).map_err(|e| DbError::Invalid(e.to_string()))?;
                sqlx::query(&format!(
                    "INSERT INTO {table} (tenant_id, {column}, updated_at_ms) VALUES ($1, $2, $3)
                     ON CONFLICT (tenant_id) DO UPDATE SET {column} = excluded.{column}, updated_at_ms = excluded.updated_at_ms",
                    table = doc.table,
                    column = doc.column
                ))
                .bind(tenant.as_str())
                .bind(json)
                .bind(now_ms())
                .execute(self.pool())
                .await?;
            }
            None => {
                sqlx::query(&format!("DELETE FROM {} WHERE tenant_id = $1", doc.table))
                    .bind(tenant.as_str())
                    .execute(self.pool())
                    .await?;
            }
        }
        Ok(())
    }

    /// Creates a tenant; `AlreadyExists` if the name is taken.
    pub async fn create_tenant(&self, name: &str) -> Result<Tenant, DbError> {
        validate_tenant_name(name)?;
        let tenant = Tenant {
            id: TenantId::generate(),
            name: name.to_owned(),
            created_at_ms: now_ms(),
        };
        sqlx::query("INSERT INTO tenants (id, name, created_at_ms) VALUES ($1, $2, $3)")
            .bind(tenant.id.as_str())
            .bind(&tenant.name)
            .bind(tenant.created_at_ms)
            .execute(self.pool())
            .await
            .map_err(|e| unique_violation(e, || format!("tenant '{name}'")))?;
        Ok(tenant)
    }

    /// The tenant with this name.
    pub async fn tenant_by_name(&self, name: &str) -> Result<Option<Tenant>, DbError> {
        let row = sqlx::query("SELECT id, name, created_at_ms FROM tenants WHERE name = $1")
            .bind(name)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    /// The tenant with this id.
    pub async fn tenant(&self, id: &TenantId) -> Result<Option<Tenant>, DbError> {
        let row = sqlx::query("SELECT id, name, created_at_ms FROM tenants WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    /// Every tenant, by name.
    pub async fn tenants(&self) -> Result<Vec<Tenant>, DbError> {
        let rows = sqlx::query("SELECT id, name, created_at_ms FROM tenants ORDER BY name")
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(tenant_from_row).collect()
    }

    /// Creates an API key for a tenant; the plaintext is only in the result.
    pub async fn create_api_key(&self, tenant: &TenantId) -> Result<NewApiKey, DbError> {
        if self.tenant(tenant).await?.is_none() {
            return Err(DbError::NotFound(format!("tenant {tenant}")));
        }
        let key = keys::generate();
        let info = ApiKeyInfo {
            id: format!("key-{}", &key.hash[..16]),
            tenant_id: tenant.clone(),
            prefix: key.display_prefix.clone(),
            created_at_ms: now_ms(),
            revoked_at_ms: None,
        };
        sqlx::query("INSERT INTO api_keys (id, tenant_id, key_hash, prefix, created_at_ms) VALUES ($1, $2, $3, $4, $5)")
            .bind(&info.id)
            .bind(tenant.as_str())
            .bind(&key.hash)
            .bind(&info.prefix)
            .bind(info.created_at_ms)
            .execute(self.pool())
            .await
            .map_err(|e| unique_violation(e, || "api key".to_owned()))?;
        self.log_operator_action(tenant, "api_key.create", &info.id)
            .await;
        Ok(NewApiKey {
            info,
            plaintext: Plaintext(key.plaintext),
        })
    }

    /// The tenant a (well-formed, unrevoked) key, in either format, belongs to.
    pub async fn authenticate(&self, key: &str) -> Result<Option<Tenant>, DbError> {
        Ok(self.authenticate_key(key).await?.map(|(tenant, _)| tenant))
    }

    /// The tenant a (well-formed, unrevoked) key, in either format, belongs to, and the key's id.
    pub async fn authenticate_key(&self, key: &str) -> Result<Option<(Tenant, String)>, DbError> {
        let Some(canonical) = keys::canonical(key) else {
            return Ok(None);
        };
        let row = sqlx::query(
            "SELECT t.id, t.name, t.created_at_ms, k.id AS key_id FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
             WHERE k.key_hash = $1 AND k.revoked_at_ms IS NULL",
        )
        .bind(keys::hash(&canonical))
        .fetch_optional(self.pool())
        .await?;
        row.as_ref()
            .map(|r| Ok((tenant_from_row(r)?, r.try_get::<String, _>("key_id")?)))
            .transpose()
    }

    /// Keys of one tenant (or all), oldest first.
    pub async fn api_keys(&self, tenant: Option<&TenantId>) -> Result<Vec<ApiKeyInfo>, DbError> {
        let rows = match tenant {
            Some(t) => {
                sqlx::query("SELECT id, tenant_id, prefix, created_at_ms, revoked_at_ms FROM api_keys WHERE tenant_id = $1 ORDER BY created_at_ms, id")
                    .bind(t.as_str())
                    .fetch_all(self.pool())
                    .await?
            }
            None => {
                sqlx::query("SELECT id, tenant_id, prefix, created_at_ms, revoked_at_ms FROM api_keys ORDER BY created_at_ms, id")
                    .fetch_all(self.pool())
                    .await?
            }
        };
        rows.iter().map(key_from_row).collect()
    }

    /// Revokes a key by id or display prefix, and with it every sandbox token handed out to
    /// the key's tenant (their epochs move on). `NotFound` if no unrevoked key matches (so
    /// revoking twice reports `NotFound`), `Invalid` if a prefix matches several keys.
    pub async fn revoke_api_key(&self, id_or_prefix: &str) -> Result<ApiKeyInfo, DbError> {
        // Listings show the canonical prefix; the E2B format's (`e2b_1a2b3c4d`) names the same key.
        let canonical_prefix = keys::canonical_display_prefix(id_or_prefix);
        let id_or_prefix = canonical_prefix.as_deref().unwrap_or(id_or_prefix);
        let row = sqlx::query(
            "SELECT id, tenant_id, prefix, created_at_ms, revoked_at_ms FROM api_keys
             WHERE (id = $1 OR prefix = $1) AND revoked_at_ms IS NULL",
        )
        .bind(id_or_prefix)
        .fetch_all(self.pool())
        .await?;
        let info = match row.as_slice() {
            [one] => key_from_row(one)?,
            [] => {
                return Err(DbError::NotFound(format!(
                    "unrevoked api key '{id_or_prefix}'"
                )))
            }
            _ => {
                return Err(DbError::Invalid(format!(
                    "more than one key matches '{id_or_prefix}'; give the key id"
                )))
            }
        };
        let now = now_ms();
        // One transaction: the tokens handed out to the key's holder (for any sandbox of
        // the tenant: which key asked is not recorded) die with the key, never after it.
        let mut tx = self.pool().begin().await?;
        sqlx::query(
            "UPDATE api_keys SET revoked_at_ms = $1 WHERE id = $2 AND revoked_at_ms IS NULL",
        )
        .bind(now)
        .bind(&info.id)
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!(
            "UPDATE sandboxes SET {} WHERE tenant_id = $1",
            super::sandboxes::REVOKE_TOKENS
        ))
        .bind(info.tenant_id.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.log_operator_action(&info.tenant_id, "api_key.revoke", &info.id)
            .await;
        Ok(ApiKeyInfo {
            revoked_at_ms: Some(now),
            ..info
        })
    }

    /// Records an action no API key made (the operator's CLI, the platform itself) in the
    /// tenant's action log; a failure is logged (the action is done by then).
    pub async fn log_operator_action(&self, tenant: &TenantId, action: &str, target: &str) {
        let record = super::NewAuditRecord {
            tenant,
            ts_ms: now_ms(),
            api_key_id: None,
            action,
            target,
            outcome: "ok",
            status: 0,
        };
        if let Err(e) = self.append_audit(&record).await {
            tracing::error!(%tenant, %action, %target, error = %e, "the action log could not record an action");
        }
    }
}
