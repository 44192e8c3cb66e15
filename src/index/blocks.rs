//! The single-threaded core of the exact index: which worker holds which kvroute block, and the
//! per-worker map from engine block ids to kvroute hashes.
//!
//! Layout (per (block, worker) pair, see `benches/index.rs` for measured bytes):
//! - `pages[p]`: kvroute hash → set of workers `32p..32p+31` holding it. One 12-byte slot
//!   (12.8 bytes with its share of a 64-byte bucket) per block, shared by every worker holding it, so with ≤ 32 workers a lookup makes one probe
//!   per block.
//! - `workers[w].engine`: mixed engine id → kvroute hash, 16 bytes per pair; needed because
//!   BlockRemoved and the parent of BlockStored name blocks by the engine's opaque id.
//!
//! Lookups scan the request's blocks in order, carrying the set of workers that held every
//! block so far, and stop when it is empty. That is exact for any holding pattern (a worker
//! that lost a middle block gets no credit past it). A binary search for the longest held
//! prefix would need the prefix to be closed under "parent held", which removals of non-leaf
//! blocks and our own eviction break; detecting that exactly needs a parent link per block
//! (+8 bytes), so the scan instead keeps its probes cheap: hashes are known up front, so the
//! slots of later blocks are prefetched while earlier ones are compared.
//!
//! Two engine ids of one worker that map to the same kvroute block (identical tokens under
//! different engine keys, e.g. multimodal inputs kvroute cannot see) share one bit: removing
//! either clears it. The cost is a missed hit, never a false one.
//!
//! The number of pairs is the number of engine-map entries; `max_entries` bounds it. Eviction
//! sweeps the largest worker's engine map in key order, an unbiased victim order that needs
//! no per-entry recency field (recency would cost 8 bytes per pair; the engines' own
//! BlockRemoved events are the primary way entries leave, the bound is a safety net).

use super::overlaps::Overlaps;
use super::table::{Table, mix};
use super::worker::{Bits, PAGE_WORKERS, WorkerIdx, workers_in};
use crate::kv_events::EngineHash;
use crate::tokens::BlockHash;

/// How many blocks ahead updates prefetch table buckets. The inserts of a run are independent,
/// so keeping several cache misses in flight hides most of their latency; measured 16 was
/// slower than 8 or 4 (two tables × 16 lines overfill the CPU's outstanding-miss slots).
const PREFETCH_AHEAD: usize = 8;
/// How many blocks ahead lookups prefetch (measured: 8 and 32 were slower on this machine).
const LOOKUP_AHEAD: usize = 16;
/// Buckets (cache lines) prefetched per insertion or removal: one holds nearly every probe.
const UPDATE_LINES: usize = 1;

#[derive(Clone, Default)]
struct WorkerBlocks {
    /// Mixed engine id → kvroute hash.
    engine: Table<u64>,
    /// Where the next eviction sweep of this worker starts.
    evict_hand: usize,
}

/// Which worker holds which block; not synchronised (see [`super::KvIndex`]).
#[derive(Clone, Default)]
pub(crate) struct BlockMap {
    pages: Vec<Table<Bits>>,
    workers: Vec<WorkerBlocks>,
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

    /// Heap bytes of every table.
    pub(crate) fn heap_bytes(&self) -> usize {
        let pages: usize = self.pages.iter().map(Table::heap_bytes).sum();
        let engines: usize = self.workers.iter().map(|w| w.engine.heap_bytes()).sum();
        pages + engines + self.workers.capacity() * std::mem::size_of::<WorkerBlocks>()
    }

    fn worker_mut(&mut self, w: WorkerIdx) -> &mut WorkerBlocks {
        let i = w.0 as usize;
        if self.workers.len() <= i {
            self.workers.resize_with(i + 1, WorkerBlocks::default);
        }
        &mut self.workers[i]
    }

    /// The kvroute hash `worker` recorded for engine block `id`.
    pub(crate) fn kvroute_of(&self, worker: WorkerIdx, id: EngineHash) -> Option<BlockHash> {
        self.workers
            .get(worker.0 as usize)?
            .engine
            .get(mix(id.0))
            .map(BlockHash)
    }

    /// Whether `worker` holds `block`.
    pub(crate) fn holds(&self, worker: WorkerIdx, block: BlockHash) -> bool {
        self.pages
            .get(worker.page())
            .and_then(|t| t.get(block.0))
            .is_some_and(|bits| bits & worker.bit() != 0)
    }

    /// Records that `worker` holds `block` under engine id `id`.
    pub(crate) fn store(&mut self, worker: WorkerIdx, id: EngineHash, block: BlockHash) -> Effect {
        let mut effect = Effect::default();
        match self.worker_mut(worker).engine.insert(mix(id.0), block.0) {
            None => {
                self.entries += 1;
                effect.added = 1;
            }
            // The engine reused an id for other content without removing it first: the old
            // content is gone from its cache.
            Some(old) if old != block.0 => self.unset(worker, BlockHash(old)),
            Some(_) => {}
        }
        let page = worker.page();
        if self.pages.len() <= page {
            self.pages.resize_with(page + 1, Table::default);
        }
        self.pages[page].upsert(block.0, |bits| bits | worker.bit());
        effect
    }

