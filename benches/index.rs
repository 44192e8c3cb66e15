//! Index benchmark on NVIDIA Dynamo's indexer workload (`kvroute::index::dynamo_workload`, the
//! generator of the comparison tool that runs Dynamo's indexers side by side): events applied
//! through `KvIndex::apply` as the event feed calls it (token ids rehashed), lookups through
//! `Holdings::lookup` as the request path calls it, live heap per (block, worker) pair, and the
//! score digest every correct index prints. Then the fleet-size and threading curves.
//!
//! ```text
//! cargo bench --bench index                      # apply, memory, lookups (Dynamo's workload)
//! cargo bench --bench index -- --apply-only      # apply only, more rounds (for profiling)
//! cargo bench --bench index -- --floor           # the work no exact index can skip, alone
//! cargo bench --bench index -- --fleet           # lookup/decision/memory/churn vs fleet size
//! cargo bench --bench index -- --threads         # sharded apply with 1, 2, 4 writer threads
//! cargo bench --bench index -- --population      # memory per pair, full caches, 16 vs 1,024
//! ```
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use kvroute::fleet::WorkerId;
use kvroute::index::dynamo_workload::{DIGEST, Params, Workload, fold_digest, seeds};
use kvroute::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex};
use kvroute::kv_events::EventBatch;

#[path = "common/index_fleet.rs"]
mod index_fleet;
#[path = "common/index_floor.rs"]
mod index_floor;
#[path = "common/population.rs"]
mod population;
#[path = "common/thread_cpu.rs"]
mod thread_cpu;
pub use thread_cpu::thread_cpu;

/// Counts live heap bytes, so the index's footprint is measured, not estimated.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards its arguments unchanged to `System`, which upholds the
// `GlobalAlloc` contract; the counter is a side effect that allocates nothing.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Live heap bytes now.
pub fn live_heap() -> isize {
    LIVE.load(Relaxed)
}

/// Events materialised per timed chunk, as in the comparison tool (the batches of one chunk
/// are decoded just before they are applied, as a feed receives them).
const CHUNK: usize = 2_000;

/// What the index is told about the workers' KV capacities before the events arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Capacity {
    /// Nothing (a cold router): the engine-id maps grow as the caches fill.
    Unknown,
    /// Each worker's peak holdings reserved first (untimed), as after reading `num_gpu_blocks`.
    Reserved,
}

impl Capacity {
    fn name(self) -> &'static str {
        match self {
            Capacity::Unknown => "capacities unknown",
            Capacity::Reserved => "capacities reserved",
        }
    }
}

/// The index as the router builds it (default `[index]` settings).
pub fn holdings() -> Holdings {
    let d = kvroute::config::IndexSettings::default();
    Holdings::new(
        KvIndex::new(IndexConfig {
            max_entries: d.max_entries,
        }),
        ApproxIndex::new(ApproxConfig {
            ttl: d.approx_ttl,
            capacity_per_worker: d.approx_capacity_blocks,
        }),
    )
}

