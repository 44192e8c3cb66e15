//! The other router replicas' bookings, as this replica learned them from the replica bus.
//!
//! Each booking another replica announces ([`super::booking`]) is booked here too, on this
//! replica's own [`Load`] of the same target, without being announced again
//! ([`Load::admit_quietly`]): it is then *known* load, exactly like this replica's own, so the
//! policy sees it at once and an engine load reading's excess over known load
//! ([`super::load_view`]) shrinks by it — nothing is counted twice. Its first token and its
//! end release it as they release an own request. Its prompt's block hashes, when it carries
//! them, do here what an own admission's do: its prefix counts once among the target's running
//! KV blocks ([`super::running_blocks`]), and they touch this replica's working set of the
//! target ([`Landing::touch`], `index::Residency`), so the evictions a placement would cause
//! are priced over every replica's traffic, not this one's share of it.
//!
//! The ledger keys bookings by (replica, request number), so a repeated announcement (a
//! snapshot that overlaps what was already heard) is applied once. A replica whose messages
//! stop for longer than the expiry (heartbeats included) is presumed gone: its bookings are
//! released, so a dead replica's load never stays booked. A gap in a replica's message
//! numbers means messages were lost: the caller asks that replica for a snapshot, which
//! replaces everything held for it ([`ReplicaLedger::replace`]).
//!
//! Pure: no clock (time is passed in), no I/O. The live bus (`replica_bus`) and the simulator
//! (`sim`) drive it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::booking::{BookingNote, BookingStep, PromptBlocks, TargetKey};
use super::load::{Load, LoadGuard};
use crate::tokens::BlockHash;

/// Where another replica's booking lands on this one: the live bus's fleet and index, the
/// simulator's router.
pub trait Landing {
    /// This replica's load of `target`, if it routes there (yet).
    fn load_of(&self, target: &TargetKey) -> Option<Arc<Load>>;

    /// A booking of `hashes` (a prompt's chained block hashes) on `target` was heard at `now`:
    /// they are the target's most recently used blocks, in this replica's working set of it,
    /// and an arrival for each of their prefixes, exactly as if this replica had admitted the
    /// request there.
    fn touch(&self, target: &TargetKey, hashes: &[BlockHash], now: Duration);
}

/// A booking still alive on its replica, as a snapshot lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveBooking {
    /// The replica's number for the request.
    pub request: u64,
    /// Where it was routed.
    pub target: TargetKey,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Predicted uncached prompt tokens.
    pub prefill_tokens: u64,
    /// Whether its first token came.
    pub first_token: bool,
}

/// What became of one announcement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// It changed the view.
    Applied,
    /// Already known (a repeated booking), or a step of a request not held (its booking was
    /// before this replica listened, or it expired): nothing to do.
    Ignored,
    /// The target is not one this replica routes to (yet): not booked.
    UnknownTarget,
}

struct Held {
    target: TargetKey,
    guard: LoadGuard,
}

#[derive(Default)]
struct Peer {
    last_heard: Duration,
    /// The number the peer's next message should carry.
    next_seq: Option<u64>,
    bookings: HashMap<u64, Held>,
}

/// Other replicas' live bookings on this replica's loads.
pub struct ReplicaLedger {
    expiry: Duration,
    peers: HashMap<Arc<str>, Peer>,
}

impl ReplicaLedger {
    /// A ledger that forgets a replica not heard from for `expiry`.
    pub fn new(expiry: Duration) -> ReplicaLedger {
        ReplicaLedger {
            expiry,
            peers: HashMap::new(),
        }
    }

    /// Replica `replica` was heard at `now` with message number `seq`: how many of its
    /// messages were lost before this one (0 when none, or for its first message heard).
    pub fn heard(&mut self, replica: &str, seq: u64, now: Duration) -> u64 {
        let peer = self.peer(replica);
        peer.last_heard = now;
        let lost = match peer.next_seq {
            Some(expected) if seq > expected => seq - expected,
            _ => 0,
        };
        peer.next_seq = Some(seq.saturating_add(1));
        lost
    }

