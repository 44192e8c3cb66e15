//! Admission control: how many requests run at once, router-wide and per tenant.
//!
//! Past the limit a request waits in a bounded queue for a bounded time; past those it is
//! refused at once with 429 and `Retry-After`. Refusing early is kinder than accepting work
//! the fleet cannot finish: clients back off, and the requests already running keep their
//! latency. The slot (a semaphore permit) is held until the response body ends, so a long
//! stream counts for as long as it runs.
//!
//! Admission comes before the body is read: a request that will be refused costs the router
//! its headers only, never its body. The bodies of admitted requests share a budget of bytes
//! ([`BodyBudget`]), claimed as they are read and held until the request is routed, so a burst
//! of large bodies cannot take more memory than the operator allowed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{Limits, TenantConfig};
use crate::metrics::Metrics;
use crate::openai::ApiError;

/// A running request's claim on capacity; dropping it frees the slot.
#[derive(Debug)]
pub struct Ticket {
    _router: OwnedSemaphorePermit,
    _tenant: Option<OwnedSemaphorePermit>,
}

/// The router's and each tenant's slots.
#[derive(Debug)]
pub struct Admission {
    limits: Limits,
    router: Arc<Semaphore>,
    waiting: AtomicUsize,
    tenants: HashMap<String, Arc<Semaphore>>,
    bodies: BodyBudget,
}

fn too_many(message: String, reason: &'static str, metrics: &Metrics) -> ApiError {
    metrics.rejected.with_label_values(&[reason]).inc();
    ApiError {
        retry_after_s: Some(1),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            Some(reason),
            message,
        )
    }
}

impl Admission {
    /// Slots for `limits` and each tenant's own limit.
    pub fn new(limits: Limits, tenants: &[TenantConfig]) -> Admission {
        Admission {
            limits,
            router: Arc::new(Semaphore::new(limits.max_concurrency)),
            waiting: AtomicUsize::new(0),
            tenants: tenants
                .iter()
                .filter_map(|t| {
                    t.max_concurrency
                        .map(|n| (t.name.clone(), Arc::new(Semaphore::new(n))))
                })
                .collect(),
            bodies: BodyBudget::new(limits.max_body_bytes_in_flight),
        }
    }

    /// The budget of body bytes being read and parsed.
    pub fn bodies(&self) -> &BodyBudget {
        &self.bodies
    }

    /// Waits for a slot for a request of `tenant` (if any), or refuses with 429.
    pub async fn admit(&self, tenant: Option<&str>, metrics: &Metrics) -> Result<Ticket, ApiError> {
        let tenant_slot = match tenant.and_then(|t| self.tenants.get(t)) {
            // A tenant over its own limit is refused at once: waiting would hold a router
            // slot's place in the queue that other tenants could use.
            Some(sem) => Some(Arc::clone(sem).try_acquire_owned().map_err(|_| {
                too_many(
                    "your organisation's concurrent request limit is reached; retry later".into(),
                    "tenant_concurrency",
                    metrics,
                )
            })?),
            None => None,
        };
        if let Ok(p) = Arc::clone(&self.router).try_acquire_owned() {
            return Ok(Ticket {
                _router: p,
                _tenant: tenant_slot,
            });
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.limits.max_queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(too_many(
                "the router is at capacity and its queue is full; retry later".into(),
                "queue_full",
                metrics,
            ));
        }
        let waited = tokio::time::timeout(
            self.limits.queue_timeout,
            Arc::clone(&self.router).acquire_owned(),
        )
        .await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match waited {
            Ok(Ok(p)) => Ok(Ticket {
                _router: p,
                _tenant: tenant_slot,
            }),
            _ => Err(too_many(
                format!(
                    "no capacity became free within {:?}; retry later",
                    self.limits.queue_timeout
                ),
                "queue_timeout",
                metrics,
            )),
        }
    }

    /// Requests waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// The bytes of request bodies being read and parsed at once, router-wide.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    in_flight: Arc<AtomicUsize>,
}

