//! A SUB socket together with the PAIR socket that reads its connection events, torn down in
//! the one order that cannot hang the process.
//!
//! Why this exists: libzmq (4.3) sends socket-monitor events with a *blocking* send from its I/O
//! thread. If the PAIR that reads them is closed while the monitored socket can still raise an
//! event — a publisher that goes away while the SUB is being reaped, say — that send waits
//! forever for a reader, and with it the I/O thread that every subscriber, publisher and replay
//! of the process shares: no KV event is received or published again. A router whose workers
//! come and go (Kubernetes replacing pods) hit it; the integration suite did, about one run in
//! two. So the monitor is switched off (events mask 0, on a fresh endpoint, which closes the
//! old monitor socket without sending anything) before either socket is dropped.

use std::sync::atomic::{AtomicU64, Ordering};

use super::contexts::ContextLease;

/// Distinct inproc names for socket monitors in this process.
static MONITORS: AtomicU64 = AtomicU64::new(0);

/// A SUB socket whose CONNECTED and DISCONNECTED events are read from [`Self::events`].
pub(super) struct MonitoredSub {
    sub: zmq::Socket,
    events: zmq::Socket,
    /// Where the monitor is moved, with no events, before the sockets are dropped.
    off_endpoint: String,
    /// The context both sockets are in; declared last, so it is given back after they drop.
    lease: ContextLease,
}

impl MonitoredSub {
    /// A SUB socket (linger 0, unbounded receive queue, subscribed to `topic`) with its
    /// connection events readable on a PAIR socket. Not connected yet.
    pub(super) fn new(topic: &[u8]) -> Result<MonitoredSub, zmq::Error> {
        match Self::new_in(ContextLease::take(), topic) {
            // The context's sockets of dropped subscribers are not reaped yet.
            Err(zmq::Error::EMFILE) => Self::new_in(ContextLease::fresh(), topic),
            made => made,
        }
    }

    fn new_in(lease: ContextLease, topic: &[u8]) -> Result<MonitoredSub, zmq::Error> {
        let sub = lease.context().socket(zmq::SUB)?;
        sub.set_linger(0)?;
        // The default high-water mark (1,000) silently drops bursts.
        sub.set_rcvhwm(0)?;
        sub.set_subscribe(topic)?;
        let n = MONITORS.fetch_add(1, Ordering::Relaxed);
        let endpoint = format!("inproc://kv-sub-monitor-{n}");
        // A dropped TCP connection is the only sign of a publisher restart whose new sequence
        // numbers happen to continue the old ones; a connection is when to ask for the replay
        // that warms the worker.
        let mask = zmq::SocketEvent::DISCONNECTED.to_raw() | zmq::SocketEvent::CONNECTED.to_raw();
        sub.monitor(&endpoint, i32::from(mask))?;
        let events = lease.context().socket(zmq::PAIR)?;
        events.set_linger(0)?;
        events.connect(&endpoint)?;
        Ok(MonitoredSub {
            sub,
            events,
            off_endpoint: format!("inproc://kv-sub-monitor-{n}-off"),
            lease,
        })
    }

    /// The SUB socket.
    pub(super) fn sub(&self) -> &zmq::Socket {
        &self.sub
    }

    /// The context its sockets are in, where its replays' sockets are made too.
    pub(super) fn context(&self) -> &zmq::Context {
        self.lease.context()
    }

    /// The PAIR socket its connection events arrive on.
    pub(super) fn events(&self) -> &zmq::Socket {
        &self.events
    }
}

impl Drop for MonitoredSub {
    fn drop(&mut self) {
        // libzmq closes the current monitor socket before it starts the new one, and sends
        // nothing for an event mask of 0. If this fails (the context is terminating), no event
        // can be sent either.
        if let Err(e) = self.sub.monitor(&self.off_endpoint, 0) {
            tracing::debug!(error = %e, "kv-events monitor not switched off");
        }
        // Fields drop after this: the SUB, then the PAIR.
    }
}
