//! Enforcing tenants' quotas and request rates (the limits themselves, and the pure checks,
//! are [`space_core::quota`]):
//! - [`Quotas::admission`] serialises a tenant's admissions (create, fork, snapshot,
//!   credential) so that two requests cannot both pass a check only one of them fits;
//! - [`Quotas::diff_permit`] caps a tenant's concurrent snapshot diffs;
//! - [`Quotas::take_request`] is each API key's token bucket.
//!
//! One control-plane process holds these in memory (a restart forgets the buckets: a burst
//! again, not more). With several replicas (issue 14) admissions move to the database.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use space_core::quota::TenantQuota;
use space_core::TenantId;
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Buckets kept before idle ones are dropped.
const MAX_BUCKETS: usize = 10_000;
/// A bucket idle this long is full again anyway: dropping it changes nothing.
const BUCKET_IDLE: Duration = Duration::from_secs(600);

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

/// The control plane's quota state. Cheap to clone.
#[derive(Clone)]
pub struct Quotas {
    /// The operator's defaults, under every tenant's own quota.
    pub defaults: TenantQuota,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    admissions: Mutex<HashMap<TenantId, Arc<tokio::sync::Mutex<()>>>>,
    /// Bytes of each tenant's snapshots being taken (not listed yet).
    snapshot_reserved: Mutex<HashMap<TenantId, u64>>,
    /// Each tenant's quota in effect, as last read, for the per-request rate check.
    cached: Mutex<HashMap<TenantId, (Instant, TenantQuota)>>,
    /// Each tenant's diff permits, with the limit they were made for.
    diffs: Mutex<HashMap<TenantId, (u64, Arc<Semaphore>)>>,
    buckets: Mutex<HashMap<String, TokenBucket>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Each critical section is a single map operation: a poisoned map is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Quotas {
    /// Quotas with the operator's `defaults`.
    pub fn new(defaults: TenantQuota) -> Self {
        Quotas {
            defaults,
            shared: Arc::default(),
        }
    }

    /// Held while one of `tenant`'s admissions checks and takes what it asks for.
    pub async fn admission(&self, tenant: &TenantId) -> OwnedMutexGuard<()> {
        let m = lock(&self.shared.admissions)
            .entry(tenant.clone())
            .or_default()
            .clone();
        m.lock_owned().await
    }

    /// Reserves `bytes` of `tenant`'s snapshot quota until the reservation is dropped.
    pub fn reserve_snapshot(&self, tenant: &TenantId, bytes: u64) -> SnapshotReservation {
        let mut reserved = lock(&self.shared.snapshot_reserved);
        let r = reserved.entry(tenant.clone()).or_default();
        *r = r.saturating_add(bytes);
        SnapshotReservation {
            shared: Arc::clone(&self.shared),
            tenant: tenant.clone(),
            bytes,
        }
    }

    /// The bytes `tenant` has reserved for snapshots being taken.
    pub fn snapshot_reserved(&self, tenant: &TenantId) -> u64 {
        lock(&self.shared.snapshot_reserved)
            .get(tenant)
            .copied()
            .unwrap_or(0)
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

    /// A permit for one of `tenant`'s diffs, at most `max` at once; `None` when all are taken.
    pub fn diff_permit(&self, tenant: &TenantId, max: u64) -> Option<OwnedSemaphorePermit> {
        let permits = usize::try_from(max)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        let sem = {
            let mut diffs = lock(&self.shared.diffs);
            let entry = diffs
                .entry(tenant.clone())
                .or_insert_with(|| (max, Arc::new(Semaphore::new(permits))));
            if entry.0 != max {
                // The limit changed: new permits from now on (diffs running keep theirs).
                *entry = (max, Arc::new(Semaphore::new(permits)));
            }
            entry.1.clone()
        };
        sem.try_acquire_owned().ok()
    }

    /// Takes one request of API key `key_id` from its bucket, or says how long to wait.
    pub fn take_request(&self, key_id: &str, rate: u64, burst: u64) -> Result<(), Duration> {
        let now = Instant::now();
        let mut buckets = lock(&self.shared.buckets);
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(key_id) {
            buckets.retain(|_, b| now.saturating_duration_since(b.last) < BUCKET_IDLE);
        }
        buckets
            .entry(key_id.to_owned())
            .or_insert_with(|| TokenBucket::full(burst, now))
            .take(rate, burst, now)
    }
}

/// Bytes of a tenant's snapshot quota held for a snapshot being taken; given back on drop.
pub struct SnapshotReservation {
    shared: Arc<Shared>,
    tenant: TenantId,
    bytes: u64,
}

impl Drop for SnapshotReservation {
    fn drop(&mut self) {
        let mut reserved = lock(&self.shared.snapshot_reserved);
        if let Some(r) = reserved.get_mut(&self.tenant) {
            *r = r.saturating_sub(self.bytes);
            if *r == 0 {
                reserved.remove(&self.tenant);
            }
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

    #[tokio::test]
    async fn diffs_are_capped_per_tenant() {
        let q = Quotas::new(TenantQuota::default());
        let (a, b) = (TenantId::generate(), TenantId::generate());
        let first = q.diff_permit(&a, 1).expect("first");
        assert!(q.diff_permit(&a, 1).is_none());
        assert!(
            q.diff_permit(&b, 1).is_some(),
            "another tenant's are its own"
        );
        drop(first);
        assert!(q.diff_permit(&a, 1).is_some());
    }

    #[test]
    fn snapshot_reservations_are_given_back() {
        let q = Quotas::new(TenantQuota::default());
        let t = TenantId::generate();
        let one = q.reserve_snapshot(&t, 10);
        let two = q.reserve_snapshot(&t, 5);
        assert_eq!(q.snapshot_reserved(&t), 15);
        drop(one);
        assert_eq!(q.snapshot_reserved(&t), 5);
        drop(two);
        assert_eq!(q.snapshot_reserved(&t), 0);
    }
}
