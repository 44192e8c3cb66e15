//! This replica's announcements on their way to the bus, and the list of its own live
//! bookings that a snapshot sends.
//!
//! The request path announces through [`Outbox::announce`] (a [`BookingSink`]): a bounded
//! queue, never a wait; a full queue drops the announcement and counts it, and the next
//! snapshot (sent on every reconnect and whenever another replica finds a gap) repairs what the
//! others hold. The live list is updated with every announcement, queued or not, so a snapshot
//! is always this replica's truth.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use tokio::sync::mpsc;

use crate::fleet::replica_ledger::LiveBooking;
use crate::fleet::{BookingNote, BookingSink, BookingStep};
use crate::metrics::ReplicaBusMetrics;

/// Announcements queued before the bus task takes them: at most this many wait (a few
/// seconds of a busy router's traffic while the bus is slow); more are dropped and counted.
pub const OUTBOX_CAPACITY: usize = 16_384;

/// Block hashes the queued bookings may carry in all (32 MiB of them): a booking queued beyond
/// it goes without its hashes (applied as token counts by the others) and is counted
/// (`reason="hashes_dropped"`), so a stalled bus holds a bounded number of bytes, not
/// [`OUTBOX_CAPACITY`] agentic prompts' worth.
pub const QUEUED_BLOCKS_CAPACITY: u64 = 1 << 22;

/// This replica's side of the bus on the request path.
pub struct Outbox {
    next: AtomicU64,
    queue: mpsc::Sender<BookingNote>,
    /// Block hashes carried by the bookings queued.
    queued_blocks: AtomicU64,
    live: Mutex<HashMap<u64, LiveBooking>>,
    metrics: ReplicaBusMetrics,
}

impl Outbox {
    /// An outbox and the receiver the bus task drains.
    pub fn new(metrics: ReplicaBusMetrics) -> (Outbox, mpsc::Receiver<BookingNote>) {
        let (queue, rx) = mpsc::channel(OUTBOX_CAPACITY);
        (
            Outbox {
                next: AtomicU64::new(0),
                queue,
                queued_blocks: AtomicU64::new(0),
                live: Mutex::new(HashMap::new()),
                metrics,
            },
            rx,
        )
    }

    /// This replica's live bookings, for a snapshot.
    pub fn live(&self) -> Vec<LiveBooking> {
        let mut v: Vec<LiveBooking> = self.lock().values().cloned().collect();
        v.sort_by_key(|b| b.request);
        v
    }

    /// The bus task took `note` off the queue.
    pub fn taken(&self, note: &BookingNote) {
        let n = blocks_of(note);
        if n > 0 {
            let _ = self
                .queued_blocks
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                    Some(q.saturating_sub(n))
                });
        }
    }

    /// `note`, or without its hashes when the queue holds its share of them already.
    fn bounded(&self, mut note: BookingNote) -> BookingNote {
        let n = blocks_of(&note);
        if n == 0 {
            return note;
        }
        let queued = self.queued_blocks.fetch_add(n, Ordering::Relaxed);
        if queued + n > QUEUED_BLOCKS_CAPACITY {
            self.queued_blocks.fetch_sub(n, Ordering::Relaxed);
            if let BookingStep::Booked { blocks, .. } = &mut note.step {
                *blocks = Default::default();
            }
            self.metrics
                .lost
                .with_label_values(&["hashes_dropped"])
                .inc();
        }
        note
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, LiveBooking>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn track(&self, note: &BookingNote) {
        let mut live = self.lock();
        match &note.step {
            BookingStep::Booked {
                prompt_tokens,
                prefill_tokens,
                ..
            } => {
                live.insert(
                    note.request,
                    LiveBooking {
                        request: note.request,
                        target: note.target.clone(),
                        prompt_tokens: *prompt_tokens,
                        prefill_tokens: *prefill_tokens,
                        first_token: false,
                    },
                );
            }
            BookingStep::FirstToken => {
                if let Some(b) = live.get_mut(&note.request) {
                    b.first_token = true;
                }
            }
            BookingStep::Freed => {
                live.remove(&note.request);
            }
        }
    }
}

impl BookingSink for Outbox {
    fn next_request(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn announce(&self, note: BookingNote) {
        self.track(&note);
        let note = self.bounded(note);
        if let Err(e) = self.queue.try_send(note) {
            self.taken(&e.into_inner());
            self.metrics.lost.with_label_values(&["outbox_full"]).inc();
        }
    }
}

/// Block hashes a note carries.
fn blocks_of(note: &BookingNote) -> u64 {
    match &note.step {
        BookingStep::Booked { blocks, .. } => blocks.hashes.len() as u64,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::TargetKey;

    fn note(request: u64, step: BookingStep) -> BookingNote {
        BookingNote {
            target: TargetKey {
                worker: "w".into(),
                rank: 0,
            },
            request,
            step,
        }
    }

    #[test]
    fn the_live_list_follows_announcements_even_when_the_queue_is_full() {
        let metrics = crate::metrics::Metrics::new().replica_bus;
        let (outbox, mut rx) = Outbox::new(metrics.clone());
        let booked = BookingStep::Booked {
            prompt_tokens: 10,
            prefill_tokens: 4,
            blocks: Default::default(),
        };
        for i in 0..OUTBOX_CAPACITY as u64 + 2 {
            outbox.announce(note(i, booked.clone()));
        }
        assert_eq!(metrics.lost.with_label_values(&["outbox_full"]).get(), 2);
        outbox.announce(note(1, BookingStep::FirstToken));
        outbox.announce(note(0, BookingStep::Freed));
        let live = outbox.live();
        assert_eq!(live.len(), OUTBOX_CAPACITY + 1);
        assert_eq!((live[0].request, live[0].first_token), (1, true));
        assert_eq!(rx.try_recv().unwrap(), note(0, booked), "queued in order");
    }

    #[test]
    fn queued_bookings_carry_a_bounded_number_of_hashes() {
        let metrics = crate::metrics::Metrics::new().replica_bus;
        let (outbox, mut rx) = Outbox::new(metrics.clone());
        let hashes: Vec<crate::tokens::BlockHash> = (0
            ..crate::fleet::booking::MAX_ANNOUNCED_BLOCKS as u64)
            .map(crate::tokens::BlockHash)
            .collect();
        let booked = BookingStep::Booked {
            prompt_tokens: 1 << 20,
            prefill_tokens: 1 << 20,
            blocks: crate::fleet::booking::PromptBlocks::of(&hashes, 16),
        };
        let fit = QUEUED_BLOCKS_CAPACITY / hashes.len() as u64;
        for i in 0..=fit {
            outbox.announce(note(i, booked.clone()));
        }
        let dropped = metrics.lost.with_label_values(&["hashes_dropped"]);
        assert_eq!(
            dropped.get(),
            1,
            "the booking past the bound goes without hashes"
        );
        let mut carried = Vec::new();
        while let Ok(n) = rx.try_recv() {
            carried.push(blocks_of(&n));
            outbox.taken(&n);
        }
        assert_eq!(
            carried.len() as u64,
            fit + 1,
            "every booking is still announced"
        );
        assert_eq!(carried.iter().filter(|&&b| b == 0).count(), 1);
        // Taken off the queue, they make room again.
        outbox.announce(note(fit + 1, booked));
        assert_eq!(dropped.get(), 1);
    }
}
