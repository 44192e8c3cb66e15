//! Worker discovery: what each source saw and did.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

/// Worker discovery's counters and gauges.
#[derive(Clone)]
pub struct DiscoveryMetrics {
    /// `kvroute_discovery_events_total{source,kind}`: what worker discovery saw and did
    /// (`join`, `join_failed`, `drain`, `undrain`, `leave`, `forced_leave`, `error`, `relist`).
    pub events: IntCounterVec,
    /// `kvroute_discovery_workers{source}`: workers a discovery source has in the fleet now.
    pub workers: IntGaugeVec,
}

impl DiscoveryMetrics {
    pub(super) fn register(registry: &Registry) -> DiscoveryMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition")
        };
        let events = counter(
            "kvroute_discovery_events_total",
            "Worker discovery, by source (kubernetes, dns) and kind: join, join_failed (the \
             endpoint's /v1/models did not answer; retried), drain, undrain, leave, forced_leave \
             (drain timeout), error (the source could not be read; the last known workers are \
             kept), relist (a full list after a start, a 410 Gone or a reconnect).",
            &["source", "kind"],
        );
        let workers = IntGaugeVec::new(
            Opts::new(
                "kvroute_discovery_workers",
                "Workers a discovery source has in the fleet now, draining ones included.",
            ),
            &["source"],
        )
        .expect("static metric definition");
        for c in [
            Box::new(events.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(workers.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        DiscoveryMetrics { events, workers }
    }
}
