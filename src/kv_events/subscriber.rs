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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::mpsc;

use super::decode::DecodeError;
use super::replay::{ReplayError, ReplayLimits};
use super::stream::Stream;
use super::wire::EventBatch;

/// The process-wide ZeroMQ context: one I/O thread serves every subscriber and publisher.
/// Never terminated, so dropping a socket never waits on another's queued messages.
pub(crate) fn zmq_context() -> &'static zmq::Context {
    static CONTEXT: OnceLock<zmq::Context> = OnceLock::new();
    CONTEXT.get_or_init(zmq::Context::new)
}

/// Where and how to subscribe to one engine.
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    /// A label for this worker, copied into every message (e.g. the worker id).
    pub worker: Arc<str>,
    /// The engine's PUB endpoint, e.g. `tcp://10.0.0.5:5557`.
    pub endpoint: String,
    /// The engine's replay ROUTER endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to; empty receives every topic.
    pub topic: String,
    /// How long the thread waits for a message before checking whether to stop.
    pub poll_interval: Duration,
    /// How long a replay waits for each reply before giving up.
    pub replay_timeout: Duration,
    /// Bounds of one replay (replies, bytes, total time).
    pub replay_limits: ReplayLimits,
}

impl SubscriberConfig {
    /// A config with defaults: every topic, 50 ms poll, 1 s replay timeout, default
    /// [`ReplayLimits`].
    pub fn new(worker: impl Into<Arc<str>>, endpoint: impl Into<String>) -> Self {
        SubscriberConfig {
            worker: worker.into(),
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            poll_interval: Duration::from_millis(50),
            replay_timeout: Duration::from_secs(1),
            replay_limits: ReplayLimits::default(),
        }
    }

    /// Sets the replay endpoint.
    pub fn with_replay(mut self, endpoint: impl Into<String>) -> Self {
        self.replay_endpoint = Some(endpoint.into());
        self
    }
}

/// Why batches were lost without recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// The worker has no replay endpoint configured.
    NoReplayEndpoint,
    /// The replay request failed or returned an incomplete run.
    ReplayFailed(String),
}

/// What the subscriber tells its consumer about one engine's stream.
#[derive(Debug, Clone, PartialEq)]
pub enum SubscriberEvent {
    /// A decoded batch, in sequence order.
    Batch {
        /// The publisher's sequence number.
        seq: u64,
        /// The decoded events.
        batch: EventBatch,
    },
    /// The publisher restarted (its sequence went from `last_seq` back to `seq`): clear this
    /// worker's entries. Replayed and live batches of the new publisher follow.
    Reset {
        /// The last number from the previous publisher.
        last_seq: u64,
        /// The first number seen from the new one.
        seq: u64,
    },
    /// The connection to the publisher dropped. Whatever comes next may be a new process
    /// whose sequence numbers happen to continue the old ones, so the stream cannot be
    /// trusted: clear this worker's entries. On reconnection the subscriber replays what the
    /// publisher still buffers, then follows live batches.
    Disconnected,
    /// Batches `from..to` are lost: clear this worker's entries. Batches from `to` follow.
    Dropped {
        /// First lost sequence number.
        from: u64,
        /// First number after the loss.
        to: u64,
        /// Why they could not be replayed.
        reason: DropReason,
    },
    /// The warm-up replay started (on connecting to a publisher with a replay endpoint, or at
    /// the first live batch after it): the worker's entries are a lower bound until `Warmed`.
    Warming,
    /// The warm-up replay ended; the batches it returned were sent before this.
    Warmed {
        /// How many batches it delivered, or why it failed or was abandoned.
        result: Result<usize, ReplayError>,
    },
    /// A payload that no known layout decodes: the batch is lost, clear this worker's entries.
    Undecodable {
        /// Its sequence number.
        seq: u64,
        /// What was wrong with it.
        error: DecodeError,
    },
}

/// A [`SubscriberEvent`] with the worker it concerns, so one channel can serve many workers.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerEvent {
    /// [`SubscriberConfig::worker`].
    pub worker: Arc<str>,
    /// What happened.
    pub event: SubscriberEvent,
}

/// Counters of one subscriber, readable while it runs (for metrics).
#[derive(Debug, Default)]
pub struct SubscriberStats {
    /// Batches decoded and delivered (live or replayed).
    pub batches: AtomicU64,
    /// Events in those batches.
    pub events: AtomicU64,
    /// Events of a type this release does not know.
    pub unknown_events: AtomicU64,
    /// Payloads that did not decode.
    pub undecodable: AtomicU64,
    /// ZMQ messages without the three documented frames.
    pub malformed_messages: AtomicU64,
    /// Sequence gaps seen.
    pub gaps: AtomicU64,
    /// Publisher restarts seen.
    pub restarts: AtomicU64,
    /// Replays that returned what was asked.
    pub replays_ok: AtomicU64,
    /// Replays that failed or came back incomplete.
    pub replays_failed: AtomicU64,
    /// Replays abandoned at a bound of [`ReplayLimits`] (also counted in `replays_failed`).
    pub replays_abandoned: AtomicU64,
    /// Replayed or live batches dropped because their number was already delivered.
    pub duplicates: AtomicU64,
    /// `Dropped` messages sent (the worker's entries must be cleared).
    pub dropped: AtomicU64,
    /// Connections to the publisher that dropped.
    pub disconnects: AtomicU64,
}

/// Distinct inproc names for socket monitors in this process.
static MONITORS: AtomicU64 = AtomicU64::new(0);

pub(super) fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

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
        let sub = zmq_context().socket(zmq::SUB).map_err(connect_err)?;
        sub.set_linger(0).map_err(connect_err)?;
        // The default high-water mark (1,000) silently drops bursts.
        sub.set_rcvhwm(0).map_err(connect_err)?;
        sub.set_subscribe(config.topic.as_bytes())
            .map_err(connect_err)?;
        // A dropped TCP connection is the only sign of a publisher restart whose new sequence
        // numbers happen to continue the old ones; watch for it.
        let monitor_endpoint = format!(
            "inproc://kv-sub-monitor-{}",
            MONITORS.fetch_add(1, Ordering::Relaxed)
        );
        // A connection is when to ask for the replay that warms the worker.
        let events = zmq::SocketEvent::DISCONNECTED.to_raw() | zmq::SocketEvent::CONNECTED.to_raw();
        sub.monitor(&monitor_endpoint, i32::from(events))
            .map_err(connect_err)?;
        let monitor = zmq_context().socket(zmq::PAIR).map_err(connect_err)?;
        monitor.set_linger(0).map_err(connect_err)?;
        monitor.connect(&monitor_endpoint).map_err(connect_err)?;
        sub.connect(&config.endpoint).map_err(connect_err)?;

        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SubscriberStats::default());
        let name = format!("kv-sub-{}", config.worker);
        let mut stream = Stream::new(config, tx, stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || stream.run(sub, monitor))?;
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
