//! Tokenizing repeated content once: split at added tokens, cache the pieces.
//!
//! Tokenization dominates a routing decision (~10–15 ms for 8,000 tokens with Qwen3's
//! tokenizer), yet most of a chat prompt was seen before: the system prompt, the earlier turns.
//! A Hugging Face tokenizer first cuts its input at *added tokens* (`<|im_start|>`,
//! `<|im_end|>`, …) and tokenizes the text between them independently. So the ids of the text
//! between two such markers do not depend on anything outside it: we can cut there ourselves,
//! tokenize each piece once, remember its ids, and concatenate — and get exactly the ids of one
//! full `encode`.
//!
//! "Exactly" holds only when our cut reproduces the tokenizer's. [`Segmenter::for_tokenizer`]
//! checks, and refuses (the caller then encodes whole texts) when it cannot be sure:
//! - we cut at the tokenizer's first-pass added tokens (`normalized: false`), leftmost-longest
//!   as its matcher does; tokens with `lstrip`, `rstrip` or `single_word` move or veto the cut,
//!   so any of those disables segmenting;
//! - `encode_special_tokens` (special tokens kept as text), truncation and padding make pieces
//!   depend on each other;
//! - a `Metaspace` pre-tokenizer with `prepend_scheme: first` treats the piece at offset 0
//!   differently from the others;
//! - finally a probe: texts mixing markers with spaces, newlines, digits and non-ASCII must
//!   encode identically both ways.
//!
//! The cache keys a piece by its xxh3-128 hash and also keeps its text, so a hash collision
//! can never substitute another piece's ids.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use xxhash_rust::xxh3::xxh3_128;

/// Why a tokenizer's pieces cannot be tokenized independently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsegmentable(pub String);

impl std::fmt::Display for Unsegmentable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A piece of text between cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Ordinary text, tokenized by the tokenizer.
    Text(&'a str),
    /// An added token, always exactly this id.
    Marker(u32),
}

/// Cuts text at a tokenizer's added tokens, exactly where the tokenizer itself cuts.
#[derive(Debug, Clone)]
pub struct Segmenter {
    /// Added tokens by their first byte, longest first (leftmost-longest matching).
    by_first_byte: Vec<Vec<(Box<[u8]>, u32)>>,
}

impl Segmenter {
    /// A segmenter for `tokenizer`, or why its pieces are not independent.
    pub fn for_tokenizer(tokenizer: &tokenizers::Tokenizer) -> Result<Segmenter, Unsegmentable> {
        let why = |s: &str| Err(Unsegmentable(s.to_owned()));
        if tokenizer.get_encode_special_tokens() {
            return why("encode_special_tokens is on: special tokens are not cut");
        }
        if tokenizer.get_truncation().is_some() {
            return why("truncation is configured");
        }
        if tokenizer.get_padding().is_some() {
            return why("padding is configured");
        }
        for (part, json) in [
            (
                "pre_tokenizer",
                serde_json::to_string(&tokenizer.get_pre_tokenizer()),
            ),
            (
                "normalizer",
                serde_json::to_string(&tokenizer.get_normalizer()),
            ),
        ] {
            let json = json.map_err(|e| Unsegmentable(format!("cannot inspect {part}: {e}")))?;
            if json.contains("\"prepend_scheme\":\"first\"") {
                return Err(Unsegmentable(format!(
                    "{part} prepends only at offset 0 (prepend_scheme: first)"
                )));
            }
        }
        let mut tokens = Vec::new();
        for (id, tok) in tokenizer.get_added_tokens_decoder() {
            if tok.normalized || tok.content.is_empty() {
                // Matched in the second pass, on normalized pieces: never across our cuts.
                continue;
            }
            if tok.lstrip || tok.rstrip || tok.single_word {
                return Err(Unsegmentable(format!(
                    "added token {:?} has lstrip/rstrip/single_word",
                    tok.content
                )));
            }
            tokens.push((tok.content, id));
        }
        if tokens.is_empty() {
            return why("no added tokens to cut at");
        }
        let segmenter = Segmenter::from_tokens(tokens);
        segmenter.probe(tokenizer)?;
        Ok(segmenter)
    }

    /// A segmenter cutting at `tokens` (content, id); no safety checks.
    pub fn from_tokens(tokens: Vec<(String, u32)>) -> Segmenter {
        let mut by_first_byte: Vec<Vec<(Box<[u8]>, u32)>> = vec![Vec::new(); 256];
        for (content, id) in tokens {
            let bytes: Box<[u8]> = content.into_bytes().into_boxed_slice();
            by_first_byte[bytes[0] as usize].push((bytes, id));
        }
        for list in &mut by_first_byte {
            list.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        }
        Segmenter { by_first_byte }
    }

