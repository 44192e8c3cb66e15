//! Exact and approximate holdings together: what a routing decision asks.

use std::cell::OnceCell;
use std::time::Duration;

use super::approx::ApproxIndex;
use super::exact::KvIndex;
use super::overlaps::Overlaps;
use crate::tokens::BlockHash;

/// The exact, event-fed index and the approximate predictions, looked up as one.
///
/// A worker holds a block if either says so: events describe what the engine cached,
/// predictions cover workers without events and requests still in prefill.
#[derive(Default)]
pub struct Holdings {
    /// Event-fed holdings.
    pub exact: KvIndex,
    /// Predictions from routing decisions.
    pub approx: ApproxIndex,
}

impl Holdings {
    /// Both indexes.
    pub fn new(exact: KvIndex, approx: ApproxIndex) -> Self {
        Holdings { exact, approx }
    }

    /// Per worker, the leading `blocks` held by the union of exact and predicted holdings.
    pub fn lookup(&self, blocks: &[BlockHash], now: Duration) -> Overlaps {
        let exact = self.exact.lookup(blocks);
        // Who holds the blocks past each worker's exact count is asked only when a worker
        // has predictions to merge, and then once for all of them.
        let holders = OnceCell::new();
        self.approx.lookup_with(blocks, now, &exact, |w, i| {
            holders
                .get_or_init(|| self.exact.holders(blocks))
                .holds(w, i)
        })
    }
}
