//! One policy on one trace: N engine models and the router, in virtual time.
//!
//! Events: a request arrives (the router routes it and the chosen engine queues it); a worker
//! is kicked (it plans a step if it is idle and has work); a step ends (its tokens, finished
//! requests and KV events take effect, and the worker plans its next step); a batch of KV
//! events reaches the index (when events are delayed); the fleet changes. Each engine's step
//! is planned at its start by [`EngineCore::step`] and its results are applied at its end,
//! exactly as the engine's real-time driver sleeps until the step's end before it delivers
//! tokens and publishes events. Nothing here reads a clock or a random source of its own, so
//! the same inputs give the same records.
//!
//! Several router replicas (`SimConfig::routers`) sit in front of the same engines as they
//! would behind a Kubernetes Service: arrivals are dealt to them round-robin, each has its own
//! load counters and policy (with its own calibration), and each sees only its own requests —
//! plus, with `load_sample_s`, every engine's running and waiting counts read at that interval,
//! as the live `[health] load_interval_ms` poller reads `/metrics`. With events they share one
//! exact index (all subscribe to the same streams, so their indexes are equal); without events
//! each predicts only what it routed itself.
//!
//! A disaggregated fleet (`SimConfig::pd`) takes each request through prefill on a prefill
//! worker, a KV transfer and decode on a decode worker ([`handoff`]); everything else — steps,
//! events, load readings — is the same loop.

use std::collections::BTreeSet;

use thiserror::Error;

use crate::engine::{EngineConfig, EngineCore, EngineCounters, Handoff, RequestId, StepOutcome};
use crate::workload::trace::Trace;
use kvroute_router::fleet::{EngineLoad, Role, poll_share};
use kvroute_router::index::Holdings;
use kvroute_router::kv_events::KvEvent;
use kvroute_router::policy::PolicyKind;

use super::config::{FleetChange, IndexMode, SimConfig, SimConfigError};
use super::queue::EventQueue;
use super::record::SimRecord;
use super::replica_sync::SimBus;
use super::router::{Routed, SimRouter};

/// Steps retried at the same instant when a step only preempted (it freed blocks).
const PREEMPT_RETRIES: usize = 64;

/// Why a simulation could not start.
#[derive(Debug, Error)]
pub enum SimError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] SimConfigError),
}

/// What happened to every request, and the engines' totals.
#[derive(Clone, Debug, Default)]
pub struct PolicyRun {
    /// The policy.
    pub policy: String,
    /// One record per trace request, in trace order.
    pub records: Vec<SimRecord>,
    /// The engines' counters, summed over workers (and over a restarted worker's lives).
    pub counters: EngineCounters,
    /// Workers that served at some point.
    pub workers: u32,
    /// Every gap between two consecutive output tokens of a request as its client saw them,
    /// seconds (the inter-token latency distribution).
    pub itl_gaps: Vec<f64>,
}

enum Event {
    Arrival(usize),
    Kick(u32),
    StepEnd {
        worker: u32,
        life: u32,
    },
    KvEvents {
        worker: u32,
        life: u32,
        ts: f64,
        events: Vec<KvEvent>,
    },
    Change(usize),
    /// Every replica reads every engine's load.
    SampleLoad,
    /// A replica's announcement of a booking reaches the other replicas.
    Sync {
        from: usize,
        note: kvroute_router::fleet::BookingNote,
    },
    /// A worker may have something to do without a new request (a KV transfer lands).
    Wake(u32),
    /// Request `i`'s last piece was answered a router round trip ago: its next one is sent.
    NextPiece(usize),
    /// A decode worker finished pulling a request's KV: its prefill worker frees the blocks.
    Release {
        worker: u32,
        life: u32,
        request: usize,
    },
}

struct SimWorker {
    engine: EngineCore,
    /// A step is running; its outcome applies at its end.
    pending: Option<StepOutcome>,
    /// A kick is scheduled.
    kicked: bool,
    /// Incremented on restart, so events of a previous life are ignored.
    life: u32,
    /// Requests live on the engine (ordered, so a restart fails them in a fixed order).
    requests: BTreeSet<usize>,
    /// Counters of previous lives.
    past: EngineCounters,
}

