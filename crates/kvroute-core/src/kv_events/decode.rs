//! Decoding of a KV-event payload (the third ZMQ frame) in any released layout.
//!
//! The layout is detected from the payload's structure, never configured: a batch is an array
//! of two (vLLM 0.9.0) or three elements; each event is an array tagged by its first element
//! (vLLM ≤ 0.23, SGLang ≤ 0.5.19) or a map tagged by `"type"` (vLLM ≥ 0.24, SGLang ≥ 0.5.20).
//! So one subscriber keeps working across an engine upgrade. How each event's fields are read
//! lives in [`super::fields`]; this file only finds the events.
//!
//! Imports go one way: [`super::msgpack`] (the reader and [`DecodeError`]) ← [`super::fields`]
//! (one event) ← this file (the batch).

use super::fields;
use super::msgpack::Reader;
use super::wire::EventBatch;

// Re-exported where callers decode, so the public path stays `kv_events::decode::DecodeError`;
// it is defined in the lowest of the three files that return it.
pub use super::msgpack::DecodeError;

/// Decodes one msgpack payload into a batch, whatever release produced it.
///
/// Unknown event types become [`super::KvEvent::Unknown`]; unknown fields are ignored; bytes
/// after the batch are ignored. Never panics, whatever the input.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut r = Reader::new(payload);
    let len = r.array_len()?;
    if len < 2 {
        return Err(DecodeError::BatchTooShort(len));
    }
    let ts = r.number()?;
    let count = r.array_len()?;
    // Every event takes at least two bytes; cap so a forged count cannot reserve gigabytes.
    let mut events = Vec::with_capacity(count.min(r.remaining() / 2));
    for _ in 0..count {
        events.push(fields::read_event(&mut r)?);
    }
    let dp_rank = if len >= 3 && !r.eat_nil()? {
        Some(i64::try_from(r.int()?).map_err(|_| DecodeError::OutOfRange("dp_rank"))?)
    } else {
        None
    };
    // Later releases may append batch fields; they carry nothing the router needs.
    for _ in 3..len {
        r.skip()?;
    }
    Ok(EventBatch {
        ts,
        events,
        dp_rank,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::{BlockStored, EngineHash, KvEvent};

    #[test]
    fn the_data_parallel_rank_is_read_in_every_layout_that_sends_it() {
        let batch = crate::kv_events::EventBatch {
            ts: 1.0,
            events: vec![KvEvent::AllCleared],
            dp_rank: Some(3),
        };
        for layout in crate::kv_events::Layout::ALL {
            let decoded = decode_batch(&crate::kv_events::encode_batch(&batch, layout)).unwrap();
            // vLLM 0.9.0's batch has no third field; every later layout carries the rank
            // (SGLang names it `attn_dp_rank`, in the same place).
            let expected = (layout.name() != "vllm-0.9.0").then_some(3);
            assert_eq!(decoded.dp_rank, expected, "{}", layout.name());
        }
    }

    #[test]
    fn two_element_batch_has_no_rank() {
        // [1.5, [["AllBlocksCleared"]]]
        let mut p = vec![0x92, 0xcb];
        p.extend_from_slice(&1.5f64.to_be_bytes());
        p.extend_from_slice(&[0x91, 0x91, 0xb0]);
        p.extend_from_slice(b"AllBlocksCleared");
        let b = decode_batch(&p).unwrap();
        assert_eq!(b.ts, 1.5);
        assert_eq!(b.events, vec![KvEvent::AllCleared]);
        assert_eq!(b.dp_rank, None);
    }

    #[test]
    fn unknown_events_and_trailing_batch_fields_are_tolerated() {
        // [2, [["Foo", 1], {"type": "BlockRemoved", "block_hashes": [7], "x": [1]}], 3, "extra"]
        let mut p = vec![0x94, 0x02, 0x92, 0x92, 0xa3];
        p.extend_from_slice(b"Foo");
        p.push(0x01);
        p.push(0x83);
        p.extend_from_slice(&[0xa4, b't', b'y', b'p', b'e', 0xac]);
        p.extend_from_slice(b"BlockRemoved");
        p.push(0xac);
        p.extend_from_slice(b"block_hashes");
        p.extend_from_slice(&[0x91, 0x07, 0xa1, b'x', 0x91, 0x01, 0x03, 0xa5]);
        p.extend_from_slice(b"extra");
        let b = decode_batch(&p).unwrap();
        assert_eq!(b.events[0], KvEvent::Unknown("Foo".into()));
        match &b.events[1] {
            KvEvent::Removed(r) => assert_eq!(r.block_hashes, vec![EngineHash(7)]),
            other => panic!("{other:?}"),
        }
        assert_eq!(b.dp_rank, Some(3));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for p in [&[][..], &[0x91, 0x01], &[0x92, 0x01, 0x91, 0x05], &[0xc1]] {
            assert!(decode_batch(p).is_err(), "{p:x?}");
        }
        let _ = BlockStored::default();
    }
}
