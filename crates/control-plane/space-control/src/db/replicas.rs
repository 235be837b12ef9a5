//! Control-plane replicas and what each one holds while it works.
//!
//! Every `space server` process is a replica with a row of its own (`replicas`), written at
//! start and heartbeated. A replica whose heartbeat is older than the timeout is dead. The
//! database's own clock judges that ([`Db::clock_sql`]), so two hosts whose clocks disagree
//! cannot make a live replica look dead.
//!
//! What a replica holds is named by its id in the rows it claims:
//! - a sandbox whose create it runs (`sandboxes.creating_replica`, cleared when the create
//!   is recorded);
//! - an idempotency key whose request it runs (`idempotency_keys.replica`);
//! - quota it holds for work under way (`quota_holds`: snapshot bytes reserved until the
//!   snapshot is listed, a concurrent diff).
//!
//! When a replica dies, the leader forgets it ([`Db::forget_dead_replicas`]): one
//! transaction removes its row, its holds and its unfinished idempotency claims. Its
//! unfinished creates are the reconciler's to finish or undo (see `reconciler::plan`).

use std::collections::HashSet;
use std::time::Duration;

use sqlx::Row;

use super::{Backend, Db, DbError};

/// A control-plane process's identity for as long as it runs (a fresh one at every start).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(String);

impl ReplicaId {
    /// A new, random id.
    pub fn generate() -> ReplicaId {
        ReplicaId(format!("rep-{}", hex::encode(rand::random::<[u8; 12]>())))
    }

    /// The stored form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An id as stored (rows name replicas by it).
    pub fn from_stored(s: String) -> ReplicaId {
        ReplicaId(s)
    }
}

impl std::fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A replica as the database knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRow {
    /// Its id.
    pub id: ReplicaId,
    /// The host it runs on (for the operator's listing).
    pub host: String,
    /// When it started, by the database's clock.
    pub started_at_ms: i64,
    /// Its last heartbeat, by the database's clock.
    pub heartbeat_at_ms: i64,
}

/// What a replica holds of a tenant's quota while its work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaHoldKind {
    /// Bytes of a snapshot being taken, until it is listed.
    SnapshotBytes,
    /// One snapshot diff being computed.
    Diff,
}

