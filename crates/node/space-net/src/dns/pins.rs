//! The pin table: which addresses the resolver handed a sandbox for which names.
//!
//! The transparent proxy connects upstream only to an address the resolver pinned for the
//! name the guest asked for (SNI / Host), so a guest can neither pick its own address for an
//! allowed name nor reach an address it learnt elsewhere. One table per sandbox, shared by
//! the resolver (writer) and the proxy (reader): `Arc<PinTable>`.
//!
//! Bounded: at most [`PinLimits::max_per_name`] addresses per name and
//! [`PinLimits::max_entries`] (name, address) pairs in all; past either cap the least
//! recently pinned pair goes. A pin lives `max(TTL, min_ttl)`, and expired pins are ignored
//! by every read and swept when the table is full. Addresses are stored canonically
//! (`::ffff:a.b.c.d` as `a.b.c.d`), and looked up the same way.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use space_core::egress::Hostname;

/// The bounds of one sandbox's [`PinTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinLimits {
    /// Addresses kept per name (the resolver also answers with no more than this many).
    pub max_per_name: usize,
    /// (name, address) pairs kept in all.
    pub max_entries: usize,
    /// The shortest life of a pin, whatever the record's TTL: a guest that connects a little
    /// after its cache expired (or that got TTL 0) must still find its pin.
    pub min_ttl: Duration,
}

