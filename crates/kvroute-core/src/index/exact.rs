//! The exact index: applies each worker's KV events and answers overlap lookups concurrently.
//!
//! Concurrency: one `RwLock` around the [`BlockMap`]. Lookups take the read lock once (a
//! lookup is a few microseconds); event application hashes tokens *outside* the lock and takes
//! the write lock for at most [`WRITE_CHUNK`] blocks at a time, so a lookup never waits behind
//! more than one short chunk (a few µs) however large an event batch is. Sharding the map by
//! block hash would put a lock operation on every block of the apply path and several on every
//! lookup, to shorten a wait that the chunking already bounds. One writer at a time is plenty:
//! a single thread applies millions of blocks per second, hashing included, where a fleet of
//! 1,000 engines prefilling at full speed publishes about three million (see
//! `docs/index-performance.md`, which also has the curve with several feed threads).
//!
//! Workers restarted, removed or with an unrecoverable sequence gap are dropped with
//! [`KvIndex::clear_worker`]. A per-worker generation makes an event batch that was being
//! applied concurrently with the clear drop its remaining blocks instead of resurrecting stale
//! entries.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::blocks::BlockMap;
use super::overlaps::Overlaps;
use super::stats::{IndexStats, StatsSnapshot};
use super::tiers::{LowerCounts, LowerTiers};
use super::worker::Bits;
use crate::fleet::WorkerId;
use crate::kv_events::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Tier};
use crate::tokens::{BlockHash, HashSeed, chain_hash};

/// Most blocks applied per write-lock hold.
pub const WRITE_CHUNK: usize = 128;

/// Largest hash buffer a feed thread keeps between batches (64 KiB).
const SCRATCH_KEPT: usize = 8192;

thread_local! {
    /// The kvroute hashes of the BlockStored being applied: one buffer per feed thread, so a
    /// batch allocates nothing for them.
    static SCRATCH: std::cell::Cell<Vec<BlockHash>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Configuration of a [`KvIndex`].
#[derive(Clone, Debug)]
pub struct IndexConfig {
    /// Maximum (block, worker) entries; beyond it the index evicts (and counts) entries.
    pub max_entries: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        // ≈ 0.6 GB at the measured 34–40 bytes per entry; size it to the fleet's total KV
        // cache blocks (sum of the engines' GPU blocks) with some headroom.
        IndexConfig {
            max_entries: 1 << 24,
        }
    }
}

/// Maps a chain's cache salt and LoRA adapter name to the seed a request with the same salt and
/// adapter would hash with. The model name and tenant namespacing live with the caller.
pub trait SeedFor {
    /// The seed for a chain stored with `cache_salt` and `lora_name`.
    fn seed_for(&self, cache_salt: Option<&str>, lora_name: Option<&str>) -> HashSeed;
}

impl<F: Fn(Option<&str>, Option<&str>) -> HashSeed> SeedFor for F {
    fn seed_for(&self, cache_salt: Option<&str>, lora_name: Option<&str>) -> HashSeed {
        self(cache_salt, lora_name)
    }
}

/// What applying one batch did (the same numbers feed the cumulative [`IndexStats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Events applied.
    pub events: u64,
    /// Events skipped (non-device, unknown type, malformed, LoRA id without a name).
    pub skipped: u64,
    /// Blocks newly recorded.
    pub stored: u64,
    /// Blocks removed.
    pub removed: u64,
    /// Blocks whose parent was unknown (their chain cannot be placed).
    pub unplaced: u64,
}

/// Per block of a request's chain, the workers the exact index says hold it
/// ([`KvIndex::holders`]).
#[derive(Clone, Debug, Default)]
pub struct ChainHolders {
    /// Per page of 32 workers, the holder set of each leading block the index contains.
    pages: Vec<Vec<Bits>>,
}

impl ChainHolders {
    /// Whether `worker` holds block `position` of the chain.
    pub fn holds(&self, worker: WorkerId, position: usize) -> bool {
        self.pages
            .get(worker.page())
            .and_then(|p| p.get(position))
            .is_some_and(|bits| bits & worker.bit() != 0)
    }
}

/// Who holds which kvroute block, fed by KV events; see the module docs.
#[derive(Default)]
pub struct KvIndex {
    config: IndexConfig,
    state: RwLock<Guarded>,
    stats: IndexStats,
}

