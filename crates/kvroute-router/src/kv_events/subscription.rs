//! What one engine's subscription is: its settings ([`SubscriberConfig`]), what it tells the
//! consumer ([`SubscriberEvent`] in a [`WorkerEvent`]) and what it counts
//! ([`SubscriberStats`]). Kept apart from the stream's logic ([`super::stream`]) and from
//! starting it ([`super::subscriber`]), so both use these types without importing each other.
//! See [`super::subscriber`] for what the consumer must do with each event.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::decode::DecodeError;
use super::replay::{ReplayError, ReplayLimits};
use super::wire::EventBatch;

/// The process-wide ZeroMQ context of publishers (subscribers spread over the contexts of
/// `super::contexts`, since one holds at most 1,023 sockets). Never terminated, so dropping a
/// socket never waits on another's queued messages.
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
    /// Longest its intake thread sleeps without a message (replay deadlines and a closed
    /// channel are noticed within it).
    pub poll_interval: Duration,
    /// How long a replay waits for each reply before giving up.
    pub replay_timeout: Duration,
    /// Bounds of one replay (replies, bytes, total time).
    pub replay_limits: ReplayLimits,
    /// The data-parallel rank this stream belongs to, when the worker has several: a batch
    /// naming another rank (`data_parallel_rank`, SGLang's `attn_dp_rank`) was published by
    /// another cache, and its consumer leaves it out. `None` takes every batch (a worker
    /// without data parallelism, or one rank of an externally balanced server configured as a
    /// worker of its own, whose batches name its rank in the whole server).
    pub dp_rank: Option<u32>,
    /// Subscriptions an intake thread takes before another thread is started for this one
    /// ([`super::DEFAULT_ENGINES_PER_INTAKE`] unless set).
    pub engines_per_intake: usize,
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
            dp_rank: None,
            engines_per_intake: super::intake_plan::DEFAULT_ENGINES_PER_INTAKE,
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
    /// `BlockStored` events left out because their block size is not the model's (counted
    /// by the worker's index feed, `index::feed`).
    pub block_size_mismatch: AtomicU64,
    /// Batches left out because they name another data-parallel rank than the stream's
    /// (counted by the index feed).
    pub dp_rank_mismatch: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}
