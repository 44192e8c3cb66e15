//! Responses the client does not take. A response body's own timers (`proxy::ObservedBody`:
//! idle between chunks, total) run only while hyper polls it, and hyper stops polling when it
//! cannot write: the client's socket buffer is full (it stopped reading), or, over HTTP/2, the
//! client's flow-control window is 0 (an HTTP/2 client that advertises a window of 0 kept a
//! `/health` answer "in progress" forever). Such a request kept its slot, its engine request
//! and its connection, and no timer fired.
//!
//! So each response body is watched from the connection's side ([`Watch`]): it is "waiting on
//! the client" from the moment it exists until hyper first polls it, and again from each chunk
//! it hands over until hyper asks for the next. The connection's driver asks [`Watches::check`]
//! while requests are in progress, and closes the connection when a body has waited on its
//! client longer than its idle limit, or past its total deadline — dropping the connection drops
//! the body, which ends the upstream request and frees the slot. A proxied response's limits are
//! the proxy's `idle_timeout_s` and `total_timeout_s` ([`WriteLimits`], given by the forwarding
//! path as a response extension); the router's own answers use the connection's idle timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// How long a proxied response may wait on its client, set by the forwarding path as a
/// response extension.
#[derive(Clone, Copy, Debug)]
pub struct WriteLimits {
    /// Longest the client may leave a chunk untaken (`proxy.idle_timeout_s`).
    pub idle: Duration,
    /// When the response must be over (its start plus `proxy.total_timeout_s`).
    pub total_at: Instant,
}

/// Not waiting on the client (the body was polled and is waiting on its own source).
const NOT_WAITING: u64 = u64::MAX;

/// One response body's wait on its client.
#[derive(Debug)]
pub(super) struct Watch {
    /// Milliseconds from the connection's birth when the wait began, or [`NOT_WAITING`].
    since_ms: AtomicU64,
    idle: Duration,
    total_at: Option<Instant>,
}

impl Watch {
    /// The client has the body's turn now (it was created, or handed a chunk over).
    pub(super) fn waiting(&self, born: Instant) {
        self.since_ms.store(ms_since(born), Ordering::Release);
    }

    /// hyper asked the body for more: the client is taking it.
    pub(super) fn taken(&self) {
        self.since_ms.store(NOT_WAITING, Ordering::Release);
    }

    /// When this body has waited too long, if it is waiting.
    fn overdue_at(&self, born: Instant) -> Option<Instant> {
        let since = self.since_ms.load(Ordering::Acquire);
        if since == NOT_WAITING {
            return None;
        }
        let idle_end = born + Duration::from_millis(since) + self.idle;
        Some(self.total_at.map_or(idle_end, |t| t.min(idle_end)))
    }
}

fn ms_since(born: Instant) -> u64 {
    u64::try_from(born.elapsed().as_millis()).unwrap_or(NOT_WAITING - 1)
}

/// The response bodies of one connection.
#[derive(Debug, Default)]
pub(super) struct Watches {
    bodies: Mutex<Bodies>,
    /// Told when a body is added that would be overdue before the driver's next check, so the
    /// driver brings that check forward.
    added: tokio::sync::Notify,
}

/// The watched bodies and when the connection's driver checks them next.
#[derive(Debug, Default)]
struct Bodies {
    list: Vec<Arc<Watch>>,
    /// The driver's next check (`None` until it says).
    check_by: Option<Instant>,
}

/// What the connection learns from its bodies.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// A body has waited on its client too long: close the connection.
    Stalled,
    /// Check again by then at the latest (the earliest a waiting body would be overdue).
    CheckBy(Option<Instant>),
}

impl Watches {
    /// Watches a new body (waiting on the client from now) with `limits`, or, without them,
    /// `default_idle` and no total deadline.
    pub(super) fn watch(
        &self,
        born: Instant,
        limits: Option<WriteLimits>,
        default_idle: Duration,
    ) -> Arc<Watch> {
        let watch = Arc::new(Watch {
            since_ms: AtomicU64::new(ms_since(born)),
            idle: limits.map_or(default_idle, |l| l.idle),
            total_at: limits.map(|l| l.total_at),
        });
        // A body is made inside the connection's own task (HTTP/1) while hyper polls it: a
        // notification there wakes that running task, which tokio then requeues behind a wake
        // of another worker thread — a context switch on every request. So the driver is told
        // only when it would check too late, which the proxy's and the connection's timeouts
        // (seconds to minutes, checked from the last request's end) make rare.
        let due = watch.overdue_at(born);
        let mut bodies = self.lock();
        bodies.list.push(Arc::clone(&watch));
        let late = match (bodies.check_by, due) {
            (Some(check), Some(due)) => due < check,
            _ => true,
        };
        drop(bodies);
        if late {
            self.added.notify_one();
        }
        watch
    }