impl QuotaHoldKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaHoldKind::SnapshotBytes => "snapshot_bytes",
            QuotaHoldKind::Diff => "diff",
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Db {
    /// An SQL expression for the database's clock, ms since the Unix epoch.
    pub(crate) fn clock_sql(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)",
            Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS BIGINT)",
        }
    }

    /// The database's clock, ms since the Unix epoch.
    pub async fn clock_ms(&self) -> Result<i64, DbError> {
        let sql = format!("SELECT {}", self.clock_sql());
        Ok(sqlx::query_scalar(&sql).fetch_one(self.pool()).await?)
    }

    /// Records replica `id` as alive now (its first heartbeat, or again after it was
    /// forgotten while it could not reach the database).
    pub async fn register_replica(&self, id: &ReplicaId, host: &str) -> Result<(), DbError> {
        let now = self.clock_sql();
        let sql = format!(
            "INSERT INTO replicas (id, host, started_at_ms, heartbeat_at_ms) VALUES ($1, $2, {now}, {now})
             ON CONFLICT (id) DO UPDATE SET heartbeat_at_ms = {now}"
        );
        sqlx::query(&sql)
            .bind(id.as_str())
            .bind(host)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Heartbeats replica `id`. `false`: its row is gone (it was declared dead and
    /// forgotten: whatever it held has passed to others).
    pub async fn heartbeat_replica(&self, id: &ReplicaId) -> Result<bool, DbError> {
        let sql = format!(
            "UPDATE replicas SET heartbeat_at_ms = {} WHERE id = $1",
            self.clock_sql()
        );
        let done = sqlx::query(&sql)
            .bind(id.as_str())
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Removes replica `id` at its graceful shutdown, with what it still holds, so the
    /// others need not wait for its heartbeat to lapse.
    pub async fn remove_replica(&self, id: &ReplicaId) -> Result<(), DbError> {
        let mut tx = self.pool().begin().await?;
        forget(&mut tx, id).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The replicas that heartbeated within `timeout`.
    pub async fn live_replicas(&self, timeout: Duration) -> Result<HashSet<ReplicaId>, DbError> {
        let sql = format!(
            "SELECT id FROM replicas WHERE heartbeat_at_ms > {} - $1",
            self.clock_sql()
        );
        let rows = sqlx::query(&sql)
            .bind(ms(timeout))
            .fetch_all(self.pool())
            .await?;
        rows.iter()
            .map(|r| Ok(ReplicaId(r.try_get("id")?)))
            .collect()
    }

    /// Whether replica `id` heartbeated within `timeout`.
    pub async fn replica_alive(&self, id: &ReplicaId, timeout: Duration) -> Result<bool, DbError> {
        let sql = format!(
            "SELECT COUNT(*) FROM replicas WHERE id = $1 AND heartbeat_at_ms > {} - $2",
            self.clock_sql()
        );
        let n: i64 = sqlx::query_scalar(&sql)
            .bind(id.as_str())
            .bind(ms(timeout))
            .fetch_one(self.pool())
            .await?;
        Ok(n > 0)
    }

    /// Every replica the database knows, alive or not yet forgotten, oldest first.
    pub async fn replicas(&self) -> Result<Vec<ReplicaRow>, DbError> {
        let rows = sqlx::query(
            "SELECT id, host, started_at_ms, heartbeat_at_ms FROM replicas ORDER BY started_at_ms, id",
        )
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(ReplicaRow {
                    id: ReplicaId(r.try_get("id")?),
                    host: r.try_get("host")?,
                    started_at_ms: r.try_get("started_at_ms")?,
                    heartbeat_at_ms: r.try_get("heartbeat_at_ms")?,
                })
            })
            .collect()
    }

    /// Forgets the replicas silent for longer than `timeout`: each one's row, quota holds
    /// and unfinished idempotency claims go in one transaction (a retry of such a request
    /// runs it again). Returns the replicas forgotten.
    pub async fn forget_dead_replicas(&self, timeout: Duration) -> Result<Vec<ReplicaId>, DbError> {
        let sql = format!(
            "SELECT id FROM replicas WHERE heartbeat_at_ms <= {} - $1",
            self.clock_sql()
        );
        let dead: Vec<String> = sqlx::query_scalar(&sql)
            .bind(ms(timeout))
            .fetch_all(self.pool())
            .await?;
        let mut forgotten = Vec::new();
        for id in dead.into_iter().map(ReplicaId) {
            let mut tx = self.pool().begin().await?;
            // Still silent now (it may have heartbeated since the read).
            let still = format!(
                "DELETE FROM replicas WHERE id = $1 AND heartbeat_at_ms <= {} - $2",
                self.clock_sql()
            );
            let gone = sqlx::query(&still)
                .bind(id.as_str())
                .bind(ms(timeout))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if gone == 1 {
                forget(&mut tx, &id).await?;
                tx.commit().await?;
                forgotten.push(id);
            }
        }
        Ok(forgotten)
    }

    /// Holds `amount` of `tenant`'s quota of `kind` for replica `replica` until released.
    /// Returns the hold's id.
    pub async fn hold_quota(
        &self,
        tenant: &space_core::TenantId,
        kind: QuotaHoldKind,
        amount: u64,
        replica: &ReplicaId,
    ) -> Result<String, DbError> {
        let id = format!("hold-{}", hex::encode(rand::random::<[u8; 16]>()));
        let sql = format!(
            "INSERT INTO quota_holds (id, tenant_id, kind, amount, replica, created_at_ms) VALUES ($1, $2, $3, $4, $5, {})",
            self.clock_sql()
        );
        sqlx::query(&sql)
            .bind(&id)
            .bind(tenant.as_str())
            .bind(kind.as_str())
            .bind(i64::try_from(amount).unwrap_or(i64::MAX))
            .bind(replica.as_str())
            .execute(self.pool())
            .await?;
        Ok(id)
    }

    /// Gives a hold back.
    pub async fn release_quota_hold(&self, id: &str) -> Result<(), DbError> {
        sqlx::query("DELETE FROM quota_holds WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// How much of `tenant`'s quota of `kind` is held, and by how many holds.
    pub async fn quota_held(
        &self,
        tenant: &space_core::TenantId,
        kind: QuotaHoldKind,
    ) -> Result<(u64, u64), DbError> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(amount), 0) AS BIGINT) AS amount, COUNT(*) AS holds FROM quota_holds WHERE tenant_id = $1 AND kind = $2",
        )
        .bind(tenant.as_str())
        .bind(kind.as_str())
        .fetch_one(self.pool())
        .await?;
        let amount: i64 = row.try_get("amount")?;
        let holds: i64 = row.try_get("holds")?;
        Ok((
            u64::try_from(amount).unwrap_or(0),
            u64::try_from(holds).unwrap_or(0),
        ))
    }
}

/// Removes replica `id`'s row, holds and unfinished idempotency claims in `tx`.
async fn forget(tx: &mut sqlx::Transaction<'_, sqlx::Any>, id: &ReplicaId) -> Result<(), DbError> {
    sqlx::query("DELETE FROM replicas WHERE id = $1")
        .bind(id.as_str())
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM quota_holds WHERE replica = $1")
        .bind(id.as_str())
        .execute(&mut **tx)
        .await?;
    sqlx::query("DELETE FROM idempotency_keys WHERE replica = $1 AND state = $2")
        .bind(id.as_str())
        .bind(super::IdempotencyState::InProgress.as_str())
        .execute(&mut **tx)
        .await?;
    Ok(())
}
