//! `kv_aware`: predicted time to first token, from prefix overlap and queued work.
//!
//! For each eligible worker the policy predicts
//! `ttft ≈ (queued + prompt − cached) / prefill_rate + decoding × step_cost + overhead`
//! (ARCHITECTURE.md, "The cost model"). `cached` comes from the KV index (leading blocks the
//! worker holds), `queued` and `decoding` from router-side accounting. The rates start from
//! configuration and are re-fitted per worker from observed TTFTs ([`super::calibration`]), so
//! the trade-off between a warm cache and a short queue is made in the worker's own seconds
//! rather than with a hand-tuned weight. A worker with too few observations of its own (new,
//! restarted, or never chosen yet) is scored with the mean of the calibrated workers' rates,
//! not the configured prior: otherwise a newcomer looks slower than its calibrated peers
//! forever and never gets the traffic that would calibrate it.
//!
//! The policy minimises the *total* latency the decision adds, not only the request's own
//! TTFT: with continuous batching, the request's prefill runs in the same steps as the
//! sequences already decoding on that worker and stalls each of them by about as long as it
//! takes (`uncached / prefill_rate + overhead`). So
//! `cost = ttft + decode_weight × decoding × (uncached / prefill_rate + overhead)`.
//! Measured in `kvroute simulate` (docs/benchmarks.md), TTFT alone piled decodes onto warm
//! workers and lost on completion latency whenever hits were equal; the stall term balances
//! decode load without giving up prefix hits that actually save time. The default weight,
//! 0.25, is the one that scored best on SLO attainment across the scenario suite (0 loses
//! completion latency, 1 gives up too much TTFT on unique prompts).
//!
//! Ties (equal predictions, e.g. an idle cold fleet) go to the worker with fewer requests in
//! flight, then to a seeded random one, so unique prompts spread like `least_request`. With a
//! temperature above 0 the choice is sampled, softly preferring lower predictions.

use std::collections::HashMap;
use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::calibration::{Calibrator, MIN_OBSERVATIONS, Rates};
use super::{Candidate, Observation, Policy, RouteDecision, RouteRequest};
use crate::fleet::WorkerId;

/// Settings of the cost model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvAwareConfig {
    /// Initial prefill throughput of one worker, tokens per second.
    pub prefill_rate_tokens_per_s: f64,
    /// Initial seconds added to TTFT per sequence decoding on the worker.
    pub step_cost_s: f64,
    /// Initial fixed seconds per request (scheduling, first step).
    pub overhead_s: f64,
    /// Re-fit the rates from observed TTFTs.
    pub calibrate: bool,
    /// Weight of older observations in the fit (0.9–1.0; 0.995 ≈ the last few hundred).
    pub forgetting: f64,
    /// 0: always the minimum. Above 0: sample with weights `exp(−Δcost / (temperature × best))`.
    pub temperature: f64,
    /// Weight of the stall a prefill imposes on sequences decoding on the worker (0: own TTFT
    /// only; 1: every second of anyone's latency counts the same).
    pub decode_weight: f64,
}

impl Default for KvAwareConfig {
    fn default() -> Self {
        KvAwareConfig {
            prefill_rate_tokens_per_s: 20_000.0,
            step_cost_s: 0.000_5,
            overhead_s: 0.02,
            calibrate: true,
            forgetting: 0.995,
            temperature: 0.0,
            decode_weight: 0.25,
        }
    }
}

impl KvAwareConfig {
    fn prior(&self) -> Rates {
        Rates {
            seconds_per_token: 1.0 / self.prefill_rate_tokens_per_s.max(1.0),
            step_cost_s: self.step_cost_s.max(0.0),
            overhead_s: self.overhead_s.max(0.0),
        }
    }
}

/// The cost-model policy.
#[derive(Debug)]
pub struct KvAware {
    /// The settings, replaced by a config reload ([`Policy::reconfigure`]); read once per
    /// decision.
    config: Mutex<KvAwareConfig>,
    calibrators: Mutex<HashMap<WorkerId, Calibrator>>,
    rng: Mutex<StdRng>,
}

