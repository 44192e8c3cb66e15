//! What a [`super::Session`] reports of its decisions: the policy's scoring time, the first
//! decision's total, how much of the prompt the chosen target holds, the decisions placement
//! isolation narrowed and those made on a saturated fleet.
//!
//! A trait, not the router's Prometheus registry, so the decision core stays free of any
//! exporter: the router implements it on its `Metrics`; the simulator and tests may pass `()`.

use std::sync::Arc;
use std::time::Duration;

use super::isolation::Confined;
use crate::policy::saturation::Saturation;

/// Where a session's decision figures go.
pub trait DecisionMetrics: Sync {
    /// `policy` took `took` to score one attempt's candidates.
    fn scored(&self, policy: &'static str, took: Duration);
    /// The request's first decision took `took` from its start (parsing, hashing, scoring).
    fn decided(&self, policy: &'static str, took: Duration);
    /// A prompt of `queried` blocks went to `target`, which held `hit` of them.
    fn prefix(&self, target: &str, queried: u32, hit: u32);
    /// Placement isolation narrowed a decision's candidates by `rule`.
    fn confined(&self, rule: Confined);
    /// The fleet was saturated for the decision, by `cause` (`policy::saturation`).
    fn saturated(&self, cause: Saturation);
}

/// Figures nobody reads.
impl DecisionMetrics for () {
    fn scored(&self, _: &'static str, _: Duration) {}
    fn decided(&self, _: &'static str, _: Duration) {}
    fn prefix(&self, _: &str, _: u32, _: u32) {}
    fn confined(&self, _: Confined) {}
    fn saturated(&self, _: Saturation) {}
}

/// A shared sink reports into what it shares.
impl<M: DecisionMetrics + Send> DecisionMetrics for Arc<M> {
    fn scored(&self, policy: &'static str, took: Duration) {
        M::scored(self, policy, took);
    }
    fn decided(&self, policy: &'static str, took: Duration) {
        M::decided(self, policy, took);
    }
    fn prefix(&self, target: &str, queried: u32, hit: u32) {
        M::prefix(self, target, queried, hit);
    }
    fn confined(&self, rule: Confined) {
        M::confined(self, rule);
    }
    fn saturated(&self, cause: Saturation) {
        M::saturated(self, cause);
    }
}
