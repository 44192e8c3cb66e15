//! A per-worker circuit breaker driven by the outcomes of real requests.
//!
//! Active health checks see a worker every few seconds; live traffic sees it on every
//! request. After `failure_threshold` consecutive failures (refused connections, resets, 5xx)
//! the circuit opens and the worker gets no requests for `open_for`. Then one probe request is
//! let through (half-open): success closes the circuit, failure opens it again. Time is passed
//! in, so the state machine is tested without sleeping.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Breaker settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the circuit.
    pub failure_threshold: u32,
    /// How long the circuit stays open before a probe.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
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

#[derive(Debug)]
enum Inner {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// One worker's circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    inner: Mutex<Inner>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Breaker {
        Breaker {
            config,
            inner: Mutex::new(Inner::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
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
            Inner::HalfOpen { probing } => !probing,
        }
    }

    /// Claims the right to send a request at `now`; in half-open state only one caller gets
    /// it until its outcome is recorded.
    pub fn acquire(&self, now: Instant) -> bool {
        let mut g = self.lock();
        match *g {
            Inner::Closed { .. } => true,
            Inner::Open { until } if now >= until => {
                *g = Inner::HalfOpen { probing: true };
                true
            }
            Inner::Open { .. } => false,
            Inner::HalfOpen { probing: false } => {
                *g = Inner::HalfOpen { probing: true };
                true
            }
            Inner::HalfOpen { probing: true } => false,
        }
    }

    /// A request succeeded.
    pub fn record_success(&self) {
        *self.lock() = Inner::Closed { failures: 0 };
    }

    /// A request failed at `now`; returns true if this opened the circuit.
    pub fn record_failure(&self, now: Instant) -> bool {
        let mut g = self.lock();
        let open = match *g {
            Inner::Closed { failures } => failures + 1 >= self.config.failure_threshold,
            Inner::HalfOpen { .. } => true,
            Inner::Open { .. } => false,
        };
        *g = if open {
            Inner::Open {
                until: now + self.config.open_for,
            }
        } else {
            match *g {
                Inner::Closed { failures } => Inner::Closed {
                    failures: failures + 1,
                },
                Inner::Open { until } => Inner::Open { until },
                Inner::HalfOpen { probing } => Inner::HalfOpen { probing },
            }
        };
        open
    }

    /// Closes the circuit (e.g. a worker re-added by an operator).
    pub fn reset(&self) {
        self.record_success();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig {
            failure_threshold: 3,
            open_for: Duration::from_secs(10),
        })
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = breaker();
        let t = Instant::now();
        assert!(!b.record_failure(t));
        assert!(!b.record_failure(t));
        b.record_success();
        assert!(!b.record_failure(t));
        assert!(!b.record_failure(t));
        assert!(b.record_failure(t));
        assert_eq!(b.state(t), CircuitState::Open);
        assert!(!b.allows(t) && !b.acquire(t));
    }

    #[test]
    fn half_open_lets_exactly_one_probe_through() {
        let b = breaker();
        let t = Instant::now();
        for _ in 0..3 {
            b.record_failure(t);
        }
        let later = t + Duration::from_secs(11);
        assert_eq!(b.state(later), CircuitState::HalfOpen);
        assert!(b.acquire(later));
        assert!(!b.acquire(later), "second probe refused");
        // The probe failed: open again for another period.
        assert!(b.record_failure(later));
        assert!(!b.acquire(later + Duration::from_secs(5)));
        let much_later = later + Duration::from_secs(11);
        assert!(b.acquire(much_later));
        b.record_success();
        assert_eq!(b.state(much_later), CircuitState::Closed);
        assert!(b.acquire(much_later) && b.acquire(much_later));
    }
}