    /// Splits `text` into text pieces and markers, leftmost-longest.
    pub fn split<'a>(&self, text: &'a str) -> Vec<Piece<'a>> {
        let bytes = text.as_bytes();
        let mut pieces = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            let candidates = &self.by_first_byte[bytes[i] as usize];
            let hit = candidates
                .iter()
                .find(|(tok, _)| bytes[i..].starts_with(tok));
            match hit {
                Some((tok, id)) => {
                    if start < i {
                        pieces.push(Piece::Text(&text[start..i]));
                    }
                    pieces.push(Piece::Marker(*id));
                    i += tok.len();
                    start = i;
                }
                None => i += 1,
            }
        }
        if start < bytes.len() {
            pieces.push(Piece::Text(&text[start..]));
        }
        pieces
    }

    /// Encodes varied texts both ways; any difference means cutting is not exact here.
    fn probe(&self, tokenizer: &tokenizers::Tokenizer) -> Result<(), Unsegmentable> {
        let mut markers: Vec<(&[u8], u32)> = self
            .by_first_byte
            .iter()
            .flatten()
            .map(|(t, id)| (&t[..], *id))
            .collect();
        markers.sort_by_key(|m| m.1);
        let fillers = [
            "Hello world",
            " leading space",
            "\n",
            "\n\n  indented\n",
            "trailing spaces   ",
            "123 456",
            "é 日本語 🚀",
            "x",
            "",
            "  ",
        ];
        let mut texts = Vec::new();
        for (n, (marker, _)) in markers.iter().take(32).enumerate() {
            let marker = String::from_utf8_lossy(marker);
            let mut text = String::new();
            for (k, filler) in fillers.iter().enumerate() {
                let f = fillers[(k + n) % fillers.len()];
                text.push_str(filler);
                text.push_str(&marker);
                text.push_str(f);
                text.push_str(&marker);
                text.push_str(&marker);
            }
            texts.push(text);
        }
        for text in &texts {
            let full = encode(tokenizer, text).map_err(Unsegmentable)?;
            let mut cut = Vec::with_capacity(full.len());
            for piece in self.split(text) {
                match piece {
                    Piece::Marker(id) => cut.push(id),
                    Piece::Text(t) => cut.extend(encode(tokenizer, t).map_err(Unsegmentable)?),
                }
            }
            if cut != full {
                return Err(Unsegmentable(format!(
                    "probe text encodes differently when cut: {text:?}"
                )));
            }
        }
        Ok(())
    }
}

