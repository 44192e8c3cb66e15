//! Online calibration of the cost model's rates from observed times to first token.
//!
//! The model says `ttft ≈ tokens / prefill_rate + decoding × step_cost + overhead`, where
//! `tokens` is the uncached prefill queued ahead of and including the request. That is linear
//! in three unknowns, so recursive least squares with exponential forgetting fits it exactly as
//! observations arrive, at a constant cost per observation, and follows drift (a worker that
//! slows down under memory pressure, a new GPU type) within a few hundred requests. Estimates
//! are clamped to physical ranges so one wild sample cannot invert the model.

/// Current estimate of one worker's rates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    /// Seconds per uncached prompt token (1 / prefill rate).
    pub seconds_per_token: f64,
    /// Seconds added to time to first token per sequence decoding on the worker.
    pub step_cost_s: f64,
    /// Fixed per-request overhead, seconds.
    pub overhead_s: f64,
}

impl Rates {
    /// Predicted time to first token.
    pub fn predict(&self, tokens: f64, decoding: f64) -> f64 {
        tokens * self.seconds_per_token + decoding * self.step_cost_s + self.overhead_s
    }
}

/// Recursive least squares over `[tokens, decoding, 1]`.
#[derive(Clone, Debug)]
pub struct Calibrator {
    theta: [f64; 3],
    p: [[f64; 3]; 3],
    forgetting: f64,
    observations: u64,
    prior: Rates,
}

/// Observations before the fitted rates replace the configured prior.
pub const MIN_OBSERVATIONS: u64 = 16;

impl Calibrator {
    /// Starts from `prior`; `forgetting` in (0, 1] weighs recent observations (0.995 ≈ the
    /// last few hundred).
    pub fn new(prior: Rates, forgetting: f64) -> Calibrator {
        // Initial covariance scaled to each parameter's magnitude: a weak prior that a few
        // observations override.
        let scale = [
            (prior.seconds_per_token.max(1e-6) * 10.0).powi(2),
            (prior.step_cost_s.max(1e-3) * 10.0).powi(2),
            1.0,
        ];
        let mut p = [[0.0; 3]; 3];
        for (i, s) in scale.iter().enumerate() {
            p[i][i] = *s;
        }
        Calibrator {
            theta: [prior.seconds_per_token, prior.step_cost_s, prior.overhead_s],
            p,
            forgetting: forgetting.clamp(0.9, 1.0),
            observations: 0,
            prior,
        }
    }

    /// Adds one observation.
    pub fn observe(&mut self, tokens: f64, decoding: f64, ttft_s: f64) {
        if !(tokens.is_finite() && decoding.is_finite() && ttft_s.is_finite()) || ttft_s < 0.0 {
            return;
        }
        let x = [tokens, decoding, 1.0];
        // k = P x / (λ + xᵀ P x)
        let px: [f64; 3] = std::array::from_fn(|i| (0..3).map(|j| self.p[i][j] * x[j]).sum());
        let denom = self.forgetting + (0..3).map(|i| x[i] * px[i]).sum::<f64>();
        if !(denom.is_finite() && denom > 0.0) {
            return;
        }
        let k: [f64; 3] = std::array::from_fn(|i| px[i] / denom);
        let err = ttft_s - (0..3).map(|i| x[i] * self.theta[i]).sum::<f64>();
        for (t, ki) in self.theta.iter_mut().zip(k) {
            *t += ki * err;
        }
        // P = (P − k xᵀ P) / λ
        let xp: [f64; 3] = std::array::from_fn(|j| (0..3).map(|i| x[i] * self.p[i][j]).sum());
        for (row, ki) in self.p.iter_mut().zip(k) {
            for (pij, xpj) in row.iter_mut().zip(xp) {
                *pij = (*pij - ki * xpj) / self.forgetting;
            }
        }
        if self
            .theta
            .iter()
            .chain(self.p.iter().flatten())
            .any(|v| !v.is_finite())
        {
            *self = Calibrator::new(self.prior, self.forgetting);
            return;
        }
        self.observations += 1;
    }

    /// The forgetting factor in use (after clamping).
    pub fn forgetting(&self) -> f64 {
        self.forgetting
    }

    /// Observations seen.
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// The rates to use now: the prior until enough observations, then the clamped fit.
    pub fn rates(&self) -> Rates {
        if self.observations < MIN_OBSERVATIONS {
            return self.prior;
        }
        Rates {
            // Between 1 M tokens/s and 10 tokens/s.
            seconds_per_token: self.theta[0].clamp(1e-6, 0.1),
            step_cost_s: self.theta[1].clamp(0.0, 1.0),
            overhead_s: self.theta[2].clamp(0.0, 10.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prior() -> Rates {
        Rates {
            seconds_per_token: 1e-4,
            step_cost_s: 1e-3,
            overhead_s: 0.0,
        }
    }

    #[test]
    fn recovers_true_rates_from_noiseless_observations() {
        let truth = Rates {
            seconds_per_token: 2.5e-5,
            step_cost_s: 4e-3,
            overhead_s: 0.02,
        };
        let mut c = Calibrator::new(prior(), 0.995);
        assert_eq!(c.rates(), prior());
        for i in 0..400u64 {
            let tokens = ((i * 7919) % 9000) as f64 + 100.0;
            let decoding = ((i * 31) % 64) as f64;
            c.observe(tokens, decoding, truth.predict(tokens, decoding));
        }
        let r = c.rates();
        assert!(
            (r.seconds_per_token - truth.seconds_per_token).abs() < 1e-6,
            "{r:?}"
        );
        assert!((r.step_cost_s - truth.step_cost_s).abs() < 2e-4, "{r:?}");
        assert!((r.overhead_s - truth.overhead_s).abs() < 5e-3, "{r:?}");
    }

    #[test]
    fn garbage_cannot_produce_unphysical_rates() {
        let mut c = Calibrator::new(prior(), 0.99);
        for i in 0..100 {
            c.observe(f64::from(i), 0.0, if i % 2 == 0 { 0.0 } else { 1e6 });
            c.observe(f64::NAN, 1.0, 1.0);
        }
        let r = c.rates();
        assert!(r.seconds_per_token >= 1e-6 && r.seconds_per_token <= 0.1);
        assert!(r.step_cost_s >= 0.0 && r.overhead_s >= 0.0);
    }
}
