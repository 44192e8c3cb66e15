//! What one replica does with the bus's traffic, free of the NATS connection: the messages it
//! hears become bookings on its own load view ([`ReplicaLedger`]) and touches of its own
//! working sets (`index::Residency`, with the booked prompts' block hashes); its own
//! announcements and heartbeats become messages, and losing or regaining the bus clears or
//! resynchronises what it holds. [`super::run`] feeds it from the connection; tests feed it
//! directly.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::fleet::replica_ledger::{Landing, ReplicaLedger};
use crate::fleet::{Announcer, BookingNote, Fleet, Load, TargetKey, Worker, WorkerId};
use crate::index::Holdings;
use crate::metrics::ReplicaBusMetrics;
use crate::tokens::BlockHash;

use super::outbox::Outbox;
use super::wire::{Body, Envelope, live_bookings};

/// One replica's state on the bus.
pub struct Link {
    id: String,
    seq: u64,
    connected: bool,
    ledger: ReplicaLedger,
    fleet: Arc<Fleet>,
    outbox: Arc<Outbox>,
    metrics: ReplicaBusMetrics,
    /// Targets by name, rebuilt when a name is not found (workers come and go).
    targets: HashMap<TargetKey, Landed>,
    /// The index whose working sets other replicas' bookings touch.
    holdings: Arc<Holdings>,
}

/// A target as other replicas' bookings land on it.
struct Landed {
    load: Arc<Load>,
    key: WorkerId,
    worker: Arc<Worker>,
}

/// The targets and the index, as the ledger applies a booking to them.
struct Targets<'a> {
    targets: &'a HashMap<TargetKey, Landed>,
    holdings: &'a Holdings,
}

impl Landing for Targets<'_> {
    fn load_of(&self, target: &TargetKey) -> Option<Arc<Load>> {
        self.targets.get(target).map(|t| Arc::clone(&t.load))
    }

    fn touch(&self, target: &TargetKey, hashes: &[BlockHash], now: Duration) {
        if let Some(t) = self.targets.get(target) {
            let capacity = t.worker.kv_blocks().map(|b| b as u64);
            self.holdings.admitted(t.key, hashes, now, capacity);
        }
    }
}

impl Link {
    /// The link of replica `id` over `fleet` and its index `holdings`, announcing through
    /// `outbox`; other replicas silent for `expiry` are forgotten. The times passed to
    /// [`Link::receive`] must be the index's clock (what decisions pass the `Decider`).
    pub fn new(
        id: String,
        expiry: Duration,
        fleet: Arc<Fleet>,
        holdings: Arc<Holdings>,
        outbox: Arc<Outbox>,
        metrics: ReplicaBusMetrics,
    ) -> Link {
        let mut link = Link {
            id,
            seq: 0,
            connected: false,
            ledger: ReplicaLedger::new(expiry),
            fleet,
            outbox,
            metrics,
            targets: HashMap::new(),
            holdings,
        };
        link.attach();
        link
    }

    /// Whether the bus is connected.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Other replicas' live bookings held.
    pub fn booked(&self) -> usize {
        self.ledger.booked()
    }

    /// Makes every rank of every worker announce its bookings (a worker that joined since the
    /// last call starts now), and refreshes the names of targets.
    pub fn attach(&mut self) {
        self.targets.clear();
        for w in self.fleet.workers().iter() {
            for r in w.ranks() {
                let key = TargetKey {
                    worker: w.id().into(),
                    rank: r.index,
                };
                if !r.load.is_announced() {
                    let sink: Arc<dyn crate::fleet::BookingSink> = self.outbox.clone();
                    r.load.announce_to(Announcer::new(sink, key.clone()));
                }
                self.targets.insert(
                    key,
                    Landed {
                        load: Arc::clone(&r.load),
                        key: r.key,
                        worker: Arc::clone(w),
                    },
                );
            }
        }
    }

    fn envelope(&mut self, body: Body) -> Envelope {
        let seq = self.seq;
        self.seq += 1;
        Envelope {
            replica: self.id.clone(),
            seq,
            body,
        }
    }

