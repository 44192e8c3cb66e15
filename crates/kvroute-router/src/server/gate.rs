//! The router's slots and the queue in front of them: a request takes a free slot at once, or
//! waits in the [`FairQueue`] (priority bands, fair share among tenants, sheddable requests
//! displaced first) until a slot is handed to it, its wait runs out, or it is shed.
//!
//! The discipline is `shaping::queue`'s (pure); this is its I/O: a lock, the waiting, and the
//! hand-over of a freed slot to the next waiter (the slot never goes back to a pool in
//! between, so no newcomer can overtake the queue).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::metrics::ShapingMetrics;
use crate::routing::Standing;
use crate::shaping::isolation::{Tenants, stance};
use crate::shaping::saturation::Part;
use crate::shaping::{
    Arrival, Arrivals, Ask, FairQueue, Isolation, Priorities, Refusal, SlotBook, Waiter,
};

/// What a waiter is told.
#[derive(Debug)]
enum Grant {
    /// A slot is its own now.
    Slot,
    /// It was dropped to make room for a request that may not be (it was sheddable).
    Shed,
    /// Its wait ran out.
    Expired,
}

/// Why a request got no slot.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Denied {
    /// The queue is full (of requests it may not displace).
    Full,
    /// Its wait ran out.
    Timeout,
    /// It waited, and was displaced by a request that may not be shed.
    Shed,
}

/// A request's place in line: band, tenant, weight, sheddability, longest wait.
pub(super) struct Entry {
    pub(super) band: usize,
    pub(super) flow: Arc<str>,
    pub(super) weight: u32,
    pub(super) sheddable: bool,
    pub(super) wait: Duration,
}

struct State {
    /// Who holds the slots, and who may take one (headroom, fair reserve).
    slots: SlotBook,
    /// Placement isolation's settings (reloadable).
    isolation: Isolation,
    /// Each tenant's last arrival (kept while isolation is on).
    arrivals: Arrivals,
    max_queue: usize,
    queue: FairQueue<oneshot::Sender<Grant>>,
}

impl State {
    /// Whether a request of `band` and `flow` may take a slot now (`shaping::slots`).
    fn room(&self, band: usize, flow: &str, weight: u32) -> bool {
        self.slots
            .may_take(Ask { band, flow, weight }, self.queue.flows())
    }

    /// The next waiter that may take a slot now, in the queue's order (bands strict, fair
    /// share among flows; flows that may not take one are passed over).
    fn next(&mut self) -> Option<Waiter<oneshot::Sender<Grant>>> {
        // The flows waiting, for the shares (listed only when the fair reserve is reached).
        let waiting: Vec<(Arc<str>, u32)> = if self.slots.needs_shares() {
            self.queue.flows().map(|(f, w)| (Arc::from(f), w)).collect()
        } else {
            Vec::new()
        };
        let slots = &self.slots;
        self.queue.pop_where(|band, flow, weight| {
            slots.may_take(
                Ask { band, flow, weight },
                waiting.iter().map(|(f, w)| (&**f, *w)),
            )
        })
    }
}

/// The router-wide slots and their queue.
pub(super) struct Gate {
    state: Mutex<State>,
    /// Origin of the queue's clock.
    origin: Instant,
    bands: Vec<String>,
    metrics: ShapingMetrics,
    /// `State::isolation.enabled`, readable without the lock: every request asks for its
    /// standing, and with isolation off (the default) the answer must not cost the gate's lock.
    isolating: AtomicBool,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").finish_non_exhaustive()
    }
}

/// A slot of the [`Gate`], handed to the next waiter (or freed) when dropped.
#[derive(Debug)]
pub(super) struct GateSlot {
    gate: Arc<Gate>,
    flow: Arc<str>,
    weight: u32,
}

impl GateSlot {
    /// Where its tenant stands for placement isolation now; `None` while isolation is off.
    pub(super) fn standing(&self) -> Option<Standing> {
        self.gate.standing(&self.flow, self.weight)
    }
}

