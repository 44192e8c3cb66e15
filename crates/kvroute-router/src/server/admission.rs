//! Admission control: how many requests run at once, router-wide and per tenant.
//!
//! Past the limit a request waits in a bounded queue for a bounded time, in its priority band
//! and sharing the band fairly with other tenants (`gate`, over `shaping::queue`); past those
//! it is refused with 429 and `Retry-After` (503 for a sheddable request displaced to make room
//! for one that is not). Refusing early is kinder than accepting work
//! the fleet cannot finish: clients back off, and the requests already running keep their
//! latency. The slot (a semaphore permit) is held until the response body ends, so a long
//! stream counts for as long as it runs.
//!
//! Admission comes before the body is read: a request that will be refused costs the router
//! its headers only, never its body. The bodies of admitted requests share a budget of bytes
//! ([`BodyBudget`]), claimed as they are read and held until the request is routed, so a burst
//! of large bodies cannot take more memory than the operator allowed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use http::HeaderMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::auth::Caller;
pub use super::body_budget::{BodyBudget, BodyClaim};
use super::gate::{Denied, Entry, Gate, GateSlot};
use super::rate_limit::RateLimits;
pub use super::rate_limit::Reservation;
use crate::config::{Limits, TenantConfig};
use crate::metrics::Metrics;
use crate::openai::ApiError;
use crate::routing::Standing;
use crate::shaping::{Isolation, Placement, Priorities};

use super::refusal::{overloaded, too_many};

/// The flow (tenant label) of requests without a tenant.
const NO_TENANT: &str = "-";

/// Where a request stands in line: its tenant, band, sheddability and share.
#[derive(Clone, Debug)]
pub struct Place<'a> {
    /// Its tenant, if any.
    pub tenant: Option<&'a str>,
    /// Its band and sheddability.
    pub placement: Placement,
    /// Its tenant's weight within the band.
    pub weight: u32,
}
/// A running request's claim on capacity; dropping it frees the slot (or, after a reload
/// lowered a limit, retires it: see [`Pool`]).
#[derive(Debug)]
pub struct Ticket {
    router: GateSlot,
    _tenant: Option<Slot>,
}

impl Ticket {
    /// Where the request's tenant stands for placement isolation now (`shaping::isolation`);
    /// `None` while isolation is off.
    pub fn standing(&self) -> Option<Standing> {
        self.router.standing()
    }
}

/// One permit of a [`Pool`], given back (or retired) when dropped.
#[derive(Debug)]
struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    pool: Arc<Pool>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take()
            && self.pool.take_debt(1) == 1
        {
            // The limit was lowered while this slot was held: the slot goes away with it.
            permit.forget();
        }
    }
}

/// A limit of requests at once whose size a config reload may change without dropping the
/// requests that hold its slots: raising it adds permits; lowering it removes the free ones at
/// once and the rest as their requests end (the pool's debt), so at no time do more requests
/// run than the higher of the old and the new limit, and soon no more than the new one.
#[derive(Debug)]
struct Pool {
    sem: Arc<Semaphore>,
    /// The limit, changed under this lock (the debt is read without it by returning slots).
    size: Mutex<usize>,
    /// Permits still to retire as held slots are returned.
    debt: AtomicUsize,
}

impl Pool {
    fn new(size: usize) -> Arc<Pool> {
        Arc::new(Pool {
            sem: Arc::new(Semaphore::new(size)),
            size: Mutex::new(size),
            debt: AtomicUsize::new(0),
        })
    }

    /// Takes up to `n` from the debt; how much it took.
    fn take_debt(&self, n: usize) -> usize {
        match self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                (d > 0).then(|| d - d.min(n))
            }) {
            Ok(before) => before.min(n),
            Err(_) => 0,
        }
    }

    fn resize(&self, new: usize) {
        let mut size = self.size.lock().unwrap_or_else(|e| e.into_inner());
        if new > *size {
            let grow = new - *size;
            let paid = self.take_debt(grow);
            self.sem.add_permits(grow - paid);
        } else if new < *size {
            let shrink = *size - new;
            let removed = self.sem.forget_permits(shrink);
            self.debt.fetch_add(shrink - removed, Ordering::AcqRel);
        }
        *size = new;
    }

    fn try_slot(self: &Arc<Self>) -> Option<Slot> {
        let permit = Arc::clone(&self.sem).try_acquire_owned().ok()?;
        Some(Slot {
            permit: Some(permit),
            pool: Arc::clone(self),
        })
    }
}

