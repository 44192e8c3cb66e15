//! The single-threaded core of the exact index: which worker holds which kvroute block, and the
//! per-worker map from engine block ids to where those blocks are stored.
//!
//! Layout (per (block, worker) pair, see `benches/index.rs` for measured bytes):
//! - [`Runs`]: every block once, along its chain, 12 bytes with the set of workers 0–31 holding
//!   it (shared by every worker holding it), plus one small table entry per run start.
//! - `workers[w].engine`: mixed engine id → the block's [`Loc`] packed in 32 bits, 12 bytes per
//!   pair; needed because BlockRemoved and the parent of BlockStored name blocks by the engine's
//!   opaque id. A location that does not pack (a run id beyond four million live runs) is kept
//!   aside in a map of its own.
//!   A location stays valid while the worker holds the block, so a removal goes straight to
//!   the block.
//!
//! Lookups walk the request's blocks in order through the runs, carrying the set of workers
//! that held every block so far, and stop when it is empty: exact for any holding pattern (a
//! worker that lost a middle block gets no credit past it).
//!
//! One worker may name the same block by two engine ids (identical tokens under different
//! engine keys, e.g. multimodal inputs kvroute cannot see). The extra names are counted in
//! `aliases`, so the worker keeps the block until its last name is removed.
//!
//! The number of pairs is the number of engine-map entries; `max_entries` bounds it. Eviction
//! sweeps the largest worker's engine map in key order, an unbiased victim order that needs
//! no per-entry recency field (recency would cost 8 bytes per pair; the engines' own
//! BlockRemoved events are the primary way entries leave, the bound is a safety net).

use std::collections::HashMap;
use std::mem::size_of;

use super::overlaps::Overlaps;
use super::runs::{Loc, Runs};
use super::table::{Table, mix};
use super::worker::{Bits, PAGE_WORKERS};
use crate::fleet::WorkerId;
use crate::kv_events::EngineHash;
use crate::tokens::BlockHash;

/// How many blocks ahead updates prefetch the engine map. The inserts of a run are independent,
/// so keeping several cache misses in flight hides most of their latency (measured: 16 was
/// slower than 8 on this machine).
const PREFETCH_AHEAD: usize = 8;

/// The engine-map value of a pair whose location does not pack: it is in [`BlockMap::aside`].
const ASIDE: u32 = u32::MAX;

#[derive(Default)]
struct WorkerBlocks {
    /// Mixed engine id → packed [`Loc`], or [`ASIDE`].
    engine: Table<u32>,
    /// Where the next eviction sweep of this worker starts.
    evict_hand: usize,
    /// Blocks the worker's KV cache holds, when known: its engine map is kept this large
    /// (see [`BlockMap::reserve`]).
    reserved: usize,
}

/// Which worker holds which block; not synchronised (see [`super::KvIndex`]).
#[derive(Default)]
pub(crate) struct BlockMap {
    runs: Runs,
    workers: Vec<WorkerBlocks>,
    /// (worker, block) pairs named by more than one engine id: how many extra names.
    aliases: HashMap<(WorkerId, Loc), u32>,
    /// Locations that do not pack into an engine-map value, by (worker, mixed engine id).
    aside: HashMap<(WorkerId, u64), Loc>,
    /// Total (block, worker) pairs: the sum of the engine maps' sizes.
    entries: usize,
}

/// What one mutation did, for the counters.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct Effect {
    pub(crate) added: u64,
    pub(crate) removed: u64,
    pub(crate) unknown: u64,
}

impl BlockMap {
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    /// Heap bytes of every table and run.
    pub(crate) fn heap_bytes(&self) -> usize {
        let engines: usize = self.workers.iter().map(|w| w.engine.heap_bytes()).sum();
        self.runs.heap_bytes()
            + engines
            + self.workers.capacity() * size_of::<WorkerBlocks>()
            + self.aliases.capacity() * size_of::<((WorkerId, Loc), u32)>()
            + self.aside.capacity() * size_of::<((WorkerId, u64), Loc)>()
    }

    fn worker_mut(&mut self, w: WorkerId) -> &mut WorkerBlocks {
        let i = w.0 as usize;
        if self.workers.len() <= i {
            self.workers.resize_with(i + 1, WorkerBlocks::default);
        }
        &mut self.workers[i]
    }

