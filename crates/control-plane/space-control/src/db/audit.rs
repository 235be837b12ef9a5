//! The action log in the database: one hash chain per tenant (see [`space_core::audit`]),
//! appended to and read, never updated; records older than the retention are removed
//! oldest first, leaving an anchor (the last removed record's position and hash) so the
//! rest still verifies.
//!
//! Appending reads the tenant's last record and inserts the next one in one transaction;
//! two appends racing on PostgreSQL both read the same last record, one insert loses on the
//! primary key `(tenant_id, seq)` and is retried, so the chain never forks.

use space_core::audit::{chain_hash, AuditAnchor, AuditRecord, GENESIS_HASH};
use space_core::TenantId;
use sqlx::any::AnyRow;
use sqlx::Row;

use super::{Db, DbError};

/// What an action to log is (the chain fields are the database's to fill).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAuditRecord<'a> {
    /// Whose chain.
    pub tenant: &'a TenantId,
    /// When, ms since the Unix epoch.
    pub ts_ms: i64,
    /// The acting key's id, if a key acted.
    pub api_key_id: Option<&'a str>,
    /// See [`AuditRecord::action`].
    pub action: &'a str,
    /// See [`AuditRecord::target`].
    pub target: &'a str,
    /// See [`AuditRecord::outcome`].
    pub outcome: &'a str,
    /// See [`AuditRecord::status`].
    pub status: u16,
}

/// Which records a read wants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditQuery {
    /// Only records after this position (paging: the last `seq` of the previous page).
    pub after_seq: Option<i64>,
    /// Only at or after this time.
    pub since_ms: Option<i64>,
    /// Only before this time.
    pub until_ms: Option<i64>,
    /// Only this action (exact).
    pub action: Option<String>,
    /// Only targets starting with this (a sandbox's records: `/v1/sandboxes/sbx-…`).
    pub target_prefix: Option<String>,
    /// Only this outcome (`ok`, or an error code).
    pub outcome: Option<String>,
    /// Only this key's.
    pub api_key_id: Option<String>,
    /// At most this many (1 to [`MAX_AUDIT_PAGE`]).
    pub limit: usize,
}

/// Most records one read returns.
pub const MAX_AUDIT_PAGE: usize = 1000;
/// Longest field stored (an action, a target, an outcome), bytes: longer is cut.
pub const MAX_AUDIT_FIELD: usize = 512;
/// How many times an append retries after losing a race for the next position (or, on
/// SQLite, to another writer), with a short back-off.
const APPEND_ATTEMPTS: usize = 8;

const COLUMNS: &str = "seq, ts_ms, api_key_id, action, target, outcome, status, prev_hash, hash";

fn record_from_row(row: &AnyRow) -> Result<AuditRecord, DbError> {
    let status: i64 = row.try_get("status")?;
    Ok(AuditRecord {
        seq: row.try_get("seq")?,
        ts_ms: row.try_get("ts_ms")?,
        api_key_id: row.try_get("api_key_id")?,
        action: row.try_get("action")?,
        target: row.try_get("target")?,
        outcome: row.try_get("outcome")?,
        status: u16::try_from(status).map_err(|_| DbError::Corrupt {
            table: "audit_log",
            reason: format!("status {status}"),
        })?,
        prev_hash: row.try_get("prev_hash")?,
        hash: row.try_get("hash")?,
    })
}

/// `tenant`'s anchor, read with `ex` (the pool, or an append's transaction).
async fn anchor_of<'e, E>(ex: E, tenant: &TenantId) -> Result<Option<AuditAnchor>, DbError>
where
    E: sqlx::Executor<'e, Database = sqlx::Any>,
{
    let row = sqlx::query("SELECT seq, hash FROM audit_anchors WHERE tenant_id = $1")
        .bind(tenant.as_str())
        .fetch_optional(ex)
        .await?;
    row.map(|r| {
        Ok(AuditAnchor {
            seq: r.try_get("seq")?,
            hash: r.try_get("hash")?,
        })
    })
    .transpose()
}

