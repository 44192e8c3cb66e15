//! vLLM's Prometheus metrics, one registry per engine instance.
//!
//! Names and the `model_name` label are vLLM's, so anything that scrapes a real vLLM (the
//! router's fleet feedback, Grafana dashboards) reads the simulated engine unchanged. Times are
//! engine seconds, which equal wall seconds in the HTTP face (step durations already include
//! `--speedup`).

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use super::core::{EngineConfig, EngineCore, EngineCounters};
use super::request::{FinishReason, RequestStats};

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// The metrics of one engine.
#[derive(Clone, Debug)]
pub struct EngineMetrics {
    registry: Registry,
    running: IntGauge,
    waiting: IntGauge,
    kv_usage: Gauge,
    queries: IntCounter,
    hits: IntCounter,
    preemptions: IntCounter,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    evictions: IntCounter,
    success: IntCounterVec,
    ttft: Histogram,
    e2e: Histogram,
    queue: Histogram,
    offload: super::tier_metrics::TierMetrics,
}

impl EngineMetrics {
    /// Registers every metric, labelled with `model_name`; `core` is described in
    /// `vllm:cache_config_info`, as vLLM describes its cache (routers size their state by its
    /// `num_gpu_blocks`).
    pub fn new(model_name: &str, core: &EngineConfig) -> Result<Self, prometheus::Error> {
        EngineMetrics::for_rank(&Registry::new(), model_name, core, 0)
    }

    /// The metrics of data-parallel rank `rank` in `registry`, which the other ranks of the
    /// engine share: every series carries `engine="<rank>"`, as vLLM labels its engine cores',
    /// so one `/metrics` shows each rank's load and cache.
    pub fn for_rank(
        registry: &Registry,
        model_name: &str,
        core: &EngineConfig,
        rank: u32,
    ) -> Result<Self, prometheus::Error> {
        let registry = registry.clone();
        let engine = rank.to_string();
        register_cache_info(&registry, core, &engine)?;
        let labels = RankLabels {
            model_name,
            engine: &engine,
        };
        let m = EngineMetrics::build(registry, &labels)?;
        m.register_families()?;
        Ok(m)
    }

    /// Every family of the rank, labelled with `labels`, in `registry`; only the offload
    /// families are registered yet (they register as they are built), the rest by
    /// [`Self::register_families`].
    fn build(registry: Registry, labels: &RankLabels<'_>) -> Result<Self, prometheus::Error> {
        Ok(EngineMetrics {
            running: IntGauge::with_opts(labels.opts(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
            ))?,
            waiting: IntGauge::with_opts(labels.opts(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
            ))?,
            kv_usage: Gauge::with_opts(labels.opts(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
            ))?,
            queries: IntCounter::with_opts(labels.opts(
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            ))?,
            hits: IntCounter::with_opts(labels.opts(
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            ))?,
            preemptions: IntCounter::with_opts(labels.opts(
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
            ))?,
            prompt_tokens: IntCounter::with_opts(labels.opts(
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
            ))?,
            generation_tokens: IntCounter::with_opts(labels.opts(
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
            ))?,
            evictions: IntCounter::with_opts(labels.opts(
                "kvroute_engine_kv_evictions_total",
                "Cached KV blocks evicted (simulated engine only).",
            ))?,
            success: IntCounterVec::new(
                labels.opts(
                    "vllm:request_success_total",
                    "Count of successfully processed requests.",
                ),
                &["finished_reason"],
            )?,
            ttft: Histogram::with_opts(labels.histogram_opts(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            ))?,
            e2e: Histogram::with_opts(labels.histogram_opts(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                LATENCY_BUCKETS,
            ))?,
            queue: Histogram::with_opts(labels.histogram_opts(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                LATENCY_BUCKETS,
            ))?,
            offload: super::tier_metrics::TierMetrics::register(&registry, |name, help| {
                labels.opts(name, help)
            })?,
            registry,
        })
    }

    /// Registers the families [`Self::build`] made, in field order.
    fn register_families(&self) -> Result<(), prometheus::Error> {
        self.registry.register(Box::new(self.running.clone()))?;
        self.registry.register(Box::new(self.waiting.clone()))?;
        self.registry.register(Box::new(self.kv_usage.clone()))?;
        self.registry.register(Box::new(self.queries.clone()))?;
        self.registry.register(Box::new(self.hits.clone()))?;
        self.registry.register(Box::new(self.preemptions.clone()))?;
        self.registry
            .register(Box::new(self.prompt_tokens.clone()))?;
        self.registry
            .register(Box::new(self.generation_tokens.clone()))?;
        self.registry.register(Box::new(self.evictions.clone()))?;
        self.registry.register(Box::new(self.success.clone()))?;
        self.registry.register(Box::new(self.ttft.clone()))?;
        self.registry.register(Box::new(self.e2e.clone()))?;
        self.registry.register(Box::new(self.queue.clone()))?;
        Ok(())
    }

