//! The pure decisions of the intake threads ([`super::intake`]): which thread a new
//! subscription joins, which socket a readiness token names, and when a subscription's sockets
//! still hold messages (ZeroMQ's edge-triggered readiness). Kept apart from the sockets so
//! the rules are tested without ZeroMQ.
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

/// Which socket of a subscription a readiness registration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// The SUB socket: live batches.
    Data = 0,
    /// The monitor's PAIR: connection events.
    Events = 1,
    /// The DEALER of a replay in flight.
    Replay = 2,
}

/// The token of a thread's own wake-up PAIR.
pub(super) const WAKE: usize = usize::MAX;

/// The readiness token of `role` of subscription `id`.
pub(super) fn token(id: u64, role: Role) -> usize {
    ((id as usize) << 2) | role as usize
}

/// The subscription and socket a token names; `None` for [`WAKE`] and for tokens no
/// subscription uses.
pub(super) fn named(token: usize) -> Option<(u64, Role)> {
    if token == WAKE {
        return None;
    }
    let role = match token & 3 {
        0 => Role::Data,
        1 => Role::Events,
        2 => Role::Replay,
        _ => return None,
    };
    Some(((token >> 2) as u64, role))
}

/// What one subscription's SUB and monitor sockets may still hold.
///
/// A ZeroMQ socket's `ZMQ_FD` signals that its state *changed*, not that it holds messages (it
/// is edge-triggered, libzmq's `zmq_getsockopt(3)`): after a signal the socket must be read
/// until it is empty, or it may never signal again for what it still holds. So a signalled
/// socket stays pending until a step has read it dry; a live socket left unread because the
/// consumer is behind (the stream's backlog) stays pending until the backlog clears and the
/// socket is read. Replay sockets need no flag: a stream steps at every wake-up while its
/// replay runs (deadlines), and reads the replay dry then.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Pending {
    data: bool,
    events: bool,
}

impl Pending {
    /// A fresh subscription: both sockets are read once, whatever was signalled before the
    /// thread watched them.
    pub(super) fn all() -> Pending {
        Pending {
            data: true,
            events: true,
        }
    }

    /// `role`'s socket signalled.
    pub(super) fn signal(&mut self, role: Role) {
        match role {
            Role::Data => self.data = true,
            Role::Events => self.events = true,
            Role::Replay => {}
        }
    }

    /// Whether the stream steps at this wake-up, and if so which sockets it reads (`data`,
    /// `events`): it steps when a socket is pending, or while it has a backlog to offer or a
    /// replay in flight. The SUB is not read while the consumer is behind.
    pub(super) fn due(&self, backlogged: bool, replaying: bool) -> Option<(bool, bool)> {
        let data = self.data && !backlogged;
        (data || self.events || backlogged || replaying).then_some((data, self.events))
    }

    /// A step read what `due` asked for; `backlogged` is the stream's state after it (a SUB
    /// read until the consumer fell behind still holds messages).
    pub(super) fn stepped(&mut self, read_data: bool, backlogged: bool) {
        if read_data && !backlogged {
            self.data = false;
        }
        self.events = false;
    }

    /// Whether a socket waits to be read at once (the thread must not sleep).
    pub(super) fn is_ready(&self, backlogged: bool) -> bool {
        (self.data && !backlogged) || self.events
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
    fn tokens_name_their_subscription_and_socket() {
        for (id, role) in [(0, Role::Data), (7, Role::Events), (1 << 40, Role::Replay)] {
            assert_eq!(named(token(id, role)), Some((id, role)));
        }
        assert_eq!(named(WAKE), None);
        assert_eq!(
            named(token(3, Role::Data) | 3),
            None,
            "no role has the value 3"
        );
        assert_ne!(token(1, Role::Data), token(0, Role::Events));
    }

    #[test]
    fn a_signalled_socket_stays_pending_until_a_step_reads_it_dry() {
        let mut p = Pending::default();
        assert_eq!(
            p.due(false, false),
            None,
            "nothing signalled, nothing to do"
        );
        assert_eq!(
            p.due(false, true),
            Some((false, false)),
            "a replay steps regardless"
        );
        p.signal(Role::Data);
        assert_eq!(p.due(false, false), Some((true, false)));
        // The consumer fell behind while the SUB was read: it still holds messages.
        p.stepped(true, true);
        assert_eq!(
            p.due(true, false),
            Some((false, false)),
            "offer the backlog, read nothing"
        );
        assert!(!p.is_ready(true));
        // The backlog cleared: read the SUB again although it signalled nothing new.
        assert_eq!(p.due(false, false), Some((true, false)));
        assert!(p.is_ready(false));
        p.stepped(true, false);
        assert_eq!(p.due(false, false), None);
        p.signal(Role::Events);
        p.signal(Role::Replay);
        assert_eq!(p.due(false, false), Some((false, true)));
        p.stepped(false, false);
        assert_eq!(p, Pending::default());
        assert_eq!(Pending::all().due(false, false), Some((true, true)));
    }
}
