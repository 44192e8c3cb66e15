//! Latency targets (SLO hints) in the decision: among the candidates the policy predicts will
//! meet a request's time-to-first-token target, the one it likes best (lowest cost); when
//! none will, the policy's own choice (best effort), and the caller decides whether to refuse
//! the request instead (a sheddable one is refused at once, see `server::slo`).
//!
//! Policies that predict no TTFT (the load-only ones) give nothing to compare: their choice
//! stands. Pure, like the rest of the decision.

use crate::policy::RouteDecision;

/// What a decision made of a TTFT target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The policy's choice is predicted to meet it.
    Met,
    /// Another candidate is predicted to meet it, and was chosen instead.
    Rerouted,
    /// No candidate is predicted to meet it; the policy's choice stands.
    Unmeetable,
    /// The policy predicts no TTFT.
    Unknown,
}

/// Makes `decision` choose a candidate predicted to meet `target_s` (seconds) if any does.
pub fn prefer(decision: &mut RouteDecision, target_s: f64) -> Verdict {
    let predicted = |i: usize| decision.predicted_ttft_s.get(i).copied().flatten();
    let Some(chosen) = predicted(decision.chosen) else {
        return Verdict::Unknown;
    };
    if chosen <= target_s {
        return Verdict::Met;
    }
    let best = (0..decision.predicted_ttft_s.len())
        .filter_map(|i| Some((i, predicted(i)?)))
        .filter(|(_, p)| *p <= target_s)
        .min_by(|(i, p), (j, q)| {
            let cost = |k: usize| decision.cost.get(k).copied().flatten().unwrap_or(f64::MAX);
            cost(*i).total_cmp(&cost(*j)).then(p.total_cmp(q))
        });
    match best {
        Some((i, _)) => {
            decision.chosen = i;
            Verdict::Rerouted
        }
        None => Verdict::Unmeetable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(chosen: usize, ttft: &[Option<f64>], cost: &[Option<f64>]) -> RouteDecision {
        RouteDecision {
            chosen,
            predicted_ttft_s: ttft.to_vec(),
            cost: cost.to_vec(),
            tiers: vec![None; ttft.len()],
            prefill_tokens_per_s: vec![None; ttft.len()],
            room_wait_s: vec![None; ttft.len()],
        }
    }

    #[test]
    fn a_target_moves_the_choice_to_the_cheapest_candidate_that_meets_it() {
        let ttft = [Some(0.9), Some(0.2), Some(0.3), Some(0.1)];
        let cost = [Some(1.0), Some(3.0), Some(2.0), Some(4.0)];
        let mut d = decision(0, &ttft, &cost);
        assert_eq!(prefer(&mut d, 1.0), Verdict::Met);
        assert_eq!(d.chosen, 0);
        assert_eq!(prefer(&mut d, 0.35), Verdict::Rerouted);
        assert_eq!(d.chosen, 2, "cheapest among those at most 0.35 s");
        let mut d = decision(0, &ttft, &cost);
        assert_eq!(prefer(&mut d, 0.05), Verdict::Unmeetable);
        assert_eq!(d.chosen, 0, "best effort: the policy's choice");
        let mut blind = RouteDecision::pick(1, 3);
        assert_eq!(prefer(&mut blind, 0.05), Verdict::Unknown);
        assert_eq!(blind.chosen, 1);
    }
}
