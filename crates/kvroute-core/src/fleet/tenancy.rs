//! Which tenants have requests in flight on one target, and how many: what placement isolation
//! (`routing::isolation`) reads to keep a tenant over its fair share on the workers it already
//! occupies and the others' requests off them.
//!
//! Counted by this router only (like [`super::Load`]'s own counters): another replica's
//! requests, learned from the replica bus, carry no tenant. A count changes only through an
//! [`Occupancy`], released when dropped, so an error, a retry or a client that hangs up cannot
//! leave a tenant on a worker it left (a leaked count would confine it there for ever).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// Requests in flight per tenant on one target.
#[derive(Debug, Default)]
pub struct Tenancy {
    counts: Mutex<HashMap<Arc<str>, u32>>,
}

/// Requests in flight per tenant, as read at one instant.
pub type Occupants = Vec<(Arc<str>, u32)>;

impl Tenancy {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, u32>> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one request of `tenant` here until the returned guard is dropped.
    pub fn occupy(self: &Arc<Self>, tenant: &Arc<str>) -> Occupancy {
        *self.lock().entry(Arc::clone(tenant)).or_insert(0) += 1;
        Occupancy {
            tenancy: Arc::clone(self),
            tenant: Arc::clone(tenant),
        }
    }

    /// Requests of `tenant` in flight here.
    pub fn count(&self, tenant: &str) -> u32 {
        self.lock().get(tenant).copied().unwrap_or(0)
    }

    /// Every tenant with requests in flight here, with its count (in no particular order).
    pub fn occupants(&self) -> Occupants {
        self.lock()
            .iter()
            .map(|(t, n)| (Arc::clone(t), *n))
            .collect()
    }
}

/// One request of a tenant counted on a target; uncounted when dropped.
#[derive(Debug)]
pub struct Occupancy {
    tenancy: Arc<Tenancy>,
    tenant: Arc<str>,
}

impl Drop for Occupancy {
    fn drop(&mut self) {
        let mut counts = self.tenancy.lock();
        if let Some(n) = counts.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_occupancy_counts_until_dropped_and_empty_tenants_leave() {
        let t = Arc::new(Tenancy::default());
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let a1 = t.occupy(&a);
        let a2 = t.occupy(&a);
        let b1 = t.occupy(&b);
        assert_eq!((t.count("a"), t.count("b"), t.count("c")), (2, 1, 0));
        drop(a1);
        assert_eq!(t.count("a"), 1);
        drop((a2, b1));
        assert!(t.occupants().is_empty(), "{:?}", t.occupants());
    }
}
