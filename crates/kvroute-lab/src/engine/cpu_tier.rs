//! A host-memory KV tier behind the GPU prefix cache, as vLLM's OffloadingConnector with its
//! `CPUOffloadingSpec` keeps one.
//!
//! A cached block the GPU evicts is written to the tier first (over the write link, one block
//! after another: it can be loaded once its write has finished); when the tier is full its
//! least recently used block goes. A request whose GPU prefix ends where the tier continues it
//! loads those blocks back (`latency + bytes ÷ read bandwidth`) instead of recomputing them,
//! and waits for the load as vLLM parks it in `WAITING_FOR_REMOTE_KVS`; a load touches the
//! blocks, so they are the last to go.
//!
//! The tier publishes what vLLM's connector publishes, in either of its encodings
//! ([`TierEvents`]): the store comes before the GPU's removal of the same block (vLLM offloads
//! while the block is still on the GPU), and the tier's own evictions are `BlockRemoved` with
//! medium `CPU`. One offloaded chunk is one block here (vLLM's default `blocks_per_chunk`).

use super::free_queue::{BlockId, FreeQueue};
use kvroute_router::kv_events::{BlockRemoved, BlockStored, EngineHash, KvEvent};
use kvroute_router::tokens::IdMap;

/// How the tier announces its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TierEvents {
    /// vLLM before 0.24 (and later without `self_describing_kv_events`): a store names the
    /// block by its engine hash only (no tokens, block size 0, no parent).
    #[default]
    Placeholder,
    /// vLLM ≥ 0.24 with `self_describing_kv_events`: a store carries the chunk's tokens, its
    /// parent and block size, like a GPU store.
    SelfDescribing,
}

impl TierEvents {
    /// The encoding's name, as `--cpu-tier-events` takes it.
    pub fn name(self) -> &'static str {
        match self {
            TierEvents::Placeholder => "placeholder",
            TierEvents::SelfDescribing => "self-describing",
        }
    }

    /// Parses [`TierEvents::name`].
    pub fn from_name(name: &str) -> Option<TierEvents> {
        [TierEvents::Placeholder, TierEvents::SelfDescribing]
            .into_iter()
            .find(|e| e.name() == name)
    }
}

/// The size and links of a host-memory tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuTierConfig {
    /// Blocks the tier holds.
    pub blocks: u32,
    /// Bytes per second a load back into GPU memory reads.
    pub read_bytes_per_s: f64,
    /// Bytes per second an offload writes.
    pub write_bytes_per_s: f64,
    /// Fixed seconds of every load.
    pub latency_s: f64,
    /// KV bytes of one token.
    pub bytes_per_token: u64,
    /// How the tier's events are encoded.
    pub events: TierEvents,
}

/// What the tier did so far (vLLM's `vllm:kv_offload_*` counters).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TierCounters {
    /// Bytes written to the tier (`vllm:kv_offload_store_bytes`).
    pub store_bytes: u64,
    /// Seconds the writes took (`vllm:kv_offload_store_time`).
    pub store_time_s: f64,
    /// Bytes loaded back into GPU memory (`vllm:kv_offload_load_bytes`).
    pub load_bytes: u64,
    /// Seconds the loads took (`vllm:kv_offload_load_time`).
    pub load_time_s: f64,
    /// Prompt tokens loaded rather than recomputed.
    pub loaded_tokens: u64,
    /// Blocks the tier evicted.
    pub evictions: u64,
}

#[derive(Clone, Debug, Default)]
struct Slot {
    hash: Option<EngineHash>,
    parent: Option<EngineHash>,
    tokens: Vec<u32>,
    /// When its write finishes: a load before that cannot use it.
    ready_at: f64,
}

/// The host-memory tier of one engine.
#[derive(Debug)]
pub struct CpuTier {
    config: CpuTierConfig,
    block_size: usize,
    slots: Vec<Slot>,
    /// Occupied slots, least recently used first.
    lru: FreeQueue,
    free: Vec<BlockId>,
    index: IdMap<EngineHash, BlockId>,
    now: f64,
    write_free_at: f64,
    counters: TierCounters,
}

impl CpuTier {
    /// An empty tier for blocks of `block_size` tokens.
    pub fn new(config: CpuTierConfig, block_size: usize) -> CpuTier {
        let n = config.blocks;
        let mut lru = FreeQueue::full(n);
        while lru.pop_front().is_some() {}
        CpuTier {
            config,
            block_size,
            slots: vec![Slot::default(); n as usize],
            lru,
            free: (0..n).rev().collect(),
            index: IdMap::default(),
            now: 0.0,
            write_free_at: 0.0,
            counters: TierCounters::default(),
        }
    }

    /// The engine's clock, set before each step's scheduling.
    pub fn set_now(&mut self, now: f64) {
        self.now = now;
    }