/// A simulation of one policy over one trace.
pub struct Simulation<'t> {
    trace: &'t Trace,
    config: SimConfig,
    /// The router replicas (one unless `config.routers` says otherwise).
    routers: Vec<SimRouter>,
    /// How this policy's router learns what the engines cache ([`SimConfig::index_for`]).
    index: IndexMode,
    /// Whether the replicas share one exact index (events mode).
    shared_index: bool,
    /// The replica bus, when replicas share their bookings.
    bus: Option<SimBus>,
    workers: Vec<SimWorker>,
    /// The engines share one KV cache (the reference of [`pooled_fleet`]).
    pooled: bool,
    joined: u32,
    queue: EventQueue<Event>,
    records: Vec<SimRecord>,
    routed: Vec<Option<Routed>>,
    /// Arrivals dealt so far (the next one goes to replica `dealt % routers`).
    dealt: usize,
    /// Engine load readings taken so far (with a bus, reading `n` is replica `n % routers`'s).
    sampled: usize,
    /// Disaggregated fleet: where each request is in its prefill → decode journey.
    pairs: Vec<Option<handoff::Pair>>,
    /// When each request's latest client-visible token came.
    last_token: Vec<f64>,
    /// Client-visible gaps between consecutive tokens.
    itl_gaps: Vec<f64>,
    /// Requests whose prompt is going to their worker in pieces, by trace index.
    pieces: std::collections::HashMap<usize, pieces::Pieces>,
}

/// The engine in `slot` in its `life`th life: the fleet's engine, at the slot's speed and
/// with the slot's KV cache in a mixed fleet.
fn engine_config(config: &SimConfig, slot: u32, life: u32) -> EngineConfig {
    let base = &config.engine;
    let mut timing = base.timing;
    if !config.worker_speeds.is_empty() {
        timing.speedup *= config.worker_speeds[slot as usize % config.worker_speeds.len()];
    }
    EngineConfig {
        // Distinct engines hash blocks differently, as real replicas' opaque ids do.
        seed: base
            .seed
            .wrapping_add(u64::from(slot) << 32)
            .wrapping_add(u64::from(life)),
        timing,
        num_blocks: config.slot_blocks(slot),
        cpu_tier: config.slot_tier(slot),
        ..base.clone()
    }
}

/// The events a simulation starts with: the first load sample (when load is sampled), the
/// fleet's changes and every request's arrival.
fn first_events(config: &SimConfig, trace: &Trace) -> EventQueue<Event> {
    let mut queue = EventQueue::default();
    if config.load_sample_s.is_some() {
        queue.push(0.0, Event::SampleLoad);
    }
    for (i, c) in config.changes.iter().enumerate() {
        queue.push(c.at(), Event::Change(i));
    }
    for (i, r) in trace.requests.iter().enumerate() {
        queue.push(r.arrival_s, Event::Arrival(i));
    }
    queue
}

impl<'t> Simulation<'t> {
    /// A simulation of `policy` over `trace` with `config`.
    pub fn new(trace: &'t Trace, config: &SimConfig, policy: PolicyKind) -> Result<Self, SimError> {
        let engine = |slot| EngineCore::new(engine_config(config, slot, 0));
        Self::with_engines(trace, config, policy, engine, |slot| {
            config.slot_blocks(slot)
        })
    }

    /// [`Self::new`] over the engines `engine` makes per slot, of `kv_blocks(slot)` blocks.
    fn with_engines(
        trace: &'t Trace,
        config: &SimConfig,
        policy: PolicyKind,
        engine: impl Fn(u32) -> Result<EngineCore, crate::engine::ConfigError>,
        kv_blocks: impl Fn(u32) -> u32,
    ) -> Result<Self, SimError> {
        config.validate()?;
        let max = config.max_workers();
        let index = config.index_for(policy);
        let shared_index = matches!(index, IndexMode::Events { .. });
        let mut routers = SimRouter::replicas(config, policy, index, max);
        let mut workers = Vec::with_capacity(max as usize);
        for slot in 0..max {
            workers.push(SimWorker {
                engine: engine(slot).map_err(SimConfigError::from)?,
                pending: None,
                kicked: false,
                life: 0,
                requests: BTreeSet::new(),
                past: EngineCounters::default(),
            });
        }
        for slot in 0..config.workers {
            let role = config.pd.map_or(Role::Both, |pd| pd.role(slot));
            let context = workers[slot as usize].engine.config().max_model_len();
            for router in &mut routers {
                router.enable_as(slot, kv_blocks(slot) as usize, role);
                router.set_context(slot, context);
            }
        }
        if config.pd.is_some() {
            // The live router's own check that each side has a worker.
            routers[0]
                .plan()
                .map_err(|e| SimConfigError::Pd(e.to_string()))?;
        }
        let bus = config
            .replica_sync_s
            .filter(|_| routers.len() > 1)
            .map(|delay| SimBus::attach(&routers, delay));
        let queue = first_events(config, trace);
        Ok(Simulation {
            trace,
            config: config.clone(),
            routers,
            index,
            shared_index,
            bus,
            workers,
            pooled: false,
            joined: config.workers,
            queue,
            records: vec![SimRecord::default(); trace.len()],
            routed: (0..trace.len()).map(|_| None).collect(),
            dealt: 0,
            sampled: 0,
            pairs: (0..trace.len()).map(|_| None).collect(),
            last_token: vec![0.0; trace.len()],
            itl_gaps: Vec::new(),
            pieces: std::collections::HashMap::new(),
        })
    }

