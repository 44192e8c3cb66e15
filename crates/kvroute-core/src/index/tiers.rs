//! The lower tiers of the exact index: blocks a worker keeps in host memory or on disk
//! (vLLM's OffloadingConnector, SGLang's HiCache), beside the GPU blocks of [`super::blocks`].
//!
//! A lower tier is kept apart from the GPU map for two reasons. Its blocks are announced in
//! shapes the GPU's are not: placeholders that name an already-known block by its engine id
//! only, and self-describing chunks that announce the same block once per overlapping chunk
//! (vLLM: "consumers are expected to deduplicate (reference-count) repeated store/remove
//! announcements of the same hash"). And a fleet without offloading must not pay for it: the
//! GPU map's 30-odd bytes per pair stay as they are, and these maps stay empty.
//!
//! Per worker and tier: engine id → (kvroute block, announcements not yet removed), and
//! kvroute block → engine ids naming it. A block is held while some name of it has an
//! announcement left. Lookups ask each worker with lower-tier blocks, starting where its GPU
//! prefix ends, how many further blocks it holds in host memory or on disk.

use std::mem::size_of;

use crate::fleet::WorkerId;
use crate::kv_events::{EngineHash, Tier};
use crate::tokens::BlockHash;

type Map<K, V> = crate::tokens::IdMap<K, V>;

/// One engine id's entry in a tier.
#[derive(Clone, Copy, Debug)]
struct Named {
    block: BlockHash,
    /// Stores not yet matched by a removal (chunks overlapping on this block each announce it).
    refs: u32,
}

#[derive(Default)]
struct TierWorker {
    engine: Map<EngineHash, Named>,
    /// kvroute block → how many engine ids name it.
    names: Map<BlockHash, u32>,
}

/// Per lower tier, per worker, which blocks it holds.
#[derive(Default)]
pub(crate) struct LowerTiers {
    /// Indexed by `tier.index() - 1`: CPU, disk.
    tiers: [Vec<TierWorker>; 2],
    /// Distinct (block, worker, tier) pairs.
    entries: usize,
}

/// What a lower-tier mutation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TierEffect {
    /// Pairs newly held.
    pub(crate) added: u64,
    /// Pairs no longer held.
    pub(crate) removed: u64,
    /// Removals of engine ids the tier did not hold.
    pub(crate) unknown: u64,
}

/// Per worker, the blocks past its GPU prefix it holds in the lower tiers.
pub(crate) type LowerCounts = Vec<(WorkerId, [u32; 2])>;

fn slot(tier: Tier) -> Option<usize> {
    match tier {
        Tier::Gpu => None,
        Tier::Cpu => Some(0),
        Tier::Disk => Some(1),
    }
}

impl LowerTiers {
    /// Distinct (block, worker, tier) pairs held.
    pub(crate) fn entries(&self) -> usize {
        self.entries
    }

    /// Heap bytes of the tiers' maps (capacity, not only used slots).
    pub(crate) fn heap_bytes(&self) -> usize {
        let per_engine = size_of::<(EngineHash, Named)>() + 1;
        let per_name = size_of::<(BlockHash, u32)>() + 1;
        self.tiers
            .iter()
            .flatten()
            .map(|w| w.engine.capacity() * per_engine + w.names.capacity() * per_name)
            .sum::<usize>()
            + self
                .tiers
                .iter()
                .map(|t| t.capacity() * size_of::<TierWorker>())
                .sum::<usize>()
    }

    fn worker_mut(&mut self, s: usize, w: WorkerId) -> &mut TierWorker {
        let workers = &mut self.tiers[s];
        let i = w.0 as usize;
        if workers.len() <= i {
            workers.resize_with(i + 1, TierWorker::default);
        }
        &mut workers[i]
    }

    fn worker(&self, s: usize, w: WorkerId) -> Option<&TierWorker> {
        self.tiers[s].get(w.0 as usize)
    }

    /// Records that `worker` stored the blocks `ids` (kvroute hashes `blocks`) in `tier`; each
    /// announcement of an id counts, so each needs its own removal.
    pub(crate) fn store(
        &mut self,
        worker: WorkerId,
        tier: Tier,
        ids: &[EngineHash],
        blocks: &[BlockHash],
    ) -> TierEffect {
        let Some(s) = slot(tier) else {
            return TierEffect::default();
        };
        let mut effect = TierEffect::default();
        let tw = self.worker_mut(s, worker);
        for (&id, &block) in ids.iter().zip(blocks) {
            let named = tw.engine.entry(id).or_insert(Named { block, refs: 0 });
            named.refs += 1;
            if named.refs > 1 {
                continue;
            }
            let names = tw.names.entry(block).or_insert(0);
            *names += 1;
            if *names == 1 {
                effect.added += 1;
            }
        }
        self.entries += effect.added as usize;
        effect
    }

    /// Takes one announcement of each of `ids` back in `tier`; a block goes when no name of it
    /// has an announcement left.
    pub(crate) fn remove(
        &mut self,
        worker: WorkerId,
        tier: Tier,
        ids: &[EngineHash],
    ) -> TierEffect {
        let Some(s) = slot(tier) else {
            return TierEffect::default();
        };
        let mut effect = TierEffect::default();
        let Some(tw) = self.tiers[s].get_mut(worker.0 as usize) else {
            effect.unknown = ids.len() as u64;
            return effect;
        };
        for id in ids {
            let Some(named) = tw.engine.get_mut(id) else {
                effect.unknown += 1;
                continue;
            };
            named.refs -= 1;
            if named.refs > 0 {
                continue;
            }
            let block = named.block;
            tw.engine.remove(id);
            if let Some(names) = tw.names.get_mut(&block) {
                *names -= 1;
                if *names == 0 {
                    tw.names.remove(&block);
                    effect.removed += 1;
                }
            }
        }
        self.entries -= effect.removed as usize;
        effect
    }

