//! The credential catalog: every tenant's credentials, desired state like sandboxes.
//!
//! A row holds a credential's metadata (`space_secrets::Credential`, the JSON the nodes
//! validate again) and its value **sealed** by the control plane (`service::credentials`:
//! never in clear here, never in a log). The nodes' gateways inject from their own copies;
//! this catalog is what those copies are synced from (a node that joins, restarts or missed
//! a change gets the catalog as it is). `credential_catalog.revision` counts every change,
//! in the same transaction: a node that reports an older revision is synced.
//!
//! One name per scope: `(tenant_id, scope_key, name)` is unique, `scope_key` being
//! `tenant`, `project:<name>` or `sandbox:<id>`.

use space_core::TenantId;
use space_secrets::{Credential, CredentialId, Scope};
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{now_ms, unique_violation, Db, DbError};

/// A credential as the catalog keeps it.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredCredential {
    /// Its metadata.
    pub credential: Credential,
    /// Its value, sealed by the control plane.
    pub sealed_value: String,
}

impl std::fmt::Debug for StoredCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredCredential")
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

/// The unique key of a credential's scope within its tenant.
fn scope_key(scope: &Scope) -> String {
    match scope {
        Scope::Tenant { .. } => "tenant".to_owned(),
        Scope::Project { project, .. } => format!("project:{project}"),
        Scope::Sandbox { sandbox, .. } => format!("sandbox:{sandbox}"),
    }
}

fn corrupt(reason: impl std::fmt::Display) -> DbError {
    DbError::Corrupt {
        table: "credentials",
        reason: reason.to_string(),
    }
}

fn row_to_stored(row: &AnyRow) -> Result<StoredCredential, DbError> {
    let metadata: String = row.try_get("metadata")?;
    let credential: Credential = serde_json::from_str(&metadata).map_err(corrupt)?;
    credential.validate().map_err(corrupt)?;
    Ok(StoredCredential {
        credential,
        sealed_value: row.try_get("sealed_value")?,
    })
}

const COLUMNS: &str = "metadata, sealed_value";

impl Db {
    /// The catalog's revision: how many changes it has seen.
    pub async fn credential_revision(&self) -> Result<u64, DbError> {
        let rev: i64 = sqlx::query_scalar("SELECT revision FROM credential_catalog WHERE id = 1")
            .fetch_one(self.pool())
            .await?;
        Ok(u64::try_from(rev).unwrap_or(0))
    }

    /// Stores a new credential, or replaces one of the same id (`replace`). A name taken
    /// in that scope is [`DbError::AlreadyExists`]; replacing one that is gone is
    /// [`DbError::NotFound`]. Returns the catalog's new revision.
    pub async fn put_credential(
        &self,
        stored: &StoredCredential,
        replace: bool,
    ) -> Result<u64, DbError> {
        let c = &stored.credential;
        let metadata = serde_json::to_string(c).map_err(|e| DbError::Invalid(e.to_string()))?;
        let taken = || format!("credential {:?} in that scope", c.name.as_str());
        let mut tx = self.pool().begin().await?;
        let changed = if replace {
            sqlx::query("UPDATE credentials SET scope_key = $1, name = $2, metadata = $3, sealed_value = $4, updated_at_ms = $5 WHERE id = $6 AND tenant_id = $7")
                .bind(scope_key(&c.scope))
                .bind(c.name.as_str())
                .bind(&metadata)
                .bind(&stored.sealed_value)
                .bind(now_ms())
                .bind(c.id.as_str())
                .bind(c.scope.tenant().as_str())
                .execute(&mut *tx)
                .await
                .map_err(|e| unique_violation(e, taken))?
                .rows_affected()
        } else {
            sqlx::query("INSERT INTO credentials (id, tenant_id, scope_key, name, metadata, sealed_value, updated_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)")
                .bind(c.id.as_str())
                .bind(c.scope.tenant().as_str())
                .bind(scope_key(&c.scope))
                .bind(c.name.as_str())
                .bind(&metadata)
                .bind(&stored.sealed_value)
                .bind(now_ms())
                .execute(&mut *tx)
                .await
                .map_err(|e| unique_violation(e, taken))?
                .rows_affected()
        };
        if changed != 1 {
            return Err(DbError::NotFound(format!("credential {}", c.id)));
        }
        let revision = bump(&mut tx).await?;
        tx.commit().await?;
        Ok(revision)
    }

    /// Deletes `tenant`'s credential `id`. `None`: there was none; else the new revision.
    pub async fn delete_credential(
        &self,
        tenant: &TenantId,
        id: &CredentialId,
    ) -> Result<Option<u64>, DbError> {
        let mut tx = self.pool().begin().await?;
        let gone = sqlx::query("DELETE FROM credentials WHERE id = $1 AND tenant_id = $2")
            .bind(id.as_str())
            .bind(tenant.as_str())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if gone == 0 {
            return Ok(None);
        }
        let revision = bump(&mut tx).await?;
        tx.commit().await?;
        Ok(Some(revision))
    }

    /// `tenant`'s credential `id`.
    pub async fn credential(
        &self,
        tenant: &TenantId,
        id: &CredentialId,
    ) -> Result<Option<StoredCredential>, DbError> {
        let sql = format!("SELECT {COLUMNS} FROM credentials WHERE id = $1 AND tenant_id = $2");
        let row = sqlx::query(&sql)
            .bind(id.as_str())
            .bind(tenant.as_str())
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(row_to_stored).transpose()
    }

    /// `tenant`'s credentials, by name then scope.
    pub async fn credentials_of(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<StoredCredential>, DbError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM credentials WHERE tenant_id = $1 ORDER BY name, scope_key, id"
        );
        let rows = sqlx::query(&sql)
            .bind(tenant.as_str())
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(row_to_stored).collect()
    }

    /// How many credentials `tenant` has.
    pub async fn count_credentials(&self, tenant: &TenantId) -> Result<u64, DbError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM credentials WHERE tenant_id = $1")
            .bind(tenant.as_str())
            .fetch_one(self.pool())
            .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The whole catalog and its revision, read in one transaction (what a node is synced
    /// to).
    pub async fn credential_catalog(&self) -> Result<(u64, Vec<StoredCredential>), DbError> {
        let mut tx = self.pool().begin().await?;
        let rev: i64 = sqlx::query_scalar("SELECT revision FROM credential_catalog WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?;
        let sql = format!("SELECT {COLUMNS} FROM credentials ORDER BY id");
        let rows = sqlx::query(&sql).fetch_all(&mut *tx).await?;
        tx.commit().await?;
        let all = rows.iter().map(row_to_stored).collect::<Result<_, _>>()?;
        Ok((u64::try_from(rev).unwrap_or(0), all))
    }
}

/// Counts one change of the catalog in `tx`; returns the new revision.
async fn bump(tx: &mut sqlx::Transaction<'_, sqlx::Any>) -> Result<u64, DbError> {
    let rev: i64 = sqlx::query_scalar(
        "UPDATE credential_catalog SET revision = revision + 1 WHERE id = 1 RETURNING revision",
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(u64::try_from(rev).unwrap_or(0))
}
