//! One engine's event stream: a ZMQ SUB on its own thread, sequence tracking, replay, and
//! decoded batches handed to the async world through a tokio channel.
//!
//! Why a thread and the blocking `zmq` crate: libzmq's SUB reconnects every 100 ms on its own,
//! also to a publisher that starts later or restarts, which the pure-Rust async `zeromq` crate
//! does not (see ARCHITECTURE.md). The thread polls with a timeout so it notices a stop request
//! or a closed channel promptly.
//!
//! What the consumer (the index) must do with each [`SubscriberEvent`]:
//! - `Batch`: apply it; batches arrive in sequence order, each once.
//! - `Reset`: the engine restarted; drop every entry of this worker, then apply what follows.
//! - `Dropped`: batches were lost for good; drop every entry of this worker (stale entries are
//!   worse than none), then apply what follows.
//! - `Undecodable`: counted; nothing to apply.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::decode::{DecodeError, decode_batch};
use super::replay::{self, Replayed};
use super::sequence::{Arrival, SequenceTracker};
use super::wire::{EventBatch, KvEvent};

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
}

impl SubscriberConfig {
    /// A config with defaults: every topic, 50 ms poll, 1 s replay timeout.
    pub fn new(worker: impl Into<Arc<str>>, endpoint: impl Into<String>) -> Self {
        SubscriberConfig {
            worker: worker.into(),
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            poll_interval: Duration::from_millis(50),
            replay_timeout: Duration::from_secs(1),
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
    /// A payload that no known layout decodes; skipped.
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
    /// `Dropped` messages sent (the worker's entries must be cleared).
    pub dropped: AtomicU64,
    /// Connections to the publisher that dropped.
    pub disconnects: AtomicU64,
}

/// Distinct inproc names for socket monitors in this process.
static MONITORS: AtomicU64 = AtomicU64::new(0);

fn bump(counter: &AtomicU64, n: u64) {
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
        sub.monitor(
            &monitor_endpoint,
            zmq::SocketEvent::DISCONNECTED.to_raw() as i32,
        )
        .map_err(connect_err)?;
        let monitor = zmq_context().socket(zmq::PAIR).map_err(connect_err)?;
        monitor.set_linger(0).map_err(connect_err)?;
        monitor.connect(&monitor_endpoint).map_err(connect_err)?;
        sub.connect(&config.endpoint).map_err(connect_err)?;

        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SubscriberStats::default());
        let mut worker = Worker {
            config,
            tx,
            stop: stop.clone(),
            stats: stats.clone(),
            tracker: SequenceTracker::default(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("kv-sub-{}", worker.config.worker))
            .spawn(move || worker.run(sub, monitor))?;
        Ok(SubscriberHandle {
            stop,
            stats,
            thread: Some(thread),
        })
    }
}

/// Owns a running subscriber; dropping it stops the thread and waits for it (at most about
/// one poll interval, or one replay timeout if a replay is in flight).
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

/// State of the subscriber thread.
struct Worker {
    config: SubscriberConfig,
    tx: mpsc::Sender<WorkerEvent>,
    stop: Arc<AtomicBool>,
    stats: Arc<SubscriberStats>,
    tracker: SequenceTracker,
}

/// The consumer is gone or a stop was requested: end the thread.
struct Closed;

impl Worker {
    fn run(&mut self, sub: zmq::Socket, monitor: zmq::Socket) {
        let timeout = self.config.poll_interval.as_millis().max(1) as i64;
        while !self.stop.load(Ordering::Relaxed) && !self.tx.is_closed() {
            let mut items = [
                sub.as_poll_item(zmq::POLLIN),
                monitor.as_poll_item(zmq::POLLIN),
            ];
            match zmq::poll(&mut items, timeout) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(worker = %self.config.worker, error = %e, "kv-events poll failed");
                    std::thread::sleep(self.config.poll_interval);
                    continue;
                }
            }
            let (data, disconnected) = (items[0].is_readable(), items[1].is_readable());
            // Drain what is queued before the disconnect, then handle it.
            if data {
                while let Ok(frames) = sub.recv_multipart(zmq::DONTWAIT) {
                    if self.on_message(frames).is_err() {
                        return;
                    }
                }
            }
            if disconnected {
                while monitor.recv_multipart(zmq::DONTWAIT).is_ok() {}
                if self.on_disconnect().is_err() {
                    return;
                }
            }
        }
    }

    /// The publisher went away: forget its sequence and tell the consumer to clear.
    fn on_disconnect(&mut self) -> Result<(), Closed> {
        bump(&self.stats.disconnects, 1);
        tracing::info!(worker = %self.config.worker, "kv-events publisher disconnected; clearing worker");
        self.tracker = SequenceTracker::default();
        self.send(SubscriberEvent::Disconnected)
    }

    fn on_message(&mut self, frames: Vec<Vec<u8>>) -> Result<(), Closed> {
        let [_topic, seq, payload]: [Vec<u8>; 3] = match frames.try_into() {
            Ok(frames) => frames,
            Err(_) => {
                bump(&self.stats.malformed_messages, 1);
                return Ok(());
            }
        };
        let Ok(seq) = <[u8; 8]>::try_from(seq) else {
            bump(&self.stats.malformed_messages, 1);
            return Ok(());
        };
        let seq = u64::from_be_bytes(seq);
        match self.tracker.observe(seq) {
            Arrival::InOrder => {}
            Arrival::Joined => self.catch_up(seq)?,
            Arrival::Gap { from } => {
                bump(&self.stats.gaps, 1);
                self.fill_gap(from, seq)?;
            }
            Arrival::Restart { last } => {
                bump(&self.stats.restarts, 1);
                tracing::info!(worker = %self.config.worker, last, seq, "kv-events publisher restarted");
                self.send(SubscriberEvent::Reset {
                    last_seq: last,
                    seq,
                })?;
                self.catch_up(seq)?;
            }
        }
        self.deliver(seq, &payload)
    }

    /// Best effort: replay whatever the publisher still buffers before `seq`. Any contiguous
    /// run ending just before `seq` is safe to apply on top of nothing.
    fn catch_up(&mut self, seq: u64) -> Result<(), Closed> {
        if seq == 0 {
            return Ok(());
        }
        let Some(got) = self.replay(0, seq) else {
            return Ok(());
        };
        let tail = replay::tail_ending_at(&got, seq);
        self.count_replay(tail.len() == got.len());
        for r in tail {
            self.deliver(r.seq, &r.payload)?;
        }
        Ok(())
    }

    /// Replays `from..seq`, or tells the consumer to clear the worker.
    fn fill_gap(&mut self, from: u64, seq: u64) -> Result<(), Closed> {
        let reason = match self.config.replay_endpoint {
            None => DropReason::NoReplayEndpoint,
            Some(_) => match self.replay(from, seq) {
                Some(got) if replay::covers(&got, from, seq) => {
                    self.count_replay(true);
                    for r in &got {
                        self.deliver(r.seq, &r.payload)?;
                    }
                    return Ok(());
                }
                Some(got) => {
                    self.count_replay(false);
                    DropReason::ReplayFailed(format!(
                        "replay returned {} of {} batches",
                        got.len(),
                        seq - from
                    ))
                }
                None => DropReason::ReplayFailed("replay request failed".into()),
            },
        };
        tracing::warn!(worker = %self.config.worker, from, to = seq, ?reason, "kv-events lost; clearing worker");
        bump(&self.stats.dropped, 1);
        self.send(SubscriberEvent::Dropped {
            from,
            to: seq,
            reason,
        })
    }

    /// Runs one replay request; `None` (counted as a failed replay) if it did not complete.
    fn replay(&self, from: u64, until: u64) -> Option<Vec<Replayed>> {
        let endpoint = self.config.replay_endpoint.as_deref()?;
        let result = replay::fetch(
            zmq_context(),
            endpoint,
            from,
            until,
            self.config.replay_timeout,
            &self.stop,
        );
        result
            .inspect_err(|e| {
                tracing::warn!(worker = %self.config.worker, endpoint, error = %e, "kv-events replay failed");
                bump(&self.stats.replays_failed, 1);
            })
            .ok()
    }

    fn count_replay(&self, ok: bool) {
        let counter = match ok {
            true => &self.stats.replays_ok,
            false => &self.stats.replays_failed,
        };
        bump(counter, 1);
    }

    fn deliver(&mut self, seq: u64, payload: &[u8]) -> Result<(), Closed> {
        let event = match decode_batch(payload) {
            Ok(batch) => {
                let unknown = batch
                    .events
                    .iter()
                    .filter(|e| matches!(e, KvEvent::Unknown(_)))
                    .count();
                bump(&self.stats.batches, 1);
                bump(&self.stats.events, batch.events.len() as u64);
                bump(&self.stats.unknown_events, unknown as u64);
                SubscriberEvent::Batch { seq, batch }
            }
            Err(error) => {
                bump(&self.stats.undecodable, 1);
                tracing::debug!(worker = %self.config.worker, seq, %error, "undecodable kv-events payload");
                SubscriberEvent::Undecodable { seq, error }
            }
        };
        self.send(event)
    }

    /// Sends without blocking the thread forever: while the channel is full, retries briefly
    /// and keeps checking for a stop request.
    fn send(&self, event: SubscriberEvent) -> Result<(), Closed> {
        let mut msg = WorkerEvent {
            worker: self.config.worker.clone(),
            event,
        };
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Closed(_)) => return Err(Closed),
                Err(TrySendError::Full(back)) => {
                    if self.stop.load(Ordering::Relaxed) {
                        return Err(Closed);
                    }
                    msg = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }
}
