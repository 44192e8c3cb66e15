//! Tenants' tokens and requests per minute (`[[tenants]] tokens_per_minute`,
//! `requests_per_minute`): a request reserves its prompt's tokens (known once it is
//! tokenized) plus the output it asks for (`max_tokens` × `n`) when it is routed, and is
//! settled with the engine's reported usage at its end; over either limit it is refused with
//! 429 and the `Retry-After` at which it would fit.
//!
//! The windows are `shaping::rate`'s (pure); this holds them per tenant behind a lock and reads
//! the clock. Each router replica counts its own requests: with N replicas behind a load
//! balancer a tenant may spend up to N times its limit (docs/tenants.md, "Token rate limits").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use http::StatusCode;

use crate::config::TenantConfig;
use crate::metrics::Metrics;
use crate::openai::ApiError;
use crate::shaping::rate::{Charge, Over, Window};

#[derive(Debug)]
struct TenantWindows {
    tokens: Option<Window>,
    requests: Option<Window>,
}

/// Every limited tenant's windows.
#[derive(Debug)]
pub(super) struct RateLimits {
    origin: Instant,
    tenants: Mutex<HashMap<String, TenantWindows>>,
}

/// A request's tokens reserved in its tenant's window; settled with what it spent, or
/// refunded when dropped unsettled (it never reached an engine).
#[derive(Debug)]
pub struct Reservation {
    limits: Arc<RateLimits>,
    tenant: String,
    charge: Option<Charge>,
}

impl Reservation {
    /// Replaces the reservation with the tokens the engine reported (`None`: unknown, the
    /// reservation stays as charged).
    pub fn settle(mut self, spent: Option<u64>) {
        if let (Some(charge), Some(spent)) = (self.charge.take(), spent) {
            self.limits.settle(&self.tenant, charge, spent);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(charge) = self.charge.take() {
            self.limits.settle(&self.tenant, charge, 0);
        }
    }
}

impl RateLimits {
    pub(super) fn new(tenants: &[TenantConfig]) -> Arc<RateLimits> {
        let limits = Arc::new(RateLimits {
            origin: Instant::now(),
            tenants: Mutex::new(HashMap::new()),
        });
        limits.update(tenants);
        limits
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, TenantWindows>> {
        self.tenants.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Reloaded limits: a tenant keeps what it charged in the last minute against its new
    /// limit; a tenant without limits has no windows.
    pub(super) fn update(&self, tenants: &[TenantConfig]) {
        let mut map = self.lock();
        let mut next = HashMap::new();
        for t in tenants {
            let (tpm, rpm) = (t.shaping.tokens_per_minute, t.shaping.requests_per_minute);
            if tpm.is_none() && rpm.is_none() {
                continue;
            }
            let old = map.remove(&t.name);
            let keep = |old: Option<Window>, limit: Option<u64>| {
                let limit = limit?;
                let mut w = old.unwrap_or_else(|| Window::new(limit));
                w.set_limit(limit);
                Some(w)
            };
            let (ot, or) = old.map_or((None, None), |o| (o.tokens, o.requests));
            next.insert(
                t.name.clone(),
                TenantWindows {
                    tokens: keep(ot, tpm),
                    requests: keep(or, rpm),
                },
            );
        }
        *map = next;
    }

    /// Whether `tenant` has a token limit (then its requests' prompts must be counted).
    pub(super) fn limits_tokens(&self, tenant: &str) -> bool {
        self.lock().get(tenant).is_some_and(|w| w.tokens.is_some())
    }

    /// Charges one request of `tenant` that may spend `tokens`, or refuses it with 429.
    pub(super) fn reserve(
        self: &Arc<Self>,
        tenant: &str,
        tokens: u64,
        metrics: &Metrics,
    ) -> Result<Option<Reservation>, ApiError> {
        let now = self.now();
        let mut map = self.lock();
        let Some(w) = map.get_mut(tenant) else {
            return Ok(None);
        };
        if let Some(r) = w.requests.as_mut()
            && let Err(over) = r.check(now, 1)
        {
            return Err(refused("requests", r.limit(), 1, over, metrics));
        }
        if let Some(t) = w.tokens.as_mut()
            && let Err(over) = t.check(now, tokens)
        {
            return Err(refused("tokens", t.limit(), tokens, over, metrics));
        }
        if let Some(r) = w.requests.as_mut() {
            r.charge(now, 1);
        }
        let charge = w.tokens.as_mut().map(|t| t.charge(now, tokens));
        Ok(Some(Reservation {
            limits: Arc::clone(self),
            tenant: tenant.to_owned(),
            charge,
        }))
    }

    fn settle(&self, tenant: &str, charge: Charge, spent: u64) {
        let now = self.now();
        if let Some(t) = self.lock().get_mut(tenant).and_then(|w| w.tokens.as_mut()) {
            t.settle(now, charge, spent);
        }
    }
}

/// The 429 of a request over its tenant's `what` (tokens or requests) per minute.
fn refused(what: &str, limit: u64, asked: u64, over: Over, metrics: &Metrics) -> ApiError {
    let reason = if what == "tokens" {
        "tokens_per_minute"
    } else {
        "requests_per_minute"
    };
    metrics.rejected.with_label_values(&[reason]).inc();
    let (message, retry) = match over {
        Over::RetryAfter(d) => (
            format!(
                "rate limit reached for {what} per minute: limit {limit}, requested {asked}; \
                 retry in {:.1}s",
                d.as_secs_f64()
            ),
            d.as_secs_f64().ceil().max(1.0) as u64,
        ),
        Over::Never => (
            format!(
                "this request needs {asked} {what} (prompt plus max_tokens), more than your \
                 limit of {limit} per minute; lower max_tokens or shorten the prompt"
            ),
            60,
        ),
    };
    ApiError {
        retry_after_s: Some(retry),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            Some("rate_limit_exceeded"),
            message,
        )
    }
}
