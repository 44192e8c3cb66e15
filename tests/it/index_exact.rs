//! The exact index against hand-built KV events: every rule of issue 4's "The index".

use kvroute::fleet::WorkerId;
use kvroute::index::{IndexConfig, KvIndex};
use kvroute::kv_events::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent};
use kvroute::tokens::{BlockHash, HashSeed, block_hashes};

const BS: u32 = 4;

fn seeds(salt: Option<&str>, lora: Option<&str>) -> HashSeed {
    HashSeed::new("m", lora, salt)
}

fn tokens(n_blocks: u32, base: u32) -> Vec<u32> {
    (0..n_blocks * BS).map(|i| base + i).collect()
}

fn batch(events: Vec<KvEvent>) -> EventBatch {
    EventBatch {
        ts: 1.0,
        events,
        dp_rank: None,
    }
}

fn stored(ids: std::ops::Range<u64>, parent: Option<u64>, toks: &[u32]) -> KvEvent {
    KvEvent::Stored(BlockStored {
        block_hashes: ids.map(EngineHash).collect(),
        parent_block_hash: parent.map(EngineHash),
        token_ids: toks.to_vec(),
        block_size: BS,
        ..BlockStored::default()
    })
}

fn removed(ids: &[u64]) -> KvEvent {
    KvEvent::Removed(BlockRemoved {
        block_hashes: ids.iter().copied().map(EngineHash).collect(),
        ..BlockRemoved::default()
    })
}

fn request(toks: &[u32]) -> Vec<BlockHash> {
    block_hashes(seeds(None, None), toks, BS as usize)
}

const W0: WorkerId = WorkerId(0);
const W1: WorkerId = WorkerId(1);

#[test]
fn a_chain_continues_from_its_parents_kvroute_hash() {
    let idx = KvIndex::new(IndexConfig::default());
    let toks = tokens(5, 100);
    // Engine ids are arbitrary: the index maps them, never interprets them.
    idx.apply(W0, &batch(vec![stored(10..13, None, &toks[..12])]), &seeds);
    let a = idx.apply(
        W0,
        &batch(vec![stored(20..22, Some(12), &toks[12..])]),
        &seeds,
    );
    assert_eq!((a.events, a.stored, a.unplaced), (1, 2, 0));
    let req = request(&toks);
    assert_eq!(idx.lookup(&req).get(W0), 5);
    assert_eq!(idx.kvroute_of(W0, EngineHash(21)), Some(req[4]));
    let s = idx.stats();
    assert_eq!((s.blocks_stored, s.entries, s.events_applied), (5, 5, 2));
}

#[test]
fn an_unknown_parent_cannot_be_placed_and_is_counted() {
    let idx = KvIndex::new(IndexConfig::default());
    let toks = tokens(3, 0);
    let a = idx.apply(W0, &batch(vec![stored(5..8, Some(99), &toks)]), &seeds);
    assert_eq!((a.events, a.skipped, a.unplaced, a.stored), (0, 1, 3, 0));
    assert_eq!(idx.entries(), 0);
    assert!(idx.lookup(&request(&toks)).is_empty());
    // A parent known on another worker does not help: engine ids are per worker.
    idx.apply(W1, &batch(vec![stored(99..100, None, &toks[..4])]), &seeds);
    let a = idx.apply(W0, &batch(vec![stored(5..7, Some(99), &toks[4..])]), &seeds);
    assert_eq!(a.unplaced, 2);
    assert_eq!(idx.stats().blocks_unplaced, 5);
}

