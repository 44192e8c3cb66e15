//! The request-level families: requests answered and their durations, time to first token,
//! decision time, retries, admission refusals, upstream errors and the prefix block counters.
//!
//! They stay fields of [`super::Metrics`] itself (call sites read `metrics.requests`); this
//! module only builds and registers them, so `Metrics::new` reads as a list of subsystems.

use prometheus::core::Collector;
use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry};

/// Buckets for latencies from sub-millisecond to minutes.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

/// Buckets for routing decision time: microseconds to tens of milliseconds.
const DECISION_BUCKETS: &[f64] = &[
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05,
];

/// The request-level families, registered, before `Metrics::new` moves each into its public
/// field of the same name (see [`super::Metrics`] for what each counts).
pub(super) struct RequestMetrics {
    pub(super) requests: IntCounterVec,
    pub(super) request_duration: HistogramVec,
    pub(super) ttft: HistogramVec,
    pub(super) decision: HistogramVec,
    pub(super) retries: IntCounterVec,
    pub(super) upstream_errors: IntCounterVec,
    pub(super) prefix_hit_blocks: IntCounterVec,
    pub(super) prefix_queried_blocks: IntCounterVec,
    pub(super) retries_denied: IntCounter,
    pub(super) rejected: IntCounterVec,
}

impl RequestMetrics {
    /// Creates the request-level families and registers them in `registry`, in field order.
    pub(super) fn register(registry: &Registry) -> RequestMetrics {
        let f = Families(registry);
        RequestMetrics {
            requests: f.counter(
                "kvroute_requests_total",
                "Requests answered, by final status: the HTTP status; upstream_error (the worker's \
                 stream broke off), stream_error (the worker ended a stream with an in-band error \
                 event), cancelled (the client went away), shutdown (cut when the shutdown grace \
                 ended).",
                &["endpoint", "model", "worker", "status"],
            ),
            request_duration: f.histogram(
                "kvroute_request_duration_seconds",
                "Time from arrival to the last byte of the response.",
                LATENCY_BUCKETS,
                &["endpoint", "model"],
            ),
            ttft: f.histogram(
                "kvroute_time_to_first_token_seconds",
                "Time from arrival to the first generated token reaching the router.",
                LATENCY_BUCKETS,
                &["model", "worker"],
            ),
            decision: f.histogram(
                "kvroute_routing_decision_seconds",
                "Time spent choosing a worker, by stage (tokenize, score, total).",
                DECISION_BUCKETS,
                &["policy", "stage"],
            ),
            retries: f.counter(
                "kvroute_retries_total",
                "Requests sent again to another worker before any byte reached the client.",
                &["reason"],
            ),
            upstream_errors: f.counter(
                "kvroute_upstream_errors_total",
                "Failures talking to a worker, by kind.",
                &["worker", "kind"],
            ),
            prefix_hit_blocks: f.counter(
                "kvroute_prefix_hit_blocks_total",
                "Prompt blocks the chosen worker already held (block-weighted hits), under every \
                 policy (load-only ones look the prompt up off the request's path).",
                &["worker"],
            ),
            prefix_queried_blocks: f.counter(
                "kvroute_prefix_queried_blocks_total",
                "Prompt blocks of requests routed to the worker (block-weighted queries).",
                &["worker"],
            ),
            retries_denied: f.registered(
                IntCounter::new(
                    "kvroute_retries_denied_total",
                    "Retries refused because the retry budget was spent.",
                )
                .expect("static metric definition"),
            ),
            rejected: f.counter(
                "kvroute_rejected_total",
                "Requests refused at admission with 429, by reason.",
                &["reason"],
            ),
        }
    }
}

/// Builds families from constant parts and registers each as it is built, so a field is
/// defined and registered in one expression. Failing to build or register one is a defect
/// every test run shows, not an input error.
struct Families<'a>(&'a Registry);

impl Families<'_> {
    /// A registered counter family.
    fn counter(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.registered(
            IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition"),
        )
    }

    /// A registered histogram family with `buckets`.
    fn histogram(&self, name: &str, help: &str, buckets: &[f64], labels: &[&str]) -> HistogramVec {
        self.registered(
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("static metric definition"),
        )
    }

    /// Registers a clone of `family` and hands `family` back.
    fn registered<C: Collector + Clone + 'static>(&self, family: C) -> C {
        self.0
            .register(Box::new(family.clone()))
            .expect("metric names are unique");
        family
    }
}
