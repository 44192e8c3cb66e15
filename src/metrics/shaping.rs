//! The admission queue's signals: how long requests waited for a slot, how many wait now per
//! band and tenant, and how full the router is (the `kvroute_saturation` gauge an autoscaler
//! reads, see `deploy/kubernetes/keda-scaledobject.yaml`).

use prometheus::{Gauge, HistogramOpts, HistogramVec, IntGaugeVec, Opts, Registry};

/// The admission queue's metrics.
#[derive(Clone)]
pub struct ShapingMetrics {
    /// `kvroute_queue_seconds{band}`: time from arrival to a slot of every admitted request (0
    /// for one admitted at once).
    pub queue_time: HistogramVec,
    /// `kvroute_queue_depth{band,tenant}`: requests waiting for a slot now (tenant `-`: no
    /// authentication).
    pub queue_depth: IntGaugeVec,
    /// `kvroute_saturation`: 0–1, how close the router is to refusing: the larger of its
    /// slots in use over `max_concurrency` and its queue over `max_queue`.
    pub saturation: Gauge,
}

/// Buckets from 1 ms to 60 s: a queue wait is short when the fleet keeps up and bounded by
/// `limits.queue_timeout_s` when it does not.
const BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

impl ShapingMetrics {
    pub(super) fn register(registry: &Registry) -> ShapingMetrics {
        let queue_time = HistogramVec::new(
            HistogramOpts::new(
                "kvroute_queue_seconds",
                "Time admitted requests waited for a router slot, by priority band.",
            )
            .buckets(BUCKETS.to_vec()),
            &["band"],
        )
        .expect("static metric definition");
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "kvroute_queue_depth",
                "Requests waiting for a router slot now, by priority band and tenant.",
            ),
            &["band", "tenant"],
        )
        .expect("static metric definition");
        let saturation = Gauge::new(
            "kvroute_saturation",
            "How close the router is to refusing requests, 0-1: the larger of slots in use over limits.max_concurrency and waiting requests over limits.max_queue.",
        )
        .expect("static metric definition");
        for c in [
            Box::new(queue_time.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(queue_depth.clone()),
            Box::new(saturation.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        ShapingMetrics {
            queue_time,
            queue_depth,
            saturation,
        }
    }
}
