//! The index benchmark workload of issue 4, reproducible from a seed.
//!
//! It models a fleet of vLLM-like engines so the figures compare with NVIDIA Dynamo's indexers
//! measured on the same workload: 16 workers, block size 16; 20,000 requests, each a root
//! prefix of 64–512 blocks (200 roots, zipf popularity s = 1.1) plus a unique suffix of 8–128
//! blocks; each request is stored on one worker (root hash mod 16, 30 % at random) as one
//! chained BlockStored of the blocks that worker does not already hold; every 500 requests each
//! worker evicts least-recently-used blocks, leaves first, until 20 % of what it stored is
//! removed; then 100,000 lookups (50 % new requests on a popular root, 30 % replays of earlier
//! requests, 20 % misses).
//!
//! Lookups are kept as compact specs and materialised on demand ([`Workload::lookup_into`]),
//! because 100,000 × 400 hashes would weigh 320 MB. The generator's own model of each engine's
//! cache ([`Workload::held`]) is the reference the index must agree with.

use std::collections::{BTreeSet, HashMap, HashSet};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::fleet::WorkerId;
use crate::kv_events::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent};
use crate::tokens::{BlockHash, HashSeed, block_hashes, chain_hash};

/// Parameters of the workload; [`WorkloadConfig::issue4`] is the published one.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Workers (engines).
    pub workers: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Requests stored before the lookups.
    pub requests: usize,
    /// Distinct root prefixes.
    pub roots: usize,
    /// Root length range in blocks (inclusive).
    pub root_blocks: (usize, usize),
    /// Unique suffix length range in blocks (inclusive).
    pub suffix_blocks: (usize, usize),
    /// Zipf exponent of root popularity.
    pub zipf_s: f64,
    /// Fraction of requests placed on a random worker instead of `root hash mod workers`.
    pub random_placement: f64,
    /// Requests between eviction rounds.
    pub evict_every: usize,
    /// Fraction of everything a worker stored that it has removed after each round.
    pub evict_fraction: f64,
    /// Lookups generated after the requests.
    pub lookups: usize,
    /// Length of a miss lookup in blocks.
    pub miss_blocks: usize,
    /// RNG seed.
    pub seed: u64,
}

impl WorkloadConfig {
    /// The workload of issue 4.
    pub fn issue4() -> Self {
        WorkloadConfig {
            workers: 16,
            block_size: 16,
            requests: 20_000,
            roots: 200,
            root_blocks: (64, 512),
            suffix_blocks: (8, 128),
            zipf_s: 1.1,
            random_placement: 0.3,
            evict_every: 500,
            evict_fraction: 0.2,
            lookups: 100_000,
            miss_blocks: 400,
            seed: 0x006b_7672_6f75_7465,
        }
    }

    /// A scaled-down version for tests (same shape, ~1 % of the size).
    pub fn small() -> Self {
        WorkloadConfig {
            workers: 5,
            requests: 400,
            roots: 12,
            root_blocks: (4, 40),
            suffix_blocks: (1, 12),
            evict_every: 50,
            lookups: 500,
            miss_blocks: 30,
            ..Self::issue4()
        }
    }
}

/// The model name the workload's chains are seeded with.
pub const MODEL: &str = "bench-model";

/// The seed of every chain in the workload (no salt, no adapter).
pub fn seed() -> HashSeed {
    HashSeed::new(MODEL, None, None)
}

/// One lookup, materialised by [`Workload::lookup_into`].
#[derive(Clone, Copy, Debug)]
enum LookupSpec {
    /// A popular root followed by a suffix nobody stored.
    New { root: u32, suffix: u32, seed: u64 },
    /// An earlier request, block for block.
    Replay { request: u32 },
    /// Blocks nobody stored.
    Miss { seed: u64 },
}

