//! NVIDIA Dynamo's indexer benchmark workload, as kvroute's router receives it.
//!
//! This is the generator of the comparison tool that runs Dynamo 1.6.1's indexers and
//! kvroute's exact index side by side (`dynidx_bench`, see `docs/index-performance.md`), ported
//! draw for draw: the same SplitMix64 stream, zipf sampler, placement, LRU eviction simulation
//! and lookup mix, so for the same seed it produces the same token ids, the same event stream
//! and the same lookups, and an index that answers correctly prints the same score digest
//! ([`DIGEST`]) as every implementation in that tool.
//!
//! Defaults: 16 workers, block size 16, vocabulary 128,000; 20,000 requests, each a root prefix
//! (200 roots of 64–512 blocks, zipf s = 1.1) plus a unique suffix of 8–128 blocks, placed on
//! `hash(root) mod workers` or, 30 % of the time, a random worker; a worker already holding
//! the root stores only the suffix (parent = the root's last block), otherwise root and suffix
//! in one event; every 500 requests (and after the last) each worker evicts its least recently
//! used segments (a root prefix or one request's suffix, suffixes first on ties), tail first,
//! until it has removed 20 % of what it stored. 1.51 M (block, worker) pairs stay live. Then
//! 100,000 lookups: 50 % a popular root plus a new suffix, 30 % a replay of a stored request,
//! 20 % a miss.
//!
//! Engine block ids are opaque to kvroute; here they are a bijective mix of the kvroute hash
//! (equal content, equal id on every worker, as with Dynamo's sequence hashes). The tool uses
//! Dynamo's own sequence hashes; the digest does not depend on the ids.

use std::collections::{BTreeMap, HashMap};

use crate::fleet::WorkerId;
use crate::kv_events::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent};
use crate::tokens::{BlockHash, HashSeed, block_hashes, chain_hash};

use super::overlaps::Overlaps;

/// The score digest every correct index prints for the default parameters.
pub const DIGEST: u64 = 0x1362_c18e_2ad9_94d9;

/// The model name the chains are seeded with (as the comparison tool's kvroute build).
pub const MODEL: &str = "bench-model";

/// The seed of every chain (no salt, no adapter).
pub fn seed() -> HashSeed {
    crate::tokens::model::hash_seed(MODEL, None, None)
}

/// The seeds closure the event feed would pass for this workload's model.
pub fn seeds(salt: Option<&str>, lora: Option<&str>) -> HashSeed {
    crate::tokens::model::hash_seed(MODEL, lora, salt)
}

/// Parameters (defaults: the comparison tool's).
#[derive(Clone, Debug)]
pub struct Params {
    /// RNG seed.
    pub seed: u64,
    /// Workers.
    pub workers: u64,
    /// Tokens per block.
    pub block_size: u32,
    /// Token ids are drawn uniformly from `[0, vocab)`.
    pub vocab: u64,
    /// Requests stored.
    pub requests: usize,
    /// Shared root prefixes.
    pub roots: usize,
    /// Root popularity exponent.
    pub zipf_s: f64,
    /// Root length in blocks (inclusive range, fixed per root).
    pub root_blocks: (u64, u64),
    /// Suffix length in blocks (inclusive range, per request).
    pub suffix_blocks: (u64, u64),
    /// Fraction of requests placed on a random worker.
    pub random_route: f64,
    /// Removed over stored blocks each worker keeps after an eviction round.
    pub evict_frac: f64,
    /// Requests between eviction rounds.
    pub evict_every: usize,
    /// Lookups.
    pub lookups: usize,
    /// Fraction of lookups: popular root and a new suffix.
    pub q_new: f64,
    /// Fraction of lookups: replay of a stored request (the rest miss).
    pub q_replay: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            seed: 0x00D1_DA1D_5EED,
            workers: 16,
            block_size: 16,
            vocab: 128_000,
            requests: 20_000,
            roots: 200,
            zipf_s: 1.1,
            root_blocks: (64, 512),
            suffix_blocks: (8, 128),
            random_route: 0.30,
            evict_frac: 0.20,
            evict_every: 500,
            lookups: 100_000,
            q_new: 0.50,
            q_replay: 0.30,
        }
    }
}

