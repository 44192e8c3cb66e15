//! A connection's hyper future, polled again at once when it wakes itself.
//!
//! hyper polls a request's handler inside the connection's own task (HTTP/1), so the request
//! body's hand-over is a wake of the task that is running: the dispatcher's `try_send_data`
//! wakes the handler reading the body, and the handler's read wakes the dispatcher. Tokio
//! answers a task woken while it runs by requeueing it behind the other tasks and waking a
//! parked worker thread to take them — an OS context switch on every request, and often the
//! request moving to the other core (`scripts/wakeups-per-request.sh` counted ~1.3 such
//! self-wakes per small request). [`Repolled`] gives the inner future a waker of its own: a
//! wake that comes while the inner future is being polled only marks it, and the inner future
//! is polled again before this poll returns; any other wake goes to the task as before.
//! `kvroute epp` runs each ext_proc conversation the same way (its body chunks are handed
//! between two futures of one task).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Most polls of the inner future in one poll of [`Repolled`]: past it, the wake goes to the
/// task (requeued behind the others), so a future that keeps waking itself cannot hold the
/// worker thread.
const MOST_REPOLLS: usize = 16;

/// Not being polled: a wake goes to the task.
const IDLE: u8 = 0;
/// Being polled, not woken yet.
const POLLING: u8 = 1;
/// Woken while being polled: poll again.
const WOKEN: u8 = 2;

/// The waker the inner future sees.
#[derive(Debug, Default)]
struct Relay {
    state: AtomicU8,
    task: AtomicWaker,
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // While the inner future is polled, the poll loop sees the mark and polls again.
        if self
            .state
            .compare_exchange(POLLING, WOKEN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return;
        }
        self.task.wake();
    }
}

/// `inner`, polled again within the same poll when it wakes itself (see the module's doc).
/// `F` is `Unpin` (a boxed future: pinned without `unsafe`).
pub(crate) struct Repolled<F> {
    inner: F,
    relay: Arc<Relay>,
    waker: Waker,
}

impl<F> Repolled<F> {
    pub(crate) fn new(inner: F) -> Repolled<F> {
        let relay = Arc::new(Relay::default());
        let waker = Waker::from(Arc::clone(&relay));
        Repolled {
            inner,
            relay,
            waker,
        }
    }

    /// The inner future (hyper's graceful shutdown is asked of the connection itself).
    pub(crate) fn inner_mut(&mut self) -> &mut F {
        &mut self.inner
    }
}

impl<F: Future + Unpin> Future for Repolled<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.relay.task.register(cx.waker());
        let (relay, waker) = (Arc::clone(&self.relay), self.waker.clone());
        let mut inner_cx = Context::from_waker(&waker);
        for _ in 0..MOST_REPOLLS {
            relay.state.store(POLLING, Ordering::Release);
            if let Poll::Ready(out) = Pin::new(&mut self.inner).poll(&mut inner_cx) {
                relay.state.store(IDLE, Ordering::Release);
                return Poll::Ready(out);
            }
            if relay.state.swap(IDLE, Ordering::AcqRel) != WOKEN {
                return Poll::Pending;
            }
        }
        // Woken on every poll: yield to the task's other work, as tokio would.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes the task gets.
    #[derive(Default)]
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself on each of its first `n` polls, then is ready with its poll count.
    struct SelfWaking {
        polls: usize,
        n: usize,
    }

    impl Future for SelfWaking {
        type Output = usize;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.polls > self.n {
                return Poll::Ready(self.polls);
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    #[test]
    fn a_self_wake_is_a_poll_again_not_a_wake_of_the_task() {
        let task = Arc::new(Counted::default());
        let waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(Repolled::new(SelfWaking { polls: 0, n: 3 }));
        assert_eq!(f.as_mut().poll(&mut cx), Poll::Ready(4));
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_to_the_task() {
        let task = Arc::new(Counted::default());
        let waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(Repolled::new(SelfWaking {
            polls: 0,
            n: usize::MAX
        }));
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(f.inner.polls, MOST_REPOLLS);
        assert_eq!(
            task.0.load(Ordering::SeqCst),
            1,
            "woken once to be polled again"
        );
    }

    #[test]
    fn a_wake_after_the_poll_reaches_the_task() {
        /// Pending once, keeping its waker; then ready.
        struct Later(Option<Waker>);
        impl Future for Later {
            type Output = ();
            fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                match self.0 {
                    Some(_) => Poll::Ready(()),
                    None => {
                        self.0 = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }
            }
        }
        let task = Arc::new(Counted::default());
        let waker = Waker::from(Arc::clone(&task));
        let mut cx = Context::from_waker(&waker);
        let mut f = std::pin::pin!(Repolled::new(Later(None)));
        assert!(f.as_mut().poll(&mut cx).is_pending());
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
        let kept = f.inner.0.clone().expect("the inner future kept its waker");
        kept.wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
        assert_eq!(f.as_mut().poll(&mut cx), Poll::Ready(()));
    }
}
