use super::*;
use crate::engine::block_hash::EngineHasher;

/// A request's tokens and their engine hashes.
struct Seq {
    tokens: Vec<u32>,
    hashes: Vec<EngineHash>,
}

impl Seq {
    fn new(tokens: Vec<u32>, bs: usize) -> Self {
        let h = EngineHasher::new(0);
        let seed = h.chain_seed(None);
        let mut hashes = Vec::new();
        let mut parent = None;
        for block in tokens.chunks_exact(bs) {
            let x = h.hash(seed, parent, block);
            hashes.push(x);
            parent = Some(x);
        }
        Seq { tokens, hashes }
    }
    fn view(&self) -> SeqView<'_> {
        SeqView {
            tokens: &self.tokens,
            hashes: &self.hashes,
            cache_salt: None,
        }
    }
}

fn stored(ev: &KvEvent) -> &BlockStored {
    match ev {
        KvEvent::Stored(s) => s,
        other => panic!("expected BlockStored, got {other:?}"),
    }
}

fn removed(ev: &KvEvent) -> EngineHash {
    match ev {
        KvEvent::Removed(r) => {
            assert_eq!(r.block_hashes.len(), 1);
            r.block_hashes[0]
        }
        other => panic!("expected BlockRemoved, got {other:?}"),
    }
}

#[test]
fn commits_full_blocks_only_with_chained_event() {
    let mut c = KvCache::new(8, 4);
    let s = Seq::new((0..10).collect(), 4);
    let mut t = BlockTable::default();
    c.allocate(&mut t, &[], 0, 10, s.view()).unwrap();
    assert_eq!(t.blocks(), &[0, 1, 2]);
    assert_eq!(c.num_free(), 5);
    let ev = c.take_events();
    assert_eq!(ev.len(), 1);
    let st = stored(&ev[0]);
    assert_eq!(st.block_hashes, s.hashes[..2].to_vec());
    assert_eq!(st.parent_block_hash, None);
    assert_eq!(st.token_ids, (0..8).collect::<Vec<u32>>());
    assert_eq!(st.block_size, 4);
    assert_eq!(c.num_cached(), 2);
    // Two more tokens complete block 2: one event whose parent is block 1.
    let s = Seq::new((0..12).collect(), 4);
    c.allocate(&mut t, &[], 10, 2, s.view()).unwrap();
    assert_eq!(t.blocks().len(), 3);
    let ev = c.take_events();
    let st = stored(&ev[0]);
    assert_eq!(st.block_hashes, vec![s.hashes[2]]);
    assert_eq!(st.parent_block_hash, Some(s.hashes[1]));
    assert_eq!(st.token_ids, (8..12).collect::<Vec<u32>>());
}

#[test]
fn at_least_one_token_is_computed() {
    let mut c = KvCache::new(8, 4);
    let s = Seq::new((0..8).collect(), 4);
    let mut t = BlockTable::default();
    c.allocate(&mut t, &[], 0, 8, s.view()).unwrap();
    // Both blocks are cached, but a request of exactly 8 tokens may only reuse the first.
    assert_eq!(c.cached_prefix(&s.hashes, 8), vec![0]);
    assert_eq!(c.cached_prefix(&s.hashes, 9), vec![0, 1]);
    assert_eq!(c.cached_prefix(&s.hashes, 1), Vec::<BlockId>::new());
    // Prefix stops at the first miss.
    let mut other = s.hashes.clone();
    other[0] = EngineHash(42);
    assert!(c.cached_prefix(&other, 9).is_empty());
}

#[test]
fn refcounts_and_free_order() {
    let mut c = KvCache::new(6, 4);
    let s = Seq::new((0..9).collect(), 4);
    let mut a = BlockTable::default();
    c.allocate(&mut a, &[], 0, 9, s.view()).unwrap(); // blocks 0,1 (cached), 2 (partial)
    let hits = c.cached_prefix(&s.hashes, 9);
    assert_eq!(hits, vec![0, 1]);
    let mut b = BlockTable::default();
    c.allocate(&mut b, &hits, 8, 1, s.view()).unwrap();
    assert_eq!(b.blocks(), &[0, 1, 3]);
    assert_eq!(
        (
            c.ref_count(0),
            c.ref_count(1),
            c.ref_count(2),
            c.ref_count(3)
        ),
        (2, 2, 1, 1)
    );
    c.free(&mut a);
    assert_eq!((c.ref_count(0), c.ref_count(1), c.ref_count(2)), (1, 1, 0));
    assert_eq!(c.free_order().collect::<Vec<_>>(), vec![4, 5, 2]);
    c.free(&mut b);
    // Tail first: 3, then 1, then 0.
    assert_eq!(c.free_order().collect::<Vec<_>>(), vec![4, 5, 2, 3, 1, 0]);
    assert_eq!(c.usage(), 0.0);
    assert!(b.blocks().is_empty());
}

