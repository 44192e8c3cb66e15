//! The pooled-cache reference: the oracle with the fleet's finite KV cache.
//!
//! The oracle ([`super::oracle`]) keeps every block ever computed. Real engines hold
//! `num_blocks` blocks each and evict the least recently freed one, and on a long trace that
//! capacity, more than placement, decides the hit rate: a conversation that comes back after
//! its worker's cache has turned over misses wherever it is sent. This reference gives the
//! whole fleet's capacity to one cache (the simulator's own [`KvCache`], vLLM's eviction
//! order) and runs each request in arrival order on an otherwise idle engine, with no
//! queueing: its prompt hits what that cache holds, it prefills the rest in the oracle's idle
//! time, and its prompt and output blocks are then cached as an engine caches them. Hits follow
//! the engine's rule (full blocks; a fully cached prompt recomputes its last block), where the
//! oracle leaves only one token to compute.
//!
//! What it answers: how much of a policy's TTFT is the cache size. It is what perfect
//! placement over LRU engines gives, with no block computed twice on two workers, no queueing
//! and no request holding blocks while others need room; a policy near it gains little from
//! better placement, only from more KV capacity. It is a reference, not a bound: a router
//! that steers which content each worker evicts could in principle beat LRU (the oracle is
//! the bound). Workers that join during the run count from the start.

use crate::engine::core::sample_token;
use crate::engine::cpu_tier::CpuTierConfig;
use crate::engine::kv_cache::{BlockTable, KvCache, SeqView};
use crate::engine::{EngineConfig, EngineHasher, RequestId};
use crate::workload::trace::Trace;
use kvroute_router::kv_events::EngineHash;

use super::config::SimConfig;
use super::oracle::{Lookup, reference_run};
use super::simulation::PolicyRun;

/// The policy name of the reference's row.
pub const NAME: &str = "pooled_cache";

/// The pooled-cache reference's records for `trace` under `config`.
pub fn pooled_cache(trace: &Trace, config: &SimConfig) -> PolicyRun {
    let engine = &config.engine;
    let workers = config.max_workers().max(1);
    // A tiered fleet pools its host-memory tiers too, loading at one engine's link.
    let tier = engine.cpu_tier.map(|t| CpuTierConfig {
        blocks: config.fleet_tier_blocks(workers),
        ..t
    });
    let cache = KvCache::with_tier(config.fleet_blocks(workers), engine.block_size.max(1), tier);
    let mut caches = IdleCaches::new(engine, vec![cache]);
    let mut run = reference_run(NAME, trace, config, |i, prompt, output| {
        caches.serve(0, i, prompt, output)
    });
    run.counters.evictions = caches.evictions();
    run
}

/// KV caches whose requests each run alone on an idle engine: the references' model of
/// caching without queueing (the pooled cache is one such cache of the fleet's size; a
/// policy's placement replayed, [`super::unqueued`], one per worker).
pub(super) struct IdleCaches<'a> {
    engine: &'a EngineConfig,
    caches: Vec<KvCache>,
    hasher: EngineHasher,
    clock: f64,
    tokens: Vec<u32>,
    hashes: Vec<EngineHash>,
}

impl<'a> IdleCaches<'a> {
    /// Requests of engines configured as `engine` over `caches`.
    pub(super) fn new(engine: &'a EngineConfig, caches: Vec<KvCache>) -> Self {
        IdleCaches {
            engine,
            caches,
            hasher: EngineHasher::new(engine.seed),
            clock: 0.0,
            tokens: Vec::new(),
            hashes: Vec::new(),
        }
    }

    /// How many caches there are.
    pub(super) fn len(&self) -> usize {
        self.caches.len()
    }

