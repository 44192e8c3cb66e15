//! Encoding of event batches exactly as a given engine release publishes them.
//!
//! The simulated engine uses this so the router is exercised against the real wire format of
//! any release, not a kvroute dialect. Each [`Layout`] reproduces that release's msgspec
//! structs: field order, which fields are omitted when unset (`omit_defaults`), map header
//! widths, signed or unsigned hashes. A layout can only say what its release could: fields it
//! lacks (say `cache_salt` before vLLM 0.20) are dropped, see [`Layout::represent`].

use super::msgpack::Writer;
use super::wire::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Tier};

/// An engine release's wire layout (named by the first release that used it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// vLLM 0.33: map events, 15 BlockStored fields (map16 header), unsigned int hashes.
    #[default]
    Vllm0_33,
    /// vLLM 0.30–0.32: map events, 14 BlockStored fields.
    Vllm0_30,
    /// vLLM 0.24–0.25: the first map layout, 11 BlockStored fields.
    Vllm0_24,
    /// vLLM 0.22–0.23: array events with 11 fields (`kv_cache_spec_*`).
    Vllm0_22,
    /// vLLM 0.20–0.21: array events with 9 fields (`extra_keys`, `group_idx`).
    Vllm0_20,
    /// vLLM 0.14–0.16: array events with 7 fields (`lora_name`).
    Vllm0_14,
    /// vLLM 0.10.2–0.13: array events with 6 fields (`medium`), sha256-derived unsigned hashes.
    Vllm0_10_2,
    /// vLLM 0.9.1–0.10.1: array events with 5 fields, signed hashes (Python `hash()`).
    Vllm0_9_1,
    /// vLLM 0.9.0: as 0.9.1, but a batch is only `[ts, events]`.
    Vllm0_9_0,
    /// SGLang 0.4.7–0.5.8: array events with 5 fields, signed hashes, `attn_dp_rank`.
    Sglang0_4_7,
    /// SGLang 0.5.20–0.5.21: map events with `medium`, `cache_salt`, `session_id`.
    Sglang0_5_20,
    /// SGLang 0.5.22–0.5.23: as 0.5.20 plus `lora_name`.
    Sglang0_5_22,
}

/// Which of vLLM's BlockStored fields a layout declares, in vLLM's order.
const VLLM_STORED: [&str; 15] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
];

impl Layout {
    /// Every layout, newest first.
    pub const ALL: [Layout; 12] = [
        Layout::Vllm0_33,
        Layout::Vllm0_30,
        Layout::Vllm0_24,
        Layout::Vllm0_22,
        Layout::Vllm0_20,
        Layout::Vllm0_14,
        Layout::Vllm0_10_2,
        Layout::Vllm0_9_1,
        Layout::Vllm0_9_0,
        Layout::Sglang0_4_7,
        Layout::Sglang0_5_20,
        Layout::Sglang0_5_22,
    ];

    /// Parses a name like `vllm-0.33`, `vllm-0.22`, `sglang-0.5.22` (CLI `--kv-events-layout`).
    pub fn from_name(name: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The layout's name, as accepted by [`Layout::from_name`].
    pub fn name(self) -> &'static str {
        match self {
            Layout::Vllm0_33 => "vllm-0.33",
            Layout::Vllm0_30 => "vllm-0.30",
            Layout::Vllm0_24 => "vllm-0.24",
            Layout::Vllm0_22 => "vllm-0.22",
            Layout::Vllm0_20 => "vllm-0.20",
            Layout::Vllm0_14 => "vllm-0.14",
            Layout::Vllm0_10_2 => "vllm-0.10.2",
            Layout::Vllm0_9_1 => "vllm-0.9.1",
            Layout::Vllm0_9_0 => "vllm-0.9.0",
            Layout::Sglang0_4_7 => "sglang-0.4.7",
            Layout::Sglang0_5_20 => "sglang-0.5.20",
            Layout::Sglang0_5_22 => "sglang-0.5.22",
        }
    }

    /// Whether this release's replay replies carry the topic (`[topic, seq, payload]`, vLLM ≥
    /// 0.26, SGLang ≥ 0.5.22) rather than `[seq, payload]`.
    pub fn replay_reply_has_topic(self) -> bool {
        matches!(
            self,
            Layout::Vllm0_33 | Layout::Vllm0_30 | Layout::Sglang0_5_22
        )
    }

    fn is_sglang(self) -> bool {
        matches!(
            self,
            Layout::Sglang0_4_7 | Layout::Sglang0_5_20 | Layout::Sglang0_5_22
        )
    }

