//! The replica bus in virtual time (`--replica-sync-ms`): every router replica announces what
//! it books (the live `fleet::booking` hook, unchanged), and each announcement reaches every
//! other replica's [`ReplicaLedger`] a fixed delay later, in the order it was made (NATS keeps
//! one publisher's order).
//!
//! The live bus's other duties — heartbeats, expiry, snapshots after a loss — have nothing to
//! do here: no simulated replica dies or loses messages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::fleet::replica_ledger::ReplicaLedger;
use crate::fleet::{BookingNote, BookingSink};

use super::router::SimRouter;

/// Announcements made and not yet scheduled for delivery, with the replica that made each.
type Pending = Arc<Mutex<Vec<(usize, BookingNote)>>>;

/// One replica's outbox.
struct Outbox {
    replica: usize,
    next: AtomicU64,
    pending: Pending,
}

impl BookingSink for Outbox {
    fn next_request(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn announce(&self, note: BookingNote) {
        lock(&self.pending).push((self.replica, note));
    }
}

fn lock(p: &Pending) -> MutexGuard<'_, Vec<(usize, BookingNote)>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// The bus between the simulation's router replicas.
pub struct SimBus {
    /// Seconds from an announcement to its delivery.
    pub delay_s: f64,
    pending: Pending,
    ledgers: Vec<ReplicaLedger>,
    names: Vec<Arc<str>>,
}

impl SimBus {
    /// A bus with delay `delay_s` between `routers`, each of which announces from now on.
    pub fn attach(routers: &[SimRouter], delay_s: f64) -> SimBus {
        let pending: Pending = Arc::default();
        for (replica, r) in routers.iter().enumerate() {
            r.announce_to(Arc::new(Outbox {
                replica,
                next: AtomicU64::new(0),
                pending: Arc::clone(&pending),
            }));
        }
        SimBus {
            delay_s,
            pending,
            // Nothing expires in a simulation: replicas never fall silent.
            ledgers: routers
                .iter()
                .map(|_| ReplicaLedger::new(Duration::MAX))
                .collect(),
            names: (0..routers.len())
                .map(|i| Arc::from(format!("r{i}")))
                .collect(),
        }
    }

    /// The announcements made since the last call, in order.
    pub fn take(&self) -> Vec<(usize, BookingNote)> {
        std::mem::take(&mut *lock(&self.pending))
    }

    /// Delivers replica `from`'s announcement to every other replica.
    pub fn deliver(&mut self, routers: &[SimRouter], from: usize, note: &BookingNote) {
        let name = &self.names[from];
        for (r, ledger) in self.ledgers.iter_mut().enumerate() {
            if r != from {
                ledger.apply(name, note, |t| routers[r].load_of(t));
            }
        }
    }
}
