//! A fleet's cache contents as the exact index holds them at fleet scale: every worker full
//! (`blocks_per_worker` blocks), part of it shared prefixes (system prompts several workers
//! hold), the rest conversations of its own. Used by `benches/decision.rs` (decisions against
//! a full index) and `benches/index.rs -- --population` (memory per pair), so both measure the
//! same population at 16 and 1,024 workers.
//!
//! Each worker holds `prefixes_per_worker` of `shared_prefixes` prefixes of `prefix_blocks`
//! blocks (chosen by a stride, so every prefix is held by about the same number of workers),
//! then chains of `chain_blocks` blocks of tokens unique to the worker until it is full. Blocks
//! are 16 tokens; engine ids are unique per worker, as engines number their own blocks.

use kvroute::fleet::WorkerId;
use kvroute::index::{KvIndex, seeds_for};
use kvroute::kv_events::{BlockStored, EngineHash, EventBatch, KvEvent};

/// What every worker holds.
#[derive(Clone, Copy, Debug)]
pub struct Population {
    pub blocks_per_worker: usize,
    pub shared_prefixes: u32,
    pub prefix_blocks: usize,
    pub prefixes_per_worker: u32,
    pub chain_blocks: usize,
}

impl Default for Population {
    /// 4,096 blocks (65,536 tokens) per worker: 2 of 64 shared prefixes of 8,192 tokens, then
    /// conversations of 4,096 tokens.
    fn default() -> Self {
        Population {
            blocks_per_worker: 4096,
            shared_prefixes: 64,
            prefix_blocks: 512,
            prefixes_per_worker: 2,
            chain_blocks: 256,
        }
    }
}

fn tokens(stream: u64, blocks: usize) -> Vec<u32> {
    let base = stream.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    (0..blocks as u64 * 16)
        .map(|i| {
            let mut x = (base ^ i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            x ^= x >> 29;
            (x >> 40) as u32 % 150_000
        })
        .collect()
}

fn stored(worker: u32, first_id: u64, tokens: Vec<u32>) -> EventBatch {
    let n = tokens.len() as u64 / 16;
    EventBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: (first_id..first_id + n)
                .map(|i| EngineHash(u64::from(worker) << 32 | i))
                .collect(),
            token_ids: tokens,
            block_size: 16,
            ..BlockStored::default()
        })],
        dp_rank: None,
    }
}

impl Population {
    /// The batches that fill `worker`'s cache, in the order its engine would publish them.
    pub fn batches(&self, worker: u32) -> Vec<EventBatch> {
        let mut out = Vec::new();
        let mut id = 0u64;
        for j in 0..self.prefixes_per_worker {
            let k = (worker * self.prefixes_per_worker + j) % self.shared_prefixes;
            out.push(stored(worker, id, tokens(u64::from(k), self.prefix_blocks)));
            id += self.prefix_blocks as u64;
        }
        let mut chain = 0u64;
        while (id as usize) < self.blocks_per_worker {
            let n = self.chain_blocks.min(self.blocks_per_worker - id as usize);
            let stream = 1 << 40 | u64::from(worker) << 16 | chain;
            out.push(stored(worker, id, tokens(stream, n)));
            id += n as u64;
            chain += 1;
        }
        out
    }

    /// Applies every worker's batches to `index` (model `model`'s seeds); returns the pairs.
    pub fn fill(&self, index: &KvIndex, workers: u32, model: &str) -> usize {
        let seeds = seeds_for(model);
        for w in 0..workers {
            for b in self.batches(w) {
                index.apply(WorkerId(w), &b, &seeds);
            }
        }
        index.entries()
    }
}
