//! `power_of_two`: sample two distinct workers at random, keep the less loaded.
//!
//! Nearly as good as `least_request` at balancing, without every router replica herding onto
//! the same momentarily idle worker.

use std::sync::Mutex;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Candidate, Policy, RouteDecision, RouteRequest};

/// Power-of-two-choices on in-flight requests.
#[derive(Debug)]
pub struct PowerOfTwo {
    rng: Mutex<StdRng>,
}

impl PowerOfTwo {
    /// A policy whose samples are determined by `seed`.
    pub fn new(seed: u64) -> PowerOfTwo {
        PowerOfTwo {
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }
}

impl Policy for PowerOfTwo {
    fn name(&self) -> &'static str {
        super::PolicyKind::PowerOfTwo.name()
    }

    fn choose(&self, _request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision> {
        let n = candidates.len();
        match n {
            0 => None,
            1 => Some(RouteDecision::pick(0, 1)),
            _ => {
                let (a, b) = {
                    let mut g = super::lock(&self.rng);
                    let a = g.random_range(0..n);
                    let b = (a + g.random_range(1..n)) % n;
                    (a, b)
                };
                let pick = if candidates[b].load.in_flight < candidates[a].load.in_flight {
                    b
                } else {
                    a
                };
                Some(RouteDecision::pick(pick, n))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{histogram, idle};
    use super::*;

    #[test]
    fn never_picks_the_most_loaded_of_three() {
        let mut c = idle(3);
        c[0].load.in_flight = 9;
        c[1].load.in_flight = 1;
        c[2].load.in_flight = 2;
        let h = histogram(&PowerOfTwo::new(3), &c, 600);
        // The busiest worker loses every pairing it is in.
        assert_eq!(h[0], 0);
        // Worker 1 wins both of its pairings, worker 2 one of two.
        assert!(h[1] > h[2], "{h:?}");
    }

    #[test]
    fn single_candidate() {
        assert_eq!(histogram(&PowerOfTwo::new(0), &idle(1), 5), [5]);
    }
}
