//! How often the fleet was saturated for a decision (`policy::saturation`: every candidate
//! had at least twice the prompt queued for prefill), so an operator sees when the cost model
//! prices fleet work rather than each request's own latency — and that a fleet saturated for
//! much of its decisions needs more prefill capacity.

use prometheus::{IntCounter, Registry};

/// The saturated decisions' counter.
#[derive(Clone)]
pub struct PrefillSaturationMetrics {
    /// `kvroute_prefill_saturated_decisions_total`: decisions made while every candidate had
    /// at least twice the request's prompt queued for prefill.
    pub saturated: IntCounter,
}

impl PrefillSaturationMetrics {
    pub(super) fn register(registry: &Registry) -> PrefillSaturationMetrics {
        let saturated = IntCounter::new(
            "kvroute_prefill_saturated_decisions_total",
            "Routing decisions made while every candidate worker had at least twice the request's prompt queued for prefill (kv_aware then counts the work a placement adds, and the prefix a request in flight computes, so requests sharing a prefix co-locate).",
        )
        .expect("static metric definition");
        registry
            .register(Box::new(saturated.clone()))
            .expect("metric names are unique");
        PrefillSaturationMetrics { saturated }
    }
}
