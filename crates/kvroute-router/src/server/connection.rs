//! One client connection's life: how long it may wait for its first request, how long it may
//! sit idle, and how it ends when the router stops.
//!
//! hyper's own header read timeout covers an HTTP/1 request whose headers trickle in, but not
//! the protocol detection before it (a client that sends nothing, or only `P` of the HTTP/2
//! preface, waits there forever), and HTTP/2 has no idle timeout at all: such connections held
//! a file descriptor and a task each until the process ran out of files. So every connection
//! runs under one deadline kept here, from what its requests do ([`Activity`]): its first
//! request must start within `first_request`; afterwards, with no request in progress (for
//! HTTP/2, no open stream) for `idle`, it is closed. A connection asked to close (idle, or the
//! router stopping) that has nothing in progress is dropped after [`CLOSE_WAIT`] even if the
//! peer never answers the HTTP/2 GOAWAY's ping, so an idle client cannot hold shutdown. A
//! request in progress whose response the client does not take (it stopped reading, or keeps
//! an HTTP/2 window of 0) is no reason to stay open either: see [`super::stall`].

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::server::graceful::GracefulConnection;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::repoll::Repolled;
use super::stall::{Verdict, Watch, Watches, WriteLimits};
use crate::metrics::Metrics;

/// How long a connection asked to close (idle or shutdown) with nothing in progress may take
/// to go (HTTP/2's GOAWAY waits for a ping answer) before it is dropped.
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// How long connections get, once the shutdown grace is over, to deliver the error event that
/// ends each cut stream before they are dropped.
pub(super) const CUT_FLUSH: Duration = Duration::from_secs(2);

/// How long every response of a connection must have waited on its client before the
/// connection may be evicted at the cap: a client that reads takes a chunk within
/// milliseconds.
const EVICTABLE_WAIT: Duration = Duration::from_secs(1);

/// Deadlines of a connection.
#[derive(Clone, Copy, Debug)]
pub(super) struct Deadlines {
    /// From accept to the first request's headers (covers protocol detection).
    pub(super) first_request: Duration,
    /// With no request in progress.
    pub(super) idle: Duration,
}

/// What a connection's requests are doing, shared by its service, its responses' bodies and
/// the task that drives it.
pub(super) struct Activity {
    born: Instant,
    in_flight: AtomicUsize,
    started: AtomicU64,
    /// Milliseconds from `born` to the moment the last request in progress ended.
    last_end_ms: AtomicU64,
    /// Its responses' waits on the client.
    watches: Watches,
    /// How long the router's own answers may wait on the client (the connection's idle
    /// timeout); proxied responses carry their own [`WriteLimits`].
    write_idle: Duration,
    /// Cancelled when the connection is evicted to make room at the cap.
    evict: CancellationToken,
    /// The client's address: at the cap, the idle connections of the client holding the most
    /// are evicted first.
    peer: std::net::IpAddr,
}

impl Activity {
    /// The activity of a connection from `peer` accepted now, whose router answers may wait on
    /// their client for `write_idle`.
    pub(super) fn new(peer: std::net::IpAddr, write_idle: Duration) -> Arc<Activity> {
        Arc::new(Activity {
            born: Instant::now(),
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            last_end_ms: AtomicU64::new(0),
            watches: Watches::default(),
            write_idle,
            evict: CancellationToken::new(),
            peer: peer.to_canonical(),
        })
    }

    /// The client's address.
    pub(super) fn peer(&self) -> std::net::IpAddr {
        self.peer
    }

    /// Since when the connection has done nothing, if it does nothing now: no request in
    /// progress (since accept or since its last request ended), or only responses that have
    /// waited on their client for at least [`EVICTABLE_WAIT`] (since the latest wait began).
    pub(super) fn idle_since(&self, now: Instant) -> Option<Instant> {
        let in_flight = self.in_flight();
        if in_flight == 0 {
            if self.started.load(Ordering::Acquire) == 0 {
                return Some(self.born);
            }
            let last_end = Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
            return Some(self.born + last_end);
        }
        let since = self.watches.all_waiting_since(self.born, in_flight)?;
        (since + EVICTABLE_WAIT <= now).then_some(since)
    }

    /// Asks the connection to close at once (its place is given to a new one).
    pub(super) fn evict(&self) {
        self.evict.cancel();
    }

    /// Whether the connection was asked to close to make room.
    pub(super) fn is_evicted(&self) -> bool {
        self.evict.is_cancelled()
    }

    /// Resolves when the connection is evicted.
    pub(super) async fn evicted(&self) {
        self.evict.cancelled().await;
    }

    /// Requests in progress: from the request's head to its response's last byte (or drop).
    pub(super) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// When the connection must close if nothing starts before: counted from accept until
    /// the first request, then from the end of the last one.
    fn idle_until(&self, d: Deadlines) -> (Instant, &'static str) {
        if self.started.load(Ordering::Acquire) == 0 {
            return (self.born + d.first_request, "first_request_timeout");
        }
        let last_end = Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
        (self.born + last_end + d.idle, "idle")
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.started.fetch_add(1, Ordering::AcqRel);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(self))
    }
}

