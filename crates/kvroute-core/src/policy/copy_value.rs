//! What a copy of a busy prefix is worth to the requests that come after.
//!
//! `kv_aware` recomputes a prefix on a worker that lacks it when the request in hand would wait
//! longer at the workers holding it than the copy takes: the right choice for that request
//! alone. But a copy made now also serves the later requests for the same prefix, and the
//! sooner it exists, the fewer of them queue at the holders. Under a hot system prompt
//! (the `hot-prefix` scenario: 180 requests a second share one 8k-token prefix) the holders'
//! queues grow until the one-request rule finally copies: without this price the run's slowest
//! 1 % all arrived in its first 0.6 s and all ran on the prefix's first holder
//! (docs/benchmarks.md, "A copy of a hot prefix").
//!
//! The price, for a candidate that lacks part of the warm prefix (the longest any candidate
//! holds): requests for the prefix arrive at `λ` per second (`index::prefix_rates`); while
//! the holders' queue `q_h` drains, `λ × q_h` of them arrive, and each would wait, on
//! average, half of what the copy saves it, `(q_h − q_w) / 2` with `q_w` the candidate's own
//! queue. That value, at most what the copy costs to compute (so a copy is never cheaper than
//! free), comes off the candidate's cost, times `copy_weight`. Its TTFT prediction is
//! unchanged. Prefixes nobody asks for again (an agent's own context, asked for once per
//! think time) and idle holders price nothing, and a saturated fleet is left to
//! `saturation`, where every copy is work taken from the queue.

/// Seconds the later requests for a prefix would save if a candidate made a copy of it now:
/// `rate` requests per second for the prefix, `holders_wait_s` the least any holder makes a
/// request wait before its own prefill, `wait_s` what the candidate makes it wait, `copy_s`
/// what the copy costs to compute there (the cap).
pub fn value_s(rate: f64, holders_wait_s: f64, wait_s: f64, copy_s: f64) -> f64 {
    if !(rate > 0.0 && holders_wait_s > 0.0 && copy_s > 0.0) {
        return 0.0;
    }
    let saved = (holders_wait_s - wait_s.max(0.0)).max(0.0);
    (rate * holders_wait_s * saved / 2.0).min(copy_s)
}

/// One candidate as the copy's price sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Side {
    /// Prompt tokens the candidate holds (GPU and lower tiers, as quoted).
    pub cached_tokens: u64,
    /// What it makes the request wait before its own prefill, seconds.
    pub wait_s: f64,
    /// Its prefill time per token, seconds.
    pub seconds_per_token: f64,
}

/// The seconds to take off each candidate's cost for the copy it would make (0 for the
/// holders of the warm prefix); `weight` scales them.
pub fn discounts(rate: f64, sides: &[Side], weight: f64) -> Vec<f64> {
    let warm = sides.iter().map(|s| s.cached_tokens).max().unwrap_or(0);
    let holders_wait = sides
        .iter()
        .filter(|s| s.cached_tokens >= warm)
        .map(|s| s.wait_s)
        .fold(f64::INFINITY, f64::min);
    sides
        .iter()
        .map(|s| {
            if warm == 0 || s.cached_tokens >= warm || !holders_wait.is_finite() {
                return 0.0;
            }
            let copy_s = (warm - s.cached_tokens) as f64 * s.seconds_per_token;
            weight * value_s(rate, holders_wait, s.wait_s, copy_s)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(cached_tokens: u64, wait_s: f64) -> Side {
        Side {
            cached_tokens,
            wait_s,
            seconds_per_token: 1e-4,
        }
    }

    #[test]
    fn the_requests_arriving_while_the_holders_drain_share_the_saving() {
        // 20 requests a second, holders busy for 0.2 s, the candidate idle: 4 requests arrive
        // meanwhile, each saving 0.1 s on average.
        assert!((value_s(20.0, 0.2, 0.0, 1.0) - 0.4).abs() < 1e-12);
        // Capped at the copy's own cost.
        assert!((value_s(20.0, 0.2, 0.0, 0.3) - 0.3).abs() < 1e-12);
        // A candidate as busy as the holders saves nobody anything.
        assert_eq!(value_s(20.0, 0.2, 0.3, 1.0), 0.0);
        // Nobody asks for the prefix, or its holders are idle.
        assert_eq!(value_s(0.0, 0.2, 0.0, 1.0), 0.0);
        assert_eq!(value_s(20.0, 0.0, 0.0, 1.0), 0.0);
    }

    #[test]
    fn only_the_workers_lacking_the_warm_prefix_are_discounted() {
        // The holder (8,192 tokens) waits 0.5 s; one worker holds half, one nothing.
        let sides = [side(8192, 0.5), side(4096, 0.0), side(0, 0.1)];
        let d = discounts(10.0, &sides, 1.0);
        assert_eq!(d[0], 0.0);
        // 10 × 0.5 × 0.5 / 2 = 1.25 s of value, capped at the 4,096 tokens' 0.41 s.
        assert!((d[1] - 0.4096).abs() < 1e-12, "{d:?}");
        // 10 × 0.5 × 0.4 / 2 = 1.0 s, under the 8,192 tokens' 0.82 s cap: the cap.
        assert!((d[2] - 0.8192).abs() < 1e-12, "{d:?}");
        assert_eq!(discounts(10.0, &sides, 0.0), vec![0.0; 3]);
        // Nobody holds anything: no copy to price.
        assert_eq!(
            discounts(10.0, &[side(0, 0.5), side(0, 0.0)], 1.0),
            vec![0.0; 2]
        );
    }
}
