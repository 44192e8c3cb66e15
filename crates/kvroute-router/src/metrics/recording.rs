//! The recorded trace (`[recording]`): requests written and dropped.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

/// The recorded trace's counters.
#[derive(Clone)]
pub struct RecordingMetrics {
    /// `kvroute_trace_records_total`: requests written to the recorded trace.
    pub records: IntCounter,
    /// `kvroute_trace_records_dropped_total{reason}`: requests not recorded (`queue_full`,
    /// `write_error`, `no_usage`, `untokenized`).
    pub dropped: IntCounterVec,
}

impl RecordingMetrics {
    pub(super) fn register(registry: &Registry) -> RecordingMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition")
        };
        let records = IntCounter::new(
            "kvroute_trace_records_total",
            "Requests written to the recorded trace ([recording] trace).",
        )
        .expect("static metric definition");
        let dropped = counter(
            "kvroute_trace_records_dropped_total",
            "Routed requests not written to the recorded trace: queue_full (the writer fell \
             behind), write_error, no_usage (the response told no output length), untokenized.",
            &["reason"],
        );
        for c in [
            Box::new(records.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(dropped.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        RecordingMetrics { records, dropped }
    }
}
