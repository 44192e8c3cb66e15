//! The fleet's calibration: one fit of the cost model's rates for all workers, and per worker
//! only a bounded, shrunk speed factor.
//!
//! Fitting three rates per worker turned noise into lasting preferences (issue 15): sequential
//! short prompts on an idle fleet leave the regression ill-conditioned (prompt sizes barely
//! vary, nothing decodes), so identical engines got rates several times apart. The one that
//! looked fastest then won every idle decision and priced its queue cheaper in bursts (2,000
//! unique prompts over four identical engines split 1,297/352/214/137), and the engines it
//! starved never got the observations that would have corrected them.
//!
//! Here every observation feeds one pooled fit ([`Calibrator`]), so identical workers price
//! the same load identically whatever the noise. A worker's own evidence only moves its speed
//! factor, the geometric mean of its observed ÷ pooled-predicted TTFTs, and only as far as the
//! evidence carries:
//! - each sample's log-ratio is clipped to ±ln 2, so a stall (a GC pause, a busy host, a
//!   network hiccup) counts as "twice as slow" at most, never as 50×;
//! - the mean is shrunk toward the fleet's by `n / (n + SHRINKAGE_OBSERVATIONS)` (empirical
//!   Bayes with a strong prior that identical replicas are identical: a difference needs
//!   hundreds of consistent samples before it counts for much);
//! - factors are relative to the fleet's weighted mean, so an error of the pooled fit that every
//!   worker shares (its early, immature predictions) is nobody's preference;
//! - they are bounded to [1/`MAX_FACTOR`, `MAX_FACTOR`];
//! - each worker's evidence decays as the *fleet* observes, so a worker that gets no traffic
//!   drifts back to the pool and is tried again, instead of being judged forever on old samples.
//!
//! A truly slower worker (another GPU type, a noisy neighbour) still ends up with a factor
//! above 1 and a smaller share; ±30 % noise on identical engines does not.
//!
//! Shrinkage that strong cannot learn a fleet that really is mixed: a worker twice as slow as
//! its peers was priced about 1.12× theirs, so half a fleet at half speed took 40 % of the
//! requests and the fleet's TTFT p99 was half as high again as with each worker priced at its
//! true speed (docs/benchmarks.md, "Mixed fleets"). So the fleet is judged *mixed* once its
//! slowest and fastest workers' own means stand [`MIXED_SPREAD`] apart, each taken
//! [`SPREAD_Z`] standard errors in toward the other (workers with at least
//! [`OWN_MEAN_WEIGHT`] observations); then every worker with that much evidence is priced at
//! its own mean, barely shrunk, the fast ones as well as the slow. Only requests that had
//! nothing queued ahead of them on their worker judge: there the prediction is the engine's own
//! prefill, and a ratio off it is the engine's speed, where under a queue it is as often the
//! model misjudging the queue (a burst of siblings tripped the judgement on identical engines
//! until queued requests were left out of it). The fleet is one pool again once the spread falls
//! under [`POOLED_SPREAD`]: a slow worker gets little traffic, its evidence thins and its margin
//! widens, and the judgement must not flap with it. GPU generations and tensor-parallel sizes
//! differ by 1.5–3×; identical engines stay one pool. A worker that stops being observed loses
//! its evidence as any other does.
//!
//! One exception keeps a full fit per worker: load the router's view cannot see. With several
//! router replicas, a replica knows other replicas' requests on a worker only from the engine's
//! last load reading, as counts, priced at its own mean prompt (`fleet::load_view`). What that
//! misses — how much prefill those requests really still need, what arrived since the reading —
//! shows up as that worker's TTFTs running above prediction, and a per-worker fit sees it
//! within a few requests and steers away. Pooling removed that feedback, and replicas reading
//! engine load routed worse than blind ones (unique 4k-token prompts at 75 % load, 4 replicas
//! reading every 100 ms: TTFT mean 201 ms pooled vs 162 ms with per-worker fits; bounding the
//! per-worker fits to the pooled ×/÷ 1.15 or 1.5 gave 192 / 182 ms; using per-worker fits only
//! for the workers whose view held others' requests, pooled rates for the rest, 166 ms: one
//! decision must compare every worker in the same currency; all workers' own fits with the 2 %
//! tie window, 170 ms; with exact ties, 159 ms). So every worker also keeps its own
//! fit, and a decision whose view is *partial* (some worker's load includes other replicas'
//! requests) scores every worker with it; the samples observed under a partial view do not move
//! the speed factors, since the load the view missed is no evidence of speed. Where the view is
//! complete (one router; or no other replica's request anywhere at the last readings, as on an
//! idle fleet) there is no unseen load for a per-worker fit to find, only noise, and the pooled
//! fit decides.

