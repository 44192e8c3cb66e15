//! The pair decision of a disaggregated request: which worker computes the prompt and which
//! one generates from its KV cache.
//!
//! - **prefill**: the policy chooses among the targets whose role serves prefill, exactly as
//!   it chooses for a whole request ([`Decider::choose_on`] with [`Side::Prefill`]): the prefix
//!   caches that save prefill live on the prefill workers, their KV events feed the index, and
//!   the cost model prices their queues.
//! - **decode**: [`choose_decode`] among the targets whose role serves decode, by load and KV
//!   room — a decode worker computes no prompt (it imports it), so what it costs a request is
//!   the batch it joins and whether its cache can hold the prompt without preempting others.
//!
//! Both are pure and read no clock, like the rest of the core, so the simulator's
//! disaggregated fleets are routed by this very code.

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::admitted::Admitted;
use super::analysis::Analysis;
use super::decider::Decider;
use super::target::Target;
use crate::fleet::{LoadSnapshot, Role, Side, WorkerId};

/// How a model's eligible targets serve its requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Every target serves whole requests: one worker per request, as always.
    Whole,
    /// Some target is prefill-only or decode-only: each request gets a prefill and a decode
    /// worker.
    Pair,
}

/// A disaggregated model without a worker for one side: an error to the operator (503), never
/// a request sent to a worker that cannot serve it whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "this model is served disaggregated but has no {} worker: add a worker with role \"{}\" or \"both\"",
    .0.as_str(),
    .0.as_str()
)]
pub struct MissingSide(pub Side);

/// Whether `targets` (a model's eligible workers) serve it whole or as pairs, and whether a
/// pair can be formed: some worker must serve each side.
pub fn plan<T: Target>(targets: &[T]) -> Result<Plan, MissingSide> {
    plan_roles(targets.iter().map(Target::role))
}

/// [`plan`] of the targets with these `roles`.
pub fn plan_roles(roles: impl Iterator<Item = Role> + Clone) -> Result<Plan, MissingSide> {
    if roles.clone().all(|r| r == Role::Both) {
        return Ok(Plan::Whole);
    }
    for side in [Side::Prefill, Side::Decode] {
        if !roles.clone().any(|r| r.serves(side)) {
            return Err(MissingSide(side));
        }
    }
    Ok(Plan::Pair)
}

/// What the decode pick sees of one decode-capable target.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeCandidate {
    /// Its name (explanations only).
    pub id: Arc<str>,
    /// Its identity.
    pub worker: WorkerId,
    /// Its load as the router sees it.
    pub load: LoadSnapshot,
    /// Tokens its KV cache holds (blocks × block size), when known.
    pub kv_tokens: Option<u64>,
}

/// The decode pick and what it weighed.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeDecision {
    /// Index of the chosen candidate.
    pub chosen: usize,
    /// Per candidate: the fraction of its KV cache the router's requests would hold with this
    /// one added (`None` when its capacity is unknown).
    pub kv_usage: Vec<Option<f64>>,
}

/// Chooses the decode worker for a request whose prompt and output need `tokens` of KV cache.
///
/// In order: a worker whose cache can take the request (the prompt tokens of the requests
/// already there plus this one fit; an unknown capacity fits) beats one that would have to
/// preempt; then fewer requests in flight (a decode step's time grows with the batch, and every
/// sequence in it waits for the step); then the lower KV usage after admission (the room left
/// for outputs to grow); then fewer requests ever admitted (rotates ties in an idle fleet);
/// then the first. `None` only without candidates.
pub fn choose_decode(tokens: u64, candidates: &[DecodeCandidate]) -> Option<DecodeDecision> {
    let kv_usage: Vec<Option<f64>> = candidates
        .iter()
        .map(|c| {
            c.kv_tokens
                .filter(|cap| *cap > 0)
                .map(|cap| (c.load.active_prompt_tokens + tokens) as f64 / cap as f64)
        })
        .collect();
    let chosen =
        (0..candidates.len()).min_by(|&a, &b| decode_order(&kv_usage, candidates, a, b))?;
    Some(DecodeDecision { chosen, kv_usage })
}

