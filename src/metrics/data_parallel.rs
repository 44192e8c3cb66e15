//! The metric of data-parallel workers whose configuration disagrees with their engine (see
//! `fleet::engine_ranks`).

use prometheus::{IntGaugeVec, Opts, Registry};

/// Workers' data-parallel ranks, configured against reported.
#[derive(Clone)]
pub struct DataParallelMetrics {
    /// `kvroute_worker_data_parallel_mismatch{worker}`: 1 while the worker's engine lists
    /// another number of data-parallel ranks in its metrics than its `data_parallel_size`
    /// (the log names both), 0 while they agree; absent until its metrics were read.
    pub mismatch: IntGaugeVec,
}

impl DataParallelMetrics {
    pub(super) fn register(registry: &Registry) -> DataParallelMetrics {
        let mismatch = IntGaugeVec::new(
            Opts::new(
                "kvroute_worker_data_parallel_mismatch",
                "1 while the worker's engine lists another number of data-parallel ranks in its metrics than its configured data_parallel_size.",
            ),
            &["worker"],
        )
        .expect("static metric definition");
        registry
            .register(Box::new(mismatch.clone()))
            .expect("metric names are unique");
        DataParallelMetrics { mismatch }
    }

    /// Drops a departed worker's series.
    pub(super) fn forget_worker(&self, worker: &str) {
        let _ = self.mismatch.remove_label_values(&[worker]);
    }
}
