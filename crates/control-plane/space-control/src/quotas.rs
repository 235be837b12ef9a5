//! Enforcing tenants' quotas and request rates (the limits themselves, and the pure checks,
//! are [`space_core::quota`]). Everything that must hold across control-plane replicas is
//! in the database:
//! - [`Quotas::admission`] serialises a tenant's admissions (create, fork, snapshot,
//!   credential, diff) across replicas (`Db::admission_lock`), so that two requests cannot
//!   both pass a check only one of them fits;
//! - what work under way holds of a quota (a snapshot's bytes until it is listed, a diff
//!   being computed) is a row naming this replica ([`QuotaHold`]), given back when the work
//!   ends or forgotten with the replica if it dies;
//! - [`Quotas::take_request`] is each API key's token bucket: a row every replica takes
//!   from (`Db::take_request`) on PostgreSQL; on SQLite, which serves one replica, the
//!   replica's memory (a database write per request would buy nothing there).
//!
//! Only the cache of each tenant's quota in effect (for the per-request rate check, a
//! few seconds old at most) is this process's own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use space_core::quota::TenantQuota;
use space_core::TenantId;
use tokio::time::Instant;

use crate::db::{AdmissionLock, Backend, Db, DbError, QuotaHoldKind, RateDecision, ReplicaId};

/// Buckets kept before idle ones are dropped.
const MAX_BUCKETS: usize = 10_000;
/// A bucket idle this long is full again anyway: dropping it changes nothing.
pub const BUCKET_IDLE: Duration = Duration::from_secs(600);

/// A token bucket: `burst` tokens, refilled at `rate` per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(burst: u64, now: Instant) -> Self {
        TokenBucket {
            tokens: burst as f64,
            last: now,
        }
    }

    /// Takes a token at `now`, or says how long until one is there.
    pub fn take(&mut self, rate: u64, burst: u64, now: Instant) -> Result<(), Duration> {
        let rate = rate.max(1) as f64;
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst.max(1) as f64);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }
}

/// The control plane's quota enforcement. Cheap to clone.
#[derive(Clone)]
pub struct Quotas {
    /// The operator's defaults, under every tenant's own quota.
    pub defaults: TenantQuota,
    db: Db,
    replica: ReplicaId,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Each tenant's quota in effect, as last read, for the per-request rate check.
    cached: Mutex<HashMap<TenantId, (Instant, TenantQuota)>>,
    /// The request buckets of a single replica (SQLite).
    buckets: Mutex<HashMap<String, TokenBucket>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each critical section is a single map operation: a poisoned map is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Quotas {
    /// Quotas with the operator's `defaults`, held as `replica`.
    pub fn new(db: Db, replica: ReplicaId, defaults: TenantQuota) -> Self {
        Quotas {
            defaults,
            db,
            replica,
            shared: Arc::default(),
        }
    }

    /// Held while one of `tenant`'s admissions checks and takes what it asks for.
    pub async fn admission(&self, tenant: &TenantId) -> Result<AdmissionLock, DbError> {
        self.db.admission_lock(tenant).await
    }

    /// Holds `bytes` of `tenant`'s snapshot quota until the hold is dropped. Call under the
    /// tenant's admission.
    pub async fn reserve_snapshot(
        &self,
        tenant: &TenantId,
        bytes: u64,
    ) -> Result<QuotaHold, DbError> {
        self.hold(tenant, QuotaHoldKind::SnapshotBytes, bytes).await
    }

    /// The bytes `tenant` holds for snapshots being taken, on every replica.
    pub async fn snapshot_reserved(&self, tenant: &TenantId) -> Result<u64, DbError> {
        Ok(self
            .db
            .quota_held(tenant, QuotaHoldKind::SnapshotBytes)
            .await?
            .0)
    }

    async fn hold(
        &self,
        tenant: &TenantId,
        kind: QuotaHoldKind,
        amount: u64,
    ) -> Result<QuotaHold, DbError> {
        let id = self
            .db
            .hold_quota(tenant, kind, amount, &self.replica)
            .await?;
        Ok(QuotaHold {
            db: self.db.clone(),
            id: Some(id),
        })
    }

    /// `tenant`'s quota as cached less than `ttl` ago.
    pub fn cached(&self, tenant: &TenantId, ttl: Duration) -> Option<TenantQuota> {
        lock(&self.shared.cached)
            .get(tenant)
            .filter(|(at, _)| at.elapsed() < ttl)
            .map(|(_, q)| *q)
    }

    /// Caches `tenant`'s quota in effect.
    pub fn cache(&self, tenant: &TenantId, quota: TenantQuota) {
        let mut cached = lock(&self.shared.cached);
        if cached.len() >= MAX_BUCKETS {
            cached.clear();
        }
        cached.insert(tenant.clone(), (Instant::now(), quota));
    }

    /// Forgets `tenant`'s cached quota (it was just changed).
    pub fn forget_cached(&self, tenant: &TenantId) {
        lock(&self.shared.cached).remove(tenant);
    }

    /// A hold for one of `tenant`'s diffs, at most `max` at once across every replica;
    /// `None` when all are taken.
    pub async fn diff_permit(
        &self,
        tenant: &TenantId,
        max: u64,
    ) -> Result<Option<QuotaHold>, DbError> {
        let _admission = self.admission(tenant).await?;
        let (_, running) = self.db.quota_held(tenant, QuotaHoldKind::Diff).await?;
        if running >= max {
            return Ok(None);
        }
        self.hold(tenant, QuotaHoldKind::Diff, 1).await.map(Some)
    }

    /// Takes one request of API key `key_id` from its bucket, or says how long to wait.
    pub async fn take_request(
        &self,
        key_id: &str,
        rate: u64,
        burst: u64,
    ) -> Result<RateDecision, DbError> {
        if self.db.backend() == Backend::Postgres {
            return self.db.take_request(key_id, rate, burst).await;
        }
        let now = Instant::now();
        let mut buckets = lock(&self.shared.buckets);
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key_id) {
            buckets.retain(|_, b| now.saturating_duration_since(b.last) < BUCKET_IDLE);
        }
        Ok(
            match buckets
                .entry(key_id.to_owned())
                .or_insert_with(|| TokenBucket::full(burst, now))
                .take(rate, burst, now)
            {
                Ok(()) => RateDecision::Allowed,
                Err(wait) => RateDecision::Limited(wait),
            },
        )
    }
}

/// Quota a replica holds for work under way (a snapshot's bytes, a diff): a database row
/// naming the replica, deleted when this is dropped. If the replica dies first, the leader
/// forgets the row with the replica.
pub struct QuotaHold {
    db: Db,
    id: Option<String>,
}

impl Drop for QuotaHold {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let db = self.db.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = db.release_quota_hold(&id).await {
                    tracing::warn!(hold = %id, error = %e, "could not give a quota hold back; it goes with this replica");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_a_burst_through_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::full(3, t0);
        for _ in 0..3 {
            assert_eq!(b.take(2, 3, t0), Ok(()));
        }
        let wait = b.take(2, 3, t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert_eq!(b.take(2, 3, t0 + Duration::from_millis(500)), Ok(()));
        // Idle time refills up to the burst, not beyond.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.take(2, 3, later), Ok(()));
        }
        assert!(b.take(2, 3, later).is_err());
    }
}
