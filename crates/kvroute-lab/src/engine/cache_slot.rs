//! Where an engine's KV cache lives: its own, or one cache several engines share.
//!
//! Every engine owns its cache, as a GPU's memory is its own. The simulator's pooled-fleet
//! reference (`sim::pooled_fleet`) gives the fleet's engines one cache instead: each engine
//! still schedules, batches and queues its own requests, but any engine hits what any other
//! computed and room is the fleet's. That is what partitioned caches cost a fleet, measured
//! with the queueing a real fleet has (the pooled-cache reference has none). The shared cache
//! sits behind a mutex so an engine stays `Send` (the HTTP face moves it between threads); the
//! simulator steps engines one at a time, so the lock is never contended.

use std::sync::{Arc, Mutex, MutexGuard};

use super::kv_cache::KvCache;

/// An engine's KV cache.
// One per engine, built once and never moved on a hot path: boxing the common variant would
// only add an indirection to every cache access.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum CacheSlot {
    /// The engine's own cache.
    Own(KvCache),
    /// A cache shared with other engines.
    Pooled(Arc<Mutex<KvCache>>),
}

/// A cache several engines share.
pub type PooledCache = Arc<Mutex<KvCache>>;

impl CacheSlot {
    /// Runs `f` on the cache.
    pub fn with<R>(&mut self, f: impl FnOnce(&mut KvCache) -> R) -> R {
        match self {
            CacheSlot::Own(cache) => f(cache),
            CacheSlot::Pooled(shared) => f(&mut lock(shared)),
        }
    }

    /// Runs `f` on the cache, reading only.
    pub fn read<R>(&self, f: impl FnOnce(&KvCache) -> R) -> R {
        match self {
            CacheSlot::Own(cache) => f(cache),
            CacheSlot::Pooled(shared) => f(&lock(shared)),
        }
    }
}

/// The shared cache, whatever another engine's panic left behind: a cache is consistent
/// between calls, and a reference run must not be lost to a poisoned lock.
fn lock(shared: &Mutex<KvCache>) -> MutexGuard<'_, KvCache> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_sharing_a_slot_see_one_cache() {
        let shared: PooledCache = Arc::new(Mutex::new(KvCache::new(8, 4)));
        let mut a = CacheSlot::Pooled(shared.clone());
        let mut b = CacheSlot::Pooled(shared);
        let mut own = CacheSlot::Own(KvCache::new(8, 4));
        // A reset through one slot is an event of the cache the other reads.
        assert!(a.with(KvCache::reset_prefix_cache));
        assert_eq!(b.with(KvCache::take_events).len(), 1);
        assert!(
            a.with(KvCache::take_events).is_empty(),
            "taken through the other"
        );
        assert!(own.with(KvCache::take_events).is_empty());
        assert_eq!(b.read(KvCache::block_size), 4);
    }
}