    /// The message announcing this replica's `note`; `None` while the bus is lost (the
    /// snapshot sent on reconnecting tells the others instead).
    pub fn announce(&mut self, note: &BookingNote) -> Option<Envelope> {
        self.outbox.taken(note);
        if !self.connected {
            self.metrics.lost.with_label_values(&["unsent"]).inc();
            return None;
        }
        Some(self.envelope(Body::of_note(note)))
    }

    /// The bus (re)connected: everyone is asked for a snapshot and told this one's.
    pub fn connected(&mut self) -> Vec<Envelope> {
        self.connected = true;
        self.metrics.connected.set(1);
        vec![self.envelope(Body::Hello { of: None }), self.snapshot()]
    }

    /// The bus was lost: the others' bookings are released (they can no longer be kept
    /// current), and the view falls back to own requests plus engine load readings.
    pub fn disconnected(&mut self) {
        self.connected = false;
        self.metrics.connected.set(0);
        self.ledger.clear();
        self.gauges();
    }

    fn snapshot(&mut self) -> Envelope {
        let live = self.outbox.live();
        self.envelope(Body::snapshot(&live))
    }

    /// A heartbeat tick at `now`: silent replicas expire, new workers are attached, and the
    /// heartbeat to send (while connected).
    pub fn tick(&mut self, now: Duration) -> Option<Envelope> {
        let gone = self.ledger.expire(now);
        if !gone.is_empty() {
            self.metrics.expired.inc_by(gone.len() as u64);
            tracing::warn!(replicas = ?gone, "router replicas went silent on the replica bus; their bookings are released");
        }
        self.attach();
        self.gauges();
        self.connected.then(|| self.envelope(Body::Heartbeat))
    }

    /// A message heard at `now`; what to send in answer (a snapshot asked for, a snapshot
    /// asked of a replica whose messages were lost).
    pub fn receive(&mut self, bytes: &[u8], now: Duration) -> Vec<Envelope> {
        let msg = match Envelope::decode(bytes) {
            Ok(m) => m,
            Err(e) => {
                self.metrics.lost.with_label_values(&["undecodable"]).inc();
                tracing::debug!(error = %e, "ignored a replica bus message");
                return Vec::new();
            }
        };
        if msg.replica == self.id {
            return Vec::new();
        }
        self.metrics.messages.with_label_values(&["received"]).inc();
        let mut answer = Vec::new();
        let lost = self.ledger.heard(&msg.replica, msg.seq, now);
        if lost > 0 {
            self.metrics.lost.with_label_values(&["gap"]).inc_by(lost);
            answer.push(self.envelope(Body::Hello {
                of: Some(msg.replica.clone()),
            }));
        }
        match &msg.body {
            Body::Hello { of } => {
                if of.as_ref().is_none_or(|o| *o == self.id) {
                    answer.push(self.snapshot());
                }
            }
            Body::Snapshot { bookings } => {
                let live = live_bookings(bookings);
                let landing = Targets {
                    targets: &self.targets,
                    holdings: &self.holdings,
                };
                self.ledger.replace(&msg.replica, &live, &landing);
            }
            Body::Heartbeat => {}
            body => {
                if let Some(note) = body.note() {
                    self.apply(&msg.replica, &note, now);
                }
            }
        }
        self.gauges();
        answer
    }

    fn apply(&mut self, replica: &str, note: &BookingNote, now: Duration) {
        if !self.targets.contains_key(&note.target) {
            self.attach();
        }
        let landing = Targets {
            targets: &self.targets,
            holdings: &self.holdings,
        };
        self.ledger.apply(replica, note, &landing, now);
    }

    fn gauges(&self) {
        let peers = self.ledger.replica_count();
        self.metrics.peers.set(peers as i64);
        // The peers share the engines' load reading with this replica (none once the bus is
        // lost: the ledger is cleared then).
        self.fleet.poll_share.set_peers(peers);
        self.metrics.bookings.set(self.ledger.booked() as i64);
    }
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
