//! Approximate holdings: what the router predicts a worker caches because it routed a request
//! there, for workers that publish no KV events (and, alongside events, for requests still in
//! prefill, whose blocks the engine has not announced yet).
//!
//! A prediction is only a guess (the engine may evict, or never finish the prefill), so each
//! one expires after a TTL and each worker keeps at most `capacity` predicted blocks, dropping
//! the oldest first. Time is passed in, never read, so `sim` drives it in virtual time.

use std::collections::VecDeque;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use super::overlaps::Overlaps;
use super::table::Table;
use crate::fleet::WorkerId;
use crate::tokens::BlockHash;

/// Configuration of an [`ApproxIndex`].
#[derive(Clone, Debug)]
pub struct ApproxConfig {
    /// How long a routed block is assumed to stay cached.
    pub ttl: Duration,
    /// Most predicted blocks kept per worker (oldest dropped first).
    pub capacity_per_worker: usize,
}

impl Default for ApproxConfig {
    fn default() -> Self {
        ApproxConfig {
            ttl: Duration::from_secs(120),
            capacity_per_worker: 1 << 16,
        }
    }
}

/// Predicted blocks of one worker.
#[derive(Default)]
struct Predicted {
    /// Block hash → expiry (nanoseconds on the caller's clock).
    expiry: Table<u64>,
    /// Blocks in recording order with the expiry they were recorded with; an entry whose
    /// expiry no longer matches the table was re-recorded later and is stale.
    order: VecDeque<(u64, u64)>,
    /// The worker's KV cache size in blocks, when known: it cannot hold more.
    cache_blocks: Option<usize>,
}

impl Predicted {
    fn record(&mut self, blocks: &[BlockHash], expires: u64, capacity: usize) {
        // Recorded in order and dropped oldest first, only the last `capacity` blocks could
        // stay; the earlier ones are never inserted, so a prompt far longer than the capacity
        // (a 32 MiB body of one-digit ids is a million blocks) costs the table its capacity, not
        // the prompt's length (the table keeps the room it once grew to).
        let blocks = &blocks[blocks.len().saturating_sub(capacity)..];
        for b in blocks {
            self.expiry.insert(b.0, expires);
            self.order.push_back((b.0, expires));
        }
        while self.expiry.len() > capacity {
            if !self.pop_oldest() {
                break;
            }
        }
        // Re-recorded blocks leave stale queue entries; compact before they dominate.
        if self.order.len() > 2 * capacity + 64 {
            let expiry = &self.expiry;
            self.order.retain(|(k, e)| expiry.get(*k) == Some(*e));
        }
    }

    /// Drops the oldest live entry; `false` when the queue is empty.
    fn pop_oldest(&mut self) -> bool {
        while let Some((k, e)) = self.order.pop_front() {
            if self.expiry.get(k) == Some(e) {
                self.expiry.remove(k);
                return true;
            }
        }
        false
    }

    fn expire(&mut self, now: u64) {
        while let Some(&(k, e)) = self.order.front() {
            if e > now {
                break;
            }
            self.order.pop_front();
            if self.expiry.get(k) == Some(e) {
                self.expiry.remove(k);
            }
        }
    }

    fn holds(&self, block: BlockHash, now: u64) -> bool {
        self.expiry.get(block.0).is_some_and(|e| e > now)
    }
}

fn nanos(t: Duration) -> u64 {
    u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)
}

/// Blocks the router predicts workers hold because it routed requests to them.
#[derive(Default)]
pub struct ApproxIndex {
    config: ApproxConfig,
    workers: RwLock<Workers>,
}

/// Every worker's predictions, and which workers have any: a lookup visits only those, so a
/// fleet of 1,024 event-fed workers (which have none) costs it a scan of 16 words.
#[derive(Default)]
struct Workers {
    all: Vec<Predicted>,
    /// Bit `i` is set while worker `i` has predictions.
    nonempty: Vec<u64>,
}

impl Workers {
    /// Worker `i`'s predictions, made room for.
    fn get_mut(&mut self, i: usize) -> &mut Predicted {
        if self.all.len() <= i {
            self.all.resize_with(i + 1, Predicted::default);
            self.nonempty.resize(self.all.len().div_ceil(64), 0);
        }
        &mut self.all[i]
    }

    /// Brings worker `i`'s bit in line with its predictions after a change.
    fn mark(&mut self, i: usize) {
        if let Some(p) = self.all.get(i) {
            let bit = 1u64 << (i % 64);
            if p.expiry.is_empty() {
                self.nonempty[i / 64] &= !bit;
            } else {
                self.nonempty[i / 64] |= bit;
            }
        }
    }

