//! The admission queue's signals: how long requests waited for a slot, how many wait now per
//! band and tenant, and how full the router is (the `kvroute_saturation` gauge an autoscaler
//! reads, see `deploy/kubernetes/keda-scaledobject.yaml`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use prometheus::{Gauge, GaugeVec, HistogramOpts, HistogramVec, IntGaugeVec, Opts, Registry};

use crate::shaping::saturation::{self, Part, TtftPart};

/// The admission queue's metrics.
#[derive(Clone)]
pub struct ShapingMetrics {
    /// `kvroute_queue_seconds{band}`: time from arrival to a slot of every admitted request (0
    /// for one admitted at once).
    pub queue_time: HistogramVec,
    /// `kvroute_queue_depth{band,tenant}`: requests waiting for a slot now (tenant `-`: no
    /// authentication).
    pub queue_depth: IntGaugeVec,
    /// `kvroute_saturation`: 0–1, how close the fleet is to its limits: the largest of
    /// `saturation_part` (`shaping::saturation`). Set through [`ShapingMetrics::saturate`].
    saturation: Gauge,
    /// `kvroute_saturation_part{part}`: each limit's own 0–1 (`slots`, `queue`, `kv`,
    /// `ttft`), so an operator sees which one binds; in [`Part::ALL`]'s order (resolved once:
    /// the gate sets two parts on every admission).
    saturation_part: [Gauge; 4],
    /// The TTFT part before fading, and the clock it fades on.
    ttft: Arc<Mutex<TtftPart>>,
    started: Instant,
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
            "How close the fleet is to its limits, 0-1: the largest of kvroute_saturation_part (router slots, queue, engines' KV usage, predicted TTFT over target).",
        )
        .expect("static metric definition");
        let saturation_part = GaugeVec::new(
            Opts::new(
                "kvroute_saturation_part",
                "Each limit's saturation, 0-1: slots (in use over limits.max_concurrency), queue (waiting over limits.max_queue), kv (engines' mean KV-cache usage), ttft (predicted TTFT over target, smoothed over recent requests with a target, fading while none come).",
            ),
            &["part"],
        )
        .expect("static metric definition");
        let parts = Part::ALL.map(|p| saturation_part.with_label_values(&[p.label()]));
        for c in [
            Box::new(queue_time.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(queue_depth.clone()),
            Box::new(saturation.clone()),
            Box::new(saturation_part.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        ShapingMetrics {
            queue_time,
            queue_depth,
            saturation,
            saturation_part: parts,
            ttft: Arc::default(),
            started: Instant::now(),
        }
    }

    /// Sets `part` of the saturation and the whole (the largest part).
    pub fn saturate(&self, part: Part, value: f64) {
        self.part(part).set(saturation::clamp(value));
        self.saturation.set(saturation::combine(
            self.saturation_part.iter().map(Gauge::get),
        ));
    }

    /// One more request with a TTFT target: `predicted_s` against `target_s`.
    pub fn observe_ttft(&self, predicted_s: f64, target_s: f64) {
        let now_s = self.started.elapsed().as_secs_f64();
        let value = {
            let mut ttft = self.ttft.lock().unwrap_or_else(PoisonError::into_inner);
            ttft.observe(now_s, predicted_s, target_s);
            ttft.at(now_s)
        };
        self.saturate(Part::Ttft, value);
    }

    /// The TTFT part faded to now (at a scrape: it moves without requests).
    pub fn fade_ttft(&self) {
        let now_s = self.started.elapsed().as_secs_f64();
        let value = self
            .ttft
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .at(now_s);
        self.saturate(Part::Ttft, value);
    }

    fn part(&self, part: Part) -> &Gauge {
        &self.saturation_part[part.index()]
    }
}