    /// Records a run of `worker`'s blocks (engine ids and kvroute hashes, pairwise), fetching
    /// the table slots of later blocks while earlier ones are inserted: the inserts are
    /// independent, so their cache misses overlap instead of adding up.
    pub(crate) fn store_run(
        &mut self,
        worker: WorkerIdx,
        ids: &[EngineHash],
        blocks: &[BlockHash],
    ) -> u64 {
        let page = worker.page();
        if self.pages.len() <= page {
            self.pages.resize_with(page + 1, Table::default);
        }
        self.worker_mut(worker);
        // The first blocks of the run are fetched up front; the loop fetches the rest ahead.
        for (id, block) in ids.iter().zip(blocks).take(PREFETCH_AHEAD) {
            self.workers[worker.0 as usize]
                .engine
                .prefetch(mix(id.0), UPDATE_LINES);
            self.pages[page].prefetch(block.0, UPDATE_LINES);
        }
        let mut added = 0;
        for (i, (id, block)) in ids.iter().zip(blocks).enumerate() {
            if let (Some(a), Some(b)) =
                (ids.get(i + PREFETCH_AHEAD), blocks.get(i + PREFETCH_AHEAD))
            {
                self.workers[worker.0 as usize]
                    .engine
                    .prefetch(mix(a.0), UPDATE_LINES);
                self.pages[page].prefetch(b.0, UPDATE_LINES);
            }
            added += self.store(worker, *id, *block).added;
        }
        added
    }

    /// Removes a run of `worker`'s engine ids, resolving them all first (prefetching ahead)
    /// and then clearing the blocks (prefetching ahead again).
    pub(crate) fn remove_run(&mut self, worker: WorkerIdx, ids: &[EngineHash]) -> Effect {
        let mut effect = Effect::default();
        let Some(wb) = self.workers.get_mut(worker.0 as usize) else {
            effect.unknown = ids.len() as u64;
            return effect;
        };
        let mut gone = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            if let Some(a) = ids.get(i + PREFETCH_AHEAD) {
                wb.engine.prefetch(mix(a.0), UPDATE_LINES);
            }
            match wb.engine.remove(mix(id.0)) {
                Some(block) => gone.push(block),
                None => effect.unknown += 1,
            }
        }
        effect.removed = gone.len() as u64;
        self.entries -= gone.len();
        if let Some(table) = self.pages.get(worker.page()) {
            for b in gone.iter().skip(1).take(PREFETCH_AHEAD) {
                table.prefetch(*b, UPDATE_LINES);
            }
        }
        for (i, block) in gone.iter().enumerate() {
            if let (Some(table), Some(b)) =
                (self.pages.get(worker.page()), gone.get(i + PREFETCH_AHEAD))
            {
                table.prefetch(*b, UPDATE_LINES);
            }
            self.unset(worker, BlockHash(*block));
        }
        effect
    }

    /// Clears `worker`'s bit for `block`, dropping the block when nobody holds it any more.
    fn unset(&mut self, worker: WorkerIdx, block: BlockHash) {
        let Some(table) = self.pages.get_mut(worker.page()) else {
            return;
        };
        table.modify(block.0, |bits| {
            Some(bits & !worker.bit()).filter(|b| *b != 0)
        });
    }

    /// Drops every entry of `worker`; returns how many.
    pub(crate) fn clear_worker(&mut self, worker: WorkerIdx) -> usize {
        let Some(wb) = self.workers.get_mut(worker.0 as usize) else {
            return 0;
        };
        let engine = std::mem::take(&mut wb.engine);
        wb.evict_hand = 0;
        let n = engine.len();
        for (_, block) in engine.iter() {
            self.unset(worker, BlockHash(block));
        }
        self.entries -= n;
        if let Some(t) = self.pages.get_mut(worker.page()) {
            t.shrink_if_sparse();
        }
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
            let worker = WorkerIdx(victim as u32);
            // Evict in small batches so the victim choice stays balanced across workers.
            let batch = (self.entries - target).min(64);
            for _ in 0..batch {
                let wb = &mut self.workers[victim];
                let Some((_, block, hand)) = wb.engine.remove_next(wb.evict_hand) else {
                    break;
                };
                wb.evict_hand = hand;
                self.entries -= 1;
                evicted += 1;
                self.unset(worker, BlockHash(block));
            }
            if self.workers[victim].engine.is_empty() && self.entries > target {
                // Defensive: a worker with no entries cannot be the largest unless all are empty.
                break;
            }
        }
        evicted
    }

    /// Per worker, the number of leading `blocks` it holds.
    ///
    /// One pass over the blocks per 64-worker page, carrying the set of workers that held
    /// every block so far and stopping when it is empty: exact for any holding pattern, and a
    /// request nobody holds costs a single probe.
    pub(crate) fn lookup(&self, blocks: &[BlockHash]) -> Overlaps {
        let mut out = Overlaps::new();
        for (page, table) in self.pages.iter().enumerate() {
            lookup_page(table, page, blocks, &mut out);
        }
        if self.pages.len() > 1 {
            out.sort();
        }
        out
    }
}

