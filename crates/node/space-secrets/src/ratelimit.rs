//! Per-credential rate limits: a token bucket for each credential that has a
//! [`RateLimit`], in memory (a node restart refills every bucket).
//!
//! The budget is per credential, shared by every sandbox that uses it: a rate limit protects
//! the upstream account (quota, cost), which is one account however many sandboxes use it. A
//! tenant that wants a budget per sandbox gives each sandbox its own credential.
//!
//! A bucket holds up to `requests` tokens and refills continuously at `requests / per_secs`
//! tokens per second; each injection takes one. Integer arithmetic: one token is
//! `per_secs × 1000` units and every millisecond adds `requests` units, so refills are exact.
//! Time comes from the caller (the request context's `now_ms`); a clock that goes backwards
//! refills nothing.

use std::collections::HashMap;

use crate::model::CredentialId;
use crate::rule::RateLimit;

/// One credential's bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    limit: RateLimit,
    /// Current level, in units (see the module doc).
    units: u64,
    /// When `units` was last brought up to date.
    updated_ms: i64,
}

impl TokenBucket {
    /// A full bucket for `limit` at `now_ms`.
    pub fn new(limit: RateLimit, now_ms: i64) -> Self {
        let mut b = Self {
            limit,
            units: 0,
            updated_ms: now_ms,
        };
        b.units = b.capacity();
        b
    }

    fn unit_per_token(&self) -> u64 {
        u64::from(self.limit.per_secs) * 1000
    }

    fn capacity(&self) -> u64 {
        u64::from(self.limit.requests) * self.unit_per_token()
    }

    fn refill(&mut self, now_ms: i64) {
        if now_ms > self.updated_ms {
            let elapsed = now_ms.abs_diff(self.updated_ms);
            let added = elapsed.saturating_mul(u64::from(self.limit.requests));
            self.units = self.units.saturating_add(added).min(self.capacity());
            self.updated_ms = now_ms;
        }
    }

    /// Whether a token is available at `now_ms` (refills, takes nothing).
    pub fn has_token(&mut self, now_ms: i64) -> bool {
        self.refill(now_ms);
        self.units >= self.unit_per_token()
    }

    /// Takes a token if one is available at `now_ms`.
    pub fn try_take(&mut self, now_ms: i64) -> bool {
        if self.has_token(now_ms) {
            self.units -= self.unit_per_token();
            true
        } else {
            false
        }
    }
}

/// The buckets of all rate-limited credentials.
#[derive(Debug, Default)]
pub struct RateLimiter {
    buckets: HashMap<CredentialId, TokenBucket>,
}

impl RateLimiter {
    /// No buckets yet (each starts full on first use).
    pub fn new() -> Self {
        Self::default()
    }

    fn bucket(&mut self, id: &CredentialId, limit: RateLimit, now_ms: i64) -> &mut TokenBucket {
        let bucket = self
            .buckets
            .entry(id.clone())
            .or_insert_with(|| TokenBucket::new(limit, now_ms));
        if bucket.limit != limit {
            // The rule changed: start over with the new budget.
            *bucket = TokenBucket::new(limit, now_ms);
        }
        bucket
    }

    /// Takes one token from each of `wanted`, all or none: if any bucket is empty, nothing is
    /// taken and the index of that credential in `wanted` is returned.
    pub fn try_acquire_all(
        &mut self,
        wanted: &[(&CredentialId, RateLimit)],
        now_ms: i64,
    ) -> Result<(), usize> {
        for (i, (id, limit)) in wanted.iter().enumerate() {
            if !self.bucket(id, *limit, now_ms).has_token(now_ms) {
                return Err(i);
            }
        }
        for (id, limit) in wanted {
            self.bucket(id, *limit, now_ms).try_take(now_ms);
        }
        Ok(())
    }

    /// Forgets a credential's bucket (after it is deleted).
    pub fn remove(&mut self, id: &CredentialId) {
        self.buckets.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEN_PER_MINUTE: RateLimit = RateLimit {
        requests: 10,
        per_secs: 60,
    };

    #[test]
    fn bursts_then_refills_continuously() {
        let mut b = TokenBucket::new(TEN_PER_MINUTE, 0);
        for _ in 0..10 {
            assert!(b.try_take(0));
        }
        assert!(!b.try_take(0));
        // One token every 6 s.
        assert!(!b.try_take(5_999));
        assert!(b.try_take(6_000));
        assert!(!b.try_take(6_000));
        // Never above capacity, however long the wait.
        for _ in 0..10 {
            assert!(b.try_take(10_000_000));
        }
        assert!(!b.try_take(10_000_000));
    }

    #[test]
    fn a_clock_going_backwards_refills_nothing() {
        let mut b = TokenBucket::new(
            RateLimit {
                requests: 1,
                per_secs: 1,
            },
            1_000,
        );
        assert!(b.try_take(1_000));
        assert!(!b.try_take(0));
        assert!(!b.try_take(1_999));
        assert!(b.try_take(2_000));
    }

    #[test]
    fn acquire_all_is_all_or_nothing() {
        let mut limiter = RateLimiter::new();
        let a = CredentialId::generate();
        let b = CredentialId::generate();
        let one = RateLimit {
            requests: 1,
            per_secs: 3600,
        };
        let two = RateLimit {
            requests: 2,
            per_secs: 3600,
        };
        assert!(limiter.try_acquire_all(&[(&a, one)], 0).is_ok());
        // a is empty: b must not be charged.
        assert_eq!(limiter.try_acquire_all(&[(&b, two), (&a, one)], 0), Err(1));
        assert!(limiter.try_acquire_all(&[(&b, two)], 0).is_ok());
        assert!(limiter.try_acquire_all(&[(&b, two)], 0).is_ok());
        assert_eq!(limiter.try_acquire_all(&[(&b, two)], 0), Err(0));
        // A changed limit starts a fresh bucket.
        assert!(limiter.try_acquire_all(&[(&a, two)], 0).is_ok());
    }

    #[test]
    fn extreme_limits_do_not_overflow() {
        let max = RateLimit {
            requests: crate::rule::MAX_RATE_REQUESTS,
            per_secs: crate::rule::MAX_RATE_PERIOD_SECS,
        };
        let mut b = TokenBucket::new(max, i64::MIN);
        assert!(b.try_take(i64::MAX));
    }
}
