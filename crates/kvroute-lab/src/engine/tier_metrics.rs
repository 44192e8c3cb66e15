//! vLLM's offloading-connector metrics for the simulated engine's host-memory tier
//! (`vllm:kv_offload_*`, as `vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py`
//! names them; prometheus_client adds `_total` to a counter's name).

use std::sync::{Arc, Mutex};

use prometheus::{Counter, IntCounter, Opts, Registry};

use super::cpu_tier::TierCounters;

/// The offload counters of one engine; registered by [`super::metrics::EngineMetrics`].
#[derive(Clone, Debug)]
pub struct TierMetrics {
    store_bytes: IntCounter,
    load_bytes: IntCounter,
    store_time: Counter,
    load_time: Counter,
    /// What the tier had done at the last observation.
    seen: Arc<Mutex<TierCounters>>,
}

impl TierMetrics {
    /// Registers the counters in `registry` with `opts` (the engine's labels).
    pub fn register(
        registry: &Registry,
        opts: impl Fn(&str, &str) -> Opts,
    ) -> Result<TierMetrics, prometheus::Error> {
        let m = TierMetrics {
            store_bytes: IntCounter::with_opts(opts(
                "vllm:kv_offload_store_bytes_total",
                "Total bytes stored from GPU to offload storage.",
            ))?,
            load_bytes: IntCounter::with_opts(opts(
                "vllm:kv_offload_load_bytes_total",
                "Total bytes loaded from offload storage to GPU.",
            ))?,
            store_time: Counter::with_opts(opts(
                "vllm:kv_offload_store_time_total",
                "Total store time from GPU to offload storage, in seconds.",
            ))?,
            load_time: Counter::with_opts(opts(
                "vllm:kv_offload_load_time_total",
                "Total load time from offload storage to GPU, in seconds.",
            ))?,
            seen: Arc::default(),
        };
        registry.register(Box::new(m.store_bytes.clone()))?;
        registry.register(Box::new(m.load_bytes.clone()))?;
        registry.register(Box::new(m.store_time.clone()))?;
        registry.register(Box::new(m.load_time.clone()))?;
        Ok(m)
    }

    /// Adds what the tier did since the last observation (`now`: its counters now).
    pub fn observe(&self, now: TierCounters) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        self.store_bytes
            .inc_by(now.store_bytes.saturating_sub(seen.store_bytes));
        self.load_bytes
            .inc_by(now.load_bytes.saturating_sub(seen.load_bytes));
        self.store_time
            .inc_by((now.store_time_s - seen.store_time_s).max(0.0));
        self.load_time
            .inc_by((now.load_time_s - seen.load_time_s).max(0.0));
        *seen = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_follow_the_tier() {
        let r = Registry::new();
        let m = TierMetrics::register(&r, |n, h| Opts::new(n, h).const_label("model_name", "m"))
            .unwrap();
        let mut c = TierCounters {
            store_bytes: 100,
            load_bytes: 40,
            store_time_s: 0.5,
            ..TierCounters::default()
        };
        m.observe(c);
        c.load_bytes = 90;
        m.observe(c);
        let mut buf = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &r.gather(), &mut buf)
            .unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(
            text.contains("vllm:kv_offload_load_bytes_total{model_name=\"m\"} 90"),
            "{text}"
        );
        assert!(text.contains("vllm:kv_offload_store_bytes_total{model_name=\"m\"} 100"));
        assert!(text.contains("vllm:kv_offload_store_time_total{model_name=\"m\"} 0.5"));
    }
}
