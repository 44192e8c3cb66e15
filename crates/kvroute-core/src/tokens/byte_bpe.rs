//! A fast, exact encoder for byte-level BPE tokenizers (Qwen2/Qwen3, Llama 3 and other
//! GPT-style `tokenizer.json`s): the pre-tokenizer's regex split, GPT-2's byte-to-character
//! map and the BPE merges, and nothing else.
//!
//! Why by hand: the `tokenizers` crate carries, for every byte, its offsets through
//! normalization and pre-tokenization, and allocates a string per piece; that bookkeeping is
//! most of its ~4–5 µs per token, which was ~80 % of a KV-aware decision on a long chat
//! (docs/index-performance.md, "The decision in CPU time"). Routing needs only the ids.
//!
//! It is used only where it gives `tokenizers`' answer:
//! - [`ByteBpe::for_tokenizer`] accepts only the pipeline it reproduces, read from the
//!   tokenizer's own JSON: no normalizer or NFC; a `Split` (isolated) by a regex followed by a
//!   `ByteLevel` without its own regex or prefix space; a BPE model without dropout, byte
//!   fallback, unknown token or word affixes;
//! - it then encodes a varied corpus both ways ([`ByteBpe::probe`]) and refuses itself on any
//!   difference;
//! - [`ByteBpe::encode`] answers `None` (the caller falls back to `tokenizers`) for text that NFC
//!   might change or with a piece too long for its quadratic merge loop.
//!
//! Callers pass text without added tokens: `tokens::segment` cuts at every one.

use std::collections::HashMap;

use regex::Regex;
use serde_json::{Map, Value};
use unicode_normalization::{IsNormalized, is_nfc_quick};

/// The ending of GPT-4-style split patterns that `regex` cannot compile (a lookahead), and what
/// replaces it: `\s+(?!\S)` leaves a whitespace run's last character to the word after it,
/// which [`ByteBpe::pieces`] does by shortening the match.
const LOOKAHEAD_TAIL: &str = r"|\s+(?!\S)|\s+";
const PLAIN_TAIL: &str = r"|\s+";

/// Pieces longer than this (bytes) go to `tokenizers`: the merge loop is quadratic.
const MAX_PIECE_BYTES: usize = 256;

/// The BPE merges: (left, right) → (rank, merged id).
type Merges = HashMap<(u32, u32), (u32, u32), foldhash::fast::RandomState>;

/// A byte-level BPE tokenizer's split, byte map and merges.
pub struct ByteBpe {
    split: Regex,
    /// Whether the pattern ended in [`LOOKAHEAD_TAIL`].
    lookahead_tail: bool,
    /// The vocabulary id of each byte's character.
    byte_ids: [u32; 256],
    /// (left, right) → (rank, merged id).
    merges: Merges,
    /// With `ignore_merges`, a whole piece found in the vocabulary is one token.
    whole_words: Option<HashMap<String, u32, foldhash::fast::RandomState>>,
    /// GPT-2's byte → character map, for `whole_words`.
    byte_chars: [char; 256],
}

impl std::fmt::Debug for ByteBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteBpe")
            .field("split", &self.split.as_str())
            .field("merges", &self.merges.len())
            .finish_non_exhaustive()
    }
}

/// Why a tokenizer gets no fast path (it keeps `tokenizers`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("no byte-level BPE fast path: {0}")]
pub struct NotByteBpe(pub String);

fn refuse<T>(why: impl Into<String>) -> Result<T, NotByteBpe> {
    Err(NotByteBpe(why.into()))
}

impl ByteBpe {
    /// The fast path for `tokenizer`, if its pipeline is one this file reproduces and a probe
    /// agrees with it.
    pub fn for_tokenizer(tokenizer: &tokenizers::Tokenizer) -> Result<ByteBpe, NotByteBpe> {
        let json = tokenizer
            .to_string(false)
            .map_err(|e| NotByteBpe(e.to_string()))?;
        let v: Value = serde_json::from_str(&json).map_err(|e| NotByteBpe(e.to_string()))?;
        let bpe = ByteBpe::from_json(&v)?;
        bpe.probe(tokenizer)?;
        Ok(bpe)
    }

