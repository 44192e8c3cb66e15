//! One engine's event stream: a ZMQ SUB on its own thread, sequence tracking, replay, and
//! decoded batches handed to the async world through a tokio channel.
//!
//! Why a thread and the blocking `zmq` crate: libzmq's SUB reconnects every 100 ms on its own,
//! also to a publisher that starts later or restarts, which the pure-Rust async `zeromq` crate
//! does not (see ARCHITECTURE.md). The thread polls with a timeout so it notices a stop request
//! or a closed channel promptly.
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
use std::thread::JoinHandle;

use thiserror::Error;
use tokio::sync::mpsc;

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
    /// The OS refused to start a thread.
    #[error("cannot start subscriber thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Starts subscribers.
pub struct Subscriber;

impl Subscriber {
    /// Connects to `config.endpoint` and starts the subscriber thread, which sends to `tx`
    /// until the handle is dropped or `tx`'s receiver is closed. Connecting succeeds even if
    /// the engine is not up yet; ZeroMQ keeps retrying.
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

        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SubscriberStats::default());
        let name = format!("kv-sub-{}", config.worker);
        let context = socket.context().clone();
        let mut stream = Stream::new(config, tx, stop.clone(), stats.clone(), context);
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || stream.run(&socket))?;
        Ok(SubscriberHandle {
            stop,
            stats,
            thread: Some(thread),
        })
    }
}

/// Owns a running subscriber; dropping it stops the thread and waits for it (about one poll
/// interval: a replay in flight is polled, never waited on).
pub struct SubscriberHandle {
    stop: Arc<AtomicBool>,
    stats: Arc<SubscriberStats>,
    thread: Option<JoinHandle<()>>,
}

impl SubscriberHandle {
    /// The subscriber's counters.
    pub fn stats(&self) -> &Arc<SubscriberStats> {
        &self.stats
    }

    /// Whether the thread has exited (its channel closed, typically).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for SubscriberHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
