//! Decoding cost of a realistic KV-event payload: one BlockStored of 32 blocks × 16 tokens
//! (a 512-token prompt committed at once), in the newest map layout and an older array layout.
//! Throughput is in blocks; events/s = blocks/s ÷ 32.
//!
//! Run: `cargo bench --bench kv_events`
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and bench code: a failed step should stop the run"
)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvroute::kv_events::{
    BlockStored, EngineHash, EventBatch, KvEvent, Layout, decode_batch, encode_batch,
};

const BLOCKS: u64 = 32;
const BLOCK_SIZE: u32 = 16;

fn realistic_batch() -> EventBatch {
    // sha256-derived ids use the whole u64 range; token ids of a 150k vocabulary.
    let hashes = (0..BLOCKS)
        .map(|i| EngineHash(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(i + 1)))
        .collect();
    let tokens = (0..BLOCKS as u32 * BLOCK_SIZE)
        .map(|i| (i * 7919) % 151_643)
        .collect();
    EventBatch {
        ts: 1_767_225_600.25,
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: hashes,
            parent_block_hash: Some(EngineHash(0xdead_beef_cafe_f00d)),
            token_ids: tokens,
            block_size: BLOCK_SIZE,
            medium: Some("GPU".into()),
            group_idx: Some(0),
            kv_cache_spec_kind: Some("full_attention".into()),
            ..Default::default()
        })],
        dp_rank: Some(0),
    }
}

fn bench(c: &mut Criterion) {
    let batch = realistic_batch();
    let mut group = c.benchmark_group("kv_events");
    group.throughput(Throughput::Elements(BLOCKS));
    for layout in [Layout::Vllm0_33, Layout::Vllm0_22] {
        let payload = encode_batch(&batch, layout);
        assert_eq!(decode_batch(&payload).unwrap(), layout.represent(&batch));
        group.bench_function(format!("decode_32x16/{}", layout.name()), |b| {
            b.iter(|| decode_batch(black_box(&payload)))
        });
        group.bench_function(format!("encode_32x16/{}", layout.name()), |b| {
            b.iter(|| encode_batch(black_box(&batch), layout))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