use std::collections::HashMap;
use std::hash::Hash;

use super::calibration::{Calibrator, MIN_OBSERVATIONS, Rates};

/// Effective observations a worker's own evidence needs before it counts for half.
///
/// Measured in `kvroute simulate` on the Mooncake conversation trace × 16 identical workers
/// (TTFT mean / p90): 50 → 189.3 / 439.3 ms, 200 → 187.0 / 436.7 ms, 1,000 → 185.5 / 426.7 ms,
/// no factors at all → 185.0 / 426.2 ms. What separates identical workers there is not noise
/// but the model's misfit for the work each happens to hold, and every weaker shrinkage let it
/// steer traffic. With the default forgetting (0.995) a worker's weight saturates near 200, so
/// its own evidence counts for at most a sixth: a worker twice as slow as its peers ends up
/// priced about 1.12× theirs, and its growing queue (which the router counts) does the rest.
pub const SHRINKAGE_OBSERVATIONS: f64 = 1_000.0;

/// How far a worker's speed factor may stray from the fleet's: ½ to 2×.
pub const MAX_FACTOR: f64 = 2.0;

/// How far apart the slowest and the fastest worker must be for the fleet to be judged
/// *mixed* (another GPU type, not the model's misfit on identical engines): 1.5×.
pub const MIXED_SPREAD: f64 = 1.5;

/// How close they must come again for a mixed fleet to be one pool again: 1.25× (hysteresis:
/// a slow worker's evidence thins while it gets little traffic, and the judgement must not
/// flap with it).
pub const POOLED_SPREAD: f64 = 1.25;

/// Standard errors by which each side's mean is taken in before the spread is measured.
pub const SPREAD_Z: f64 = 2.0;

/// Fewest effective observations before a worker's own mean counts.
pub const OWN_MEAN_WEIGHT: f64 = 16.0;

/// Effective observations a worker's own mean is shrunk by in a mixed fleet (a light touch).
const MIXED_SHRINKAGE: f64 = 4.0;

/// Forgetting-weighted sums of clipped log-ratios and of their squares, and their weight.
#[derive(Clone, Copy, Debug, Default)]
struct Moments {
    log_ratio_sum: f64,
    log_ratio_squares: f64,
    weight: f64,
}

impl Moments {
    fn add(&mut self, log_ratio: f64) {
        self.log_ratio_sum += log_ratio;
        self.log_ratio_squares += log_ratio * log_ratio;
        self.weight += 1.0;
    }

    fn decay(&mut self, by: f64) {
        self.log_ratio_sum *= by;
        self.log_ratio_squares *= by;
        self.weight *= by;
    }

    fn mean(&self) -> f64 {
        if self.weight <= 0.0 {
            return 0.0;
        }
        self.log_ratio_sum / self.weight
    }

    fn standard_error(&self) -> f64 {
        if self.weight <= 1.0 {
            return f64::INFINITY;
        }
        let mean = self.mean();
        let variance = (self.log_ratio_squares / self.weight - mean * mean).max(0.0);
        (variance / self.weight).sqrt()
    }
}

/// One worker's evidence: every observation's log-ratio, and apart those of requests that had
/// nothing queued ahead of them there (what the engine's speed alone decides).
#[derive(Clone, Copy, Debug, Default)]
struct Evidence {
    all: Moments,
    alone: Moments,
}

impl Evidence {
    /// The worker's mean log-ratio, shrunk toward 0.
    fn shrunk(&self) -> f64 {
        if self.all.weight <= 0.0 {
            return 0.0;
        }
        self.all.log_ratio_sum / (self.all.weight + SHRINKAGE_OBSERVATIONS)
    }

    /// The worker's log speed factor before it is made relative to the fleet's: in a mixed
    /// fleet its own mean (once it has [`OWN_MEAN_WEIGHT`] observations), else the strongly
    /// shrunk mean.
    fn estimate(&self, mixed: bool) -> f64 {
        if mixed && self.all.weight >= OWN_MEAN_WEIGHT {
            self.all.log_ratio_sum / (self.all.weight + MIXED_SHRINKAGE)
        } else {
            self.shrunk()
        }
    }

