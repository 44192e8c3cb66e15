//! `cache_aware`: the SGLang router's policy, as a baseline.
//!
//! SGLang's router keeps two regimes. When the fleet is imbalanced (`max_load − min_load >
//! balance_abs_threshold` and `max_load > balance_rel_threshold × min_load`) it routes to the
//! least-loaded worker, ignoring cache. Otherwise it routes to the worker with the longest
//! prefix match if the match rate exceeds `cache_threshold`, else to the least-loaded worker.
//! Load is the number of requests in flight. SGLang matches against its own approximate radix
//! tree of routed text; here the match is the index's overlap, so both baselines and `kv_aware`
//! see the same cache state and differ only in policy. The SGLang router's own tree hears no
//! eviction, so it never moves a session whose home dropped part of its prefix; the simulator
//! models that with `--cache-aware-index approx` (this policy on the approximate index), which
//! reproduces the SGLang router's real-time figures (docs/benchmarks.md, "The SGLang router in
//! the simulator").

use super::{Candidate, Policy, RouteDecision, RouteRequest};

/// SGLang router defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheAwareConfig {
    /// Absolute load gap that counts as imbalance (SGLang: 64).
    pub balance_abs_threshold: u64,
    /// Relative load gap that counts as imbalance (SGLang: 1.5).
    pub balance_rel_threshold: f64,
    /// Matched fraction of the prompt above which the cache is preferred (SGLang: 0.3).
    pub cache_threshold: f64,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        CacheAwareConfig {
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            cache_threshold: 0.3,
        }
    }
}

/// SGLang's cache-aware policy.
#[derive(Debug, Default)]
pub struct CacheAware {
    config: CacheAwareConfig,
}

impl CacheAware {
    /// A policy with `config`.
    pub fn new(config: CacheAwareConfig) -> CacheAware {
        CacheAware { config }
    }
}

fn least_loaded(candidates: &[Candidate]) -> usize {
    (0..candidates.len())
        .min_by_key(|&i| candidates[i].load.in_flight)
        .unwrap_or(0)
}

impl Policy for CacheAware {
    fn name(&self) -> &'static str {
        super::PolicyKind::CacheAware.name()
    }

    fn uses_prefix(&self) -> bool {
        true
    }

    fn choose(&self, request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision> {
        let n = candidates.len();
        if n == 0 {
            return None;
        }
        let max = candidates
            .iter()
            .map(|c| c.load.in_flight)
            .max()
            .unwrap_or(0);
        let min = candidates
            .iter()
            .map(|c| c.load.in_flight)
            .min()
            .unwrap_or(0);
        let imbalanced = max - min > self.config.balance_abs_threshold
            && max as f64 > self.config.balance_rel_threshold * min as f64;
        if imbalanced {
            return Some(RouteDecision::pick(least_loaded(candidates), n));
        }
        let best_match =
            (0..n).max_by_key(|&i| (candidates[i].overlap_blocks, std::cmp::Reverse(i)))?;
        let matched =
            u64::from(candidates[best_match].overlap_blocks) * u64::from(request.block_size);
        let rate = if request.prompt_tokens == 0 {
            0.0
        } else {
            matched as f64 / request.prompt_tokens as f64
        };
        let chosen = if rate > self.config.cache_threshold {
            best_match
        } else {
            least_loaded(candidates)
        };
        Some(RouteDecision::pick(chosen, n))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::idle;
    use super::*;

    fn req() -> RouteRequest {
        RouteRequest {
            prompt_tokens: 1600,
            blocks: 100,
            block_size: 16,
            kv_bytes_per_token: 0,
            warm_prefix_rate: 0.0,
        }
    }

    #[test]
    fn follows_the_cache_above_the_match_threshold() {
        let mut c = idle(3);
        c[1].overlap_blocks = 40; // 40 % match
        c[1].load.in_flight = 10;
        assert_eq!(CacheAware::default().choose(&req(), &c).unwrap().chosen, 1);
        c[1].overlap_blocks = 20; // 20 %: below the threshold, least loaded instead
        assert_eq!(CacheAware::default().choose(&req(), &c).unwrap().chosen, 0);
    }

    #[test]
    fn balances_when_imbalanced_regardless_of_cache() {
        let mut c = idle(2);
        c[0].overlap_blocks = 100;
        c[0].load.in_flight = 100;
        c[1].load.in_flight = 10;
        assert_eq!(CacheAware::default().choose(&req(), &c).unwrap().chosen, 1);
        // A gap of 60 is under the absolute threshold: the cache wins.
        c[0].load.in_flight = 70;
        assert_eq!(CacheAware::default().choose(&req(), &c).unwrap().chosen, 0);
    }
}