    /// Sizes `worker`'s engine map for `blocks` pairs (its KV cache capacity), now and after
    /// every clear; 0 forgets the reservation (the map then shrinks at the next clear).
    ///
    /// A cache that is in use fills up: engines evict only when they need room, so a warm
    /// worker's map reaches its capacity anyway. Sizing it up front spares the growth steps on
    /// the way there: each moves every entry into fresh memory under the write lock while
    /// lookups wait (on the index benchmark, growth was 19–21 ms of a 150–190 ms build).
    pub(crate) fn reserve(&mut self, worker: WorkerId, blocks: usize) {
        let wb = self.worker_mut(worker);
        wb.reserved = blocks;
        wb.engine.reserve(blocks);
    }

    /// The capacity reserved for all workers together.
    pub(crate) fn reserved_total(&self) -> usize {
        self.workers.iter().map(|w| w.reserved).sum()
    }

    /// The capacity reserved for `worker` (0 when unknown).
    pub(crate) fn reserved(&self, worker: WorkerId) -> usize {
        self.workers
            .get(worker.0 as usize)
            .map_or(0, |w| w.reserved)
    }

    /// Where the block `worker` stored under engine id `id` is.
    fn loc_of(&self, worker: WorkerId, id: EngineHash) -> Option<Loc> {
        let key = mix(id.0);
        match self.workers.get(worker.0 as usize)?.engine.get(key)? {
            ASIDE => self.aside.get(&(worker, key)).copied(),
            packed => Some(Loc::unpack(packed)),
        }
    }

    /// The location of an engine-map value just taken out of `worker`'s map under `key`.
    fn take_loc(
        aside: &mut HashMap<(WorkerId, u64), Loc>,
        worker: WorkerId,
        key: u64,
        value: u32,
    ) -> Option<Loc> {
        match value {
            ASIDE => aside.remove(&(worker, key)),
            packed => Some(Loc::unpack(packed)),
        }
    }

    /// The kvroute hash `worker` recorded for engine block `id`.
    pub(crate) fn kvroute_of(&self, worker: WorkerId, id: EngineHash) -> Option<BlockHash> {
        self.loc_of(worker, id).map(|l| self.runs.hash_at(l))
    }

    /// Records a run of `worker`'s blocks (engine ids and kvroute hashes, pairwise) continuing
    /// the block `worker` stored as `parent` (`None` for the start of a chain); returns how
    /// many pairs are new. The engine-map slots of later blocks are fetched while earlier ones
    /// are inserted: the inserts are independent, so their cache misses overlap.
    pub(crate) fn store_run(
        &mut self,
        worker: WorkerId,
        parent: Option<EngineHash>,
        ids: &[EngineHash],
        blocks: &[BlockHash],
    ) -> u64 {
        let mut at = parent.and_then(|p| self.loc_of(worker, p));
        let engine = &self.worker_mut(worker).engine;
        for id in ids.iter().take(PREFETCH_AHEAD) {
            engine.prefetch(mix(id.0));
        }
        let mut added = 0;
        for (i, (id, block)) in ids.iter().zip(blocks).enumerate() {
            if let Some(ahead) = ids.get(i + PREFETCH_AHEAD) {
                self.workers[worker.0 as usize]
                    .engine
                    .prefetch(mix(ahead.0));
            }
            let loc = self.runs.place(at, block.0, blocks.len() - i);
            added += u64::from(self.record(worker, *id, loc));
            at = Some(loc);
        }
        added
    }

    /// Records that `worker` holds the block at `loc` under engine id `id`; whether the pair
    /// is new.
    fn record(&mut self, worker: WorkerId, id: EngineHash, loc: Loc) -> bool {
        let key = mix(id.0);
        let packed = loc.pack();
        let old = self.workers[worker.0 as usize]
            .engine
            .insert(key, packed.unwrap_or(ASIDE))
            .and_then(|v| Self::take_loc(&mut self.aside, worker, key, v));
        if packed.is_none() {
            self.aside.insert((worker, key), loc);
        }
        match old {
            Some(old) if old == loc => false,
            old => {
                // Mark the new block before releasing anything: releasing may free runs, and
                // the new block's run must not look unused meanwhile.
                if !self.runs.set(loc, worker) {
                    *self.aliases.entry((worker, loc)).or_default() += 1;
                }
                match old {
                    // The engine reused an id for other content without removing it first:
                    // the old content is gone from its cache.
                    Some(old) => {
                        self.release(worker, old);
                        false
                    }
                    None => {
                        self.entries += 1;
                        true
                    }
                }
            }
        }
    }

