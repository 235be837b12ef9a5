//! Locks the replicas share through the database.
//!
//! On PostgreSQL these are session advisory locks: held by one connection, released when it
//! ends however it ends, so a replica killed while it holds one releases it with its
//! connection and nobody waits for a timeout. On SQLite (the single-machine default: one
//! replica) the same guards are this process's mutexes.
//!
//! - [`Db::try_lead`]: the leader's lock, for work one replica does at a time (the
//!   reconciler, the liveness sweeps). Held on a connection of its own for as long as the
//!   replica leads.
//! - [`Db::admission_lock`]: one tenant's admissions (a sandbox row, a credential, a
//!   snapshot's bytes, a diff), so that two requests on two replicas cannot both pass a
//!   quota check only one of them fits.
//! - Migrations run under a lock of their own (`Db::migrate`), so replicas that start
//!   together apply each one once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sqlx::any::AnyConnectOptions;
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, Connection as _};
use tokio::sync::OwnedMutexGuard;

use super::{Backend, Db, DbError};

/// The first key of every SPACE advisory lock ("SP"), so they stay apart from others an
/// operator's own tools take on the same database.
const LOCK_CLASS: i32 = 0x5350;
/// Second keys of the singleton locks. Tenant admissions use a hash of the tenant id, and
/// a hash is never one of these (see [`tenant_key`]).
pub(super) const MIGRATIONS_KEY: i32 = 0;
const LEADER_KEY: i32 = 1;

/// The second key of a tenant's admission lock: a stable hash of its id, kept out of the
/// range of the singleton keys.
fn tenant_key(tenant: &space_core::TenantId) -> i32 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(tenant.as_str().as_bytes());
    let key = i32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    if (MIGRATIONS_KEY..=LEADER_KEY).contains(&key) {
        key + 16
    } else {
        key
    }
}

/// The admission locks of an SQLite database: this process's, shared by every handle on
/// it in the process (SQLite serves one replica; tests open several handles).
fn process_admissions() -> &'static Mutex<HashMap<space_core::TenantId, Arc<tokio::sync::Mutex<()>>>>
{
    static LOCKS: std::sync::OnceLock<
        Mutex<HashMap<space_core::TenantId, Arc<tokio::sync::Mutex<()>>>>,
    > = std::sync::OnceLock::new();
    LOCKS.get_or_init(Default::default)
}

/// This replica leads while it holds this (see [`Db::try_lead`]).
pub struct LeaderLock {
    /// The connection holding the advisory lock (`None` on SQLite: the one replica leads).
    conn: Option<AnyConnection>,
}

impl std::fmt::Debug for LeaderLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderLock")
            .field("advisory", &self.conn.is_some())
            .finish()
    }
}

impl LeaderLock {
    /// Whether the lock is still held: its connection still answers. A connection that
    /// broke took the lock with it (another replica may lead by now).
    pub async fn still_held(&mut self) -> bool {
        let Some(conn) = self.conn.as_mut() else {
            return true;
        };
        let probe = tokio::time::timeout(std::time::Duration::from_secs(5), conn.ping()).await;
        matches!(probe, Ok(Ok(())))
    }

    /// Gives the lead up (the connection closes, and the lock with it).
    pub async fn release(self) {
        if let Some(conn) = self.conn {
            let _ = conn.close().await;
        }
    }
}

/// One tenant's admission lock, held until dropped.
pub enum AdmissionLock {
    /// The single replica's mutex (SQLite).
    Process(OwnedMutexGuard<()>),
    /// A PostgreSQL advisory lock on a pooled connection.
    Database(DatabaseLock),
}

/// A session advisory lock on a connection of the lock pool. Dropping it unlocks, and only
/// then does the connection go back to the pool; a connection that cannot unlock is closed
/// instead (which releases the lock), so no pooled connection ever keeps one.
pub struct DatabaseLock {
    conn: Option<PoolConnection<Any>>,
    keys: (i32, i32),
}

impl Drop for DatabaseLock {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let keys = self.keys;
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    let unlocked: Result<bool, sqlx::Error> =
                        sqlx::query_scalar("SELECT pg_advisory_unlock($1, $2)")
                            .bind(keys.0)
                            .bind(keys.1)
                            .fetch_one(&mut *conn)
                            .await;
                    if !matches!(unlocked, Ok(true)) {
                        tracing::warn!(
                            ?unlocked,
                            "an admission lock did not unlock; closing its connection"
                        );
                        drop(conn.detach());
                    }
                });
            }
            // No runtime to unlock on: closing the connection releases the lock.
            Err(_) => drop(conn.detach()),
        }
    }
}

impl Db {
    /// Takes the leader's lock if no other replica holds it. `None`: another replica leads.
    pub async fn try_lead(&self) -> Result<Option<LeaderLock>, DbError> {
        match self.backend {
            Backend::Sqlite => Ok(Some(LeaderLock { conn: None })),
            Backend::Postgres => {
                let mut conn = AnyConnection::connect_with(&self.options).await?;
                let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)")
                    .bind(LOCK_CLASS)
                    .bind(LEADER_KEY)
                    .fetch_one(&mut conn)
                    .await?;
                if got {
                    Ok(Some(LeaderLock { conn: Some(conn) }))
                } else {
                    let _ = conn.close().await;
                    Ok(None)
                }
            }
        }
    }

    /// Waits for `tenant`'s admission lock.
    pub async fn admission_lock(
        &self,
        tenant: &space_core::TenantId,
    ) -> Result<AdmissionLock, DbError> {
        match self.backend {
            Backend::Sqlite => {
                let m = process_admissions()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(tenant.clone())
                    .or_default()
                    .clone();
                Ok(AdmissionLock::Process(m.lock_owned().await))
            }
            Backend::Postgres => {
                let keys = (LOCK_CLASS, tenant_key(tenant));
                let mut conn = self.lock_pool.acquire().await?;
                sqlx::query("SELECT pg_advisory_lock($1, $2)")
                    .bind(keys.0)
                    .bind(keys.1)
                    .execute(&mut *conn)
                    .await?;
                Ok(AdmissionLock::Database(DatabaseLock {
                    conn: Some(conn),
                    keys,
                }))
            }
        }
    }

    /// Runs migrations with the migration lock held (PostgreSQL; SQLite serialises writers
    /// itself).
    pub(super) async fn migration_lock(
        options: &AnyConnectOptions,
        backend: Backend,
    ) -> Result<Option<AnyConnection>, DbError> {
        if backend != Backend::Postgres {
            return Ok(None);
        }
        let mut conn = AnyConnection::connect_with(options).await?;
        sqlx::query("SELECT pg_advisory_lock($1, $2)")
            .bind(LOCK_CLASS)
            .bind(MIGRATIONS_KEY)
            .execute(&mut conn)
            .await?;
        Ok(Some(conn))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_keys_are_stable_and_never_a_singleton_key() {
        let t = space_core::TenantId::generate();
        assert_eq!(tenant_key(&t), tenant_key(&t));
        for _ in 0..1000 {
            let k = tenant_key(&space_core::TenantId::generate());
            assert!(!(MIGRATIONS_KEY..=LEADER_KEY).contains(&k));
        }
    }
}
