//! `kv_aware`: predicted time to first token, from prefix overlap and queued work.
//!
//! For each eligible worker the policy predicts
//! `ttft ≈ (queued + prompt − cached) / prefill_rate + decoding × step_cost + overhead`
//! (ARCHITECTURE.md, "The cost model") and picks the minimum. `cached` comes from the KV index
//! (leading blocks the worker holds), `queued` and `decoding` from router-side accounting. The
//! rates start from configuration and are re-fitted per worker from observed TTFTs
//! ([`super::calibration`]), so the trade-off between a warm cache and a short queue is made in
//! the worker's own seconds rather than with a hand-tuned weight.
//!
//! Ties (equal predictions, e.g. an idle cold fleet) go to the worker with fewer requests in
//! flight, then to a seeded random one, so unique prompts spread like `least_request`. With a
//! temperature above 0 the choice is sampled, softly preferring lower predictions.

use std::collections::HashMap;
use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::calibration::{Calibrator, Rates};
use super::{Candidate, Observation, Policy, RouteDecision, RouteRequest};

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
    /// 0: always the minimum. Above 0: sample with weights `exp(−Δttft / (temperature × best))`.
    pub temperature: f64,
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
    config: KvAwareConfig,
    calibrators: Mutex<HashMap<u32, Calibrator>>,
    rng: Mutex<StdRng>,
}

impl KvAware {
    /// A policy with `config`; `seed` drives tie-breaks and sampling.
    pub fn new(config: KvAwareConfig, seed: u64) -> KvAware {
        KvAware {
            config,
            calibrators: Mutex::new(HashMap::new()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    /// The rates currently used for the worker in `slot`.
    pub fn rates(&self, slot: u32) -> Rates {
        let cals = super::lock(&self.calibrators);
        cals.get(&slot)
            .map(Calibrator::rates)
            .unwrap_or_else(|| self.config.prior())
    }

    /// Predicted TTFT of `request` on `candidate` with `rates`.
    fn predict(request: &RouteRequest, c: &Candidate, rates: &Rates) -> f64 {
        let cached = u64::from(c.overlap_blocks) * u64::from(request.block_size);
        let uncached = request.prompt_tokens.saturating_sub(cached);
        let tokens = (c.load.queued_prefill_tokens + uncached) as f64;
        rates.predict(tokens, c.load.decoding as f64)
    }
}

impl Policy for KvAware {
    fn name(&self) -> &'static str {
        "kv_aware"
    }

    fn uses_prefix(&self) -> bool {
        true
    }

    fn choose(&self, request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision> {
        if candidates.is_empty() {
            return None;
        }
        let predicted: Vec<f64> = {
            let cals = super::lock(&self.calibrators);
            let prior = self.config.prior();
            candidates
                .iter()
                .map(|c| {
                    let rates = cals.get(&c.slot).map(Calibrator::rates).unwrap_or(prior);
                    Self::predict(request, c, &rates)
                })
                .collect()
        };
        let best = predicted.iter().copied().fold(f64::INFINITY, f64::min);
        let chosen = if self.config.temperature > 0.0 {
            let scale = self.config.temperature * best.max(1e-3);
            let weights: Vec<f64> = predicted
                .iter()
                .map(|p| (-(p - best) / scale).exp())
                .collect();
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
                .filter(|&i| predicted[i] - best <= 1e-6)
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
        })
    }

    fn observe(&self, o: &Observation) {
        if !self.config.calibrate {
            return;
        }
        let mut cals = super::lock(&self.calibrators);
        let prior = self.config.prior();
        let forgetting = self.config.forgetting;
        cals.entry(o.slot)
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
        // Worker 0 turns out to prefill 10× slower than the prior says.
        for i in 0..200u64 {
            let tokens = 500 + i * 20;
            p.observe(&Observation {
                slot: 0,
                uncached_tokens: tokens,
                queued_tokens: 0,
                decoding: i % 4,
                ttft_s: tokens as f64 / 2_000.0 + 0.02,
            });
        }
        let r = p.rates(0);
        assert!((r.seconds_per_token - 1.0 / 2_000.0).abs() < 2e-5, "{r:?}");
        assert_eq!(p.rates(1), KvAwareConfig::default().prior());
        // Now a half-warm but slow worker 0 loses to a cold fast worker 1.
        let mut c = idle(2);
        c[0].overlap_blocks = 250;
        assert_eq!(p.choose(&req(8000), &c).unwrap().chosen, 1);
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