/// SplitMix64, as the tool's.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
    fn range(&mut self, (lo, hi): (u64, u64)) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    fn tokens(&mut self, n_blocks: u64, block_size: u32, vocab: u64) -> Vec<u32> {
        (0..n_blocks * u64::from(block_size))
            .map(|_| self.below(vocab) as u32)
            .collect()
    }
}

/// The SplitMix64 finaliser (also the tool's root → worker affinity hash and digest mixer).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let w: Vec<f64> = (1..=n).map(|k| (k as f64).powf(-s)).collect();
        let total: f64 = w.iter().sum();
        let mut acc = 0.0;
        let cdf = w
            .iter()
            .map(|x| {
                acc += x / total;
                acc
            })
            .collect();
        Zipf { cdf }
    }
    fn sample(&self, rng: &mut Rng) -> usize {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

struct Root {
    tokens: Vec<u32>,
    hashes: Vec<BlockHash>,
}

struct Request {
    root: u32,
    worker: u32,
    /// Suffix tokens and their hashes (chained from the root's last block).
    tokens: Vec<u32>,
    hashes: Vec<BlockHash>,
}

#[derive(Clone, Copy)]
enum Kind {
    Store { parent: Option<BlockHash> },
    Remove,
}

/// One event of the stream; its blocks are `flat[start..start + len]`.
#[derive(Clone, Copy)]
struct Event {
    worker: u32,
    kind: Kind,
    start: usize,
    len: usize,
    req: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct SegKey {
    last_use: u64,
    kind: u8,
    id: u64,
}

enum Seg {
    Prefix(u32),
    Suffix(u32),
}

#[derive(Default)]
struct WorkerSim {
    lru: BTreeMap<SegKey, Seg>,
    resident_root: HashMap<u32, SegKey>,
    stored: u64,
    removed: u64,
    peak: u64,
}

/// The generated workload: roots, requests, and the event stream the engines publish.
pub struct Workload {
    /// The parameters.
    pub params: Params,
    roots: Vec<Root>,
    reqs: Vec<Request>,
    zipf: Zipf,
    events: Vec<Event>,
    flat: Vec<BlockHash>,
    /// Blocks stored by all BlockStored events.
    pub stored_blocks: u64,
    /// Blocks removed by all BlockRemoved events.
    pub removed_blocks: u64,
    /// (block, worker) pairs live after the stream.
    pub live_pairs: u64,
    /// Per worker, the most blocks it held at once (its smallest possible KV capacity).
    pub peak: Vec<u64>,
}

/// The engine id a worker's engine gives block `h` (a bijection: equal content, equal id).
pub fn engine_id(h: BlockHash) -> EngineHash {
    EngineHash(mix64(h.0 ^ 0x0E4E_1D00))
}

fn chain_from(parent: Option<BlockHash>, tokens: &[u32], block_size: u32) -> Vec<BlockHash> {
    let seed = seed();
    let mut prev = parent;
    tokens
        .chunks_exact(block_size as usize)
        .map(|t| {
            let h = chain_hash(seed, prev, t);
            prev = Some(h);
            h
        })
        .collect()
}

impl Workload {
    /// Generates roots and requests and simulates the engines' event stream.
    pub fn generate(p: Params) -> Self {
        let mut rng = Rng(p.seed);
        let mut roots = Vec::with_capacity(p.roots);
        for _ in 0..p.roots {
            let n = rng.range(p.root_blocks);
            let tokens = rng.tokens(n, p.block_size, p.vocab);
            let hashes = block_hashes(seed(), &tokens, p.block_size as usize);
            roots.push(Root { tokens, hashes });
        }
        let zipf = Zipf::new(p.roots, p.zipf_s);
        let mut reqs = Vec::with_capacity(p.requests);
        for _ in 0..p.requests {
            let root = zipf.sample(&mut rng);
            let n = rng.range(p.suffix_blocks);
            let tokens = rng.tokens(n, p.block_size, p.vocab);
            let u = rng.unit();
            let random_worker = rng.below(p.workers);
            let worker = if u < p.random_route {
                random_worker
            } else {
                mix64(root as u64 ^ 0x005E_ED0F_0000) % p.workers
            };
            let hashes = chain_from(roots[root].hashes.last().copied(), &tokens, p.block_size);
            reqs.push(Request {
                root: root as u32,
                worker: worker as u32,
                tokens,
                hashes,
            });
        }
        let mut w = Workload {
            params: p,
            roots,
            reqs,
            zipf,
            events: Vec::new(),
            flat: Vec::new(),
            stored_blocks: 0,
            removed_blocks: 0,
            live_pairs: 0,
            peak: Vec::new(),
        };
        w.simulate();
        w
    }

    #[allow(
        clippy::expect_used,
        reason = "the generator's own bookkeeping (tests and benches only)"
    )]
    fn simulate(&mut self) {
        let p = &self.params;
        let mut sims: Vec<WorkerSim> = (0..p.workers).map(|_| WorkerSim::default()).collect();
        let mut next_seg = 0u64;
        for (i, req) in self.reqs.iter().enumerate() {
            let sim = &mut sims[req.worker as usize];
            let root = &self.roots[req.root as usize];
            let start = self.flat.len();
            let parent;
            if let Some(old) = sim.resident_root.get(&req.root).copied() {
                let seg = sim.lru.remove(&old).expect("resident root in the LRU");
                let key = SegKey {
                    last_use: i as u64,
                    kind: 1,
                    id: old.id,
                };
                sim.lru.insert(key, seg);
                sim.resident_root.insert(req.root, key);
                parent = root.hashes.last().copied();
            } else {
                let key = SegKey {
                    last_use: i as u64,
                    kind: 1,
                    id: next_seg,
                };
                next_seg += 1;
                sim.lru.insert(key, Seg::Prefix(req.root));
                sim.resident_root.insert(req.root, key);
                self.flat.extend_from_slice(&root.hashes);
                parent = None;
            }
            let key = SegKey {
                last_use: i as u64,
                kind: 0,
                id: next_seg,
            };
            next_seg += 1;
            sim.lru.insert(key, Seg::Suffix(i as u32));
            self.flat.extend_from_slice(&req.hashes);
            let len = self.flat.len() - start;
            sim.stored += len as u64;
            sim.peak = sim.peak.max(sim.stored - sim.removed);
            self.events.push(Event {
                worker: req.worker,
                kind: Kind::Store { parent },
                start,
                len,
                req: i as u32,
            });
            self.stored_blocks += len as u64;

            if (i + 1) % p.evict_every == 0 || i + 1 == self.reqs.len() {
                self.removed_blocks += evict_round(
                    &mut sims,
                    p.evict_frac,
                    &self.roots,
                    &self.reqs,
                    &mut self.flat,
                    &mut self.events,
                );
            }
        }
        self.live_pairs = sims.iter().map(|s| s.stored - s.removed).sum();
        self.peak = sims.iter().map(|s| s.peak).collect();
    }

    /// Events in the stream.
    pub fn events(&self) -> usize {
        self.events.len()
    }

    /// Event `i` as its engine publishes it: one batch of one event, with the token ids of a
    /// BlockStored (which kvroute rehashes).
    pub fn batch(&self, i: usize) -> (WorkerId, EventBatch) {
        let e = &self.events[i];
        let ids: Vec<EngineHash> = self.flat[e.start..e.start + e.len]
            .iter()
            .map(|h| engine_id(*h))
            .collect();
        let event = match e.kind {
            Kind::Store { parent } => {
                let req = &self.reqs[e.req as usize];
                let mut token_ids = Vec::with_capacity(e.len * self.params.block_size as usize);
                if parent.is_none() {
                    token_ids.extend_from_slice(&self.roots[req.root as usize].tokens);
                }
                token_ids.extend_from_slice(&req.tokens);
                KvEvent::Stored(BlockStored {
                    block_hashes: ids,
                    parent_block_hash: parent.map(engine_id),
                    token_ids,
                    block_size: self.params.block_size,
                    ..BlockStored::default()
                })
            }
            Kind::Remove => KvEvent::Removed(BlockRemoved {
                block_hashes: ids,
                ..BlockRemoved::default()
            }),
        };
        let batch = EventBatch {
            ts: 0.0,
            events: vec![event],
            dp_rank: None,
        };
        (WorkerId(e.worker), batch)
    }

    /// The kvroute hashes of event `i`'s stored blocks (empty for a removal).
    pub fn stored_hashes(&self, i: usize) -> &[BlockHash] {
        let e = &self.events[i];
        match e.kind {
            Kind::Store { .. } => &self.flat[e.start..e.start + e.len],
            Kind::Remove => &[],
        }
    }

    /// The lookups, in order.
    pub fn queries(&self) -> Queries<'_> {
        Queries {
            w: self,
            rng: Rng(mix64(self.params.seed ^ 0x0B00_C0DE_0000_0001)),
            left: self.params.lookups,
        }
    }
}

