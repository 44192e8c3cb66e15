//! How many router replicas share the reading of the engines' load, so that the engines pay for
//! one reader whatever the number of replicas.
//!
//! Each replica reads every engine's `/metrics` to learn the requests other replicas sent
//! there (the router's `fleet::load_poller`). A real vLLM API server spends 4–6 ms of CPU
//! rendering one
//! 50 KB exposition: at 10 readings a second, 8 replicas took a third of a core from the
//! process that also tokenizes and streams the engine's requests (docs/benchmarks.md,
//! "Engine-side polling cost"). With a replica bus the replicas already know each other's
//! bookings; an engine's reading is only the check for load no replica announced. So while a
//! replica hears `n` others on the bus, it reads each engine `n + 1` times less often: the
//! engine sees one reading per interval in all, however many replicas there are. Losing the
//! bus (or the others' heartbeats) brings every replica back to the full rate, since readings
//! are then all it has.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// The replicas sharing the reading: this one and the peers heard on the replica bus.
#[derive(Debug)]
pub struct PollShare {
    replicas: AtomicU32,
}

impl Default for PollShare {
    fn default() -> Self {
        PollShare {
            replicas: AtomicU32::new(1),
        }
    }
}

impl PollShare {
    /// `peers` other replicas are heard on the bus now (0 when it is lost).
    pub fn set_peers(&self, peers: usize) {
        let replicas = u32::try_from(peers).unwrap_or(u32::MAX).saturating_add(1);
        self.replicas.store(replicas, Ordering::Relaxed);
    }

    /// Replicas sharing the reading, this one included (at least 1).
    pub fn replicas(&self) -> u32 {
        self.replicas.load(Ordering::Relaxed).max(1)
    }

    /// How often this replica reads each engine, given the configured `base` interval.
    pub fn interval(&self, base: Duration) -> Duration {
        base.saturating_mul(self.replicas())
    }
}

/// Which of `replicas` replicas read the engines at the `turn`-th reading instant of a fleet
/// read every interval: all of them alone, one in turn when they share the reading (each then
/// reads every `replicas` intervals, staggered, as [`PollShare::interval`] has the live ones
/// do). The simulator's readings.
pub fn readers(replicas: usize, shared: bool, turn: usize) -> std::ops::Range<usize> {
    match (shared, replicas) {
        (_, 0) => 0..0,
        (true, n) => turn % n..turn % n + 1,
        (false, n) => 0..n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_heard_on_the_bus_stretch_each_ones_interval_so_the_engine_sees_one() {
        let share = PollShare::default();
        let base = Duration::from_millis(100);
        assert_eq!(share.interval(base), base, "alone: the configured interval");
        share.set_peers(7);
        assert_eq!(share.replicas(), 8);
        assert_eq!(share.interval(base), Duration::from_millis(800));
        // Eight replicas each reading every 800 ms: 10 readings a second at the engine, as one.
        assert_eq!(
            f64::from(share.replicas()) / share.interval(base).as_secs_f64(),
            1.0 / base.as_secs_f64()
        );
        share.set_peers(0);
        assert_eq!(
            share.interval(base),
            base,
            "the bus lost: back to the full rate"
        );
        share.set_peers(usize::MAX);
        assert_eq!(share.replicas(), u32::MAX);
    }

    #[test]
    fn simulated_replicas_sharing_the_reading_take_turns() {
        let turns: Vec<_> = (0..6).map(|t| readers(3, true, t)).collect();
        assert_eq!(turns, [0..1, 1..2, 2..3, 0..1, 1..2, 2..3]);
        assert_eq!(
            readers(3, false, 4),
            0..3,
            "no bus: every replica reads every time"
        );
        assert!(readers(0, true, 2).is_empty());
    }
}