    fn decay(&mut self, by: f64) {
        self.all.decay(by);
        self.alone.decay(by);
    }
}

/// The log of how far apart the slowest and the fastest worker are, each mean taken
/// [`SPREAD_Z`] standard errors in toward the other (0 with fewer than two workers of
/// [`OWN_MEAN_WEIGHT`] observations).
fn spread<'e>(evidence: impl Iterator<Item = &'e Evidence>) -> f64 {
    let (mut slowest, mut fastest) = (f64::NEG_INFINITY, f64::INFINITY);
    for e in evidence
        .map(|e| &e.alone)
        .filter(|e| e.weight >= OWN_MEAN_WEIGHT)
    {
        let margin = SPREAD_Z * e.standard_error();
        slowest = slowest.max(e.mean() - margin);
        fastest = fastest.min(e.mean() + margin);
    }
    if slowest.is_finite() && fastest.is_finite() {
        (slowest - fastest).max(0.0)
    } else {
        0.0
    }
}

/// What the workers' factors are measured against: whether the fleet is mixed, and the
/// fleet's weighted mean estimate.
#[derive(Clone, Copy, Debug)]
struct Reference {
    mixed: bool,
    fleet: f64,
}

/// A pooled fit of the rates and a speed factor per worker `K`.
#[derive(Clone, Debug)]
pub struct FleetCalibration<K> {
    pooled: Calibrator,
    evidence: HashMap<K, Evidence>,
    /// Per-worker fits of every observation, for decisions on a partial view.
    own_fits: HashMap<K, Calibrator>,
    forgetting: f64,
    /// Whether the workers' speeds differ ([`MIXED_SPREAD`], [`POOLED_SPREAD`]).
    mixed: bool,
}

impl<K: Copy + Eq + Hash> FleetCalibration<K> {
    /// Starts from `prior`; `forgetting` in (0, 1] as for [`Calibrator::new`] (per observation
    /// of the pooled fit, and per observation of its own when traffic is even for a factor).
    pub fn new(prior: Rates, forgetting: f64) -> Self {
        let pooled = Calibrator::new(prior, forgetting);
        FleetCalibration {
            forgetting: pooled.forgetting(),
            pooled,
            evidence: HashMap::new(),
            own_fits: HashMap::new(),
            mixed: false,
        }
    }

    /// Adds one observation of `worker`: `tokens` of prefill queued ahead of and including the
    /// request, `decoding` sequences, and the TTFT observed. `partial` says the view the request
    /// was routed on held other router replicas' requests on the worker: the sample then trains
    /// the pooled fit and the worker's own fit, not its speed factor, because the load the view
    /// missed is no evidence of speed. `alone` says the request had nothing queued ahead of it
    /// on the worker: only such samples judge whether the fleet is mixed, since a queue's
    /// misprediction is no evidence of an engine's speed.
    pub fn observe(
        &mut self,
        worker: K,
        tokens: f64,
        decoding: f64,
        ttft_s: f64,
        partial: bool,
        alone: bool,
    ) {
        if !(tokens.is_finite() && decoding.is_finite() && ttft_s.is_finite()) || ttft_s < 0.0 {
            return;
        }
        let prior = self.pooled.rates();
        let forgetting = self.forgetting;
        self.own_fits
            .entry(worker)
            .or_insert_with(|| Calibrator::new(prior, forgetting))
            .observe(tokens, decoding, ttft_s);
        if partial {
            self.pooled.observe(tokens, decoding, ttft_s);
            return;
        }
        // The worker's evidence is measured against the pooled fit as it stands, once the
        // pool has enough to predict anything (before that, every factor is 1 anyway).
        if self.pooled.observations() >= MIN_OBSERVATIONS {
            let predicted = self.pooled.rates().predict(tokens, decoding);
            if predicted > 0.0 {
                let log_ratio = (ttft_s.max(1e-6) / predicted)
                    .ln()
                    .clamp(-MAX_FACTOR.ln(), MAX_FACTOR.ln());
                // Evidence fades as the fleet observes, at the pace that forgets a worker's own
                // samples at `forgetting` per own sample when traffic is even.
                let workers = self.evidence.len().max(1) as f64;
                let decay = self.forgetting.powf(1.0 / workers);
                for e in self.evidence.values_mut() {
                    e.decay(decay);
                }
                let e = self.evidence.entry(worker).or_default();
                e.all.add(log_ratio);
                if alone {
                    e.alone.add(log_ratio);
                }
                self.judge();
            }
        }
        self.pooled.observe(tokens, decoding, ttft_s);
    }

