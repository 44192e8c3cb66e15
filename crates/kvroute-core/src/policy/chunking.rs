//! What a request waits behind on an engine that caps how much of one prompt a step computes.
//!
//! An engine step has a token budget; by default (vLLM's, the simulator's) a prompt takes as
//! much of it as it can, so a request routed behind a 500k-token prefill waits for all of it:
//! the cost model's queue term, `queued / prefill_rate`. With vLLM's
//! `--long-prefill-token-threshold T`, a prompt takes at most `T` tokens a step, and the rest of
//! the budget goes to the requests behind it: they share the long prefill's steps instead of
//! waiting for its end. A request needing `u` tokens then finishes its prefill in `⌈u / T⌉` steps,
//! and in each of them the `p` requests prefilling ahead of it compute at most `T` tokens each:
//! at most `p × T × ⌈u / T⌉` tokens of theirs run before its first token, and never more than
//! they have left. Measured on the agentic trace × 8 (docs/benchmarks.md, "Long prefills that
//! share their steps"), the queue term without this made `kv_aware` recompute sessions elsewhere
//! to avoid a wait the engine no longer imposes. The budget itself is not modelled: when the
//! prompts ahead take it all (`p × T` at least the budget), the request waits longer than this
//! says. Priced with the budget it moved the agentic figures within their seeds' spread, for a
//! setting the router would have to be told (docs/benchmarks.md), so it is left out.

/// Prompt tokens computed before the first token of a request needing `uncached` tokens, on a
/// worker where `prefilling` requests with `queued` tokens left are ahead of it and a prompt
/// takes at most `threshold` tokens a step (0: no cap, the whole queue runs first).
pub fn tokens_ahead(queued: u64, prefilling: u64, uncached: u64, threshold: u64) -> u64 {
    if threshold == 0 {
        return queued;
    }
    let steps = uncached.div_ceil(threshold).max(1);
    queued.min(prefilling.saturating_mul(threshold).saturating_mul(steps))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_cap_the_whole_queue_runs_first() {
        assert_eq!(tokens_ahead(500_000, 1, 2_000, 0), 500_000);
    }

    #[test]
    fn with_a_cap_a_short_prompt_shares_the_long_ones_steps() {
        // One 500k-token prefill ahead, a cap of 4,096: a 2k-token prompt runs in one step,
        // beside one 4,096-token chunk of it.
        assert_eq!(tokens_ahead(500_000, 1, 2_000, 4_096), 4_096);
        // A 10k-token prompt takes three steps; two prompts ahead compute 2 × 3 chunks.
        assert_eq!(tokens_ahead(500_000, 2, 10_000, 4_096), 24_576);
        // Never more than they have left.
        assert_eq!(tokens_ahead(3_000, 2, 10_000, 4_096), 3_000);
        assert_eq!(tokens_ahead(0, 0, 10_000, 4_096), 0);
    }
}