    /// What the tier did so far.
    pub fn counters(&self) -> TierCounters {
        self.counters
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the tier holds nothing.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn bytes(&self, blocks: usize) -> u64 {
        (blocks * self.block_size) as u64 * self.config.bytes_per_token
    }

    /// Writes the GPU's block `hash` (continuing `parent`, holding `tokens`) to the tier,
    /// announcing it in `events`; a block already there is only touched.
    pub fn offload(
        &mut self,
        hash: EngineHash,
        parent: Option<EngineHash>,
        tokens: &[u32],
        events: &mut Vec<KvEvent>,
    ) {
        if let Some(&s) = self.index.get(&hash) {
            self.lru.remove(s);
            self.lru.push_back(s);
            return;
        }
        let Some(s) = self.free.pop().or_else(|| self.evict_lru(events)) else {
            return; // a tier of 0 blocks
        };
        let bytes = self.bytes(1);
        let write_s = bytes as f64 / self.config.write_bytes_per_s.max(1.0);
        let ready_at = self.now.max(self.write_free_at) + write_s;
        self.write_free_at = ready_at;
        self.counters.store_bytes += bytes;
        self.counters.store_time_s += write_s;
        let self_describing = self.config.events == TierEvents::SelfDescribing;
        self.slots[s as usize] = Slot {
            hash: Some(hash),
            parent,
            tokens: if self_describing {
                tokens.to_vec()
            } else {
                Vec::new()
            },
            ready_at,
        };
        self.index.insert(hash, s);
        self.lru.push_back(s);
        let slot = &self.slots[s as usize];
        events.push(KvEvent::Stored(if self_describing {
            BlockStored {
                block_hashes: vec![hash],
                parent_block_hash: slot.parent,
                token_ids: slot.tokens.clone(),
                block_size: self.block_size as u32,
                medium: Some("CPU".into()),
                group_idx: Some(0),
                kv_cache_spec_kind: Some("full_attention".into()),
                ..BlockStored::default()
            }
        } else {
            BlockStored {
                block_hashes: vec![hash],
                medium: Some("CPU".into()),
                group_idx: Some(0),
                ..BlockStored::default()
            }
        }));
    }

    fn evict_lru(&mut self, events: &mut Vec<KvEvent>) -> Option<BlockId> {
        let s = self.lru.pop_front()?;
        if let Some(h) = self.slots[s as usize].hash.take() {
            self.index.remove(&h);
            self.counters.evictions += 1;
            events.push(KvEvent::Removed(BlockRemoved {
                block_hashes: vec![h],
                medium: Some("CPU".into()),
                group_idx: Some(0),
            }));
        }
        Some(s)
    }

    /// How many of `hashes` (the blocks after a request's GPU prefix), from the first, the
    /// tier holds with their writes finished.
    pub fn prefix(&self, hashes: &[EngineHash]) -> usize {
        hashes
            .iter()
            .take_while(|h| {
                self.index
                    .get(h)
                    .is_some_and(|&s| self.slots[s as usize].ready_at <= self.now)
            })
            .count()
    }

    /// Loads `hashes` (a [`CpuTier::prefix`]) back into GPU memory: touches them and returns
    /// the seconds the load takes.
    pub fn load(&mut self, hashes: &[EngineHash]) -> f64 {
        for h in hashes {
            if let Some(&s) = self.index.get(h) {
                self.lru.remove(s);
                self.lru.push_back(s);
            }
        }
        let bytes = self.bytes(hashes.len());
        let seconds = self.config.latency_s + bytes as f64 / self.config.read_bytes_per_s.max(1.0);
        self.counters.load_bytes += bytes;
        self.counters.load_time_s += seconds;
        self.counters.loaded_tokens += (hashes.len() * self.block_size) as u64;
        seconds
    }

    /// Forgets every block (the engine's prefix-cache reset; its `AllBlocksCleared` covers
    /// every tier).
    pub fn clear(&mut self) {
        while let Some(s) = self.lru.pop_front() {
            self.slots[s as usize].hash = None;
            self.free.push(s);
        }
        self.index.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(blocks: u32, events: TierEvents) -> CpuTier {
        CpuTier::new(
            CpuTierConfig {
                blocks,
                read_bytes_per_s: 1000.0,
                write_bytes_per_s: 500.0,
                latency_s: 0.5,
                bytes_per_token: 10,
                events,
            },
            4,
        )
    }

    #[test]
    fn offloads_are_loadable_once_written_and_evicted_lru() {
        let mut t = tier(2, TierEvents::Placeholder);
        let mut ev = Vec::new();
        t.offload(EngineHash(1), None, &[0; 4], &mut ev);
        t.offload(EngineHash(2), Some(EngineHash(1)), &[0; 4], &mut ev);
        // 40 bytes at 500 B/s: written at 0.08 and 0.16.
        assert_eq!(t.prefix(&[EngineHash(1), EngineHash(2)]), 0);
        t.set_now(0.16);
        assert_eq!(t.prefix(&[EngineHash(1), EngineHash(2)]), 2);
        // Loading block 1 makes block 2 the least recently used.
        let s = t.load(&[EngineHash(1)]);
        assert!((s - (0.5 + 0.04)).abs() < 1e-12);
        t.offload(EngineHash(3), None, &[0; 4], &mut ev);
        assert_eq!(t.len(), 2);
        assert_eq!(t.prefix(&[EngineHash(2)]), 0);
        let kinds: Vec<_> = ev
            .iter()
            .map(|e| match e {
                KvEvent::Stored(s) if s.is_placeholder() => "stored",
                KvEvent::Removed(r) if r.block_hashes == vec![EngineHash(2)] => "removed 2",
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(kinds, ["stored", "stored", "removed 2", "stored"]);
        assert_eq!(t.counters().evictions, 1);
        t.clear();
        assert!(t.is_empty());
    }

    #[test]
    fn self_describing_stores_carry_tokens_and_parent() {
        let mut t = tier(1, TierEvents::SelfDescribing);
        let mut ev = Vec::new();
        t.offload(EngineHash(9), Some(EngineHash(8)), &[1, 2, 3, 4], &mut ev);
        let KvEvent::Stored(s) = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(
            (s.parent_block_hash, s.token_ids.as_slice(), s.block_size),
            (Some(EngineHash(8)), &[1, 2, 3, 4][..], 4)
        );
        assert_eq!(s.medium.as_deref(), Some("CPU"));
        // Offloading it again only touches it.
        t.offload(EngineHash(9), Some(EngineHash(8)), &[1, 2, 3, 4], &mut ev);
        assert_eq!(ev.len(), 1);
    }
}
