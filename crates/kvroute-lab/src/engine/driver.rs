//! Runs an [`EngineCore`] in real time on a tokio task.
//!
//! The task owns the core; HTTP handlers talk to it through [`EngineClient`] commands. Each
//! loop iteration takes pending commands, runs one step, sleeps until the step's end and then
//! delivers its tokens and KV events, so clients observe the timing the model predicts.
//!
//! The engine clock is real seconds since start, except that consecutive steps are chained
//! back to back while the real clock is within [`SLACK`] of the model clock: timer granularity
//! (about 1 ms) would otherwise stretch every short step. A request that arrives at an idle
//! engine is stamped with the same instant its first step starts, so its reported TTFT is
//! exactly the model's prediction, independent of machine noise.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::core::{AddError, EngineCore, NewRequest, StepOutcome};
use super::events::{KvEventSink, batch};
use super::metrics::EngineMetrics;
use super::request::{Handoff, RequestId, RequestStats};

/// How far the real clock may run ahead of the model before the model jumps to it.
const SLACK: f64 = 0.002;

/// What an HTTP handler hears about its request.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestEvent {
    /// One generated token.
    Token {
        /// Token id.
        token: u32,
        /// Output position, from 0.
        index: usize,
    },
    /// The request ended; no more events follow.
    Finished(RequestStats),
}

/// A request to the engine task.
enum Command {
    Add {
        id: RequestId,
        prompt: Vec<u32>,
        max_tokens: usize,
        cache_salt: Option<Arc<str>>,
        handoff: Handoff,
        events: mpsc::UnboundedSender<RequestEvent>,
        accepted: oneshot::Sender<Result<(), AddError>>,
    },
    Abort(RequestId),
    ReleaseHeld(RequestId, oneshot::Sender<bool>),
    ResetPrefixCache(oneshot::Sender<bool>),
}

/// What ended an idle wait of the engine task.
enum Wake {
    /// A command arrived (handled by the caller).
    Command(Command),
    /// A KV transfer or a load from the host-memory tier completed, or a held prefill
    /// expired: time to step.
    Timer,
    /// Shutdown, or every client is gone.
    Stop,
}

/// Why a request could not be submitted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The engine rejected it.
    #[error(transparent)]
    Rejected(#[from] AddError),
    /// The engine task has stopped.
    #[error("the engine is shutting down")]
    Stopped,
}

/// Waits for a command, or until `wakeup` (the engine task holds a `dyn KvEventSink`, which is
/// not `Sync`, so this borrows nothing of it).
async fn idle(
    rx: &mut mpsc::UnboundedReceiver<Command>,
    shutdown: &CancellationToken,
    wakeup: Option<Instant>,
) -> Wake {
    let timer = async {
        match wakeup {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        cmd = rx.recv() => cmd.map_or(Wake::Stop, Wake::Command),
        _ = timer => Wake::Timer,
        _ = shutdown.cancelled() => Wake::Stop,
    }
}

/// A cheap, cloneable handle to the engine task.
#[derive(Clone, Debug)]
pub struct EngineClient {
    tx: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicU64>,
    /// Requests submitted whose streams are still open (the front end's own count, which a
    /// data-parallel engine balances its ranks by: it is current, unlike the step gauges).
    active: Arc<AtomicU64>,
}

/// The event stream of one submitted request. Dropping it before the request finished aborts
/// the request in the engine (a client that went away frees its KV blocks).
#[derive(Debug)]
pub struct RequestStream {
    id: RequestId,
    rx: mpsc::UnboundedReceiver<RequestEvent>,
    tx: mpsc::UnboundedSender<Command>,
    finished: bool,
    active: Arc<AtomicU64>,
}

impl RequestStream {
    /// The engine's id for the request.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event; `None` if the engine stopped before the request finished.
    pub async fn next(&mut self) -> Option<RequestEvent> {
        let ev = self.rx.recv().await;
        match &ev {
            Some(RequestEvent::Finished(_)) | None => self.finished = true,
            Some(RequestEvent::Token { .. }) => {}
        }
        ev
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::Relaxed);
        if !self.finished {
            let _ = self.tx.send(Command::Abort(self.id));
        }
    }
}

