//! A per-worker circuit breaker driven by the outcomes of real requests.
//!
//! Active health checks see a worker every few seconds; live traffic sees it on every
//! request. Only failures that say something about the worker are recorded (refused
//! connections, resets, no response head in time, 502/503/504, a stream cut short: see
//! `proxy`); a request whose own content makes the engine answer 500 is the request's answer,
//! not the worker's failure, or one tenant could take a model offline for everyone.
//!
//! The circuit opens when, within the last `window`, at least `min_requests` outcomes were
//! recorded and at least `failure_rate` of them were failures — a rate, not a run of
//! consecutive failures, so a few failures among many successes do not open it, and a
//! worker that fails most of its requests does even when the odd one succeeds. It then gets no
//! requests for `open_for`; after that one probe request is let through (half-open): success
//! closes the circuit with a fresh window, failure opens it again. Whether it may open at all
//! is the caller's to say (the fleet keeps the last routable worker of a model in service:
//! see `Worker::record_failure`). Time is passed in, so the state machine is tested without
//! sleeping.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Breaker settings (`[proxy] breaker_*`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerConfig {
    /// How far back outcomes count.
    pub window: Duration,
    /// Outcomes the window must hold before its failure rate is judged.
    pub min_requests: u32,
    /// Fraction of the window's outcomes that must be failures to open the circuit (0 < r ≤ 1).
    pub failure_rate: f64,
    /// How long the circuit stays open before a probe.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            window: Duration::from_secs(10),
            min_requests: 5,
            failure_rate: 0.5,
            open_for: Duration::from_secs(10),
        }
    }
}

/// The breaker's state, as exported in metrics (0, 1, 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CircuitState {
    /// Requests flow.
    Closed,
    /// No requests until the probe time.
    Open,
    /// One probe request is allowed.
    HalfOpen,
}

impl CircuitState {
    /// The metric value: closed 0, open 1, half-open 2.
    pub fn as_metric(self) -> i64 {
        match self {
            CircuitState::Closed => 0,
            CircuitState::Open => 1,
            CircuitState::HalfOpen => 2,
        }
    }

    /// A lower-case name for APIs and logs.
    pub fn name(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }
}

/// Buckets the window is cut into: outcomes expire a tenth of a window at a time, and memory
/// stays fixed however busy the worker.
const BUCKETS: usize = 10;

#[derive(Clone, Copy, Debug, Default)]
struct Bucket {
    /// Which slice of time it counts (0: never used).
    epoch: u64,
    ok: u32,
    failed: u32,
}

/// Outcomes of the last window, in time buckets.
#[derive(Clone, Debug, Default)]
struct Window {
    buckets: [Bucket; BUCKETS],
}

impl Window {
    fn record(&mut self, epoch: u64, failed: bool) {
        let b = &mut self.buckets[(epoch % BUCKETS as u64) as usize];
        if b.epoch != epoch {
            *b = Bucket {
                epoch,
                ..Bucket::default()
            };
        }
        if failed {
            b.failed = b.failed.saturating_add(1);
        } else {
            b.ok = b.ok.saturating_add(1);
        }
    }

    /// (outcomes, failures) of the buckets still inside the window at `epoch`.
    fn totals(&self, epoch: u64) -> (u64, u64) {
        self.buckets
            .iter()
            .filter(|b| b.epoch != 0 && b.epoch + BUCKETS as u64 > epoch)
            .fold((0, 0), |(n, f), b| {
                (
                    n + u64::from(b.ok) + u64::from(b.failed),
                    f + u64::from(b.failed),
                )
            })
    }
}

#[derive(Debug)]
enum Inner {
    Closed {
        window: Window,
    },
    Open {
        until: Instant,
    },
    /// `probe`: when the one probe request was let through, if it has been.
    HalfOpen {
        probe: Option<Instant>,
    },
}

impl Inner {
    fn closed() -> Inner {
        Inner::Closed {
            window: Window::default(),
        }
    }
}