    /// Drops one of `worker`'s names for the block at `loc`: the block itself once no name is
    /// left.
    fn release(&mut self, worker: WorkerId, loc: Loc) {
        if !self.aliases.is_empty()
            && let Some(n) = self.aliases.get_mut(&(worker, loc))
        {
            *n -= 1;
            if *n == 0 {
                self.aliases.remove(&(worker, loc));
            }
            return;
        }
        self.runs.unset(loc, worker);
    }

    /// Removes a run of `worker`'s engine ids, resolving them all first (prefetching ahead)
    /// and then releasing the blocks (prefetching ahead again).
    pub(crate) fn remove_run(&mut self, worker: WorkerId, ids: &[EngineHash]) -> Effect {
        let mut effect = Effect::default();
        let Some(wb) = self.workers.get_mut(worker.0 as usize) else {
            effect.unknown = ids.len() as u64;
            return effect;
        };
        let mut gone = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            if let Some(a) = ids.get(i + PREFETCH_AHEAD) {
                wb.engine.prefetch(mix(a.0));
            }
            let key = mix(id.0);
            match wb
                .engine
                .remove(key)
                .and_then(|v| Self::take_loc(&mut self.aside, worker, key, v))
            {
                Some(loc) => gone.push(loc),
                None => effect.unknown += 1,
            }
        }
        effect.removed = gone.len() as u64;
        self.entries -= gone.len();
        for l in gone.iter().take(PREFETCH_AHEAD) {
            self.runs.prefetch(*l);
        }
        for (i, loc) in gone.iter().enumerate() {
            if let Some(l) = gone.get(i + PREFETCH_AHEAD) {
                self.runs.prefetch(*l);
            }
            self.release(worker, *loc);
        }
        effect
    }

    /// Drops every entry of `worker`; returns how many.
    pub(crate) fn clear_worker(&mut self, worker: WorkerId) -> usize {
        let Some(wb) = self.workers.get_mut(worker.0 as usize) else {
            return 0;
        };
        let engine = std::mem::replace(&mut wb.engine, Table::with_capacity(wb.reserved));
        wb.evict_hand = 0;
        self.aliases.retain(|(w, _), _| *w != worker);
        let n = engine.len();
        for (key, value) in engine.iter() {
            if let Some(loc) = Self::take_loc(&mut self.aside, worker, key, value) {
                self.runs.unset(loc, worker);
            }
        }
        self.entries -= n;
        n
    }

    /// Evicts pairs until at most `target` remain, from the workers holding the most;
    /// returns how many were evicted.
    pub(crate) fn evict_to(&mut self, target: usize) -> usize {
        let mut evicted = 0;
        while self.entries > target {
            let Some(victim) =
                (0..self.workers.len()).max_by_key(|&i| self.workers[i].engine.len())
            else {
                break;
            };
            let worker = WorkerId(victim as u32);
            // Evict in small batches so the victim choice stays balanced across workers.
            let batch = (self.entries - target).min(64);
            for _ in 0..batch {
                let wb = &mut self.workers[victim];
                let Some((key, value, hand)) = wb.engine.remove_next(wb.evict_hand) else {
                    break;
                };
                wb.evict_hand = hand;
                self.entries -= 1;
                evicted += 1;
                if let Some(loc) = Self::take_loc(&mut self.aside, worker, key, value) {
                    self.release(worker, loc);
                }
            }
            if self.workers[victim].engine.is_empty() && self.entries > target {
                // Defensive: a worker with no entries cannot be the largest unless all are empty.
                break;
            }
        }
        evicted
    }

    /// Pages of [`PAGE_WORKERS`] workers that have ever held a block.
    fn pages(&self) -> usize {
        self.workers.len().div_ceil(PAGE_WORKERS as usize)
    }

    /// Per worker, the number of leading `blocks` it holds.
    ///
    /// One walk over the blocks, carrying per 32-worker page the set of workers that held
    /// every block so far and stopping when all are empty: exact for any holding pattern, and
    /// a request nobody holds costs a single probe.
    pub(crate) fn lookup(&self, blocks: &[BlockHash]) -> Overlaps {
        let mut out = Overlaps::new();
        self.runs.lookup(blocks, &mut out);
        out.sort();
        out
    }

    /// Per page, the holders of each leading block of `blocks` the index contains, however far
    /// that goes (not only while some worker holds every block so far).
    pub(crate) fn holders(&self, blocks: &[BlockHash]) -> Vec<Vec<Bits>> {
        (0..self.pages())
            .map(|page| self.runs.holders(blocks, page))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u64) -> BlockHash {
        BlockHash(0x1234_5678_9abc_def0 ^ i.wrapping_mul(0x2545_F491_4F6C_DD1D))
    }

    fn chain(n: u64) -> Vec<BlockHash> {
        (0..n).map(h).collect()
    }

    fn ids(base: u64, n: usize) -> Vec<EngineHash> {
        (0..n as u64).map(|i| EngineHash(base + i)).collect()
    }

    #[test]
    fn leading_blocks_stop_at_the_first_gap() {
        let mut m = BlockMap::default();
        let c = chain(10);
        m.store_run(WorkerId(0), None, &ids(0, 10), &c);
        m.store_run(WorkerId(1), None, &ids(100, 3), &c[..3]);
        m.store_run(WorkerId(1), Some(EngineHash(102)), &ids(104, 6), &c[4..]);
        let o = m.lookup(&c);
        assert_eq!(o.get(WorkerId(0)), 10);
        assert_eq!(o.get(WorkerId(1)), 3);
        assert_eq!(m.entries(), 19);
        assert_eq!(m.kvroute_of(WorkerId(1), EngineHash(105)), Some(c[5]));
    }

    #[test]
    fn workers_beyond_one_page_are_exact() {
        let mut m = BlockMap::default();
        let c = chain(5);
        for w in [0u32, 63, 64, 130] {
            let n = w as usize % 5 + 1;
            m.store_run(WorkerId(w), None, &ids(0, n), &c[..n]);
        }
        let o = m.lookup(&c);
        let got: Vec<_> = o.iter().map(|(w, n)| (w.0, n)).collect();
        assert_eq!(got, vec![(0, 1), (63, 4), (64, 5), (130, 1)]);
        let holders = m.holders(&c);
        assert_eq!(holders.len(), 5);
        assert_eq!((holders[1][3], holders[1][4]), (1 << 31, 0));
        assert_eq!(holders[2][4], 1);
        assert_eq!(holders[4][0], 1 << 2);
    }

    #[test]
    fn remove_and_clear_drop_entries_and_blocks() {
        let mut m = BlockMap::default();
        let c = chain(4);
        m.store_run(WorkerId(2), None, &ids(0, 4), &c);
        m.store_run(WorkerId(3), None, &ids(0, 4), &c);
        assert_eq!(m.remove_run(WorkerId(2), &[EngineHash(1)]).removed, 1);
        assert_eq!(m.remove_run(WorkerId(2), &[EngineHash(1)]).unknown, 1);
        assert_eq!(m.lookup(&c).get(WorkerId(2)), 1);
        assert_eq!(m.clear_worker(WorkerId(3)), 4);
        assert_eq!(m.lookup(&c).get(WorkerId(3)), 0);
        assert_eq!(m.entries(), 3);
        m.clear_worker(WorkerId(2));
        assert_eq!(m.runs.len(), 0);
        assert_eq!(m.runs.blocks(), 0);
    }

    #[test]
    fn a_block_named_twice_stays_until_both_names_go() {
        let mut m = BlockMap::default();
        let c = chain(3);
        m.store_run(WorkerId(0), None, &ids(0, 3), &c);
        // The same content again under new engine ids.
        m.store_run(WorkerId(0), None, &ids(10, 3), &c);
        assert_eq!(m.entries(), 6);
        m.remove_run(WorkerId(0), &ids(0, 3));
        assert_eq!(m.lookup(&c).get(WorkerId(0)), 3);
        m.remove_run(WorkerId(0), &ids(10, 3));
        assert_eq!(m.lookup(&c).get(WorkerId(0)), 0);
        assert!(m.aliases.is_empty());
        assert_eq!(m.runs.blocks(), 0);
    }

    #[test]
    fn a_reused_engine_id_moves_to_the_new_content() {
        let mut m = BlockMap::default();
        let c = chain(4);
        m.store_run(WorkerId(0), None, &ids(0, 2), &c[..2]);
        // Id 1 now names block 2 (block 1 was dropped without a BlockRemoved).
        m.store_run(WorkerId(0), Some(EngineHash(0)), &[EngineHash(1)], &[c[2]]);
        assert_eq!(m.entries(), 2);
        assert_eq!(m.kvroute_of(WorkerId(0), EngineHash(1)), Some(c[2]));
        assert_eq!(m.lookup(&c).get(WorkerId(0)), 1);
    }

    #[test]
    fn locations_that_do_not_pack_are_kept_aside() {
        // Unit tests pack run ids in 5 bits: chains beyond the 30th run are kept aside.
        let mut m = BlockMap::default();
        let chains: Vec<Vec<BlockHash>> = (0..40u64)
            .map(|c| (0..3).map(|i| h(c << 20 | i)).collect())
            .collect();
        for (c, blocks) in chains.iter().enumerate() {
            m.store_run(WorkerId(1), None, &ids(c as u64 * 10, 3), blocks);
        }
        assert!(!m.aside.is_empty());
        assert_eq!(m.entries(), 120);
        for (c, blocks) in chains.iter().enumerate() {
            assert_eq!(m.lookup(blocks).get(WorkerId(1)), 3);
            let id = EngineHash(c as u64 * 10 + 2);
            assert_eq!(m.kvroute_of(WorkerId(1), id), Some(blocks[2]));
        }
        // A parent kept aside is found; an id reused for other content moves.
        m.store_run(
            WorkerId(1),
            Some(EngineHash(392)),
            &[EngineHash(500)],
            &[h(7777)],
        );
        let mut longer = chains[39].clone();
        longer.push(h(7777));
        assert_eq!(m.lookup(&longer).get(WorkerId(1)), 4);
        for c in (0..40u64).step_by(2) {
            m.remove_run(WorkerId(1), &ids(c * 10, 3));
        }
        assert_eq!(m.evict_to(30), 31);
        assert_eq!(m.entries(), 30);
        assert_eq!(m.clear_worker(WorkerId(1)), 30);
        assert!(m.aside.is_empty());
        assert_eq!(m.runs.blocks(), 0);
    }

    #[test]
    fn a_chain_longer_than_a_run_continues_in_the_next() {
        let mut m = BlockMap::default();
        let n = 3 * super::super::runs::MAX_RUN + 5;
        let c = chain(n as u64);
        m.store_run(WorkerId(0), None, &ids(0, n), &c);
        m.store_run(WorkerId(2), None, &ids(0, n - 1), &c[..n - 1]);
        let o = m.lookup(&c);
        assert_eq!(
            (o.get(WorkerId(0)), o.get(WorkerId(2))),
            (n as u32, n as u32 - 1)
        );
        m.remove_run(WorkerId(0), &ids(0, n));
        m.remove_run(WorkerId(2), &ids(0, n - 1));
        assert_eq!((m.entries(), m.runs.blocks(), m.runs.len()), (0, 0, 0));
    }

    #[test]
    fn eviction_takes_from_the_largest_worker() {
        let mut m = BlockMap::default();
        let c = chain(100);
        m.store_run(WorkerId(0), None, &ids(0, 100), &c);
        m.store_run(WorkerId(1), None, &ids(0, 10), &c[..10]);
        assert_eq!(m.evict_to(60), 50);
        assert_eq!(m.entries(), 60);
        assert_eq!(m.workers[0].engine.len(), 50);
        assert_eq!(m.workers[1].engine.len(), 10);
        let held0 = m.holders(&c)[0]
            .iter()
            .filter(|b| **b & WorkerId(0).bit() != 0)
            .count();
        assert_eq!(held0, 50);
    }
}
