//! The decision core's figures ([`DecisionMetrics`]) into the families `Metrics::new` registers:
//! `kvroute_decision_seconds`, the prefix block counters, isolation's narrowed decisions and the
//! decisions made on a saturated fleet.

use std::time::Duration;

use super::Metrics;
use crate::policy::saturation::Saturation;
use crate::routing::{Confined, DecisionMetrics};

impl DecisionMetrics for Metrics {
    fn scored(&self, policy: &'static str, took: Duration) {
        self.decision
            .with_label_values(&[policy, "score"])
            .observe(took.as_secs_f64());
    }

    fn decided(&self, policy: &'static str, took: Duration) {
        self.decision
            .with_label_values(&[policy, "total"])
            .observe(took.as_secs_f64());
    }

    fn prefix(&self, target: &str, queried: u32, hit: u32) {
        self.prefix_queried_blocks
            .with_label_values(&[target])
            .inc_by(u64::from(queried));
        self.prefix_hit_blocks
            .with_label_values(&[target])
            .inc_by(u64::from(hit));
    }

    fn confined(&self, rule: Confined) {
        self.isolation.count(rule);
    }

    fn saturated(&self, cause: Saturation) {
        self.saturated_decisions.count(cause);
    }
}