/// `s` cut to [`MAX_AUDIT_FIELD`] bytes at a character boundary.
fn bounded(s: &str) -> &str {
    space_core::text::prefix_at_char_boundary(s, MAX_AUDIT_FIELD)
}

impl Db {
    /// Appends an action to its tenant's chain; returns the record as stored.
    pub async fn append_audit(&self, new: &NewAuditRecord<'_>) -> Result<AuditRecord, DbError> {
        let (action, target, outcome) = (
            bounded(new.action),
            bounded(new.target),
            bounded(new.outcome),
        );
        let _serialised = self.audit_appends.lock().await;
        let mut last_err = None;
        for attempt in 0..APPEND_ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(5 << attempt.min(6))).await;
            }
            let mut tx = self.pool().begin().await?;
            let last = match sqlx::query(
                "SELECT seq, hash FROM audit_log WHERE tenant_id = $1 ORDER BY seq DESC LIMIT 1",
            )
            .bind(new.tenant.as_str())
            .fetch_optional(&mut *tx)
            .await
            {
                Ok(last) => last,
                Err(sqlx::Error::Database(e)) if super::is_busy(e.as_ref()) => {
                    last_err = Some(sqlx::Error::Database(e));
                    let _ = tx.rollback().await;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let (prev_seq, prev_hash) = match last {
                Some(row) => (
                    row.try_get::<i64, _>("seq")?,
                    row.try_get::<String, _>("hash")?,
                ),
                None => match anchor_of(&mut *tx, new.tenant).await? {
                    Some(a) => (a.seq, a.hash),
                    None => (0, GENESIS_HASH.to_owned()),
                },
            };
            let seq = prev_seq + 1;
            let hash = chain_hash(
                &prev_hash,
                new.tenant.as_str(),
                seq,
                new.ts_ms,
                new.api_key_id,
                action,
                target,
                outcome,
                new.status,
            );
            let inserted = sqlx::query(
                "INSERT INTO audit_log (tenant_id, seq, ts_ms, api_key_id, action, target, outcome, status, prev_hash, hash)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(new.tenant.as_str())
            .bind(seq)
            .bind(new.ts_ms)
            .bind(new.api_key_id)
            .bind(action)
            .bind(target)
            .bind(outcome)
            .bind(i64::from(new.status))
            .bind(&prev_hash)
            .bind(&hash)
            .execute(&mut *tx)
            .await;
            match inserted {
                Ok(_) => {
                    match tx.commit().await {
                        Ok(()) => {}
                        Err(sqlx::Error::Database(e)) if super::is_busy(e.as_ref()) => {
                            last_err = Some(sqlx::Error::Database(e));
                            continue;
                        }
                        Err(e) => return Err(e.into()),
                    }
                    return Ok(AuditRecord {
                        seq,
                        ts_ms: new.ts_ms,
                        api_key_id: new.api_key_id.map(str::to_owned),
                        action: action.to_owned(),
                        target: target.to_owned(),
                        outcome: outcome.to_owned(),
                        status: new.status,
                        prev_hash,
                        hash,
                    });
                }
                // Another append took this position, or (SQLite) another writer committed
                // between this one's read and its write: read the last record again.
                Err(sqlx::Error::Database(e))
                    if e.is_unique_violation() || super::is_busy(e.as_ref()) =>
                {
                    last_err = Some(sqlx::Error::Database(e));
                    let _ = tx.rollback().await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(last_err.map_or_else(
            || DbError::Invalid("audit append contended".into()),
            DbError::Sqlx,
        ))
    }

    /// Where a tenant's kept chain starts (`None`: at its first record ever).
    pub async fn audit_anchor(&self, tenant: &TenantId) -> Result<Option<AuditAnchor>, DbError> {
        anchor_of(self.pool(), tenant).await
    }

    /// A tenant's records matching `q`, in chain order.
    pub async fn audit_records(
        &self,
        tenant: &TenantId,
        q: &AuditQuery,
    ) -> Result<Vec<AuditRecord>, DbError> {
        let mut sql = format!("SELECT {COLUMNS} FROM audit_log WHERE tenant_id = $1");
        let mut n = 1;
        let mut param = || {
            n += 1;
            n
        };
        let mut clauses = Vec::new();
        if q.after_seq.is_some() {
            clauses.push(format!("seq > ${}", param()));
        }
        if q.since_ms.is_some() {
            clauses.push(format!("ts_ms >= ${}", param()));
        }
        if q.until_ms.is_some() {
            clauses.push(format!("ts_ms < ${}", param()));
        }
        if q.action.is_some() {
            clauses.push(format!("action = ${}", param()));
        }
        if q.target_prefix.is_some() {
            // A prefix match without LIKE's wildcards: the target's first bytes equal it.
            let k = param();
            clauses.push(format!("substr(target, 1, length(${k})) = ${k}"));
        }
        if q.outcome.is_some() {
            clauses.push(format!("outcome = ${}", param()));
        }
        if q.api_key_id.is_some() {
            clauses.push(format!("api_key_id = ${}", param()));
        }
        for c in clauses {
            sql.push_str(" AND ");
            sql.push_str(&c);
        }
        sql.push_str(&format!(
            " ORDER BY seq LIMIT {}",
            q.limit.clamp(1, MAX_AUDIT_PAGE)
        ));
        let mut query = sqlx::query(&sql).bind(tenant.as_str());
        if let Some(v) = q.after_seq {
            query = query.bind(v);
        }
        if let Some(v) = q.since_ms {
            query = query.bind(v);
        }
        if let Some(v) = q.until_ms {
            query = query.bind(v);
        }
        if let Some(v) = &q.action {
            query = query.bind(v.clone());
        }
        if let Some(v) = &q.target_prefix {
            query = query.bind(v.clone());
        }
        if let Some(v) = &q.outcome {
            query = query.bind(v.clone());
        }
        if let Some(v) = &q.api_key_id {
            query = query.bind(v.clone());
        }
        query
            .fetch_all(self.pool())
            .await?
            .iter()
            .map(record_from_row)
            .collect()
    }

    /// Removes every tenant's records older than `before_ms`, oldest first, moving each
    /// tenant's anchor to the last one removed. Returns how many were removed.
    pub async fn prune_audit(&self, before_ms: i64) -> Result<u64, DbError> {
        let tenants: Vec<String> =
            sqlx::query_scalar("SELECT DISTINCT tenant_id FROM audit_log WHERE ts_ms < $1")
                .bind(before_ms)
                .fetch_all(self.pool())
                .await?;
        let mut removed = 0;
        for tenant in tenants {
            let mut tx = self.pool().begin().await?;
            // The newest old record: everything up to it goes (positions are in time order).
            let last = sqlx::query(
                "SELECT seq, hash FROM audit_log WHERE tenant_id = $1 AND ts_ms < $2 ORDER BY seq DESC LIMIT 1",
            )
            .bind(&tenant)
            .bind(before_ms)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(last) = last else { continue };
            let (seq, hash): (i64, String) = (last.try_get("seq")?, last.try_get("hash")?);
            let done = sqlx::query("DELETE FROM audit_log WHERE tenant_id = $1 AND seq <= $2")
                .bind(&tenant)
                .bind(seq)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM audit_anchors WHERE tenant_id = $1")
                .bind(&tenant)
                .execute(&mut *tx)
                .await?;
            sqlx::query("INSERT INTO audit_anchors (tenant_id, seq, hash) VALUES ($1, $2, $3)")
                .bind(&tenant)
                .bind(seq)
                .bind(&hash)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            removed += done.rows_affected();
        }
        Ok(removed)
    }
}