    /// Updates gauges from `core` and counters by the difference from `before`.
    pub fn observe_core(&self, core: &EngineCore, before: &EngineCounters) {
        self.running.set(core.num_running() as i64);
        self.waiting.set(core.num_waiting() as i64);
        self.kv_usage.set(core.kv_usage());
        let now = core.counters();
        self.queries
            .inc_by(now.queried_tokens - before.queried_tokens);
        self.hits.inc_by(now.hit_tokens - before.hit_tokens);
        self.preemptions
            .inc_by(now.preemptions - before.preemptions);
        self.prompt_tokens
            .inc_by(now.prefill_tokens - before.prefill_tokens);
        self.generation_tokens
            .inc_by(now.generated_tokens - before.generated_tokens);
        self.evictions.inc_by(now.evictions - before.evictions);
        if let Some(counters) = core.with_cache(|c| c.tier().map(|t| t.counters())) {
            self.offload.observe(counters);
        }
    }

    /// Records a request that ended.
    pub fn observe_finished(&self, stats: &RequestStats) {
        if stats.reason == FinishReason::Aborted {
            self.success.with_label_values(&["abort"]).inc();
            return;
        }
        self.success.with_label_values(&["length"]).inc();
        if let Some(t) = stats.ttft() {
            self.ttft.observe(t);
        }
        if let Some(q) = stats.queue_time() {
            self.queue.observe(q);
        }
        self.e2e.observe(stats.e2e());
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics; an error yields what was
        // written so far rather than a panic.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Registers `vllm:cache_config_info` for rank `engine`, always 1: its labels describe the
/// cache as vLLM describes it (routers size their state by its `num_gpu_blocks`).
fn register_cache_info(
    registry: &Registry,
    core: &EngineConfig,
    engine: &str,
) -> Result<(), prometheus::Error> {
    let cache_info = Gauge::with_opts(
        Opts::new(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
        )
        .const_label("block_size", core.block_size.to_string())
        .const_label("enable_prefix_caching", "True")
        .const_label("engine", engine)
        .const_label("num_gpu_blocks", core.num_blocks.to_string()),
    )?;
    cache_info.set(1.0);
    registry.register(Box::new(cache_info))?;
    Ok(())
}

/// The constant labels of every series of one engine rank: vLLM's `model_name`, and
/// `engine`, the data-parallel rank.
struct RankLabels<'a> {
    model_name: &'a str,
    engine: &'a str,
}

impl RankLabels<'_> {
    /// A counter's or gauge's options with the rank's labels.
    fn opts(&self, name: &str, help: &str) -> Opts {
        Opts::new(name, help)
            .const_label("model_name", self.model_name)
            .const_label("engine", self.engine)
    }

    /// A histogram's options with the rank's labels and `buckets`.
    fn histogram_opts(&self, name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
        HistogramOpts::new(name, help)
            .const_label("model_name", self.model_name)
            .const_label("engine", self.engine)
            .buckets(buckets.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{EngineConfig, RequestId};

    #[test]
    fn exposes_vllm_names_with_model_label() {
        let m = EngineMetrics::new("my-model", &EngineConfig::default()).unwrap();
        let mut core = EngineCore::new(EngineConfig::default()).unwrap();
        let before = core.counters();
        core.add_request(RequestId(1), (0..40).collect(), 1, 0.0)
            .unwrap();
        let out = core.step(0.0);
        m.observe_core(&core, &before);
        m.observe_finished(&out.finished[0]);
        let text = m.render();
        for name in [
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "vllm:num_preemptions_total",
            "vllm:time_to_first_token_seconds_bucket",
            "vllm:e2e_request_latency_seconds_count",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
        assert!(
            text.contains(
                "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"my-model\"} 40"
            )
        );
        assert!(
            text.contains("vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"my-model\"} 0")
        );
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"my-model\"} 1"
        ));
    }

    #[test]
    fn cache_config_info_tells_the_router_the_cache_size() {
        let config = EngineConfig {
            num_blocks: 1234,
            ..EngineConfig::default()
        };
        let text = EngineMetrics::new("m", &config).unwrap().render();
        assert!(text.contains("vllm:cache_config_info{"), "{text}");
        assert_eq!(
            kvroute_router::fleet::capacity::parse_kv_blocks(&text),
            Some(1234)
        );
    }
}
