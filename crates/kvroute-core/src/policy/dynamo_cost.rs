//! `dynamo_cost`: NVIDIA Dynamo's classic KV-router cost, as a baseline.
//!
//! Dynamo scores each worker as `overlap_weight × prefill_blocks + decode_blocks` and takes the
//! minimum (temperature 0): `prefill_blocks` are the request's blocks the worker does not hold,
//! `decode_blocks` the KV blocks already active on it. Dynamo counts active blocks from its own
//! bookkeeping of routed requests; here they come from the router's accounting of the prompt
//! tokens of unfinished requests (`active_prompt_tokens`), which is the same source. Ties go to
//! the lower-indexed worker after a rotating start, as a stable argmin does.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Candidate, Policy, RouteDecision, RouteRequest};

/// Dynamo's default overlap weight.
pub const DEFAULT_OVERLAP_WEIGHT: f64 = 1.0;

/// Dynamo's cost function.
#[derive(Debug)]
pub struct DynamoCost {
    overlap_weight: f64,
    cursor: AtomicUsize,
}

impl DynamoCost {
    /// A policy weighing prefill blocks by `overlap_weight`.
    pub fn new(overlap_weight: f64) -> DynamoCost {
        DynamoCost {
            overlap_weight,
            cursor: AtomicUsize::new(0),
        }
    }
}

impl Default for DynamoCost {
    fn default() -> Self {
        DynamoCost::new(DEFAULT_OVERLAP_WEIGHT)
    }
}

impl Policy for DynamoCost {
    fn name(&self) -> &'static str {
        super::PolicyKind::DynamoCost.name()
    }

    fn uses_prefix(&self) -> bool {
        true
    }

    fn choose(&self, request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision> {
        let n = candidates.len();
        if n == 0 {
            return None;
        }
        let bs = f64::from(request.block_size.max(1));
        let request_blocks = (request.prompt_tokens as f64 / bs).ceil();
        let cost = |c: &Candidate| {
            let prefill = (request_blocks - f64::from(c.overlap_blocks)).max(0.0);
            let decode = (c.load.active_prompt_tokens as f64 / bs).ceil();
            self.overlap_weight * prefill + decode
        };
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        let mut best = start;
        let mut best_cost = cost(&candidates[start]);
        for k in 1..n {
            let i = (start + k) % n;
            let c = cost(&candidates[i]);
            if c < best_cost {
                best = i;
                best_cost = c;
            }
        }
        Some(RouteDecision::pick(best, n))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::idle;
    use super::*;

    #[test]
    fn cost_is_prefill_plus_active_blocks() {
        let p = DynamoCost::default();
        let req = RouteRequest {
            prompt_tokens: 1600,
            blocks: 100,
            block_size: 16,
            kv_bytes_per_token: 0,
            warm_prefix_rate: 0.0,
        };
        let mut c = idle(2);
        // Worker 0 holds 60 blocks but has 50 active: 40 + 50 = 90.
        c[0].overlap_blocks = 60;
        c[0].load.active_prompt_tokens = 800;
        // Worker 1 is cold and idle: 100 + 0 = 100.
        assert_eq!(p.choose(&req, &c).unwrap().chosen, 0);
        // 70 active blocks on worker 0: 40 + 70 = 110 > 100.
        c[0].load.active_prompt_tokens = 1120;
        assert_eq!(p.choose(&req, &c).unwrap().chosen, 1);
    }
}