    /// The router's index (for inspection after or during a run).
    pub fn holdings(&self) -> &Holdings {
        self.routers[0].holdings()
    }

    /// kvroute's block hashes of trace request `i`'s prompt.
    #[cfg(any(test, feature = "testing"))]
    pub fn request_hashes(&self, i: usize) -> Vec<kvroute_router::tokens::BlockHash> {
        let prompt = self.config.synth.prompt_tokens(&self.trace.requests[i]);
        self.routers[0].hashes(&prompt)
    }

    /// Runs until every event is processed.
    pub fn run(mut self) -> PolicyRun {
        self.run_until(f64::INFINITY);
        self.finish()
    }

    /// Processes every event scheduled before `until` seconds.
    pub fn run_until(&mut self, until: f64) {
        while self.queue.peek_at().is_some_and(|t| t < until) {
            if let Some((t, e)) = self.queue.pop() {
                self.handle(t, e);
                self.sync(t);
            }
        }
    }

    /// The records and totals; requests that never completed count as errors.
    pub fn finish(mut self) -> PolicyRun {
        if let Some(bus) = &self.bus {
            let w = bus.wire;
            let per = |bytes: u64| bytes / w.bookings.max(1);
            tracing::info!(
                bookings = w.bookings,
                bytes_per_booking = per(w.bytes),
                marks_only_bytes_per_booking = per(w.marks_only_bytes),
                "replica bus: what the bookings would take on the live bus"
            );
        }
        let mut counters = EngineCounters::default();
        for w in &self.workers {
            counters += w.past;
            counters += w.engine.counters();
        }
        for (i, r) in self.records.iter_mut().enumerate() {
            if r.end.is_none() && r.error.is_none() {
                r.error = Some("never completed (engine stuck)".to_string());
            }
            if let Some(mut routed) = self.routed[i].take() {
                routed.finish();
            }
        }
        PolicyRun {
            policy: self.routers[0].policy_name().to_string(),
            records: self.records,
            counters,
            workers: self.joined,
            itl_gaps: self.itl_gaps,
        }
    }

    fn handle(&mut self, now: f64, event: Event) {
        match event {
            Event::Arrival(i) => self.arrive(i, now),
            Event::Kick(w) => {
                self.workers[w as usize].kicked = false;
                self.try_step(w, now);
            }
            Event::StepEnd { worker, life } => self.step_end(worker, life, now),
            Event::KvEvents {
                worker,
                life,
                ts,
                events,
            } => {
                if self.workers[worker as usize].life == life {
                    self.apply_events(worker, ts, events);
                }
            }
            Event::Change(k) => self.change(k, now),
            Event::SampleLoad => self.sample_load(now),
            Event::Sync { from, note } => {
                if let Some(bus) = self.bus.as_mut() {
                    bus.deliver(&self.routers, from, &note, now);
                }
            }
            Event::Wake(w) => self.try_step(w, now),
            Event::NextPiece(i) => self.next_piece(i, now),
            Event::Release {
                worker,
                life,
                request,
            } => self.release(worker, life, request),
        }
    }

    fn arrive(&mut self, i: usize, now: f64) {
        if self.config.pd.is_some() {
            self.arrive_pair(i, now);
            return;
        }
        let (prompt, replica, session) = self.open_arrival(i, now);
        let req = &self.trace.requests[i];
        let max_tokens = Some(u64::from(req.output_tokens.max(1)));
        let Some(routed) =
            self.routers[replica].route_in_session(&prompt, max_tokens, now, session)
        else {
            let rec = &mut self.records[i];
            rec.error = Some("no worker available".to_string());
            rec.end = Some(now);
            return;
        };
        let rec = &mut self.records[i];
        rec.worker = Some(routed.slot);
        rec.predicted_blocks = routed.overlap_blocks;
        rec.predicted_ttft = routed.predicted_ttft();
        rec.predicted_room_wait = routed.room_wait_s;
        rec.warmest_blocks = routed.warmest_blocks;
        rec.blocks = routed.blocks;
        let slot = routed.slot;
        let output = req.output_tokens.max(1) as usize;
        let Some((prompt, mut routed)) = self.send_in_pieces(i, prompt, routed, output, now) else {
            return;
        };
        let w = &mut self.workers[slot as usize];
        match w
            .engine
            .add_request(RequestId(i as u64), prompt, output, now)
        {
            Ok(()) => {
                w.requests.insert(i);
                self.routed[i] = Some(routed);
                if w.pending.is_none() && !w.kicked {
                    w.kicked = true;
                    self.queue.push(now, Event::Kick(slot));
                }
            }
            Err(e) => {
                let rec = &mut self.records[i];
                rec.error = Some(e.to_string());
                rec.end = Some(now);
                routed.finish();
            }
        }
    }

