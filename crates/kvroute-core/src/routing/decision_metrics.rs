//! What a [`super::Session`] reports of its decisions: the policy's scoring time, the first
//! decision's total, and how much of the prompt the chosen target holds.
//!
//! A trait, not the router's Prometheus registry, so the decision core stays free of any
//! exporter: the router implements it on its `Metrics`; the simulator and tests may pass `()`.

use std::sync::Arc;
use std::time::Duration;

/// Where a session's decision figures go.
pub trait DecisionMetrics: Sync {
    /// `policy` took `took` to score one attempt's candidates.
    fn scored(&self, policy: &'static str, took: Duration);
    /// The request's first decision took `took` from its start (parsing, hashing, scoring).
    fn decided(&self, policy: &'static str, took: Duration);
    /// A prompt of `queried` blocks went to `target`, which held `hit` of them.
    fn prefix(&self, target: &str, queried: u32, hit: u32);
}

/// Figures nobody reads.
impl DecisionMetrics for () {
    fn scored(&self, _: &'static str, _: Duration) {}
    fn decided(&self, _: &'static str, _: Duration) {}
    fn prefix(&self, _: &str, _: u32, _: u32) {}
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
}
