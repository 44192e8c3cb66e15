//! Tokens and their pace, per model and worker: prompt, completion and cached prompt tokens as
//! the engines report them in `usage`, and the time between a stream's tokens.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// The token counters and pace histograms.
#[derive(Clone)]
pub struct TokenMetrics {
    /// `kvroute_prompt_tokens_total{model,worker}`: `usage.prompt_tokens` of answered requests.
    pub prompt: IntCounterVec,
    /// `kvroute_completion_tokens_total{model,worker}`: `usage.completion_tokens`.
    pub completion: IntCounterVec,
    /// `kvroute_cached_tokens_total{model,worker}`:
    /// `usage.prompt_tokens_details.cached_tokens`, where the engine reports it.
    pub cached: IntCounterVec,
    /// `kvroute_inter_token_latency_seconds{model,worker}`: time between a stream's
    /// successive chunks after the first token (an engine sends one per decode step).
    pub itl: HistogramVec,
    /// `kvroute_time_per_output_token_seconds{model,worker}`: (end − first token) /
    /// (completion tokens − 1) of each response that reported its usage.
    pub tpot: HistogramVec,
}

/// Buckets from 1 ms to 2.5 s: a decode step is milliseconds to tens of them; stalls longer.
const BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 2.5,
];

fn counter(name: &str, help: &str) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), &["model", "worker"])
        .expect("static metric definition")
}

fn histogram(name: &str, help: &str) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()),
        &["model", "worker"],
    )
    .expect("static metric definition")
}

impl TokenMetrics {
    pub(super) fn register(registry: &Registry) -> TokenMetrics {
        let m = TokenMetrics {
            prompt: counter(
                "kvroute_prompt_tokens_total",
                "Prompt tokens of answered requests, as the engine reported them.",
            ),
            completion: counter(
                "kvroute_completion_tokens_total",
                "Completion tokens of answered requests, as the engine reported them.",
            ),
            cached: counter(
                "kvroute_cached_tokens_total",
                "Prompt tokens the engine found in its prefix cache (usage.prompt_tokens_details.cached_tokens).",
            ),
            itl: histogram(
                "kvroute_inter_token_latency_seconds",
                "Time between a stream's successive chunks after its first token.",
            ),
            tpot: histogram(
                "kvroute_time_per_output_token_seconds",
                "Time per output token after the first, of responses that reported their usage.",
            ),
        };
        for c in [
            Box::new(m.prompt.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(m.completion.clone()),
            Box::new(m.cached.clone()),
            Box::new(m.itl.clone()),
            Box::new(m.tpot.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        m
    }

    /// Drops a departed worker's series.
    pub(super) fn forget_worker(&self, worker: &str) {
        super::forget(&self.prompt, worker);
        super::forget(&self.completion, worker);
        super::forget(&self.cached, worker);
        super::forget(&self.itl, worker);
        super::forget(&self.tpot, worker);
    }
}
