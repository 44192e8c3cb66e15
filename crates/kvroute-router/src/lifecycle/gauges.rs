//! What a worker's life records, as Prometheus metrics read when `/metrics` is scraped: its
//! KV-event stream's counters, and what its engine reports against its configuration
//! (data-parallel ranks, KV block size).
//!
//! The stream counts in its own atomics (`kv_events::SubscriberStats`) and the workers hold
//! what their engines report; this collector reads them at scrape time, so a departed worker's
//! series simply are not listed and no scrape sees another one half-done.
#![allow(
    clippy::expect_used,
    reason = "metric families are defined from constant names and labels: one that cannot be built is a defect every test run shows, not an input error"
)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError, Weak};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounterVec, IntGaugeVec, Opts};

use super::Lifecycle;
use crate::fleet::WorkerId;
use crate::kv_events::SubscriberStats;

/// `kvroute_kv_events_total`, `kvroute_worker_data_parallel_mismatch`,
/// `kvroute_worker_engine_block_size` and `kvroute_worker_block_size_mismatch`.
pub struct LifecycleGauges {
    /// Weak: the lifecycle holds the metrics whose registry holds this collector.
    lifecycle: Weak<Lifecycle>,
    /// Held from reset to collect: one scrape's reading at a time.
    scrape: Mutex<()>,
    kv_stream: IntCounterVec,
    dp_mismatch: IntGaugeVec,
    engine_block_size: IntGaugeVec,
    block_size_mismatch: IntGaugeVec,
}

fn family<T>(
    make: impl FnOnce(Opts, &[&str]) -> prometheus::Result<T>,
    name: &str,
    help: &str,
    labels: &[&str],
) -> T {
    make(Opts::new(name, help), labels).expect("static metric definition")
}

impl LifecycleGauges {
    /// Metrics of `lifecycle`'s workers, read at every scrape (none once it is dropped).
    pub fn new(lifecycle: Weak<Lifecycle>) -> LifecycleGauges {
        LifecycleGauges {
            lifecycle,
            scrape: Mutex::new(()),
            kv_stream: family(
                IntCounterVec::new,
                "kvroute_kv_events_total",
                "Per-worker KV-event stream counters (a data-parallel worker's per rank, `worker` = `id/dpN`): batches, undecodable, gaps, restarts, replays, drops, block_size_mismatch, dp_rank_mismatch.",
                &["worker", "kind"],
            ),
            dp_mismatch: family(
                IntGaugeVec::new,
                "kvroute_worker_data_parallel_mismatch",
                "1 while the worker's engine lists another number of data-parallel ranks in its metrics than its configured data_parallel_size.",
                &["worker"],
            ),
            engine_block_size: family(
                IntGaugeVec::new,
                "kvroute_worker_engine_block_size",
                "The KV block size (tokens) the worker's engine reports in its metrics.",
                &["worker"],
            ),
            block_size_mismatch: family(
                IntGaugeVec::new,
                "kvroute_worker_block_size_mismatch",
                "1 while the model's configured block_size is not the KV block size the worker's engine reports: the router's block hashes never match that engine's cache.",
                &["worker", "model"],
            ),
        }
    }

    fn stream_counters(&self, label: &str, stats: &SubscriberStats) {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (kind, value) in [
            ("batches", r(&stats.batches)),
            ("events", r(&stats.events)),
            ("undecodable", r(&stats.undecodable)),
            ("malformed", r(&stats.malformed_messages)),
            ("unknown_events", r(&stats.unknown_events)),
            ("gaps", r(&stats.gaps)),
            ("restarts", r(&stats.restarts)),
            ("replays_ok", r(&stats.replays_ok)),
            ("replays_failed", r(&stats.replays_failed)),
            ("replays_abandoned", r(&stats.replays_abandoned)),
            ("duplicates", r(&stats.duplicates)),
            ("dropped", r(&stats.dropped)),
            ("disconnects", r(&stats.disconnects)),
            ("block_size_mismatch", r(&stats.block_size_mismatch)),
            ("dp_rank_mismatch", r(&stats.dp_rank_mismatch)),
        ] {
            self.kv_stream
                .with_label_values(&[label, kind])
                .inc_by(value);
        }
    }

    /// Sets every family from the workers and feeds of now.
    fn fill(&self, lifecycle: &Lifecycle) {
        let workers = lifecycle.fleet().workers();
        // One pass over the ranks, not one per feed: a scrape of 1,024 workers stays linear.
        let labels: HashMap<WorkerId, &str> = workers
            .iter()
            .flat_map(|w| w.ranks())
            .map(|r| (r.key, &*r.label))
            .collect();
        for (slot, stats) in lifecycle.feed_stats() {
            if let Some(label) = labels.get(&slot) {
                self.stream_counters(label, &stats);
            }
        }
        for w in workers.iter() {
            if w.engine_ranks.listed().is_some() {
                let wrong = w.engine_ranks.disagrees(w.data_parallel_size());
                self.dp_mismatch
                    .with_label_values(&[w.id()])
                    .set(i64::from(wrong));
            }
            if let Some(size) = w.engine_block_size.reported() {
                self.engine_block_size
                    .with_label_values(&[w.id()])
                    .set(i64::from(size));
                for (model, configured) in lifecycle.block_sizes_of(w) {
                    self.block_size_mismatch
                        .with_label_values(&[w.id(), &model])
                        .set(i64::from(configured != size));
                }
            }
        }
    }
}

impl Collector for LifecycleGauges {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.kv_stream.desc();
        descs.extend(self.dp_mismatch.desc());
        descs.extend(self.engine_block_size.desc());
        descs.extend(self.block_size_mismatch.desc());
        descs
    }

    /// The stream counters are the feeds' own cumulative counts, set afresh at each scrape
    /// (a rejoined worker's new feed starts from 0, as a restarted process's counter does).
    fn collect(&self) -> Vec<MetricFamily> {
        let _one_scrape = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        self.kv_stream.reset();
        self.dp_mismatch.reset();
        self.engine_block_size.reset();
        self.block_size_mismatch.reset();
        if let Some(lifecycle) = self.lifecycle.upgrade() {
            self.fill(&lifecycle);
        }
        let mut families = self.kv_stream.collect();
        families.extend(self.dp_mismatch.collect());
        families.extend(self.engine_block_size.collect());
        families.extend(self.block_size_mismatch.collect());
        families
    }
}
