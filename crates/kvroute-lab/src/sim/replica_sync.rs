//! The replica bus in virtual time (`--replica-sync-ms`): every router replica announces what
//! it books (the live `fleet::booking` hook, unchanged: token counts and the prompt's block
//! hashes), and each announcement reaches every other replica's [`ReplicaLedger`] a fixed
//! delay later, in the order it was made (NATS keeps one publisher's order), where it lands as
//! on a live replica: known load, and the prompt's blocks in that replica's own working set of
//! the worker (each replica has its own `index::Residency`; only the exact index, fed by the
//! same KV events, is shared).
//!
//! The live bus's other duties — heartbeats, expiry, snapshots after a loss — have nothing to
//! do here: no simulated replica dies or loses messages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kvroute_router::fleet::booking::PromptBlocks;
use kvroute_router::fleet::replica_ledger::ReplicaLedger;
use kvroute_router::fleet::running_blocks::marks;
use kvroute_router::fleet::{BookingNote, BookingSink, BookingStep};
use kvroute_router::replica_bus::wire::{Body, Envelope};

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

/// What the live bus would carry for the bookings announced: each encoded as the live replica
/// encodes it (`replica_bus::wire`), and as it would be with one chained-hash mark per
/// `fleet::running_blocks::STRIDE` blocks in place of every block's hash.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireCost {
    /// Bookings announced.
    pub bookings: u64,
    /// Their bytes on the wire.
    pub bytes: u64,
    /// Their bytes with marks only.
    pub marks_only_bytes: u64,
}

impl WireCost {
    fn add(&mut self, from: usize, note: &BookingNote) {
        let BookingStep::Booked {
            prompt_tokens,
            prefill_tokens,
            blocks,
        } = &note.step
        else {
            return;
        };
        let seq = self.bookings * 3;
        let size = |note: &BookingNote| {
            Envelope {
                replica: format!("router-{from}"),
                seq,
                body: Body::of_note(note),
            }
            .encode()
            .len() as u64
        };
        let marked = BookingNote {
            step: BookingStep::Booked {
                prompt_tokens: *prompt_tokens,
                prefill_tokens: *prefill_tokens,
                blocks: PromptBlocks {
                    hashes: marks(&blocks.hashes),
                    block_size: blocks.block_size,
                },
            },
            ..note.clone()
        };
        self.bookings += 1;
        self.bytes += size(note);
        self.marks_only_bytes += size(&marked);
    }
}

/// The bus between the simulation's router replicas.
pub struct SimBus {
    /// Seconds from an announcement to its delivery.
    pub delay_s: f64,
    /// What the bookings announced so far would cost on the live bus.
    pub wire: WireCost,
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
            wire: WireCost::default(),
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
    pub fn take(&mut self) -> Vec<(usize, BookingNote)> {
        let notes = std::mem::take(&mut *lock(&self.pending));
        for (from, note) in &notes {
            self.wire.add(*from, note);
        }
        notes
    }

    /// Delivers replica `from`'s announcement to every other replica at `now` (seconds).
    pub fn deliver(&mut self, routers: &[SimRouter], from: usize, note: &BookingNote, now: f64) {
        let name = &self.names[from];
        let at = Duration::from_secs_f64(now.max(0.0));
        for (r, ledger) in self.ledgers.iter_mut().enumerate() {
            if r != from {
                ledger.apply(name, note, &routers[r], at);
            }
        }
    }
}
