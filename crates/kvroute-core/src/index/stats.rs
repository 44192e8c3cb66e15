//! Counters the index keeps for the metrics module.
//!
//! Plain relaxed atomics: `metrics` reads them at scrape time, so the hot paths never touch a
//! Prometheus registry.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Cumulative counters and gauges of one [`super::KvIndex`].
#[derive(Debug, Default)]
pub struct IndexStats {
    pub(crate) events_applied: AtomicU64,
    pub(crate) events_skipped: AtomicU64,
    pub(crate) blocks_stored: AtomicU64,
    pub(crate) blocks_removed: AtomicU64,
    pub(crate) blocks_unplaced: AtomicU64,
    pub(crate) removals_unknown: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) workers_cleared: AtomicU64,
    pub(crate) entries: AtomicU64,
}

/// A point-in-time copy of [`IndexStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Events applied to the index (stored, removed, cleared).
    pub events_applied: u64,
    /// Events skipped: not device-prefix blocks (CPU medium, group ≠ 0, sliding window),
    /// unknown event types, malformed events, LoRA ids without a name.
    pub events_skipped: u64,
    /// Blocks recorded from BlockStored.
    pub blocks_stored: u64,
    /// Blocks dropped by BlockRemoved.
    pub blocks_removed: u64,
    /// Stored blocks whose parent was unknown, so their chain could not be placed.
    pub blocks_unplaced: u64,
    /// BlockRemoved ids the index did not know (e.g. their store was unplaced).
    pub removals_unknown: u64,
    /// (block, worker) entries evicted to stay within `max_entries`.
    pub evictions: u64,
    /// Times a worker's entries were dropped (AllBlocksCleared, restart, gap, removal).
    pub workers_cleared: u64,
    /// Current (block, worker) entries (gauge).
    pub entries: u64,
}

impl IndexStats {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Relaxed);
        }
    }

    /// Copies every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            events_applied: self.events_applied.load(Relaxed),
            events_skipped: self.events_skipped.load(Relaxed),
            blocks_stored: self.blocks_stored.load(Relaxed),
            blocks_removed: self.blocks_removed.load(Relaxed),
            blocks_unplaced: self.blocks_unplaced.load(Relaxed),
            removals_unknown: self.removals_unknown.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            workers_cleared: self.workers_cleared.load(Relaxed),
            entries: self.entries.load(Relaxed),
        }
    }
}
