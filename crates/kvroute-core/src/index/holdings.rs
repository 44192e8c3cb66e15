//! Exact and approximate holdings together: what a routing decision asks.

use std::cell::OnceCell;
use std::sync::Arc;
use std::time::Duration;

use super::approx::ApproxIndex;
use super::exact::KvIndex;
use super::overlaps::Overlaps;
use super::prefix_rates::PrefixRates;
use super::residency::Residency;
use super::sessions::SessionHomes;
use crate::fleet::WorkerId;
use crate::tokens::BlockHash;

/// The exact, event-fed index and the approximate predictions, looked up as one.
///
/// A worker holds a block if either says so: events describe what the engine cached,
/// predictions cover workers without events and requests still in prefill.
#[derive(Default)]
pub struct Holdings {
    /// Event-fed holdings (shared by the simulator's router replicas, which hear the same
    /// events: [`Holdings::beside`]).
    pub exact: Arc<KvIndex>,
    /// Predictions from routing decisions.
    pub approx: ApproxIndex,
    /// Each worker's working set, touched by admissions.
    pub residency: Residency,
    /// The homes of the sessions clients named (affinity hints).
    pub sessions: SessionHomes,
    /// Arrivals per second by prefix, counted at admission (`prefix_rates`).
    pub prefix_rates: PrefixRates,
}

impl Holdings {
    /// Both indexes.
    pub fn new(exact: KvIndex, approx: ApproxIndex) -> Self {
        Holdings {
            exact: Arc::new(exact),
            approx,
            residency: Residency::default(),
            sessions: SessionHomes::default(),
            prefix_rates: PrefixRates::default(),
        }
    }

    /// Holdings of another router replica over the same KV events: this one's exact index,
    /// shared (every replica subscribes to every engine's stream, so theirs are the same),
    /// with its own `approx` predictions, working sets, session homes and prefix rates, which
    /// only its own decisions (and, over a replica bus, the others' bookings) feed.
    pub fn beside(&self, approx: ApproxIndex) -> Self {
        Holdings {
            exact: Arc::clone(&self.exact),
            approx,
            residency: Residency::new(self.residency.config()),
            sessions: SessionHomes::default(),
            prefix_rates: PrefixRates::default(),
        }
    }

    /// A request with chained block `hashes` was admitted on `worker` (a cache of `capacity`
    /// blocks, when known) at `now`, by this router or, heard over the replica bus, by
    /// another: its blocks are the worker's most recently used, and it is an arrival for each
    /// of its prefixes.
    pub fn admitted(
        &self,
        worker: WorkerId,
        hashes: &[BlockHash],
        now: Duration,
        capacity: Option<u64>,
    ) {
        self.residency.touch(worker, hashes, now, capacity);
        self.prefix_rates.arrive(hashes, now);
    }

    /// Drops everything known of what `worker` holds, exact and predicted: it went down, and a
    /// replica that comes back is a new process with a cold cache. Its KV capacity is kept.
    pub fn clear_worker(&self, worker: WorkerId) {
        self.exact.clear_worker(worker);
        self.approx.clear_worker(worker);
        self.residency.clear_worker(worker);
        self.sessions.clear_worker(worker);
    }

    /// Forgets `worker` entirely (entries, predictions, reserved room, capacity): it left the
    /// fleet, and its number may later name another worker.
    pub fn remove_worker(&self, worker: WorkerId) {
        self.exact.remove_worker(worker);
        self.approx.remove_worker(worker);
        self.residency.clear_worker(worker);
        self.sessions.clear_worker(worker);
    }

    /// Per worker, the leading `blocks` held by the union of exact and predicted holdings.
    pub fn lookup(&self, blocks: &[BlockHash], now: Duration) -> Overlaps {
        let exact = self.exact.lookup(blocks);
        // Who holds the blocks past each worker's exact count is asked only when a worker
        // has predictions to merge, and then once for all of them.
        let holders = OnceCell::new();
        let mut overlaps = self.approx.lookup_with(blocks, now, exact, |w, i| {
            holders
                .get_or_init(|| self.exact.holders(blocks))
                .holds(w, i)
        });
        // Past each worker's GPU prefix, what it can load from host memory or disk.
        let lower = self.exact.lower(blocks, |w| overlaps.get(w));
        overlaps.set_lower(lower);
        overlaps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{ApproxConfig, IndexConfig};
    use crate::kv_events::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent};
    use crate::tokens::{HashSeed, block_hashes};

    fn seeds(_: Option<&str>, _: Option<&str>) -> HashSeed {
        HashSeed::new("m", None, None)
    }

    fn batch(e: KvEvent) -> EventBatch {
        EventBatch {
            ts: 0.0,
            events: vec![e],
            dp_rank: None,
        }
    }

    #[test]
    fn a_predicted_block_bridges_a_gap_in_the_exact_holdings() {
        let w = WorkerId(1);
        let tokens: Vec<u32> = (0..8 * 16).collect();
        let exact = KvIndex::new(IndexConfig::default());
        let stored = BlockStored {
            block_hashes: (0..8).map(EngineHash).collect(),
            token_ids: tokens.clone(),
            block_size: 16,
            ..BlockStored::default()
        };
        exact.apply(w, &batch(KvEvent::Stored(stored)), &seeds);
        let removed = BlockRemoved {
            block_hashes: vec![EngineHash(4)],
            ..BlockRemoved::default()
        };
        exact.apply(w, &batch(KvEvent::Removed(removed)), &seeds);
        let h = Holdings::new(
            exact,
            ApproxIndex::new(ApproxConfig {
                ttl: Duration::from_secs(30),
                capacity_per_worker: 100,
            }),
        );
        let blocks = block_hashes(seeds(None, None), &tokens, 16);
        assert_eq!(h.lookup(&blocks, Duration::from_secs(1)).get(w), 4);
        // Block 4 is being prefilled there again: with it, blocks 5..8 count too.
        h.approx
            .record_routed(w, &blocks[4..5], Duration::from_secs(1));
        assert_eq!(h.lookup(&blocks, Duration::from_secs(2)).get(w), 8);
    }
}
