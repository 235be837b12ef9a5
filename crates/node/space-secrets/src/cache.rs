//! The manager's short-lived cache of values, so that a backend (a file read and decryption,
//! or a helper process) is consulted once per credential per TTL instead of once per request.
//!
//! Pure: time is passed in (milliseconds, the same clock as the request context), so tests
//! need no sleeping. Bounded to [`MAX_CACHED_VALUES`] entries; when full, expired entries go
//! first, then the one closest to expiry. Values are shared as `Arc<SecretValue>` and wiped when
//! the last user drops them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::model::CredentialId;
use crate::secret::SecretValue;

/// How long a fetched value is reused unless configured otherwise.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(60);
/// Longest TTL that may be configured (a rotated secret must show up reasonably soon).
pub const MAX_CACHE_TTL: Duration = Duration::from_secs(3600);
/// Most values cached at once.
pub const MAX_CACHED_VALUES: usize = 4096;

/// Values by credential id, each with an expiry instant.
#[derive(Debug)]
pub struct ValueCache {
    ttl_ms: i64,
    entries: HashMap<CredentialId, (Arc<SecretValue>, i64)>,
}

impl ValueCache {
    /// An empty cache keeping values for `ttl` (clamped to [`MAX_CACHE_TTL`]; zero disables
    /// caching).
    pub fn new(ttl: Duration) -> Self {
        let ttl_ms = ttl.min(MAX_CACHE_TTL).as_millis();
        Self {
            ttl_ms: i64::try_from(ttl_ms).unwrap_or(i64::MAX),
            entries: HashMap::new(),
        }
    }

    /// The cached value of `id`, if still fresh at `now_ms`.
    pub fn get(&self, id: &CredentialId, now_ms: i64) -> Option<Arc<SecretValue>> {
        self.entries
            .get(id)
            .filter(|(_, expires)| now_ms < *expires)
            .map(|(v, _)| Arc::clone(v))
    }

    /// Caches `value` for `id` from `now_ms`.
    pub fn insert(&mut self, id: CredentialId, value: Arc<SecretValue>, now_ms: i64) {
        if self.ttl_ms == 0 {
            return;
        }
        if self.entries.len() >= MAX_CACHED_VALUES && !self.entries.contains_key(&id) {
            self.entries.retain(|_, (_, expires)| now_ms < *expires);
            if self.entries.len() >= MAX_CACHED_VALUES {
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| k.clone());
                if let Some(k) = soonest {
                    self.entries.remove(&k);
                }
            }
        }
        let expires = now_ms.saturating_add(self.ttl_ms);
        self.entries.insert(id, (value, expires));
    }

    /// Forgets `id` (after a put or delete).
    pub fn remove(&mut self, id: &CredentialId) {
        self.entries.remove(id);
    }

    /// Number of entries (fresh or not).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(s: &str) -> Arc<SecretValue> {
        Arc::new(SecretValue::new(s.into()).unwrap())
    }

    #[test]
    fn entries_expire_after_the_ttl() {
        let mut cache = ValueCache::new(Duration::from_secs(10));
        let id = CredentialId::generate();
        cache.insert(id.clone(), value("v"), 1_000);
        assert!(cache.get(&id, 1_000).is_some());
        assert!(cache.get(&id, 10_999).is_some());
        assert!(cache.get(&id, 11_000).is_none());
        cache.remove(&id);
        assert!(cache.is_empty());
    }

    #[test]
    fn zero_ttl_disables_caching() {
        let mut cache = ValueCache::new(Duration::ZERO);
        let id = CredentialId::generate();
        cache.insert(id.clone(), value("v"), 0);
        assert!(cache.get(&id, 0).is_none());
    }

    #[test]
    fn the_cache_is_bounded() {
        let mut cache = ValueCache::new(Duration::from_secs(10));
        for i in 0..(MAX_CACHED_VALUES + 10) {
            cache.insert(CredentialId::generate(), value("v"), i as i64);
        }
        assert_eq!(cache.len(), MAX_CACHED_VALUES);
    }
}
