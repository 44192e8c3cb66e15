//! The KV block size of each worker's engine and whether its models agree with it (see
//! `fleet::engine_block_size`).

use prometheus::{IntGaugeVec, Opts, Registry};

/// Workers' engine block sizes, reported against configured.
#[derive(Clone)]
pub struct BlockSizeMetrics {
    /// `kvroute_worker_engine_block_size{worker}`: the KV block size the worker's engine
    /// reports in its metrics (vLLM `cache_config_info`, SGLang `page_size`); absent until
    /// read.
    pub engine: IntGaugeVec,
    /// `kvroute_worker_block_size_mismatch{worker,model}`: 1 while the model's configured
    /// `block_size` is not the one the worker's engine reports (its prefix hits are lost;
    /// the log names both and the fix), 0 while they agree; absent until read.
    pub mismatch: IntGaugeVec,
}

impl BlockSizeMetrics {
    pub(super) fn register(registry: &Registry) -> BlockSizeMetrics {
        let engine = IntGaugeVec::new(
            Opts::new(
                "kvroute_worker_engine_block_size",
                "The KV block size (tokens) the worker's engine reports in its metrics.",
            ),
            &["worker"],
        )
        .expect("static metric definition");
        let mismatch = IntGaugeVec::new(
            Opts::new(
                "kvroute_worker_block_size_mismatch",
                "1 while the model's configured block_size is not the KV block size the worker's engine reports: the router's block hashes never match that engine's cache.",
            ),
            &["worker", "model"],
        )
        .expect("static metric definition");
        for m in [&engine, &mismatch] {
            registry
                .register(Box::new(m.clone()))
                .expect("metric names are unique");
        }
        BlockSizeMetrics { engine, mismatch }
    }

    /// Drops a departed worker's series.
    pub(super) fn forget_worker(&self, worker: &str) {
        super::forget(&self.engine, worker);
        super::forget(&self.mismatch, worker);
    }
}
