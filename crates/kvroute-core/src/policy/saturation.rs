//! When the fleet is saturated for a request, and what a request in flight computes for it.
//!
//! Below saturation a request's own TTFT is the right thing to minimise: a worker that can
//! start it now is worth more than the prefill a warmer but busier one would save. Requests
//! sharing a prefix that arrive together (a sibling group: the same system prompt, the same
//! document, a fan-out of one agent) finish sooner spread over idle workers, each computing
//! the prefix at once, than on one worker whose step then holds the prefix and every
//! sibling's own part (113 ms against the SGLang router's 141 ms, which co-locates, for the
//! groups of docs/benchmarks.md, "Saturation", in real time). A saturated fleet has no idle
//! worker to spread onto:
//!
//! - **Every worker makes the request wait.** If every worker has at least
//!   [`SATURATION_FACTOR`] times the request's prompt queued for prefill, whichever worker it
//!   goes to starts it after steps full of other work. A prefix that a request in flight there
//!   is computing is in that engine's cache by the time this request is admitted, so only the
//!   rest is computed, and only the rest is booked as queued work.
//! - **Work is what every later request waits for.** The fleet runs flat out, so each second of
//!   prefill a placement adds delays the requests queued behind it as much as it delays this
//!   one. The cost then counts the work a placement adds a second time (weight
//!   [`super::KvAwareConfig::saturation_weight`]), which is what makes siblings co-locate where
//!   the first is computing their prefix instead of spreading and computing it once per worker.
//!
//! The factor 2 leaves one prompt's worth of margin (with a factor of 1, or with the in-flight
//! prefix credited at any load, scenarios of the suite got worse: docs/benchmarks.md). The test
//! is in tokens, not seconds, so it needs no fitted rate and reads the same in the router and
//! in the decider's bookings (`routing::decider`).

use super::{Candidate, RouteRequest};

/// How many times its own prompt every worker must have queued for prefill before the fleet
/// counts as saturated for a request.
pub const SATURATION_FACTOR: u64 = 2;

/// Whether every candidate has at least [`SATURATION_FACTOR`] × the prompt queued for prefill
/// (false without candidates or without a prompt: a load-only decision saw no tokens).
pub fn saturated(prompt_tokens: u64, candidates: &[Candidate]) -> bool {
    let threshold = prompt_tokens.saturating_mul(SATURATION_FACTOR);
    prompt_tokens > 0
        && !candidates.is_empty()
        && candidates
            .iter()
            .all(|c| c.load.queued_prefill_tokens >= threshold)
}

/// Tokens of `request`'s prompt the requests in flight on `c` hold or are computing (leading
/// blocks, as `fleet::running_blocks` counts them).
pub fn in_flight_prefix_tokens(request: &RouteRequest, c: &Candidate) -> u64 {
    c.cache
        .running_prefix_blocks
        .saturating_mul(u64::from(request.block_size))
        .min(request.prompt_tokens)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::fleet::{LoadSnapshot, WorkerId};
    use crate::policy::{LowerBlocks, WorkingSet};

    fn candidate(queued: u64, running_prefix_blocks: u64) -> Candidate {
        Candidate {
            id: Arc::from("w"),
            worker: WorkerId(0),
            load: LoadSnapshot {
                queued_prefill_tokens: queued,
                ..LoadSnapshot::default()
            },
            overlap_blocks: 0,
            lower_blocks: LowerBlocks::default(),
            cache: WorkingSet {
                running_prefix_blocks,
                ..WorkingSet::default()
            },
            session_home: false,
        }
    }

    #[test]
    fn saturated_only_when_every_worker_has_twice_the_prompt_queued() {
        let busy = [candidate(2_000, 0), candidate(5_000, 0)];
        assert!(saturated(1_000, &busy));
        let one_short = [candidate(2_000, 0), candidate(1_999, 0)];
        assert!(!saturated(1_000, &one_short));
        let idle = [candidate(0, 0), candidate(50_000, 0)];
        assert!(!saturated(1_000, &idle));
    }

    #[test]
    fn nothing_is_saturated_without_candidates_or_a_prompt() {
        assert!(!saturated(1_000, &[]));
        assert!(!saturated(0, &[candidate(10, 0)]));
    }

    #[test]
    fn the_in_flight_prefix_is_counted_in_tokens_up_to_the_prompt() {
        let request = RouteRequest {
            prompt_tokens: 1_000,
            blocks: 15,
            block_size: 64,
            kv_bytes_per_token: 0,
            warm_prefix_rate: 0.0,
        };
        assert_eq!(in_flight_prefix_tokens(&request, &candidate(0, 10)), 640);
        assert_eq!(in_flight_prefix_tokens(&request, &candidate(0, 0)), 0);
        assert_eq!(in_flight_prefix_tokens(&request, &candidate(0, 40)), 1_000);
    }
}
