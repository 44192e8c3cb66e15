//! The router's Prometheus metrics.
//!
//! One [`Metrics`] per router, with its own registry (not the global default one), so several
//! routers in one process — tests, `kvroute demo` — never mix their numbers.
#![allow(
    clippy::expect_used,
    reason = "metric families are defined from constant names, labels and buckets: one that cannot be built or registered is a defect every test run shows, not an input error"
)]

use std::collections::HashMap;

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};

mod cache_prediction;
mod config;
mod connections;
mod context;
mod decisions;
mod disaggregation;
mod discovery;
mod isolation;
mod prediction;
mod prefill_pieces;
mod recording;
mod replica_bus;
mod requests;
mod response_affinity;
mod saturated_decisions;
mod shaping;
mod slo;
mod tokens;

pub use cache_prediction::CachePredictionMetrics;
pub use config::ConfigMetrics;
pub use connections::ConnectionMetrics;
pub use context::ContextMetrics;
pub use disaggregation::DisaggregationMetrics;
pub use discovery::DiscoveryMetrics;
pub use isolation::IsolationMetrics;
pub use prediction::PredictionMetrics;
pub use prefill_pieces::PrefillPieceMetrics;
pub use recording::RecordingMetrics;
pub use replica_bus::ReplicaBusMetrics;
use requests::RequestMetrics;
pub use response_affinity::ResponseAffinityMetrics;
pub use saturated_decisions::SaturatedDecisionMetrics;
pub use shaping::ShapingMetrics;
pub use slo::SloMetrics;
pub use tokens::TokenMetrics;

/// Every metric the router exports.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// `kvroute_requests_total{endpoint,model,worker,status}`: requests answered, by final
    /// status (`endpoint`: the kind of endpoint, see `server::api`; worker `-`: none, the router
    /// answered).
    pub requests: IntCounterVec,
    /// `kvroute_request_duration_seconds{endpoint,model}`: arrival to last byte.
    pub request_duration: HistogramVec,
    /// `kvroute_time_to_first_token_seconds{model,worker}`.
    pub ttft: HistogramVec,
    /// `kvroute_routing_decision_seconds{policy,stage}`: time to decide (tokenize, score, total).
    pub decision: HistogramVec,
    /// `kvroute_retries_total{reason}`: requests sent again to another worker.
    pub retries: IntCounterVec,
    /// `kvroute_retries_denied_total`: retries refused because the retry budget was spent.
    pub retries_denied: IntCounter,
    /// `kvroute_rejected_total{reason}`: requests refused at admission (429).
    pub rejected: IntCounterVec,
    /// `kvroute_upstream_errors_total{worker,kind}`: failures talking to a worker.
    pub upstream_errors: IntCounterVec,
    /// `kvroute_prefix_hit_blocks_total{worker}`: prompt blocks the chosen worker held.
    pub prefix_hit_blocks: IntCounterVec,
    /// `kvroute_prefix_queried_blocks_total{worker}`: prompt blocks routed to the worker.
    pub prefix_queried_blocks: IntCounterVec,
    /// Client connections and the front door's TLS.
    pub connections: ConnectionMetrics,
    /// Worker discovery.
    pub discovery: DiscoveryMetrics,
    /// The recorded trace.
    pub recording: RecordingMetrics,
    /// The Responses API's stored responses.
    pub response_affinity: ResponseAffinityMetrics,
    /// The loaded configuration and its reloads.
    pub config: ConfigMetrics,
    /// Disaggregated requests' picks, hand-offs and retries by phase.
    pub disaggregation: DisaggregationMetrics,
    /// The cost model's TTFT prediction error per worker.
    pub prediction: PredictionMetrics,
    /// The admission queue: waits, depth, saturation.
    pub shaping: ShapingMetrics,
    /// How requests with latency targets fared.
    pub slo: SloMetrics,
    /// Decisions placement isolation narrowed.
    pub isolation: IsolationMetrics,
    /// Requests kept off workers whose context could not hold them.
    pub context: ContextMetrics,
    /// Decisions made on a fleet saturated for the request.
    pub saturated_decisions: SaturatedDecisionMetrics,
    /// Long prompts sent in prefix pieces.
    pub prefill_pieces: PrefillPieceMetrics,
    /// Prompt, completion and cached tokens; inter-token latency and time per output token.
    pub tokens: TokenMetrics,
    /// The predicted cached tokens against the engines' reports.
    pub cache_prediction: CachePredictionMetrics,
    /// The replica bus: connected, messages, losses, peers, others' bookings.
    pub replica_bus: ReplicaBusMetrics,
}

impl Metrics {
    /// Removes every series labelled with worker `id`: the worker left the fleet, and under
    /// churn (Kubernetes pods replaced by the thousand) series of departed workers would grow
    /// the exposition without bound and leave stale gauges behind.
    pub fn forget_worker(&self, id: &str) {
        forget(&self.requests, id);
        forget(&self.ttft, id);
        forget(&self.upstream_errors, id);
        forget(&self.prefix_hit_blocks, id);
        forget(&self.prefix_queried_blocks, id);
        self.disaggregation.forget_worker(id);
        self.prediction.forget_worker(id);
        self.tokens.forget_worker(id);
        self.cache_prediction.forget_worker(id);
    }

