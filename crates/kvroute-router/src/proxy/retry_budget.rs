//! A retry budget: retries may add at most a fixed fraction of recent traffic.
//!
//! Retrying a failed attempt on another worker hides a single bad replica from clients, but
//! during a fleet-wide outage every request fails and retries would multiply the load on the
//! survivors. The budget allows `ratio` retries per request seen in a sliding window, plus a
//! small floor so an idle router can still retry.
//!
//! The bookkeeping is tower's [`TpsBudget`]: a token bucket over ten slots of the window, each
//! request depositing and each retry withdrawing, lock-free but for a slot's turn — not one
//! queue entry per request. It reads tokio's clock (the system's, outside tokio's `test-util`). Its units are whole: `ratio` is taken as
//! one retry per `⌊1 / ratio⌋` requests (0.2: one per 5; 0.3: one per 3) up to 1, as `ratio`
//! retries per request above, and `min_per_s` rounded up to whole retries per second.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tower::retry::budget::{Budget, TpsBudget};

/// Budget settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryBudgetConfig {
    /// Retries allowed per request in the window (0.2 = at most 20 % extra load).
    pub ratio: f64,
    /// Retries always allowed per second, whatever the traffic.
    pub min_per_s: f64,
    /// Length of the sliding window (1 to 60 s).
    pub window: Duration,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig {
            ratio: 0.2,
            min_per_s: 2.0,
            window: Duration::from_secs(10),
        }
    }
}

/// Most retries per request tower's budget takes (more is no limit at all: a request is
/// retried at most `proxy.retries` times).
const MAX_RATIO: f64 = 1000.0;

/// The shared retry budget of one router.
pub struct RetryBudget {
    /// The settings it was made with, and the bucket; a reload with other settings swaps in
    /// a new bucket.
    current: ArcSwap<(RetryBudgetConfig, TpsBudget)>,
}

impl std::fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let current = self.current.load();
        f.debug_struct("RetryBudget")
            .field("config", &current.0)
            .field("budget", &current.1)
            .finish()
    }
}

impl RetryBudget {
    /// A budget with `config`.
    pub fn new(config: RetryBudgetConfig) -> RetryBudget {
        RetryBudget {
            current: ArcSwap::from_pointee((config, bucket(config))),
        }
    }

    /// New settings (a config reload). Unchanged settings keep the traffic and retries seen
    /// so far; changed ones start a new window.
    pub fn set_config(&self, config: RetryBudgetConfig) {
        if self.current.load().0 != config {
            self.current.store(Arc::new((config, bucket(config))));
        }
    }

    /// Counts a client request.
    pub fn record_request(&self) {
        self.current.load().1.deposit();
    }

    /// Takes one retry from the budget if any is left.
    pub fn try_retry(&self) -> bool {
        self.current.load().1.withdraw()
    }
}

/// Tower's bucket for `config`, its values brought into the ranges it takes.
fn bucket(config: RetryBudgetConfig) -> TpsBudget {
    let window = config
        .window
        .clamp(Duration::from_secs(1), Duration::from_secs(60));
    let min_per_s = config
        .min_per_s
        .max(0.0)
        .ceil()
        .min(f64::from(i32::MAX - 1)) as u32;
    let ratio = config.ratio.clamp(0.0, MAX_RATIO) as f32;
    TpsBudget::new(window, min_per_s, ratio)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_bounded_by_a_fraction_of_traffic() {
        // The shortest window tower takes: the test waits it out on the real clock (tower's
        // budget reads tokio's, which only tokio's `test-util` could move; that feature would
        // put a lock into every clock read of the tests' and benches' builds).
        let window = Duration::from_secs(1);
        let b = RetryBudget::new(RetryBudgetConfig {
            ratio: 0.1,
            min_per_s: 0.0,
            window,
        });
        for _ in 0..100 {
            b.record_request();
        }
        let granted = (0..100).filter(|_| b.try_retry()).count();
        assert_eq!(granted, 10);
        // The window slides: old traffic and old retries no longer count.
        std::thread::sleep(window + Duration::from_millis(200));
        assert!(!b.try_retry());
        for _ in 0..20 {
            b.record_request();
        }
        assert_eq!((0..10).filter(|_| b.try_retry()).count(), 2);
    }

    #[test]
    fn an_idle_router_still_gets_the_floor() {
        let b = RetryBudget::new(RetryBudgetConfig {
            ratio: 0.2,
            min_per_s: 1.0,
            window: Duration::from_secs(5),
        });
        assert_eq!((0..20).filter(|_| b.try_retry()).count(), 5);
    }

    #[test]
    fn a_reload_keeps_the_window_unless_the_settings_change() {
        let config = RetryBudgetConfig {
            ratio: 1.0,
            min_per_s: 0.0,
            window: Duration::from_secs(10),
        };
        let b = RetryBudget::new(config);
        for _ in 0..3 {
            b.record_request();
        }
        b.set_config(config);
        assert_eq!((0..10).filter(|_| b.try_retry()).count(), 3);
        b.record_request();
        b.set_config(RetryBudgetConfig {
            ratio: 0.5,
            ..config
        });
        assert!(!b.try_retry(), "new settings start a new window");
    }

    #[test]
    fn settings_out_of_tower_s_ranges_are_brought_into_them() {
        // Each would make `TpsBudget::new` panic as it is.
        let b = RetryBudget::new(RetryBudgetConfig {
            ratio: 1e9,
            min_per_s: 0.5,
            window: Duration::from_secs(600),
        });
        assert!(
            b.try_retry(),
            "half a retry per second is rounded up to one"
        );
    }
}
