//! The metrics of disaggregated requests: which workers each side picked, what was handed from
//! prefill to decode, and what was retried in which phase.

use prometheus::core::Collector;
use prometheus::{IntCounterVec, Opts, Registry};

/// Prefill/decode hand-offs, by side and phase.
#[derive(Clone)]
pub struct DisaggregationMetrics {
    /// `kvroute_disaggregated_picks_total{side, worker}`: workers chosen for the `prefill` or
    /// `decode` side of a disaggregated request (every attempt, retries included).
    pub picks: IntCounterVec,
    /// `kvroute_disaggregated_handoffs_total{protocol, outcome}`: hand-offs from a prefill to a
    /// decode worker: `relayed` (vLLM: the prefill's `kv_transfer_params` sent on to the
    /// decode), `no_params` (vLLM: the prefill returned none; the decode got the original
    /// request), `paired` (SGLang: both sent with one bootstrap room), `failed` (the request
    /// got no decode answer).
    pub handoffs: IntCounterVec,
    /// `kvroute_disaggregated_retries_total{phase, reason}`: a side sent again: `prefill` on
    /// another prefill worker, `decode` on another decode worker (the same transfer params),
    /// `pair` (a decode failure before the first token: prefill and decode again).
    pub retries: IntCounterVec,
}

impl DisaggregationMetrics {
    pub(super) fn register(registry: &Registry) -> DisaggregationMetrics {
        let m = DisaggregationMetrics {
            picks: IntCounterVec::new(
                Opts::new(
                    "kvroute_disaggregated_picks_total",
                    "Workers chosen for the prefill or decode side of disaggregated requests.",
                ),
                &["side", "worker"],
            )
            .expect("static metric definition"),
            handoffs: IntCounterVec::new(
                Opts::new(
                    "kvroute_disaggregated_handoffs_total",
                    "Hand-offs from a prefill to a decode worker, by protocol and outcome.",
                ),
                &["protocol", "outcome"],
            )
            .expect("static metric definition"),
            retries: IntCounterVec::new(
                Opts::new(
                    "kvroute_disaggregated_retries_total",
                    "Sides of disaggregated requests sent again, by phase and reason.",
                ),
                &["phase", "reason"],
            )
            .expect("static metric definition"),
        };
        for c in [
            Box::new(m.picks.clone()) as Box<dyn Collector>,
            Box::new(m.handoffs.clone()),
            Box::new(m.retries.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        m
    }

    /// Drops a departed worker's series.
    pub(super) fn forget_worker(&self, worker: &str) {
        for side in ["prefill", "decode"] {
            let _ = self.picks.remove_label_values(&[side, worker]);
        }
    }
}
