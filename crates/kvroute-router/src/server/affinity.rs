//! Which worker stores which Responses API response: learned from the ids of the responses
//! workers return (a JSON body's `id`, a stream's `response.created`), so that a request
//! continuing one (`previous_response_id`) and `GET`/`DELETE /v1/responses/{id}` reach the
//! engine that holds it — engines keep stored responses in their own memory.
//!
//! Entries are per tenant: a tenant can only address responses created with its own key, even
//! if it knows another tenant's ids (vLLM lets a client choose the id). Memory is bounded: at
//! most `capacity` entries (the oldest forgotten first) for at most `ttl` each; an id longer
//! than [`crate::proxy::response_id::MAX_ID_BYTES`] is never learned. An entry holds the worker
//! weakly: a worker that left the fleet is not kept alive by the responses it stored.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::fleet::Worker;

type Key = (Option<Box<str>>, Box<str>);

struct Entry {
    worker: Weak<Worker>,
    at: Instant,
    /// Matches its place in `order` (a later learn of the same key moves it).
    seq: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Entry>,
    /// Keys in the order learned, with the `seq` they were learned under; stale pairs (the key
    /// learned again, or forgotten) are skipped when met.
    order: VecDeque<(Key, u64)>,
    seq: u64,
}

/// What is known of a response id.
#[derive(Debug)]
pub enum Lookup {
    /// Learned from this worker (which may have left since).
    Stored(Weak<Worker>),
    /// Never learned (not created through this router, or forgotten since).
    Unknown,
}

/// The map from (tenant, response id) to the worker that stored it.
pub struct ResponseAffinity {
    inner: Mutex<Inner>,
    capacity: usize,
    ttl: Duration,
}

fn key(tenant: Option<&str>, id: &str) -> Key {
    (tenant.map(Box::from), Box::from(id))
}

impl ResponseAffinity {
    /// An empty map of at most `capacity` entries, each kept for `ttl`.
    pub fn new(capacity: usize, ttl: Duration) -> ResponseAffinity {
        ResponseAffinity {
            inner: Mutex::new(Inner::default()),
            capacity: capacity.max(1),
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `worker` stored response `id` for `tenant`, at `now`.
    pub fn learn(&self, tenant: Option<&str>, id: &str, worker: &Arc<Worker>, now: Instant) {
        let mut g = self.lock();
        g.seq += 1;
        let seq = g.seq;
        let k = key(tenant, id);
        g.map.insert(
            k.clone(),
            Entry {
                worker: Arc::downgrade(worker),
                at: now,
                seq,
            },
        );
        g.order.push_back((k, seq));
        self.evict(&mut g, now);
    }

    /// Drops expired entries and the oldest beyond capacity; keeps `order` within twice the
    /// capacity (stale pairs left by forgets and re-learns).
    fn evict(&self, g: &mut Inner, now: Instant) {
        while let Some((k, seq)) = g.order.front() {
            let live = g.map.get(k).filter(|e| e.seq == *seq);
            let drop_it = match live {
                None => true,
                Some(e) => g.map.len() > self.capacity || now.duration_since(e.at) >= self.ttl,
            };
            if !drop_it {
                break;
            }
            if live.is_some() {
                g.map.remove(k);
            }
            g.order.pop_front();
        }
        if g.order.len() > 2 * self.capacity {
            let Inner { map, order, .. } = g;
            order.retain(|(k, seq)| map.get(k).is_some_and(|e| e.seq == *seq));
        }
    }

    /// The worker that stored response `id` for `tenant`, as known at `now`.
    pub fn lookup(&self, tenant: Option<&str>, id: &str, now: Instant) -> Lookup {
        let g = self.lock();
        match g.map.get(&key(tenant, id)) {
            Some(e) if now.duration_since(e.at) < self.ttl => Lookup::Stored(e.worker.clone()),
            _ => Lookup::Unknown,
        }
    }

    /// Forgets response `id` of `tenant` (it was deleted).
    pub fn forget(&self, tenant: Option<&str>, id: &str) {
        self.lock().map.remove(&key(tenant, id));
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{BaseUrl, WorkerId, WorkerSpec};

    fn worker(id: &str) -> Arc<Worker> {
        Arc::new(Worker::new(
            WorkerSpec {
                id: id.into(),
                url: BaseUrl::parse("http://h:1").unwrap(),
                models: vec!["m".into()],
                kv_events: None,
                kv_replay: None,
                kv_blocks: None,
                data_parallel_size: 1,
                role: crate::fleet::Role::Both,
                bootstrap_port: None,
            },
            WorkerId(0),
        ))
    }

    fn holder(l: Lookup) -> Option<String> {
        match l {
            Lookup::Stored(w) => w.upgrade().map(|w| w.id().to_owned()),
            Lookup::Unknown => None,
        }
    }

    #[test]
    fn per_tenant_learn_lookup_forget() {
        let a = ResponseAffinity::new(10, Duration::from_secs(60));
        let (w0, w1) = (worker("w0"), worker("w1"));
        let t = Instant::now();
        a.learn(Some("acme"), "resp_1", &w0, t);
        a.learn(None, "resp_1", &w1, t);
        assert_eq!(
            holder(a.lookup(Some("acme"), "resp_1", t)).as_deref(),
            Some("w0")
        );
        assert_eq!(holder(a.lookup(None, "resp_1", t)).as_deref(), Some("w1"));
        assert!(matches!(
            a.lookup(Some("bob"), "resp_1", t),
            Lookup::Unknown
        ));
        a.forget(Some("acme"), "resp_1");
        assert!(matches!(
            a.lookup(Some("acme"), "resp_1", t),
            Lookup::Unknown
        ));
        assert_eq!(a.len(), 1);
    }

    #[test]
    fn bounded_by_capacity_and_ttl() {
        let a = ResponseAffinity::new(3, Duration::from_secs(10));
        let w = worker("w");
        let t = Instant::now();
        for i in 0..5 {
            a.learn(None, &format!("r{i}"), &w, t);
        }
        assert_eq!(a.len(), 3);
        assert!(matches!(a.lookup(None, "r0", t), Lookup::Unknown));
        assert!(matches!(a.lookup(None, "r4", t), Lookup::Stored(_)));
        let later = t + Duration::from_secs(11);
        assert!(matches!(a.lookup(None, "r4", later), Lookup::Unknown));
        a.learn(None, "fresh", &w, later);
        assert_eq!(a.len(), 1, "expired entries are dropped on the next learn");
        // Re-learning and forgetting the same ids many times keeps the queue bounded.
        for i in 0..100 {
            a.learn(None, "same", &w, later);
            a.forget(None, &format!("x{i}"));
        }
        assert!(a.lock().order.len() <= 6);
    }

    #[test]
    fn a_departed_worker_is_not_kept_alive() {
        let a = ResponseAffinity::new(10, Duration::from_secs(60));
        let w = worker("w");
        let t = Instant::now();
        a.learn(None, "r", &w, t);
        drop(w);
        assert_eq!(holder(a.lookup(None, "r", t)), None);
        assert!(matches!(a.lookup(None, "r", t), Lookup::Stored(_)));
    }
}