/// Each worker evicts least-recently-used segments (a root prefix or a request's suffix,
/// whole) until `fraction` of what it stored is removed; each segment is one BlockRemoved,
/// its hashes leaves first, its blocks appended to `flat`. The blocks removed.
fn evict_round(
    sims: &mut [WorkerSim],
    fraction: f64,
    roots: &[Root],
    reqs: &[Request],
    flat: &mut Vec<BlockHash>,
    events: &mut Vec<Event>,
) -> u64 {
    let mut removed = 0;
    for (w, sim) in sims.iter_mut().enumerate() {
        while (sim.removed as f64) < fraction * sim.stored as f64 {
            let Some((_, seg)) = sim.lru.pop_first() else {
                break;
            };
            let hashes: &[BlockHash] = match seg {
                Seg::Prefix(r) => {
                    sim.resident_root.remove(&r);
                    &roots[r as usize].hashes
                }
                Seg::Suffix(q) => &reqs[q as usize].hashes,
            };
            let start = flat.len();
            flat.extend(hashes.iter().rev());
            sim.removed += hashes.len() as u64;
            events.push(Event {
                worker: w as u32,
                kind: Kind::Remove,
                start,
                len: hashes.len(),
                req: u32::MAX,
            });
            removed += hashes.len() as u64;
        }
    }
    removed
}