fn encode(tokenizer: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>, String> {
    tokenizer
        .encode_fast(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| e.to_string())
}

/// Fixed cost of an entry in 4-byte units (map slot, queue slot, `Arc` header).
const ENTRY_OVERHEAD_UNITS: usize = 24;
/// Shards of the cache; a lookup locks one, so concurrent requests rarely meet.
const SHARDS: usize = 16;

/// Token ids of text pieces, bounded and least-recently-used first out.
///
/// The bound is in 4-byte units: a cached piece costs its token ids, its text (kept to make
/// a hash collision harmless) and a fixed overhead — about two units per token of English
/// text. `SegmentCache::new(1_000_000)` therefore holds roughly 500,000 tokens in ~4 MB.
#[derive(Debug)]
pub struct SegmentCache {
    shards: Box<[Mutex<Shard>]>,
    capacity_per_shard: usize,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<u128, Entry>,
    /// Recency queue with lazy deletion: `(key, tick)` is stale when the entry's tick moved on.
    order: VecDeque<(u128, u64)>,
    tick: u64,
    units: usize,
}

#[derive(Debug)]
struct Entry {
    text: Box<str>,
    ids: Arc<[u32]>,
    tick: u64,
}

fn cost(text: &str, ids: &[u32]) -> usize {
    ids.len() + text.len().div_ceil(4) + ENTRY_OVERHEAD_UNITS
}

impl SegmentCache {
    /// A cache bounded to `capacity` 4-byte units (see the type's docs).
    pub fn new(capacity: usize) -> SegmentCache {
        SegmentCache {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            capacity_per_shard: capacity / SHARDS,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: u128) -> &Mutex<Shard> {
        &self.shards[(key as usize) % SHARDS]
    }

    /// The cached ids of `text`, refreshing its recency.
    pub fn get(&self, text: &str) -> Option<Arc<[u32]>> {
        let key = xxh3_128(text.as_bytes());
        let found = {
            let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
            shard.tick += 1;
            let tick = shard.tick;
            let ids = match shard.map.get_mut(&key) {
                Some(e) if &*e.text == text => {
                    e.tick = tick;
                    Some(e.ids.clone())
                }
                _ => None,
            };
            if ids.is_some() {
                shard.order.push_back((key, tick));
                shard.compact_if_needed();
            }
            ids
        };
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Remembers `ids` for `text`, evicting least recently used pieces beyond the bound.
    /// Pieces larger than a shard's share of the bound are not cached.
    pub fn insert(&self, text: &str, ids: Arc<[u32]>) {
        let c = cost(text, &ids);
        if c > self.capacity_per_shard {
            return;
        }
        let key = xxh3_128(text.as_bytes());
        let mut shard = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        shard.tick += 1;
        let tick = shard.tick;
        let entry = Entry {
            text: text.into(),
            ids,
            tick,
        };
        if let Some(old) = shard.map.insert(key, entry) {
            shard.units -= cost(&old.text, &old.ids);
        }
        shard.units += c;
        shard.order.push_back((key, tick));
        while shard.units > self.capacity_per_shard {
            let Some((k, t)) = shard.order.pop_front() else {
                break;
            };
            if shard.map.get(&k).is_some_and(|e| e.tick == t)
                && let Some(old) = shard.map.remove(&k)
            {
                shard.units -= cost(&old.text, &old.ids);
            }
        }
        shard.compact_if_needed();
    }

    /// Cache statistics.
    pub fn stats(&self) -> CacheStats {
        let (mut entries, mut units) = (0, 0);
        for s in self.shards.iter() {
            let s = s.lock().unwrap_or_else(|p| p.into_inner());
            entries += s.map.len();
            units += s.units;
        }
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries,
            units,
        }
    }
}

impl Shard {
    /// Drops stale queue slots once they outnumber live entries, keeping memory bounded.
    fn compact_if_needed(&mut self) {
        if self.order.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.order
                .retain(|(k, t)| map.get(k).is_some_and(|e| e.tick == *t));
        }
    }
}

/// Counters of a [`SegmentCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found the piece.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Pieces held.
    pub entries: usize,
    /// Size in 4-byte units.
    pub units: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg() -> Segmenter {
        Segmenter::from_tokens(vec![
            ("<|a|>".into(), 1),
            ("<|ab|>".into(), 2),
            ("<|a|>x".into(), 3),
        ])
    }

    #[test]
    fn splits_leftmost_longest() {
        let s = seg();
        assert_eq!(
            s.split("hi<|a|>x<|a|>y<|ab|>"),
            vec![
                Piece::Text("hi"),
                Piece::Marker(3),
                Piece::Marker(1),
                Piece::Text("y"),
                Piece::Marker(2)
            ]
        );
        assert_eq!(s.split(""), vec![]);
        assert_eq!(s.split("<|a"), vec![Piece::Text("<|a")]);
    }

    #[test]
    fn cache_evicts_least_recently_used() {
        // One shard's share: 16 × 100 units in total.
        let cache = SegmentCache::new(SHARDS * 100);
        let ids: Arc<[u32]> = vec![0u32; 40].into();
        // Each costs 40 + 1 + 24 = 65 units: one fits per shard, so inserting many
        // evicts; the most recent one of each shard survives.
        for i in 0..200 {
            cache.insert(&format!("t{i:03}"), ids.clone());
        }
        let st = cache.stats();
        assert!(st.entries <= SHARDS, "{st:?}");
        assert!(st.units <= SHARDS * 100);
        assert!(cache.get("t199").is_some());
        // Too big for any shard: not cached.
        cache.insert("big", vec![0u32; 1000].into());
        assert!(cache.get("big").is_none());
    }

    #[test]
    fn recently_used_entries_survive() {
        let cache = SegmentCache::new(SHARDS * 1000);
        let small: Arc<[u32]> = vec![7u32; 10].into();
        cache.insert("keep", small.clone());
        for i in 0..2000 {
            assert_eq!(cache.get("keep").as_deref(), Some(&small[..]));
            cache.insert(&format!("filler {i}"), small.clone());
        }
        assert!(cache.get("keep").is_some());
        let st = cache.stats();
        assert!(st.hits >= 2000);
        // The recency queue stays bounded by compaction.
        for s in cache.shards.iter() {
            let s = s.lock().unwrap();
            assert!(s.order.len() <= 2 * s.map.len() + 65);
        }
    }
}
