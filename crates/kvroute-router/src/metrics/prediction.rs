//! How far the cost model's predicted time to first token fell from the one observed, per
//! worker: the measured error of the decisions, which `kv_aware` calibrates against and an
//! operator checks before trusting `/debug/route`'s numbers.

use prometheus::{HistogramOpts, HistogramVec, Registry};

/// The TTFT prediction error.
#[derive(Clone)]
pub struct PredictionMetrics {
    /// `kvroute_ttft_prediction_error_seconds{model, worker, direction}`: |observed −
    /// predicted| TTFT of requests whose policy predicted one; `direction` is `slower` when the
    /// request took longer than predicted, `faster` otherwise. The two `_sum`s give the bias.
    pub ttft_error: HistogramVec,
}

/// Buckets from 5 ms to 20 s: a prediction is useful to within a step, and wrong by seconds
/// when a queue was missed.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0,
];

impl PredictionMetrics {
    pub(super) fn register(registry: &Registry) -> PredictionMetrics {
        let ttft_error = HistogramVec::new(
            HistogramOpts::new(
                "kvroute_ttft_prediction_error_seconds",
                "|observed - predicted| time to first token on the chosen worker, by whether the request was slower or faster than predicted.",
            )
            .buckets(BUCKETS.to_vec()),
            &["model", "worker", "direction"],
        )
        .expect("static metric definition");
        registry
            .register(Box::new(ttft_error.clone()))
            .expect("metric names are unique");
        PredictionMetrics { ttft_error }
    }

    /// Records one request: `predicted_s` and `observed_s` from the routing decision on.
    pub fn observe(&self, model: &str, worker: &str, predicted_s: f64, observed_s: f64) {
        if !(predicted_s.is_finite() && observed_s.is_finite()) {
            return;
        }
        let direction = if observed_s > predicted_s {
            "slower"
        } else {
            "faster"
        };
        self.ttft_error
            .with_label_values(&[model, worker, direction])
            .observe((observed_s - predicted_s).abs());
    }

    /// Drops a departed worker's series.
    pub(super) fn forget_worker(&self, worker: &str) {
        super::forget(&self.ttft_error, worker);
    }
}
