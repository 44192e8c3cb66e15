//! Client connections open now: the cap's count, the gauge, shutdown's wait for zero, and room
//! for a new client at the cap.
//!
//! At `server.max_connections`, a cap's worth of connections that do nothing — silent ones
//! waiting out `header_read_timeout_s`, idle keep-alives, or ones whose only requests wait on a
//! client that takes nothing (an HTTP/2 window of 0) — used to lock every other client out
//! until they timed out (75 s by default). Now a new connection at the cap evicts a connection
//! that is doing nothing — of the client address holding the most such connections, the one
//! idle the longest, so one client's idle connections count against it and not against
//! everyone — and is refused only when every open connection has work in progress.

use std::collections::HashMap;
use std::net::IpAddr;
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
        self.metrics.connections.open.inc();
        let mut all = self.lock();
        // Closed connections' entries are swept once they are as many as the open ones, so
        // an accept costs a push, not a scan.
        if all.len() > 2 * self.count() + 16 {
            all.retain(|a| a.strong_count() > 0);
        }
        all.push(Arc::downgrade(activity));
        Some(Slot(Arc::clone(self)))
    }

    /// Evicts an open connection that does nothing (see [`Activity::idle_since`]): of the
    /// client address with the most of them, the one idle the longest; `None` when none is idle.
    fn evict_one(&self) -> Option<()> {
        let now = Instant::now();
        let idle: Vec<(Instant, Arc<Activity>)> = self
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|a| !a.is_evicted())
            .filter_map(|a| Some((a.idle_since(now)?, a)))
            .collect();
        let mut per_peer: HashMap<IpAddr, usize> = HashMap::new();
        for (_, a) in &idle {
            *per_peer.entry(a.peer()).or_default() += 1;
        }
        let victim = idle
            .into_iter()
            .max_by_key(|(since, a)| (per_peer[&a.peer()], std::cmp::Reverse(*since)))
            .map(|(_, a)| a)?;
        victim.evict();
        self.metrics
            .connections
            .closed
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
        self.0.metrics.connections.open.dec();
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.closed.notify_waiters();
        }
    }
}
