//! A long prompt sent to its worker in prefix pieces, so that it does not block the requests
//! that arrive behind it.
//!
//! An engine computes the prompts it runs before any it has queued: a step's token budget goes
//! to the running requests first, and vLLM V1 and SGLang, by default, give one prompt all of
//! it (vLLM's `--long-prefill-token-threshold` is 0 unless set). So a 300k-token prefill holds
//! every request queued behind it for its whole length — on agent sessions, a returning turn
//! whose context the worker holds waits seconds behind another session's first turn, or leaves
//! for a worker that must recompute it (docs/benchmarks.md, "The requests over the p90 goal").
//!
//! The router can cut that wait without the engine's help. Before the request itself it sends
//! the prompt's prefixes, each a piece longer than the last, as requests of one output token:
//! each computes its piece and leaves it in the engine's prefix cache, and between two pieces
//! every request that arrived meanwhile is queued ahead of the next. The request then finds all
//! but its last part cached. No token is computed twice (pieces end on block boundaries); the
//! long prompt pays the short requests' time between its pieces, which its own prefill dwarfs.
//!
//! The ladder never starves its request: the next piece goes only while the other requests
//! queued for prefill on the worker (as the router counts them) come to at most one piece;
//! past that, the rest of the prompt goes whole with the request ([`next_piece_goes`]). A
//! piece then waits behind at most about a piece of others' work, and an overloaded worker,
//! whose queue is always longer, gets whole prompts as without pieces (measured: without this
//! bound, agentic × 4 — three times what the fleet serves — went from a mean TTFT of 62 s to
//! 2,106 s, every pieced prompt queued behind the whole queue once per piece).
//!
//! Only a prompt that needs at least two pieces beyond what its worker holds is cut: a shorter
//! one, sent whole, blocks the queue for less than two pieces, and cut it would wait behind
//! every arrival for little gain (measured: cutting every prompt over one piece cost agentic
//! × 8 a third of its mean TTFT). The cost model is told that a queued prefill blocks a request
//! for one piece at most (`kv_aware.long_prefill_token_threshold`).
//!
//! Pure: the server sends the pieces (`proxy::dispatch`), the simulator queues them.

/// The most pieces one prompt is cut into: each piece's body carries its whole prefix, so the
/// bytes and the engine's per-request work grow with the square of the count; eight keep them
/// under about four times the prompt's. Longer prompts get longer pieces. Measured on agentic
/// × 8 (seeds 0, 1; pieces of 16,384): TTFT p90 470 / 475 ms with at most eight, 421 / 385
/// without a bound (300k-token prompts in 18 pieces), 549 / 580 with at most four.
pub const MAX_PIECES: usize = 8;

/// Where the pieces of a prompt of `prompt_tokens` end, for a worker holding its first
/// `cached_tokens` (the router's prediction), in pieces of `piece_tokens` (rounded down to
/// whole blocks of `block_size`): each end a whole number of blocks past the cached prefix,
/// with at least one piece left for the request itself, and at most [`MAX_PIECES`] of them
/// (longer pieces for a longer prompt). Empty when the uncached part is under two pieces, or
/// either size is 0.
pub fn piece_ends(
    prompt_tokens: usize,
    cached_tokens: usize,
    piece_tokens: usize,
    block_size: usize,
) -> Vec<usize> {
    if block_size == 0 || piece_tokens < block_size {
        return Vec::new();
    }
    let start = cached_tokens.min(prompt_tokens) / block_size * block_size;
    // At most MAX_PIECES pieces, the request's own part at least as long as one.
    let fair = (prompt_tokens - start).div_ceil(MAX_PIECES + 1);
    let piece = piece_tokens.max(fair) / block_size * block_size;
    let mut ends = Vec::new();
    let mut end = start + piece;
    while end + piece <= prompt_tokens {
        ends.push(end);
        end += piece;
    }
    ends
}

/// Whether a ladder sends its next piece when `others_queued_tokens` of other requests'
/// prefill are queued on its worker, for pieces of `piece_tokens`; otherwise the request goes
/// now, with the rest of its prompt.
pub fn next_piece_goes(others_queued_tokens: u64, piece_tokens: usize) -> bool {
    others_queued_tokens <= piece_tokens as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_very_long_prompt_gets_longer_pieces_not_more() {
        // 300,000 tokens in pieces of 16,384 would be 17; at most 8, each 33,328 tokens.
        let ends = piece_ends(300_000, 0, 16_384, 16);
        assert_eq!(ends.len(), MAX_PIECES);
        assert_eq!(ends[0], 33_328);
        assert!(ends.windows(2).all(|w| w[1] - w[0] == 33_328));
        assert!(300_000 - ends[MAX_PIECES - 1] >= 33_328);
    }

    #[test]
    fn a_ladder_stops_behind_more_than_a_pieces_worth_of_others() {
        assert!(next_piece_goes(0, 16_384));
        assert!(next_piece_goes(16_384, 16_384));
        assert!(!next_piece_goes(16_385, 16_384));
    }

    #[test]
    fn a_prompt_under_two_pieces_is_sent_whole() {
        assert!(piece_ends(30_000, 0, 16_384, 16).is_empty());
        assert!(piece_ends(100_000, 70_000, 16_384, 16).is_empty());
        assert!(piece_ends(100_000, 0, 0, 16).is_empty(), "pieces off");
        assert!(piece_ends(100_000, 0, 8, 16).is_empty(), "under a block");
        assert!(piece_ends(100_000, 0, 16_384, 0).is_empty());
    }

    #[test]
    fn pieces_follow_the_cached_prefix_on_block_boundaries() {
        // 10,008 cached (625 whole blocks of 16: 10,000), pieces of 16,384: ends 26,384 and
        // 42,768; the request computes the last 17,232 itself (one to two pieces).
        let ends = piece_ends(60_000, 10_008, 16_384, 16);
        assert_eq!(ends, vec![26_384, 42_768]);
        assert!(ends.iter().all(|e| e % 16 == 0));
        let left = 60_000 - ends[ends.len() - 1];
        assert!((16_384..2 * 16_384).contains(&left), "{left}");
        // A piece size that is not whole blocks is rounded down.
        assert_eq!(piece_ends(100, 0, 20, 16), vec![16, 32, 48, 64, 80]);
        // Nothing cached: from the first token.
        assert_eq!(piece_ends(40_000, 0, 16_384, 16), vec![16_384]);
        // A cached prefix longer than the prompt (a stale prediction) cuts nothing.
        assert!(piece_ends(40_000, 90_000, 16_384, 16).is_empty());
    }
}
