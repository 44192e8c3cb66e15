//! The event-fed index's size and event counts as Prometheus metrics, read when `/metrics` is
//! scraped.
//!
//! The index counts in its own atomics (`index::stats`) on the event path; this collector
//! reads them at scrape time, so applying an event never touches a metric and the exposition
//! is never behind the index.
#![allow(
    clippy::expect_used,
    reason = "metric families are defined from constant names and labels: one that cannot be built is a defect every test run shows, not an input error"
)]

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};

use super::Holdings;
use crate::metrics::sync_counter;

/// `kvroute_index_*`: entries, heap bytes, events applied and skipped, evictions.
pub struct IndexGauges {
    holdings: Arc<Holdings>,
    entries: IntGauge,
    bytes: IntGauge,
    events: IntCounterVec,
    evictions: IntCounter,
}

impl IndexGauges {
    /// Metrics of `holdings`' event-fed index, read at every scrape.
    pub fn new(holdings: Arc<Holdings>) -> IndexGauges {
        IndexGauges {
            holdings,
            entries: IntGauge::new(
                "kvroute_index_entries",
                "(block, worker) entries in the event-fed KV index.",
            )
            .expect("static metric definition"),
            bytes: IntGauge::new(
                "kvroute_index_bytes",
                "Heap bytes held by the event-fed KV index (divide by kvroute_index_entries for \
                 bytes per entry).",
            )
            .expect("static metric definition"),
            events: IntCounterVec::new(
                Opts::new(
                    "kvroute_index_events_total",
                    "KV events applied to or skipped by the index.",
                ),
                &["outcome"],
            )
            .expect("static metric definition"),
            evictions: IntCounter::new(
                "kvroute_index_evictions_total",
                "Index entries evicted to stay within index.max_entries.",
            )
            .expect("static metric definition"),
        }
    }
}

impl Collector for IndexGauges {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.entries.desc();
        descs.extend(self.bytes.desc());
        descs.extend(self.events.desc());
        descs.extend(self.evictions.desc());
        descs
    }

    /// Gauges are set and counters raised to the index's own counts (only ever higher: they
    /// are cumulative there, so concurrent scrapes agree).
    fn collect(&self) -> Vec<MetricFamily> {
        let index = &self.holdings.exact;
        let stats = index.stats();
        self.entries
            .set(i64::try_from(stats.entries).unwrap_or(i64::MAX));
        self.bytes
            .set(i64::try_from(index.heap_bytes()).unwrap_or(i64::MAX));
        sync_counter(
            &self.events.with_label_values(&["applied"]),
            stats.events_applied,
        );
        sync_counter(
            &self.events.with_label_values(&["skipped"]),
            stats.events_skipped,
        );
        sync_counter(&self.evictions, stats.evictions);
        let mut families = self.entries.collect();
        families.extend(self.bytes.collect());
        families.extend(self.events.collect());
        families.extend(self.evictions.collect());
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::WorkerId;
    use crate::index::{ApproxConfig, ApproxIndex, IndexConfig, KvIndex};
    use crate::kv_events::{BlockStored, EngineHash, EventBatch, KvEvent};
    use crate::tokens::HashSeed;

    fn seeds(_: Option<&str>, _: Option<&str>) -> HashSeed {
        HashSeed::new("m", None, None)
    }

    fn value(families: &[MetricFamily], name: &str) -> Option<f64> {
        let f = families.iter().find(|f| f.name() == name)?;
        let m = f.get_metric().first()?;
        Some(
            if f.get_field_type() == prometheus::proto::MetricType::COUNTER {
                m.get_counter().get_value()
            } else {
                m.get_gauge().get_value()
            },
        )
    }

    #[test]
    fn every_scrape_reads_the_index_as_it_is_then() {
        let holdings = Arc::new(Holdings::new(
            KvIndex::new(IndexConfig::default()),
            ApproxIndex::new(ApproxConfig::default()),
        ));
        let gauges = IndexGauges::new(Arc::clone(&holdings));
        assert_eq!(gauges.desc().len(), 4);
        let before = gauges.collect();
        assert_eq!(value(&before, "kvroute_index_entries"), Some(0.0));
        let stored = BlockStored {
            block_hashes: (0..8).map(EngineHash).collect(),
            token_ids: (0..8 * 16).collect(),
            block_size: 16,
            ..BlockStored::default()
        };
        let batch = EventBatch {
            ts: 0.0,
            events: vec![KvEvent::Stored(stored)],
            dp_rank: None,
        };
        holdings.exact.apply(WorkerId(1), &batch, &seeds);
        holdings.exact.count_skipped(2);
        let after = gauges.collect();
        assert_eq!(value(&after, "kvroute_index_entries"), Some(8.0));
        assert!(value(&after, "kvroute_index_bytes") > value(&before, "kvroute_index_bytes"));
        let events = after
            .iter()
            .find(|f| f.name() == "kvroute_index_events_total")
            .map(|f| f.get_metric().len());
        assert_eq!(events, Some(2), "applied and skipped");
        // Counters only rise, whatever order scrapes run in.
        let again = gauges.collect();
        assert_eq!(value(&again, "kvroute_index_entries"), Some(8.0));
    }
}
