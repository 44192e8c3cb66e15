//! Client connections open now: the cap's count, the gauge, shutdown's wait for zero, and room
//! for a new client at the cap.
//!
//! At `server.max_connections`, a cap's worth of connections that do nothing — silent ones
//! waiting out `header_read_timeout_s`, idle keep-alives, or ones whose only requests wait on a
//! client that takes nothing (an HTTP/2 window of 0) — used to lock every other client out
//! until they timed out (75 s by default). Now a new connection at the cap evicts the
//! connection that has been doing nothing the longest, and is refused only when every open
//! connection has work in progress.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::connection::Activity;
use crate::metrics::Metrics;

/// The open connections.
pub(super) struct OpenConnections {
    count: AtomicUsize,
    closed: Notify,
    metrics: Arc<Metrics>,
    /// Each open connection's activity, to find one to evict at the cap.
    activities: Mutex<Vec<Weak<Activity>>>,
}

impl OpenConnections {
    pub(super) fn new(metrics: Arc<Metrics>) -> OpenConnections {
        OpenConnections {
            count: AtomicUsize::new(0),
            closed: Notify::new(),
            metrics,
            activities: Mutex::new(Vec::new()),
        }
    }

    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Activity>>> {
        self.activities.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for the connection of `activity`: one of `cap`, else the place of the open
    /// connection idle the longest, which is evicted; `None` when every open connection has
    /// work in progress.
    pub(super) fn take(self: &Arc<Self>, cap: usize, activity: &Arc<Activity>) -> Option<Slot> {
        let under_cap = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < cap).then_some(n + 1)
            })
            .is_ok();
        if !under_cap {
            self.evict_one()?;
            // Over the cap for as long as the evicted connection takes to drop.
            self.count.fetch_add(1, Ordering::AcqRel);
        }
        self.metrics.open_connections.inc();
        let mut all = self.lock();
        // Closed connections' entries are swept once they are as many as the open ones, so
        // an accept costs a push, not a scan.
        if all.len() > 2 * self.count() + 16 {
            all.retain(|a| a.strong_count() > 0);
        }
        all.push(Arc::downgrade(activity));
        Some(Slot(Arc::clone(self)))
    }

    /// Evicts the open connection that has done nothing the longest (see
    /// [`Activity::idle_since`]); `None` when none is idle.
    fn evict_one(&self) -> Option<()> {
        let now = Instant::now();
        let victim = self
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|a| !a.is_evicted())
            .filter_map(|a| Some((a.idle_since(now)?, a)))
            .min_by_key(|(since, _)| *since)
            .map(|(_, a)| a)?;
        victim.evict();
        self.metrics
            .connections_closed
            .with_label_values(&["evicted"])
            .inc();
        Some(())
    }

    /// Resolves once no connection is open.
    pub(super) async fn all_closed(&self) {
        loop {
            let notified = self.closed.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One open connection's place under the cap; dropping it frees the place.
pub(super) struct Slot(Arc<OpenConnections>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.metrics.open_connections.dec();
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.closed.notify_waiters();
        }
    }
}
