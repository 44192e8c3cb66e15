//! Property tests: no input makes the decoder panic, and every layout round-trips what it can
//! represent.

use kvroute::kv_events::{
    BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Layout, decode_batch, encode_batch,
};
use proptest::prelude::*;

fn opt_name() -> impl Strategy<Value = Option<String>> {
    proptest::option::of("[a-zA-Z0-9_-]{0,40}")
}

fn event() -> impl Strategy<Value = KvEvent> {
    let stored = (
        proptest::collection::vec(any::<u64>(), 0..6),
        proptest::option::of(any::<u64>()),
        proptest::collection::vec(any::<u32>(), 0..40),
        any::<u32>(),
        proptest::option::of(any::<i64>()),
        (opt_name(), opt_name(), opt_name()),
        proptest::option::of(any::<i64>()),
        opt_name(),
    )
        .prop_map(
            |(hashes, parent, tokens, bs, lora_id, (medium, lora, salt), group, kind)| {
                KvEvent::Stored(BlockStored {
                    block_hashes: hashes.into_iter().map(EngineHash).collect(),
                    parent_block_hash: parent.map(EngineHash),
                    token_ids: tokens,
                    block_size: bs,
                    lora_id,
                    medium,
                    lora_name: lora,
                    cache_salt: salt,
                    group_idx: group,
                    kv_cache_spec_kind: kind,
                })
            },
        );
    let removed = (
        proptest::collection::vec(any::<u64>(), 0..6),
        opt_name(),
        proptest::option::of(any::<i64>()),
    )
        .prop_map(|(hashes, medium, group)| {
            KvEvent::Removed(BlockRemoved {
                block_hashes: hashes.into_iter().map(EngineHash).collect(),
                medium,
                group_idx: group,
            })
        });
    prop_oneof![
        stored,
        removed,
        Just(KvEvent::AllCleared),
        "[A-Z][a-z]{1,12}".prop_map(KvEvent::Unknown)
    ]
}

fn batch() -> impl Strategy<Value = EventBatch> {
    (
        -1e12f64..1e12,
        proptest::collection::vec(event(), 0..5),
        proptest::option::of(any::<i64>()),
    )
        .prop_map(|(ts, events, dp_rank)| EventBatch {
            ts,
            events,
            dp_rank,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_batch(&bytes);
    }

    /// Mutations of a valid payload reach much deeper into the decoder than random bytes.
    #[test]
    fn mutated_payloads_never_panic(b in batch(), layout in 0..Layout::ALL.len(), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let mut bytes = encode_batch(&b, Layout::ALL[layout]);
        for (at, v) in flips {
            let n = bytes.len();
            bytes[at % n] = v;
        }
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn decode_inverts_encode_in_every_layout(b in batch(), layout in 0..Layout::ALL.len()) {
        let layout = Layout::ALL[layout];
        let back = decode_batch(&encode_batch(&b, layout)).unwrap();
        // Unknown events named like known ones decode as those; skip that corner.
        prop_assume!(!b.events.iter().any(|e| matches!(e, KvEvent::Unknown(n) if n == "BlockStored" || n == "BlockRemoved")));
        prop_assert_eq!(back, layout.represent(&b));
    }
}
