//! `random`: a uniformly random eligible worker (seeded, so runs are reproducible).

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Candidate, Policy, RouteDecision, RouteRequest};

/// Picks uniformly at random.
#[derive(Debug)]
pub struct Random {
    rng: Mutex<StdRng>,
}

impl Random {
    /// A policy whose choices are determined by `seed`.
    pub fn new(seed: u64) -> Random {
        Random {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }
}

impl Policy for Random {
    fn name(&self) -> &'static str {
        super::PolicyKind::Random.name()
    }

    fn choose(&self, _request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision> {
        if candidates.is_empty() {
            return None;
        }
        let i = super::lock(&self.rng).random_range(0..candidates.len());
        Some(RouteDecision::pick(i, candidates.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{histogram, idle};
    use super::*;

    #[test]
    fn spreads_roughly_uniformly_and_is_reproducible() {
        let c = idle(4);
        let h = histogram(&Random::new(1), &c, 4000);
        assert!(h.iter().all(|&n| (800..1200).contains(&n)), "{h:?}");
        assert_eq!(h, histogram(&Random::new(1), &c, 4000));
        assert_ne!(h, histogram(&Random::new(2), &c, 4000));
    }
}
