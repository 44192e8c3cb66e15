//! The decision itself: candidates, the policy's choice, and admission on the chosen worker.

use std::sync::Arc;
use std::time::Duration;

use super::admitted::{Admitted, Forecast};
use super::analysis::Analysis;
use super::isolation::Confined;
use super::target::Target;
use crate::fleet::decode_ages::DecodeAges;
use crate::fleet::{Occupants, Side, WorkerId};
use crate::index::{Holdings, ReuseCurve, SessionHome};
use crate::policy::saturation::{self, Saturation};
use crate::policy::{Candidate, Policy, RouteDecision, WorkingSet};
use crate::tokens::HashSeed;

/// `decision` moved to a candidate predicted to meet the request's TTFT target, if it has one
/// (see `routing::slo`).
fn slo_preferred(mut decision: RouteDecision, analysis: &Analysis) -> RouteDecision {
    if let Some(target) = analysis.ttft_target_s {
        super::slo::prefer(&mut decision, target);
    }
    decision
}

/// The policy and the index, shared by every decision of a router (live or simulated).
pub struct Decider {
    policy: Arc<dyn Policy>,
    holdings: Arc<Holdings>,
}

/// A chosen target with what the policy saw and said.
#[derive(Debug)]
pub struct Choice<'t, T> {
    /// The chosen target.
    pub target: &'t T,
    /// The policy's decision over all candidates.
    pub decision: RouteDecision,
    /// Every target the policy weighed (the chosen one included), in the order of
    /// `decision`'s per-candidate figures.
    pub weighed: Vec<&'t T>,
    /// Their candidate entries, in the same order.
    pub candidates: Vec<Candidate>,
    /// The isolation rule that narrowed the candidates, if one did.
    pub confined: Option<Confined>,
    /// Whether, and why, the fleet was saturated for the request (`policy::saturation`),
    /// read by the booking and the decision's metrics.
    pub saturated: Option<Saturation>,
}

/// The candidates of one decision, as isolation left them ([`Decider::weigh`]).
#[derive(Debug)]
pub struct Weighed<'t, T> {
    /// Their targets.
    pub picked: Vec<&'t T>,
    /// Their candidate entries, in the same order.
    pub candidates: Vec<Candidate>,
    /// The isolation rule that narrowed them, if one did.
    pub confined: Option<Confined>,
}

impl<T> Choice<'_, T> {
    /// The chosen target's candidate entry (load snapshot and overlap at decision time);
    /// `decision.chosen` indexes `weighed` and `candidates` alike (checked when chosen).
    pub fn candidate(&self) -> &Candidate {
        &self.candidates[self.decision.chosen]
    }

    /// The policy's predicted TTFT on the chosen target, if it predicts one.
    pub fn predicted_ttft_s(&self) -> Option<f64> {
        chosen_figure(&self.decision.predicted_ttft_s, self.decision.chosen)
    }

    /// The wait for KV room the policy priced on the chosen target, if it prices one.
    pub fn room_wait_s(&self) -> Option<f64> {
        chosen_figure(&self.decision.room_wait_s, self.decision.chosen)
    }
}

/// A decision's per-candidate figure for the chosen candidate.
fn chosen_figure(figures: &[Option<f64>], chosen: usize) -> Option<f64> {
    figures.get(chosen).copied().flatten()
}

impl Decider {
    /// A decider over `policy` and `holdings`.
    pub fn new(policy: Arc<dyn Policy>, holdings: Arc<Holdings>) -> Decider {
        Decider { policy, holdings }
    }

    /// The policy.
    pub fn policy(&self) -> &Arc<dyn Policy> {
        &self.policy
    }

    /// The index.
    pub fn holdings(&self) -> &Arc<Holdings> {
        &self.holdings
    }

    /// Whether decisions need the prompt's tokens (load-only policies skip tokenization).
    pub fn uses_prefix(&self) -> bool {
        self.policy.uses_prefix()
    }

