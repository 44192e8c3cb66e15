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
//!   [`SATURATION_FACTOR`] times the request's prompt queued for prefill, or no worker has room
//!   for it in its KV cache (every candidate's predicted wait for room, `policy::kv_room`, is
//!   above zero), whichever worker it goes to starts it after other work: steps full of other
//!   prefills, or running answers that must end first. A fleet whose caches are full is as
//!   saturated as one whose queues are: what a placement recomputes evicts what the next
//!   turns would have found. A prefix that a request in flight there
//!   is computing is in that engine's cache by the time this request is admitted, so only the
//!   rest is computed, and only the rest is booked as queued work.
//! - **Work is what every later request waits for.** The fleet runs flat out, so each second of
//!   prefill a placement adds delays the requests queued behind it as much as it delays this
//!   one. The cost then counts the work a placement adds a second time (weight
//!   [`super::KvAwareConfig::saturation_weight`]), which is what makes siblings co-locate where
//!   the first is computing their prefix instead of spreading and computing it once per worker.
//!
//! The factor 2 leaves one prompt's worth of margin (with a factor of 1, or with the in-flight
//! prefix credited at any load, scenarios of the suite got worse: docs/benchmarks.md). The
//! queue test is in tokens, not seconds, so it needs no fitted rate; the room test reads the
//! waits the policy predicted (`RouteDecision::room_wait_s`), so both read the same in the
//! policy and in the decider's bookings (`routing::decider`). Counting a full fleet as
//! saturated cut agentic × 4's mean TTFT by 29 % and g64s11 × 4's by 78 %, and loses where turns
//! pile onto one full home (docs/benchmarks.md, "No room anywhere is saturation").

use super::{Candidate, RouteRequest};

/// How many times its own prompt every worker must have queued for prefill before the fleet
/// counts as saturated for a request.
pub const SATURATION_FACTOR: u64 = 2;

/// What makes every worker keep a request waiting: an operator adds prefill capacity for the
/// one and KV memory for the other (`kvroute_prefill_saturated_decisions_total`,
/// `kvroute_kv_room_saturated_decisions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saturation {
    /// Every candidate has at least [`SATURATION_FACTOR`] × the prompt queued for prefill.
    Prefill,
    /// Every candidate's running requests leave no room for the prompt in its KV cache.
    KvRoom,
}

impl Saturation {
    /// The name `/debug/route` shows.
    pub fn name(self) -> &'static str {
        match self {
            Saturation::Prefill => "prefill",
            Saturation::KvRoom => "kv_room",
        }
    }
}

/// Whether, and why, the fleet is saturated for a request: every candidate has at least
/// [`SATURATION_FACTOR`] × the prompt queued for prefill (said first when both hold), or every
/// candidate makes it wait for room in its KV cache (`room_waits`, aligned with `candidates`
/// as `RouteDecision::room_wait_s` is; `None`, a capacity not known, is no wait). `None`
/// without candidates or without a prompt: a load-only decision saw no tokens.
pub fn saturation(
    prompt_tokens: u64,
    candidates: &[Candidate],
    room_waits: &[Option<f64>],
) -> Option<Saturation> {
    if prompt_tokens == 0 || candidates.is_empty() {
        return None;
    }
    let threshold = prompt_tokens.saturating_mul(SATURATION_FACTOR);
    let queued = candidates
        .iter()
        .all(|c| c.load.queued_prefill_tokens >= threshold);
    let no_room = room_waits.len() == candidates.len()
        && room_waits.iter().all(|w| w.is_some_and(|w| w > 0.0));
    if queued {
        Some(Saturation::Prefill)
    } else if no_room {
        Some(Saturation::KvRoom)
    } else {
        None
    }
}

/// [`saturation`] as a yes or no, for the cost model.
pub fn saturated(prompt_tokens: u64, candidates: &[Candidate], room_waits: &[Option<f64>]) -> bool {
    saturation(prompt_tokens, candidates, room_waits).is_some()
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
        assert!(saturated(1_000, &busy, &[]));
        let one_short = [candidate(2_000, 0), candidate(1_999, 0)];
        assert!(!saturated(1_000, &one_short, &[]));
        let idle = [candidate(0, 0), candidate(50_000, 0)];
        assert!(!saturated(1_000, &idle, &[]));
    }

    #[test]
    fn saturated_when_no_worker_has_room_for_the_prompt() {
        let idle = [candidate(0, 0), candidate(0, 0)];
        let full = [Some(0.5), Some(2.0)];
        assert_eq!(saturation(1_000, &idle, &full), Some(Saturation::KvRoom));
        // Queues full as well: prefill is named first.
        let busy = [candidate(2_000, 0), candidate(2_000, 0)];
        assert_eq!(saturation(1_000, &busy, &full), Some(Saturation::Prefill));
        assert_eq!(saturation(1_000, &busy, &[]), Some(Saturation::Prefill));
        assert!(!saturated(1_000, &idle, &[Some(0.5), Some(0.0)]));
        // A capacity not known is room: that worker may take the request at once.
        assert!(!saturated(1_000, &idle, &[Some(0.5), None]));
        // Waits that do not line up with the candidates say nothing.
        assert!(!saturated(1_000, &idle, &[Some(0.5)]));
    }

    #[test]
    fn nothing_is_saturated_without_candidates_or_a_prompt() {
        assert!(!saturated(1_000, &[], &[]));
        assert!(!saturated(0, &[candidate(10, 0)], &[Some(1.0)]));
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