#[test]
fn removal_cuts_the_leading_run_at_the_first_missing_block() {
    let idx = KvIndex::new(IndexConfig::default());
    let toks = tokens(6, 7);
    let req = request(&toks);
    idx.apply(W0, &batch(vec![stored(0..6, None, &toks)]), &seeds);
    idx.apply(W1, &batch(vec![stored(100..106, None, &toks)]), &seeds);
    // W1 loses block 2 but keeps 3..6: it gets credit for blocks 0 and 1 only.
    let a = idx.apply(W1, &batch(vec![removed(&[102, 555])]), &seeds);
    assert_eq!(a.removed, 1);
    let o = idx.lookup(&req);
    assert_eq!((o.get(W0), o.get(W1)), (6, 2));
    // W1 still holds blocks 3..6, which approximate predictions could extend its credit to.
    let holders = idx.holders(&req);
    let w1: Vec<bool> = (0..6).map(|i| holders.holds(W1, i)).collect();
    assert_eq!(w1, [true, true, false, true, true, true]);
    // A lookup starts at a chain's first block: a slice from the middle names no stored chain.
    assert!(idx.lookup(&req[3..]).is_empty());
    let s = idx.stats();
    assert_eq!(
        (s.blocks_removed, s.removals_unknown, s.entries),
        (1, 1, 11)
    );
}

#[test]
fn all_blocks_cleared_and_clear_worker_drop_only_that_worker() {
    let idx = KvIndex::new(IndexConfig::default());
    let toks = tokens(3, 1);
    let req = request(&toks);
    for (w, base) in [(W0, 0), (W1, 10), (WorkerId(2), 20)] {
        idx.apply(w, &batch(vec![stored(base..base + 3, None, &toks)]), &seeds);
    }
    idx.apply(W1, &batch(vec![KvEvent::AllCleared]), &seeds);
    idx.clear_worker(WorkerId(2));
    let o = idx.lookup(&req);
    assert_eq!(o.iter().collect::<Vec<_>>(), vec![(W0, 3)]);
    assert_eq!(idx.entries(), 3);
    assert_eq!(idx.stats().workers_cleared, 2);
    // Engine ids of a cleared worker are forgotten: its next chain must start fresh.
    let a = idx.apply(
        W1,
        &batch(vec![stored(13..14, Some(12), &toks[..4])]),
        &seeds,
    );
    assert_eq!(a.unplaced, 1);
}

#[test]
fn salt_and_lora_seed_separate_chains_like_requests_do() {
    let idx = KvIndex::new(IndexConfig::default());
    let toks = tokens(2, 50);
    let mut salted = BlockStored {
        block_hashes: vec![EngineHash(1), EngineHash(2)],
        token_ids: toks.clone(),
        block_size: BS,
        cache_salt: Some("tenant-a".into()),
        ..BlockStored::default()
    };
    idx.apply(W0, &batch(vec![KvEvent::Stored(salted.clone())]), &seeds);
    salted.cache_salt = None;
    salted.lora_name = Some("sql-adapter".into());
    idx.apply(W1, &batch(vec![KvEvent::Stored(salted)]), &seeds);
    let with = |salt, lora| block_hashes(seeds(salt, lora), &toks, BS as usize);
    let tenant = idx.lookup(&with(Some("tenant-a"), None));
    assert_eq!(tenant.iter().collect::<Vec<_>>(), vec![(W0, 2)]);
    let adapter = idx.lookup(&with(None, Some("sql-adapter")));
    assert_eq!(adapter.iter().collect::<Vec<_>>(), vec![(W1, 2)]);
    assert!(idx.lookup(&with(None, None)).is_empty());
    assert!(idx.lookup(&with(Some("tenant-b"), None)).is_empty());
    // A continuation inherits the salt through its parent, not from its own fields.
    let more = tokens(1, 900);
    idx.apply(W0, &batch(vec![stored(3..4, Some(2), &more)]), &seeds);
    let mut all = toks.clone();
    all.extend(&more);
    let long = block_hashes(seeds(Some("tenant-a"), None), &all, BS as usize);
    assert_eq!(idx.lookup(&long).get(W0), 3);
}

#[test]
fn a_lora_id_without_a_name_is_not_indexed() {
    let idx = KvIndex::new(IndexConfig::default());
    let ev = KvEvent::Stored(BlockStored {
        block_hashes: vec![EngineHash(1)],
        token_ids: tokens(1, 0),
        block_size: BS,
        lora_id: Some(3),
        ..BlockStored::default()
    });
    let a = idx.apply(W0, &batch(vec![ev]), &seeds);
    assert_eq!((a.skipped, a.stored), (1, 0));
}

