//! A paged KV cache with prefix caching, modelled on vLLM V1's `KVCacheManager` + `BlockPool`.
//!
//! `num_blocks` physical blocks of `block_size` tokens. A request owns a [`BlockTable`]; blocks
//! are reference counted so requests sharing a prefix share its blocks. A *full* block whose
//! tokens are scheduled is committed to the prefix cache under its engine hash (and a
//! `BlockStored` event is emitted). When a block's last reference goes it joins the free queue
//! but keeps its content, so a later request can still hit it; allocation takes the least
//! recently freed block and, if it was cached, evicts it (`BlockRemoved`). That is vLLM's LRU.
//!
//! One deliberate difference: when a request commits a block whose hash another physical block
//! already holds (two requests computed the same prefix concurrently), vLLM keeps both and
//! publishes two `BlockStored` for one hash, so a later `BlockRemoved` of either copy makes a
//! router forget a block that is still cached. Here the second copy stays uncommitted and no
//! event is sent, so the event stream describes exactly the set of cached hashes.

use super::cpu_tier::{CpuTier, CpuTierConfig};
use super::free_queue::{BlockId, FreeQueue};
use kvroute_router::kv_events::{BlockRemoved, BlockStored, EngineHash, KvEvent};
use kvroute_router::tokens::IdMap;

/// The blocks one request holds, in token order.
#[derive(Clone, Debug, Default)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    /// Leading blocks already committed (or found) in the prefix cache.
    committed: usize,
}

impl BlockTable {
    /// The physical blocks, in token order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }
}

/// What the cache needs to know about a request's tokens to commit its blocks.
#[derive(Clone, Copy, Debug)]
pub struct SeqView<'a> {
    /// All tokens of the request so far (prompt then outputs).
    pub tokens: &'a [u32],
    /// Engine hashes of every full block of `tokens`.
    pub hashes: &'a [EngineHash],
    /// The request's cache salt, reported on the first block's `BlockStored`.
    pub cache_salt: Option<&'a str>,
}

/// Not enough free blocks for the requested allocation; nothing was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfBlocks;

/// The paged KV cache of one engine.
#[derive(Debug)]
pub struct KvCache {
    block_size: usize,
    ref_cnt: Vec<u32>,
    hash: Vec<Option<EngineHash>>,
    free: FreeQueue,
    cached: IdMap<EngineHash, BlockId>,
    events: Vec<KvEvent>,
    evictions: u64,
    /// The host-memory tier evicted blocks are offloaded to, if any; with it, each cached
    /// block's parent and tokens (what its offload announces).
    tier: Option<CpuTier>,
    parent: Vec<Option<EngineHash>>,
    tokens: Vec<Vec<u32>>,
}

