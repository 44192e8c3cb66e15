//! One engine's event stream: a ZMQ SUB read by one of a few intake threads shared by every
//! subscription ([`super::intake`]), sequence tracking, replay, and decoded batches handed to
//! the async world through a tokio channel.
//!
//! Why threads and the blocking `zmq` crate: libzmq's SUB reconnects every 100 ms on its own,
//! also to a publisher that starts later or restarts, which the pure-Rust async `zeromq` crate
//! does not (see ARCHITECTURE.md). An intake thread polls its subscriptions' sockets together
//! with a timeout, so it notices a closed channel promptly.
//!
//! On connecting to a publisher (router start, worker added, reconnection after an engine
//! restart) the subscriber asks the replay socket for everything the engine still buffers, so
//! an idle engine's cache is known without waiting for its next event; live batches that arrive
//! meanwhile are held and applied after the replay, duplicates dropped by sequence number (the
//! thread's logic is in [`super::stream`]).
//!
//! What the consumer (the index) must do with each [`SubscriberEvent`]:
//! - `Batch`: apply it; batches arrive in sequence order, each once.
//! - `Warming` … `Warmed`: the warm-up replay runs; the worker's entries are a lower bound.
//! - `Reset`: the engine restarted; drop every entry of this worker, then apply what follows.
//! - `Dropped`: batches were lost for good; drop every entry of this worker (stale entries are
//!   worse than none), then apply what follows.
//! - `Undecodable`: a batch arrived but cannot be read, so it is lost too: drop every entry of
//!   this worker. (Replaying it would return the same bytes.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use thiserror::Error;
use tokio::sync::mpsc;

use super::intake::{self, Placed, Subscription};
use super::monitored::MonitoredSub;
use super::stream::Stream;
use super::subscription::{SubscriberConfig, SubscriberStats, WorkerEvent};

/// Failure to start a subscriber.
#[derive(Debug, Error)]
pub enum SubscriberError {
    /// Socket creation or connect failed (a malformed endpoint, typically).
    #[error("cannot subscribe to {endpoint}: {source}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The ZeroMQ error.
        source: zmq::Error,
    },
    /// The OS refused to start an intake thread.
    #[error("cannot start a kv-events intake thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Starts subscribers.
pub struct Subscriber;

impl Subscriber {
    /// Connects to `config.endpoint` and gives the subscription to an intake thread, which
    /// sends to `tx` until the handle is dropped or `tx`'s receiver is closed. Connecting
    /// succeeds even if the engine is not up yet; ZeroMQ keeps retrying.
    pub fn spawn(
        config: SubscriberConfig,
        tx: mpsc::Sender<WorkerEvent>,
    ) -> Result<SubscriberHandle, SubscriberError> {
        let connect_err = |source| SubscriberError::Connect {
            endpoint: config.endpoint.clone(),
            source,
        };
        let socket = MonitoredSub::new(config.topic.as_bytes()).map_err(connect_err)?;
        socket
            .sub()
            .connect(&config.endpoint)
            .map_err(connect_err)?;

        let stats = Arc::new(SubscriberStats::default());
        let finished = Arc::new(AtomicBool::new(false));
        let per_thread = config.engines_per_intake;
        let context = socket.context().clone();
        let subscription = Subscription {
            id: intake::next_id(),
            socket,
            stream: Stream::new(config, tx, stats.clone(), context),
            finished: finished.clone(),
        };
        let placed = intake::add(subscription, per_thread)?;
        Ok(SubscriberHandle {
            stats,
            finished,
            _placed: placed,
        })
    }
}

/// Owns a running subscription; dropping it removes the subscription from its intake thread
/// and waits until the thread has let go of it (one wake-up of that thread).
pub struct SubscriberHandle {
    stats: Arc<SubscriberStats>,
    finished: Arc<AtomicBool>,
    _placed: Placed,
}

impl SubscriberHandle {
    /// The subscriber's counters.
    pub fn stats(&self) -> &Arc<SubscriberStats> {
        &self.stats
    }

    /// Whether the subscription has ended (its channel closed, typically).
    pub fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Relaxed)
    }
}