/// How [`choose_decode`] ranks candidates `a` and `b` (`Less`: `a` is the better decode),
/// given the KV usage each would have with the request admitted; the runners-up of a decode
/// pick follow the same order (`routing::decode_runners_up`).
pub(super) fn decode_order(
    kv_usage: &[Option<f64>],
    candidates: &[DecodeCandidate],
    a: usize,
    b: usize,
) -> Ordering {
    let key = |i: usize| {
        let c = &candidates[i];
        let usage = kv_usage.get(i).copied().flatten().unwrap_or(0.0);
        (usage > 1.0, c.load.in_flight, usage, c.load.admitted)
    };
    let (ka, kb) = (key(a), key(b));
    ka.0.cmp(&kb.0)
        .then(ka.1.cmp(&kb.1))
        .then(ka.2.total_cmp(&kb.2))
        .then(ka.3.cmp(&kb.3))
}

/// A decode target chosen for a request, with what the pick saw.
#[derive(Debug)]
pub struct DecodeChoice<'t, T> {
    /// The chosen target.
    pub target: &'t T,
    /// The pick over all candidates.
    pub decision: DecodeDecision,
    /// Every target the pick weighed (the chosen one included), in the order of `decision`'s
    /// per-candidate figures.
    pub weighed: Vec<&'t T>,
    /// Their candidate entries, in the same order.
    pub candidates: Vec<DecodeCandidate>,
}

impl<'t, T> DecodeChoice<'t, T> {
    /// The chosen target's candidate entry at decision time.
    pub fn candidate(&self) -> &DecodeCandidate {
        &self.candidates[self.decision.chosen]
    }

    /// The targets weighed and not chosen, best first by the pick's own order
    /// ([`super::decode_runners_up`]): where a gateway may fall back for the decode.
    pub fn runners_up(&self) -> Vec<&'t T> {
        super::decode_runners_up(&self.decision, &self.candidates)
            .into_iter()
            .filter_map(|i| self.weighed.get(i).copied())
            .collect()
    }
}