    /// Records that the connection's driver checks again by `at`, or earlier when a body
    /// already watched would be overdue before (one added since the driver's last
    /// [`check`](Self::check)), and returns the time it must check by.
    pub(super) fn check_by(&self, born: Instant, at: Instant) -> Instant {
        let mut bodies = self.lock();
        let at = bodies
            .list
            .iter()
            .filter_map(|w| w.overdue_at(born))
            .fold(at, Instant::min);
        bodies.check_by = Some(at);
        at
    }

    /// Resolves when a body was added since the last time it resolved.
    pub(super) async fn added(&self) {
        self.added.notified().await;
    }

    /// Forgets a body that hyper dropped.
    pub(super) fn forget(&self, watch: &Arc<Watch>) {
        self.lock().list.retain(|w| !Arc::ptr_eq(w, watch));
    }

    /// Whether a body has waited on its client too long at `now`; else when to check again: when
    /// a waiting body would be overdue, and within the idle limit of one that is not waiting
    /// now (it may be handed a chunk the client does not take next).
    pub(super) fn check(&self, born: Instant, now: Instant) -> Verdict {
        let mut next: Option<Instant> = None;
        for w in self.lock().list.iter() {
            let at = match w.overdue_at(born) {
                Some(at) if at <= now => return Verdict::Stalled,
                Some(at) => at,
                None => now + w.idle,
            };
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        Verdict::CheckBy(next)
    }

    /// When the latest of the waits began, when there are `in_flight` bodies and every one is
    /// waiting on its client; `None` otherwise.
    pub(super) fn all_waiting_since(&self, born: Instant, in_flight: usize) -> Option<Instant> {
        let bodies = self.lock();
        if bodies.list.len() != in_flight {
            return None;
        }
        bodies.list.iter().try_fold(born, |latest, w| {
            let since = w.since_ms.load(Ordering::Acquire);
            (since != NOT_WAITING).then(|| latest.max(born + Duration::from_millis(since)))
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Bodies> {
        self.bodies.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_the_client_does_not_take_is_overdue_after_its_idle_limit() {
        let born = Instant::now();
        let secs = Duration::from_secs;
        let watches = Watches::default();
        let w = watches.watch(born, None, secs(5));
        w.since_ms.store(0, Ordering::Release);
        assert_eq!(
            watches.check(born, born + secs(4)),
            Verdict::CheckBy(Some(born + secs(5)))
        );
        // Taken, then waiting on its own source: never overdue, looked at again after its idle
        // limit.
        w.taken();
        assert_eq!(
            watches.check(born, born + secs(60)),
            Verdict::CheckBy(Some(born + secs(65)))
        );
        assert_eq!(watches.all_waiting_since(born, 1), None, "taken");
        // A chunk handed over at 60 s and not taken for the idle limit.
        w.since_ms.store(60_000, Ordering::Release);
        assert_eq!(watches.all_waiting_since(born, 1), Some(born + secs(60)));
        assert_eq!(
            watches.all_waiting_since(born, 2),
            None,
            "another request in progress has no response yet"
        );
        assert_eq!(watches.check(born, born + secs(65)), Verdict::Stalled);
        watches.forget(&w);
        assert_eq!(watches.check(born, born + secs(65)), Verdict::CheckBy(None));
        // The total deadline comes first when it is earlier.
        let limits = WriteLimits {
            idle: secs(300),
            total_at: born + secs(2),
        };
        let w = watches.watch(born, Some(limits), secs(5));
        w.since_ms.store(0, Ordering::Release);
        assert_eq!(
            watches.check(born, born + secs(1)),
            Verdict::CheckBy(Some(born + secs(2)))
        );
        assert_eq!(watches.check(born, born + secs(2)), Verdict::Stalled);
    }

    /// The driver is told of a new body only when its current check would come too late, and
    /// a check it asks for is brought forward to the earliest body already watched.
    #[test]
    fn a_new_body_wakes_the_driver_only_when_it_would_be_overdue_before_the_next_check() {
        use futures_util::FutureExt;
        let born = Instant::now();
        let secs = Duration::from_secs;
        let watches = Watches::default();
        // Before the driver has said when it checks, every body tells it.
        watches.watch(born, None, secs(300));
        assert!(watches.added().now_or_never().is_some(), "first body: told");
        // The driver checks by 75 s; the body watched is overdue only at ~300 s: kept.
        assert_eq!(watches.check_by(born, born + secs(75)), born + secs(75));
        watches.watch(born, None, secs(300));
        assert!(
            watches.added().now_or_never().is_none(),
            "due after the check: not told"
        );
        // A body overdue in 5 s would be late for the 75 s check: told.
        watches.watch(born, None, secs(5));
        assert!(
            watches.added().now_or_never().is_some(),
            "due before the check: told"
        );
        let five = watches.check_by(born, born + secs(75));
        assert!(
            five <= born + secs(6),
            "check brought forward to the 5-s body: {five:?}"
        );
    }
}