/// The router's and each tenant's slots.
#[derive(Debug)]
pub struct Admission {
    /// The queue's bounds (`max_queue`, `queue_timeout`), read once per request.
    limits: ArcSwap<Limits>,
    router: Arc<Gate>,
    /// The bands and the headers naming them (fixed until a restart: the queue has its bands).
    priorities: Priorities,
    /// Tenants' tokens and requests per minute.
    rates: Arc<RateLimits>,
    tenants: ArcSwap<HashMap<String, Arc<Pool>>>,
    /// Serialises reloads (the tenant pools are read, resized and swapped as one step).
    reload: Mutex<()>,
    bodies: BodyBudget,
}

impl Admission {
    /// Slots for `limits` and each tenant's own limit, queued in the bands of `priorities`.
    pub fn new(
        limits: Limits,
        tenants: &[TenantConfig],
        priorities: &Priorities,
        metrics: &Metrics,
    ) -> Admission {
        Admission {
            limits: ArcSwap::from_pointee(limits),
            router: Gate::new(
                limits.max_concurrency,
                limits.max_queue,
                priorities,
                metrics.shaping.clone(),
            ),
            priorities: priorities.clone(),
            rates: RateLimits::new(tenants),
            tenants: ArcSwap::from_pointee(
                tenants
                    .iter()
                    .filter_map(|t| t.max_concurrency.map(|n| (t.name.clone(), Pool::new(n))))
                    .collect(),
            ),
            reload: Mutex::new(()),
            bodies: BodyBudget::new(limits.max_body_bytes_in_flight),
        }
    }

    /// Applies reloaded limits: every pool is resized in place, so the requests running now
    /// keep their slots and count against the new limits. A tenant that keeps its limit keeps
    /// its pool; a tenant given a limit it did not have starts with an empty pool (its
    /// requests already running are not counted in it); a tenant that lost its limit or
    /// left has no pool any more.
    pub fn update(&self, limits: Limits, tenants: &[TenantConfig]) {
        let _serial = self.reload.lock().unwrap_or_else(|e| e.into_inner());
        self.router.resize(limits.max_concurrency, limits.max_queue);
        self.rates.update(tenants);
        self.bodies.set_limit(limits.max_body_bytes_in_flight);
        let old = self.tenants.load();
        let pools: HashMap<String, Arc<Pool>> = tenants
            .iter()
            .filter_map(|t| {
                let n = t.max_concurrency?;
                let pool = match old.get(&t.name) {
                    Some(p) => {
                        p.resize(n);
                        Arc::clone(p)
                    }
                    None => Pool::new(n),
                };
                Some((t.name.clone(), pool))
            })
            .collect();
        self.tenants.store(Arc::new(pools));
        self.limits.store(Arc::new(limits));
    }

    /// New placement isolation settings (`[priority] isolate`), from the next decision on.
    pub fn set_isolation(&self, isolation: Isolation) {
        self.router.set_isolation(isolation);
    }

    /// Where a request at `place` would stand for placement isolation (for an explanation:
    /// it holds no slot); `None` while isolation is off.
    pub fn standing(&self, place: &Place<'_>) -> Option<Standing> {
        let flow: Arc<str> = Arc::from(place.tenant.unwrap_or(NO_TENANT));
        self.router.standing(&flow, place.weight)
    }

    /// The budget of body bytes being read and parsed.
    pub fn bodies(&self) -> &BodyBudget {
        &self.bodies
    }

