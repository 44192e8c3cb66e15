//! The decision a request would get, taken by the core and nothing admitted: what
//! `/debug/route` shows. It fails as the request would ([`RouteError`]), so an operator never
//! reads a worker where the request gets an error.

use super::analysis::Analysis;
use super::decider::Decider;
use super::error::RouteError;
use super::isolation::Confined;
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
    /// The placement isolation rule that narrowed the candidates, if one did
    /// (`routing::isolation`).
    pub confined: Option<Confined>,
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
        let (weighed, decision) = self.explain(analysis, targets, side);
        let (picked, candidates, confined) = (weighed.picked, weighed.candidates, weighed.confined);
        let decision = decision
            .filter(|d| d.chosen < picked.len())
            .ok_or(RouteError::NoWorker)?;
        let decode = match plan {
            Plan::Whole => None,
            Plan::Pair => {
                // The decode leaves the prefill's process while it can (see `choose_decode`).
                let prefill = picked[decision.chosen].siblings();
                let (picked, candidates, decision) =
                    self.explain_decode(analysis, targets, &prefill);
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
            confined,
            decode,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::fleet::{Role, WorkerId};
    use crate::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex};
    use crate::policy::{PolicyKind, seeded};
    use crate::routing::testing::TestTarget as T;

    fn target(key: u32, role: Role) -> T {
        T::new(key, role)
    }

    /// A `both` target that computes the prompt is idler than the decode-only one, yet the
    /// explained decode goes to the decode-only one, as the live pick sends it; a fleet whose
    /// only decode-capable target computed the prompt decodes there.
    #[test]
    fn a_pair_is_explained_as_the_live_path_picks_it() {
        let holdings = Arc::new(Holdings::new(
            KvIndex::new(IndexConfig { max_entries: 1024 }),
            ApproxIndex::new(ApproxConfig {
                ttl: Duration::from_secs(60),
                capacity_per_worker: 1024,
            }),
        ));
        let decider = Decider::new(seeded(PolicyKind::LeastRequest, 1), holdings);
        let analysis = Analysis::load_only();
        let targets = [target(0, Role::Both), target(1, Role::Decode)];
        let _busy = [targets[1].load.admit(10, 0), targets[1].load.admit(10, 0)];
        let e = decider
            .explain_plan(&analysis, &targets, Plan::Pair)
            .unwrap();
        assert_eq!(e.chosen().key, WorkerId(0));
        let decode = e.decode.as_ref().unwrap();
        assert_eq!(decode.chosen().key, WorkerId(1));
        let alone = [target(0, Role::Both), target(1, Role::Prefill)];
        let e = decider.explain_plan(&analysis, &alone, Plan::Pair).unwrap();
        assert_eq!(e.decode.as_ref().unwrap().chosen().key, WorkerId(0));
        assert!(e.decode.is_some());
        let none: [T; 0] = [];
        let e = decider.explain_plan(&analysis, &none, Plan::Whole);
        assert_eq!(e.err(), Some(RouteError::NoWorker));
    }
}