    /// The analysis of a tokenized prompt at `now`, or the load-only one when the policy does
    /// not weigh prefixes.
    pub fn analyse(
        &self,
        ids: &[u32],
        seed: HashSeed,
        block_size: usize,
        now: Duration,
    ) -> Analysis {
        if !self.uses_prefix() {
            return Analysis::load_only();
        }
        Analysis::of_prompt(ids, seed, block_size, &self.holdings, now)
    }

    /// The routable `targets` not in `skip`, with each one's candidate entry, in order.
    pub fn candidates<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        skip: &[WorkerId],
    ) -> (Vec<&'t T>, Vec<Candidate>) {
        self.candidates_on(analysis, targets, skip, None)
    }

    /// [`Self::candidates`] among the targets whose role serves `side` (all of them for
    /// `None`: an aggregated request's eligible workers are chosen by the server).
    pub fn candidates_on<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        skip: &[WorkerId],
        side: Option<Side>,
    ) -> (Vec<&'t T>, Vec<Candidate>) {
        let picked: Vec<&T> = targets
            .iter()
            .filter(|t| {
                !skip.contains(&t.worker())
                    && side.is_none_or(|s| t.role().serves(s))
                    && t.routable()
            })
            .collect();
        let curve = self.holdings.residency.curve();
        let home = self.session_home(analysis);
        let warm = analysis.overlaps.max() as usize;
        let (mut candidates, aged): (Vec<Candidate>, Vec<bool>) = picked
            .iter()
            .map(|t| {
                let at_home = home.filter(|h| h.worker == t.worker());
                let (cache, aged) = self.working_set(analysis, *t, &curve, warm);
                let candidate = Candidate {
                    id: Arc::clone(t.label()),
                    worker: t.worker(),
                    load: t.load().view(),
                    overlap_blocks: overlap_with_hint(analysis, *t, at_home),
                    lower_blocks: analysis.lower_blocks(t.worker()),
                    cache,
                    session_home: at_home.is_some(),
                };
                (candidate, aged)
            })
            .unzip();
        // A wait for room is priced from how long requests run, and the requests still running
        // everywhere are part of that evidence (`policy::residence`): once one candidate's
        // ages are read, every candidate's are.
        if aged.contains(&true) {
            for ((c, t), aged) in candidates.iter_mut().zip(&picked).zip(&aged) {
                if !aged {
                    c.cache.decode_ages = t.load().decode_ages(analysis.at);
                }
            }
        }
        (picked, candidates)
    }

    /// Where the session the client named was last routed, if it names one the router knows.
    pub fn session_home(&self, analysis: &Analysis) -> Option<SessionHome> {
        let key = analysis.session?;
        self.holdings
            .sessions
            .home(key, &analysis.hashes, analysis.at)
    }

    /// `target`'s working set when `analysis` was made, and what writing the prompt's uncached
    /// blocks there would evict that comes back (nothing for a load-only analysis, which
    /// touches no blocks); and whether the prompt may wait there for room (its ages were read).
    fn working_set<T: Target>(
        &self,
        analysis: &Analysis,
        target: &T,
        curve: &ReuseCurve,
        warm: usize,
    ) -> (WorkingSet, bool) {
        if analysis.hashes.is_empty() {
            return (WorkingSet::default(), false);
        }
        let residency = &self.holdings.residency;
        let worker = target.worker();
        let capacity_blocks = target.kv_blocks().map(|b| b as u64);
        let overlap = (analysis.overlaps.get(worker) as usize).min(analysis.hashes.len());
        let new_blocks = (analysis.hashes.len() - overlap) as u64;
        let (running_tokens, running_prefix, sharing_requests) =
            target
                .load()
                .running_sharing(&analysis.hashes, analysis.request.block_size, warm);
        // Only a prompt that does not fit beside what runs there waits for room, and only that
        // wait reads the decoding requests' ages one by one (a walk of the worker's decode
        // starts under its lock): the rest of the decisions skip it. The booked prompts are
        // not all the running requests hold (their answers grow, at a rate the policy learns
        // and from the ages' sum, read for every decision), so the ages are read from half the
        // capacity on; below that, a worker whose answers fill it is still priced a wait, its
        // requests taken as found running at random.
        let block_size = u64::from(analysis.request.block_size);
        let needed = analysis
            .request
            .prompt_tokens
            .saturating_sub(running_prefix as u64 * block_size);
        let filling =
            capacity_blocks.is_some_and(|c| 2 * (running_tokens + needed) > c * block_size);
        let decode_ages = if filling {
            target.load().decode_ages(analysis.at)
        } else {
            DecodeAges::default()
        };
        let set = WorkingSet {
            // Only a worker of known capacity is priced a wait for room.
            decoded_s: if capacity_blocks.is_some() {
                target.load().decoded_s(analysis.at)
            } else {
                0.0
            },
            sharing_requests,
            decode_ages,
            live_blocks: residency.live_blocks(worker, analysis.at),
            capacity_blocks,
            running_tokens,
            running_prefix_blocks: running_prefix as u64,
            returning_evictions: capacity_blocks.map_or(0.0, |capacity| {
                residency.returning_evictions(
                    worker,
                    capacity,
                    new_blocks,
                    &analysis.hashes[..overlap],
                    analysis.at,
                    curve,
                )
            }),
        };
        (set, filling)
    }

    /// The candidates a decision weighs: [`Self::candidates_on`], narrowed by placement
    /// isolation when the request's tenant has a stance (`routing::isolation`).
    pub fn weigh<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        skip: &[WorkerId],
        side: Option<Side>,
    ) -> Weighed<'t, T> {
        let (picked, candidates) = self.candidates_on(analysis, targets, skip, side);
        let narrowed = analysis.standing.as_ref().and_then(|standing| {
            let occupants: Vec<Occupants> = picked
                .iter()
                .map(|t| t.load().tenancy().occupants())
                .collect();
            super::isolation::confine(standing, &occupants)
        });
        let Some((confined, allowed)) = narrowed else {
            return Weighed {
                picked,
                candidates,
                confined: None,
            };
        };
        let keep = |i: &usize| allowed.binary_search(i).is_ok();
        Weighed {
            picked: (0..picked.len()).filter(keep).map(|i| picked[i]).collect(),
            candidates: candidates
                .into_iter()
                .enumerate()
                .filter(|(i, _)| keep(i))
                .map(|(_, c)| c)
                .collect(),
            confined: Some(confined),
        }
    }

    /// The policy's choice among the routable `targets` serving `side` (all for `None`), as
    /// narrowed by isolation ([`Self::weigh`]), without taking anything (what `/debug/route`
    /// shows, see `routing::explain`).
    pub fn explain<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        side: Option<Side>,
    ) -> (Weighed<'t, T>, Option<RouteDecision>) {
        let weighed = self.weigh(analysis, targets, &[], side);
        let decision = self.policy.choose(&analysis.request, &weighed.candidates);
        let decision = decision.map(|d| slo_preferred(d, analysis));
        (weighed, decision)
    }

    /// Chooses a target not in `skip` that grants a request; a target whose circuit refuses
    /// (its half-open probe is taken) is added to `skip` and the policy asked again. `None`
    /// when no target is left.
    pub fn choose<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        skip: &mut Vec<WorkerId>,
    ) -> Option<Choice<'t, T>> {
        self.choose_on(analysis, targets, skip, None)
    }

    /// [`Self::choose`] among the targets whose role serves `side`: a disaggregated request's
    /// prefill worker is chosen by the policy, KV-aware, with `Some(Side::Prefill)`.
    pub fn choose_on<'t, T: Target>(
        &self,
        analysis: &Analysis,
        targets: &'t [T],
        skip: &mut Vec<WorkerId>,
        side: Option<Side>,
    ) -> Option<Choice<'t, T>> {
        loop {
            let Weighed {
                picked,
                candidates,
                confined,
            } = self.weigh(analysis, targets, skip, side);
            let decision = self.policy.choose(&analysis.request, &candidates)?;
            let decision = slo_preferred(decision, analysis);
            let target = *picked.get(decision.chosen)?;
            if target.acquire() {
                let saturated = saturation::saturation(
                    analysis.request.prompt_tokens,
                    &candidates,
                    &decision.room_wait_s,
                );
                return Some(Choice {
                    target,
                    decision,
                    weighed: picked,
                    candidates,
                    confined,
                    saturated,
                });
            }
            skip.push(target.worker());
        }
    }

    /// Counts the request on the chosen target's load and, when that worker publishes no KV
    /// events, predicts the prompt's blocks there from `now` on.
    pub fn admit<T: Target>(
        &self,
        analysis: &Analysis,
        choice: &Choice<'_, T>,
        now: Duration,
    ) -> Admitted {
        let c = choice.candidate();
        let worker = choice.target.worker();
        let uncached = booked_uncached(analysis, c, choice.saturated.is_some());
        let predicted_ttft = choice.predicted_ttft_s();
        if analysis.request.blocks > 0 && !choice.target.publishes_events() {
            self.holdings
                .approx
                .record_routed(worker, &analysis.hashes, now);
        }
        if let Some(key) = analysis.session {
            self.holdings
                .sessions
                .learn(key, worker, &analysis.hashes, now);
        }
        self.holdings.admitted(
            worker,
            &analysis.hashes,
            now,
            choice.target.kv_blocks().map(|b| b as u64),
        );
        let mut guard = choice.target.load().admit_holding(
            analysis.request.prompt_tokens,
            uncached,
            &analysis.hashes,
            analysis.request.block_size,
        );
        if let Some(standing) = &analysis.standing {
            guard.occupy(&standing.tenant);
        }
        Admitted::new(
            worker,
            guard,
            Arc::clone(&self.policy),
            analysis,
            c,
            uncached,
            Forecast {
                ttft_s: predicted_ttft,
                room_wait_s: choice.room_wait_s().unwrap_or(0.0),
            },
        )
        .admitted_at(now)
    }
}

