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

/// One worker's evidence: forgetting-weighted sum of clipped log-ratios and its weight.
#[derive(Clone, Copy, Debug, Default)]
struct Evidence {
    log_ratio_sum: f64,
    weight: f64,
}

impl Evidence {
    /// The worker's mean log-ratio, shrunk toward 0.
    fn shrunk(&self) -> f64 {
        if self.weight <= 0.0 {
            return 0.0;
        }
        self.log_ratio_sum / (self.weight + SHRINKAGE_OBSERVATIONS)
    }
}

/// A pooled fit of the rates and a speed factor per worker `K`.
#[derive(Clone, Debug)]
pub struct FleetCalibration<K> {
    pooled: Calibrator,
    evidence: HashMap<K, Evidence>,
    /// Per-worker fits of every observation, for decisions on a partial view.
    own_fits: HashMap<K, Calibrator>,
    forgetting: f64,
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
        }
    }

    /// Adds one observation of `worker`: `tokens` of prefill queued ahead of and including the
    /// request, `decoding` sequences, and the TTFT observed. `partial` says the view the request
    /// was routed on held other router replicas' requests on the worker: the sample then trains
    /// the pooled fit and the worker's own fit, not its speed factor, because the load the view
    /// missed is no evidence of speed.
    pub fn observe(&mut self, worker: K, tokens: f64, decoding: f64, ttft_s: f64, partial: bool) {
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
                    e.log_ratio_sum *= decay;
                    e.weight *= decay;
                }
                let e = self.evidence.entry(worker).or_default();
                e.log_ratio_sum += log_ratio;
                e.weight += 1.0;
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

    /// `worker`'s speed factor: its shrunk mean log-ratio relative to the fleet's weighted mean,
    /// within [1/[`MAX_FACTOR`], [`MAX_FACTOR`]]; 1 for a worker without evidence measured
    /// against the fleet's mean (a newcomer is scored like its peers).
    pub fn factor(&self, worker: K) -> f64 {
        let total: f64 = self.evidence.values().map(|e| e.weight).sum();
        if total <= 0.0 {
            return 1.0;
        }
        let fleet = self
            .evidence
            .values()
            .map(|e| e.weight * e.shrunk())
            .sum::<f64>()
            / total;
        let own = self.evidence.get(&worker).map_or(fleet, Evidence::shrunk);
        let bound = MAX_FACTOR.ln();
        (own - fleet).clamp(-bound, bound).exp()
    }

    /// The rates used for `worker`: the pooled ones scaled by its factor.
    pub fn rates(&self, worker: K) -> Rates {
        let f = self.factor(worker);
        let r = self.pooled();
        Rates {
            seconds_per_token: r.seconds_per_token * f,
            step_cost_s: r.step_cost_s * f,
            overhead_s: r.overhead_s * f,
        }
    }

    /// The rates for `worker` in a decision whose view is `partial` (some worker's load holds
    /// other router replicas' requests): the worker's own fit once it has enough observations;
    /// otherwise, and on a complete view, [`Self::rates`].
    pub fn rates_in_view(&self, worker: K, partial: bool) -> Rates {
        match self.own_fits.get(&worker) {
            Some(fit) if partial && fit.observations() >= MIN_OBSERVATIONS => fit.rates(),
            _ => self.rates(worker),
        }
    }

    /// Forgets `worker`'s evidence (it left; its id may name another worker later).
    pub fn forget(&mut self, worker: K) {
        self.evidence.remove(&worker);
        self.own_fits.remove(&worker);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prior() -> Rates {
        Rates {
            seconds_per_token: 5e-5,
            step_cost_s: 5e-4,
            overhead_s: 0.02,
        }
    }

    /// A deterministic uniform draw in [-0.5, 0.5).
    fn noise(x: &mut u64) -> f64 {
        *x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*x >> 33) as f64 / f64::from(1u32 << 31) - 0.5
    }

    fn spread(values: impl Iterator<Item = f64>) -> f64 {
        let v: Vec<f64> = values.collect();
        let max = v.iter().copied().fold(f64::MIN, f64::max);
        let min = v.iter().copied().fold(f64::MAX, f64::min);
        max / min
    }

    /// Identical workers, short prompts, nothing decoding (the idle fleet of the herding
    /// report), ±30 % noise and an occasional 20× stall: their load price and their idle
    /// predictions stay within 10 % of each other. Per-worker fits put them 3–8× apart.
    #[test]
    fn noise_does_not_separate_identical_workers() {
        let truth = Rates {
            seconds_per_token: 1.5e-5,
            step_cost_s: 0.0,
            overhead_s: 0.0165,
        };
        let mut fleet = FleetCalibration::new(prior(), 0.995);
        let mut per_worker: Vec<Calibrator> =
            (0..4).map(|_| Calibrator::new(prior(), 0.995)).collect();
        let mut x = 12345;
        for i in 0..400u64 {
            let tokens = 24.0 + (i % 7) as f64 * 8.0;
            let mut ttft = truth.predict(tokens, 0.0) * (1.0 + 0.6 * noise(&mut x));
            if i % 37 == 0 {
                ttft *= 20.0;
            }
            let w = (i % 4) as usize;
            fleet.observe(w, tokens, 0.0, ttft, false);
            per_worker[w].observe(tokens, 0.0, ttft);
        }
        let price = spread((0..4).map(|w| fleet.rates(w).seconds_per_token));
        assert!(price < 1.1, "pooled fit: load price spread {price}");
        let idle = spread((0..4).map(|w| fleet.rates(w).predict(40.0, 0.0)));
        assert!(idle < 1.1, "pooled fit: idle prediction spread {idle}");
        // What per-worker fits made of the same samples (the behaviour this replaces).
        let old = spread(per_worker.iter().map(|c| c.rates().seconds_per_token));
        assert!(old > 1.15, "per-worker fits: {old}");
    }

    #[test]
    fn a_slower_worker_is_recognised_within_bounds() {
        let mut fleet = FleetCalibration::new(prior(), 0.995);
        for i in 0..3_000u64 {
            let tokens = 200.0 + ((i * 7919) % 4000) as f64;
            let w = (i % 3) as u32;
            // Worker 2 is 3× slower; worker 1 looks 100× faster (implausible).
            let slow = match w {
                2 => 3.0,
                1 => 0.01,
                _ => 1.0,
            };
            fleet.observe(w, tokens, 0.0, (tokens * 5e-5 + 0.02) * slow, false);
        }
        let f: Vec<f64> = (0..3).map(|w| fleet.factor(w)).collect();
        assert!(f[2] / f[0] > 1.1, "{f:?}");
        assert!(f[1] >= 1.0 / MAX_FACTOR && f[1] < f[0], "{f:?}");
        // A worker without evidence is scored as the fleet's mean, and so is a forgotten one.
        let unknown = fleet.factor(9);
        assert!(unknown > f[1] && unknown < f[2], "{unknown} vs {f:?}");
        fleet.forget(2);
        assert_eq!(fleet.factor(2), fleet.factor(9));
    }

    #[test]
    fn an_unobserved_worker_drifts_back_to_the_pool() {
        let mut fleet = FleetCalibration::new(prior(), 0.99);
        // Worker 0 looks slow for a while, then only workers 1 and 2 are observed.
        for i in 0..300u64 {
            let tokens = 100.0 + (i % 50) as f64 * 40.0;
            let w = (i % 3) as u32;
            let slow = if w == 0 { 3.0 } else { 1.0 };
            fleet.observe(w, tokens, 0.0, (tokens * 5e-5 + 0.02) * slow, false);
        }
        let before = fleet.factor(0);
        assert!(before > 1.03, "{before}");
        for i in 0..2_000u64 {
            let tokens = 100.0 + (i % 50) as f64 * 40.0;
            fleet.observe(1 + (i % 2) as u32, tokens, 0.0, tokens * 5e-5 + 0.02, false);
        }
        let after = fleet.factor(0);
        assert!(after - 1.0 < (before - 1.0) / 4.0, "{before} → {after}");
    }

    /// Worker 0 shares its engine with other router replicas' requests the view prices too
    /// low: its TTFTs run 3× what its visible load predicts. On a partial view its own fit
    /// prices that; on a complete view it is priced like its peers (those samples were no
    /// evidence of speed), and a forgotten worker is scored like a newcomer.
    #[test]
    fn own_fits_decide_only_on_a_partial_view() {
        let mut fleet = FleetCalibration::new(prior(), 0.995);
        for i in 0..400u64 {
            let tokens = 200.0 + ((i * 7919) % 4000) as f64;
            let visible = tokens * 5e-5 + 0.02;
            fleet.observe(0, tokens, 0.0, 3.0 * visible, true);
            fleet.observe(1, tokens, 0.0, visible, false);
        }
        let predict = |w: u32, partial: bool| fleet.rates_in_view(w, partial).predict(2000.0, 0.0);
        let truth = 2000.0 * 5e-5 + 0.02;
        assert!(
            (predict(0, true) / (3.0 * truth) - 1.0).abs() < 0.05,
            "{}",
            predict(0, true)
        );
        assert!(
            (predict(1, true) / truth - 1.0).abs() < 0.05,
            "{}",
            predict(1, true)
        );
        assert!((predict(0, false) / predict(1, false) - 1.0).abs() < 0.01);
        fleet.forget(0);
        assert_eq!(fleet.rates_in_view(0, true), fleet.rates_in_view(0, false));
    }

    #[test]
    fn the_pooled_fit_learns_the_rates() {
        let truth = Rates {
            seconds_per_token: 2.5e-5,
            step_cost_s: 4e-3,
            overhead_s: 0.02,
        };
        let mut fleet = FleetCalibration::new(prior(), 0.995);
        for i in 0..400u64 {
            let tokens = ((i * 7919) % 9000) as f64 + 100.0;
            let decoding = ((i * 31) % 64) as f64;
            fleet.observe(
                (i % 4) as u32,
                tokens,
                decoding,
                truth.predict(tokens, decoding),
                false,
            );
        }
        let r = fleet.rates(2);
        assert!(
            (r.seconds_per_token - truth.seconds_per_token).abs() < 1e-6,
            "{r:?}"
        );
        assert!((fleet.factor(0) - 1.0).abs() < 0.01);
    }
}