    /// Request `i` (`prompt`, then `output` tokens) on cache `slot`: what it finds, and its
    /// prompt and output blocks then cached as an engine caches them.
    pub(super) fn serve(&mut self, slot: usize, i: usize, prompt: &[u32], output: u32) -> Lookup {
        let engine = self.engine;
        let block_size = engine.block_size.max(1);
        let chain = self.hasher.chain_seed(None);
        self.tokens.clear();
        self.tokens.extend_from_slice(prompt);
        // Request `i` samples its output as an engine would: distinct per request, as sampled
        // answers are, so two requests with the same prompt do not share output blocks.
        let id = RequestId(i as u64);
        self.tokens.extend(
            (0..output as usize).map(|j| sample_token(engine.seed, id, j, engine.vocab_size)),
        );
        self.hashes.clear();
        for block in self.tokens.chunks_exact(block_size) {
            let parent = self.hashes.last().copied();
            self.hashes.push(self.hasher.hash(chain, parent, block));
        }
        // Offloads are written by the time of the request (an idle fleet's links are free).
        self.clock += 1e9;
        let cache = &mut self.caches[slot];
        cache.set_now(self.clock);
        let hashes = &self.hashes;
        let hits = cache.cached_prefix(hashes, prompt.len());
        let reusable = (prompt.len().saturating_sub(1) / block_size).min(hashes.len());
        let loads = cache.tier_prefix(&hashes[hits.len().min(reusable)..reusable]);
        let load_s = if loads > 0 {
            cache.tier_load(&hashes[hits.len()..hits.len() + loads])
        } else {
            0.0
        };
        let cached = (hits.len() + loads) * block_size;
        let seq = SeqView {
            tokens: &self.tokens,
            hashes,
            cache_salt: None,
        };
        let mut table = BlockTable::default();
        // Every other request has freed its blocks, so only a sequence longer than the whole
        // cache fails here (the engine limit refuses those first); it caches nothing.
        let gpu = hits.len() * block_size;
        let _ = cache.allocate(&mut table, &hits, gpu, self.tokens.len() - gpu, seq);
        cache.free(&mut table);
        Lookup {
            queried_blocks: prompt.len() / block_size,
            hit_blocks: hits.len(),
            cached_tokens: cached,
            load_s,
        }
    }

    /// Blocks evicted from every cache so far.
    pub(super) fn evictions(&self) -> u64 {
        self.caches.iter().map(KvCache::evictions).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::oracle::{idle_prefill_s, oracle};
    use crate::sim::reference_tests::{config, req};

    #[test]
    fn with_room_for_everything_it_is_the_oracle() {
        let trace = Trace::new(vec![
            req(0.0, &[1, 2], 128, 1),
            req(1.0, &[1, 2, 3], 192, 1),
            req(2.0, &[1, 2, 3], 192, 1),
        ]);
        let c = config(2, 64);
        let (p, o) = (pooled_cache(&trace, &c), oracle(&trace, &c));
        for (a, b) in p.records.iter().zip(&o.records).take(2) {
            assert_eq!(a.cached_tokens, b.cached_tokens);
            assert!((a.ttft().unwrap() - b.ttft().unwrap()).abs() < 1e-12);
        }
        assert_eq!(p.records[1].cached_tokens, 128);
        // A repeated prompt: the engine's rule recomputes its last block (at least one token
        // must run), where the oracle only keeps the last token.
        assert_eq!(p.records[2].cached_tokens, 128);
        assert_eq!(o.records[2].cached_tokens, 191);
        assert_eq!(p.counters.evictions, 0);
    }

    #[test]
    fn the_fleet_capacity_evicts_the_least_recently_used_prefix() {
        // One worker of 8 blocks: A (2 prompt blocks + 1 output block), then B (7 + 1) takes
        // every block and evicts A's, so A's second visit misses where the oracle hits.
        let trace = Trace::new(vec![
            req(0.0, &[1, 2], 128, 64),
            req(1.0, &[7, 8, 9, 10, 11, 12, 13], 448, 64),
            req(2.0, &[1, 2, 3], 192, 1),
        ]);
        let c = config(1, 8);
        let (p, o) = (pooled_cache(&trace, &c), oracle(&trace, &c));
        assert_eq!(o.records[2].cached_tokens, 128);
        assert_eq!(p.records[2].cached_tokens, 0);
        let e = &c.engine;
        assert!((p.records[2].ttft().unwrap() - idle_prefill_s(e, 192)).abs() < 1e-12);
        // A's 3 blocks for B, then 4 of B's for the last request.
        assert_eq!(p.counters.evictions, 7);
        // With a second worker's cache, the same trace keeps A's prefix.
        let roomy = pooled_cache(&trace, &config(2, 8));
        assert_eq!(roomy.records[2].cached_tokens, 128);
        assert!(roomy.records.iter().all(|r| r.error.is_none()));
    }
}