    /// The kvroute block `worker` named `id` in any lower tier (a placeholder's block that left
    /// the GPU, or the parent of a self-describing chunk).
    pub(crate) fn kvroute_of(&self, worker: WorkerId, id: EngineHash) -> Option<BlockHash> {
        (0..2).find_map(|s| Some(self.worker(s, worker)?.engine.get(&id)?.block))
    }

    /// Drops every lower-tier block of `worker`.
    pub(crate) fn clear_worker(&mut self, worker: WorkerId) {
        for s in 0..2 {
            if let Some(tw) = self.tiers[s].get_mut(worker.0 as usize) {
                self.entries -= tw.names.len();
                *tw = TierWorker::default();
            }
        }
    }

    /// Whether any worker holds anything in a lower tier (a GPU-only fleet never does).
    pub(crate) fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Per worker holding lower-tier blocks, how many of `blocks` past `gpu(worker)` leading
    /// blocks it holds in host memory and on disk, walking on while each next block is in
    /// either (a block in both counts as host memory, the faster load); workers whose
    /// continuation is empty are left out.
    pub(crate) fn extend(
        &self,
        blocks: &[BlockHash],
        gpu: impl Fn(WorkerId) -> u32,
    ) -> LowerCounts {
        let mut out = Vec::new();
        if self.is_empty() {
            return out;
        }
        let n = self.tiers[0].len().max(self.tiers[1].len());
        for i in 0..n {
            let w = WorkerId(i as u32);
            let cpu = self.worker(0, w).filter(|t| !t.names.is_empty());
            let disk = self.worker(1, w).filter(|t| !t.names.is_empty());
            if cpu.is_none() && disk.is_none() {
                continue;
            }
            let mut counts = [0u32; 2];
            for b in blocks.iter().skip(gpu(w) as usize) {
                if cpu.is_some_and(|t| t.names.contains_key(b)) {
                    counts[0] += 1;
                } else if disk.is_some_and(|t| t.names.contains_key(b)) {
                    counts[1] += 1;
                } else {
                    break;
                }
            }
            if counts != [0, 0] {
                out.push((w, counts));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: WorkerId = WorkerId(2);

    fn ids(v: &[u64]) -> Vec<EngineHash> {
        v.iter().copied().map(EngineHash).collect()
    }

    fn blocks(v: &[u64]) -> Vec<BlockHash> {
        v.iter().map(|x| BlockHash(x + 100)).collect()
    }

    #[test]
    fn a_block_stored_by_two_chunks_goes_when_both_remove_it() {
        let mut t = LowerTiers::default();
        // Chunk A: blocks 1, 2; chunk B overlaps on 2: 2, 3.
        assert_eq!(
            t.store(W, Tier::Cpu, &ids(&[1, 2]), &blocks(&[1, 2])).added,
            2
        );
        assert_eq!(
            t.store(W, Tier::Cpu, &ids(&[2, 3]), &blocks(&[2, 3])).added,
            1
        );
        assert_eq!(t.entries(), 3);
        let request = blocks(&[1, 2, 3]);
        assert_eq!(t.extend(&request, |_| 0), vec![(W, [3, 0])]);
        // Chunk A evicted: block 1 goes, block 2 is still B's.
        let e = t.remove(W, Tier::Cpu, &ids(&[1, 2]));
        assert_eq!((e.removed, e.unknown), (1, 0));
        assert_eq!(t.extend(&request[1..], |_| 0), vec![(W, [2, 0])]);
        t.remove(W, Tier::Cpu, &ids(&[2, 3]));
        assert!(t.is_empty());
        assert_eq!(t.remove(W, Tier::Cpu, &ids(&[2])).unknown, 1);
    }

    #[test]
    fn the_walk_starts_after_the_gpu_prefix_and_prefers_host_memory() {
        let mut t = LowerTiers::default();
        t.store(W, Tier::Cpu, &ids(&[2, 3]), &blocks(&[2, 3]));
        t.store(W, Tier::Disk, &ids(&[3, 4, 6]), &blocks(&[3, 4, 6]));
        let request = blocks(&[0, 1, 2, 3, 4, 5, 6]);
        // GPU holds blocks 0 and 1; 2, 3 from host memory, 4 from disk, 5 nowhere.
        assert_eq!(t.extend(&request, |_| 2), vec![(W, [2, 1])]);
        // Without the GPU prefix the walk stops at block 0.
        assert!(t.extend(&request, |_| 0).is_empty());
        assert_eq!(t.kvroute_of(W, EngineHash(4)), Some(BlockHash(104)));
        t.clear_worker(W);
        assert!(t.is_empty());
        assert_eq!(t.kvroute_of(W, EngineHash(4)), None);
    }

    #[test]
    fn the_gpu_tier_is_not_kept_here() {
        let mut t = LowerTiers::default();
        assert_eq!(
            t.store(W, Tier::Gpu, &ids(&[1]), &blocks(&[1])),
            TierEffect::default()
        );
        assert!(t.is_empty());
    }
}
