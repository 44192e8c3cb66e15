//! The KV blocks a worker's unfinished requests hold, each counted once.
//!
//! An engine keeps one copy of a prefix that several running sequences share: ten requests
//! with one 4k-token system prompt hold 4k tokens of it, not 40k. Summing the prompts of the
//! requests in flight (`LoadSnapshot::active_prompt_tokens`) counts shared prefixes once per
//! request and makes a worker serving one popular prefix look full. This counts the distinct
//! chained block hashes of the prompts routed to the worker and not yet finished
//! (reference-counted, so a prefix stays until its last request ends), plus the prompt tokens
//! of requests routed without hashes (load-only decisions, the decode side of a
//! disaggregated request), which can share nothing that is known.
//!
//! Chained hashes make a shared prefix a shared run of leading hashes, so the part of a new
//! prompt the running requests already hold is its longest leading run in the set, found by
//! bisection.

use crate::tokens::BlockHash;
use crate::tokens::id_map::IdMap;

/// Reference-counted block hashes of the requests in flight on one worker.
#[derive(Debug, Default)]
pub struct RunningBlocks {
    counts: IdMap<u64, u32>,
    /// Prompt tokens of requests in flight that came without hashes.
    anonymous_tokens: u64,
}

impl RunningBlocks {
    /// A request holding `hashes` (or, without them, `prompt_tokens` tokens) is in flight.
    pub fn add(&mut self, hashes: &[BlockHash], prompt_tokens: u64) {
        if hashes.is_empty() {
            self.anonymous_tokens += prompt_tokens;
            return;
        }
        for h in hashes {
            *self.counts.entry(h.0).or_insert(0) += 1;
        }
    }

    /// The request `add`ed with the same arguments ended.
    pub fn remove(&mut self, hashes: &[BlockHash], prompt_tokens: u64) {
        if hashes.is_empty() {
            self.anonymous_tokens = self.anonymous_tokens.saturating_sub(prompt_tokens);
            return;
        }
        for h in hashes {
            if let Some(n) = self.counts.get_mut(&h.0) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(&h.0);
                }
            }
        }
    }

    /// Tokens the requests in flight hold, shared blocks once.
    pub fn tokens(&self, block_size: u32) -> u64 {
        self.counts.len() as u64 * u64::from(block_size) + self.anonymous_tokens
    }

    /// How many leading blocks of `hashes` the requests in flight already hold.
    pub fn held_prefix(&self, hashes: &[BlockHash]) -> usize {
        // Leading hashes held form a prefix (a chained hash is only ever added with all the
        // hashes before it), so the first one missing is found by bisection.
        hashes.partition_point(|h| self.counts.contains_key(&h.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(ids: &[u64]) -> Vec<BlockHash> {
        ids.iter().map(|&i| BlockHash(i)).collect()
    }

    #[test]
    fn a_shared_prefix_counts_once_until_its_last_request_ends() {
        let mut r = RunningBlocks::default();
        let a = chain(&[1, 2, 3, 10]);
        let b = chain(&[1, 2, 3, 20, 21]);
        r.add(&a, 256);
        r.add(&b, 320);
        assert_eq!(r.tokens(64), 6 * 64, "1, 2, 3 once, then 10, 20, 21");
        assert_eq!(r.held_prefix(&chain(&[1, 2, 3, 20, 99])), 4);
        assert_eq!(r.held_prefix(&chain(&[7, 8])), 0);
        r.remove(&a, 256);
        assert_eq!(r.tokens(64), 5 * 64);
        assert_eq!(r.held_prefix(&a), 3, "b still holds the shared prefix");
        r.remove(&b, 320);
        assert_eq!(r.tokens(64), 0);
        assert_eq!(r.held_prefix(&a), 0);
    }

    #[test]
    fn requests_without_hashes_count_their_prompt() {
        let mut r = RunningBlocks::default();
        r.add(&[], 1000);
        r.add(&chain(&[5]), 64);
        assert_eq!(r.tokens(64), 1064);
        r.remove(&[], 1000);
        r.remove(&[], 1000);
        assert_eq!(r.tokens(64), 64, "an extra removal never underflows");
    }
}
