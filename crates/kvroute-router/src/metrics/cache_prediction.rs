//! How far the router's predicted cached tokens fell from what the engine reported
//! (`usage.prompt_tokens_details.cached_tokens`: vLLM with `--enable-prompt-tokens-details`,
//! SGLang with `--enable-cache-report`), per worker: when they differ, routing is running
//! blind on that worker — a wrong tokenizer or chat template, a wrong block size, lost KV
//! events — and its cache hit rate suffers for it. The dashboard's "Cached-token prediction"
//! panel and the `KvrouteCachedTokenMispredictions` alert read these.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// The cached-token prediction's error.
#[derive(Clone)]
pub struct CachePredictionMetrics {
    /// `kvroute_cached_tokens_prediction_error_tokens{worker,direction}`: |reported −
    /// predicted| cached tokens; `direction` `more` when the engine found more than predicted,
    /// `fewer` otherwise.
    pub error: HistogramVec,
    /// `kvroute_cached_tokens_mismatch_total{worker}`: requests whose reported cached tokens
    /// differ from the prediction.
    pub mismatch: IntCounterVec,
    /// `kvroute_cached_tokens_compared_total{worker}`: requests whose prediction could be
    /// compared (the engine reported cached tokens).
    pub compared: IntCounterVec,
}

/// Buckets in tokens: one block of 16 to whole long prompts.
const BUCKETS: [f64; 10] = [
    1.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0, 16384.0,
];

impl CachePredictionMetrics {
    pub(super) fn register(registry: &Registry) -> CachePredictionMetrics {
        let m = CachePredictionMetrics {
            error: HistogramVec::new(
                HistogramOpts::new(
                    "kvroute_cached_tokens_prediction_error_tokens",
                    "|reported - predicted| cached prompt tokens per request, by whether the engine found more or fewer than predicted.",
                )
                .buckets(BUCKETS.to_vec()),
                &["worker", "direction"],
            )
            .expect("static metric definition"),
            mismatch: IntCounterVec::new(
                Opts::new(
                    "kvroute_cached_tokens_mismatch_total",
                    "Requests whose engine-reported cached tokens differ from the router's prediction.",
                ),
                &["worker"],
            )
            .expect("static metric definition"),
            compared: IntCounterVec::new(
                Opts::new(
                    "kvroute_cached_tokens_compared_total",
                    "Requests whose engine reported cached tokens to compare with the router's prediction.",
                ),
                &["worker"],
            )
            .expect("static metric definition"),
        };
        for c in [
            Box::new(m.error.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.mismatch.clone()),
            Box::new(m.compared.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        m
    }

    /// Compares one request's prediction with the engine's report.
    pub fn observe(&self, worker: &str, predicted: u64, reported: u64) {
        self.compared.with_label_values(&[worker]).inc();
        // The series exists from the first comparison, so "0 mismatches" is a value, not absent.
        let mismatch = self.mismatch.with_label_values(&[worker]);
        if predicted != reported {
            mismatch.inc();
        }
        let direction = if reported > predicted {
            "more"
        } else {
            "fewer"
        };
        self.error
            .with_label_values(&[worker, direction])
            .observe(reported.abs_diff(predicted) as f64);
    }

    /// Drops a departed worker's series.
    pub(super) fn forget_worker(&self, worker: &str) {
        super::forget(&self.error, worker);
        super::forget(&self.mismatch, worker);
        super::forget(&self.compared, worker);
    }
}
