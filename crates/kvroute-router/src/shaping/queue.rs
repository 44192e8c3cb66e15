//! The admission queue's discipline: strict priority between bands, weighted fair share among
//! the flows (tenants) of a band, a bounded wait, and sheddable requests displaced first when
//! the queue is full.
//!
//! Pure and clock-driven (time is passed in), like `routing::pair`: the server's admission
//! holds one behind a lock and does the waiting; the simulator-style unit tests below drive it
//! with a virtual clock.
//!
//! Fair share is deficit round robin with unit cost (a request is one slot): each flow of a
//! band takes `weight` requests per turn, then goes to the back of the band's ring. A tenant
//! that floods its band therefore waits behind its own backlog, not in front of others: a
//! flow with weight `w` among flows of total weight `W` gets `w / W` of the slots its band
//! is given while all of them are waiting.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Where a waiting request sits: its band (0 is the highest priority) and flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Its priority band; lower numbers are served first, strictly.
    pub band: usize,
    /// Its flow (the tenant), among which its band shares fairly.
    pub flow: Arc<str>,
    /// The flow's weight: requests it takes per turn (at least 1).
    pub weight: u32,
    /// Whether it may be dropped to make room for a request that may not.
    pub sheddable: bool,
    /// Latest time it may still be granted a slot.
    pub deadline: Duration,
}

/// A request in the queue.
#[derive(Debug)]
pub struct Waiter<T> {
    /// Its number, unique in this queue (for [`FairQueue::remove`]).
    pub id: u64,
    /// What the caller keeps with it (the live router: the channel its grant is sent on).
    pub item: T,
    /// Where it sat.
    pub arrival: Arrival,
    /// When it was queued.
    pub since: Duration,
}

/// Why a request could not be queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The queue is full of requests it may not displace.
    Full,
    /// Its band is not one of the queue's.
    NoSuchBand,
}

/// A request queued: its number, and the sheddable request it displaced to fit, if any.
#[derive(Debug)]
pub struct Queued<T> {
    /// Its number.
    pub id: u64,
    /// The request dropped to make room (its caller refuses it).
    pub shed: Option<Waiter<T>>,
}

struct Flow<T> {
    weight: u32,
    /// Requests left in the flow's current turn.
    credit: u32,
    items: VecDeque<Waiter<T>>,
}

struct Band<T> {
    flows: HashMap<Arc<str>, Flow<T>>,
    /// Flows with waiting requests, in turn order.
    ring: VecDeque<Arc<str>>,
}

impl<T> Band<T> {
    fn new() -> Band<T> {
        Band {
            flows: HashMap::new(),
            ring: VecDeque::new(),
        }
    }

    /// The next waiter of the first flow in turn order that `may` admits; flows skipped keep
    /// their place and credit (they are not served, so they lose nothing of their turn).
    fn pop(
        &mut self,
        band: usize,
        may: &mut impl FnMut(usize, &str, u32) -> bool,
    ) -> Option<Waiter<T>> {
        let at = self
            .ring
            .iter()
            .position(|k| self.flows.get(k).is_some_and(|f| may(band, k, f.weight)))?;
        // Served in its place in the ring: the flows passed over keep theirs.
        let key = self.ring.get(at)?.clone();
        let flow = self.flows.get_mut(&key)?;
        if flow.credit == 0 {
            flow.credit = flow.weight.max(1);
        }
        let waiter = flow.items.pop_front()?;
        flow.credit -= 1;
        if flow.items.is_empty() {
            self.flows.remove(&key);
            self.ring.remove(at);
        } else if flow.credit == 0 {
            self.ring.remove(at);
            self.ring.push_back(key);
        }
        Some(waiter)
    }

    fn remove(&mut self, flow: &Arc<str>, id: u64) -> Option<Waiter<T>> {
        let f = self.flows.get_mut(flow)?;
        let at = f.items.iter().position(|w| w.id == id)?;
        let waiter = f.items.remove(at)?;
        if f.items.is_empty() {
            self.flows.remove(flow);
            self.ring.retain(|k| k != flow);
        }
        Some(waiter)
    }
}

/// The queue of requests waiting for a slot; see the module's documentation.
pub struct FairQueue<T> {
    bands: Vec<Band<T>>,
    capacity: usize,
    len: usize,
    next_id: u64,
    /// Where each waiting request is, by number.
    place: HashMap<u64, (usize, Arc<str>)>,
    /// No deadline is earlier than this (a lower bound: [`FairQueue::expire`] scans only then).
    earliest: Option<Duration>,
}

impl<T> FairQueue<T> {
    /// A queue of `bands` bands holding at most `capacity` requests.
    pub fn new(bands: usize, capacity: usize) -> FairQueue<T> {
        FairQueue {
            bands: (0..bands).map(|_| Band::new()).collect(),
            capacity,
            len: 0,
            next_id: 0,
            place: HashMap::new(),
            earliest: None,
        }
    }

