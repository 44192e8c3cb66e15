//! Fleet-size and threading curves of the index benchmark (see `benches/index.rs`).
//!
//! `--fleet`: Dynamo's workload generated for 16, 256 and 1,024 workers (the same 20,000
//! requests spread over more engines, so the pairs stay ~1.5 M and what grows is the fleet):
//! apply rate, heap per pair and lookup latency; then one worker churning while 1,000 others
//! hold 1 M pairs and stay idle; then workers added and removed continuously.
//!
//! `--threads`: the same stream applied by 1, 2 and 4 threads, each thread the feed of a
//! disjoint set of workers (a worker's batches stay in order on one thread).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvroute::fleet::WorkerId;
use kvroute::index::Holdings;
use kvroute::index::dynamo_workload::{Params, Workload, fold_digest, seeds};
use kvroute::kv_events::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent};

use super::{holdings, live_heap};

fn all_batches(w: &Workload) -> Vec<(WorkerId, EventBatch)> {
    (0..w.events()).map(|i| w.batch(i)).collect()
}

fn lookup_percentiles(w: &Workload, h: &Holdings) -> (u64, u64, u64) {
    let mut ns = Vec::with_capacity(w.params.lookups);
    let mut digest = 0;
    for (_, q) in w.queries() {
        let t = Instant::now();
        let o = h.lookup(&q, Duration::from_secs(1));
        drop(q);
        ns.push(t.elapsed().as_nanos() as u64);
        digest = fold_digest(digest, &o);
    }
    ns.sort_unstable();
    let p = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize];
    std::hint::black_box(digest);
    (p(0.5), p(0.99), p(0.999))
}

/// One chain of `n` blocks of tokens unique to `tag`, as one BlockStored.
fn chain(tag: u32, n: usize, engine_base: u64) -> EventBatch {
    let tokens: Vec<u32> = (0..(n * 16) as u32)
        .map(|t| t.wrapping_mul(2_654_435_761) ^ tag.wrapping_mul(0x9E37_79B9))
        .collect();
    EventBatch {
        ts: 0.0,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: (0..n as u64).map(|i| EngineHash(engine_base + i)).collect(),
            token_ids: tokens,
            block_size: 16,
            ..BlockStored::default()
        })],
        dp_rank: None,
    }
}

fn removal(engine_base: u64, n: usize) -> EventBatch {
    EventBatch {
        ts: 0.0,
        events: vec![KvEvent::Removed(BlockRemoved {
            block_hashes: (0..n as u64)
                .rev()
                .map(|i| EngineHash(engine_base + i))
                .collect(),
            ..BlockRemoved::default()
        })],
        dp_rank: None,
    }
}

pub fn run() {
    println!("fleet size: Dynamo's workload over more workers (cold index, tokens rehashed)");
    for workers in [16u64, 256, 1024] {
        let w = Workload::generate(Params {
            workers,
            ..Params::default()
        });
        let batches = all_batches(&w);
        let blocks = (w.stored_blocks + w.removed_blocks) as f64;
        let before = live_heap();
        let h = holdings();
        let t = Instant::now();
        for (worker, b) in &batches {
            h.exact.apply(*worker, b, &seeds);
        }
        let apply = t.elapsed();
        let heap = (live_heap() - before) as f64;
        assert_eq!(h.exact.entries() as u64, w.live_pairs);
        drop(batches);
        let (p50, p99, p999) = lookup_percentiles(&w, &h);
        println!(
            "  {workers:>5} workers: {} live pairs, apply {:.1} M blocks/s, heap {:.1} bytes/pair, \
             lookup p50 {p50} ns, p99 {p99} ns, p99.9 {p999} ns",
            w.live_pairs,
            blocks / apply.as_secs_f64() / 1e6,
            heap / w.live_pairs as f64,
        );
    }

    // One worker's cache churns while 1,000 others hold 1,000 blocks each and stay idle.
    let w = Workload::generate(Params::default());
    let own: Vec<EventBatch> = (0..w.events())
        .map(|i| w.batch(i))
        .filter(|(worker, _)| *worker == WorkerId(0))
        .map(|(_, b)| b)
        .collect();
    let own_blocks: u64 = own
        .iter()
        .flat_map(|b| &b.events)
        .map(|e| match e {
            KvEvent::Stored(s) => s.block_hashes.len() as u64,
            KvEvent::Removed(r) => r.block_hashes.len() as u64,
            _ => 0,
        })
        .sum();
    for idle in [0u32, 15, 1000] {
        let mut rates = Vec::new();
        for _ in 0..3 {
            let h = holdings();
            for i in 0..idle {
                h.exact
                    .apply(WorkerId(i + 1), &chain(i, 1000, 1 << 40), &seeds);
            }
            let t = Instant::now();
            for b in &own {
                h.exact.apply(WorkerId(0), b, &seeds);
            }
            rates.push(own_blocks as f64 / t.elapsed().as_secs_f64() / 1e6);
        }
        rates.sort_by(f64::total_cmp);
        println!(
            "one worker churning ({own_blocks} blocks) beside {idle} idle workers holding {} \
             pairs: median {:.1} M blocks/s ({:.1}–{:.1})",
            idle as u64 * 1000,
            rates[1],
            rates[0],
            rates[2]
        );
    }

    // Workers join (capacity read, events applied) and leave, their numbers reused, beside
    // 1,000 idle workers.
    let h = holdings();
    for i in 0..1000u32 {
        h.exact.apply(WorkerId(i), &chain(i, 1000, 1 << 40), &seeds);
    }
    let cycle = |n: u32| {
        let worker = WorkerId(1000 + n % 16);
        h.exact.reserve(worker, 8192);
        h.exact
            .apply(worker, &chain(100_000 + n, 256, u64::from(n) << 20), &seeds);
        h.exact
            .apply(worker, &removal(u64::from(n) << 20, 128), &seeds);
        h.remove_worker(worker);
    };
    for n in 0..64 {
        cycle(n);
    }
    let before = live_heap();
    let t = Instant::now();
    let cycles = 10_000u32;
    for n in 64..64 + cycles {
        cycle(n);
    }
    let per = t.elapsed() / cycles;
    println!(
        "worker churn beside 1,000 idle workers: {cycles} join (reserve 8,192 blocks, store 256) \
         + leave cycles, {per:.1?} each; heap after − before: {} bytes; entries {}",
        live_heap() - before,
        h.exact.entries()
    );
}