    fn from_json(v: &Value) -> Result<ByteBpe, NotByteBpe> {
        match &v["normalizer"] {
            Value::Null => {}
            n if n["type"] == "NFC" => {}
            n => return refuse(format!("normalizer {}", n["type"])),
        }
        let (split, lookahead_tail) = split_regex(&v["pre_tokenizer"])?;
        let model = &v["model"];
        check_model(model)?;
        let Some(vocab) = model["vocab"].as_object() else {
            return refuse("the BPE model has no vocabulary");
        };
        let byte_chars = byte_chars();
        let mut byte_ids = [0u32; 256];
        for (b, c) in byte_chars.iter().enumerate() {
            byte_ids[b] = token_id(vocab, &c.to_string())
                .ok_or_else(|| NotByteBpe(format!("byte {b:#04x} has no token")))?;
        }
        let Some(list) = model["merges"].as_array() else {
            return refuse("the BPE model has no merges");
        };
        let merges = merges(vocab, list)?;
        let whole_words = (model["ignore_merges"] == true).then(|| {
            vocab
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()? as u32)))
                .collect()
        });
        Ok(ByteBpe {
            split,
            lookahead_tail,
            byte_ids,
            merges,
            whole_words,
            byte_chars,
        })
    }

    /// Token ids of `text` (which holds no added token), or `None` where this path does not
    /// answer: text NFC might change, or a piece longer than [`MAX_PIECE_BYTES`].
    pub fn encode(&self, text: &str) -> Option<Vec<u32>> {
        if !text.is_ascii() && is_nfc_quick(text.chars()) != IsNormalized::Yes {
            return None;
        }
        let mut ids = Vec::with_capacity(text.len() / 3 + 4);
        let mut symbols = Vec::new();
        for piece in self.pieces(text) {
            if piece.len() > MAX_PIECE_BYTES {
                return None;
            }
            self.encode_piece(piece, &mut symbols);
            ids.extend_from_slice(&symbols);
        }
        Some(ids)
    }

    /// The pre-tokenizer's pieces: every match of the split pattern, and any text between
    /// matches as a piece of its own (`Isolated`).
    fn pieces<'t>(&'t self, text: &'t str) -> impl Iterator<Item = &'t str> + 't {
        let mut at = 0;
        let mut pending: Option<&'t str> = None;
        std::iter::from_fn(move || {
            if let Some(p) = pending.take() {
                return Some(p);
            }
            if at >= text.len() {
                return None;
            }
            let Some(m) = self.split.find_at(text, at) else {
                let rest = &text[at..];
                at = text.len();
                return Some(rest);
            };
            let mut end = m.end();
            if self.lookahead_tail {
                let s = m.as_str();
                // Only the `\s+` alternative matches whitespace without a line break (a run
                // with one is `\s*[\r\n]+`'s, an earlier alternative).
                let next = text[end..].chars().next();
                if s.chars().all(char::is_whitespace)
                    && !s.contains(['\r', '\n'])
                    && next.is_some_and(|c| !c.is_whitespace())
                    && let Some(last) = s.chars().next_back()
                    && s.len() > last.len_utf8()
                {
                    end -= last.len_utf8();
                }
            }
            let gap = &text[at..m.start()];
            let piece = &text[m.start()..end];
            at = end;
            if gap.is_empty() {
                Some(piece)
            } else {
                pending = Some(piece);
                Some(gap)
            }
        })
    }

    /// BPE of one piece into `out`: its bytes' tokens, merged lowest rank first (leftmost
    /// among equals), as `tokenizers` merges.
    fn encode_piece(&self, piece: &str, out: &mut Vec<u32>) {
        out.clear();
        if let Some(words) = &self.whole_words {
            let mapped: String = piece.bytes().map(|b| self.byte_chars[b as usize]).collect();
            if let Some(&id) = words.get(&mapped) {
                out.push(id);
                return;
            }
        }
        out.extend(piece.bytes().map(|b| self.byte_ids[b as usize]));
        loop {
            let mut best: Option<(u32, usize, u32)> = None;
            for i in 0..out.len().saturating_sub(1) {
                if let Some(&(rank, merged)) = self.merges.get(&(out[i], out[i + 1]))
                    && best.is_none_or(|b| rank < b.0)
                {
                    best = Some((rank, i, merged));
                }
            }
            let Some((_, i, merged)) = best else {
                return;
            };
            out[i] = merged;
            out.remove(i + 1);
        }
    }

    /// Encodes varied texts both ways; any difference refuses the fast path.
    fn probe(&self, tokenizer: &tokenizers::Tokenizer) -> Result<(), NotByteBpe> {
        for text in PROBES {
            let want = tokenizer
                .encode_fast(*text, false)
                .map_err(|e| NotByteBpe(e.to_string()))?
                .get_ids()
                .to_vec();
            match self.encode(text) {
                Some(got) if got == want => {}
                // Text this path leaves to `tokenizers` is no disagreement.
                None => {}
                Some(_) => return refuse(format!("the probe {text:?} encodes differently")),
            }
        }
        Ok(())
    }
}

/// The split regex of a pre-tokenizer that is an isolating regex `Split` followed by a plain
/// `ByteLevel` (no regex or prefix space of its own), and whether its pattern ended in
/// [`LOOKAHEAD_TAIL`] (replaced, since `regex` cannot compile a lookahead).
fn split_regex(pre: &Value) -> Result<(Regex, bool), NotByteBpe> {
    let steps = match pre["type"].as_str() {
        Some("Sequence") => pre["pretokenizers"].as_array().cloned().unwrap_or_default(),
        _ => return refuse("the pre-tokenizer is not a sequence"),
    };
    let [split, byte_level] = steps.as_slice() else {
        return refuse("the pre-tokenizer is not a split and a byte-level step");
    };
    if split["type"] != "Split" || split["behavior"] != "Isolated" || split["invert"] != false {
        return refuse("the first pre-tokenizer is not an isolating regex split");
    }
    let Some(pattern) = split["pattern"]["Regex"].as_str() else {
        return refuse("the split is not by a regex");
    };
    if byte_level["type"] != "ByteLevel"
        || byte_level["add_prefix_space"] != false
        || byte_level["use_regex"] != false
    {
        return refuse("the second pre-tokenizer is not a plain byte-level map");
    }
    let (pattern, lookahead_tail) = match pattern.strip_suffix(LOOKAHEAD_TAIL) {
        Some(head) => (format!("{head}{PLAIN_TAIL}"), true),
        None => (pattern.to_owned(), false),
    };
    let split = Regex::new(&pattern).map_err(|e| NotByteBpe(format!("split regex: {e}")))?;
    Ok((split, lookahead_tail))
}