    /// Applies one announcement of `replica`, heard at `now`, on `landing`.
    pub fn apply(
        &mut self,
        replica: &str,
        note: &BookingNote,
        landing: &dyn Landing,
        now: Duration,
    ) -> Applied {
        let peer = self.peer(replica);
        match &note.step {
            BookingStep::Booked {
                prompt_tokens,
                prefill_tokens,
                blocks,
            } => {
                if peer.bookings.contains_key(&note.request) {
                    return Applied::Ignored;
                }
                let Some(load) = landing.load_of(&note.target) else {
                    return Applied::UnknownTarget;
                };
                let guard = load.admit_quietly(*prompt_tokens, *prefill_tokens, blocks);
                if !blocks.hashes.is_empty() {
                    landing.touch(&note.target, &blocks.hashes, now);
                }
                peer.bookings.insert(
                    note.request,
                    Held {
                        target: note.target.clone(),
                        guard,
                    },
                );
                Applied::Applied
            }
            BookingStep::FirstToken => match peer.bookings.get_mut(&note.request) {
                Some(h) => {
                    h.guard.first_token();
                    Applied::Applied
                }
                None => Applied::Ignored,
            },
            BookingStep::Freed => match peer.bookings.remove(&note.request) {
                Some(_) => Applied::Applied,
                None => Applied::Ignored,
            },
        }
    }

    /// `replica`'s complete list of live bookings: what it no longer holds is released, what
    /// is new is booked, what was known stays (advanced to its first token if the list says
    /// so). A snapshot lists no block hashes (it would be every live prompt's at once): a
    /// booking first heard in one counts its prompt whole, and touches no working set (its
    /// blocks were used when it was booked, not now).
    pub fn replace(&mut self, replica: &str, live: &[LiveBooking], landing: &dyn Landing) {
        let peer = self.peer(replica);
        let mut kept: HashMap<u64, Held> = HashMap::with_capacity(live.len());
        for b in live {
            let held = match peer.bookings.remove(&b.request) {
                Some(h) if h.target == b.target => Some(h),
                _ => landing.load_of(&b.target).map(|load| Held {
                    target: b.target.clone(),
                    guard: load.admit_quietly(
                        b.prompt_tokens,
                        b.prefill_tokens,
                        &PromptBlocks::default(),
                    ),
                }),
            };
            if let Some(mut h) = held {
                if b.first_token {
                    h.guard.first_token();
                }
                kept.insert(b.request, h);
            }
        }
        // What is left in `peer.bookings` ended on the replica: dropping releases it.
        peer.bookings = kept;
    }

    /// Releases the bookings of every replica not heard from for longer than the expiry
    /// before `now`, and returns those replicas.
    pub fn expire(&mut self, now: Duration) -> Vec<Arc<str>> {
        let expiry = self.expiry;
        let gone: Vec<Arc<str>> = self
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.last_heard) > expiry)
            .map(|(r, _)| Arc::clone(r))
            .collect();
        for r in &gone {
            self.peers.remove(r);
        }
        gone
    }

    /// Forgets every replica and releases their bookings (this replica lost the bus: its view
    /// falls back to own requests plus engine readings).
    pub fn clear(&mut self) {
        self.peers.clear();
    }

    /// Bookings held for other replicas.
    pub fn booked(&self) -> usize {
        self.peers.values().map(|p| p.bookings.len()).sum()
    }

    /// How many replicas are heard from and not expired.
    pub fn replica_count(&self) -> usize {
        self.peers.len()
    }

    /// The replicas heard from and not expired, sorted.
    pub fn replicas(&self) -> Vec<Arc<str>> {
        let mut r: Vec<Arc<str>> = self.peers.keys().cloned().collect();
        r.sort();
        r
    }

    fn peer(&mut self, replica: &str) -> &mut Peer {
        self.peers.entry(Arc::from(replica)).or_default()
    }
}

#[cfg(test)]
#[path = "replica_ledger_tests.rs"]
mod tests;