pub fn threads() {
    let w = Workload::generate(Params::default());
    let blocks = (w.stored_blocks + w.removed_blocks) as f64;
    println!(
        "threads: Dynamo's workload, each writer thread the feed of workers w ≡ t (mod threads)"
    );
    for reserved in [false, true] {
        let mut rates = vec![Vec::new(); 3];
        for _ in 0..3 {
            for (k, threads) in [1usize, 2, 4].into_iter().enumerate() {
                let per: Vec<Vec<(WorkerId, EventBatch)>> = (0..threads)
                    .map(|t| {
                        (0..w.events())
                            .map(|i| w.batch(i))
                            .filter(|(worker, _)| worker.0 as usize % threads == t)
                            .collect()
                    })
                    .collect();
                let h = Arc::new(holdings());
                if reserved {
                    for (i, peak) in w.peak.iter().enumerate() {
                        h.exact.reserve(WorkerId(i as u32), *peak as usize);
                    }
                }
                let t = Instant::now();
                std::thread::scope(|s| {
                    for batches in &per {
                        let h = Arc::clone(&h);
                        s.spawn(move || {
                            for (worker, b) in batches {
                                h.exact.apply(*worker, b, &seeds);
                            }
                        });
                    }
                });
                rates[k].push(blocks / t.elapsed().as_secs_f64() / 1e6);
                assert_eq!(h.exact.entries() as u64, w.live_pairs);
            }
        }
        for (k, threads) in [1usize, 2, 4].into_iter().enumerate() {
            let r = &mut rates[k];
            r.sort_by(f64::total_cmp);
            println!(
                "  {} {threads} thread(s): median {:.1} M blocks/s ({:.1}–{:.1})",
                if reserved { "reserved," } else { "unknown, " },
                r[1],
                r[0],
                r[2]
            );
        }
    }
}

/// `--population`: live heap per (block, worker) pair of an index holding full caches
/// (`common/population.rs`: 4,096 blocks per worker, shared prefixes and own conversations)
/// for 16, 256 and 1,024 workers, with capacities unknown (a cold router) and reserved (each
/// worker's `num_gpu_blocks` known), and the ratio to the 16-worker figure.
pub fn population() {
    let p = super::population::Population::default();
    println!("full caches: {p:?}");
    let mut base = [0.0f64; 2];
    for workers in [16u32, 256, 1024] {
        let mut per_pair = [0.0f64; 2];
        for (i, reserved) in [false, true].into_iter().enumerate() {
            let before = live_heap();
            let h = holdings();
            if reserved {
                for w in 0..workers {
                    h.exact.reserve(WorkerId(w), p.blocks_per_worker);
                }
            }
            let t = Instant::now();
            let pairs = p.fill(&h.exact, workers, "qwen3");
            let took = t.elapsed();
            per_pair[i] = (live_heap() - before) as f64 / pairs as f64;
            if workers == 16 {
                base[i] = per_pair[i];
            }
            println!(
                "  {workers:>5} workers, capacities {}: {pairs} pairs, heap {:.1} bytes/pair \
                 ({:.2}× 16 workers), filled in {took:.1?}",
                if reserved { "reserved" } else { "unknown" },
                per_pair[i],
                per_pair[i] / base[i],
            );
            drop(h);
        }
    }
}
