//! The decision a request would get, taken by the core and nothing admitted: what
//! `/debug/route` shows. It fails as the request would ([`RouteError`]), so an operator never
//! reads a worker where the request gets an error.

use super::analysis::Analysis;
use super::decider::Decider;
use super::error::RouteError;
use super::pair::{DecodeCandidate, DecodeDecision, Plan};
use super::target::Target;
use crate::fleet::Side;
use crate::policy::{Candidate, RouteDecision};

/// The policy's choice for a request (its prefill worker, for a pair), with every candidate it
/// weighed, and the decode pick of a pair.
#[derive(Debug)]
pub struct Explanation<'t, T> {
    /// The candidates' targets, in the order of `candidates`.
    pub targets: Vec<&'t T>,
    /// What the policy saw of each (load snapshot and overlap).
    pub candidates: Vec<Candidate>,
    /// Its decision over them.
    pub decision: RouteDecision,
    /// A pair's decode pick.
    pub decode: Option<DecodeExplanation<'t, T>>,
}

/// The decode pick of a disaggregated request, with every decode-capable candidate.
#[derive(Debug)]
pub struct DecodeExplanation<'t, T> {
    /// The candidates' targets, in the order of `candidates`.
    pub targets: Vec<&'t T>,
    /// What the pick saw of each (load, KV room).
    pub candidates: Vec<DecodeCandidate>,
    /// The pick.
    pub decision: DecodeDecision,
}

impl<T> Explanation<'_, T> {
    /// The chosen target (the prefill worker of a pair).
    pub fn chosen(&self) -> &T {
        self.targets[self.decision.chosen]
    }
}

impl<T> DecodeExplanation<'_, T> {
    /// The chosen decode target.
    pub fn chosen(&self) -> &T {
        self.targets[self.decision.chosen]
    }
}

impl Decider {
    /// The decision `analysis` would get among `targets` (the ranks of the eligible workers)
    /// served as `plan` says: the policy's choice ([`Decider::explain`]; among the
    /// prefill-capable targets for a pair) and, for a pair, the decode pick. No target left to
    /// choose is [`RouteError::NoWorker`], as for a live request.
    pub fn explain_plan<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        plan: Plan,
    ) -> Result<Explanation<'t, T>, RouteError> {
        let side = (plan == Plan::Pair).then_some(Side::Prefill);
        let (picked, candidates, decision) = self.explain(analysis, targets, side);
        let decision = decision
            .filter(|d| d.chosen < picked.len())
            .ok_or(RouteError::NoWorker)?;
        let decode = match plan {
            Plan::Whole => None,
            Plan::Pair => {
                let (picked, candidates, decision) = self.explain_decode(analysis, targets);
                let decision = decision
                    .filter(|d| d.chosen < picked.len())
                    .ok_or(RouteError::NoWorker)?;
                Some(DecodeExplanation {
                    targets: picked,
                    candidates,
                    decision,
                })
            }
        };
        Ok(Explanation {
            targets: picked,
            candidates,
            decision,
            decode,
        })
    }
}
