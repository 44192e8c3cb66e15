//! `[proxy]`: the upstream client (timeouts, retries, pool) and the per-worker circuit
//! breakers. Defaults are `ProxyConfig::default()` and `BreakerConfig::default()`, next to the
//! code that uses them; an unset key takes exactly that value.

use super::file::FileProxy;
use super::server::Deprecation;
use super::values::{non_negative, seconds};
use super::{ConfigError, invalid};
use crate::fleet::BreakerConfig;
use crate::proxy::{ProxyConfig, RetryBudgetConfig};

/// Most retries allowed: each one multiplies load on a fleet that is already failing.
const MAX_RETRIES: u32 = 5;

/// The upstream client settings of `[proxy]`.
pub(super) fn proxy(file: &FileProxy) -> Result<ProxyConfig, ConfigError> {
    let d = ProxyConfig::default();
    let proxy = ProxyConfig {
        connect_timeout: seconds(
            "proxy.connect_timeout_s",
            file.connect_timeout_s,
            d.connect_timeout,
            0.001,
        )?,
        first_byte_timeout: seconds(
            "proxy.first_byte_timeout_s",
            file.first_byte_timeout_s,
            d.first_byte_timeout,
            0.001,
        )?,
        retries: file.retries.unwrap_or(d.retries),
        pool_max_idle_per_host: file
            .pool_max_idle_per_host
            .unwrap_or(d.pool_max_idle_per_host),
        idle_timeout: seconds(
            "proxy.idle_timeout_s",
            file.idle_timeout_s,
            d.idle_timeout,
            0.001,
        )?,
        total_timeout: seconds(
            "proxy.total_timeout_s",
            file.total_timeout_s,
            d.total_timeout,
            0.001,
        )?,
        retry_budget: RetryBudgetConfig {
            ratio: non_negative(
                "proxy.retry_budget_ratio",
                file.retry_budget_ratio,
                d.retry_budget.ratio,
            )?,
            min_per_s: non_negative(
                "proxy.retry_budget_min_per_s",
                file.retry_budget_min_per_s,
                d.retry_budget.min_per_s,
            )?,
            ..d.retry_budget
        },
        tls: super::tls::upstream_tls(file.tls.as_ref())?,
        prefill_piece_tokens: pieces(file.prefill_piece_tokens)?,
    };
    if proxy.retries > MAX_RETRIES {
        return Err(invalid(
            "proxy.retries",
            "at most 5: retries multiply load during an outage",
        ));
    }
    Ok(proxy)
}

/// The smallest piece worth a request of its own: under it, the pieces' round trips and steps
/// would cost more than the wait they spare.
const MIN_PIECE_TOKENS: u64 = 1_024;

/// `proxy.prefill_piece_tokens`: 0 (off) or at least [`MIN_PIECE_TOKENS`].
fn pieces(tokens: Option<u64>) -> Result<usize, ConfigError> {
    match tokens.unwrap_or(0) {
        0 => Ok(0),
        t if t < MIN_PIECE_TOKENS => Err(invalid(
            "proxy.prefill_piece_tokens",
            "0 (off) or at least 1024 tokens (16384 is twice a step's default budget)",
        )),
        t => usize::try_from(t)
            .map_err(|_| invalid("proxy.prefill_piece_tokens", "too large for this machine")),
    }
}

/// `breaker_failures` counted consecutive failures; the breaker now judges a failure rate
/// over a window, and the nearest meaning of the old key is the window's minimum of requests.
const BREAKER_FAILURES: Deprecation = Deprecation {
    old: "proxy.breaker_failures",
    new: "proxy.breaker_min_requests",
};

/// The deprecated keys of `[proxy]` the file uses.
pub(super) fn deprecations(file: &FileProxy) -> Vec<Deprecation> {
    file.breaker_failures
        .map(|_| BREAKER_FAILURES)
        .into_iter()
        .collect()
}

/// The circuit breaker settings of `[proxy]` (`breaker_*`).
pub(super) fn breaker(file: &FileProxy) -> Result<BreakerConfig, ConfigError> {
    let d = BreakerConfig::default();
    let (key, min_requests) = match (file.breaker_min_requests, file.breaker_failures) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                BREAKER_FAILURES.new,
                "also given as `proxy.breaker_failures`, its deprecated old name; keep only \
                 `proxy.breaker_min_requests`",
            ));
        }
        (None, Some(n)) => (BREAKER_FAILURES.old, n),
        (n, None) => (BREAKER_FAILURES.new, n.unwrap_or(d.min_requests)),
    };
    if min_requests == 0 {
        return Err(invalid(key, "must be at least 1"));
    }
    let failure_rate = file.breaker_failure_rate.unwrap_or(d.failure_rate);
    if !(failure_rate.is_finite() && failure_rate > 0.0 && failure_rate <= 1.0) {
        return Err(invalid(
            "proxy.breaker_failure_rate",
            format!(
                "{failure_rate} is out of range; give a fraction above 0 and at most 1, e.g. 0.5"
            ),
        ));
    }
    Ok(BreakerConfig {
        window: seconds(
            "proxy.breaker_window_s",
            file.breaker_window_s,
            d.window,
            0.01,
        )?,
        min_requests,
        failure_rate,
        open_for: seconds(
            "proxy.breaker_open_s",
            file.breaker_open_s,
            d.open_for,
            0.001,
        )?,
    })
}
