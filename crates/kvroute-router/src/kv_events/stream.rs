//! The subscriber thread's logic for one engine's stream: sequence numbers, replays, and the
//! live batches held while a replay runs.
//!
//! Rules, in the order they matter:
//! - Nothing from a replay or the live socket is delivered twice or out of order: while a
//!   replay runs, live batches are held (bounded with the replay, [`ReplayLimits`]); after it,
//!   they are offered again as if they arrived then, and any whose number the replay already
//!   delivered is dropped as a duplicate (not mistaken for a publisher restart).
//! - A warm-up replay (from 0, the oldest batch the publisher retains) runs when the socket
//!   connects and no batch has been delivered on this connection, or at the first live batch
//!   if none ran. The worker's entries are empty then, so any contiguous run ending where the
//!   live stream continues is safe to apply: what is missing makes the index a lower bound.
//! - A gap replay fills `from..first held`; if it cannot, the loss is declared (`Dropped`) and
//!   the consumer clears the worker.
//! - A replay that fails or reaches a bound is not retried for [`REPLAY_BACKOFF`] (a reconnect
//!   ends the pause), so a broken or endless peer cannot keep the live batches held.
//! - The replay socket is polled with the live socket, never waited on: a replay never holds
//!   the thread.
//! - Nothing waits on the consumer: what its channel has no room for waits in the stream's
//!   outbox, and while it does the live socket is not read (ZeroMQ queues for it, its receive
//!   high-water mark is unbounded). The intake thread serves other engines meanwhile.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::decode::decode_batch;
use super::monitored::MonitoredSub;
use super::replay::{self, ReplayBound, ReplayError, ReplayRun, Replayed};
use super::sequence::{Arrival, SequenceTracker};
use super::subscription::{
    DropReason, SubscriberConfig, SubscriberEvent, SubscriberStats, WorkerEvent, bump,
};
use super::wire::KvEvent;

/// How long replays pause after one failed or was abandoned.
pub(super) const REPLAY_BACKOFF: Duration = Duration::from_secs(10);

/// What a replay in flight is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// Warm an empty worker with everything the publisher still buffers.
    Warm,
    /// Fill the gap from `from` to the first held batch.
    Gap { from: u64 },
}

/// A replay in flight and the live batches held meanwhile.
struct Replaying {
    run: ReplayRun,
    purpose: Purpose,
    started: Instant,
    held: Vec<(u64, Vec<u8>)>,
    held_bytes: usize,
}

/// The consumer is gone: end the subscription.
pub(super) struct Closed;

/// State of one engine's stream.
pub(super) struct Stream {
    config: SubscriberConfig,
    tx: mpsc::Sender<WorkerEvent>,
    /// Events the channel had no room for yet, oldest first.
    outbox: VecDeque<WorkerEvent>,
    stats: Arc<SubscriberStats>,
    tracker: SequenceTracker,
    replaying: Option<Replaying>,
    /// No replay is started before this instant (after a failed or abandoned one).
    backoff_until: Option<Instant>,
    /// Numbers the last replay delivered: a live copy of one is a duplicate.
    delivered_by_replay: Option<Range<u64>>,
    /// The context of the subscriber's sockets, where replay sockets are made.
    context: zmq::Context,
}

impl Stream {
    pub(super) fn new(
        config: SubscriberConfig,
        tx: mpsc::Sender<WorkerEvent>,
        stats: Arc<SubscriberStats>,
        context: zmq::Context,
    ) -> Stream {
        Stream {
            config,
            tx,
            outbox: VecDeque::new(),
            stats,
            tracker: SequenceTracker::default(),
            replaying: None,
            backoff_until: None,
            delivered_by_replay: None,
            context,
        }
    }