impl EngineClient {
    /// Queues a request and returns its event stream.
    pub async fn submit(
        &self,
        prompt: Vec<u32>,
        max_tokens: usize,
        cache_salt: Option<Arc<str>>,
    ) -> Result<RequestStream, SubmitError> {
        self.submit_handoff(prompt, max_tokens, cache_salt, Handoff::Local)
            .await
    }

    /// Queues a request of a prefill/decode hand-off kind and returns its event stream: a
    /// [`Handoff::ToDecode`] prefill streams its one token and finishes, its blocks held
    /// until [`EngineClient::release_held`] (or the engine's hold timeout); a
    /// [`Handoff::FromPrefill`] request streams its tokens once its KV has been pulled over the
    /// engine's transfer model.
    pub async fn submit_handoff(
        &self,
        prompt: Vec<u32>,
        max_tokens: usize,
        cache_salt: Option<Arc<str>>,
        handoff: Handoff,
    ) -> Result<RequestStream, SubmitError> {
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (events, rx) = mpsc::unbounded_channel();
        let (accepted, ok) = oneshot::channel();
        self.tx
            .send(Command::Add {
                id,
                prompt,
                max_tokens,
                cache_salt,
                handoff,
                events,
                accepted,
            })
            .map_err(|_| SubmitError::Stopped)?;
        ok.await.map_err(|_| SubmitError::Stopped)??;
        self.active.fetch_add(1, Ordering::Relaxed);
        Ok(RequestStream {
            id,
            rx,
            tx: self.tx.clone(),
            finished: false,
            active: Arc::clone(&self.active),
        })
    }

    /// Requests submitted through this engine's clients whose streams are still open.
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Relaxed)
    }

    /// The decode side has pulled finished prefill `id`'s KV: its held blocks are released.
    /// Whether they were held (false for an unknown id, or after the hold expired).
    pub async fn release_held(&self, id: RequestId) -> Result<bool, SubmitError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::ReleaseHeld(id, tx))
            .map_err(|_| SubmitError::Stopped)?;
        rx.await.map_err(|_| SubmitError::Stopped)
    }

    /// Empties the prefix cache if no request holds blocks; whether it did.
    pub async fn reset_prefix_cache(&self) -> Result<bool, SubmitError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::ResetPrefixCache(tx))
            .map_err(|_| SubmitError::Stopped)?;
        rx.await.map_err(|_| SubmitError::Stopped)
    }
}

/// The engine task's state.
struct Driver {
    core: EngineCore,
    sink: Box<dyn KvEventSink>,
    /// Its data-parallel rank (0 without data parallelism), named in every batch.
    rank: u32,
    metrics: Arc<EngineMetrics>,
    streams: HashMap<RequestId, mpsc::UnboundedSender<RequestEvent>>,
    start: Instant,
    clock: f64,
}

/// Spawns the engine task; it stops when `shutdown` is cancelled or every client is dropped.
pub fn spawn(
    core: EngineCore,
    sink: Box<dyn KvEventSink>,
    metrics: Arc<EngineMetrics>,
    shutdown: CancellationToken,
) -> (EngineClient, tokio::task::JoinHandle<()>) {
    spawn_rank(core, sink, metrics, 0, shutdown)
}

/// Spawns the engine task of data-parallel rank `rank`, whose KV-event batches name it.
pub fn spawn_rank(
    core: EngineCore,
    sink: Box<dyn KvEventSink>,
    metrics: Arc<EngineMetrics>,
    rank: u32,
    shutdown: CancellationToken,
) -> (EngineClient, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let driver = Driver {
        core,
        sink,
        rank,
        metrics,
        streams: HashMap::new(),
        start: Instant::now(),
        clock: 0.0,
    };
    let handle = tokio::spawn(driver.run(rx, shutdown));
    let client = EngineClient {
        tx,
        next_id: Arc::new(AtomicU64::new(1)),
        active: Arc::new(AtomicU64::new(0)),
    };
    (client, handle)
}

