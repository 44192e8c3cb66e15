//! The index's lower tiers, fed by the tiered-cache fixtures built with vLLM 0.32's and SGLang
//! 0.5.23's own event classes (`scripts/fixtures/tier_kv_events.py`): every event shape
//! (placeholder stores, self-describing chunks with reference counts, removals per tier,
//! clears), and lookups split by tier as the engines load them.

use std::fs;
use std::time::Duration;

use kvroute::fleet::WorkerId;
use kvroute::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex};
use kvroute::kv_events::{EventBatch, KvEvent, decode_batch};
use kvroute::tokens::{BlockHash, HashSeed, block_hashes};

const W: WorkerId = WorkerId(3);

fn seeds(salt: Option<&str>, lora: Option<&str>) -> HashSeed {
    HashSeed::new("m", lora, salt)
}

fn fixture(name: &str) -> EventBatch {
    let path = crate::support::fixtures()
        .join("kv-events")
        .join(format!("{name}.bin"));
    decode_batch(&fs::read(path).unwrap()).unwrap()
}

fn holdings() -> Holdings {
    Holdings::new(
        KvIndex::new(IndexConfig::default()),
        ApproxIndex::new(ApproxConfig {
            ttl: Duration::from_secs(30),
            capacity_per_worker: 100,
        }),
    )
}

/// vLLM's fixtures: 4 blocks of 32 tokens, 1000, 1001, ….
fn vllm_request() -> Vec<BlockHash> {
    let toks: Vec<u32> = (1000..1000 + 4 * 32).collect();
    block_hashes(seeds(None, None), &toks, 32)
}

/// (GPU, host memory, disk) blocks of the request `w` holds.
fn split(h: &Holdings, blocks: &[BlockHash], w: WorkerId) -> (u32, u32, u32) {
    let o = h.lookup(blocks, Duration::from_secs(1));
    let [cpu, disk] = o.lower(w);
    (o.get(w), cpu, disk)
}

#[test]
fn placeholder_stores_move_known_blocks_to_the_cpu_tier() {
    let h = holdings();
    let a = h.exact.apply(
        W,
        &fixture("vllm-0_32_0__offload_placeholder_stored"),
        &seeds,
    );
    // The GPU chain (2 blocks) and both placeholders, each naming one known block.
    assert_eq!((a.events, a.stored, a.unplaced), (3, 4, 0));
    let req = vllm_request();
    // Both blocks are on the GPU: nothing to load.
    assert_eq!(split(&h, &req, W), (2, 0, 0));
    assert_eq!(h.exact.lower_entries(), 2);
    // The GPU evicts block 1 (its CPU copy stays), the CPU tier evicts block 0 (its GPU copy
    // stays): block 0 from the GPU, then block 1 loaded from host memory.
    h.exact.apply(
        W,
        &fixture("vllm-0_32_0__offload_placeholder_removed"),
        &seeds,
    );
    assert_eq!(split(&h, &req, W), (1, 1, 0));
    // Another worker holds nothing.
    assert_eq!(split(&h, &req, WorkerId(0)), (0, 0, 0));
}

#[test]
fn a_placeholder_for_an_unknown_block_is_unplaced() {
    let h = holdings();
    let mut batch = fixture("vllm-0_32_0__offload_placeholder_stored");
    batch.events.remove(0); // no GPU store announced the blocks
    let a = h.exact.apply(W, &batch, &seeds);
    assert_eq!((a.stored, a.unplaced, a.skipped), (0, 2, 2));
    assert_eq!(h.exact.lower_entries(), 0);
}

#[test]
fn self_describing_chunks_are_reference_counted() {
    let h = holdings();
    let a = h
        .exact
        .apply(W, &fixture("vllm-0_32_0__self_describing_stored"), &seeds);
    // CPU: blocks 0, 1 and (overlapping) 1, 2 → 3 blocks; STORAGE: 0, 1.
    assert_eq!((a.events, a.stored, a.unplaced), (3, 5, 0));
    let req = vllm_request();
    // No GPU copy: three blocks from host memory (the disk copies of 0 and 1 are slower).
    assert_eq!(split(&h, &req, W), (0, 3, 0));
    h.exact
        .apply(W, &fixture("vllm-0_32_0__self_describing_removed"), &seeds);
    // The first chunk's eviction takes block 0 and one of block 1's two announcements: block
    // 1 and 2 stay in host memory, but without block 0 no prefix is left.
    assert_eq!(h.exact.lower_entries(), 2);
    assert_eq!(split(&h, &req, W), (0, 0, 0));
    assert_eq!(split(&h, &req[1..], W), (0, 2, 0));
}

#[test]
fn chunks_may_arrive_before_their_parent() {
    let h = holdings();
    let mut batch = fixture("vllm-0_32_0__self_describing_stored");
    batch.events.swap(0, 1); // the chunk continuing block 0 comes first
    let a = h.exact.apply(W, &batch, &seeds);
    assert_eq!((a.events, a.unplaced), (3, 0));
    assert_eq!(split(&h, &vllm_request(), W), (0, 3, 0));
}

#[test]
fn sglang_hicache_tiers() {
    let h = holdings();
    let a = h
        .exact
        .apply(W, &fixture("sglang-0_5_23__hicache_tiers"), &seeds);
    assert_eq!(a.events, 5);
    let toks: Vec<u32> = (500..532).collect();
    let req = block_hashes(seeds(None, None), &toks, 16);
    // Demoted from the GPU; block 0 in host memory and on disk, block 1's host copy removed.
    assert_eq!(split(&h, &req, W), (0, 1, 0));
    assert_eq!(h.exact.lower_entries(), 2);
}

#[test]
fn a_clear_and_a_lost_stream_empty_every_tier() {
    let h = holdings();
    h.exact
        .apply(W, &fixture("vllm-0_32_0__self_describing_stored"), &seeds);
    h.exact.apply(
        W,
        &EventBatch {
            ts: 0.0,
            events: vec![KvEvent::AllCleared],
            dp_rank: None,
        },
        &seeds,
    );
    assert_eq!(h.exact.lower_entries(), 0);
    h.exact.apply(
        W,
        &fixture("vllm-0_32_0__offload_placeholder_stored"),
        &seeds,
    );
    assert_eq!(h.exact.lower_entries(), 2);
    // What the feed does on a gap it cannot replay, a restart or an undecodable batch.
    h.clear_worker(W);
    assert_eq!((h.exact.entries(), h.exact.lower_entries()), (0, 0));
    // Replaying the stream from sequence 0 restores every tier.
    for name in [
        "vllm-0_32_0__offload_placeholder_stored",
        "vllm-0_32_0__offload_placeholder_removed",
    ] {
        h.exact.apply(W, &fixture(name), &seeds);
    }
    assert_eq!(split(&h, &vllm_request(), W), (1, 1, 0));
}
