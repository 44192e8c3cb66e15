//! A decision's runners-up: the candidates it did not choose, best first, by what the decision
//! itself said of each — so a gateway that falls back down a list of endpoints (GIE's
//! `x-gateway-destination-endpoint: ip:port,ip:port…`) goes where the policy priced next,
//! without the policy being asked again (which would advance a round-robin, take a half-open
//! circuit's probe or learn a session's home for a worker that may never see the request).

use std::cmp::Ordering;

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
}