#[test]
fn other_groups_are_skipped_and_lower_tiers_kept_apart() {
    let idx = KvIndex::new(IndexConfig::default());
    let toks = tokens(1, 0);
    let base = BlockStored {
        block_hashes: vec![EngineHash(1)],
        token_ids: toks.clone(),
        block_size: BS,
        ..BlockStored::default()
    };
    let variants = [
        BlockStored {
            group_idx: Some(1),
            ..base.clone()
        },
        BlockStored {
            kv_cache_spec_kind: Some("sliding_window".into()),
            ..base.clone()
        },
    ];
    let mut events: Vec<KvEvent> = variants.into_iter().map(KvEvent::Stored).collect();
    events.push(KvEvent::Unknown("BlockMoved".into()));
    let a = idx.apply(W0, &batch(events), &seeds);
    assert_eq!((a.skipped, a.events, a.stored), (3, 0, 0));
    assert!(idx.lookup(&request(&toks)).is_empty());
    // A CPU copy is indexed in its own tier: the GPU lookup does not see it.
    let cpu = BlockStored {
        medium: Some("CPU".into()),
        ..base.clone()
    };
    let a = idx.apply(W0, &batch(vec![KvEvent::Stored(cpu)]), &seeds);
    assert_eq!((a.events, a.stored), (1, 1));
    assert!(idx.lookup(&request(&toks)).is_empty());
    assert_eq!(idx.lower_entries(), 1);
    // GPU spelled explicitly, group 0 and full attention are indexed.
    let gpu = BlockStored {
        medium: Some("GPU".into()),
        group_idx: Some(0),
        kv_cache_spec_kind: Some("full_attention".into()),
        ..base
    };
    idx.apply(W0, &batch(vec![KvEvent::Stored(gpu)]), &seeds);
    assert_eq!(idx.lookup(&request(&toks)).get(W0), 1);
    // A CPU-tier removal must not drop the GPU copy, and takes the CPU copy.
    let cpu_removal = KvEvent::Removed(BlockRemoved {
        block_hashes: vec![EngineHash(1)],
        medium: Some("CPU".into()),
        ..BlockRemoved::default()
    });
    idx.apply(W0, &batch(vec![cpu_removal]), &seeds);
    assert_eq!(idx.lookup(&request(&toks)).get(W0), 1);
    assert_eq!(idx.lower_entries(), 0);
    assert_eq!(idx.stats().events_skipped, 3);
}

#[test]
fn malformed_stored_events_are_skipped() {
    let idx = KvIndex::new(IndexConfig::default());
    let short = KvEvent::Stored(BlockStored {
        block_hashes: vec![EngineHash(1), EngineHash(2)],
        token_ids: tokens(1, 0),
        block_size: BS,
        ..BlockStored::default()
    });
    let zero = KvEvent::Stored(BlockStored {
        block_hashes: vec![EngineHash(1)],
        token_ids: tokens(1, 0),
        block_size: 0,
        ..BlockStored::default()
    });
    let a = idx.apply(W0, &batch(vec![short, zero]), &seeds);
    assert_eq!((a.skipped, a.stored), (2, 0));
}

#[test]
fn max_entries_evicts_and_counts() {
    let idx = KvIndex::new(IndexConfig { max_entries: 640 });
    for w in 0..4u32 {
        let toks = tokens(300, w * 10_000);
        let a = idx.apply(
            WorkerId(w),
            &batch(vec![stored(0..300, None, &toks)]),
            &seeds,
        );
        assert_eq!(a.stored, 300);
    }
    let s = idx.stats();
    assert!(s.entries <= 640, "{s:?}");
    assert_eq!(s.entries + s.evictions, 1200);
    assert_eq!(idx.entries() as u64, s.entries);
    // Evictions come from the largest workers, so all four keep a share.
    for w in 0..4u32 {
        let req = request(&tokens(300, w * 10_000));
        let holders = idx.holders(&req);
        let held = (0..req.len())
            .filter(|&b| holders.holds(WorkerId(w), b))
            .count();
        assert!((100..=300).contains(&held), "worker {w}: {held}");
    }
}

