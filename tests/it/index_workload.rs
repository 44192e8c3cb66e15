//! The index replays the benchmark workload (scaled down) and agrees with the engines' own
//! caches on every entry and every lookup.

use std::time::Duration;

use kvroute::fleet::WorkerId;
use kvroute::index::workload::{Workload, WorkloadConfig, engine_id, seed};
use kvroute::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex};
use kvroute::tokens::HashSeed;

fn seeds(_: Option<&str>, _: Option<&str>) -> HashSeed {
    seed()
}

#[test]
fn index_matches_the_engines_after_the_workload() {
    let w = Workload::generate(WorkloadConfig::small());
    let idx = KvIndex::new(IndexConfig::default());
    for (worker, b) in &w.batches {
        idx.apply(*worker, b, &seeds);
    }
    let s = idx.stats();
    assert_eq!(s.entries as usize, w.live_pairs());
    assert_eq!(s.blocks_stored, w.blocks_stored);
    assert_eq!(s.blocks_removed, w.blocks_removed);
    assert_eq!(
        (s.blocks_unplaced, s.removals_unknown, s.evictions),
        (0, 0, 0)
    );
    // Every engine id the engines still hold maps to the block they hold.
    for (i, held) in w.held.iter().enumerate() {
        let worker = WorkerId(i as u32);
        for b in held {
            assert_eq!(idx.kvroute_of(worker, engine_id(worker, *b)), Some(*b));
        }
    }
    let mut buf = Vec::new();
    let mut hits = 0;
    for i in 0..w.lookups() {
        w.lookup_into(i, &mut buf);
        let o = idx.lookup(&buf);
        for worker in 0..w.config.workers {
            let worker = WorkerId(worker);
            assert_eq!(
                o.get(worker),
                w.expected_overlap(&buf, worker),
                "lookup {i}"
            );
        }
        hits += usize::from(!o.is_empty());
    }
    assert!(hits > w.lookups() / 2, "{hits}");
}

#[test]
fn holdings_merge_exact_and_predicted_blocks_per_position() {
    let w = Workload::generate(WorkloadConfig::small());
    let idx = KvIndex::new(IndexConfig::default());
    for (worker, b) in &w.batches {
        idx.apply(*worker, b, &seeds);
    }
    let h = Holdings::new(
        idx,
        ApproxIndex::new(ApproxConfig {
            ttl: Duration::from_secs(30),
            capacity_per_worker: 10_000,
        }),
    );
    let mut buf = Vec::new();
    // Find a lookup where some worker holds a leading part but not all of it.
    let (blocks, worker, exact) = (0..w.lookups())
        .find_map(|i| {
            w.lookup_into(i, &mut buf);
            let o = h.exact.lookup(&buf);
            o.iter()
                .find(|(_, n)| (*n as usize) < buf.len())
                .map(|(wk, n)| (buf.clone(), wk, n as usize))
        })
        .expect("the workload has partial hits");
    // The router sends the rest of the request there: while in prefill, predictions cover it.
    h.approx
        .record_routed(worker, &blocks[exact..], Duration::from_secs(1));
    assert_eq!(
        h.lookup(&blocks, Duration::from_secs(2)).get(worker) as usize,
        blocks.len()
    );
    assert_eq!(
        h.lookup(&blocks, Duration::from_secs(40)).get(worker) as usize,
        exact
    );
}
