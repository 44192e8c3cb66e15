//! A decision's runners-up: the candidates it did not choose, best first, by what the decision
//! itself said of each — so a gateway that falls back down a list of endpoints (GIE's
//! `x-gateway-destination-endpoint: ip:port,ip:port…`) goes where the policy priced next,
//! without the policy being asked again (which would advance a round-robin, take a half-open
//! circuit's probe or learn a session's home for a worker that may never see the request).

use std::cmp::Ordering;

use super::pair::{DecodeCandidate, DecodeDecision, decode_order};
use crate::policy::{Candidate, RouteDecision};

/// The indices of `candidates` other than `decision.chosen`, best first: by the cost the
/// policy minimised (lower first; a candidate it priced before one it did not), then, for
/// policies that price nothing, by the requests in flight on each when it decided, then in
/// the candidates' own order.
pub fn runners_up(decision: &RouteDecision, candidates: &[Candidate]) -> Vec<usize> {
    let cost = |i: usize| decision.cost.get(i).copied().flatten();
    let mut others: Vec<usize> = (0..candidates.len())
        .filter(|&i| i != decision.chosen)
        .collect();
    others.sort_by(|&a, &b| {
        let by_cost = match (cost(a), cost(b)) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        };
        by_cost
            .then_with(|| {
                candidates[a]
                    .load
                    .in_flight
                    .cmp(&candidates[b].load.in_flight)
            })
            .then_with(|| a.cmp(&b))
    });
    others
}

/// The indices of a decode pick's `candidates` other than `decision.chosen`, best first by the
/// pick's own order (room in the KV cache, then requests in flight, then KV usage, then
/// requests admitted; see [`super::choose_decode`]), then in the candidates' own order. Every
/// decode pod of a disaggregated request reads the same prefill endpoint, so any of them can
/// take the decode the chosen one could not.
pub fn decode_runners_up(decision: &DecodeDecision, candidates: &[DecodeCandidate]) -> Vec<usize> {
    let mut others: Vec<usize> = (0..candidates.len())
        .filter(|&i| i != decision.chosen)
        .collect();
    others.sort_by(|&a, &b| decode_order(&decision.kv_usage, candidates, a, b).then(a.cmp(&b)));
    others
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::idle;

    fn loaded(in_flight: &[u64]) -> Vec<Candidate> {
        let mut candidates = idle(in_flight.len());
        for (c, &n) in candidates.iter_mut().zip(in_flight) {
            c.load.in_flight = n;
        }
        candidates
    }

    #[test]
    fn the_runners_up_follow_the_cost_and_never_include_the_chosen_one() {
        let candidates = idle(5);
        let decision = RouteDecision {
            chosen: 2,
            predicted_ttft_s: vec![None; 5],
            cost: vec![Some(3.0), Some(0.5), Some(0.1), None, Some(1.5)],
            tiers: vec![None; 5],
            prefill_tokens_per_s: vec![None; 5],
            room_wait_s: vec![None; 5],
        };
        // Priced ones by cost, the unpriced one last; the chosen one (the cheapest) absent.
        assert_eq!(runners_up(&decision, &candidates), vec![1, 4, 0, 3]);
    }

    #[test]
    fn without_costs_the_least_loaded_come_first_in_their_own_order_on_ties() {
        let candidates = loaded(&[4, 1, 0, 1]);
        let decision = RouteDecision::pick(2, 4);
        assert_eq!(runners_up(&decision, &candidates), vec![1, 3, 0]);
        assert!(runners_up(&RouteDecision::pick(0, 1), &candidates[..1]).is_empty());
    }

    fn decode(worker: u32, in_flight: u64, active: u64, kv: Option<u64>) -> DecodeCandidate {
        let load = crate::fleet::LoadSnapshot {
            in_flight,
            active_prompt_tokens: active,
            ..Default::default()
        };
        DecodeCandidate {
            id: format!("d{worker}").into(),
            worker: crate::fleet::WorkerId(worker),
            load,
            kv_tokens: kv,
        }
    }

    #[test]
    fn decode_runners_up_follow_the_decode_picks_order_without_the_chosen_one() {
        let candidates = vec![
            // Its cache would overflow: last, whatever its load.
            decode(0, 0, 9_900, Some(10_000)),
            decode(1, 2, 100, Some(10_000)),
            // The pick: fewest in flight.
            decode(2, 0, 100, Some(10_000)),
            // As loaded as 1 but fuller: after it.
            decode(3, 2, 5_000, Some(10_000)),
            // Unknown capacity fits; fewer in flight than 1 and 3.
            decode(4, 1, 0, None),
        ];
        let decision = crate::routing::choose_decode(200, &candidates).unwrap();
        assert_eq!(decision.chosen, 2);
        assert_eq!(decode_runners_up(&decision, &candidates), vec![4, 1, 3, 0]);
        let alone = crate::routing::choose_decode(200, &candidates[..1]).unwrap();
        assert!(decode_runners_up(&alone, &candidates[..1]).is_empty());
    }
}
