//! Placement isolation (`routing::isolation`): how many decisions it narrowed, by rule, so an
//! operator sees that a tenant is being kept on its share of the workers (and how often the
//! others are kept off them).

use prometheus::{IntCounterVec, Opts, Registry};

use crate::routing::Confined;

/// Placement isolation's counter.
#[derive(Clone)]
pub struct IsolationMetrics {
    /// `kvroute_isolation_confined_total{rule}`: decisions whose candidates isolation
    /// narrowed: `over_share` (a tenant over its fair share kept on its share of the workers)
    /// or `within_share` (another tenant kept off the over-share tenants' workers).
    pub confined: IntCounterVec,
}

impl IsolationMetrics {
    pub(super) fn register(registry: &Registry) -> IsolationMetrics {
        let confined = IntCounterVec::new(
            Opts::new(
                "kvroute_isolation_confined_total",
                "Routing decisions whose candidates placement isolation narrowed, by rule: over_share (a tenant over its fair share kept on its share of the workers), within_share (another tenant kept off their workers).",
            ),
            &["rule"],
        )
        .expect("static metric definition");
        for rule in [Confined::Over, Confined::Within] {
            confined.with_label_values(&[rule.as_str()]);
        }
        registry
            .register(Box::new(confined.clone()))
            .expect("metric names are unique");
        IsolationMetrics { confined }
    }

    /// Counts one decision narrowed by `rule`.
    pub fn count(&self, rule: Confined) {
        self.confined.with_label_values(&[rule.as_str()]).inc();
    }
}
