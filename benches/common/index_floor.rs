//! The floor of event application on this machine (`cargo bench --bench index -- --floor`):
//! the work no exact index can skip, timed alone on Dynamo's workload, alternating with the
//! full `KvIndex::apply` in one run.
//!
//! Engine block ids are opaque, and a BlockRemoved names blocks only by them, so every index
//! that stays exact keeps, per worker, a map from engine id to wherever it stored the block
//! (Dynamo's RadixTree keeps a `HashMap` per worker for the same reason): one insert per stored
//! (block, worker) pair and one removal per removed pair, each at a random place in a table of
//! the worker's size. kvroute also rehashes the tokens of every stored block. The floor is
//! those three, done as cheaply as this machine allows: a bare table of 64-byte buckets (five
//! 8-byte keys and 4-byte values, as kvroute's), sized up front to each worker's peak (no
//! growth), prefetched eight operations ahead, with nothing else in the loop; and the chained
//! hash of every stored block's tokens. Whatever an index does beyond that (where the block
//! goes, who holds it, the lookups' structure) comes on top.

use std::time::{Duration, Instant};

use kvroute::index::dynamo_workload::{Workload, seed};
use kvroute::kv_events::KvEvent;
use kvroute::tokens::{BlockHash, chain_hash};

/// Operations ahead whose bucket is prefetched (kvroute's engine maps use the same distance).
const AHEAD: usize = 8;

/// Entries per bucket: 5 × (8 + 4) bytes and a count fill one 64-byte line.
const SLOTS: usize = 5;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket {
    keys: [u64; SLOTS],
    values: [u32; SLOTS],
    len: u32,
}

const EMPTY: Bucket = Bucket {
    keys: [0; SLOTS],
    values: [0; SLOTS],
    len: 0,
};

/// Open addressing over buckets, the home bucket a monotone function of the key: the least an
/// engine-id map does per operation.
struct BareMap {
    buckets: Vec<Bucket>,
}

impl BareMap {
    /// A map for `entries` keys at kvroute's maximum load (0.8), written once now so that
    /// first-touch page faults stay out of the timed loop.
    fn new(entries: usize) -> BareMap {
        let n = (entries * 5 / 4).div_ceil(SLOTS).max(1);
        BareMap {
            buckets: vec![EMPTY; n],
        }
    }

    fn home(&self, key: u64) -> usize {
        ((u128::from(key) * self.buckets.len() as u128) >> 64) as usize
    }

    fn prefetch(&self, key: u64) {
        let line = &self.buckets[self.home(key)];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint; it reads nothing and cannot fault.
        #[allow(unsafe_code)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                (line as *const Bucket).cast(),
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        std::hint::black_box(line);
    }

    fn insert(&mut self, key: u64, value: u32) {
        let mut at = self.home(key);
        loop {
            let b = &mut self.buckets[at];
            let len = b.len as usize;
            if let Some(i) = b.keys[..len].iter().position(|&k| k == key) {
                b.values[i] = value;
                return;
            }
            if len < SLOTS {
                b.keys[len] = key;
                b.values[len] = value;
                b.len += 1;
                return;
            }
            at = (at + 1) % self.buckets.len();
        }
    }

    fn remove(&mut self, key: u64) -> Option<u32> {
        let mut at = self.home(key);
        for _ in 0..self.buckets.len() {
            let b = &mut self.buckets[at];
            let len = b.len as usize;
            if let Some(i) = b.keys[..len].iter().position(|&k| k == key) {
                let v = b.values[i];
                b.keys[i] = b.keys[len - 1];
                b.values[i] = b.values[len - 1];
                b.len -= 1;
                return Some(v);
            }
            if len < SLOTS {
                return None;
            }
            at = (at + 1) % self.buckets.len();
        }
        None
    }
}

/// One engine-map operation of the workload, in event order.
#[derive(Clone, Copy)]
struct Op {
    worker: u32,
    key: u64,
    store: bool,
}

/// The workload's engine-map operations and stored token runs (block size, tokens, parent?).
fn operations(w: &Workload) -> (Vec<Op>, Vec<Vec<u32>>, u32) {
    let mut ops = Vec::new();
    let mut stores = Vec::new();
    let mut block_size = 16;
    for i in 0..w.events() {
        let (worker, batch) = w.batch(i);
        for event in batch.events {
            let (ids, store) = match event {
                KvEvent::Stored(s) => {
                    block_size = s.block_size;
                    stores.push(s.token_ids);
                    (s.block_hashes, true)
                }
                KvEvent::Removed(r) => (r.block_hashes, false),
                _ => continue,
            };
            ops.extend(ids.iter().map(|id| Op {
                worker: worker.0,
                // The engine ids are well mixed already (kvroute mixes them once more).
                key: id.0,
                store,
            }));
        }
    }
    (ops, stores, block_size)
}

/// Times the engine-map operations alone.
fn maps_alone(w: &Workload, ops: &[Op]) -> Duration {
    let mut maps: Vec<BareMap> = w.peak.iter().map(|&p| BareMap::new(p as usize)).collect();
    let t = Instant::now();
    for (i, op) in ops.iter().enumerate() {
        if let Some(a) = ops.get(i + AHEAD) {
            maps[a.worker as usize].prefetch(a.key);
        }
        let map = &mut maps[op.worker as usize];
        if op.store {
            map.insert(op.key, i as u32);
        } else {
            std::hint::black_box(map.remove(op.key));
        }
    }
    let elapsed = t.elapsed();
    std::hint::black_box(&maps);
    elapsed
}

/// Times the rehash of every stored block alone (chained from the event's first block; the
/// parent's hash, which the index looks up, is left out).
fn rehash_alone(stores: &[Vec<u32>], block_size: u32) -> Duration {
    let seed = seed();
    let mut out: Vec<BlockHash> = Vec::with_capacity(1024);
    let t = Instant::now();
    for tokens in stores {
        out.clear();
        let mut parent = None;
        for block in tokens.chunks_exact(block_size as usize) {
            let h = chain_hash(seed, parent, block);
            out.push(h);
            parent = Some(h);
        }
        std::hint::black_box(&out);
    }
    t.elapsed()
}

/// Prints the floor beside the full apply, three rounds alternating.
pub fn run(w: &Workload, apply: impl Fn(&Workload) -> Duration) {
    let (ops, stores, block_size) = operations(w);
    let blocks = (w.stored_blocks + w.removed_blocks) as f64;
    let rate = |d: Duration| blocks / d.as_secs_f64() / 1e6;
    for round in 1..=3 {
        let maps = maps_alone(w, &ops);
        let hash = rehash_alone(&stores, block_size);
        let full = apply(w);
        println!(
            "round {round}: engine-id maps alone {:.1} ns/block, rehash alone {:.1} ns/block: \
             floor {:.1} M blocks/s; KvIndex::apply with capacities reserved {:.1} M blocks/s \
             ({:.0} % of its time is the floor)",
            maps.as_nanos() as f64 / blocks,
            hash.as_nanos() as f64 / blocks,
            rate(maps + hash),
            rate(full),
            (maps + hash).as_secs_f64() / full.as_secs_f64() * 100.0,
        );
    }
}
