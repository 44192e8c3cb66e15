//! What a sequence number says about the stream: in order, a gap, or a restarted publisher.
//!
//! Pure so that the rules are tested without sockets. The subscriber acts on the verdicts:
//! replay a gap, reset the worker's entries on a restart.

/// How one arriving sequence number relates to the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The next expected number, or the very first message at 0.
    InOrder,
    /// The first message of this subscription, after earlier ones we never saw (we joined an
    /// engine that was already running, or subscribed late). Replaying from 0 warms the index.
    Joined,
    /// Numbers `from..seq` were missed.
    Gap {
        /// The first missed number.
        from: u64,
    },
    /// The number went backwards (or repeated): the publisher restarted and counts from 0 again.
    Restart {
        /// The last number seen from the previous publisher.
        last: u64,
    },
}

/// Tracks the expected next sequence number of one publisher.
#[derive(Clone, Debug, Default)]
pub struct SequenceTracker {
    next: Option<u64>,
}

impl SequenceTracker {
    /// Classifies `seq` and makes it the latest seen.
    pub fn observe(&mut self, seq: u64) -> Arrival {
        let arrival = self.classify(seq);
        self.next = Some(seq.saturating_add(1));
        arrival
    }

    /// Classifies `seq` without recording it (the subscriber may hold it for a replay first).
    pub fn classify(&self, seq: u64) -> Arrival {
        match self.next {
            None if seq == 0 => Arrival::InOrder,
            None => Arrival::Joined,
            Some(next) if seq == next => Arrival::InOrder,
            Some(next) if seq > next => Arrival::Gap { from: next },
            Some(next) => Arrival::Restart {
                last: next.saturating_sub(1),
            },
        }
    }

    /// Sets the number expected next (`None`: nothing seen yet), after a replay delivered
    /// batches or a loss was declared.
    pub fn expect(&mut self, next: Option<u64>) {
        self.next = next;
    }

    /// The number expected next, if any message was seen.
    pub fn next(&self) -> Option<u64> {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_each_case() {
        let mut t = SequenceTracker::default();
        assert_eq!(t.observe(0), Arrival::InOrder);
        assert_eq!(t.observe(1), Arrival::InOrder);
        assert_eq!(t.observe(4), Arrival::Gap { from: 2 });
        assert_eq!(t.observe(5), Arrival::InOrder);
        assert_eq!(t.observe(2), Arrival::Restart { last: 5 });
        assert_eq!(t.observe(3), Arrival::InOrder);
        assert_eq!(t.observe(3), Arrival::Restart { last: 3 });
        assert_eq!(t.next(), Some(4));
    }

    #[test]
    fn joining_late_is_not_a_gap() {
        let mut t = SequenceTracker::default();
        assert_eq!(t.observe(7), Arrival::Joined);
        assert_eq!(t.observe(8), Arrival::InOrder);
        assert_eq!(t.classify(12), Arrival::Gap { from: 9 });
        assert_eq!(t.next(), Some(9), "classifying records nothing");
        t.expect(Some(12));
        assert_eq!(t.observe(12), Arrival::InOrder);
    }
}