impl KvAware {
    /// A policy with `config`; `seed` drives tie-breaks and sampling.
    pub fn new(config: KvAwareConfig, seed: u64) -> KvAware {
        KvAware {
            config: Mutex::new(config),
            calibrators: Mutex::new(HashMap::new()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    /// The settings now.
    pub fn config(&self) -> KvAwareConfig {
        *super::lock(&self.config)
    }

    /// The rates currently used for `worker`.
    pub fn rates(&self, worker: WorkerId) -> Rates {
        let config = self.config();
        let cals = super::lock(&self.calibrators);
        Self::rates_in(&cals, worker, Self::pooled(&config, &cals))
    }

    /// The mean rates of the calibrated workers, or the prior when none is.
    fn pooled(config: &KvAwareConfig, cals: &HashMap<WorkerId, Calibrator>) -> Rates {
        let fitted: Vec<Rates> = cals
            .values()
            .filter(|c| c.observations() >= MIN_OBSERVATIONS)
            .map(Calibrator::rates)
            .collect();
        if fitted.is_empty() {
            return config.prior();
        }
        let n = fitted.len() as f64;
        Rates {
            seconds_per_token: fitted.iter().map(|r| r.seconds_per_token).sum::<f64>() / n,
            step_cost_s: fitted.iter().map(|r| r.step_cost_s).sum::<f64>() / n,
            overhead_s: fitted.iter().map(|r| r.overhead_s).sum::<f64>() / n,
        }
    }

    fn rates_in(cals: &HashMap<WorkerId, Calibrator>, worker: WorkerId, pooled: Rates) -> Rates {
        match cals.get(&worker) {
            Some(c) if c.observations() >= MIN_OBSERVATIONS => c.rates(),
            _ => pooled,
        }
    }

    /// Predicted TTFT of `request` on `c`, and the cost of sending it there.
    fn predict(
        config: &KvAwareConfig,
        request: &RouteRequest,
        c: &Candidate,
        rates: &Rates,
    ) -> (f64, f64) {
        let cached = u64::from(c.overlap_blocks) * u64::from(request.block_size);
        let uncached = request.prompt_tokens.saturating_sub(cached) as f64;
        let tokens = c.load.queued_prefill_tokens as f64 + uncached;
        let decoding = c.load.decoding as f64;
        let ttft = rates.predict(tokens, decoding);
        let stall = uncached * rates.seconds_per_token + rates.overhead_s;
        (ttft, ttft + config.decode_weight * decoding * stall)
    }
}

impl Policy for KvAware {
    fn name(&self) -> &'static str {
        super::PolicyKind::KvAware.name()
    }

    fn uses_prefix(&self) -> bool {
        true
    }

    fn choose(&self, request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision> {
        if candidates.is_empty() {
            return None;
        }
        let config = self.config();
        let (predicted, cost): (Vec<f64>, Vec<f64>) = {
            let cals = super::lock(&self.calibrators);
            let pooled = Self::pooled(&config, &cals);
            candidates
                .iter()
                .map(|c| {
                    let rates = Self::rates_in(&cals, c.worker, pooled);
                    Self::predict(&config, request, c, &rates)
                })
                .unzip()
        };
        let best = cost.iter().copied().fold(f64::INFINITY, f64::min);
        let chosen = if config.temperature > 0.0 {
            let scale = config.temperature * best.max(1e-3);
            let weights: Vec<f64> = cost.iter().map(|p| (-(p - best) / scale).exp()).collect();
            let total: f64 = weights.iter().sum();
            let mut x = super::lock(&self.rng).random_range(0.0..total);
            let mut pick = 0;
            for (i, w) in weights.iter().enumerate() {
                if x < *w {
                    pick = i;
                    break;
                }
                x -= w;
            }
            pick
        } else {
            // Equal within a microsecond is a tie.
            let tied: Vec<usize> = (0..candidates.len())
                .filter(|&i| cost[i] - best <= 1e-6)
                .collect();
            let fewest = tied
                .iter()
                .map(|&i| candidates[i].load.in_flight)
                .min()
                .unwrap_or(0);
            let tied: Vec<usize> = tied
                .into_iter()
                .filter(|&i| candidates[i].load.in_flight == fewest)
                .collect();
            if tied.len() == 1 {
                tied[0]
            } else {
                tied[super::lock(&self.rng).random_range(0..tied.len())]
            }
        };
        Some(RouteDecision {
            chosen,
            predicted_ttft_s: predicted.into_iter().map(Some).collect(),
            cost: cost.into_iter().map(Some).collect(),
        })
    }

    fn forget(&self, worker: WorkerId) {
        super::lock(&self.calibrators).remove(&worker);
    }

    /// A reload's new cost model applies from the next decision: the weights, the temperature
    /// and the prior (which scores every worker not calibrated yet). Rates already fitted are
    /// kept (they are measurements of the workers, not settings); a new `forgetting` applies
    /// to workers calibrated from now on. The seed is not changed.
    fn reconfigure(&self, settings: &super::PolicySettings) {
        *super::lock(&self.config) = settings.kv_aware;
    }

    fn observe(&self, o: &Observation) {
        let config = self.config();
        if !config.calibrate {
            return;
        }
        let mut cals = super::lock(&self.calibrators);
        let prior = config.prior();
        let forgetting = config.forgetting;
        cals.entry(o.worker)
            .or_insert_with(|| Calibrator::new(prior, forgetting))
            .observe(
                (o.queued_tokens + o.uncached_tokens) as f64,
                o.decoding as f64,
                o.ttft_s,
            );
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::idle;
    use super::*;

    fn req(tokens: u64) -> RouteRequest {
        RouteRequest {
            prompt_tokens: tokens,
            blocks: (tokens / 16) as u32,
            block_size: 16,
        }
    }

    fn policy() -> KvAware {
        KvAware::new(
            KvAwareConfig {
                calibrate: false,
                ..Default::default()
            },
            1,
        )
    }

    #[test]
    fn prefers_the_warm_worker_when_queues_are_equal() {
        let mut c = idle(3);
        c[2].overlap_blocks = 400;
        let d = policy().choose(&req(8000), &c).unwrap();
        assert_eq!(d.chosen, 2);
        let p = d.predicted_ttft_s;
        assert!(p[2].unwrap() < p[0].unwrap());
    }

    #[test]
    fn bypasses_a_warm_worker_whose_queue_costs_more_than_the_prefix_saves() {
        let mut c = idle(2);
        c[0].overlap_blocks = 100; // saves 1,600 tokens
        c[0].load.queued_prefill_tokens = 20_000; // but 20,000 are queued ahead
        assert_eq!(policy().choose(&req(2000), &c).unwrap().chosen, 1);
        // With a short queue the same prefix wins.
        c[0].load.queued_prefill_tokens = 500;
        assert_eq!(policy().choose(&req(2000), &c).unwrap().chosen, 0);
    }

    #[test]
    fn reconfigured_weights_apply_to_the_next_decision() {
        let mut c = idle(2);
        c[0].overlap_blocks = 100; // saves 1,600 tokens
        c[0].load.queued_prefill_tokens = 1_000;
        let p = policy();
        assert_eq!(p.choose(&req(2000), &c).unwrap().chosen, 0);
        let before = p.choose(&req(2000), &c).unwrap().predicted_ttft_s[1].unwrap();
        // A prior ten times slower changes every prediction at once.
        p.reconfigure(&crate::policy::PolicySettings {
            kv_aware: KvAwareConfig {
                prefill_rate_tokens_per_s: 2_000.0,
                calibrate: false,
                ..Default::default()
            },
            ..Default::default()
        });
        let after = p.choose(&req(2000), &c).unwrap().predicted_ttft_s[1].unwrap();
        assert!(after > 5.0 * before, "{before} → {after}");
        assert_eq!(p.config().prefill_rate_tokens_per_s, 2_000.0);
    }

    #[test]
    fn unique_prompts_spread_by_in_flight_then_randomly() {
        let p = policy();
        let mut c = idle(3);
        c[0].load.in_flight = 2;
        c[0].load.decoding = 0;
        let mut hits = [0; 3];
        for _ in 0..300 {
            hits[p.choose(&req(1000), &c).unwrap().chosen] += 1;
        }
        assert_eq!(hits[0], 0, "{hits:?}");
        assert!(hits[1] > 100 && hits[2] > 100, "{hits:?}");
    }

    #[test]
    fn deterministic_for_a_seed() {
        let run = |seed| {
            let p = KvAware::new(KvAwareConfig::default(), seed);
            (0..50)
                .map(|_| p.choose(&req(100), &idle(4)).unwrap().chosen)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn calibration_changes_the_trade_off() {
        let p = KvAware::new(KvAwareConfig::default(), 1);
        // Worker 0 turns out 10× slower than worker 1.
        for (slot, rate) in [(0, 2_000.0), (1, 20_000.0)] {
            let worker = WorkerId(slot);
            for i in 0..200u64 {
                let tokens = 500 + i * 20;
                p.observe(&Observation {
                    worker,
                    uncached_tokens: tokens,
                    queued_tokens: 0,
                    decoding: i % 4,
                    ttft_s: tokens as f64 / rate + 0.02,
                });
            }
        }
        let r = p.rates(WorkerId(0));
        assert!((r.seconds_per_token - 1.0 / 2_000.0).abs() < 2e-5, "{r:?}");
        // A half-warm but slow worker 0 loses to a cold fast worker 1.
        let mut c = idle(2);
        c[0].overlap_blocks = 250;
        assert_eq!(p.choose(&req(8000), &c).unwrap().chosen, 1);
    }

    #[test]
    fn a_forgotten_worker_is_scored_as_a_newcomer() {
        let p = KvAware::new(KvAwareConfig::default(), 1);
        for i in 0..200u64 {
            p.observe(&Observation {
                worker: WorkerId(0),
                uncached_tokens: 500 + i,
                queued_tokens: 0,
                decoding: 0,
                ttft_s: (500 + i) as f64 / 2_000.0,
            });
        }
        let slow = p.rates(WorkerId(0));
        p.forget(WorkerId(0));
        assert_ne!(p.rates(WorkerId(0)), slow);
        assert_eq!(p.rates(WorkerId(0)), p.rates(WorkerId(7)));
    }

    #[test]
    fn an_uncalibrated_worker_is_scored_like_its_calibrated_peers() {
        let p = KvAware::new(KvAwareConfig::default(), 1);
        // Workers 0 and 1 turn out 3× faster than the prior; worker 2 is new.
        for slot in [0, 1] {
            let worker = WorkerId(slot);
            for i in 0..100u64 {
                let tokens = 500 + i * 37;
                p.observe(&Observation {
                    worker,
                    uncached_tokens: tokens,
                    queued_tokens: 0,
                    decoding: 0,
                    ttft_s: tokens as f64 / 60_000.0 + 0.02,
                });
            }
        }
        let r = p.rates(WorkerId(2));
        assert!((r.seconds_per_token - 1.0 / 60_000.0).abs() < 2e-6, "{r:?}");
        // Idle and cold, the newcomer ties with its peers and wins on fewer in-flight.
        let mut c = idle(3);
        c[0].load.in_flight = 1;
        c[1].load.in_flight = 1;
        assert_eq!(p.choose(&req(4000), &c).unwrap().chosen, 2);
    }

    #[test]
    fn decode_stall_balances_equal_hits() {
        let p = policy();
        let mut c = idle(2);
        c[0].overlap_blocks = 490;
        c[1].overlap_blocks = 490;
        // Worker 0 would give this request the lower TTFT (0.030 s vs 0.033 s), but its
        // prefill would stall the 4 sequences decoding there by ~0.028 s each.
        c[0].load.decoding = 4;
        c[1].load.queued_prefill_tokens = 100;
        let d = p.choose(&req(8000), &c).unwrap();
        assert_eq!(d.chosen, 1, "{d:?}");
        let ttft = |i: usize| d.predicted_ttft_s[i].unwrap();
        assert!(ttft(0) < ttft(1));
        // Own TTFT alone prefers worker 0.
        let ttft_only = KvAware::new(
            KvAwareConfig {
                decode_weight: 0.0,
                calibrate: false,
                ..Default::default()
            },
            1,
        );
        assert_eq!(ttft_only.choose(&req(8000), &c).unwrap().chosen, 0);
    }

    #[test]
    fn temperature_samples_but_prefers_the_best() {
        let p = KvAware::new(
            KvAwareConfig {
                temperature: 0.5,
                calibrate: false,
                ..Default::default()
            },
            3,
        );
        let mut c = idle(2);
        c[0].overlap_blocks = 150;
        let mut hits = [0; 2];
        for _ in 0..400 {
            hits[p.choose(&req(8000), &c).unwrap().chosen] += 1;
        }
        assert!(hits[0] > hits[1] && hits[1] > 0, "{hits:?}");
    }
}