/// One request's share of the [`BodyBudget`], returned when dropped.
#[derive(Debug)]
pub struct BodyClaim {
    limit: usize,
    in_flight: Arc<AtomicUsize>,
    bytes: usize,
}

impl BodyBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> BodyBudget {
        BodyBudget {
            limit,
            in_flight: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// An empty claim, grown as the body arrives.
    pub fn claim(&self) -> BodyClaim {
        BodyClaim {
            limit: self.limit,
            in_flight: Arc::clone(&self.in_flight),
            bytes: 0,
        }
    }

    /// Bytes claimed now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

impl BodyClaim {
    /// Claims `n` more bytes, or refuses (429, counted as `body_bytes_in_flight`) when the
    /// budget cannot hold them; a refused claim keeps what it had.
    pub fn grow(&mut self, n: usize, metrics: &Metrics) -> Result<(), ApiError> {
        let limit = self.limit;
        let grown = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                cur.checked_add(n).filter(|&next| next <= limit)
            });
        match grown {
            Ok(_) => {
                self.bytes += n;
                Ok(())
            }
            Err(_) => Err(too_many(
                "the router is reading too many large request bodies at once; retry later".into(),
                "body_bytes_in_flight",
                metrics,
            )),
        }
    }

    /// Bytes held by this claim.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for BodyClaim {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn tenant(name: &str, max: Option<usize>) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            api_key_sha256: [0; 32],
            models: vec!["*".into()],
            max_concurrency: max,
        }
    }

    #[tokio::test]
    async fn queue_then_refuse() {
        let m = Metrics::new();
        let a = Arc::new(Admission::new(
            Limits {
                max_concurrency: 1,
                max_queue: 1,
                queue_timeout: Duration::from_millis(200),
                ..Limits::default()
            },
            &[],
        ));
        let first = a.admit(None, &m).await.unwrap();
        // The second waits; the third finds the queue full.
        let a2 = Arc::clone(&a);
        let m2 = m.clone();
        let second = tokio::spawn(async move { a2.admit(None, &m2).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let third = a.admit(None, &m).await.unwrap_err();
        assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(third.code, Some("queue_full"));
        assert_eq!(third.retry_after_s, Some(1));
        drop(first);
        assert!(
            second.await.unwrap().is_ok(),
            "the waiter got the freed slot"
        );
        // Now nothing frees the slot held by... nobody: a waiter times out only when full.
        let held = a.admit(None, &m).await.unwrap();
        let late = a.admit(None, &m).await.unwrap_err();
        assert_eq!(late.code, Some("queue_timeout"));
        drop(held);
    }

    #[tokio::test]
    async fn tenant_limits_are_separate() {
        let m = Metrics::new();
        let a = Admission::new(
            Limits::default(),
            &[tenant("a", Some(1)), tenant("b", None)],
        );
        let t1 = a.admit(Some("a"), &m).await.unwrap();
        let e = a.admit(Some("a"), &m).await.unwrap_err();
        assert_eq!(e.code, Some("tenant_concurrency"));
        let _b = a.admit(Some("b"), &m).await.unwrap();
        drop(t1);
        assert!(a.admit(Some("a"), &m).await.is_ok());
    }

    #[test]
    fn body_claims_share_the_budget_and_return_it() {
        let m = Metrics::new();
        let budget = BodyBudget::new(100);
        let mut a = budget.claim();
        a.grow(60, &m).unwrap();
        let mut b = budget.claim();
        let e = b.grow(41, &m).unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.code, Some("body_bytes_in_flight"));
        assert_eq!(b.bytes(), 0, "a refused claim takes nothing");
        b.grow(40, &m).unwrap();
        assert_eq!(budget.in_flight(), 100);
        drop(a);
        assert_eq!(budget.in_flight(), 40);
        b.grow(usize::MAX, &m).unwrap_err();
        drop(b);
        assert_eq!(budget.in_flight(), 0);
        assert_eq!(
            m.rejected
                .with_label_values(&["body_bytes_in_flight"])
                .get(),
            2
        );
    }
}