    /// Request `i` arriving at `now`, whole or as a pair: its record opened, and its prompt,
    /// the router replica dealt it (round-robin) and the session it names.
    pub(super) fn open_arrival(&mut self, i: usize, now: f64) -> (Vec<u32>, usize, Option<u64>) {
        let req = &self.trace.requests[i];
        let prompt = self.config.synth.prompt_tokens(req);
        let rec = &mut self.records[i];
        rec.arrival = now;
        rec.prompt_tokens = req.input_tokens;
        rec.output_tokens = req.output_tokens.max(1);
        let replica = self.dealt % self.routers.len();
        self.dealt += 1;
        (prompt, replica, req.session)
    }

    fn try_step(&mut self, slot: u32, now: f64) {
        for _ in 0..PREEMPT_RETRIES {
            let w = &mut self.workers[slot as usize];
            if w.pending.is_some() || !w.engine.has_work() {
                return;
            }
            let mut out = w.engine.step(now);
            let life = w.life;
            let events = std::mem::take(&mut out.kv_events);
            self.publish(slot, life, now, events);
            self.pulls_started(std::mem::take(&mut out.pulls));
            for id in &out.preempted {
                if let Some(r) = self.records.get_mut(id.0 as usize) {
                    r.preemptions += 1;
                }
            }
            if out.num_scheduled > 0 {
                let end = out.end;
                self.workers[slot as usize].pending = Some(out);
                self.queue.push(end, Event::StepEnd { worker: slot, life });
                return;
            }
            if out.preempted.is_empty() {
                // Nothing fits now (the next arrival kicks the worker again), or only KV
                // transfers run: wake when the next one lands.
                let w = &self.workers[slot as usize];
                if let Some(at) = w.engine.next_wakeup().filter(|&t| t > now) {
                    self.queue.push(at, Event::Wake(slot));
                }
                return;
            }
        }
    }

    fn publish(&mut self, slot: u32, life: u32, at: f64, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        if let IndexMode::Events { delay_s } = self.index {
            if delay_s > 0.0 {
                self.queue.push(
                    at + delay_s,
                    Event::KvEvents {
                        worker: slot,
                        life,
                        ts: at,
                        events,
                    },
                );
            } else {
                self.apply_events(slot, at, events);
            }
        }
    }

    /// A batch of KV events reaches every replica's index (the shared one once); a pooled
    /// fleet's reach every worker of it.
    fn apply_events(&self, slot: u32, ts: f64, events: Vec<KvEvent>) {
        if self.pooled {
            (0..self.joined).for_each(|w| self.routers[0].apply_events(w, ts, events.clone()));
        } else if self.shared_index {
            self.routers[0].apply_events(slot, ts, events);
        } else {
            for r in &self.routers {
                r.apply_events(slot, ts, events.clone());
            }
        }
    }

    /// Sends the bookings announced while handling an event at `now` over the replica bus:
    /// delivered at once without a delay, else scheduled.
    fn sync(&mut self, now: f64) {
        let Some(bus) = self.bus.as_mut() else {
            return;
        };
        let notes = bus.take();
        if bus.delay_s > 0.0 {
            for (from, note) in notes {
                self.queue
                    .push(now + bus.delay_s, Event::Sync { from, note });
            }
        } else {
            for (from, note) in &notes {
                bus.deliver(&self.routers, *from, note, now);
            }
        }
    }

