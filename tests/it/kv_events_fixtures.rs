//! Every recorded engine payload in `tests/fixtures/kv-events` decodes to the content its
//! `.json` records, and re-encodes byte for byte in its release's layout where kvroute's types
//! can hold all of it.

use std::fs;
use std::path::PathBuf;

use kvroute::kv_events::{EngineHash, EventBatch, KvEvent, Layout, decode_batch, encode_batch};
use serde_json::Value;

struct Fixture {
    name: String,
    json: Value,
    payload: Vec<u8>,
}

fn fixtures() -> Vec<Fixture> {
    let dir = crate::support::fixtures().join("kv-events");
    let mut paths: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let json: Value = serde_json::from_slice(&fs::read(&p).unwrap()).unwrap();
            let bin = dir.join(json["zmq_frames"]["payload_file"].as_str().unwrap());
            Fixture {
                name: json["name"].as_str().unwrap().to_owned(),
                payload: fs::read(bin).unwrap(),
                json,
            }
        })
        .collect()
}

/// The layout that produced a fixture, from its `schema` field.
fn layout_of(schema: &str) -> Layout {
    match schema {
        "vllm-0.9.1" => Layout::Vllm0_9_1,
        "vllm-0.10.2" => Layout::Vllm0_10_2,
        "vllm-0.14.0" => Layout::Vllm0_14,
        "vllm-0.20.0" => Layout::Vllm0_20,
        "vllm-0.22.1" => Layout::Vllm0_22,
        "vllm-0.24.0" => Layout::Vllm0_24,
        "vllm-0.30.0" | "vllm-0.32.0" => Layout::Vllm0_30,
        "vllm-0.33.0" => Layout::Vllm0_33,
        "sglang-0.4.7" => Layout::Sglang0_4_7,
        "sglang-0.5.20" => Layout::Sglang0_5_20,
        "sglang-0.5.22" => Layout::Sglang0_5_22,
        other => panic!("fixture schema {other} has no layout"),
    }
}

fn hash(v: &Value) -> EngineHash {
    if let Some(hex) = v.get("bytes").and_then(Value::as_str) {
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let tail: [u8; 8] = bytes[bytes.len() - 8..].try_into().unwrap();
        return EngineHash(u64::from_be_bytes(tail));
    }
    match v.as_i64() {
        Some(i) => EngineHash(i as u64),
        None => EngineHash(v.as_u64().unwrap()),
    }
}

fn hashes(v: &Value) -> Vec<EngineHash> {
    v.as_array().unwrap().iter().map(hash).collect()
}