    fn maps(self) -> bool {
        matches!(
            self,
            Layout::Vllm0_33
                | Layout::Vllm0_30
                | Layout::Vllm0_24
                | Layout::Sglang0_5_20
                | Layout::Sglang0_5_22
        )
    }

    fn signed_hashes(self) -> bool {
        matches!(self, Layout::Vllm0_9_1 | Layout::Vllm0_9_0) || self.is_sglang()
    }

    /// How many of [`VLLM_STORED`] a vLLM layout declares (SGLang layouts: its first five).
    fn stored_fields(self) -> usize {
        match self {
            Layout::Vllm0_33 => 15,
            Layout::Vllm0_30 => 14,
            Layout::Vllm0_24 | Layout::Vllm0_22 => 11,
            Layout::Vllm0_20 => 9,
            Layout::Vllm0_14 => 7,
            Layout::Vllm0_10_2 => 6,
            _ => 5,
        }
    }

    fn has(self, field: &str) -> bool {
        if self.is_sglang() {
            return match field {
                "medium" | "cache_salt" => self != Layout::Sglang0_4_7,
                "lora_name" => self == Layout::Sglang0_5_22,
                _ => false,
            };
        }
        VLLM_STORED[..self.stored_fields()].contains(&field)
    }

    /// What `decode_batch(encode_batch(batch, self))` returns: the batch without the fields
    /// this release cannot carry. vLLM carries a salt only on a chain's first block (no parent).
    pub fn represent(self, batch: &EventBatch) -> EventBatch {
        let opt = |keep: bool, v: &Option<String>| if keep { v.clone() } else { None };
        let events = batch
            .events
            .iter()
            .map(|e| match e {
                KvEvent::Stored(s) => KvEvent::Stored(BlockStored {
                    medium: opt(self.has("medium"), &s.medium),
                    lora_name: opt(self.has("lora_name"), &s.lora_name),
                    cache_salt: match self.is_sglang() {
                        true => opt(self.has("cache_salt"), &s.cache_salt),
                        false => opt(vllm_carries_salt(self, s), &s.cache_salt),
                    },
                    group_idx: s.group_idx.filter(|_| self.has("group_idx")),
                    kv_cache_spec_kind: opt(self.has("kv_cache_spec_kind"), &s.kv_cache_spec_kind),
                    ..s.clone()
                }),
                KvEvent::Removed(r) => KvEvent::Removed(BlockRemoved {
                    block_hashes: r.block_hashes.clone(),
                    medium: opt(self.has("medium"), &r.medium),
                    group_idx: r.group_idx.filter(|_| self.has("group_idx")),
                }),
                other => other.clone(),
            })
            .collect();
        EventBatch {
            ts: batch.ts,
            events,
            dp_rank: batch.dp_rank.filter(|_| self != Layout::Vllm0_9_0),
        }
    }
}

/// vLLM puts a non-empty salt in the extra keys of a request's first block: only a chain
/// without parent and with at least one block can carry it.
fn vllm_carries_salt(layout: Layout, s: &BlockStored) -> bool {
    layout.has("extra_keys")
        && vllm_extra_keys(s)
        && s.parent_block_hash.is_none()
        && !s.block_hashes.is_empty()
        && s.cache_salt.as_deref().is_some_and(|salt| !salt.is_empty())
}

/// Whether vLLM sends `extra_keys` with `s`: the GPU prefix cache does (one entry per block);
/// the offloading connector's host-memory and storage events leave it unset
/// (`OffloadingEventsTracker`: "Deferred"), so msgspec omits it from map layouts.
fn vllm_extra_keys(s: &BlockStored) -> bool {
    Tier::of_medium(s.medium.as_deref()) == Tier::Gpu
}

/// Encodes a batch as `layout`'s release would publish it (the payload, ZMQ frame 3).
///
/// Events of unknown type ([`KvEvent::Unknown`]) are encoded as a bare tag, which every
/// decoder skips.
pub fn encode_batch(batch: &EventBatch, layout: Layout) -> Vec<u8> {
    let size: usize = batch.events.iter().map(estimated_size).sum();
    let mut w = Writer::with_capacity(16 + size);
    let dp_rank = batch.dp_rank.filter(|_| layout != Layout::Vllm0_9_0);
    // vLLM's batch omits an unset rank (omit_defaults); SGLang's always has the slot.
    let with_rank = dp_rank.is_some() || layout.is_sglang();
    w.array(if with_rank { 3 } else { 2 });
    w.f64(batch.ts);
    w.array(batch.events.len());
    for event in &batch.events {
        match event {
            KvEvent::Stored(s) if layout.is_sglang() => sglang_stored(&mut w, s, layout),
            KvEvent::Stored(s) => vllm_stored(&mut w, s, layout),
            KvEvent::Removed(r) => removed(&mut w, r, layout),
            KvEvent::AllCleared => tag_only(&mut w, "AllBlocksCleared", layout),
            KvEvent::Unknown(name) => tag_only(&mut w, name, layout),
        }
    }
    if with_rank {
        opt_int(&mut w, dp_rank);
    }
    w.buf
}