    /// Where `caller`'s request stands: the band its header asks for (`[priority] header`)
    /// if its tenant may use it, else its tenant's; 400 for a band that does not exist or is
    /// above the tenant's.
    pub fn place<'c>(
        &self,
        caller: &'c Caller,
        headers: &HeaderMap,
    ) -> Result<Place<'c>, ApiError> {
        let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
        let tenant = match caller {
            Caller::Tenant(t) => Some(&**t),
            Caller::Anonymous => None,
        };
        let placement = self
            .priorities
            .place(
                header(&self.priorities.header),
                header(&self.priorities.sheddable_header),
                tenant.map(|t| &t.shaping.priority),
            )
            .map_err(|e| ApiError {
                code: Some("invalid_priority"),
                ..ApiError::invalid(e.to_string(), None)
            })?;
        Ok(Place {
            tenant: tenant.map(|t| t.name.as_str()),
            placement,
            weight: tenant.map_or(1, |t| t.shaping.weight),
        })
    }

    /// Places `caller`'s request ([`Self::place`]) and waits for its slot ([`Self::admit`]).
    pub async fn admit_caller(
        &self,
        caller: &Caller,
        headers: &HeaderMap,
        metrics: &Metrics,
    ) -> Result<Ticket, ApiError> {
        let place = self.place(caller, headers)?;
        self.admit(&place, metrics).await
    }

    /// Waits for a slot for a request at `place`, or refuses it: 429 when its tenant is at its
    /// own limit, the queue is full or its wait ran out; 503 when it was sheddable and shed.
    pub async fn admit(&self, place: &Place<'_>, metrics: &Metrics) -> Result<Ticket, ApiError> {
        let limits = **self.limits.load();
        let tenant_pool = place
            .tenant
            .and_then(|t| self.tenants.load().get(t).cloned());
        let tenant_slot = match tenant_pool {
            // A tenant over its own limit is refused at once: waiting would hold a router
            // slot's place in the queue that other tenants could use.
            Some(pool) => Some(pool.try_slot().ok_or_else(|| {
                too_many(
                    "your organisation's concurrent request limit is reached; retry later".into(),
                    "tenant_concurrency",
                    metrics,
                )
            })?),
            None => None,
        };
        let entry = Entry {
            band: place.placement.band,
            flow: Arc::from(place.tenant.unwrap_or(NO_TENANT)),
            weight: place.weight,
            sheddable: place.placement.sheddable,
            wait: limits.queue_timeout,
        };
        match self.router.enter(entry).await {
            Ok(slot) => Ok(Ticket {
                router: slot,
                _tenant: tenant_slot,
            }),
            Err(Denied::Full) if place.placement.sheddable => Err(overloaded(
                "the router is saturated and sheddable requests are not queued; retry later".into(),
                metrics,
            )),
            Err(Denied::Full) => Err(too_many(
                "the router is at capacity and its queue is full; retry later".into(),
                "queue_full",
                metrics,
            )),
            Err(Denied::Shed) => Err(overloaded(
                "the router is saturated and this sheddable request gave its place to one that \
                 is not; retry later"
                    .into(),
                metrics,
            )),
            Err(Denied::Timeout) => Err(too_many(
                format!(
                    "no capacity became free within {:?}; retry later",
                    limits.queue_timeout
                ),
                "queue_timeout",
                metrics,
            )),
        }
    }

    /// Requests waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.router.waiting()
    }

    /// Whether `tenant`'s requests are limited in tokens (their prompts must be counted).
    pub fn limits_tokens(&self, tenant: Option<&str>) -> bool {
        tenant.is_some_and(|t| self.rates.limits_tokens(t))
    }

    /// Reserves a routed request's `tokens` (prompt plus requested output) and one request in
    /// its tenant's per-minute limits, or refuses it with 429; `None` for a tenant without
    /// limits.
    pub fn reserve(
        &self,
        tenant: Option<&str>,
        tokens: u64,
        metrics: &Metrics,
    ) -> Result<Option<Reservation>, ApiError> {
        match tenant {
            Some(t) => self.rates.reserve(t, tokens, metrics),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use http::StatusCode;

    fn tenant(name: &str, max: Option<usize>) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            api_key_sha256: [0; 32],
            models: vec!["*".into()],
            max_concurrency: max,
            shaping: Default::default(),
        }
    }

    fn at(tenant: Option<&str>) -> Place<'_> {
        Place {
            tenant,
            placement: Placement {
                band: 1,
                sheddable: false,
            },
            weight: 1,
        }
    }

    fn admission(limits: Limits, tenants: &[TenantConfig], m: &Metrics) -> Admission {
        Admission::new(limits, tenants, &Priorities::default(), m)
    }

    #[tokio::test]
    async fn queue_then_refuse() {
        let m = Metrics::new();
        let a = Arc::new(admission(
            Limits {
                max_concurrency: 1,
                max_queue: 1,
                queue_timeout: Duration::from_millis(200),
                ..Limits::default()
            },
            &[],
            &m,
        ));
        let first = a.admit(&at(None), &m).await.unwrap();
        // The second waits; the third finds the queue full.
        let a2 = Arc::clone(&a);
        let m2 = m.clone();
        let second = tokio::spawn(async move { a2.admit(&at(None), &m2).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let third = a.admit(&at(None), &m).await.unwrap_err();
        assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(third.code, Some("queue_full"));
        assert_eq!(third.retry_after_s, Some(1));
        drop(first);
        assert!(
            second.await.unwrap().is_ok(),
            "the waiter got the freed slot"
        );
        // Now nothing frees the slot held by... nobody: a waiter times out only when full.
        let held = a.admit(&at(None), &m).await.unwrap();
        let late = a.admit(&at(None), &m).await.unwrap_err();
        assert_eq!(late.code, Some("queue_timeout"));
        drop(held);
    }

    #[tokio::test]
    async fn headroom_keeps_slots_for_the_highest_band() {
        let m = Metrics::new();
        let limits = Limits {
            max_concurrency: 3,
            max_queue: 0,
            ..Limits::default()
        };
        let priorities = Priorities {
            headroom: 2,
            ..Priorities::default()
        };
        let a = Admission::new(limits, &[], &priorities, &m);
        let high = |band| Place {
            placement: Placement {
                band,
                sheddable: false,
            },
            ..at(None)
        };
        let normal = a.admit(&at(None), &m).await.unwrap();
        assert_eq!(
            a.admit(&at(None), &m).await.unwrap_err().code,
            Some("queue_full"),
            "the last two slots are the highest band's"
        );
        let h1 = a.admit(&high(0), &m).await.unwrap();
        let h2 = a.admit(&high(0), &m).await.unwrap();
        assert!(a.admit(&high(0), &m).await.is_err(), "all three taken");
        drop((normal, h1, h2));
        assert!(a.admit(&at(None), &m).await.is_ok());
    }

    /// A tenant flooding the router holds every slot but the fair reserve; another tenant's
    /// request is admitted on its first poll (no release waited for), the flood's waiter is
    /// not given the reserve, and is served — not lost — when one of its own slots ends.
    #[tokio::test]
    async fn a_tenant_under_its_share_takes_the_fair_reserve_at_once() {
        use futures_util::FutureExt;
        let m = Metrics::new();
        let limits = Limits {
            max_concurrency: 4,
            max_queue: 16,
            queue_timeout: Duration::from_secs(600),
            ..Limits::default()
        };
        let priorities = Priorities {
            fair_reserve: 1,
            ..Priorities::default()
        };
        let a = Arc::new(Admission::new(limits, &[], &priorities, &m));
        let mut flood = Vec::new();
        for _ in 0..3 {
            flood.push(a.admit(&at(Some("a")), &m).await.unwrap());
        }
        let (a2, m2) = (Arc::clone(&a), m.clone());
        let waiter = tokio::spawn(async move { a2.admit(&at(Some("a")), &m2).await.is_ok() });
        // The runtime is single-threaded: the waiter runs (and queues) while this one yields.
        for _ in 0..100 {
            if a.waiting() > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(
            a.waiting(),
            1,
            "the flood's fourth request took the reserve"
        );
        let b = a.admit(&at(Some("b")), &m).now_or_never();
        assert!(matches!(b, Some(Ok(_))), "b waited or was refused");
        drop(b);
        // The reserve is free again, and still not `a`'s.
        tokio::task::yield_now().await;
        assert_eq!(a.waiting(), 1);
        drop(flood.pop());
        assert!(
            waiter.await.unwrap(),
            "the flood's waiter got its own freed slot"
        );
        assert_eq!(a.waiting(), 0);
    }

    #[tokio::test]
    async fn tenant_limits_are_separate() {
        let m = Metrics::new();
        let a = admission(
            Limits::default(),
            &[tenant("a", Some(1)), tenant("b", None)],
            &m,
        );
        let t1 = a.admit(&at(Some("a")), &m).await.unwrap();
        let e = a.admit(&at(Some("a")), &m).await.unwrap_err();
        assert_eq!(e.code, Some("tenant_concurrency"));
        let _b = a.admit(&at(Some("b")), &m).await.unwrap();
        drop(t1);
        assert!(a.admit(&at(Some("a")), &m).await.is_ok());
    }

    #[tokio::test]
    async fn a_reload_resizes_limits_without_dropping_held_slots() {
        let m = Metrics::new();
        let limits = |n| Limits {
            max_concurrency: n,
            max_queue: 0,
            ..Limits::default()
        };
        let a = admission(limits(3), &[tenant("t", Some(2))], &m);
        let held: Vec<Ticket> = vec![
            a.admit(&at(Some("t")), &m).await.unwrap(),
            a.admit(&at(Some("t")), &m).await.unwrap(),
            a.admit(&at(None), &m).await.unwrap(),
        ];
        // Lowered below what is held: the held slots stay, nothing new is admitted until
        // enough of them end.
        a.update(limits(1), &[tenant("t", Some(1))]);
        assert_eq!(
            a.admit(&at(None), &m).await.unwrap_err().code,
            Some("queue_full")
        );
        let mut held = held.into_iter();
        drop(held.next());
        drop(held.next());
        assert_eq!(
            a.admit(&at(None), &m).await.unwrap_err().code,
            Some("queue_full"),
            "one slot still held against a limit of one"
        );
        drop(held.next());
        let t = a.admit(&at(Some("t")), &m).await.unwrap();
        assert_eq!(
            a.admit(&at(Some("t")), &m).await.unwrap_err().code,
            Some("tenant_concurrency")
        );
        // Raised: new slots at once; the tenant that lost its limit has none of its own.
        a.update(limits(3), &[tenant("t", None)]);
        let more = [
            a.admit(&at(Some("t")), &m).await.unwrap(),
            a.admit(&at(Some("t")), &m).await.unwrap(),
        ];
        assert_eq!(
            a.admit(&at(None), &m).await.unwrap_err().code,
            Some("queue_full")
        );
        drop((t, more));
        assert!(a.admit(&at(None), &m).await.is_ok());
    }
}
