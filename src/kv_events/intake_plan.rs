//! The pure decisions of the intake threads ([`super::intake`]): which thread a new
//! subscription joins, and which of a thread's sockets a poll found ready, subscription by
//! subscription. Kept apart from the sockets so the rules are tested without ZeroMQ.
//!
//! Why a thread serves many subscriptions: with a thread per engine, 1,024 engines publishing
//! 50 batches a second woke 1,024 threads 51,200 times a second (about 13 µs of CPU a batch),
//! and the lag goal was missed by far (docs/benchmarks.md, "Event-to-index lag"). A thread
//! that polls hundreds of SUB sockets at once wakes once for everything ready since its last
//! wake-up: the busier the fleet, the more batches each wake-up takes.

/// Subscriptions one intake thread takes before a new thread is started, unless the
/// subscription's config says otherwise. 1,024 engines are read by 4 threads.
pub const DEFAULT_ENGINES_PER_INTAKE: usize = 256;

/// The thread a new subscription joins: the least loaded one with fewer than `per_thread`
/// subscriptions (the first of equals), or `None` when every thread is full and a new one
/// must be started. A `per_thread` of 0 counts as 1.
pub(super) fn place(loads: &[usize], per_thread: usize) -> Option<usize> {
    let per_thread = per_thread.max(1);
    loads
        .iter()
        .enumerate()
        .filter(|(_, load)| **load < per_thread)
        .min_by_key(|(i, load)| (**load, *i))
        .map(|(i, _)| i)
}

/// Which socket of a subscription a poll item is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// The SUB socket: live batches.
    Data,
    /// The monitor's PAIR: connection events.
    Events,
    /// The DEALER of a replay in flight.
    Replay,
}

/// What a poll found for one subscription.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Ready {
    /// Position of the subscription in the thread's list.
    pub slot: usize,
    /// Its SUB socket has messages.
    pub data: bool,
    /// Its monitor has connection events.
    pub events: bool,
    /// Its replay DEALER has replies.
    pub replay: bool,
}

/// The order of a thread's poll items: which subscription and socket each one is. Items of one
/// subscription are pushed together.
#[derive(Debug, Default)]
pub(super) struct PollLayout {
    items: Vec<(usize, Role)>,
}

impl PollLayout {
    /// An empty layout with room for `n` items.
    pub(super) fn with_capacity(n: usize) -> PollLayout {
        PollLayout {
            items: Vec::with_capacity(n),
        }
    }

    /// The next poll item is `role` of subscription `slot`.
    pub(super) fn push(&mut self, slot: usize, role: Role) {
        self.items.push((slot, role));
    }

    /// The subscriptions with at least one readable item, in slot order, given each item's
    /// readability in push order (`readable[i]` for the i-th pushed item).
    pub(super) fn ready(&self, readable: &[bool]) -> Vec<Ready> {
        let mut out: Vec<Ready> = Vec::new();
        for (&(slot, role), _) in self.items.iter().zip(readable).filter(|(_, r)| **r) {
            if out.last().is_none_or(|r| r.slot != slot) {
                out.push(Ready {
                    slot,
                    ..Ready::default()
                });
            }
            if let Some(r) = out.last_mut() {
                match role {
                    Role::Data => r.data = true,
                    Role::Events => r.events = true,
                    Role::Replay => r.replay = true,
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_joins_the_least_loaded_thread_with_room() {
        assert_eq!(place(&[], 256), None, "no thread yet: start one");
        assert_eq!(place(&[3, 1, 1], 256), Some(1));
        assert_eq!(place(&[256, 255], 256), Some(1));
        assert_eq!(place(&[256, 256], 256), None, "all full: start another");
        assert_eq!(place(&[0], 0), Some(0), "0 counts as 1");
        assert_eq!(place(&[1], 0), None);
    }

    #[test]
    fn readiness_is_grouped_by_subscription() {
        let mut layout = PollLayout::with_capacity(6);
        layout.push(0, Role::Data);
        layout.push(0, Role::Events);
        // Subscription 1 is backlogged: its SUB is not polled.
        layout.push(1, Role::Events);
        layout.push(1, Role::Replay);
        layout.push(2, Role::Data);
        layout.push(2, Role::Events);
        let ready = layout.ready(&[true, true, false, true, false, false]);
        assert_eq!(
            ready,
            vec![
                Ready {
                    slot: 0,
                    data: true,
                    events: true,
                    replay: false
                },
                Ready {
                    slot: 1,
                    data: false,
                    events: false,
                    replay: true
                },
            ]
        );
        assert!(layout.ready(&[false; 6]).is_empty());
    }
}
