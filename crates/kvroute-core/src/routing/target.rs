//! What the decision needs of a worker it may route to.

use std::sync::Arc;
use std::time::Instant;

use crate::fleet::WorkerId;
use crate::fleet::{Load, Role, WorkerRank};

/// A target as the decision sees it: one engine core with its own KV cache. The live fleet's
/// are [`WorkerRank`]s (a worker's data-parallel ranks; a plain worker has one), never a
/// [`crate::fleet::Worker`] as such, so no decision can route to a worker's first rank by
/// mistake; the simulator has its own (no circuit breaker, eligibility by engine state), so
/// both feed the same decision.
pub trait Target {
    /// The worker's identity in the index, load and policy.
    fn worker(&self) -> WorkerId;
    /// Its name, for explanations and metrics.
    fn label(&self) -> &Arc<str>;
    /// Its router-side load.
    fn load(&self) -> &Arc<Load>;
    /// Whether it may take a new request now.
    fn routable(&self) -> bool;
    /// Takes the right to send it a request: a half-open circuit lets one probe through and
    /// refuses the rest.
    fn acquire(&self) -> bool {
        true
    }
    /// Whether its KV events feed the exact index; without them, routed blocks are predicted.
    fn publishes_events(&self) -> bool;
    /// Which side of disaggregated requests it serves (an ordinary engine serves both).
    fn role(&self) -> Role {
        Role::Both
    }
    /// Blocks its KV cache holds, when known (the decode pick keeps requests where they fit).
    fn kv_blocks(&self) -> Option<usize> {
        None
    }
    /// The targets sharing its process and front door, itself included (a worker's
    /// data-parallel ranks): a retry after its failure skips them all, and a prompt it computed
    /// is not handed off to one of them while another decode target is left.
    fn siblings(&self) -> Vec<WorkerId> {
        vec![self.worker()]
    }
}

/// One data-parallel rank of a live worker: the rank's identity and load, the worker's health,
/// drain and circuit (the ranks share one process and one front door).
impl Target for WorkerRank {
    fn worker(&self) -> WorkerId {
        self.state().key
    }

    fn label(&self) -> &Arc<str> {
        &self.state().label
    }

    fn load(&self) -> &Arc<Load> {
        &self.state().load
    }

    fn routable(&self) -> bool {
        self.worker.is_routable(Instant::now())
    }

    fn acquire(&self) -> bool {
        self.worker.breaker.acquire(Instant::now())
    }

    fn publishes_events(&self) -> bool {
        self.worker.has_event_feed()
    }

    fn role(&self) -> Role {
        self.worker.role()
    }

    fn kv_blocks(&self) -> Option<usize> {
        self.worker.kv_blocks()
    }

    fn siblings(&self) -> Vec<WorkerId> {
        self.worker.keys().collect()
    }
}