impl KvCache {
    /// An empty cache of `num_blocks` blocks of `block_size` tokens (both at least 1).
    pub fn new(num_blocks: u32, block_size: usize) -> Self {
        KvCache {
            block_size: block_size.max(1),
            ref_cnt: vec![0; num_blocks as usize],
            hash: vec![None; num_blocks as usize],
            free: FreeQueue::full(num_blocks),
            cached: IdMap::default(),
            events: Vec::new(),
            evictions: 0,
            tier: None,
            parent: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// [`KvCache::new`] with a host-memory tier behind it when `tier` is given.
    pub fn with_tier(num_blocks: u32, block_size: usize, tier: Option<CpuTierConfig>) -> Self {
        let mut cache = KvCache::new(num_blocks, block_size);
        if let Some(config) = tier {
            cache.tier = Some(CpuTier::new(config, cache.block_size));
            cache.parent = vec![None; num_blocks as usize];
            cache.tokens = vec![Vec::new(); num_blocks as usize];
        }
        cache
    }

    /// The host-memory tier, if any.
    pub fn tier(&self) -> Option<&CpuTier> {
        self.tier.as_ref()
    }

    /// Sets the tier's clock (writes finish, loads start at engine time `now`).
    pub fn set_now(&mut self, now: f64) {
        if let Some(t) = &mut self.tier {
            t.set_now(now);
        }
    }

    /// How many of `hashes` (a request's blocks after its GPU prefix, at most its reusable
    /// ones) the host-memory tier can load, from the first.
    pub fn tier_prefix(&self, hashes: &[EngineHash]) -> usize {
        self.tier.as_ref().map_or(0, |t| t.prefix(hashes))
    }

    /// Loads `hashes` from the host-memory tier; the seconds it takes.
    pub fn tier_load(&mut self, hashes: &[EngineHash]) -> f64 {
        self.tier.as_mut().map_or(0.0, |t| t.load(hashes))
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Number of physical blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Blocks with no reference (cached or not): what allocation can use.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Fraction of blocks referenced by requests, vLLM's `kv_cache_usage_perc`.
    pub fn usage(&self) -> f64 {
        if self.ref_cnt.is_empty() {
            return 0.0;
        }
        1.0 - self.free.len() as f64 / self.ref_cnt.len() as f64
    }

    /// Cached blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Number of blocks in the prefix cache.
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// The reference count of block `b`.
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_cnt.get(b as usize).copied().unwrap_or(0)
    }

    /// Every cached block hash.
    pub fn cached_hashes(&self) -> impl Iterator<Item = EngineHash> + '_ {
        self.cached.keys().copied()
    }

    /// Free blocks from next-to-evict to most recently freed.
    pub fn free_order(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.free.iter()
    }

    /// The blocks holding the longest cached prefix of a request with `num_tokens` tokens.
    ///
    /// vLLM's reuse rule: only full blocks, and at least one token is always left to compute
    /// (the model must run on something to produce logits), so at most
    /// `(num_tokens - 1) / block_size` blocks can hit.
    pub fn cached_prefix(&self, hashes: &[EngineHash], num_tokens: usize) -> Vec<BlockId> {
        let max_blocks = num_tokens.saturating_sub(1) / self.block_size;
        hashes
            .iter()
            .take(max_blocks)
            .map_while(|h| self.cached.get(h).copied())
            .collect()
    }

    /// Grows `table` so it covers `num_computed_tokens + num_new_tokens` tokens.
    ///
    /// `hits` are prefix-cache blocks (from [`KvCache::cached_prefix`]) a newly scheduled
    /// request adopts; `num_computed_tokens` counts them. Full blocks among the scheduled
    /// tokens are committed to the prefix cache (vLLM commits at scheduling time, before the
    /// forward pass). Fails without side effects when free blocks do not suffice.
    pub fn allocate(
        &mut self,
        table: &mut BlockTable,
        hits: &[BlockId],
        num_computed_tokens: usize,
        num_new_tokens: usize,
        seq: SeqView<'_>,
    ) -> Result<(), OutOfBlocks> {
        let total = num_computed_tokens + num_new_tokens;
        let required = total.div_ceil(self.block_size);
        let have = table.blocks.len() + hits.len();
        let new_blocks = required.saturating_sub(have);
        // Hits on free blocks take them out of the free queue too.
        let free_hits = hits.iter().filter(|&&b| self.ref_count(b) == 0).count();
        if new_blocks + free_hits > self.free.len() {
            return Err(OutOfBlocks);
        }
        // Adopted hits extend the committed prefix (they are cached by definition).
        let all_committed = table.committed == table.blocks.len();
        for &b in hits {
            if self.ref_cnt[b as usize] == 0 {
                self.free.remove(b);
            }
            self.ref_cnt[b as usize] += 1;
            table.blocks.push(b);
        }
        if all_committed {
            table.committed = table.blocks.len();
        }
        for _ in 0..new_blocks {
            let Some(b) = self.free.pop_front() else {
                return Err(OutOfBlocks); // unreachable: counted above
            };
            self.evict(b);
            self.ref_cnt[b as usize] = 1;
            table.blocks.push(b);
        }
        self.commit_tokens(table, total, seq);
        Ok(())
    }

    /// Commits the full blocks among `table`'s first `num_tokens` tokens to the prefix cache.
    ///
    /// [`KvCache::allocate`] commits what it schedules; blocks filled by a KV transfer are
    /// allocated with no hashes in their view (nothing committed, since a request hitting them
    /// before the data lands would read garbage) and committed here once the KV arrived, as
    /// vLLM caches a remote prefill's blocks when its load finishes.
    pub fn commit_tokens(&mut self, table: &mut BlockTable, num_tokens: usize, seq: SeqView<'_>) {
        let full = (num_tokens.min(seq.tokens.len()) / self.block_size)
            .min(seq.hashes.len())
            .min(table.blocks.len());
        self.commit(table, full, seq);
    }

    /// Drops `table`'s references; blocks that reach zero join the free queue, last block
    /// first, so a request's tail is evicted before its (more shareable) head.
    pub fn free(&mut self, table: &mut BlockTable) {
        for &b in table.blocks.iter().rev() {
            let rc = &mut self.ref_cnt[b as usize];
            *rc = rc.saturating_sub(1);
            if *rc == 0 {
                self.free.push_back(b);
            }
        }
        table.blocks.clear();
        table.committed = 0;
    }

    /// Forgets every cached block (`AllBlocksCleared`). Refused, as in vLLM, while any block
    /// is in use, since running requests still read them.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.free.len() != self.ref_cnt.len() {
            return false;
        }
        self.cached.clear();
        self.hash.iter_mut().for_each(|h| *h = None);
        if let Some(t) = &mut self.tier {
            t.clear();
        }
        self.events.push(KvEvent::AllCleared);
        true
    }

    /// Takes the events produced since the last call, in order.
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    fn evict(&mut self, b: BlockId) {
        if let Some(h) = self.hash[b as usize].take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
            }
            self.evictions += 1;
            if let Some(t) = &mut self.tier {
                // Offloaded while still on the GPU: the tier's store precedes the removal.
                let i = b as usize;
                t.offload(h, self.parent[i], &self.tokens[i], &mut self.events);
            }
            self.events.push(KvEvent::Removed(BlockRemoved {
                block_hashes: vec![h],
                medium: Some("GPU".into()),
                group_idx: None,
            }));
        }
    }

    /// Commits blocks `table.committed..full`, one `BlockStored` per contiguous run.
    fn commit(&mut self, table: &mut BlockTable, full: usize, seq: SeqView<'_>) {
        let mut run_start: Option<usize> = None;
        let start = table.committed;
        for i in start..full {
            let b = table.blocks[i];
            let h = seq.hashes[i];
            if self.cached.contains_key(&h) {
                // Another block already holds this content; see the module docs.
                self.flush_run(&mut run_start, i, seq);
                continue;
            }
            self.cached.insert(h, b);
            self.hash[b as usize] = Some(h);
            if self.tier.is_some() {
                let bs = self.block_size;
                self.parent[b as usize] = i.checked_sub(1).map(|p| seq.hashes[p]);
                self.tokens[b as usize] = seq.tokens[i * bs..(i + 1) * bs].to_vec();
            }
            run_start.get_or_insert(i);
        }
        self.flush_run(&mut run_start, full.max(start), seq);
        table.committed = table.committed.max(full);
    }

    fn flush_run(&mut self, run_start: &mut Option<usize>, end: usize, seq: SeqView<'_>) {
        let Some(start) = run_start.take() else {
            return;
        };
        let bs = self.block_size;
        self.events.push(KvEvent::Stored(BlockStored {
            block_hashes: seq.hashes[start..end].to_vec(),
            parent_block_hash: start.checked_sub(1).map(|p| seq.hashes[p]),
            token_ids: seq.tokens[start * bs..end * bs].to_vec(),
            block_size: bs as u32,
            lora_id: None,
            medium: Some("GPU".into()),
            lora_name: None,
            cache_salt: if start == 0 {
                seq.cache_salt.map(str::to_owned)
            } else {
                None
            },
            group_idx: None,
            kv_cache_spec_kind: None,
        }));
    }
}

#[cfg(test)]
#[path = "kv_cache_tests.rs"]
mod tests;
