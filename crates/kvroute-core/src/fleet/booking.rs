//! What a router replica tells the others about the load it books, and where it tells it.
//!
//! Several router replicas behind one Service each count only the requests they routed
//! ([`super::Load`]). With a replica bus (`replica_bus`, over NATS; the simulator's
//! `--replica-sync-ms`), each replica announces every booking it makes — the target, the
//! request's prompt and predicted prefill tokens, the prompt's block hashes — then its first
//! token and its end, and the other replicas book the same request on their own view of that
//! target and touch their own working set of it with its blocks
//! ([`super::replica_ledger`]). A [`Load`](super::Load) whose rank has an [`Announcer`]
//! reports through it from [`super::Load::admit`] and the [`super::LoadGuard`] it returns, so
//! every caller of the decision core (server, endpoint picker, simulator) announces without
//! knowing of the bus.

use std::sync::Arc;

use crate::tokens::BlockHash;

/// Most block hashes one booking carries: a prompt's first 65,536 blocks (a million tokens of
/// 16-token blocks). Encoded, that is 699,052 bytes of base64 (`replica_bus::wire`), under
/// NATS's default 1 MiB payload limit; past it, the rest of a prompt counts as its own tokens
/// on the other replicas ([`super::running_blocks`]) and is not in their working sets.
pub const MAX_ANNOUNCED_BLOCKS: usize = 1 << 16;

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

/// A booked prompt's KV blocks: its chained block hashes (kvroute's, of `block_size`-token
/// blocks), at most [`MAX_ANNOUNCED_BLOCKS`]. Empty when the decision did not hash the prompt
/// (a load-only policy, the decode side of a disaggregated request) or the announcement
/// predates them (an older replica): the booking then counts as token counts alone.
///
/// The other replicas need every block, not one mark in [`super::running_blocks::STRIDE`]:
/// each touches its own working set of the target (`index::Residency`) with them, block by
/// block, as its own admissions do, and prices the evictions a placement causes from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptBlocks {
    /// The chained hashes, first block first.
    pub hashes: Arc<[BlockHash]>,
    /// Tokens per block (0 without hashes).
    pub block_size: u32,
}

impl PromptBlocks {
    /// The first [`MAX_ANNOUNCED_BLOCKS`] of `hashes`, of `block_size`-token blocks.
    pub fn of(hashes: &[BlockHash], block_size: u32) -> PromptBlocks {
        if hashes.is_empty() {
            return PromptBlocks::default();
        }
        PromptBlocks {
            hashes: Arc::from(&hashes[..hashes.len().min(MAX_ANNOUNCED_BLOCKS)]),
            block_size,
        }
    }
}

/// One step of a booked request's life, as announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BookingStep {
    /// Routed to the target: `prompt_tokens` in all, `prefill_tokens` of them predicted to be
    /// computed (the rest found in the target's prefix cache).
    Booked {
        /// Prompt tokens.
        prompt_tokens: u64,
        /// Predicted uncached prompt tokens.
        prefill_tokens: u64,
        /// The prompt's blocks.
        blocks: PromptBlocks,
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
    pub(super) fn book(
        &self,
        prompt_tokens: u64,
        prefill_tokens: u64,
        blocks: PromptBlocks,
    ) -> Ticket {
        let request = self.sink.next_request();
        let ticket = Ticket {
            announcer: self.clone(),
            request,
        };
        ticket.announce(BookingStep::Booked {
            prompt_tokens,
            prefill_tokens,
            blocks,
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