fn estimated_size(e: &KvEvent) -> usize {
    match e {
        KvEvent::Stored(s) => 240 + 9 * s.block_hashes.len() + 3 * s.token_ids.len(),
        KvEvent::Removed(r) => 64 + 9 * r.block_hashes.len(),
        _ => 32,
    }
}

fn tag_only(w: &mut Writer, name: &str, layout: Layout) {
    if layout.maps() {
        w.map(1);
        w.str("type");
    } else {
        w.array(1);
    }
    w.str(name);
}

fn hash(w: &mut Writer, h: EngineHash, layout: Layout) {
    if layout.signed_hashes() {
        w.int(h.0 as i64);
    } else {
        w.uint(h.0);
    }
}

fn hashes(w: &mut Writer, hs: &[EngineHash], layout: Layout) {
    w.array(hs.len());
    for h in hs {
        hash(w, *h, layout);
    }
}

fn opt_hash(w: &mut Writer, h: Option<EngineHash>, layout: Layout) {
    match h {
        Some(h) => hash(w, h, layout),
        None => w.nil(),
    }
}

fn opt_int(w: &mut Writer, v: Option<i64>) {
    match v {
        Some(v) => w.int(v),
        None => w.nil(),
    }
}

fn opt_str(w: &mut Writer, v: Option<&str>) {
    match v {
        Some(v) => w.str(v),
        None => w.nil(),
    }
}

fn tokens(w: &mut Writer, t: &[u32]) {
    w.array(t.len());
    for t in t {
        w.uint(*t as u64);
    }
}

/// vLLM's `extra_keys`: one entry per block, `(lora_name?, cache_salt?)` or nil; the salt only
/// on the request's first block (a chain without parent).
fn extra_keys(w: &mut Writer, s: &BlockStored, with_salt: bool) {
    if s.block_hashes.is_empty() {
        w.nil();
        return;
    }
    w.array(s.block_hashes.len());
    for i in 0..s.block_hashes.len() {
        let salt = s.cache_salt.as_deref().filter(|_| i == 0 && with_salt);
        let keys: Vec<&str> = s.lora_name.as_deref().into_iter().chain(salt).collect();
        if keys.is_empty() {
            w.nil();
        } else {
            w.array(keys.len());
            keys.iter().for_each(|k| w.str(k));
        }
    }
}

fn vllm_stored(w: &mut Writer, s: &BlockStored, layout: Layout) {
    let declared = layout.stored_fields();
    if layout.maps() {
        // Required fields are always written; group_idx and kv_cache_spec_kind default to None.
        let n = 1
            + 7
            + vllm_extra_keys(s) as usize
            + s.group_idx.is_some() as usize
            + s.kv_cache_spec_kind.is_some() as usize;
        if declared + 1 > 15 {
            w.map16(n);
        } else {
            w.map(n);
        }
        w.str("type");
        w.str("BlockStored");
    } else {
        w.array(declared + 1);
        w.str("BlockStored");
    }
    let maps = layout.maps();
    for (i, name) in VLLM_STORED[..declared].iter().enumerate() {
        let present = match *name {
            "group_idx" => s.group_idx.is_some(),
            "kv_cache_spec_kind" => s.kv_cache_spec_kind.is_some(),
            "extra_keys" => vllm_extra_keys(s),
            _ => i < 8,
        };
        if maps && !present {
            continue;
        }
        if maps {
            w.str(name);
        }
        match *name {
            "block_hashes" => hashes(w, &s.block_hashes, layout),
            "parent_block_hash" => opt_hash(w, s.parent_block_hash, layout),
            "token_ids" => tokens(w, &s.token_ids),
            "block_size" => w.uint(s.block_size as u64),
            "lora_id" => opt_int(w, s.lora_id),
            "medium" => opt_str(w, s.medium.as_deref()),
            "lora_name" => opt_str(w, s.lora_name.as_deref()),
            "extra_keys" if vllm_extra_keys(s) => extra_keys(w, s, vllm_carries_salt(layout, s)),
            "group_idx" => opt_int(w, s.group_idx),
            "kv_cache_spec_kind" => opt_str(w, s.kv_cache_spec_kind.as_deref()),
            _ => w.nil(),
        }
    }
}