/// One request in progress; dropping it ends it.
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let ms = u64::try_from(self.0.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_end_ms.store(ms, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The router's service, counting each request as in progress until its response body is
/// done with.
#[derive(Clone)]
pub(super) struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    /// The client's address, given to each request as axum's `ConnectInfo` (the admin API
    /// opened to loopback clients reads it).
    peer: SocketAddr,
}

impl<S> Tracked<S> {
    pub(super) fn new(inner: S, activity: Arc<Activity>, peer: SocketAddr) -> Tracked<S> {
        Tracked {
            inner,
            activity,
            peer,
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes>,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn call(&self, mut req: Request<Incoming>) -> Self::Future {
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(self.peer));
        let in_flight = self.activity.begin();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            let activity = &in_flight.0;
            let limits = resp.extensions().get::<WriteLimits>().copied();
            let watch = activity
                .watches
                .watch(activity.born, limits, activity.write_idle);
            Ok(resp.map(|inner| TrackedBody {
                inner,
                in_flight,
                watch,
            }))
        })
    }
}

/// A response body that keeps its request in progress until hyper drops it, and tells its
/// connection when it waits on the client ([`super::stall`]).
pub(super) struct TrackedBody<B> {
    inner: B,
    in_flight: InFlight,
    watch: Arc<Watch>,
}

impl<B> Drop for TrackedBody<B> {
    fn drop(&mut self) {
        self.in_flight.0.watches.forget(&self.watch);
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for TrackedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        self.watch.taken();
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            // Handed over: the client's to take before hyper asks for more.
            self.watch.waiting(self.in_flight.0.born);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Counts a connection closed because a response waited on its client too long. Returning
/// drops the connection and with it the response, which ends its upstream request and frees
/// its slot.
fn stalled(metrics: &Metrics) {
    metrics
        .connections
        .closed
        .with_label_values(&["write_stalled"])
        .inc();
}

/// Drives `conn` to its end under `deadlines`; on `stop` asks it to finish what is in progress
/// and close; on `cutoff` (the shutdown grace is over: bodies in progress are ending with an
/// error event) gives it [`CUT_FLUSH`] to deliver that, then drops it.
pub(super) async fn drive<C>(
    conn: C,
    activity: Arc<Activity>,
    deadlines: Deadlines,
    stop: CancellationToken,
    cutoff: CancellationToken,
    metrics: Arc<Metrics>,
) where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    // A request's own wakes of its connection task are polls again, not requeues (`repoll`).
    let mut conn = Repolled::new(Box::pin(conn));
    let (first, _) = activity.idle_until(deadlines);
    let deadline = tokio::time::sleep_until(activity.watches.check_by(activity.born, first));
    tokio::pin!(deadline);
    // Every new deadline is told to the watches: a body added later wakes this task only if
    // it would be overdue before it (see `Watches::watch`).
    let check_by = |at: Instant| activity.watches.check_by(activity.born, at);
    let mut closing = false;
    loop {
        tokio::select! {
            ended = &mut conn => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.cancelled(), if !closing => {
                closing = true;
                conn.inner_mut().as_mut().graceful_shutdown();
                deadline.as_mut().reset(check_by(Instant::now() + CLOSE_WAIT));
            }
            _ = cutoff.cancelled() => {
                let _ = tokio::time::timeout(CUT_FLUSH, &mut conn).await;
                return;
            }
            _ = activity.evicted() => return,
            _ = activity.watches.added() => {
                // A new response: its wait on the client may end before the next check.
                match activity.watches.check(activity.born, Instant::now()) {
                    Verdict::Stalled => return stalled(&metrics),
                    Verdict::CheckBy(Some(at)) if at < deadline.deadline() => {
                        deadline.as_mut().reset(check_by(at));
                    }
                    Verdict::CheckBy(_) => {}
                }
            }
            _ = deadline.as_mut() => {
                let now = Instant::now();
                if activity.in_flight() > 0 {
                    let recheck = if closing { CLOSE_WAIT } else { deadlines.idle };
                    match activity.watches.check(activity.born, now) {
                        Verdict::Stalled => return stalled(&metrics),
                        Verdict::CheckBy(at) => {
                            let next = at.map_or(now + recheck, |at| at.min(now + recheck));
                            deadline.as_mut().reset(check_by(next));
                        }
                    }
                    continue;
                }
                if closing {
                    // Asked to close, nothing in progress, and the peer is still there (an
                    // HTTP/2 client that does not answer GOAWAY's ping, or a half-sent
                    // preface): drop it.
                    return;
                }
                let (until, reason) = activity.idle_until(deadlines);
                if until > now {
                    deadline.as_mut().reset(check_by(until));
                    continue;
                }
                metrics.connections.closed.with_label_values(&[reason]).inc();
                closing = true;
                conn.inner_mut().as_mut().graceful_shutdown();
                deadline.as_mut().reset(check_by(now + CLOSE_WAIT));
            }
        }
    }
}