#[derive(Default)]
struct Guarded {
    map: BlockMap,
    /// Blocks in host memory and on disk (empty unless workers offload).
    lower: LowerTiers,
    /// Per worker, bumped by every clear.
    generations: Vec<u64>,
}

impl Guarded {
    fn generation(&self, w: WorkerId) -> u64 {
        self.generations.get(w.0 as usize).copied().unwrap_or(0)
    }

    /// The kvroute block `worker` names `id` by, in any tier.
    fn kvroute_of(&self, w: WorkerId, id: EngineHash) -> Option<BlockHash> {
        self.map
            .kvroute_of(w, id)
            .or_else(|| self.lower.kvroute_of(w, id))
    }
}

impl KvIndex {
    /// An empty index.
    pub fn new(config: IndexConfig) -> Self {
        KvIndex {
            config,
            state: RwLock::default(),
            stats: IndexStats::default(),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Guarded> {
        // A panic while holding the lock cannot leave the map half-updated in a way that
        // matters more than losing the index, so keep serving.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Guarded> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The cumulative counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Current (block, worker) entries.
    pub fn entries(&self) -> usize {
        self.read().map.entries()
    }

    /// Current (block, worker, tier) entries of the lower tiers (host memory, disk).
    pub fn lower_entries(&self) -> usize {
        self.read().lower.entries()
    }

    /// Heap bytes held by the index's tables (capacity, not just used slots).
    pub fn heap_bytes(&self) -> usize {
        let st = self.read();
        st.map.heap_bytes() + st.lower.heap_bytes()
    }

    /// Applies one decoded event batch from `worker`. `seeds` maps a chain's cache salt and
    /// LoRA name to its hash seed (see [`SeedFor`]).
    ///
    /// The batch's `dp_rank` is not interpreted: everything one event stream publishes is
    /// taken as one cache. The ranks of a data-parallel engine keep separate caches and publish
    /// on separate endpoints (vLLM offsets the port by the rank), and the router can only
    /// choose between them if each rank is its own URL, so such ranks are configured as
    /// separate workers (external load balancing). Batches of one worker must be applied in
    /// sequence order.
    pub fn apply(&self, worker: WorkerId, batch: &EventBatch, seeds: &impl SeedFor) -> Applied {
        let mut scratch = SCRATCH.take();
        let applied = self.apply_with(worker, batch, Hashes::Tokens(seeds), &mut scratch);
        if scratch.capacity() <= SCRATCH_KEPT {
            SCRATCH.set(scratch);
        }
        applied
    }

    /// [`KvIndex::apply`] for a batch whose BlockStored hashes the caller computed: `hashes[i]`
    /// holds the kvroute hashes of event `i`'s blocks when it is a BlockStored (anything for
    /// other events), exactly as `apply` would compute them from the tokens (seeded as
    /// [`SeedFor`] says for a chain start, chained from the parent's kvroute hash otherwise).
    /// For a caller that hashes elsewhere (another thread, or a benchmark isolating the index
    /// work); a BlockStored whose hashes are missing or of another length is skipped.
    pub fn apply_prehashed(
        &self,
        worker: WorkerId,
        batch: &EventBatch,
        hashes: &[Vec<BlockHash>],
    ) -> Applied {
        let given: Hashes<'_, NoSeeds> = Hashes::Given(hashes);
        self.apply_with(worker, batch, given, &mut Vec::new())
    }

    /// The body of [`KvIndex::apply`] and [`KvIndex::apply_prehashed`].
    fn apply_with<S: SeedFor>(
        &self,
        worker: WorkerId,
        batch: &EventBatch,
        hashes: Hashes<'_, S>,
        scratch: &mut Vec<BlockHash>,
    ) -> Applied {
        let mut applied = Applied::default();
        // Lower-tier chunks whose parent comes later in the batch (vLLM's self-describing
        // events are self-contained, so their order is free): tried again at the end.
        let mut deferred = Vec::new();
        for (i, event) in batch.events.iter().enumerate() {
            let ok = match (event.prefix_tier(), event) {
                (None, _) | (_, KvEvent::Unknown(_)) => false,
                (Some(Tier::Gpu), KvEvent::Stored(s)) => {
                    self.store(worker, s, (&hashes, i), scratch, &mut applied)
                }
                (Some(Tier::Gpu), KvEvent::Removed(r)) => {
                    self.remove(worker, r, &mut applied);
                    true
                }
                (_, KvEvent::AllCleared) => {
                    self.clear_worker(worker);
                    true
                }
                (Some(tier), KvEvent::Stored(s)) => {
                    match self.store_lower(worker, tier, s, (&hashes, i), scratch, &mut applied) {
                        Lower::Placed => true,
                        Lower::Refused => false,
                        Lower::ParentUnknown => {
                            deferred.push((i, tier));
                            continue;
                        }
                    }
                }
                (Some(tier), KvEvent::Removed(r)) => {
                    let effect = self.write().lower.remove(worker, tier, &r.block_hashes);
                    applied.removed += effect.removed;
                    IndexStats::add(&self.stats.removals_unknown, effect.unknown);
                    true
                }
            };
            if ok {
                applied.events += 1;
            } else {
                applied.skipped += 1;
            }
        }
        self.retry_deferred(worker, batch, &hashes, deferred, scratch, &mut applied);
        let s = &self.stats;
        IndexStats::add(&s.events_applied, applied.events);
        IndexStats::add(&s.events_skipped, applied.skipped);
        IndexStats::add(&s.blocks_stored, applied.stored);
        IndexStats::add(&s.blocks_removed, applied.removed);
        IndexStats::add(&s.blocks_unplaced, applied.unplaced);
        applied
    }

    /// Applies a BlockStored; `false` if it was skipped (malformed, unseedable, or continuing a
    /// chain whose parent this index does not know). Event `i` of the batch; its kvroute
    /// hashes are computed (into `scratch`) or taken from `hashes`, outside the lock.
    fn store<S: SeedFor>(
        &self,
        worker: WorkerId,
        s: &BlockStored,
        (hashes, i): (&Hashes<'_, S>, usize),
        scratch: &mut Vec<BlockHash>,
        applied: &mut Applied,
    ) -> bool {
        let bs = s.block_size as usize;
        let n = s.block_hashes.len();
        if bs == 0 || s.token_ids.len() < n * bs {
            return false;
        }
        // Older releases name adapters only by an integer id that requests never carry: such a
        // chain could only be seeded wrongly (as the base model), so it is not indexed.
        if s.lora_id.is_some() && s.lora_name.is_none() {
            return false;
        }
        let (parent, generation) = {
            let st = self.read();
            let parent = match s.parent_block_hash {
                Some(p) => match st.kvroute_of(worker, p) {
                    Some(k) => Some(k),
                    None => {
                        applied.unplaced += n as u64;
                        return false;
                    }
                },
                None => None,
            };
            (parent, st.generation(worker))
        };
        let hashes: &[BlockHash] = match hashes {
            Hashes::Tokens(seeds) => {
                hash_chain(s, parent, *seeds, scratch);
                scratch
            }
            Hashes::Given(given) => match given.get(i).filter(|h| h.len() == n) {
                Some(h) => h,
                None => return false,
            },
        };
        // Each chunk continues the block the previous chunk ended with.
        let mut parent_id = s.parent_block_hash;
        for (ids, blocks) in s
            .block_hashes
            .chunks(WRITE_CHUNK)
            .zip(hashes.chunks(WRITE_CHUNK))
        {
            let mut st = self.write();
            if st.generation(worker) != generation {
                // The worker was cleared meanwhile: these blocks belong to its previous life.
                break;
            }
            applied.stored += st.map.store_run(worker, parent_id, ids, blocks);
            self.enforce_bound(&mut st);
            parent_id = ids.last().copied();
        }
        true
    }

    fn remove(&self, worker: WorkerId, r: &BlockRemoved, applied: &mut Applied) {
        for ids in r.block_hashes.chunks(WRITE_CHUNK) {
            let mut st = self.write();
            let effect = st.map.remove_run(worker, ids);
            applied.removed += effect.removed;
            IndexStats::add(&self.stats.removals_unknown, effect.unknown);
            self.publish_entries(&st);
        }
    }

    /// Applies a BlockStored in host memory or on disk: a placeholder names blocks this index
    /// already knows (in any tier) by engine id; a full (self-describing) store is hashed from
    /// its tokens like a GPU store. Beyond `max_entries` lower-tier pairs, stores are refused.
    fn store_lower<S: SeedFor>(
        &self,
        worker: WorkerId,
        tier: Tier,
        s: &BlockStored,
        (hashes, i): (&Hashes<'_, S>, usize),
        scratch: &mut Vec<BlockHash>,
        applied: &mut Applied,
    ) -> Lower {
        if s.is_placeholder() {
            let mut st = self.write();
            if st.lower.entries() >= self.config.max_entries {
                return Lower::Refused;
            }
            let (mut ids, mut blocks) = (Vec::new(), Vec::new());
            for &id in &s.block_hashes {
                match st.kvroute_of(worker, id) {
                    Some(b) => {
                        ids.push(id);
                        blocks.push(b);
                    }
                    None => applied.unplaced += 1,
                }
            }
            applied.stored += st.lower.store(worker, tier, &ids, &blocks).added;
            return if ids.is_empty() {
                Lower::Refused
            } else {
                Lower::Placed
            };
        }
        let n = s.block_hashes.len();
        if s.block_size == 0 || s.token_ids.len() < n * s.block_size as usize {
            return Lower::Refused;
        }
        if s.lora_id.is_some() && s.lora_name.is_none() {
            return Lower::Refused;
        }
        let parent = match s.parent_block_hash {
            Some(p) => match self.read().kvroute_of(worker, p) {
                Some(k) => Some(k),
                None => return Lower::ParentUnknown,
            },
            None => None,
        };
        let blocks: &[BlockHash] = match hashes {
            Hashes::Tokens(seeds) => {
                hash_chain(s, parent, *seeds, scratch);
                scratch
            }
            Hashes::Given(given) => match given.get(i).filter(|h| h.len() == n) {
                Some(h) => h,
                None => return Lower::Refused,
            },
        };
        let mut st = self.write();
        if st.lower.entries() >= self.config.max_entries {
            return Lower::Refused;
        }
        applied.stored += st.lower.store(worker, tier, &s.block_hashes, blocks).added;
        Lower::Placed
    }

    /// Tries the batch's deferred lower-tier stores again until none more can be placed; the
    /// rest are unplaced.
    fn retry_deferred<S: SeedFor>(
        &self,
        worker: WorkerId,
        batch: &EventBatch,
        hashes: &Hashes<'_, S>,
        mut deferred: Vec<(usize, Tier)>,
        scratch: &mut Vec<BlockHash>,
        applied: &mut Applied,
    ) {
        loop {
            let before = deferred.len();
            deferred.retain(|&(i, tier)| {
                let KvEvent::Stored(s) = &batch.events[i] else {
                    return false;
                };
                match self.store_lower(worker, tier, s, (hashes, i), scratch, applied) {
                    Lower::ParentUnknown => true,
                    Lower::Placed => {
                        applied.events += 1;
                        false
                    }
                    Lower::Refused => {
                        applied.skipped += 1;
                        false
                    }
                }
            });
            if deferred.len() == before {
                break;
            }
        }
        for &(i, _) in &deferred {
            if let KvEvent::Stored(s) = &batch.events[i] {
                applied.unplaced += s.block_hashes.len() as u64;
            }
            applied.skipped += 1;
        }
    }

    fn enforce_bound(&self, st: &mut Guarded) {
        let max = self.config.max_entries;
        if st.map.entries() > max {
            // Evict a little below the bound so eviction runs in batches, not per insert.
            let evicted = st.map.evict_to(max - max / 64);
            IndexStats::add(&self.stats.evictions, evicted as u64);
        }
        self.publish_entries(st);
    }

    fn publish_entries(&self, st: &Guarded) {
        self.stats.entries.store(
            st.map.entries() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Counts `events` the caller received but could not apply (e.g. their worker's model is
    /// not known yet, so their hashes cannot be seeded).
    pub fn count_skipped(&self, events: u64) {
        IndexStats::add(&self.stats.events_skipped, events);
    }

    /// Records that `worker`'s KV cache holds `blocks` blocks (vLLM's `num_gpu_blocks`), so its
    /// part of the index is sized for them now and after every clear instead of growing as
    /// the cache warms; returns the blocks granted. All reservations together stay within
    /// `max_entries`, so a wrong or hostile capacity cannot allocate past the bound. 0 forgets
    /// the worker's reservation (a removed worker).
    pub fn reserve(&self, worker: WorkerId, blocks: usize) -> usize {
        let mut st = self.write();
        let others = st.map.reserved_total() - st.map.reserved(worker);
        let granted = blocks.min(self.config.max_entries.saturating_sub(others));
        st.map.reserve(worker, granted);
        granted
    }

    /// Clears `worker` and forgets its reservation: for a worker leaving the fleet.
    pub fn remove_worker(&self, worker: WorkerId) {
        self.reserve(worker, 0);
        self.clear_worker(worker);
    }

    /// Drops every entry of `worker` (AllBlocksCleared, restart, removal, gap without replay).
    /// Holds the write lock for the whole worker (≈ 5 ms per 100,000 entries): a rare event,
    /// and clearing in pieces would let lookups see a half-cleared worker.
    pub fn clear_worker(&self, worker: WorkerId) {
        let mut st = self.write();
        let i = worker.0 as usize;
        if st.generations.len() <= i {
            st.generations.resize(i + 1, 0);
        }
        st.generations[i] += 1;
        st.map.clear_worker(worker);
        st.lower.clear_worker(worker);
        self.publish_entries(&st);
        IndexStats::add(&self.stats.workers_cleared, 1);
    }

    /// Per worker, the number of leading `blocks` (a request's chained hashes) it holds.
    pub fn lookup(&self, blocks: &[BlockHash]) -> Overlaps {
        self.read().map.lookup(blocks)
    }

    /// Per worker holding blocks in host memory or on disk, how many of `blocks` past its
    /// `gpu` leading blocks it holds there (host memory, disk), as its engine would load them.
    pub(crate) fn lower(&self, blocks: &[BlockHash], gpu: impl Fn(WorkerId) -> u32) -> LowerCounts {
        self.read().lower.extend(blocks, gpu)
    }

    /// Who holds each block of `blocks` (a request's chained hashes), as far as the index
    /// contains the chain, not only while some worker holds every block so far: used to merge
    /// approximate holdings, which may fill a worker's gaps.
    pub fn holders(&self, blocks: &[BlockHash]) -> ChainHolders {
        ChainHolders {
            pages: self.read().map.holders(blocks),
        }
    }

    /// The kvroute hash `worker` recorded for its engine block `id`, if any.
    pub fn kvroute_of(&self, worker: WorkerId, id: EngineHash) -> Option<BlockHash> {
        self.read().map.kvroute_of(worker, id)
    }
}

/// What became of a lower-tier store.
enum Lower {
    Placed,
    Refused,
    /// Its parent is in no tier (yet): maybe later in the batch.
    ParentUnknown,
}

/// The seeds type of [`Hashes::Given`], which needs none.
type NoSeeds = fn(Option<&str>, Option<&str>) -> HashSeed;

/// Where the kvroute hashes of a batch's BlockStored events come from.
enum Hashes<'a, S> {
    /// Computed from the tokens, seeded by `S`.
    Tokens(&'a S),
    /// Given by the caller, per event.
    Given(&'a [Vec<BlockHash>]),
}

/// The kvroute hashes of `s`'s blocks into `out`: seeded as `seeds` says for a chain start,
/// chained from `parent` otherwise.
fn hash_chain(
    s: &BlockStored,
    parent: Option<BlockHash>,
    seeds: &impl SeedFor,
    out: &mut Vec<BlockHash>,
) {
    let seed = match parent {
        // Only the first block of a chain is seeded; later ones chain from the parent hash.
        Some(_) => HashSeed(0),
        None => seeds.seed_for(s.cache_salt.as_deref(), s.lora_name.as_deref()),
    };
    out.clear();
    let mut prev = parent;
    for tokens in s
        .token_ids
        .chunks_exact(s.block_size as usize)
        .take(s.block_hashes.len())
    {
        let h = chain_hash(seed, prev, tokens);
        out.push(h);
        prev = Some(h);
    }
}