fn lookup_page(table: &Table<Bits>, page: usize, blocks: &[BlockHash], out: &mut Overlaps) {
    let Some(first) = blocks.first() else {
        return;
    };
    let held = table.get(first.0).unwrap_or(0);
    if held == 0 {
        return;
    }
    // Home slots of the next LOOKUP_AHEAD blocks, computed once: prefetched now, probed later.
    let mut homes = [0usize; LOOKUP_AHEAD];
    for (i, b) in blocks.iter().enumerate().skip(1).take(LOOKUP_AHEAD) {
        let h = table.home(b.0);
        homes[i % LOOKUP_AHEAD] = h;
        table.prefetch_slot(h);
    }
    let mut active = held;
    let mut lost = [0u32; PAGE_WORKERS as usize];
    let mut i = 1;
    while i < blocks.len() {
        let home = homes[i % LOOKUP_AHEAD];
        if let Some(ahead) = blocks.get(i + LOOKUP_AHEAD) {
            let h = table.home(ahead.0);
            homes[i % LOOKUP_AHEAD] = h;
            table.prefetch_slot(h);
        }
        let bits = table.get_from(home, blocks[i].0).unwrap_or(0);
        let gone = active & !bits;
        if gone != 0 {
            for w in workers_in(0, gone) {
                lost[w.0 as usize] = i as u32;
            }
            active &= bits;
            if active == 0 {
                break;
            }
        }
        i += 1;
    }
    for w in workers_in(0, active) {
        lost[w.0 as usize] = blocks.len() as u32;
    }
    for w in workers_in(0, held) {
        out.push_sorted(WorkerIdx::from_page_bit(page, w.0), lost[w.0 as usize]);
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

    #[test]
    fn leading_blocks_stop_at_the_first_gap() {
        let mut m = BlockMap::default();
        let c = chain(10);
        for (i, b) in c.iter().enumerate() {
            m.store(WorkerIdx(0), EngineHash(i as u64), *b);
            if i != 3 {
                m.store(WorkerIdx(1), EngineHash(100 + i as u64), *b);
            }
        }
        let o = m.lookup(&c);
        assert_eq!(o.get(WorkerIdx(0)), 10);
        assert_eq!(o.get(WorkerIdx(1)), 3);
        assert_eq!(m.entries(), 19);
    }

    #[test]
    fn workers_beyond_one_page_are_exact() {
        let mut m = BlockMap::default();
        let c = chain(5);
        for w in [0u32, 63, 64, 130] {
            for (i, b) in c.iter().enumerate().take(w as usize % 5 + 1) {
                m.store(WorkerIdx(w), EngineHash(i as u64), *b);
            }
        }
        let o = m.lookup(&c);
        let got: Vec<_> = o.iter().map(|(w, n)| (w.0, n)).collect();
        assert_eq!(got, vec![(0, 1), (63, 4), (64, 5), (130, 1)]);
    }

    #[test]
    fn remove_and_clear_drop_entries_and_blocks() {
        let mut m = BlockMap::default();
        let c = chain(4);
        for (i, b) in c.iter().enumerate() {
            m.store(WorkerIdx(2), EngineHash(i as u64), *b);
            m.store(WorkerIdx(3), EngineHash(i as u64), *b);
        }
        assert_eq!(m.remove_run(WorkerIdx(2), &[EngineHash(1)]).removed, 1);
        assert_eq!(m.remove_run(WorkerIdx(2), &[EngineHash(1)]).unknown, 1);
        assert_eq!(m.lookup(&c).get(WorkerIdx(2)), 1);
        assert_eq!(m.clear_worker(WorkerIdx(3)), 4);
        assert_eq!(m.lookup(&c).get(WorkerIdx(3)), 0);
        assert_eq!(m.entries(), 3);
        m.clear_worker(WorkerIdx(2));
        assert_eq!(m.pages[0].len(), 0);
    }

    #[test]
    fn eviction_takes_from_the_largest_worker() {
        let mut m = BlockMap::default();
        for i in 0..100u64 {
            m.store(WorkerIdx(0), EngineHash(i), h(i));
        }
        for i in 0..10u64 {
            m.store(WorkerIdx(1), EngineHash(i), h(i));
        }
        assert_eq!(m.evict_to(60), 50);
        assert_eq!(m.entries(), 60);
        assert_eq!(m.workers[0].engine.len(), 50);
        assert_eq!(m.workers[1].engine.len(), 10);
        let held0 = (0..100).filter(|&i| m.holds(WorkerIdx(0), h(i))).count();
        assert_eq!(held0, 50);
    }
}