/// The prompt tokens `c`'s prefill queue grows by. Blocks in host memory or on disk are
/// loaded, not computed, whatever the policy credits them with; on a saturated fleet
/// (`policy::saturation`) the prefix a request in flight there is computing is written
/// before this request starts, so it is not booked twice.
fn booked_uncached(analysis: &Analysis, c: &Candidate, saturated: bool) -> u64 {
    let held = c.overlap_blocks + c.lower_blocks.total();
    let in_flight = u32::try_from(c.cache.running_prefix_blocks).unwrap_or(u32::MAX);
    if saturated && in_flight > held {
        analysis.uncached_tokens(in_flight)
    } else {
        analysis.uncached_tokens(held)
    }
}

/// Leading blocks of the prompt `target` is expected to hold: the index's count, or, on a
/// worker that publishes no KV events and is the home of the request's session, what its last
/// request there shared with this one when that is more (the index predicts routed prompts
/// only for a short while; the hint lasts the session's TTL). Exact holdings are never
/// overridden: an event-publishing worker's count is what its engine reported.
fn overlap_with_hint<T: Target>(analysis: &Analysis, target: &T, home: Option<SessionHome>) -> u32 {
    let indexed = analysis.overlaps.get(target.worker());
    match home {
        Some(h) if !target.publishes_events() && !analysis.no_reuse => {
            let reusable = super::analysis::reusable_blocks(
                analysis.request.prompt_tokens as usize,
                analysis.request.block_size as usize,
            );
            indexed.max(
                h.shared_blocks
                    .min(u32::try_from(reusable).unwrap_or(u32::MAX)),
            )
        }
        _ => indexed,
    }
}

#[cfg(test)]
#[path = "decider_tests.rs"]
mod tests;