/// Applies the whole stream to a fresh index; returns it and the wall and thread-CPU time
/// spent in `apply`.
fn build(w: &Workload, capacity: Capacity) -> (Holdings, Duration, Duration) {
    let h = holdings();
    if capacity == Capacity::Reserved {
        for (i, peak) in w.peak.iter().enumerate() {
            h.exact.reserve(WorkerId(i as u32), *peak as usize);
        }
    }
    let (mut wall, mut cpu) = (Duration::ZERO, Duration::ZERO);
    let mut start = 0;
    while start < w.events() {
        let end = (start + CHUNK).min(w.events());
        let batches: Vec<(WorkerId, EventBatch)> = (start..end).map(|i| w.batch(i)).collect();
        let (t, c) = (Instant::now(), thread_cpu());
        for (worker, batch) in batches {
            h.exact.apply(worker, &batch, &seeds);
        }
        wall += t.elapsed();
        cpu += thread_cpu() - c;
        start = end;
    }
    (h, wall, cpu)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Builds `rounds` times per mode, the modes alternating; prints the median and range.
fn apply_rounds(w: &Workload, rounds: usize) {
    let blocks = (w.stored_blocks + w.removed_blocks) as f64;
    let mut rates = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (i, capacity) in [Capacity::Unknown, Capacity::Reserved]
            .into_iter()
            .enumerate()
        {
            let (h, wall, cpu) = build(w, capacity);
            drop(h);
            rates[2 * i].push(blocks / wall.as_secs_f64() / 1e6);
            rates[2 * i + 1].push(blocks / cpu.as_secs_f64() / 1e6);
        }
    }
    for (i, capacity) in [Capacity::Unknown, Capacity::Reserved]
        .into_iter()
        .enumerate()
    {
        let range = |r: &[f64]| {
            (
                r.iter().copied().fold(f64::MAX, f64::min),
                r.iter().copied().fold(0.0, f64::max),
            )
        };
        let (wlo, whi) = range(&rates[2 * i]);
        let (clo, chi) = range(&rates[2 * i + 1]);
        println!(
            "apply, {} (1 thread, tokens rehashed, {rounds} builds): median {:.1} M blocks/s \
             wall ({wlo:.1}–{whi:.1}), {:.1} M blocks/s thread CPU ({clo:.1}–{chi:.1})",
            capacity.name(),
            median(&mut rates[2 * i]),
            median(&mut rates[2 * i + 1]),
        );
    }
}

/// Builds once more and prints the live heap per (block, worker) pair.
fn memory(w: &Workload, capacity: Capacity) -> Holdings {
    let before = live_heap();
    let (h, _, _) = build(w, capacity);
    let live = (live_heap() - before) as f64;
    let entries = h.exact.entries();
    assert_eq!(
        entries as u64, w.live_pairs,
        "index disagrees with the engines"
    );
    println!(
        "memory, {}: {entries} (block, worker) pairs, {:.1} MB live heap = {:.1} bytes/pair",
        capacity.name(),
        live / 1e6,
        live / entries as f64,
    );
    h
}

/// Times every lookup once through `Holdings::lookup`; prints percentiles and the digest.
fn lookup_pass(w: &Workload, h: &Holdings, pass: u32) {
    let mut ns = Vec::with_capacity(w.params.lookups);
    let mut digest = 0u64;
    let now = Duration::from_secs(1);
    for (_, q) in w.queries() {
        let t = Instant::now();
        let o = h.lookup(black_box(&q), now);
        drop(q);
        ns.push(t.elapsed().as_nanos() as u64);
        digest = fold_digest(digest, &o);
    }
    ns.sort_unstable();
    let p = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize];
    println!(
        "lookup pass {pass} ({} lookups through Holdings::lookup): p50 {} ns, p90 {} ns, p99 {} \
         ns, p99.9 {} ns, max {} ns; digest {digest:016x} ({})",
        ns.len(),
        p(0.5),
        p(0.9),
        p(0.99),
        p(0.999),
        ns[ns.len() - 1],
        if digest == DIGEST {
            "as every correct index"
        } else {
            "WRONG"
        },
    );
    assert_eq!(digest, DIGEST, "lookups disagree with Dynamo's indexers");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |f: &str| args.iter().any(|a| a == f);
    if has("--fleet") {
        index_fleet::run();
        return;
    }
    if has("--threads") {
        index_fleet::threads();
        return;
    }
    if has("--population") {
        index_fleet::population();
        return;
    }
    let t = Instant::now();
    let w = Workload::generate(Params::default());
    println!(
        "Dynamo's workload: {} events, {} blocks stored, {} removed, {} live pairs, peak per \
         worker {}–{} blocks (generated in {:.1?})",
        w.events(),
        w.stored_blocks,
        w.removed_blocks,
        w.live_pairs,
        w.peak.iter().min().unwrap_or(&0),
        w.peak.iter().max().unwrap_or(&0),
        t.elapsed()
    );
    if has("--apply-only") {
        apply_rounds(&w, 8);
        return;
    }
    if has("--floor") {
        index_floor::run(&w, |w| build(w, Capacity::Reserved).1);
        return;
    }
    apply_rounds(&w, 3);
    drop(memory(&w, Capacity::Reserved));
    let h = memory(&w, Capacity::Unknown);
    for pass in 1..=3 {
        lookup_pass(&w, &h, pass);
    }
}