impl Default for PinLimits {
    fn default() -> Self {
        Self {
            max_per_name: 64,
            max_entries: 4096,
            min_ttl: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pin {
    expires: Instant,
    /// Position in `Inner::order`: larger is more recently pinned.
    seq: u64,
}

#[derive(Debug, Default)]
struct Inner {
    by_name: HashMap<Hostname, HashMap<IpAddr, Pin>>,
    by_addr: HashMap<IpAddr, HashSet<Hostname>>,
    /// Every pair, least recently pinned first.
    order: BTreeMap<u64, (Hostname, IpAddr)>,
    next_seq: u64,
}

impl Inner {
    fn remove(&mut self, name: &Hostname, addr: IpAddr) {
        if let Some(addrs) = self.by_name.get_mut(name) {
            if let Some(pin) = addrs.remove(&addr) {
                self.order.remove(&pin.seq);
            }
            if addrs.is_empty() {
                self.by_name.remove(name);
            }
        }
        if let Some(names) = self.by_addr.get_mut(&addr) {
            names.remove(name);
            if names.is_empty() {
                self.by_addr.remove(&addr);
            }
        }
    }

    fn sweep_expired(&mut self, now: Instant) {
        let expired: Vec<(Hostname, IpAddr)> = self
            .by_name
            .iter()
            .flat_map(|(name, addrs)| {
                addrs
                    .iter()
                    .filter(|(_, pin)| pin.expires <= now)
                    .map(move |(addr, _)| (name.clone(), *addr))
            })
            .collect();
        for (name, addr) in expired {
            self.remove(&name, addr);
        }
    }

    fn evict_oldest(&mut self) {
        if let Some((_, (name, addr))) = self.order.pop_first() {
            self.remove(&name, addr);
        }
    }

    fn evict_oldest_of(&mut self, name: &Hostname) {
        let oldest = self
            .by_name
            .get(name)
            .and_then(|addrs| addrs.iter().min_by_key(|(_, pin)| pin.seq))
            .map(|(addr, _)| *addr);
        if let Some(addr) = oldest {
            self.remove(name, addr);
        }
    }
}

/// One sandbox's pins: hostname → addresses the resolver answered with, until they expire.
#[derive(Debug)]
pub struct PinTable {
    limits: PinLimits,
    inner: Mutex<Inner>,
}

impl Default for PinTable {
    fn default() -> Self {
        Self::new(PinLimits::default())
    }
}

impl PinTable {
    /// An empty table with these bounds (a zero bound is taken as 1).
    pub fn new(limits: PinLimits) -> Self {
        Self {
            limits: PinLimits {
                max_per_name: limits.max_per_name.max(1),
                max_entries: limits.max_entries.max(1),
                min_ttl: limits.min_ttl,
            },
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The table's bounds.
    pub fn limits(&self) -> PinLimits {
        self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every critical section leaves `Inner` consistent before it can panic, so a
        // poisoned lock still holds a usable table.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pins `addrs` for `name` for `max(ttl, min_ttl)`. Re-pinning a pair refreshes it
    /// (its expiry only ever grows).
    pub fn pin(&self, name: &Hostname, addrs: &[IpAddr], ttl: Duration) {
        self.pin_at(name, addrs, ttl, Instant::now());
    }

    pub(crate) fn pin_at(&self, name: &Hostname, addrs: &[IpAddr], ttl: Duration, now: Instant) {
        let expires = now + ttl.max(self.limits.min_ttl);
        let mut inner = self.lock();
        for addr in addrs {
            let addr = addr.to_canonical();
            let seq = inner.next_seq;
            inner.next_seq += 1;
            let previous = inner
                .by_name
                .get(name)
                .and_then(|addrs| addrs.get(&addr))
                .copied();
            match previous {
                Some(old) => {
                    inner.order.remove(&old.seq);
                    inner.order.insert(seq, (name.clone(), addr));
                    let pin = Pin {
                        expires: old.expires.max(expires),
                        seq,
                    };
                    if let Some(addrs) = inner.by_name.get_mut(name) {
                        addrs.insert(addr, pin);
                    }
                }
                None => {
                    if inner.by_name.get(name).map_or(0, HashMap::len) >= self.limits.max_per_name {
                        inner.evict_oldest_of(name);
                    }
                    if inner.order.len() >= self.limits.max_entries {
                        inner.sweep_expired(now);
                    }
                    while inner.order.len() >= self.limits.max_entries {
                        inner.evict_oldest();
                    }
                    inner.order.insert(seq, (name.clone(), addr));
                    match inner.by_name.entry(name.clone()) {
                        Entry::Occupied(mut e) => {
                            e.get_mut().insert(addr, Pin { expires, seq });
                        }
                        Entry::Vacant(e) => {
                            e.insert(HashMap::from([(addr, Pin { expires, seq })]));
                        }
                    }
                    inner.by_addr.entry(addr).or_default().insert(name.clone());
                }
            }
        }
    }

    /// The unexpired addresses pinned for `name`, most recently pinned first.
    pub fn addresses_for(&self, name: &Hostname) -> Vec<IpAddr> {
        self.addresses_for_at(name, Instant::now())
    }

    pub(crate) fn addresses_for_at(&self, name: &Hostname, now: Instant) -> Vec<IpAddr> {
        let inner = self.lock();
        let Some(addrs) = inner.by_name.get(name) else {
            return Vec::new();
        };
        let mut live: Vec<(u64, IpAddr)> = addrs
            .iter()
            .filter(|(_, pin)| pin.expires > now)
            .map(|(addr, pin)| (pin.seq, *addr))
            .collect();
        live.sort_unstable_by_key(|(seq, _)| std::cmp::Reverse(*seq));
        live.into_iter().map(|(_, addr)| addr).collect()
    }

    /// The names `addr` is pinned for (unexpired), in no particular order.
    pub fn names_for(&self, addr: IpAddr) -> Vec<Hostname> {
        self.names_for_at(addr, Instant::now())
    }

    pub(crate) fn names_for_at(&self, addr: IpAddr, now: Instant) -> Vec<Hostname> {
        let addr = addr.to_canonical();
        let inner = self.lock();
        let Some(names) = inner.by_addr.get(&addr) else {
            return Vec::new();
        };
        names
            .iter()
            .filter(|name| {
                inner
                    .by_name
                    .get(*name)
                    .and_then(|addrs| addrs.get(&addr))
                    .is_some_and(|pin| pin.expires > now)
            })
            .cloned()
            .collect()
    }

    /// Whether `addr` is pinned (unexpired) for `name`: the proxy's question.
    pub fn is_pinned(&self, name: &Hostname, addr: IpAddr) -> bool {
        self.is_pinned_at(name, addr, Instant::now())
    }

    pub(crate) fn is_pinned_at(&self, name: &Hostname, addr: IpAddr, now: Instant) -> bool {
        let addr = addr.to_canonical();
        self.lock()
            .by_name
            .get(name)
            .and_then(|addrs| addrs.get(&addr))
            .is_some_and(|pin| pin.expires > now)
    }

    /// (name, address) pairs held, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.lock().order.len()
    }

    /// Whether the table holds no pair.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired pin now (reads ignore them anyway; this frees their memory).
    pub fn purge_expired(&self) {
        self.lock().sweep_expired(Instant::now());
    }
}