impl Decider {
    /// The routable targets serving decode, not in `skip`, with what the decode pick sees of
    /// each (their capacity in tokens of `analysis`' block size).
    pub fn decode_candidates<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        skip: &[WorkerId],
    ) -> (Vec<&'t T>, Vec<DecodeCandidate>) {
        let block_size = u64::from(analysis.request.block_size);
        let picked: Vec<&T> = targets
            .iter()
            .filter(|t| {
                !skip.contains(&t.worker()) && t.role().serves(Side::Decode) && t.routable()
            })
            .collect();
        let candidates = picked
            .iter()
            .map(|t| DecodeCandidate {
                id: Arc::clone(t.label()),
                worker: t.worker(),
                load: t.load().view(),
                kv_tokens: t
                    .kv_blocks()
                    .map(|b| b as u64 * block_size)
                    .filter(|n| *n > 0),
            })
            .collect();
        (picked, candidates)
    }

    /// The decode pick among the routable decode-capable `targets` without taking anything
    /// (what `/debug/route` shows), for a prompt computed on the targets `prefill`: away from
    /// them while another decode-capable target is left, as [`Decider::choose_decode`] picks.
    pub fn explain_decode<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        prefill: &[WorkerId],
    ) -> (Vec<&'t T>, Vec<DecodeCandidate>, Option<DecodeDecision>) {
        let tokens = analysis.request.prompt_tokens;
        let (picked, candidates) = self.decode_candidates(analysis, targets, prefill);
        if let Some(decision) = choose_decode(tokens, &candidates) {
            return (picked, candidates, Some(decision));
        }
        let (picked, candidates) = self.decode_candidates(analysis, targets, &[]);
        let decision = choose_decode(tokens, &candidates);
        (picked, candidates, decision)
    }

    /// Chooses a decode target not in `skip` that grants a request; one whose circuit refuses
    /// is added to `skip` and the pick made again. `None` when none is left.
    ///
    /// `prefill` names the worker computing the request's prompt (its ranks). A `both` worker
    /// chosen for the prefill is as eligible as any for the decode, and the request would hand
    /// its KV cache off to the worker that already holds it: a transfer for nothing, and the
    /// decode back on a worker that computes prompts (an SGLang server cannot pair with itself
    /// at all). So the decode goes to another decode-capable worker while one is left, and
    /// there only when none is.
    pub fn choose_decode<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        skip: &mut Vec<WorkerId>,
        prefill: &[WorkerId],
    ) -> Option<DecodeChoice<'t, T>> {
        if !prefill.is_empty() {
            let mut away: Vec<WorkerId> = skip.iter().chain(prefill).copied().collect();
            if let Some(choice) = self.pick_decode(analysis, targets, &mut away) {
                return Some(choice);
            }
        }
        self.pick_decode(analysis, targets, skip)
    }

    fn pick_decode<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        skip: &mut Vec<WorkerId>,
    ) -> Option<DecodeChoice<'t, T>> {
        loop {
            let (weighed, candidates) = self.decode_candidates(analysis, targets, skip);
            let decision = choose_decode(analysis.request.prompt_tokens, &candidates)?;
            let target = *weighed.get(decision.chosen)?;
            if target.acquire() {
                return Some(DecodeChoice {
                    target,
                    decision,
                    weighed,
                    candidates,
                });
            }
            skip.push(target.worker());
        }
    }

    /// Counts the request on the chosen decode target: its prompt occupies the worker's KV
    /// cache but is not computed there (it arrives by transfer), so it queues no prefill
    /// tokens and feeds no calibration. When the worker publishes no KV events, the prompt's
    /// blocks are predicted there from `now` on (it holds them once imported).
    pub fn admit_decode<T: Target>(
        &self,
        analysis: &Analysis,
        choice: &DecodeChoice<'_, T>,
        now: Duration,
    ) -> Admitted {
        let worker = choice.target.worker();
        if analysis.request.blocks > 0 && !choice.target.publishes_events() {
            self.holdings()
                .approx
                .record_routed(worker, &analysis.hashes, now);
        }
        let guard = choice
            .target
            .load()
            .admit(analysis.request.prompt_tokens, 0);
        Admitted::unpredicted(
            worker,
            guard,
            Arc::clone(self.policy()),
            analysis,
            analysis.overlaps.get(worker),
        )
        .admitted_at(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(worker: u32, in_flight: u64, active: u64, kv: Option<u64>) -> DecodeCandidate {
        DecodeCandidate {
            id: format!("d{worker}").into(),
            worker: WorkerId(worker),
            load: LoadSnapshot {
                in_flight,
                active_prompt_tokens: active,
                ..LoadSnapshot::default()
            },
            kv_tokens: kv,
        }
    }

    #[test]
    fn decode_goes_to_the_least_loaded_worker_with_room() {
        let c = [
            candidate(0, 3, 300, Some(10_000)),
            candidate(1, 1, 100, Some(10_000)),
            candidate(2, 2, 100, Some(10_000)),
        ];
        assert_eq!(choose_decode(100, &c).unwrap().chosen, 1);
        // The least loaded one cannot hold a long prompt: the next one can.
        let c = [
            candidate(0, 3, 300, Some(100_000)),
            candidate(1, 1, 9_000, Some(10_000)),
        ];
        let d = choose_decode(2_000, &c).unwrap();
        assert_eq!(d.chosen, 0);
        assert_eq!(d.kv_usage[1], Some(1.1));
        // Equal loads: the emptier cache, then fewer admitted, then the first.
        let c = [
            candidate(0, 1, 500, Some(1_000)),
            candidate(1, 1, 100, Some(1_000)),
        ];
        assert_eq!(choose_decode(10, &c).unwrap().chosen, 1);
        let mut c = [candidate(0, 0, 0, None), candidate(1, 0, 0, None)];
        c[0].load.admitted = 5;
        assert_eq!(choose_decode(10, &c).unwrap().chosen, 1);
        c[1].load.admitted = 5;
        assert_eq!(choose_decode(10, &c).unwrap().chosen, 0);
        assert_eq!(choose_decode(10, &[]), None);
    }

    struct T(Role);
    impl Target for T {
        fn worker(&self) -> WorkerId {
            WorkerId(0)
        }
        fn label(&self) -> &Arc<str> {
            unreachable!("plan reads roles only")
        }
        fn load(&self) -> &Arc<crate::fleet::Load> {
            unreachable!("plan reads roles only")
        }
        fn routable(&self) -> bool {
            true
        }
        fn publishes_events(&self) -> bool {
            false
        }
        fn role(&self) -> Role {
            self.0
        }
    }

    #[test]
    fn a_pair_needs_both_sides() {
        use Role::*;
        assert_eq!(plan(&[T(Both), T(Both)]), Ok(Plan::Whole));
        assert_eq!(plan::<T>(&[]), Ok(Plan::Whole));
        assert_eq!(plan(&[T(Prefill), T(Decode)]), Ok(Plan::Pair));
        assert_eq!(plan(&[T(Prefill), T(Both)]), Ok(Plan::Pair));
        assert_eq!(
            plan(&[T(Decode), T(Decode)]),
            Err(MissingSide(Side::Prefill))
        );
        assert_eq!(plan(&[T(Prefill)]), Err(MissingSide(Side::Decode)));
        let e = MissingSide(Side::Prefill).to_string();
        assert!(e.contains("no prefill worker"), "{e}");
    }
}
