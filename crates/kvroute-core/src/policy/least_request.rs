//! `least_request`: the worker with the fewest requests in flight.
//!
//! Ties rotate (a cursor offsets where the scan starts) so an idle fleet is not served by its
//! first worker alone.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Candidate, Policy, RouteDecision, RouteRequest};

/// Picks the candidate with the fewest in-flight requests.
#[derive(Debug, Default)]
pub struct LeastRequest {
    cursor: AtomicUsize,
}

impl Policy for LeastRequest {
    fn name(&self) -> &'static str {
        super::PolicyKind::LeastRequest.name()
    }

    fn choose(&self, _request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision> {
        let n = candidates.len();
        if n == 0 {
            return None;
        }
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        let best = (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&i| candidates[i].load.in_flight)?;
        Some(RouteDecision::pick(best, n))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{histogram, idle};
    use super::*;

    #[test]
    fn prefers_the_least_loaded_and_rotates_ties() {
        let p = LeastRequest::default();
        let mut c = idle(3);
        c[0].load.in_flight = 5;
        c[1].load.in_flight = 1;
        c[2].load.in_flight = 3;
        assert_eq!(histogram(&p, &c, 10), [0, 10, 0]);
        let h = histogram(&p, &idle(3), 300);
        assert_eq!(h, [100, 100, 100]);
    }
}
