//! The ZeroMQ contexts the subscribers' sockets are made in, so a router can subscribe to
//! more than a few hundred engines.
//!
//! Why several: a libzmq context holds at most 1,023 sockets (its `ZMQ_MAX_SOCKETS` default;
//! the `zmq` crate offers no way to raise it), and one subscriber uses up to five: its SUB, the
//! two PAIRs of its connection monitor (libzmq's end and ours), during a replay a DEALER, and
//! while it is dropped the PAIR libzmq makes when the monitor is switched off.
//! With one process-wide context the 342nd worker's subscription failed with "Too many open
//! files" (measured by `benches/event_lag.rs` at 1,024 workers). So each subscriber leases a
//! place in a context that has room, and a new context is made when none has; a lease is
//! given back when its subscriber's sockets are dropped. libzmq closes sockets later, on its
//! reaper thread, so a context whose leases are back may still be full for a moment: a
//! subscriber refused there ("Too many open files") is made in a new context instead.
//!
//! Each context has its own I/O thread, so a large fleet's connections are also read by
//! several threads instead of one. Contexts are never terminated (as the process-wide one
//! is not): dropping a socket never waits on another's queued messages.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Subscribers per context: 5 sockets each is 800 of the 1,023, leaving room for sockets that
/// libzmq's reaper has not closed yet when their lease is already back.
pub(crate) const SUBSCRIBERS_PER_CONTEXT: usize = 160;

struct Shared {
    context: zmq::Context,
    leased: AtomicUsize,
}

/// Every context made so far.
static CONTEXTS: Mutex<Vec<Arc<Shared>>> = Mutex::new(Vec::new());

/// A subscriber's place in a context; dropped after the subscriber's sockets.
pub(crate) struct ContextLease(Arc<Shared>);

impl ContextLease {
    /// A place in the first context with room, or in a new one.
    pub(crate) fn take() -> ContextLease {
        // A poisoned lock only means a thread panicked while holding it; the list is intact
        // (every change to it is one push).
        let mut all = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
        let room = all.iter().find(|c| {
            c.leased
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < SUBSCRIBERS_PER_CONTEXT).then_some(n + 1)
                })
                .is_ok()
        });
        let shared = match room {
            Some(c) => Arc::clone(c),
            None => Self::add(&mut all),
        };
        ContextLease(shared)
    }

    /// A place in a new context: for a subscriber whose sockets a full context refused.
    pub(crate) fn fresh() -> ContextLease {
        let mut all = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
        ContextLease(Self::add(&mut all))
    }

    fn add(all: &mut Vec<Arc<Shared>>) -> Arc<Shared> {
        let c = Arc::new(Shared {
            context: zmq::Context::new(),
            leased: AtomicUsize::new(1),
        });
        all.push(Arc::clone(&c));
        c
    }

    /// The context to make this subscriber's sockets in (all of them: its monitor is an
    /// `inproc` endpoint, which only connects within one context).
    pub(crate) fn context(&self) -> &zmq::Context {
        &self.0.context
    }

    /// How many contexts exist (for tests).
    #[cfg(test)]
    pub(crate) fn contexts() -> usize {
        CONTEXTS.lock().map(|c| c.len()).unwrap_or(0)
    }
}

impl Drop for ContextLease {
    fn drop(&mut self) {
        self.0.leased.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::super::monitored::MonitoredSub;
    use super::*;

    /// 700 subscribers' sockets (2,100 with their monitors) in one process: one context
    /// refused the 342nd. Dropped and made again at once (before libzmq has reaped the old
    /// sockets), every one is made.
    #[test]
    fn more_subscribers_than_one_context_holds() {
        let subs: Vec<MonitoredSub> = (0..700)
            .map(|i| MonitoredSub::new(b"kv-events").unwrap_or_else(|e| panic!("sub {i}: {e}")))
            .collect();
        let made = ContextLease::contexts();
        assert!(made > 700 / SUBSCRIBERS_PER_CONTEXT, "{made} contexts");
        for s in &subs {
            s.sub().connect("tcp://127.0.0.1:9").expect("connect");
        }
        drop(subs);
        let again: Vec<MonitoredSub> = (0..700)
            .map(|i| MonitoredSub::new(b"kv-events").unwrap_or_else(|e| panic!("again {i}: {e}")))
            .collect();
        drop(again);
    }
}
