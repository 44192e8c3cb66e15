//! The Responses API: which worker stores which response.

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

/// Responses API requests naming a stored response, and the responses remembered.
#[derive(Clone)]
pub struct ResponseAffinityMetrics {
    /// `kvroute_response_affinity_total{outcome}`: Responses API requests that name a stored
    /// response (`routed`, `unknown`, `holder_gone`, `holder_unavailable`), and ids `learned`.
    pub requests: IntCounterVec,
    /// `kvroute_response_affinity_entries`: stored responses whose worker is remembered.
    pub entries: IntGauge,
}

impl ResponseAffinityMetrics {
    pub(super) fn register(registry: &Registry) -> ResponseAffinityMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition")
        };
        let requests = counter(
            "kvroute_response_affinity_total",
            "Responses API: ids of stored responses learned, and requests naming one, by \
             outcome: routed (to the worker that stores it), unknown (never learned, or \
             forgotten), holder_gone (its worker left the fleet), holder_unavailable (its worker \
             is down, draining or open-circuited).",
            &["outcome"],
        );
        let entries = IntGauge::new(
            "kvroute_response_affinity_entries",
            "Stored Responses API responses whose worker the router remembers.",
        )
        .expect("static metric definition");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(entries.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        ResponseAffinityMetrics { requests, entries }
    }
}