    /// Changes the bound; requests already waiting beyond it stay until served or expired.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The highest band with a waiting request.
    pub fn peek_band(&self) -> Option<usize> {
        self.bands.iter().position(|b| !b.ring.is_empty())
    }

    /// Every flow waiting and its weight (once per band it waits in).
    pub fn flows(&self) -> impl Iterator<Item = (&str, u32)> {
        self.bands
            .iter()
            .flat_map(|b| b.flows.iter().map(|(k, f)| (&**k, f.weight)))
    }

    /// Requests of `flow` waiting in `band`.
    pub fn depth(&self, band: usize, flow: &str) -> usize {
        self.bands
            .get(band)
            .and_then(|b| b.flows.get(flow))
            .map_or(0, |f| f.items.len())
    }

    /// Queues a request at `now`; when the queue is full, a sheddable request of a lower
    /// band (or of the same band, for an arrival that is not sheddable) is displaced, the
    /// newest first; otherwise the arrival is refused.
    pub fn push(&mut self, now: Duration, arrival: Arrival, item: T) -> Result<Queued<T>, Refusal> {
        if arrival.band >= self.bands.len() {
            return Err(Refusal::NoSuchBand);
        }
        let shed = if self.len >= self.capacity {
            Some(self.victim(&arrival).ok_or(Refusal::Full)?)
        } else {
            None
        };
        let shed = shed.and_then(|id| self.remove(id));
        let id = self.next_id;
        self.next_id += 1;
        self.earliest = Some(
            self.earliest
                .map_or(arrival.deadline, |e| e.min(arrival.deadline)),
        );
        self.place
            .insert(id, (arrival.band, Arc::clone(&arrival.flow)));
        let band = &mut self.bands[arrival.band];
        let flow = band
            .flows
            .entry(Arc::clone(&arrival.flow))
            .or_insert_with(|| Flow {
                weight: arrival.weight.max(1),
                credit: 0,
                items: VecDeque::new(),
            });
        flow.weight = arrival.weight.max(1);
        if flow.items.is_empty() {
            band.ring.push_back(Arc::clone(&arrival.flow));
        }
        flow.items.push_back(Waiter {
            id,
            item,
            arrival,
            since: now,
        });
        self.len += 1;
        Ok(Queued { id, shed })
    }

    /// The sheddable request an `arrival` may displace: in the lowest band it outranks (its
    /// own only if it is not sheddable itself), the newest.
    fn victim(&self, arrival: &Arrival) -> Option<u64> {
        let lowest_own = if arrival.sheddable {
            arrival.band + 1
        } else {
            arrival.band
        };
        self.bands
            .iter()
            .enumerate()
            .rev()
            .take_while(|(b, _)| *b >= lowest_own)
            .find_map(|(_, band)| {
                band.flows
                    .values()
                    .flat_map(|f| f.items.iter())
                    .filter(|w| w.arrival.sheddable)
                    .max_by_key(|w| (w.since, w.id))
                    .map(|w| w.id)
            })
    }

    /// The next request to grant a slot: the highest band with a waiter, and in it the flow
    /// whose turn it is.
    pub fn pop(&mut self) -> Option<Waiter<T>> {
        self.pop_where(|_, _, _| true)
    }

    /// Like [`FairQueue::pop`], among the flows `may(band, flow, weight)` admits (the others
    /// are passed over and keep their turn): bands stay strict among the admitted.
    pub fn pop_where(
        &mut self,
        mut may: impl FnMut(usize, &str, u32) -> bool,
    ) -> Option<Waiter<T>> {
        let waiter = self
            .bands
            .iter_mut()
            .enumerate()
            .find_map(|(b, band)| band.pop(b, &mut may))?;
        self.place.remove(&waiter.id);
        self.len -= 1;
        Some(waiter)
    }

    /// Takes request `id` out (it gave up waiting); `None` when it is not waiting any more.
    pub fn remove(&mut self, id: u64) -> Option<Waiter<T>> {
        let (band, flow) = self.place.remove(&id)?;
        let waiter = self.bands.get_mut(band)?.remove(&flow, id)?;
        self.len -= 1;
        Some(waiter)
    }

    /// Takes out every request whose deadline passed by `now`.
    pub fn expire(&mut self, now: Duration) -> Vec<Waiter<T>> {
        if self.earliest.is_none_or(|e| e > now) {
            return Vec::new();
        }
        let mut late = Vec::new();
        let mut earliest: Option<Duration> = None;
        for w in self
            .bands
            .iter()
            .flat_map(|b| b.flows.values())
            .flat_map(|f| f.items.iter())
        {
            if w.arrival.deadline <= now {
                late.push(w.id);
            } else {
                earliest = Some(earliest.map_or(w.arrival.deadline, |e| e.min(w.arrival.deadline)));
            }
        }
        self.earliest = earliest;
        late.into_iter().filter_map(|id| self.remove(id)).collect()
    }
}

#[cfg(test)]
#[path = "queue_tests.rs"]
mod tests;
