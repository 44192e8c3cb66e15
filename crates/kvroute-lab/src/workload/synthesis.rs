//! Prompt synthesis: turning anonymous block ids into concrete prompts.
//!
//! A trace says which requests share which blocks but not what the blocks contain. To make a
//! server's prefix cache see the same sharing, each block id becomes a deterministic block of
//! token ids: equal ids give equal tokens, different ids give (with overwhelming probability)
//! different tokens from the very first token of the block, so no accidental sharing crosses
//! a block boundary. A prompt is the concatenation of its blocks cut to `input_tokens`; a last
//! partial block is the prefix of its own id's full block, which is what makes a cut prompt an
//! exact prefix of a longer one with the same ids.
//!
//! Token-id prompts (`/v1/completions` with `prompt: [ids]`) are exact: the server sees
//! precisely these ids. Text prompts are offered for chat endpoints: one word per token,
//! which the builtin tokenizer maps to exactly one token each (a real BPE tokenizer will give
//! a similar but not identical count).
//!
//! Prompts are built before a run, never during it, so the client's timing is not disturbed.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::trace::TraceRequest;

/// Deterministic block content for a vocabulary range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptSynth {
    /// Lowest token id used (inclusive). Keep clear of special tokens at the low end.
    pub vocab_start: u32,
    /// Highest token id used (exclusive). Keep below the model's special tokens.
    pub vocab_end: u32,
    /// Mixed into every block, so two runs can use disjoint content on purpose.
    pub seed: u64,
}

impl Default for PromptSynth {
    /// Ids 1,000..30,000: ordinary tokens in every common vocabulary (Llama 3, Qwen, Mistral,
    /// GPT-2 and the builtin tokenizer), away from special tokens at either end.
    fn default() -> Self {
        PromptSynth {
            vocab_start: 1_000,
            vocab_end: 30_000,
            seed: 0,
        }
    }
}

/// SplitMix64: a tiny, fast, well-mixed generator; its sequence is fixed forever, unlike a
/// library RNG's, so synthesized prompts stay the same across dependency upgrades.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl PromptSynth {
    /// A synthesizer over token ids `vocab_start..vocab_end` (an empty range is widened to one
    /// id rather than failing: content then stops being distinct, which the caller chose).
    pub fn new(vocab_start: u32, vocab_end: u32, seed: u64) -> PromptSynth {
        PromptSynth {
            vocab_start,
            vocab_end: vocab_end.max(vocab_start.saturating_add(1)),
            seed,
        }
    }

    fn token(&self, r: u64) -> u32 {
        let span = u64::from(self.vocab_end - self.vocab_start);
        // Multiply-shift maps r uniformly onto the span without a division.
        self.vocab_start + ((u128::from(r) * u128::from(span)) >> 64) as u32
    }

    /// Appends the first `len` tokens of block `id` to `out`.
    pub fn extend_block(&self, id: u64, len: u32, out: &mut Vec<u32>) {
        let mut g = SplitMix64(xxh3_64_with_seed(&id.to_le_bytes(), self.seed));
        out.extend((0..len).map(|_| self.token(g.next())));
    }

    /// The first `len` tokens of block `id`.
    pub fn block(&self, id: u64, len: u32) -> Vec<u32> {
        let mut out = Vec::with_capacity(len as usize);
        self.extend_block(id, len, &mut out);
        out
    }

    /// The token ids of `req`'s prompt: its blocks in order, cut to `input_tokens`. If the ids
    /// cover fewer tokens than `input_tokens`, the rest is padding derived from the whole id
    /// chain, so it is shared only by requests with the same ids.
    pub fn prompt_tokens(&self, req: &TraceRequest) -> Vec<u32> {
        let want = req.input_tokens as usize;
        let mut out = Vec::with_capacity(want);
        let bt = req.block_tokens.max(1);
        for &id in &req.hash_ids {
            let left = want - out.len();
            if left == 0 {
                break;
            }
            self.extend_block(id, bt.min(left as u32), &mut out);
        }
        if out.len() < want {
            let mut chain = Vec::with_capacity(req.hash_ids.len() * 8 + 3);
            chain.extend_from_slice(b"pad");
            for id in &req.hash_ids {
                chain.extend_from_slice(&id.to_le_bytes());
            }
            let mut g = SplitMix64(xxh3_64_with_seed(&chain, self.seed));
            let left = want - out.len();
            out.extend((0..left).map(|_| self.token(g.next())));
        }
        out
    }

    /// A text prompt with one word per token id (`" w<id>"`), for chat endpoints; same sharing
    /// as [`PromptSynth::prompt_tokens`].
    pub fn prompt_text(&self, req: &TraceRequest) -> String {
        let tokens = self.prompt_tokens(req);
        let mut s = String::with_capacity(tokens.len() * 7);
        for (i, t) in tokens.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            s.push('w');
            s.push_str(&t.to_string());
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_stay_in_range() {
        let s = PromptSynth::new(10, 20, 3);
        let b = s.block(42, 1000);
        assert!(b.iter().all(|&t| (10..20).contains(&t)));
        // All ten ids should appear in a thousand draws.
        let mut seen = b.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 10);
    }

    #[test]
    fn seed_changes_content() {
        let a = PromptSynth::new(0, 50_000, 1).block(5, 16);
        let b = PromptSynth::new(0, 50_000, 2).block(5, 16);
        assert_ne!(a, b);
    }
}
