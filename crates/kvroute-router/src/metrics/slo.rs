//! Latency targets (SLO hints): how requests with a target fared, predicted at the decision
//! and observed at the first token and the end.

use prometheus::{IntCounterVec, Opts, Registry};

/// The SLO hints' counters.
#[derive(Clone)]
pub struct SloMetrics {
    /// `kvroute_slo_requests_total{target,outcome}`: requests with a `ttft` or `itl` target, by
    /// `outcome`: `predicted_met` / `predicted_missed` (the chosen worker's predicted TTFT
    /// against the target, when the policy predicts one), `refused` (sheddable, no worker
    /// predicted to meet it: refused at once with 503), `met` / `missed` (as observed).
    pub requests: IntCounterVec,
}

impl SloMetrics {
    pub(super) fn register(registry: &Registry) -> SloMetrics {
        let requests = IntCounterVec::new(
            Opts::new(
                "kvroute_slo_requests_total",
                "Requests with a latency target (ttft or itl), by outcome: predicted_met, predicted_missed, refused, met, missed.",
            ),
            &["target", "outcome"],
        )
        .expect("static metric definition");
        registry
            .register(Box::new(requests.clone()))
            .expect("metric names are unique");
        SloMetrics { requests }
    }

    /// Counts one request's `outcome` for `target`.
    pub fn count(&self, target: &str, outcome: &str) {
        self.requests.with_label_values(&[target, outcome]).inc();
    }
}