    /// The workers with predictions, lowest first.
    fn nonempty(&self) -> impl Iterator<Item = (usize, &Predicted)> + '_ {
        self.nonempty
            .iter()
            .enumerate()
            .flat_map(move |(w, &word)| {
                let mut bits = word;
                std::iter::from_fn(move || {
                    if bits == 0 {
                        return None;
                    }
                    let i = w * 64 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    Some((i, &self.all[i]))
                })
            })
    }
}

impl ApproxIndex {
    /// An empty set of predictions.
    pub fn new(config: ApproxConfig) -> Self {
        ApproxIndex {
            config,
            workers: RwLock::default(),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Workers> {
        self.workers.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Workers> {
        self.workers.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that a request with `blocks` was routed to `worker` at `now` (any monotonic
    /// clock, as a duration since its epoch). Also expires old predictions of that worker.
    pub fn record_routed(&self, worker: WorkerId, blocks: &[BlockHash], now: Duration) {
        let now = nanos(now);
        let expires = now.saturating_add(nanos(self.config.ttl));
        let mut workers = self.write();
        let i = worker.0 as usize;
        let p = workers.get_mut(i);
        let capacity = p.cache_blocks.map_or(self.config.capacity_per_worker, |c| {
            c.min(self.config.capacity_per_worker)
        });
        p.expire(now);
        p.record(blocks, expires, capacity);
        workers.mark(i);
    }

    /// Caps `worker`'s predictions at its KV cache size in blocks (read from its metrics), when
    /// that is below the configured capacity: an engine cannot keep more than its cache holds,
    /// so older predictions beyond it are likely evicted already. Kept across clears.
    pub fn set_cache_blocks(&self, worker: WorkerId, blocks: usize) {
        let mut workers = self.write();
        let i = worker.0 as usize;
        let p = workers.get_mut(i);
        p.cache_blocks = Some(blocks);
        while p.expiry.len() > blocks.min(self.config.capacity_per_worker) {
            if !p.pop_oldest() {
                break;
            }
        }
        workers.mark(i);
    }

    /// Drops every prediction of `worker`.
    pub fn clear_worker(&self, worker: WorkerId) {
        let mut workers = self.write();
        if let Some(p) = workers.all.get_mut(worker.0 as usize) {
            *p = Predicted {
                cache_blocks: p.cache_blocks,
                ..Predicted::default()
            };
        }
        workers.mark(worker.0 as usize);
    }

    /// Forgets `worker` entirely, its cache size too: it left the fleet, and its number may
    /// later name another worker.
    pub fn remove_worker(&self, worker: WorkerId) {
        let mut workers = self.write();
        if let Some(p) = workers.all.get_mut(worker.0 as usize) {
            *p = Predicted::default();
        }
        workers.mark(worker.0 as usize);
    }

    /// Predicted blocks currently kept for `worker`, including expired ones: those are dropped
    /// when the worker is next routed to (memory stays bounded by the capacity meanwhile).
    pub fn len(&self, worker: WorkerId) -> usize {
        self.read()
            .all
            .get(worker.0 as usize)
            .map_or(0, |p| p.expiry.len())
    }

    /// Per worker, the number of leading `blocks` predicted to be held at `now`.
    pub fn lookup(&self, blocks: &[BlockHash], now: Duration) -> Overlaps {
        self.lookup_with(blocks, now, Overlaps::new(), |_, _| false)
    }

    /// Per worker, the leading blocks held by the union of `exact` holdings (counts from an
    /// exact lookup, with `exact_holds(worker, i)` answering whether the worker holds block
    /// `i` beyond them) and predictions.
    pub(crate) fn lookup_with(
        &self,
        blocks: &[BlockHash],
        now: Duration,
        exact: Overlaps,
        exact_holds: impl Fn(WorkerId, usize) -> bool,
    ) -> Overlaps {
        let now = nanos(now);
        let mut out = exact;
        for (i, p) in self.read().nonempty() {
            let w = WorkerId(i as u32);
            // `out` holds the exact count until this worker is raised, below.
            let mut n = out.get(w) as usize;
            while let Some(b) = blocks.get(n) {
                if !(p.holds(*b, now) || exact_holds(w, n)) {
                    break;
                }
                n += 1;
            }
            out.raise(w, n as u32);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(start: u64, n: u64) -> Vec<BlockHash> {
        (start..start + n)
            .map(|i| BlockHash(i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1))
            .collect()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn index(ttl: Duration, capacity_per_worker: usize) -> ApproxIndex {
        ApproxIndex::new(ApproxConfig {
            ttl,
            capacity_per_worker,
        })
    }

    #[test]
    fn routed_blocks_count_as_leading_until_the_ttl() {
        let a = index(secs(10), 1000);
        let req = blocks(0, 8);
        a.record_routed(WorkerId(3), &req[..5], secs(100));
        assert_eq!(a.lookup(&req, secs(105)).get(WorkerId(3)), 5);
        assert_eq!(a.lookup(&req, secs(105)).get(WorkerId(0)), 0);
        assert_eq!(a.lookup(&req, secs(110)).get(WorkerId(3)), 0);
    }

    #[test]
    fn re_routing_refreshes_the_ttl() {
        let a = index(secs(10), 1000);
        let req = blocks(0, 4);
        a.record_routed(WorkerId(0), &req, secs(0));
        a.record_routed(WorkerId(0), &req, secs(8));
        // The first recording's queue entries expire at 10 but must not drop the refreshed ones.
        a.record_routed(WorkerId(0), &blocks(100, 1), secs(12));
        assert_eq!(a.lookup(&req, secs(15)).get(WorkerId(0)), 4);
        assert_eq!(a.lookup(&req, secs(18)).get(WorkerId(0)), 0);
    }

    #[test]
    fn a_prompt_longer_than_the_capacity_keeps_its_last_blocks_only() {
        let idx = index(Duration::from_secs(60), 4);
        let w = WorkerId(0);
        idx.record_routed(w, &[BlockHash(100)], Duration::ZERO);
        let long: Vec<BlockHash> = (0..1000).map(BlockHash).collect();
        idx.record_routed(w, &long, Duration::from_secs(1));
        let p = &idx.read().all[0];
        assert_eq!(p.expiry.len(), 4);
        assert!(p.order.len() <= 4, "only the survivors were queued");
        for b in 996..1000 {
            assert!(p.holds(BlockHash(b), 0));
        }
        assert!(!p.holds(BlockHash(100), 0));
        assert!(!p.holds(BlockHash(995), 0));
    }

    #[test]
    fn capacity_drops_the_oldest_predictions() {
        let a = index(secs(1000), 10);
        let old = blocks(0, 6);
        let new = blocks(50, 6);
        a.record_routed(WorkerId(1), &old, secs(1));
        a.record_routed(WorkerId(1), &new, secs(2));
        assert_eq!(a.len(WorkerId(1)), 10);
        assert_eq!(a.lookup(&new, secs(3)).get(WorkerId(1)), 6);
        // The two oldest blocks went first, so the old request lost its leading blocks.
        assert_eq!(a.lookup(&old, secs(3)).get(WorkerId(1)), 0);
        assert_eq!(a.lookup(&old[2..], secs(3)).get(WorkerId(1)), 4);
    }

    #[test]
    fn a_known_cache_size_below_the_capacity_caps_predictions() {
        let a = index(secs(1000), 10);
        let old = blocks(0, 6);
        a.record_routed(WorkerId(1), &old, secs(1));
        a.set_cache_blocks(WorkerId(1), 4);
        // Shrunk at once, oldest first, and the cap holds for new predictions and clears.
        assert_eq!(a.len(WorkerId(1)), 4);
        assert_eq!(a.lookup(&old[2..], secs(2)).get(WorkerId(1)), 4);
        a.clear_worker(WorkerId(1));
        a.record_routed(WorkerId(1), &blocks(50, 6), secs(3));
        assert_eq!(a.len(WorkerId(1)), 4);
        // A cache larger than the configured capacity does not raise it.
        a.set_cache_blocks(WorkerId(2), 1_000);
        a.record_routed(WorkerId(2), &blocks(100, 20), secs(3));
        assert_eq!(a.len(WorkerId(2)), 10);
    }

    #[test]
    fn leading_blocks_only() {
        let a = ApproxIndex::new(ApproxConfig::default());
        let req = blocks(0, 6);
        a.record_routed(WorkerId(0), &[req[0], req[1], req[3]], secs(0));
        assert_eq!(a.lookup(&req, secs(1)).get(WorkerId(0)), 2);
    }

    #[test]
    fn clear_worker_forgets_predictions() {
        let a = ApproxIndex::new(ApproxConfig::default());
        let req = blocks(0, 3);
        a.record_routed(WorkerId(2), &req, secs(0));
        a.clear_worker(WorkerId(2));
        assert!(a.lookup(&req, secs(0)).is_empty());
    }
}