    /// Whether the consumer is gone (its receiver dropped): the subscription ends.
    pub(super) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Whether events wait for room in the consumer's channel: the live socket is not read
    /// meanwhile.
    pub(super) fn is_backlogged(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// The DEALER of the replay in flight, to poll with the live socket.
    pub(super) fn replay_socket(&self) -> Option<&zmq::Socket> {
        self.replaying.as_ref().map(|r| r.run.socket())
    }

    /// How long the thread may sleep before this stream needs it (replay deadlines, a
    /// backlog to offer again).
    pub(super) fn poll_interval(&self) -> Duration {
        self.config.poll_interval
    }

    /// One wake-up of the intake thread for this stream: what waits in the outbox first, then
    /// live batches (queued before any disconnect; not while the consumer is behind), then
    /// replies and replay deadlines, then connection events. `data` and `events` say whether
    /// the SUB socket and the monitor were readable.
    pub(super) fn step(
        &mut self,
        socket: &MonitoredSub,
        data: bool,
        events: bool,
    ) -> Result<(), Closed> {
        self.flush()?;
        if data {
            while !self.is_backlogged() {
                match socket.sub().recv_multipart(zmq::DONTWAIT) {
                    Ok(frames) => self.on_message(frames)?,
                    Err(_) => break,
                }
            }
        }
        self.poll_replay()?;
        if events {
            while let Ok(frames) = socket.events().recv_multipart(zmq::DONTWAIT) {
                let raw = frames
                    .first()
                    .and_then(|f| f.get(..2))
                    .map(|b| u16::from_ne_bytes([b[0], b[1]]));
                if raw == Some(zmq::SocketEvent::DISCONNECTED.to_raw()) {
                    self.on_disconnect()?;
                } else if raw == Some(zmq::SocketEvent::CONNECTED.to_raw()) {
                    self.on_connect()?;
                }
            }
        }
        Ok(())
    }

    /// Connected (again): a new publisher process may be there, so replays may run again, and
    /// an empty worker is warmed with what it buffers.
    fn on_connect(&mut self) -> Result<(), Closed> {
        self.backoff_until = None;
        if self.replaying.is_none() && self.tracker.next().is_none() {
            self.begin(Purpose::Warm, Vec::new())?;
        }
        Ok(())
    }

    /// The publisher went away: forget its sequence and tell the consumer to clear.
    fn on_disconnect(&mut self) -> Result<(), Closed> {
        bump(&self.stats.disconnects, 1);
        tracing::info!(worker = %self.config.worker, "kv-events publisher disconnected; clearing worker");
        if let Some(r) = self.replaying.take() {
            // What it held came from the process that went away: the clear below covers it.
            let held = r.held.len();
            bump(&self.stats.replays_failed, 1);
            self.report(
                r.purpose,
                r.started,
                held,
                &Err::<Vec<()>, _>(ReplayError::Disconnected),
            );
            if r.purpose == Purpose::Warm {
                self.send(SubscriberEvent::Warmed {
                    result: Err(ReplayError::Disconnected),
                })?;
            }
        }
        self.tracker = SequenceTracker::default();
        self.delivered_by_replay = None;
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
        self.on_live(u64::from_be_bytes(seq), payload)
    }

    /// One live batch: held while a replay runs, else delivered, replayed around or declared
    /// lost by what its number says.
    fn on_live(&mut self, seq: u64, payload: Vec<u8>) -> Result<(), Closed> {
        let limits = self.config.replay_limits;
        if let Some(r) = &mut self.replaying {
            r.held_bytes += payload.len();
            r.held.push((seq, payload));
            let bound = if r.held.len() > limits.max_batches {
                Some(ReplayBound::Held(limits.max_batches))
            } else if r.held_bytes > limits.max_bytes {
                Some(ReplayBound::Bytes(limits.max_bytes))
            } else {
                None
            };
            return match bound {
                Some(bound) => self.finish(Err(ReplayError::Abandoned(bound))),
                None => Ok(()),
            };
        }
        if let Some(window) = &self.delivered_by_replay {
            if window.contains(&seq) {
                bump(&self.stats.duplicates, 1);
                return Ok(());
            }
            if seq >= window.end {
                self.delivered_by_replay = None;
            }
        }
        match self.tracker.classify(seq) {
            Arrival::InOrder => {}
            Arrival::Joined => {
                if self.may_replay() {
                    return self.begin(Purpose::Warm, vec![(seq, payload)]);
                }
            }
            Arrival::Gap { from } => {
                bump(&self.stats.gaps, 1);
                if self.may_replay() {
                    return self.begin(Purpose::Gap { from }, vec![(seq, payload)]);
                }
                let reason = match self.config.replay_endpoint {
                    None => DropReason::NoReplayEndpoint,
                    Some(_) => DropReason::ReplayFailed("replays paused after a failure".into()),
                };
                self.declare_lost(from, seq, reason)?;
            }
            Arrival::Restart { last } => {
                bump(&self.stats.restarts, 1);
                tracing::info!(worker = %self.config.worker, last, seq, "kv-events publisher restarted");
                self.tracker = SequenceTracker::default();
                self.delivered_by_replay = None;
                self.send(SubscriberEvent::Reset {
                    last_seq: last,
                    seq,
                })?;
                if seq > 0 && self.may_replay() {
                    return self.begin(Purpose::Warm, vec![(seq, payload)]);
                }
            }
        }
        self.tracker.observe(seq);
        self.deliver(seq, &payload)
    }

    fn may_replay(&self) -> bool {
        self.config.replay_endpoint.is_some()
            && self.backoff_until.is_none_or(|t| Instant::now() >= t)
    }

    /// Sends a replay request; `held` are the live batches that wait for it.
    fn begin(&mut self, purpose: Purpose, held: Vec<(u64, Vec<u8>)>) -> Result<(), Closed> {
        let Some(endpoint) = self.config.replay_endpoint.as_deref() else {
            return Ok(());
        };
        let start = match purpose {
            Purpose::Warm => 0,
            Purpose::Gap { from } => from,
        };
        let now = Instant::now();
        let run = ReplayRun::request(
            &self.context,
            endpoint,
            start,
            self.config.replay_limits,
            self.config.replay_timeout,
            now,
        );
        let held_bytes = held.iter().map(|(_, p)| p.len()).sum();
        if purpose == Purpose::Warm {
            self.send(SubscriberEvent::Warming)?;
        }
        match run {
            Ok(run) => {
                self.replaying = Some(Replaying {
                    run,
                    purpose,
                    started: now,
                    held,
                    held_bytes,
                });
                Ok(())
            }
            Err(e) => self.conclude(purpose, now, held, Err(e)),
        }
    }

    /// Reads replies and checks the replay's deadlines.
    fn poll_replay(&mut self) -> Result<(), Closed> {
        let Some(r) = &mut self.replaying else {
            return Ok(());
        };
        match r.run.read(r.held_bytes, Instant::now()) {
            Some(outcome) => self.finish(outcome),
            None => Ok(()),
        }
    }

    /// Ends the replay in flight with `outcome`.
    fn finish(&mut self, outcome: Result<Vec<Replayed>, ReplayError>) -> Result<(), Closed> {
        let Some(r) = self.replaying.take() else {
            return Ok(());
        };
        bump(&self.stats.duplicates, r.run.duplicates());
        self.conclude(r.purpose, r.started, r.held, outcome)
    }

    /// Delivers what a replay returned (or declares the loss), then offers the held batches
    /// again.
    fn conclude(
        &mut self,
        purpose: Purpose,
        started: Instant,
        held: Vec<(u64, Vec<u8>)>,
        outcome: Result<Vec<Replayed>, ReplayError>,
    ) -> Result<(), Closed> {
        let first_held = held.first().map(|(seq, _)| *seq);
        let outcome = outcome.and_then(|got| match purpose {
            // Everything is a lower bound on an empty worker: keep the contiguous tail.
            Purpose::Warm => {
                let end = got.last().map_or(0, |r| r.seq + 1);
                let tail = replay::tail_ending_at(&got, end).len();
                Ok(got[got.len() - tail..].to_vec())
            }
            Purpose::Gap { from } => {
                let until = first_held.unwrap_or(from);
                let run: Vec<Replayed> = got.into_iter().filter(|r| r.seq < until).collect();
                match replay::covers(&run, from, until) {
                    true => Ok(run),
                    false => Err(ReplayError::Incomplete {
                        got: run.len(),
                        wanted: until.saturating_sub(from),
                    }),
                }
            }
        });
        self.report(purpose, started, held.len(), &outcome);
        match &outcome {
            Ok(run) => {
                bump(&self.stats.replays_ok, 1);
                if let (Some(first), Some(last)) = (run.first(), run.last()) {
                    self.delivered_by_replay = Some(first.seq..last.seq + 1);
                    self.tracker.expect(Some(last.seq + 1));
                }
                for r in run {
                    self.deliver(r.seq, &r.payload)?;
                }
            }
            Err(e) => {
                bump(&self.stats.replays_failed, 1);
                if matches!(e, ReplayError::Abandoned(_)) {
                    bump(&self.stats.replays_abandoned, 1);
                }
                self.backoff_until = Some(Instant::now() + REPLAY_BACKOFF);
                if let Purpose::Gap { from } = purpose {
                    let to = first_held.unwrap_or(from);
                    self.declare_lost(from, to, DropReason::ReplayFailed(e.to_string()))?;
                }
            }
        }
        if purpose == Purpose::Warm {
            self.send(SubscriberEvent::Warmed {
                result: outcome.map(|run| run.len()),
            })?;
        }
        for (seq, payload) in held {
            self.on_live(seq, payload)?;
        }
        Ok(())
    }

    /// Batches `from..to` are lost: the consumer clears the worker, and `to` comes next.
    fn declare_lost(&mut self, from: u64, to: u64, reason: DropReason) -> Result<(), Closed> {
        bump(&self.stats.dropped, 1);
        self.tracker.expect(Some(to));
        self.send(SubscriberEvent::Dropped { from, to, reason })
    }

    /// The one log line of a replay.
    fn report<T>(
        &self,
        purpose: Purpose,
        started: Instant,
        held: usize,
        outcome: &Result<Vec<T>, ReplayError>,
    ) {
        let (worker, ms) = (&self.config.worker, started.elapsed().as_millis());
        match outcome {
            Ok(run) => {
                let delivered = run.len();
                tracing::info!(%worker, ?purpose, delivered, held, ms, "kv-events replay done")
            }
            Err(error) => {
                tracing::warn!(%worker, ?purpose, %error, held, ms, "kv-events replay failed")
            }
        }
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

    /// Queues `event` for the consumer and hands over what its channel has room for.
    fn send(&mut self, event: SubscriberEvent) -> Result<(), Closed> {
        self.outbox.push_back(WorkerEvent {
            worker: self.config.worker.clone(),
            event,
        });
        self.flush()
    }

    /// Hands the outbox to the channel, oldest first, until it is empty or the channel full.
    fn flush(&mut self) -> Result<(), Closed> {
        while let Some(msg) = self.outbox.pop_front() {
            match self.tx.try_send(msg) {
                Ok(()) => {}
                Err(TrySendError::Closed(_)) => return Err(Closed),
                Err(TrySendError::Full(back)) => {
                    self.outbox.push_front(back);
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}
