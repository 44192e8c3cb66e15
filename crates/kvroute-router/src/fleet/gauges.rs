//! The fleet's live state as Prometheus gauges, read when `/metrics` is scraped.
//!
//! Health, capacity, warm-up, in-flight counts, load-reading age and breaker state live in the
//! workers (atomics and the breaker); copying them into registered gauges at scrape time meant
//! resetting the gauges first (so a departed worker's series vanish), and a scrape running
//! beside another saw them mid-reset — a worker absent, or half its series. This collector
//! owns the families instead: each scrape fills them from the workers listed now under one
//! lock, so every scrape sees one whole reading and departed workers simply are not listed.
#![allow(
    clippy::expect_used,
    reason = "metric families are defined from constant names, labels and buckets: one that cannot be built is a defect every test run shows, not an input error"
)]

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntGaugeVec, Opts};

use super::Fleet;

/// `kvroute_worker_*` gauges of every worker (a data-parallel worker's load per rank).
pub struct FleetGauges {
    fleet: Arc<Fleet>,
    /// Held from reset to collect: one scrape's reading at a time.
    scrape: Mutex<()>,
    healthy: IntGaugeVec,
    kv_blocks: IntGaugeVec,
    in_flight: IntGaugeVec,
    warming: IntGaugeVec,
    load_age: GaugeVec,
    unseen_in_flight: IntGaugeVec,
    circuit_state: IntGaugeVec,
}

fn int_gauges(name: &str, help: &str) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), &["worker"]).expect("static metric definition")
}

fn saturating(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

impl FleetGauges {
    /// Gauges of `fleet`'s workers, filled at every scrape.
    pub fn new(fleet: Arc<Fleet>) -> FleetGauges {
        FleetGauges {
            fleet,
            scrape: Mutex::new(()),
            healthy: int_gauges(
                "kvroute_worker_healthy",
                "1 when the worker may receive new requests.",
            ),
            kv_blocks: int_gauges(
                "kvroute_worker_kv_blocks",
                "KV cache capacity of the worker in blocks (configured or read from its metrics).",
            ),
            in_flight: int_gauges(
                "kvroute_worker_in_flight",
                "Requests routed to a worker and not yet finished.",
            ),
            warming: int_gauges(
                "kvroute_worker_warming",
                "1 while the worker's KV-event warm-up replay runs (its index entries are a lower bound).",
            ),
            load_age: GaugeVec::new(
                Opts::new(
                    "kvroute_worker_load_reading_age_seconds",
                    "Age of the last reading of the worker's own load from its /metrics ([health] load_interval_ms); absent without one.",
                ),
                &["worker"],
            )
            .expect("static metric definition"),
            unseen_in_flight: int_gauges(
                "kvroute_worker_unseen_in_flight",
                "Requests on the worker that this router did not send (other router replicas'), from the last load reading.",
            ),
            circuit_state: int_gauges(
                "kvroute_worker_circuit_state",
                "Circuit breaker state per worker: 0 closed, 1 open, 2 half-open.",
            ),
        }
    }

    fn int_families(&self) -> [&IntGaugeVec; 6] {
        [
            &self.healthy,
            &self.kv_blocks,
            &self.in_flight,
            &self.warming,
            &self.unseen_in_flight,
            &self.circuit_state,
        ]
    }

    /// Sets every gauge from the workers listed now.
    fn fill(&self, now: Instant) {
        for w in self.fleet.workers().iter() {
            let id = w.id();
            self.healthy
                .with_label_values(&[id])
                .set(i64::from(w.is_healthy()));
            if let Some(blocks) = w.kv_blocks() {
                self.kv_blocks
                    .with_label_values(&[id])
                    .set(saturating(blocks));
            }
            // Load and warm-up are a routing target's: a data-parallel worker's per rank.
            for rank in w.ranks() {
                let label = &*rank.label;
                self.in_flight
                    .with_label_values(&[label])
                    .set(saturating(rank.load.snapshot().in_flight));
                if w.has_event_feed() {
                    self.warming
                        .with_label_values(&[label])
                        .set(i64::from(rank.is_kv_warming()));
                }
                if let Some(at) = rank.load.reading_taken() {
                    self.load_age
                        .with_label_values(&[label])
                        .set(now.saturating_duration_since(at).as_secs_f64());
                    self.unseen_in_flight
                        .with_label_values(&[label])
                        .set(saturating(rank.load.view().unseen_in_flight));
                }
            }
            self.circuit_state
                .with_label_values(&[id])
                .set(w.breaker.state(now).as_metric());
        }
    }
}

impl Collector for FleetGauges {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs: Vec<&Desc> = self.int_families().iter().flat_map(|v| v.desc()).collect();
        descs.extend(self.load_age.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _one_scrape = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        for v in self.int_families() {
            v.reset();
        }
        self.load_age.reset();
        self.fill(Instant::now());
        let mut families: Vec<MetricFamily> = self
            .int_families()
            .iter()
            .flat_map(|v| v.collect())
            .collect();
        families.extend(self.load_age.collect());
        families
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_worker_flag;

    /// The series of `name`, by their `worker` label.
    fn workers_in(families: &[MetricFamily], name: &str) -> Vec<String> {
        let mut ids: Vec<String> = families
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric())
            .flat_map(|m| m.get_label())
            .filter(|l| l.name() == "worker")
            .map(|l| l.value().to_string())
            .collect();
        ids.sort();
        ids
    }

    #[test]
    fn a_scrape_lists_the_workers_of_now_and_a_departed_one_vanishes() {
        let spec = |flag: &str| parse_worker_flag(flag).expect("a valid worker flag");
        let fleet = Arc::new(Fleet::new(vec![
            spec("http://127.0.0.1:1=m"),
            spec("http://127.0.0.1:2=m"),
        ]));
        let gauges = FleetGauges::new(Arc::clone(&fleet));
        assert_eq!(gauges.desc().len(), 7);
        let ids: Vec<String> = fleet.workers().iter().map(|w| w.id().to_string()).collect();
        let first = gauges.collect();
        for name in [
            "kvroute_worker_healthy",
            "kvroute_worker_in_flight",
            "kvroute_worker_circuit_state",
        ] {
            assert_eq!(workers_in(&first, name), ids, "{name}");
        }
        // No capacity known, no load read, no event feed: those series are absent, not 0.
        assert!(workers_in(&first, "kvroute_worker_kv_blocks").is_empty());
        assert!(workers_in(&first, "kvroute_worker_load_reading_age_seconds").is_empty());
        assert!(workers_in(&first, "kvroute_worker_warming").is_empty());

        assert!(fleet.remove(&ids[0]).is_some());
        let after = gauges.collect();
        for name in ["kvroute_worker_healthy", "kvroute_worker_in_flight"] {
            assert_eq!(workers_in(&after, name), ids[1..], "{name}");
        }
    }
}