/// What kind of lookup a query is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryKind {
    /// A popular root and a new suffix.
    New,
    /// A stored request again.
    Replay,
    /// An unseen prefix.
    Miss,
}

/// The lookups of a [`Workload`], hashed as kvroute's request path hashes them.
pub struct Queries<'a> {
    w: &'a Workload,
    rng: Rng,
    left: usize,
}

impl Iterator for Queries<'_> {
    type Item = (QueryKind, Vec<BlockHash>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let (w, p) = (self.w, &self.w.params);
        let u = self.rng.unit();
        Some(if u < p.q_new {
            let root = w.zipf.sample(&mut self.rng);
            let n = self.rng.range(p.suffix_blocks);
            let toks = self.rng.tokens(n, p.block_size, p.vocab);
            let r = &w.roots[root].hashes;
            let mut q = Vec::with_capacity(r.len() + n as usize);
            q.extend_from_slice(r);
            q.extend(chain_from(r.last().copied(), &toks, p.block_size));
            (QueryKind::New, q)
        } else if u < p.q_new + p.q_replay {
            let i = self.rng.below(w.reqs.len() as u64) as usize;
            let req = &w.reqs[i];
            let r = &w.roots[req.root as usize].hashes;
            let mut q = Vec::with_capacity(r.len() + req.hashes.len());
            q.extend_from_slice(r);
            q.extend_from_slice(&req.hashes);
            (QueryKind::Replay, q)
        } else {
            let n = self.rng.range(p.root_blocks) + self.rng.range(p.suffix_blocks);
            let toks = self.rng.tokens(n, p.block_size, p.vocab);
            (
                QueryKind::Miss,
                block_hashes(seed(), &toks, p.block_size as usize),
            )
        })
    }
}

/// The tool's order-independent digest of one answer: `(digest, best score)`.
pub fn score_digest(o: &Overlaps) -> (u64, u32) {
    let mut h = 0x1234_5678u64;
    let mut best = 0;
    // Workers come sorted; dp rank 0 as in every event here.
    for (w, s) in o.iter().filter(|(_, s)| *s > 0) {
        h = mix64(h ^ mix64((u64::from(w.0) << 40) ^ u64::from(s)));
        best = best.max(s);
    }
    (h, best)
}

/// Folds one answer's digest into the running digest of a lookup pass.
pub fn fold_digest(digest: u64, o: &Overlaps) -> u64 {
    mix64(digest ^ score_digest(o).0)
}
