//! `round_robin`: each eligible worker in turn, blind to load and cache.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Candidate, Policy, RouteDecision, RouteRequest};

/// Cycles through the candidates.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        super::PolicyKind::RoundRobin.name()
    }

    fn choose(&self, _request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision> {
        if candidates.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % candidates.len();
        Some(RouteDecision::pick(i, candidates.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{histogram, idle};
    use super::*;

    #[test]
    fn visits_each_worker_equally_and_in_order() {
        let p = RoundRobin::default();
        let c = idle(3);
        let order: Vec<_> = (0..6)
            .map(|_| p.choose(&RouteRequest::default(), &c).unwrap().chosen)
            .collect();
        assert_eq!(order, [0, 1, 2, 0, 1, 2]);
        assert_eq!(histogram(&p, &c, 300), [100, 100, 100]);
    }
}