fn sglang_stored(w: &mut Writer, s: &BlockStored, layout: Layout) {
    if !layout.maps() {
        w.array(6);
        w.str("BlockStored");
    } else {
        let optional = [
            s.medium.is_some(),
            s.cache_salt.is_some(),
            s.lora_name.is_some() && layout.has("lora_name"),
        ];
        w.map(6 + optional.iter().filter(|p| **p).count());
        w.str("type");
        w.str("BlockStored");
    }
    let key = |w: &mut Writer, k: &str| {
        if layout.maps() {
            w.str(k);
        }
    };
    key(w, "block_hashes");
    hashes(w, &s.block_hashes, layout);
    key(w, "parent_block_hash");
    opt_hash(w, s.parent_block_hash, layout);
    key(w, "token_ids");
    tokens(w, &s.token_ids);
    key(w, "block_size");
    w.uint(s.block_size as u64);
    key(w, "lora_id");
    opt_int(w, s.lora_id);
    if !layout.maps() {
        return;
    }
    if let Some(m) = &s.medium {
        key(w, "medium");
        w.str(m);
    }
    if let Some(salt) = &s.cache_salt {
        key(w, "cache_salt");
        w.str(salt);
    }
    if let Some(name) = s.lora_name.as_deref().filter(|_| layout.has("lora_name")) {
        key(w, "lora_name");
        w.str(name);
    }
}

fn removed(w: &mut Writer, r: &BlockRemoved, layout: Layout) {
    if layout.is_sglang() {
        if layout.maps() {
            w.map(2 + r.medium.is_some() as usize);
            w.str("type");
            w.str("BlockRemoved");
            w.str("block_hashes");
            hashes(w, &r.block_hashes, layout);
            if let Some(m) = &r.medium {
                w.str("medium");
                w.str(m);
            }
        } else {
            w.array(2);
            w.str("BlockRemoved");
            hashes(w, &r.block_hashes, layout);
        }
        return;
    }
    if layout.maps() {
        w.map(3 + r.group_idx.is_some() as usize);
        w.str("type");
        w.str("BlockRemoved");
        w.str("block_hashes");
        hashes(w, &r.block_hashes, layout);
        w.str("medium");
        opt_str(w, r.medium.as_deref());
        if let Some(g) = r.group_idx {
            w.str("group_idx");
            w.int(g);
        }
        return;
    }
    let fields = 1 + layout.has("medium") as usize + layout.has("group_idx") as usize;
    w.array(1 + fields);
    w.str("BlockRemoved");
    hashes(w, &r.block_hashes, layout);
    if layout.has("medium") {
        opt_str(w, r.medium.as_deref());
    }
    if layout.has("group_idx") {
        opt_int(w, r.group_idx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::decode_batch;

    fn sample() -> EventBatch {
        EventBatch {
            ts: 12.5,
            events: vec![
                KvEvent::Stored(BlockStored {
                    block_hashes: vec![EngineHash(u64::MAX), EngineHash(3)],
                    parent_block_hash: None,
                    token_ids: (0..32).collect(),
                    block_size: 16,
                    lora_id: Some(2),
                    medium: Some("GPU".into()),
                    lora_name: Some("adapter".into()),
                    cache_salt: Some("tenant".into()),
                    group_idx: Some(0),
                    kv_cache_spec_kind: Some("full_attention".into()),
                }),
                KvEvent::Removed(BlockRemoved {
                    block_hashes: vec![EngineHash(1 << 63)],
                    medium: Some("CPU".into()),
                    group_idx: Some(1),
                }),
                KvEvent::AllCleared,
                KvEvent::Unknown("Future".into()),
            ],
            dp_rank: Some(1),
        }
    }

    #[test]
    fn every_layout_round_trips_what_it_can_represent() {
        let batch = sample();
        for layout in Layout::ALL {
            let bytes = encode_batch(&batch, layout);
            let back = decode_batch(&bytes).unwrap();
            assert_eq!(back, layout.represent(&batch), "{}", layout.name());
        }
    }

    #[test]
    fn names_parse_back() {
        for layout in Layout::ALL {
            assert_eq!(Layout::from_name(layout.name()), Some(layout));
        }
        assert_eq!(Layout::from_name("vllm-9"), None);
    }
}