#[test]
fn lru_eviction_order() {
    let mut c = KvCache::new(4, 4);
    let a = Seq::new((0..8).collect(), 4);
    let b = Seq::new((100..108).collect(), 4);
    let d = Seq::new((200..212).collect(), 4);
    let mut ta = BlockTable::default();
    c.allocate(&mut ta, &[], 0, 8, a.view()).unwrap(); // blocks 0,1
    c.free(&mut ta); // queue: 2,3,1,0
    let mut tb = BlockTable::default();
    c.allocate(&mut tb, &[], 0, 8, b.view()).unwrap(); // blocks 2,3
    c.free(&mut tb); // queue: 1,0,3,2
    assert_eq!(c.free_order().collect::<Vec<_>>(), vec![1, 0, 3, 2]);
    c.take_events();
    let mut td = BlockTable::default();
    c.allocate(&mut td, &[], 0, 12, d.view()).unwrap();
    assert_eq!(td.blocks(), &[1, 0, 3]);
    let ev = c.take_events();
    assert_eq!(ev.len(), 4);
    assert_eq!(removed(&ev[0]), a.hashes[1]);
    assert_eq!(removed(&ev[1]), a.hashes[0]);
    assert_eq!(removed(&ev[2]), b.hashes[1]);
    assert_eq!(stored(&ev[3]).block_hashes, d.hashes);
    assert_eq!(c.evictions(), 3);
    // b's first block survives; a is gone.
    assert_eq!(c.cached_prefix(&b.hashes, 8), vec![2]);
    assert!(c.cached_prefix(&a.hashes, 8).is_empty());
}

#[test]
fn out_of_blocks_changes_nothing() {
    let mut c = KvCache::new(2, 4);
    let s = Seq::new((0..12).collect(), 4);
    let mut t = BlockTable::default();
    assert_eq!(c.allocate(&mut t, &[], 0, 12, s.view()), Err(OutOfBlocks));
    assert!(t.blocks().is_empty());
    assert_eq!(c.num_free(), 2);
    assert!(c.take_events().is_empty());
}

#[test]
fn hits_on_free_blocks_count_against_free_space() {
    let mut c = KvCache::new(3, 4);
    let s = Seq::new((0..9).collect(), 4);
    let mut t = BlockTable::default();
    c.allocate(&mut t, &[], 0, 9, s.view()).unwrap();
    c.free(&mut t);
    let hits = c.cached_prefix(&s.hashes, 9);
    assert_eq!(hits.len(), 2);
    // 2 free hits + 1 new block = 3 blocks: fits exactly.
    let mut u = BlockTable::default();
    c.allocate(&mut u, &hits, 8, 1, s.view()).unwrap();
    assert_eq!(c.num_free(), 0);
    assert!(
        c.take_events()
            .iter()
            .all(|e| matches!(e, KvEvent::Stored(_)))
    );
}

#[test]
fn duplicate_content_is_not_stored_twice() {
    let mut c = KvCache::new(8, 4);
    let s = Seq::new((0..8).collect(), 4);
    let mut a = BlockTable::default();
    c.allocate(&mut a, &[], 0, 8, s.view()).unwrap();
    c.take_events();
    // Same 8 tokens: one block hits, the second is recomputed into a new physical block
    // whose hash is already cached.
    let hits = c.cached_prefix(&s.hashes, 8);
    let mut b = BlockTable::default();
    c.allocate(&mut b, &hits, 4, 4, s.view()).unwrap();
    assert!(c.take_events().is_empty());
    assert_eq!(c.num_cached(), 2);
    c.free(&mut a);
    c.free(&mut b);
    // Evicting everything removes each hash exactly once.
    let big = Seq::new((500..532).collect(), 4);
    let mut t = BlockTable::default();
    c.allocate(&mut t, &[], 0, 32, big.view()).unwrap();
    let removed_count = c
        .take_events()
        .iter()
        .filter(|e| matches!(e, KvEvent::Removed(_)))
        .count();
    assert_eq!(removed_count, 2);
}

#[test]
fn reset_refused_while_in_use() {
    let mut c = KvCache::new(4, 4);
    let s = Seq::new((0..8).collect(), 4);
    let mut t = BlockTable::default();
    c.allocate(&mut t, &[], 0, 8, s.view()).unwrap();
    c.take_events();
    assert!(!c.reset_prefix_cache());
    assert!(c.take_events().is_empty());
    c.free(&mut t);
    assert!(c.reset_prefix_cache());
    assert_eq!(c.take_events(), vec![KvEvent::AllCleared]);
    assert_eq!(c.num_cached(), 0);
    assert!(c.cached_prefix(&s.hashes, 9).is_empty());
    // Reusing a cleared block emits no BlockRemoved.
    let mut u = BlockTable::default();
    c.allocate(&mut u, &[], 0, 16, Seq::new((50..66).collect(), 4).view())
        .unwrap();
    assert!(
        c.take_events()
            .iter()
            .all(|e| !matches!(e, KvEvent::Removed(_)))
    );
}

#[test]
fn salt_is_reported_on_the_chain_start_only() {
    let mut c = KvCache::new(8, 4);
    let s = Seq::new((0..8).collect(), 4);
    let mut t = BlockTable::default();
    let view = SeqView {
        cache_salt: Some("tenant"),
        ..s.view()
    };
    c.allocate(&mut t, &[], 0, 4, view).unwrap();
    c.allocate(&mut t, &[], 4, 4, view).unwrap();
    let ev = c.take_events();
    assert_eq!(stored(&ev[0]).cache_salt.as_deref(), Some("tenant"));
    assert_eq!(stored(&ev[1]).cache_salt, None);
}