/// One worker's circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    /// Origin of the window's time buckets.
    origin: Instant,
    inner: Mutex<Inner>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Breaker {
        Breaker {
            config,
            origin: Instant::now(),
            inner: Mutex::new(Inner::closed()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The window's time bucket of `now` (from 1).
    fn epoch(&self, now: Instant) -> u64 {
        let bucket = (self.config.window.as_nanos() / BUCKETS as u128).max(1);
        let since = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(since / bucket).unwrap_or(u64::MAX - 1) + 1
    }

    /// Whether a probe let through at `at` is still awaited at `now`. A probe whose outcome
    /// never comes (its client went away before the worker answered) is given up after
    /// `open_for`, or the circuit would stay half-open with its one probe taken forever.
    fn probe_pending(&self, at: Option<Instant>, now: Instant) -> bool {
        at.is_some_and(|at| now < at + self.config.open_for)
    }

    /// The state at `now` (an open circuit past its time reads as half-open).
    pub fn state(&self, now: Instant) -> CircuitState {
        match *self.lock() {
            Inner::Closed { .. } => CircuitState::Closed,
            Inner::Open { until } if now >= until => CircuitState::HalfOpen,
            Inner::Open { .. } => CircuitState::Open,
            Inner::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    /// Whether the worker may be offered a request at `now` (without claiming the probe).
    pub fn allows(&self, now: Instant) -> bool {
        match *self.lock() {
            Inner::Closed { .. } => true,
            Inner::Open { until } => now >= until,
            Inner::HalfOpen { probe } => !self.probe_pending(probe, now),
        }
    }

    /// Claims the right to send a request at `now`; in half-open state only one caller gets
    /// it until its outcome is recorded.
    pub fn acquire(&self, now: Instant) -> bool {
        let mut g = self.lock();
        match *g {
            Inner::Closed { .. } => true,
            Inner::Open { until } if now >= until => {
                *g = Inner::HalfOpen { probe: Some(now) };
                true
            }
            Inner::Open { .. } => false,
            Inner::HalfOpen { probe } if self.probe_pending(probe, now) => false,
            Inner::HalfOpen { .. } => {
                *g = Inner::HalfOpen { probe: Some(now) };
                true
            }
        }
    }

    /// A request was answered at `now`. A half-open circuit closes with a fresh window; an
    /// open one stays open (the answer is from a request sent before it opened).
    pub fn record_success(&self, now: Instant) {
        let epoch = self.epoch(now);
        let mut g = self.lock();
        match &mut *g {
            Inner::Closed { window } => window.record(epoch, false),
            Inner::HalfOpen { .. } => *g = Inner::closed(),
            Inner::Open { .. } => {}
        }
    }

    /// A request failed at `now`; returns true if this opened the circuit. `may_open` is asked
    /// only when the window (or a failed probe) calls for opening; when it says no, the circuit
    /// stays closed (a failed probe closes it with a fresh window).
    pub fn record_failure(&self, now: Instant, may_open: impl FnOnce() -> bool) -> bool {
        let epoch = self.epoch(now);
        let mut g = self.lock();
        let trips = match &mut *g {
            Inner::Closed { window } => {
                window.record(epoch, true);
                let (n, failed) = window.totals(epoch);
                n >= u64::from(self.config.min_requests)
                    && failed as f64 >= self.config.failure_rate * n as f64
            }
            Inner::HalfOpen { .. } => true,
            Inner::Open { .. } => return false,
        };
        if !trips {
            return false;
        }
        if may_open() {
            *g = Inner::Open {
                until: now + self.config.open_for,
            };
            true
        } else {
            if matches!(*g, Inner::HalfOpen { .. }) {
                *g = Inner::closed();
            }
            false
        }
    }

    /// Closes the circuit with a fresh window (e.g. a worker that passed its health checks
    /// again).
    pub fn reset(&self) {
        *self.lock() = Inner::closed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            window: Duration::from_secs(10),
            min_requests: 4,
            failure_rate: 0.5,
            open_for: Duration::from_secs(10),
        }
    }

    fn yes() -> bool {
        true
    }

    #[test]
    fn opens_on_a_failure_rate_over_enough_requests() {
        let b = Breaker::new(config());
        let t = Instant::now();
        // Three failures: fewer outcomes than min_requests, however bad.
        for _ in 0..3 {
            assert!(!b.record_failure(t, yes));
        }
        assert_eq!(b.state(t), CircuitState::Closed);
        // Many successes dilute them: 4 failures in 14 outcomes stay under 50 %.
        for _ in 0..10 {
            b.record_success(t);
        }
        assert!(!b.record_failure(t, yes));
        assert_eq!(b.state(t), CircuitState::Closed);
        // Successes interleaved with failures do not reset the count (no consecutive run is
        // needed): it opens once half of the window's outcomes are failures, here 12 of 24.
        let mut opened_at = None;
        for i in 0..12 {
            if i % 6 == 0 {
                b.record_success(t);
            } else if b.record_failure(t, yes) {
                opened_at = Some(i);
            }
        }
        assert_eq!(opened_at, Some(9));
        assert_eq!(b.state(t), CircuitState::Open);
        assert!(!b.allows(t) && !b.acquire(t));
    }

    #[test]
    fn old_outcomes_leave_the_window() {
        let b = Breaker::new(config());
        let t = Instant::now();
        for _ in 0..3 {
            b.record_failure(t, yes);
        }
        // A window later those three no longer count: one more failure is 1 of 1 < min.
        let later = t + Duration::from_secs(11);
        assert!(!b.record_failure(later, yes));
        assert_eq!(b.state(later), CircuitState::Closed);
        for _ in 0..3 {
            b.record_failure(later, yes);
        }
        assert_eq!(b.state(later), CircuitState::Open);
    }

    #[test]
    fn a_refused_opening_keeps_the_circuit_closed() {
        let b = Breaker::new(config());
        let t = Instant::now();
        let mut asked = 0;
        for _ in 0..20 {
            assert!(!b.record_failure(t, || {
                asked += 1;
                false
            }));
        }
        assert_eq!(b.state(t), CircuitState::Closed);
        assert!(b.allows(t) && b.acquire(t));
        assert_eq!(asked, 17, "asked only once the window calls for opening");
    }

    #[test]
    fn half_open_lets_exactly_one_probe_through() {
        let b = Breaker::new(config());
        let t = Instant::now();
        for _ in 0..4 {
            b.record_failure(t, yes);
        }
        let later = t + Duration::from_secs(11);
        assert_eq!(b.state(later), CircuitState::HalfOpen);
        assert!(b.acquire(later));
        assert!(!b.acquire(later), "second probe refused");
        // A success of a request sent before the circuit opened does not close it.
        let b2 = Breaker::new(config());
        for _ in 0..4 {
            b2.record_failure(t, yes);
        }
        b2.record_success(t);
        assert_eq!(b2.state(t), CircuitState::Open);
        // The probe failed: open again for another period.
        assert!(b.record_failure(later, yes));
        assert!(!b.acquire(later + Duration::from_secs(5)));
        let much_later = later + Duration::from_secs(11);
        assert!(b.acquire(much_later));
        b.record_success(much_later);
        assert_eq!(b.state(much_later), CircuitState::Closed);
        assert!(b.acquire(much_later) && b.acquire(much_later));
        // Closed with a fresh window: one failure does not reopen it.
        assert!(!b.record_failure(much_later, yes));
    }

    #[test]
    fn a_failed_probe_of_the_last_worker_closes_the_circuit() {
        let b = Breaker::new(config());
        let t = Instant::now();
        for _ in 0..4 {
            b.record_failure(t, yes);
        }
        let later = t + Duration::from_secs(11);
        assert!(b.acquire(later));
        assert!(!b.record_failure(later, || false));
        assert_eq!(b.state(later), CircuitState::Closed);
    }

    #[test]
    fn an_abandoned_probe_is_given_up_after_the_open_period() {
        let b = Breaker::new(config());
        let t = Instant::now();
        for _ in 0..4 {
            b.record_failure(t, yes);
        }
        let probe = t + Duration::from_secs(11);
        assert!(b.acquire(probe));
        // Its outcome never comes (the client hung up before the worker answered).
        assert!(!b.allows(probe + Duration::from_secs(5)));
        let after = probe + Duration::from_secs(10);
        assert!(b.allows(after));
        assert!(b.acquire(after));
        assert!(!b.acquire(after));
    }
}
