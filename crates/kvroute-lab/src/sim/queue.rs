//! The event queue of virtual time.
//!
//! Events are ordered by time, then by insertion: two events at the same instant happen in
//! the order they were scheduled. That tie-break is what makes a run deterministic (a heap
//! alone would order equal times arbitrarily) and lets a worker that is kicked at time `t`
//! see every request that arrived at `t` before it plans its step, as the real engine loop
//! drains its inbox before stepping.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry<E> {
    at: f64,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    /// Reversed, so the max-heap pops the earliest (then first-scheduled) entry.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .total_cmp(&self.at)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// Events of type `E` in time order, ties in scheduling order.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    next_seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// Schedules `event` at time `at` (seconds).
    pub fn push(&mut self, at: f64, event: E) {
        self.heap.push(Entry {
            at,
            seq: self.next_seq,
            event,
        });
        self.next_seq += 1;
    }

    /// The earliest event with its time.
    pub fn pop(&mut self) -> Option<(f64, E)> {
        self.heap.pop().map(|e| (e.at, e.event))
    }

    /// Time of the earliest event.
    pub fn peek_at(&self) -> Option<f64> {
        self.heap.peek().map(|e| e.at)
    }

    /// Events still scheduled.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_by_time_then_by_insertion() {
        let mut q = EventQueue::default();
        q.push(2.0, "c");
        q.push(1.0, "a");
        q.push(1.0, "b");
        q.push(0.5, "first");
        let order: Vec<&str> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, ["first", "a", "b", "c"]);
        assert!(q.is_empty());
    }
}