impl Driver {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>, shutdown: CancellationToken) {
        let mut t = self.now();
        loop {
            loop {
                match rx.try_recv() {
                    Ok(cmd) => self.handle(cmd, t),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => return,
                }
            }
            if !self.core.has_work() {
                match idle(&mut rx, &shutdown, self.wakeup_after(t)).await {
                    Wake::Command(cmd) => {
                        t = self.now();
                        self.handle(cmd, t);
                        continue;
                    }
                    // A held prefill expired: the step frees its blocks.
                    Wake::Timer => t = self.now(),
                    Wake::Stop => return,
                }
            }
            let before = self.core.counters();
            let out = self.core.step(t);
            if out.num_scheduled == 0 {
                self.publish(out.kv_events);
                self.metrics.observe_core(&self.core, &before);
                if !out.preempted.is_empty() {
                    // Preemption freed blocks; the next step can admit.
                    continue;
                }
                // Nothing fits right now (cannot persist: admission guarantees every request
                // fits alone), or only KV transfers or host-tier loads are running; wait for a
                // command or for the next one to land rather than spin.
                match idle(&mut rx, &shutdown, self.wakeup_after(t)).await {
                    Wake::Command(cmd) => {
                        t = self.now();
                        self.handle(cmd, t);
                    }
                    Wake::Timer => t = self.now(),
                    Wake::Stop => return,
                }
                continue;
            }
            let deadline = self.start + Duration::from_secs_f64(out.end);
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = shutdown.cancelled() => return,
            }
            self.clock = out.end;
            self.metrics.observe_core(&self.core, &before);
            self.deliver(out);
            t = self.now();
        }
    }

    /// The core's next wake-up (a transfer or a tier load landing, a hold expiring) if it is
    /// after `t`.
    fn wakeup_after(&self, t: f64) -> Option<Instant> {
        let w = self.core.next_wakeup().filter(|&w| w > t)?;
        Some(self.start + Duration::from_secs_f64(w))
    }

    /// The start time of the next step or the stamp of an arrival.
    fn now(&self) -> f64 {
        let real = self.start.elapsed().as_secs_f64();
        if real - self.clock < SLACK {
            self.clock
        } else {
            real
        }
    }

    fn handle(&mut self, cmd: Command, now: f64) {
        match cmd {
            Command::Add {
                id,
                prompt,
                max_tokens,
                cache_salt,
                handoff,
                events,
                accepted,
            } => {
                let r = self.core.add(NewRequest {
                    id,
                    prompt,
                    max_output_tokens: max_tokens,
                    arrival: now,
                    cache_salt,
                    handoff,
                });
                if r.is_ok() {
                    self.streams.insert(id, events);
                }
                let _ = accepted.send(r);
            }
            Command::Abort(id) => self.abort(id, now),
            Command::ReleaseHeld(id, reply) => {
                let _ = reply.send(self.core.release_held(id));
            }
            Command::ResetPrefixCache(reply) => {
                let ok = self.core.reset_prefix_cache();
                let events = self.core.take_kv_events();
                self.publish(events);
                let _ = reply.send(ok);
            }
        }
    }

    fn abort(&mut self, id: RequestId, now: f64) {
        self.streams.remove(&id);
        let before = self.core.counters();
        if let Some(stats) = self.core.abort(id, now) {
            self.metrics.observe_finished(&stats);
            self.metrics.observe_core(&self.core, &before);
        }
    }

    fn deliver(&mut self, out: StepOutcome) {
        self.publish(out.kv_events);
        let mut gone = Vec::new();
        for t in &out.tokens {
            if let Some(tx) = self.streams.get(&t.id) {
                let ev = RequestEvent::Token {
                    token: t.token,
                    index: t.index,
                };
                if tx.send(ev).is_err() {
                    gone.push(t.id);
                }
            }
        }
        for stats in out.finished {
            self.metrics.observe_finished(&stats);
            if let Some(tx) = self.streams.remove(&stats.id) {
                let _ = tx.send(RequestEvent::Finished(stats));
            }
        }
        for id in gone {
            self.abort(id, out.end);
        }
    }

    fn publish(&mut self, events: Vec<kvroute_router::kv_events::KvEvent>) {
        if events.is_empty() {
            return;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.sink.publish(batch(ts, events, self.rank));
    }
}