    /// Replaces the prior (a configuration reload): it takes effect while the pooled fit has
    /// too few observations to be used; a fit already in use is kept.
    pub fn set_prior(&mut self, prior: Rates) {
        if self.pooled.observations() < MIN_OBSERVATIONS {
            self.pooled = Calibrator::new(prior, self.forgetting);
        }
    }

    /// The pooled rates (the prior until enough observations).
    pub fn pooled(&self) -> Rates {
        self.pooled.rates()
    }

    /// What every worker's factor is measured against now (`None` without evidence).
    fn reference(&self) -> Option<Reference> {
        let total: f64 = self.evidence.values().map(|e| e.all.weight).sum();
        if total <= 0.0 {
            return None;
        }
        let mixed = self.mixed;
        let fleet = self
            .evidence
            .values()
            .map(|e| e.all.weight * e.estimate(mixed))
            .sum::<f64>()
            / total;
        Some(Reference { mixed, fleet })
    }

    /// `worker`'s speed factor against `reference`.
    fn factor_in(&self, worker: K, reference: Option<&Reference>) -> f64 {
        let Some(r) = reference else {
            return 1.0;
        };
        let own = self
            .evidence
            .get(&worker)
            .map_or(r.fleet, |e| e.estimate(r.mixed));
        let bound = MAX_FACTOR.ln();
        (own - r.fleet).clamp(-bound, bound).exp()
    }

    /// `worker`'s speed factor: its estimated log-ratio ([`Evidence::estimate`]: strongly
    /// shrunk, or its own mean in a mixed fleet) relative to the fleet's weighted mean, within
    /// [1/[`MAX_FACTOR`], [`MAX_FACTOR`]]; 1 for a worker without evidence measured against the
    /// fleet's mean (a newcomer is scored like its peers).
    pub fn factor(&self, worker: K) -> f64 {
        self.factor_in(worker, self.reference().as_ref())
    }

    /// Whether the fleet is judged mixed: some worker's speed stands apart from the rest.
    pub fn mixed(&self) -> bool {
        self.mixed
    }

    /// The rates used for `worker`: the pooled ones scaled by its factor.
    pub fn rates(&self, worker: K) -> Rates {
        self.rates_against(worker, self.reference().as_ref())
    }

    fn rates_against(&self, worker: K, reference: Option<&Reference>) -> Rates {
        let f = self.factor_in(worker, reference);
        let r = self.pooled();
        Rates {
            seconds_per_token: r.seconds_per_token * f,
            step_cost_s: r.step_cost_s * f,
            overhead_s: r.overhead_s * f,
        }
    }

    /// The rates for each of `workers` in a decision whose view is `partial` (some worker's
    /// load holds other router replicas' requests): the worker's own fit once it has enough
    /// observations; otherwise, and on a complete view, [`Self::rates`] (the fleet's reference
    /// computed once for all of them).
    pub fn rates_in_view_of(&self, workers: impl Iterator<Item = K>, partial: bool) -> Vec<Rates> {
        let reference = self.reference();
        workers
            .map(|w| match self.own_fits.get(&w) {
                Some(fit) if partial && fit.observations() >= MIN_OBSERVATIONS => fit.rates(),
                _ => self.rates_against(w, reference.as_ref()),
            })
            .collect()
    }

    /// Forgets `worker`'s evidence (it left; its id may name another worker later).
    pub fn forget(&mut self, worker: K) {
        self.evidence.remove(&worker);
        self.own_fits.remove(&worker);
        self.judge();
    }

    /// Judges the fleet mixed when its workers' speeds spread past [`MIXED_SPREAD`], and one
    /// pool again once they come within [`POOLED_SPREAD`].
    fn judge(&mut self) {
        let spread = spread(self.evidence.values());
        if self.mixed {
            self.mixed = spread >= POOLED_SPREAD.ln();
        } else {
            self.mixed = spread >= MIXED_SPREAD.ln();
        }
    }
}

#[cfg(test)]
#[path = "fleet_calibration_tests.rs"]
mod tests;
