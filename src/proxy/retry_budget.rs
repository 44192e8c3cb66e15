//! A retry budget: retries may add at most a fixed fraction of recent traffic.
//!
//! Retrying a failed attempt on another worker hides a single bad replica from clients, but
//! during a fleet-wide outage every request fails and retries would multiply the load on the
//! survivors. The budget allows `ratio` retries per request seen in a sliding window, plus a
//! small floor so an idle router can still retry. Time is passed in.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Budget settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryBudgetConfig {
    /// Retries allowed per request in the window (0.2 = at most 20 % extra load).
    pub ratio: f64,
    /// Retries always allowed per second, whatever the traffic.
    pub min_per_s: f64,
    /// Length of the sliding window.
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

#[derive(Debug, Default)]
struct Window {
    /// The settings, under the window's lock: a reload changes them between two requests.
    config: RetryBudgetConfig,
    requests: VecDeque<Instant>,
    retries: VecDeque<Instant>,
}

/// The shared retry budget of one router.
#[derive(Debug)]
pub struct RetryBudget {
    window: Mutex<Window>,
}

impl RetryBudget {
    /// A budget with `config`.
    pub fn new(config: RetryBudgetConfig) -> RetryBudget {
        RetryBudget {
            window: Mutex::new(Window {
                config,
                ..Window::default()
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        match self.window.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    fn expire(w: &mut Window, now: Instant, window: Duration) {
        let Some(cut) = now.checked_sub(window) else {
            return;
        };
        while w.requests.front().is_some_and(|t| *t < cut) {
            w.requests.pop_front();
        }
        while w.retries.front().is_some_and(|t| *t < cut) {
            w.retries.pop_front();
        }
    }

    /// New settings (a config reload); the traffic and retries seen so far still count.
    pub fn set_config(&self, config: RetryBudgetConfig) {
        self.lock().config = config;
    }

    /// Counts a client request.
    pub fn record_request(&self, now: Instant) {
        let mut w = self.lock();
        let window = w.config.window;
        Self::expire(&mut w, now, window);
        w.requests.push_back(now);
    }

    /// Takes one retry from the budget if any is left.
    pub fn try_retry(&self, now: Instant) -> bool {
        let mut w = self.lock();
        let c = w.config;
        Self::expire(&mut w, now, c.window);
        let allowed = c.ratio * w.requests.len() as f64 + c.min_per_s * c.window.as_secs_f64();
        if (w.retries.len() as f64) < allowed {
            w.retries.push_back(now);
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_are_bounded_by_a_fraction_of_traffic() {
        let b = RetryBudget::new(RetryBudgetConfig {
            ratio: 0.1,
            min_per_s: 0.0,
            window: Duration::from_secs(10),
        });
        let t = Instant::now();
        for _ in 0..100 {
            b.record_request(t);
        }
        let granted = (0..100).filter(|_| b.try_retry(t)).count();
        assert_eq!(granted, 10);
        // The window slides: old traffic and old retries no longer count.
        let later = t + Duration::from_secs(11);
        assert!(!b.try_retry(later));
        for _ in 0..20 {
            b.record_request(later);
        }
        assert_eq!((0..10).filter(|_| b.try_retry(later)).count(), 2);
    }

    #[test]
    fn an_idle_router_still_gets_the_floor() {
        let b = RetryBudget::new(RetryBudgetConfig {
            ratio: 0.2,
            min_per_s: 1.0,
            window: Duration::from_secs(5),
        });
        let t = Instant::now();
        assert_eq!((0..20).filter(|_| b.try_retry(t)).count(), 5);
    }
}