/// Refuses a model other than a plain BPE: dropout, an unknown token, byte fallback or word
/// affixes change the ids in ways the merge loop does not reproduce.
fn check_model(model: &Value) -> Result<(), NotByteBpe> {
    if model["type"] != "BPE" {
        return refuse("the model is not BPE");
    }
    for (key, ok) in [
        ("dropout", model["dropout"].is_null()),
        ("unk_token", model["unk_token"].is_null()),
        ("byte_fallback", model["byte_fallback"] != true),
        (
            "continuing_subword_prefix",
            model["continuing_subword_prefix"]
                .as_str()
                .is_none_or(str::is_empty),
        ),
        (
            "end_of_word_suffix",
            model["end_of_word_suffix"]
                .as_str()
                .is_none_or(str::is_empty),
        ),
    ] {
        if !ok {
            return refuse(format!("the BPE model sets {key}"));
        }
    }
    Ok(())
}

/// The id of `token` in `vocab`.
fn token_id(vocab: &Map<String, Value>, token: &str) -> Option<u32> {
    vocab.get(token).and_then(Value::as_u64).map(|i| i as u32)
}

/// The merges `list` (each `"left right"` or `["left", "right"]`) as (left, right) → (rank,
/// merged id); the first of a repeated pair keeps its rank, as `tokenizers` does.
fn merges(vocab: &Map<String, Value>, list: &[Value]) -> Result<Merges, NotByteBpe> {
    let id = |token: &str| token_id(vocab, token);
    let mut merges = HashMap::with_capacity_and_hasher(list.len(), Default::default());
    for (rank, merge) in list.iter().enumerate() {
        let (left, right) = match merge {
            Value::String(s) => match s.split_once(' ') {
                Some(pair) => pair,
                None => return refuse(format!("merge {s:?}")),
            },
            Value::Array(a) => match (
                a.first().and_then(Value::as_str),
                a.get(1).and_then(Value::as_str),
            ) {
                (Some(l), Some(r)) if a.len() == 2 => (l, r),
                _ => return refuse(format!("merge {merge}")),
            },
            other => return refuse(format!("merge {other}")),
        };
        let (Some(l), Some(r), Some(m)) = (id(left), id(right), id(&format!("{left}{right}")))
        else {
            return refuse(format!("merge {left:?} {right:?} is not in the vocabulary"));
        };
        merges.entry((l, r)).or_insert((rank as u32, m));
    }
    Ok(merges)
}

/// Texts the probe encodes: words with and without spaces, contractions in both cases, digit
/// runs, punctuation runs, every kind of whitespace run and line break, accents, CJK, emoji.
const PROBES: &[&str] = &[
    "Hello, world! How are you today?",
    " leading space and trailing spaces   ",
    "I'm sure you'll see we've DONE it; they'd say it's ok. YOU'RE RIGHT'S",
    "numbers 1234567 and 3.14159, -42, 1e10, 0x1F",
    "def f(x):\n    return x ** 2  # square\n\n\tindented\r\n  \n",
    "a  b   c    d\u{a0}e\u{3000}f\u{2003}g\u{85}h\u{b}i\u{c}j",
    "=====\n-----\n*** !!! ??? ... ,,, ;;; ::",
    "https://example.com/path?q=1&r=two#frag <tag attr=\"v\"/>",
    "café naïve résumé Straße Ελληνικά русский",
    "日本語のテキストと中文文本，한국어 텍스트。",
    "emoji 🚀🔥 👩‍💻 and symbols ©®™ € £ ¥ ° ± × ÷",
    "    ",
    "\n\n\n",
    "x",
    "  x",
    "\t\tx\n",
    "end with space ",
    "MixedCASE camelCase snake_case kebab-case",
    "'quoted' \"double\" `back` «guillemets»",
];

/// GPT-2's byte → character map: printable Latin-1 bytes map to themselves, the others to
/// U+0100 upward, in byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        map[b as usize] = char::from_u32(c).unwrap_or('\u{fffd}');
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_byte_map() {
        let m = byte_chars();
        assert_eq!(m[b'A' as usize], 'A');
        assert_eq!(m[b' ' as usize], 'Ġ');
        assert_eq!(m[b'\n' as usize], 'Ċ');
        assert_eq!(m[0], 'Ā');
        let mut all: Vec<char> = m.to_vec();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 256);
    }
}