    /// Every replica reads every engine's running and waiting counts now — or, with a replica
    /// bus, one replica in turn (the live `fleet::PollShare`: replicas that hear each other
    /// read each engine as often as one router would, in all); the next reading is scheduled
    /// while anything else is left to happen.
    fn sample_load(&mut self, now: f64) {
        let readers = poll_share::readers(self.routers.len(), self.bus.is_some(), self.sampled);
        self.sampled += 1;
        for (slot, w) in self.workers.iter().enumerate().take(self.joined as usize) {
            let engine = EngineLoad {
                running: w.engine.num_running() as u64,
                waiting: w.engine.num_waiting() as u64,
                kv_usage: Some(w.engine.kv_usage()),
            };
            for r in &self.routers[readers.clone()] {
                r.read_load(slot as u32, engine);
            }
        }
        if let Some(dt) = self.config.load_sample_s
            && self.queue.peek_at().is_some()
        {
            self.queue.push(now + dt, Event::SampleLoad);
        }
    }

    fn step_end(&mut self, slot: u32, life: u32, now: f64) {
        let w = &mut self.workers[slot as usize];
        if w.life != life {
            return;
        }
        let Some(mut out) = w.pending.take() else {
            return;
        };
        let events = std::mem::take(&mut out.kv_events);
        self.publish(slot, life, out.end, events);
        for t in &out.tokens {
            if pieces::is_piece(t.id) {
                continue;
            }
            let i = t.id.0 as usize;
            let visible = self.client_sees(i);
            if t.index == 0 {
                if visible {
                    self.records[i].first_token = Some(out.end);
                }
                if let Some(routed) = self.routed[i].as_mut() {
                    routed.first_token(out.end);
                }
            } else if visible {
                self.itl_gaps.push(out.end - self.last_token[i]);
            }
            if visible {
                self.last_token[i] = out.end;
            }
        }
        for s in &out.finished {
            if let Some(i) = pieces::piece_of(s.id) {
                // The answer reaches the router, which sends the next piece: the engine has
                // planned its next step by then.
                let at = s.finished.max(now) + pieces::ROUND_TRIP_S;
                self.queue.push(at, Event::NextPiece(i));
                continue;
            }
            let i = s.id.0 as usize;
            if s.handoff == Handoff::ToDecode {
                self.prefill_done(slot, s, out.end);
                continue;
            }
            let rec = &mut self.records[i];
            rec.end = Some(s.finished);
            // A disaggregated request keeps its prefill worker's hits; its preemptions on
            // both workers were counted as they happened.
            if s.handoff == Handoff::Local {
                rec.cached_tokens = s.cached_tokens as u32;
                rec.loaded_tokens = s.loaded_tokens as u32;
                rec.preemptions = s.preemptions;
            }
            rec.first_scheduled = s.first_scheduled;
            let output_tokens = u64::from(rec.output_tokens);
            if let Some(mut routed) = self.routed[i].take() {
                routed.complete(s.finished, output_tokens);
            }
            self.workers[slot as usize].requests.remove(&i);
        }
        self.try_step(slot, now);
    }

    fn change(&mut self, k: usize, now: f64) {
        match self.config.changes[k] {
            FleetChange::Join { .. } => {
                let slot = self.joined;
                self.joined += 1;
                let context = self.workers[slot as usize].engine.config().max_model_len();
                for router in &mut self.routers {
                    router.enable(slot, self.config.slot_blocks(slot) as usize);
                    router.set_context(slot, context);
                }
            }
            FleetChange::Restart { worker, .. } => self.restart(worker, now),
        }
    }

    fn restart(&mut self, slot: u32, now: f64) {
        self.drop_pieces(slot, now);
        let w = &mut self.workers[slot as usize];
        let live: Vec<usize> = std::mem::take(&mut w.requests).into_iter().collect();
        for i in live {
            let stats = w.engine.abort(RequestId(i as u64), now);
            let rec = &mut self.records[i];
            rec.error = Some("worker restarted".to_string());
            rec.end = Some(now);
            if let Some(s) = stats {
                rec.cached_tokens = s.cached_tokens as u32;
            }
            if let Some(mut routed) = self.routed[i].take() {
                routed.finish();
            }
        }
        w.life += 1;
        let counters = w.engine.counters();
        w.past += counters;
        match EngineCore::new(engine_config(&self.config, slot, w.life)) {
            Ok(engine) => w.engine = engine,
            Err(e) => tracing::error!(error = %e, "cannot restart engine"),
        }
        w.pending = None;
        w.kicked = false;
        // Every replica forgets the worker's working set (its own); the shared exact index is
        // cleared by the first and found clear by the rest.
        for r in &self.routers {
            r.worker_restarted(slot);
        }
    }
}

#[path = "handoff.rs"]
mod handoff;
#[path = "pieces.rs"]
mod pieces;
#[path = "pooled_fleet.rs"]
pub(super) mod pooled_fleet;
