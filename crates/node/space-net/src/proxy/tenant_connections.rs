//! Open guest connections counted per tenant, across all of its sandboxes on this node
//! (issue 12, item 5): each sandbox's proxy has its own cap ([`super::ProxyLimits`]), but a
//! tenant with many sandboxes could still hold every socket the node's gateways can keep
//! open. Every proxy of a tenant takes a slot of one [`TenantConnections`] for each guest
//! connection, beside its own.
//!
//! Limits change while connections are open (a quota set through the API): a lower limit
//! refuses new connections until enough have closed; open ones are never cut.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use space_core::TenantId;

/// Stored for "no limit".
const UNLIMITED: u64 = u64::MAX;
/// Stored in a tenant's own limit for "the node's default applies".
const FOLLOW_DEFAULT: u64 = 0;

fn encode(limit: Option<u64>) -> u64 {
    limit.map_or(UNLIMITED, |l| l.max(1))
}

/// The node's tenants' connection budgets, made on first use.
#[derive(Debug)]
pub struct TenantConnectionLimits {
    default: Arc<AtomicU64>,
    tenants: Mutex<HashMap<TenantId, Arc<TenantConnections>>>,
}

impl TenantConnectionLimits {
    /// Budgets whose limit is `default` (`None`: unlimited) unless a tenant's own is set.
    pub fn new(default: Option<u64>) -> Self {
        TenantConnectionLimits {
            default: Arc::new(AtomicU64::new(encode(default))),
            tenants: Mutex::default(),
        }
    }

    /// Changes the default of every tenant without one of its own.
    pub fn set_default(&self, default: Option<u64>) {
        self.default.store(encode(default), Ordering::Relaxed);
    }

    /// Sets (`Some`) or clears (`None`: the default applies) the tenant's own limit.
    pub fn set_own(&self, tenant: &TenantId, limit: Option<Option<u64>>) {
        let own = limit.map_or(FOLLOW_DEFAULT, encode);
        self.of(tenant).own.store(own, Ordering::Relaxed);
    }

    /// The tenant's budget, shared by all of its sandboxes' proxies.
    pub fn of(&self, tenant: &TenantId) -> Arc<TenantConnections> {
        let mut tenants = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(tenants.entry(tenant.clone()).or_insert_with(|| {
            Arc::new(TenantConnections {
                open: AtomicU64::new(0),
                own: AtomicU64::new(FOLLOW_DEFAULT),
                default: Arc::clone(&self.default),
            })
        }))
    }
}

/// One tenant's open guest connections on this node, and its limit.
#[derive(Debug)]
pub struct TenantConnections {
    open: AtomicU64,
    own: AtomicU64,
    default: Arc<AtomicU64>,
}

impl TenantConnections {
    /// A budget of its own (not shared through [`TenantConnectionLimits`]): for a proxy
    /// whose tenant is alone, such as a test's.
    pub fn unshared(limit: Option<u64>) -> Arc<Self> {
        Arc::new(TenantConnections {
            open: AtomicU64::new(0),
            own: AtomicU64::new(encode(limit)),
            default: Arc::new(AtomicU64::new(UNLIMITED)),
        })
    }

    /// The limit in force (`None`: unlimited).
    pub fn limit(&self) -> Option<u64> {
        let own = self.own.load(Ordering::Relaxed);
        let limit = if own == FOLLOW_DEFAULT {
            self.default.load(Ordering::Relaxed)
        } else {
            own
        };
        (limit != UNLIMITED).then_some(limit)
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    /// A slot for one more connection, held until the permit is dropped; the limit in
    /// force if there is none.
    pub fn try_take(self: &Arc<Self>) -> Result<TenantConnectionPermit, u64> {
        let limit = self.limit().unwrap_or(UNLIMITED);
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < limit).then_some(open + 1)
            })
            .map(|_| TenantConnectionPermit(Arc::clone(self)))
            .map_err(|_| limit)
    }
}

/// One open connection of a tenant; gives its slot back when dropped.
#[derive(Debug)]
pub struct TenantConnectionPermit(Arc<TenantConnections>);

impl Drop for TenantConnectionPermit {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenants_sandboxes_share_one_budget_and_others_are_apart() {
        let limits = TenantConnectionLimits::new(Some(2));
        let (a, b) = (TenantId::generate(), TenantId::generate());
        let (a1, a2) = (limits.of(&a), limits.of(&a));
        let p1 = a1.try_take().expect("first");
        let _p2 = a2.try_take().expect("second, from another sandbox");
        assert_eq!(a1.try_take().unwrap_err(), 2);
        assert_eq!(a2.open(), 2);
        let _other = limits.of(&b).try_take().expect("another tenant");
        drop(p1);
        assert_eq!(a1.open(), 1);
        let _p3 = a2.try_take().expect("a slot came back");
    }

    #[test]
    fn limits_change_under_open_connections() {
        let limits = TenantConnectionLimits::new(Some(3));
        let t = TenantId::generate();
        let budget = limits.of(&t);
        let held: Vec<_> = (0..3).map(|_| budget.try_take().unwrap()).collect();
        limits.set_own(&t, Some(Some(1)));
        assert_eq!(budget.limit(), Some(1));
        assert_eq!(
            budget.try_take().unwrap_err(),
            1,
            "open ones stay, new ones wait"
        );
        drop(held);
        let one = budget.try_take().expect("under the new limit");
        assert!(budget.try_take().is_err());
        // Unlimited on its own, then back to the default, which itself changes.
        limits.set_own(&t, Some(None));
        assert_eq!(budget.limit(), None);
        let _more: Vec<_> = (0..10).map(|_| budget.try_take().unwrap()).collect();
        limits.set_own(&t, None);
        limits.set_default(Some(20));
        assert_eq!(budget.limit(), Some(20));
        drop(one);
        assert_eq!(budget.open(), 10);
    }

    #[test]
    fn a_zero_limit_is_taken_as_one() {
        let budget = TenantConnections::unshared(Some(0));
        assert_eq!(budget.limit(), Some(1));
        let _p = budget.try_take().unwrap();
        assert!(budget.try_take().is_err());
    }
}