    /// Creates and registers every metric.
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let RequestMetrics {
            requests,
            request_duration,
            ttft,
            decision,
            retries,
            upstream_errors,
            prefix_hit_blocks,
            prefix_queried_blocks,
            retries_denied,
            rejected,
        } = RequestMetrics::register(&registry);
        register_process_and_build(&registry);
        let connections = ConnectionMetrics::register(&registry);
        let discovery = DiscoveryMetrics::register(&registry);
        let recording = RecordingMetrics::register(&registry);
        let response_affinity = ResponseAffinityMetrics::register(&registry);
        let config = ConfigMetrics::register(&registry);
        let disaggregation = DisaggregationMetrics::register(&registry);
        let prediction = PredictionMetrics::register(&registry);
        let shaping = ShapingMetrics::register(&registry);
        let slo = SloMetrics::register(&registry);
        let isolation = IsolationMetrics::register(&registry);
        let context = ContextMetrics::register(&registry);
        let saturated_decisions = SaturatedDecisionMetrics::register(&registry);
        let prefill_pieces = PrefillPieceMetrics::register(&registry);
        let tokens = TokenMetrics::register(&registry);
        let cache_prediction = CachePredictionMetrics::register(&registry);
        let replica_bus = ReplicaBusMetrics::register(&registry);
        Metrics {
            registry,
            requests,
            request_duration,
            ttft,
            decision,
            retries,
            upstream_errors,
            prefix_hit_blocks,
            prefix_queried_blocks,
            retries_denied,
            rejected,
            connections,
            discovery,
            recording,
            response_affinity,
            config,
            disaggregation,
            prediction,
            shaping,
            slo,
            isolation,
            context,
            saturated_decisions,
            prefill_pieces,
            tokens,
            cache_prediction,
            replica_bus,
        }
    }

    /// Adds a collector of live state (read at scrape time) to this router's registry.
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        if let Err(e) = self.registry.register(collector) {
            tracing::error!(error = %e, "cannot register a metrics collector");
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The version this binary was built from: the crate version, and the commit (`build.rs`:
/// the `KVROUTE_COMMIT` the build was given, as the Dockerfile's build argument does, else the
/// checkout's `git rev-parse`, else `unknown`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit this binary was built from (see [`VERSION`]).
pub const COMMIT: &str = env!("KVROUTE_COMMIT");
/// What `kvroute --version` prints after the name: `0.1.0 (commit 0123456789ab)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("KVROUTE_COMMIT"),
    ")"
);

/// Registers the standard `process_*` metrics (CPU seconds, resident memory, open and maximum
/// file descriptors, threads, start time: what an operator alerts on first, e.g. descriptors
/// running out under idle connections) and `kvroute_build_info{version,commit}`, always 1, so
/// dashboards can tell which build each replica runs.
fn register_process_and_build(registry: &Registry) {
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("process metrics register once per registry");
    let build = IntGaugeVec::new(
        Opts::new(
            "kvroute_build_info",
            "Always 1; the labels say which build of kvroute this is.",
        ),
        &["version", "commit"],
    )
    .expect("static metric definition");
    build.with_label_values(&[VERSION, COMMIT]).set(1);
    registry
        .register(Box::new(build))
        .expect("metric names are unique");
}

/// Removes the series of `vec` whose `worker` label is `id`, whatever its other labels.
fn forget<T: MetricVecBuilder>(vec: &MetricVec<T>, id: &str) {
    for family in vec.collect() {
        for m in family.get_metric() {
            let labels: HashMap<&str, &str> = m
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("worker") == Some(&id) {
                // Absent already (a concurrent scrape removed it) is fine.
                let _ = vec.remove(&labels);
            }
        }
    }
}

/// Raises a counter to `value`, a cumulative count kept elsewhere (index or subscriber
/// atomics), so it can be exported as a true Prometheus counter at scrape time.
pub fn sync_counter(counter: &prometheus::IntCounter, value: u64) {
    let current = counter.get();
    if value > current {
        counter.inc_by(value - current);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_registered_metrics() {
        let m = Metrics::new();
        m.requests
            .with_label_values(&["chat_completions", "m", "w", "200"])
            .inc();
        m.ttft.with_label_values(&["m", "w"]).observe(0.2);
        let text = m.render();
        assert!(text.contains(
            "kvroute_requests_total{endpoint=\"chat_completions\",model=\"m\",status=\"200\",worker=\"w\"} 1"
        ));
        m.forget_worker("w");
        assert!(!m.render().contains("kvroute_requests_total{"));
        assert!(text.contains("kvroute_time_to_first_token_seconds_bucket"));
        // Two routers in one process keep separate numbers.
        assert!(!Metrics::new().render().contains("kvroute_requests_total{"));
    }

    #[test]
    fn process_and_build_metrics_are_exported() {
        let text = Metrics::new().render();
        let build = format!("kvroute_build_info{{commit=\"{COMMIT}\",version=\"{VERSION}\"}} 1");
        assert!(text.contains(&build), "{text}");
        #[cfg(target_os = "linux")]
        for name in [
            "process_open_fds ",
            "process_max_fds ",
            "process_resident_memory_bytes ",
            "process_cpu_seconds_total ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
    }
}
