//! What a router replica tells the others about the load it books, and where it tells it.
//!
//! Several router replicas behind one Service each count only the requests they routed
//! ([`super::Load`]). With a replica bus (`replica_bus`, over NATS; the simulator's
//! `--replica-sync-ms`), each replica announces every booking it makes — the target, the
//! request's prompt and predicted prefill tokens — then its first token and its end, and the
//! other replicas book the same request on their own view of that target
//! ([`super::replica_ledger`]). A [`Load`](super::Load) whose rank has an [`Announcer`]
//! reports through it from [`super::Load::admit`] and the [`super::LoadGuard`] it returns, so
//! every caller of the decision core (server, endpoint picker, simulator) announces without
//! knowing of the bus.

use std::sync::Arc;

/// A routing target as every replica names it: the worker's configured (or discovered) id and
/// the data-parallel rank. Replicas number workers ([`super::WorkerId`]) each in their own
/// order, so the bus never carries those numbers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetKey {
    /// The worker's id.
    pub worker: Arc<str>,
    /// The rank (0 without data parallelism).
    pub rank: u32,
}

/// One step of a booked request's life, as announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BookingStep {
    /// Routed to the target: `prompt_tokens` in all, `prefill_tokens` of them predicted to be
    /// computed (the rest found in the target's prefix cache).
    Booked {
        /// Prompt tokens.
        prompt_tokens: u64,
        /// Predicted uncached prompt tokens.
        prefill_tokens: u64,
    },
    /// The first token came: its prefill no longer queues others.
    FirstToken,
    /// It ended (finished, failed or cancelled).
    Freed,
}

/// One announcement: request `request` (numbered by the announcing replica) on `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BookingNote {
    /// The target.
    pub target: TargetKey,
    /// The announcing replica's number for the request (unique per replica).
    pub request: u64,
    /// What happened.
    pub step: BookingStep,
}

/// Where a replica's announcements go (the bus's outbox). Called on the request path: it must
/// not block (a bounded queue that drops and counts when full, never a network write).
pub trait BookingSink: Send + Sync {
    /// A fresh request number, unique within this replica.
    fn next_request(&self) -> u64;

    /// Queues an announcement.
    fn announce(&self, note: BookingNote);
}

/// A target's link to its replica's bus: where to announce, and under which name.
#[derive(Clone)]
pub struct Announcer {
    sink: Arc<dyn BookingSink>,
    target: TargetKey,
}

impl std::fmt::Debug for Announcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Announcer")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Announcer {
    /// Announcements of `target` go to `sink`.
    pub fn new(sink: Arc<dyn BookingSink>, target: TargetKey) -> Announcer {
        Announcer { sink, target }
    }

    /// Announces a booking; the returned ticket announces its later steps.
    pub(super) fn book(&self, prompt_tokens: u64, prefill_tokens: u64) -> Ticket {
        let request = self.sink.next_request();
        let ticket = Ticket {
            announcer: self.clone(),
            request,
        };
        ticket.announce(BookingStep::Booked {
            prompt_tokens,
            prefill_tokens,
        });
        ticket
    }
}

/// An announced request, held by its [`super::LoadGuard`].
#[derive(Debug)]
pub(super) struct Ticket {
    announcer: Announcer,
    request: u64,
}

impl Ticket {
    pub(super) fn announce(&self, step: BookingStep) {
        self.announcer.sink.announce(BookingNote {
            target: self.announcer.target.clone(),
            request: self.request,
            step,
        });
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A sink that keeps every note, in order.
    #[derive(Default)]
    pub(crate) struct Notes {
        next: AtomicU64,
        pub(crate) notes: Mutex<Vec<BookingNote>>,
    }

    impl BookingSink for Notes {
        fn next_request(&self) -> u64 {
            self.next.fetch_add(1, Ordering::Relaxed)
        }

        fn announce(&self, note: BookingNote) {
            self.notes.lock().unwrap().push(note);
        }
    }
}