#[test]
fn reserved_capacity_survives_clears_and_stays_within_the_entry_bound() {
    let idx = KvIndex::new(IndexConfig {
        max_entries: 100_000,
    });
    let empty = idx.heap_bytes();
    assert_eq!(idx.reserve(W0, 60_000), 60_000);
    // The second worker gets only what the bound leaves.
    assert_eq!(idx.reserve(WorkerId(1), 60_000), 40_000);
    let reserved = idx.heap_bytes();
    // 100,000 engine-map entries of 12 bytes at most 85 % full.
    assert!(reserved > empty + 100_000 * 12, "{reserved}");
    let toks = tokens(300, 0);
    idx.apply(W0, &batch(vec![stored(0..300, None, &toks)]), &seeds);
    idx.apply(W0, &batch(vec![KvEvent::AllCleared]), &seeds);
    assert_eq!(idx.entries(), 0);
    // A restarted engine has the same cache: the cleared worker keeps its room.
    assert!(idx.heap_bytes() >= reserved, "{}", idx.heap_bytes());
    // Re-reserving a worker counts only the others against the bound.
    assert_eq!(idx.reserve(W0, 60_000), 60_000);
    // A removed worker gives its room back, to the index and to the bound.
    idx.remove_worker(W0);
    assert!(
        idx.heap_bytes() < reserved - 60_000 * 12,
        "{}",
        idx.heap_bytes()
    );
    assert_eq!(idx.reserve(WorkerId(1), 100_000), 100_000);
    let o = idx.lookup(&request(&toks));
    assert!(o.is_empty());
}

#[test]
fn many_workers_beyond_one_word() {
    let idx = KvIndex::new(IndexConfig::default());
    let toks = tokens(8, 3);
    for w in 0..150u32 {
        let n = u64::from(w % 8) + 1;
        let t = &toks[..(n as usize) * BS as usize];
        idx.apply(WorkerId(w), &batch(vec![stored(0..n, None, t)]), &seeds);
    }
    let o = idx.lookup(&request(&toks));
    assert_eq!(o.len(), 150);
    for (w, n) in o.iter() {
        assert_eq!(n, w.0 % 8 + 1, "{w}");
    }
}

#[test]
fn lookups_run_while_events_are_applied() {
    let idx = std::sync::Arc::new(KvIndex::new(IndexConfig::default()));
    let toks = tokens(200, 0);
    let req = request(&toks);
    let writers: Vec<_> = (0..2u32)
        .map(|w| {
            let idx = idx.clone();
            let toks = toks.clone();
            std::thread::spawn(move || {
                for round in 0..50u64 {
                    let ids = round * 1000..round * 1000 + 200;
                    idx.apply(WorkerId(w), &batch(vec![stored(ids, None, &toks)]), &seeds);
                    let gone: Vec<u64> = (round * 1000..round * 1000 + 200).collect();
                    idx.apply(WorkerId(w), &batch(vec![removed(&gone)]), &seeds);
                }
                idx.apply(
                    WorkerId(w),
                    &batch(vec![stored(0..200, None, &toks)]),
                    &seeds,
                );
            })
        })
        .collect();
    let mut seen = 0;
    while writers.iter().any(|t| !t.is_finished()) {
        let o = idx.lookup(&req);
        // Mid-update a worker may hold a leading part, never more than the chain.
        assert!(o.max() <= 200);
        seen += 1;
    }
    for t in writers {
        t.join().unwrap();
    }
    assert!(seen > 0);
    let o = idx.lookup(&req);
    assert_eq!((o.get(W0), o.get(W1)), (200, 200));
    assert_eq!(idx.entries(), 400);
}