fn opt_str(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn opt_int(v: &Value, key: &str) -> Option<i64> {
    v.get(key).and_then(Value::as_i64)
}

fn check_event(name: &str, got: &KvEvent, want: &Value) {
    let ctx = |field: &str| format!("{name}: {field}");
    match (got, want["type"].as_str().unwrap()) {
        (KvEvent::Stored(s), "BlockStored") => {
            assert_eq!(
                s.block_hashes,
                hashes(&want["block_hashes"]),
                "{}",
                ctx("hashes")
            );
            let parent = &want["parent_block_hash"];
            let parent = (!parent.is_null()).then(|| hash(parent));
            assert_eq!(s.parent_block_hash, parent, "{}", ctx("parent"));
            let tokens: Vec<u32> = want["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            assert_eq!(s.token_ids, tokens, "{}", ctx("token_ids"));
            assert_eq!(s.block_size as u64, want["block_size"].as_u64().unwrap());
            assert_eq!(s.lora_id, opt_int(want, "lora_id"), "{}", ctx("lora_id"));
            assert_eq!(s.medium, opt_str(want, "medium"), "{}", ctx("medium"));
            assert_eq!(
                s.lora_name,
                opt_str(want, "lora_name"),
                "{}",
                ctx("lora_name")
            );
            assert_eq!(s.cache_salt, opt_str(want, "cache_salt"), "{}", ctx("salt"));
            assert_eq!(
                s.group_idx,
                opt_int(want, "group_idx"),
                "{}",
                ctx("group_idx")
            );
            assert_eq!(
                s.kv_cache_spec_kind,
                opt_str(want, "kv_cache_spec_kind"),
                "{}",
                ctx("kv_cache_spec_kind")
            );
        }
        (KvEvent::Removed(r), "BlockRemoved") => {
            assert_eq!(
                r.block_hashes,
                hashes(&want["block_hashes"]),
                "{}",
                ctx("hashes")
            );
            assert_eq!(r.medium, opt_str(want, "medium"), "{}", ctx("medium"));
            assert_eq!(
                r.group_idx,
                opt_int(want, "group_idx"),
                "{}",
                ctx("group_idx")
            );
        }
        (KvEvent::AllCleared, "AllBlocksCleared") => {}
        (got, want) => panic!("{name}: decoded {got:?}, fixture says {want}"),
    }
}

fn check_batch(f: &Fixture, batch: &EventBatch) {
    let typed = &f.json["typed"];
    assert_eq!(batch.ts, typed["ts"].as_f64().unwrap(), "{}: ts", f.name);
    let rank = typed
        .get("data_parallel_rank")
        .or_else(|| typed.get("attn_dp_rank"))
        .and_then(Value::as_i64);
    assert_eq!(batch.dp_rank, rank, "{}: dp_rank", f.name);
    let want = typed["events"].as_array().unwrap();
    assert_eq!(batch.events.len(), want.len(), "{}: event count", f.name);
    for (got, want) in batch.events.iter().zip(want) {
        check_event(&f.name, got, want);
    }
}

#[test]
fn every_fixture_decodes_to_its_recorded_content() {
    let all = fixtures();
    assert!(all.len() >= 55, "only {} fixtures found", all.len());
    for f in &all {
        let batch = decode_batch(&f.payload).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        check_batch(f, &batch);
    }
}

/// Fixtures holding content kvroute's types drop (32-byte hashes, SGLang's `session_id`).
fn representable(f: &Fixture) -> bool {
    let events = f.json["typed"]["events"].as_array().unwrap();
    !f.name.contains("bytes_hashes")
        && !events
            .iter()
            .any(|e| e.get("session_id").is_some_and(|s| !s.is_null()))
}

#[test]
fn fixtures_re_encode_byte_for_byte_in_their_layout() {
    let mut exact = 0;
    for f in fixtures().iter().filter(|f| representable(f)) {
        let layout = layout_of(f.json["schema"].as_str().unwrap());
        let batch = decode_batch(&f.payload).unwrap();
        let bytes = encode_batch(&batch, layout);
        assert_eq!(
            bytes,
            f.payload,
            "{} re-encoded in {} differs",
            f.name,
            layout.name()
        );
        exact += 1;
    }
    // All but the bytes-hash, mixed (session_id) and SGLang ≥ 0.5.20 salted ones.
    assert!(exact >= 48, "only {exact} fixtures were compared");
}

#[test]
fn every_fixture_round_trips_through_every_layout() {
    for f in fixtures() {
        let batch = decode_batch(&f.payload).unwrap();
        for layout in Layout::ALL {
            let back = decode_batch(&encode_batch(&batch, layout)).unwrap();
            assert_eq!(
                back,
                layout.represent(&batch),
                "{} via {}",
                f.name,
                layout.name()
            );
        }
    }
}

#[test]
fn fixture_replay_frame_layout_matches_the_layout_table() {
    for f in fixtures() {
        let layout = layout_of(f.json["schema"].as_str().unwrap());
        let frames = f.json["encoding"]["replay_reply_frames"]
            .as_array()
            .unwrap();
        assert_eq!(
            layout.replay_reply_has_topic(),
            frames.len() == 3,
            "{}",
            f.name
        );
        assert_eq!(f.json["zmq_frames"]["topic"], "kv-events");
    }
}

/// vLLM ≥ 0.17 sends a salted request's `cache_salt` as `extra_keys[0] == [salt]`: splice that
/// into the recorded 0.33 root chain (whose `extra_keys` is `[nil, nil]`).
#[test]
fn vllm_salt_in_extra_keys_of_the_first_block_is_read() {
    let f = fixtures()
        .into_iter()
        .find(|f| f.name == "vllm-0_33_0__stored_root")
        .unwrap();
    let unsalted: &[u8] = b"\xaaextra_keys\x92\xc0\xc0";
    let at = f
        .payload
        .windows(unsalted.len())
        .position(|w| w == unsalted)
        .unwrap();
    let mut salted = f.payload[..at].to_vec();
    salted.extend_from_slice(b"\xaaextra_keys\x92\x91\xa8tenant-a\xc0");
    salted.extend_from_slice(&f.payload[at + unsalted.len()..]);
    let batch = decode_batch(&salted).unwrap();
    let KvEvent::Stored(s) = &batch.events[0] else {
        panic!("{batch:?}")
    };
    assert_eq!(s.cache_salt.as_deref(), Some("tenant-a"));
    // And the encoder writes exactly this shape.
    assert_eq!(encode_batch(&batch, Layout::Vllm0_33), salted);
}

#[test]
fn truncated_fixtures_are_errors_not_panics() {
    for f in fixtures() {
        for cut in 0..f.payload.len() {
            assert!(
                decode_batch(&f.payload[..cut]).is_err(),
                "{} cut at {cut}",
                f.name
            );
        }
    }
}

/// The tiered-cache fixtures (built with vLLM 0.32's and SGLang 0.5.23's own event classes by
/// `scripts/fixtures/tier_kv_events.py`) name every tier and every shape the offloading
/// connector and HiCache send: placeholder stores, chunk-granular self-describing stores,
/// removals per tier.
#[test]
fn tier_fixtures_decode_to_every_tier_and_shape() {
    use kvroute::kv_events::Tier;
    let mut tiers = std::collections::BTreeSet::new();
    let (mut placeholders, mut full_lower, mut removals) = (0, 0, 0);
    for f in fixtures().iter().filter(|f| {
        f.name.contains("offload")
            || f.name.contains("self_describing")
            || f.name.contains("hicache")
    }) {
        let batch = decode_batch(&f.payload).unwrap();
        for e in &batch.events {
            let tier = e
                .prefix_tier()
                .unwrap_or_else(|| panic!("{}: {e:?}", f.name));
            tiers.insert(tier);
            match e {
                KvEvent::Stored(s) if s.is_placeholder() => {
                    assert_eq!(tier, Tier::Cpu, "{}", f.name);
                    placeholders += 1;
                }
                KvEvent::Stored(s) if tier != Tier::Gpu => {
                    assert_eq!(
                        s.token_ids.len(),
                        s.block_hashes.len() * s.block_size as usize
                    );
                    full_lower += 1;
                }
                KvEvent::Removed(_) if tier != Tier::Gpu => removals += 1,
                _ => {}
            }
        }
    }
    assert_eq!(tiers.into_iter().collect::<Vec<_>>(), Tier::ALL.to_vec());
    assert_eq!((placeholders, full_lower, removals), (2, 5, 4));
}