/// The generated workload.
pub struct Workload {
    /// The configuration it was generated from.
    pub config: WorkloadConfig,
    /// Event batches in publication order, each with the worker that published it.
    pub batches: Vec<(WorkerId, EventBatch)>,
    /// Per worker, the kvroute hashes its engine holds after the last batch.
    pub held: Vec<HashSet<BlockHash>>,
    /// Per worker, the most blocks its engine held at any time: the smallest KV capacity
    /// (`num_gpu_blocks`) an engine publishing these events could have.
    pub peak_held: Vec<usize>,
    /// Blocks stored by all BlockStored events.
    pub blocks_stored: u64,
    /// Blocks removed by all BlockRemoved events.
    pub blocks_removed: u64,
    root_hashes: Vec<Vec<BlockHash>>,
    request_roots: Vec<u32>,
    suffix_hashes: Vec<Vec<BlockHash>>,
    lookups: Vec<LookupSpec>,
}

/// One engine's prefix cache, as far as the workload needs it: a tree with LRU, leaves first.
#[derive(Default)]
struct EngineCache {
    nodes: HashMap<BlockHash, Node>,
    /// (last use, block) of every node without children: the eviction candidates.
    leaves: BTreeSet<(u64, BlockHash)>,
    stored: u64,
    removed: u64,
    peak: usize,
}

struct Node {
    parent: Option<BlockHash>,
    children: u32,
    last_used: u64,
}

impl EngineCache {
    fn touch(&mut self, block: BlockHash, now: u64) {
        if let Some(node) = self.nodes.get_mut(&block) {
            if node.children == 0 {
                self.leaves.remove(&(node.last_used, block));
                self.leaves.insert((now, block));
            }
            node.last_used = now;
        }
    }

    fn insert(&mut self, block: BlockHash, parent: Option<BlockHash>, now: u64) {
        if let Some(p) = parent.and_then(|p| self.nodes.get_mut(&p)) {
            if p.children == 0 {
                self.leaves
                    .remove(&(p.last_used, parent.unwrap_or_default()));
            }
            p.children += 1;
        }
        self.nodes.insert(
            block,
            Node {
                parent,
                children: 0,
                last_used: now,
            },
        );
        self.leaves.insert((now, block));
        self.stored += 1;
        self.peak = self.peak.max(self.nodes.len());
    }

    /// Stores `request` at time `now` as worker `worker`'s engine would: the blocks it holds
    /// from the start are touched, the rest inserted; the event is one chained BlockStored of
    /// the inserted ones (with their tokens), parented on the last block held.
    fn store(
        &mut self,
        worker: WorkerId,
        request: &Request<'_>,
        now: u64,
        block_size: u32,
    ) -> BlockStored {
        let bs = block_size as usize;
        let rh = request.root_hashes;
        let all: Vec<BlockHash> = rh.iter().chain(request.suffix).copied().collect();
        let held = all
            .iter()
            .take_while(|b| self.nodes.contains_key(b))
            .count();
        for b in &all[..held] {
            self.touch(*b, now);
        }
        let mut tokens = Vec::with_capacity((all.len() - held) * bs);
        for i in held..all.len() {
            let parent = i.checked_sub(1).map(|p| all[p]);
            self.insert(all[i], parent, now);
            if i < rh.len() {
                tokens.extend_from_slice(&request.root_tokens[i * bs..(i + 1) * bs]);
            } else {
                let j = i - rh.len();
                tokens.extend_from_slice(&request.suffix_tokens[j * bs..(j + 1) * bs]);
            }
        }
        BlockStored {
            block_hashes: all[held..].iter().map(|b| engine_id(worker, *b)).collect(),
            parent_block_hash: held.checked_sub(1).map(|p| engine_id(worker, all[p])),
            token_ids: tokens,
            block_size,
            ..BlockStored::default()
        }
    }

    /// Evicts least-recently-used leaves until `fraction` of all stored blocks were removed.
    fn evict(&mut self, fraction: f64) -> Vec<BlockHash> {
        let mut out = Vec::new();
        while (self.removed as f64) < fraction * self.stored as f64 {
            let Some((_, block)) = self.leaves.pop_first() else {
                break;
            };
            let parent = self.nodes.remove(&block).and_then(|n| n.parent);
            if let Some(p) = parent.and_then(|p| self.nodes.get_mut(&p).map(|n| (p, n))) {
                let (ph, node) = p;
                node.children -= 1;
                if node.children == 0 {
                    self.leaves.insert((node.last_used, ph));
                }
            }
            self.removed += 1;
            out.push(block);
        }
        out
    }
}

