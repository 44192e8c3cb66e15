//! The KV blocks a worker's unfinished requests hold, each counted once.
//!
//! An engine keeps one copy of a prefix that several running sequences share: ten requests
//! with one 4k-token system prompt hold 4k tokens of it, not 40k. Summing the prompts of the
//! requests in flight (`LoadSnapshot::active_prompt_tokens`) counts shared prefixes once per
//! request and makes a worker serving one popular prefix look full (measured: the
//! eviction-pressure scenario's TTFT mean went from 86 to 104 ms when the wait for KV room was
//! priced from that sum). This counts distinct prefixes instead, reference-counted, so a
//! prefix stays until its last request ends.
//!
//! It keeps one chained block hash in [`STRIDE`] (a *mark*: the hash of blocks `STRIDE − 1`,
//! `2·STRIDE − 1`, …), not every block's: a chained hash names its whole prefix, so two prompts
//! sharing a prefix share its marks, and a prompt's leading run of marks found in the set is
//! the part the running requests hold, to within `STRIDE` blocks. Keeping every block's hash
//! (a map entry and the guard's copy per block) raised the peak memory of a large body of
//! short token ids from 2.35× to 3.2× the body (`body_memory`); a mark per 16 blocks keeps a
//! sixteenth of that and measured 2.35× again.
//! The tokens past a prompt's last mark count as its own.

use std::sync::Arc;

use crate::tokens::BlockHash;
use crate::tokens::id_map::IdMap;

/// Blocks per mark.
pub const STRIDE: usize = 16;

/// The marks of a prompt's chained block hashes: every [`STRIDE`]-th.
pub fn marks(hashes: &[BlockHash]) -> Arc<[BlockHash]> {
    hashes
        .iter()
        .skip(STRIDE - 1)
        .step_by(STRIDE)
        .copied()
        .collect()
}

/// Reference-counted prefix marks of the requests in flight on one worker.
#[derive(Debug, Default)]
pub struct RunningBlocks {
    counts: IdMap<u64, u32>,
    /// Prompt tokens of the requests in flight past their last mark (all of a prompt's tokens
    /// when it came without hashes: a load-only decision, the decode side of a disaggregated
    /// request, another router replica's booking).
    own_tokens: u64,
}

/// Tokens of a prompt of `prompt_tokens` past its `marks` marks.
fn past_marks(prompt_tokens: u64, marks: usize, block_size: u32) -> u64 {
    prompt_tokens.saturating_sub(marks as u64 * STRIDE as u64 * u64::from(block_size))
}

impl RunningBlocks {
    /// A request of `prompt_tokens` with prefix `marks` ([`marks`]) is in flight.
    pub fn add(&mut self, marks: &[BlockHash], prompt_tokens: u64, block_size: u32) {
        for m in marks {
            *self.counts.entry(m.0).or_insert(0) += 1;
        }
        self.own_tokens += past_marks(prompt_tokens, marks.len(), block_size);
    }

    /// The request `add`ed with the same arguments ended.
    pub fn remove(&mut self, marks: &[BlockHash], prompt_tokens: u64, block_size: u32) {
        for m in marks {
            if let Some(n) = self.counts.get_mut(&m.0) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(&m.0);
                }
            }
        }
        self.own_tokens =
            self.own_tokens
                .saturating_sub(past_marks(prompt_tokens, marks.len(), block_size));
    }

    /// Tokens the requests in flight hold, shared prefixes once.
    pub fn tokens(&self, block_size: u32) -> u64 {
        self.counts.len() as u64 * STRIDE as u64 * u64::from(block_size) + self.own_tokens
    }

    /// How many leading blocks of the prompt with chained `hashes` the requests in flight
    /// already hold (a multiple of [`STRIDE`]).
    pub fn held_prefix(&self, hashes: &[BlockHash]) -> usize {
        // A mark is only ever added with all the marks before it, so the marks held form a
        // leading run, found by bisection.
        let n = hashes.len() / STRIDE;
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self
                .counts
                .contains_key(&hashes[mid * STRIDE + STRIDE - 1].0)
            {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo * STRIDE
    }

    /// How many requests in flight hold the first `blocks` blocks of `hashes` (to within
    /// [`STRIDE`] blocks below; 0 for a prefix shorter than one mark).
    pub fn sharing(&self, hashes: &[BlockHash], blocks: usize) -> u32 {
        let k = blocks.min(hashes.len()) / STRIDE;
        if k == 0 {
            return 0;
        }
        self.counts
            .get(&hashes[k * STRIDE - 1].0)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `len` blocks whose first `shared` are common to every chain made with the
    /// same `shared`, the rest particular to `tag`.
    fn chain(shared: u64, len: u64, tag: u64) -> Vec<BlockHash> {
        (0..len)
            .map(|i| {
                BlockHash(if i < shared {
                    i + 1
                } else {
                    tag * 1_000_000 + i
                })
            })
            .collect()
    }

    #[test]
    fn a_shared_prefix_counts_once_until_its_last_request_ends() {
        let mut r = RunningBlocks::default();
        // Two prompts of 48 and 40 blocks (16 tokens each) sharing their first 32 blocks.
        let a = chain(32, 48, 1);
        let b = chain(32, 40, 2);
        let (ma, mb) = (marks(&a), marks(&b));
        assert_eq!((ma.len(), mb.len()), (3, 2));
        r.add(&ma, 48 * 16, 16);
        r.add(&mb, 40 * 16, 16);
        // Marks: the shared two once, a's third; b's last 8 blocks are its own.
        assert_eq!(r.tokens(16), (3 * 16 + 8) * 16);
        assert_eq!(r.held_prefix(&chain(32, 64, 3)), 32);
        assert_eq!(r.held_prefix(&a), 48);
        assert_eq!(r.held_prefix(&chain(0, 64, 4)), 0);
        r.remove(&ma, 48 * 16, 16);
        assert_eq!(r.tokens(16), 40 * 16);
        assert_eq!(r.held_prefix(&a), 32, "b still holds the shared prefix");
        r.remove(&mb, 40 * 16, 16);
        assert_eq!(r.tokens(16), 0);
        assert_eq!(r.held_prefix(&a), 0);
    }

    #[test]
    fn prompts_without_hashes_or_marks_count_whole() {
        let mut r = RunningBlocks::default();
        r.add(&[], 1000, 16);
        let short = marks(&chain(0, 10, 1));
        assert!(short.is_empty(), "fewer blocks than a stride: no mark");
        r.add(&short, 160, 16);
        assert_eq!(r.tokens(16), 1160);
        r.remove(&[], 1000, 16);
        assert_eq!(r.tokens(16), 160);
        r.remove(&short, 160, 16);
        r.remove(&short, 160, 16);
        assert_eq!(r.tokens(16), 0, "an extra removal never underflows");
    }
}