impl Drop for GateSlot {
    fn drop(&mut self) {
        let mut st = self.gate.lock();
        st.slots.release(&self.flow);
        self.gate.pump(&mut st);
    }
}

/// Takes a waiter out of the queue if its future is dropped (the client went away) while it
/// still waits, so it neither counts in the depth nor is handed a slot no one takes.
struct Waiting<'g> {
    gate: &'g Arc<Gate>,
    id: u64,
    band: usize,
    flow: Arc<str>,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut st = self.gate.lock();
            if st.queue.remove(self.id).is_some() {
                self.gate.depth(&st, self.band, &self.flow);
                // One flow fewer waiting may raise the others' shares.
                self.gate.pump(&mut st);
            }
        }
    }
}

impl Gate {
    /// `limit` slots, at most `max_queue` waiting, in the bands of `priorities`.
    pub(super) fn new(
        limit: usize,
        max_queue: usize,
        priorities: &Priorities,
        metrics: ShapingMetrics,
    ) -> Arc<Gate> {
        Arc::new(Gate {
            state: Mutex::new(State {
                slots: SlotBook::new(limit, priorities.headroom, priorities.fair_reserve),
                isolation: Isolation::default(),
                arrivals: Arrivals::default(),
                max_queue,
                queue: FairQueue::new(priorities.bands.len(), max_queue),
            }),
            origin: Instant::now(),
            bands: priorities.bands.clone(),
            metrics,
            isolating: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// New limits: more slots are handed to waiters at once; fewer take effect as held slots
    /// are returned (the requests running keep theirs).
    pub(super) fn resize(&self, limit: usize, max_queue: usize) {
        let mut st = self.lock();
        st.slots.set_limit(limit);
        st.max_queue = max_queue;
        st.queue.set_capacity(max_queue);
        self.pump(&mut st);
    }

    /// New placement isolation settings, from the next decision on.
    pub(super) fn set_isolation(&self, isolation: Isolation) {
        let mut st = self.lock();
        st.isolation = isolation;
        self.isolating.store(isolation.enabled, Ordering::Relaxed);
    }

    /// Where `flow` (of `weight`) stands for placement isolation (`shaping::isolation`);
    /// `None` while isolation is off.
    pub(super) fn standing(&self, flow: &Arc<str>, weight: u32) -> Option<Standing> {
        if !self.isolating.load(Ordering::Relaxed) {
            return None;
        }
        let st = self.lock();
        if !st.isolation.enabled {
            return None;
        }
        let tenants = Tenants {
            book: &st.slots,
            waiting: st.queue.flows(),
            arrivals: &st.arrivals,
        };
        let stance = stance(flow, weight, tenants, self.now(), st.isolation.window);
        Some(Standing {
            tenant: Arc::clone(flow),
            stance,
        })
    }

    /// Requests waiting now.
    pub(super) fn waiting(&self) -> usize {
        self.lock().queue.len()
    }

    /// A slot for `entry`: at once if one is free and nobody waits, else after waiting in line.
    pub(super) async fn enter(self: &Arc<Self>, entry: Entry) -> Result<GateSlot, Denied> {
        let started = Instant::now();
        let band_label = self.bands.get(entry.band).map_or("-", String::as_str);
        let (id, mut rx) = {
            let mut st = self.lock();
            if st.isolation.enabled {
                let (now, window) = (self.now(), st.isolation.window);
                st.arrivals.arrived(&entry.flow, entry.weight, now, window);
            }
            // A slot it may take is free. No waiter may take it (each release and departure
            // hands free slots to every waiter that may), so it overtakes nobody.
            if st.room(entry.band, &entry.flow, entry.weight) {
                st.slots.take(&entry.flow, entry.weight);
                self.saturation(&st);
                self.metrics
                    .queue_time
                    .with_label_values(&[band_label])
                    .observe(0.0);
                return Ok(GateSlot {
                    gate: Arc::clone(self),
                    flow: entry.flow,
                    weight: entry.weight,
                });
            }
            self.queue(&mut st, &entry)?
        };
        let mut waiting = Waiting {
            gate: self,
            id,
            band: entry.band,
            flow: entry.flow,
            armed: true,
        };
        let grant = match tokio::time::timeout(entry.wait, &mut rx).await {
            Ok(grant) => grant.unwrap_or(Grant::Shed),
            Err(_) => self.wait_ran_out(id, (waiting.band, &waiting.flow), &mut rx),
        };
        waiting.armed = false;
        match grant {
            Grant::Slot => {
                self.metrics
                    .queue_time
                    .with_label_values(&[band_label])
                    .observe(started.elapsed().as_secs_f64());
                Ok(GateSlot {
                    gate: Arc::clone(self),
                    flow: Arc::clone(&waiting.flow),
                    weight: entry.weight,
                })
            }
            Grant::Shed => Err(Denied::Shed),
            Grant::Expired => Err(Denied::Timeout),
        }
    }

    /// Puts `entry` in line (`st`: the gate's state, locked), shedding the waiter it displaces
    /// if any; its id in the line and where its grant will come. A full line refuses it.
    fn queue(
        &self,
        st: &mut State,
        entry: &Entry,
    ) -> Result<(u64, oneshot::Receiver<Grant>), Denied> {
        let (tx, rx) = oneshot::channel();
        let arrival = Arrival {
            band: entry.band,
            flow: Arc::clone(&entry.flow),
            weight: entry.weight,
            sheddable: entry.sheddable,
            deadline: self.now() + entry.wait,
        };
        let queued = match st.queue.push(self.now(), arrival, tx) {
            Ok(q) => q,
            Err(Refusal::Full | Refusal::NoSuchBand) => return Err(Denied::Full),
        };
        if let Some(shed) = queued.shed {
            let _ = shed.item.send(Grant::Shed);
            self.depth(st, shed.arrival.band, &shed.arrival.flow);
        }
        self.depth(st, entry.band, &entry.flow);
        Ok((queued.id, rx))
    }

    /// The grant of waiter `id` (of `band` and `flow`) whose wait ran out: expired if it was
    /// still in line (then the line moves on), else the answer it was sent just then.
    fn wait_ran_out(
        &self,
        id: u64,
        (band, flow): (usize, &str),
        rx: &mut oneshot::Receiver<Grant>,
    ) -> Grant {
        let mut st = self.lock();
        if st.queue.remove(id).is_some() {
            self.depth(&st, band, flow);
            self.pump(&mut st);
            Grant::Expired
        } else {
            // Handed a slot (or shed) just as the wait ran out: the answer is sent.
            rx.try_recv().unwrap_or(Grant::Shed)
        }
    }

    /// Hands free slots to the waiters whose turn it is; those whose wait ran out are told.
    fn pump(&self, st: &mut State) {
        for late in st.queue.expire(self.now()) {
            let _ = late.item.send(Grant::Expired);
            self.depth(st, late.arrival.band, &late.arrival.flow);
        }
        while let Some(next) = st.next() {
            // A waiter whose client left no longer listens: the slot goes to the next one.
            if next.item.send(Grant::Slot).is_ok() {
                st.slots.take(&next.arrival.flow, next.arrival.weight);
            }
            self.depth(st, next.arrival.band, &next.arrival.flow);
        }
        self.saturation(st);
    }

    fn depth(&self, st: &State, band: usize, flow: &str) {
        let name = self.bands.get(band).map_or("-", String::as_str);
        let depth = st.queue.depth(band, flow);
        if depth == 0 {
            let _ = self.metrics.queue_depth.remove_label_values(&[name, flow]);
        } else {
            self.metrics
                .queue_depth
                .with_label_values(&[name, flow])
                .set(depth as i64);
        }
        self.saturation(st);
    }

    fn saturation(&self, st: &State) {
        let slots = st.slots.in_use() as f64 / st.slots.limit().max(1) as f64;
        let queue = if st.max_queue == 0 {
            0.0
        } else {
            st.queue.len() as f64 / st.max_queue as f64
        };
        self.metrics.saturate(Part::Slots, slots);
        self.metrics.saturate(Part::Queue, queue);
    }
}