/// The engine's own id for a block: opaque, different per worker (like vLLM's per-process hash
/// seed), stable for the same content on the same worker.
pub fn engine_id(worker: WorkerId, block: BlockHash) -> EngineHash {
    EngineHash(xxh3_64_with_seed(
        &block.0.to_le_bytes(),
        u64::from(worker.0) + 1,
    ))
}

fn random_tokens(rng: &mut SmallRng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..150_000)).collect()
}

fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|k| {
            acc += 1.0 / (k as f64).powf(s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

fn sample(cdf: &[f64], rng: &mut SmallRng) -> usize {
    let u: f64 = rng.random();
    cdf.partition_point(|&c| c < u).min(cdf.len() - 1)
}

/// The chained hashes of `tokens`' blocks of `bs` tokens, after `parent`.
fn chain(seed: HashSeed, parent: Option<BlockHash>, tokens: &[u32], bs: usize) -> Vec<BlockHash> {
    let mut hashes = Vec::with_capacity(tokens.len() / bs);
    let mut parent = parent;
    for t in tokens.chunks_exact(bs) {
        let h = chain_hash(seed, parent, t);
        hashes.push(h);
        parent = Some(h);
    }
    hashes
}

/// The lookups: half new requests on a popular root, 30 % replays of stored requests, 20 %
/// misses.
fn lookup_specs(config: &WorkloadConfig, cdf: &[f64], rng: &mut SmallRng) -> Vec<LookupSpec> {
    (0..config.lookups)
        .map(|_| {
            let u: f64 = rng.random();
            if u < 0.5 {
                LookupSpec::New {
                    root: sample(cdf, rng) as u32,
                    suffix: rng.random_range(config.suffix_blocks.0..=config.suffix_blocks.1)
                        as u32,
                    seed: rng.random(),
                }
            } else if u < 0.8 {
                LookupSpec::Replay {
                    request: rng.random_range(0..config.requests.max(1)) as u32,
                }
            } else {
                LookupSpec::Miss { seed: rng.random() }
            }
        })
        .collect()
}

/// One stored request: its root's blocks and tokens, then its own suffix's.
struct Request<'a> {
    root_hashes: &'a [BlockHash],
    root_tokens: &'a [u32],
    suffix: &'a [BlockHash],
    suffix_tokens: &'a [u32],
}

impl Workload {
    /// Generates the workload (about ten seconds for [`WorkloadConfig::issue4`] in release).
    pub fn generate(config: WorkloadConfig) -> Self {
        let mut rng = SmallRng::seed_from_u64(config.seed);
        let bs = config.block_size as usize;
        let seed = seed();
        let root_tokens: Vec<Vec<u32>> = (0..config.roots)
            .map(|_| {
                let n = rng.random_range(config.root_blocks.0..=config.root_blocks.1);
                random_tokens(&mut rng, n * bs)
            })
            .collect();
        let root_hashes: Vec<Vec<BlockHash>> = root_tokens
            .iter()
            .map(|t| block_hashes(seed, t, bs))
            .collect();
        let cdf = zipf_cdf(config.roots, config.zipf_s);
        let mut engines: Vec<EngineCache> = (0..config.workers)
            .map(|_| EngineCache::default())
            .collect();
        let mut w = Workload {
            batches: Vec::new(),
            held: Vec::new(),
            peak_held: Vec::new(),
            blocks_stored: 0,
            blocks_removed: 0,
            root_hashes,
            request_roots: Vec::with_capacity(config.requests),
            suffix_hashes: Vec::with_capacity(config.requests),
            lookups: Vec::new(),
            config,
        };
        let config = w.config.clone();
        for req in 0..config.requests {
            let root = sample(&cdf, &mut rng);
            let rh = &w.root_hashes[root];
            let worker = if rng.random_bool(config.random_placement) {
                rng.random_range(0..config.workers)
            } else {
                (rh[0].0 % u64::from(config.workers)) as u32
            };
            let worker = WorkerId(worker);
            let n_suffix = rng.random_range(config.suffix_blocks.0..=config.suffix_blocks.1);
            let suffix_tokens = random_tokens(&mut rng, n_suffix * bs);
            let suffix = chain(seed, rh.last().copied(), &suffix_tokens, bs);
            let request = Request {
                root_hashes: rh,
                root_tokens: &root_tokens[root],
                suffix: &suffix,
                suffix_tokens: &suffix_tokens,
            };
            let now = req as u64 + 1;
            let stored = engines[worker.0 as usize].store(worker, &request, now, config.block_size);
            w.blocks_stored += stored.block_hashes.len() as u64;
            w.batches
                .push((worker, batch(vec![KvEvent::Stored(stored)])));
            w.request_roots.push(root as u32);
            w.suffix_hashes.push(suffix);
            if (req + 1) % config.evict_every == 0 {
                w.evict_round(&mut engines, config.evict_fraction);
            }
        }
        w.peak_held = engines.iter().map(|e| e.peak).collect();
        w.held = engines
            .iter()
            .map(|e| e.nodes.keys().copied().collect())
            .collect();
        w.lookups = lookup_specs(&config, &cdf, &mut rng);
        w
    }

    /// Every engine evicts its share ([`EngineCache::evict`]); each that removed blocks
    /// publishes them in BlockRemoved events of at most 512 blocks.
    fn evict_round(&mut self, engines: &mut [EngineCache], fraction: f64) {
        for (i, engine) in engines.iter_mut().enumerate() {
            let worker = WorkerId(i as u32);
            let gone = engine.evict(fraction);
            if gone.is_empty() {
                continue;
            }
            self.blocks_removed += gone.len() as u64;
            let events = gone
                .chunks(512)
                .map(|c| {
                    KvEvent::Removed(BlockRemoved {
                        block_hashes: c.iter().map(|b| engine_id(worker, *b)).collect(),
                        ..BlockRemoved::default()
                    })
                })
                .collect();
            self.batches.push((worker, batch(events)));
        }
    }

    /// (block, worker) pairs the engines hold at the end.
    pub fn live_pairs(&self) -> usize {
        self.held.iter().map(HashSet::len).sum()
    }

    /// Number of lookups.
    pub fn lookups(&self) -> usize {
        self.lookups.len()
    }

    /// Writes the block hashes of lookup `i` into `out` (cleared first).
    pub fn lookup_into(&self, i: usize, out: &mut Vec<BlockHash>) {
        out.clear();
        let Some(spec) = self.lookups.get(i) else {
            return;
        };
        match *spec {
            LookupSpec::New { root, suffix, seed } => {
                out.extend_from_slice(&self.root_hashes[root as usize]);
                let mut rng = SmallRng::seed_from_u64(seed);
                out.extend((0..suffix).map(|_| BlockHash(rng.random())));
            }
            LookupSpec::Replay { request } => {
                let r = request as usize;
                out.extend_from_slice(&self.root_hashes[self.request_roots[r] as usize]);
                out.extend_from_slice(&self.suffix_hashes[r]);
            }
            LookupSpec::Miss { seed } => {
                let mut rng = SmallRng::seed_from_u64(seed);
                out.extend((0..self.config.miss_blocks).map(|_| BlockHash(rng.random())));
            }
        }
    }

    /// The reference answer for `blocks`: per worker, the leading blocks its engine holds.
    pub fn expected_overlap(&self, blocks: &[BlockHash], worker: WorkerId) -> u32 {
        self.held.get(worker.0 as usize).map_or(0, |h| {
            blocks.iter().take_while(|b| h.contains(b)).count() as u32
        })
    }
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events,
        dp_rank: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_reproducible_and_consistent() {
        let a = Workload::generate(WorkloadConfig::small());
        let b = Workload::generate(WorkloadConfig::small());
        assert_eq!(a.batches, b.batches);
        assert_eq!(
            a.blocks_stored - a.blocks_removed,
            a.live_pairs() as u64,
            "every removal removes a stored block"
        );
        // About a fifth of what was stored has been removed.
        let frac = a.blocks_removed as f64 / a.blocks_stored as f64;
        assert!((0.15..0.21).contains(&frac), "{frac}");
        let mut buf = Vec::new();
        a.lookup_into(0, &mut buf);
        assert!(!buf.is_empty());
    }
}
