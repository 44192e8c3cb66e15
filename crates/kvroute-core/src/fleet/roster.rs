//! The fleet's current workers, and the rule that keeps a model in service: a worker's circuit
//! opens only while another routable worker serves each of its models.
//!
//! Without the rule a burst of failures on the last worker of a model turns every request for
//! it into a 503 for `open_for`, even when the failures came from one client's requests, and
//! fails nothing faster than the worker itself would. With it, the last worker keeps taking
//! requests (its failures are still counted, retried within the retry budget and reported),
//! and its circuit may open as soon as a peer is routable again. Opening decisions are taken
//! one at a time, so two workers failing together cannot both open on the strength of the
//! other one.

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

use super::Worker;

/// The workers, shared by the fleet (which swaps the list) and each worker (whose breaker asks
/// it before opening).
pub struct Roster {
    workers: RwLock<Arc<[Arc<Worker>]>>,
    /// Held while a breaker decides to open.
    opening: Mutex<()>,
}

impl Roster {
    /// A roster built by `make`, which is given the roster's weak handle for each worker.
    pub(super) fn new_cyclic(make: impl FnOnce(&Weak<Roster>) -> Vec<Arc<Worker>>) -> Arc<Roster> {
        Arc::new_cyclic(|me| Roster {
            workers: RwLock::new(make(me).into()),
            opening: Mutex::new(()),
        })
    }

    /// The current workers.
    pub(super) fn workers(&self) -> Arc<[Arc<Worker>]> {
        match self.workers.read() {
            Ok(w) => Arc::clone(&w),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// The list, for writing.
    pub(super) fn write(&self) -> std::sync::RwLockWriteGuard<'_, Arc<[Arc<Worker>]>> {
        match self.workers.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Runs `decide` as the only opening decision in progress.
    pub(super) fn one_at_a_time<R>(&self, decide: impl FnOnce() -> R) -> R {
        let _turn = match self.opening.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        decide()
    }

    /// Whether every model `worker` serves has another worker routable at `now`.
    pub(super) fn has_peer_for_each_model(&self, worker: &Worker, now: Instant) -> bool {
        let workers = self.workers();
        let peers: Vec<&Arc<Worker>> = workers
            .iter()
            .filter(|w| !std::ptr::eq(w.as_ref(), worker) && w.is_routable(now))
            .collect();
        worker
            .models()
            .iter()
            .all(|m| peers.iter().any(|p| p.serves(m)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{BaseUrl, BreakerConfig, CircuitState, Fleet, WorkerSpec};
    use super::*;

    fn spec(id: &str, models: &[&str]) -> WorkerSpec {
        WorkerSpec {
            id: id.into(),
            url: BaseUrl::parse(&format!("http://{id}:1")).unwrap(),
            models: models.iter().map(|m| m.to_string()).collect(),
            kv_events: None,
            kv_replay: None,
            kv_blocks: None,
            data_parallel_size: 1,
            role: crate::fleet::Role::Both,
            bootstrap_port: None,
        }
    }

    fn fleet(specs: Vec<WorkerSpec>) -> Fleet {
        let breaker = BreakerConfig {
            min_requests: 2,
            ..BreakerConfig::default()
        };
        Fleet::with(specs, breaker, None)
    }

    fn fail(f: &Fleet, id: &str, times: usize, now: Instant) {
        let w = f.get(id).unwrap();
        for _ in 0..times {
            w.record_failure(now);
        }
    }

    #[test]
    fn the_last_routable_worker_of_a_model_never_opens() {
        let f = fleet(vec![spec("a", &["m"]), spec("b", &["m"])]);
        let now = Instant::now();
        fail(&f, "a", 5, now);
        fail(&f, "b", 50, now);
        let state = |id: &str| f.get(id).unwrap().breaker.state(now);
        assert_eq!(state("a"), CircuitState::Open);
        assert_eq!(state("b"), CircuitState::Closed, "b is the last for m");
        assert_eq!(f.eligible("m").len(), 1);
        // Once a's open period ends it is routable again (half-open), so b may open.
        let later = now + Duration::from_secs(11);
        fail(&f, "b", 2, later);
        assert_eq!(f.get("b").unwrap().breaker.state(later), CircuitState::Open);
    }

    #[test]
    fn a_worker_alone_on_one_of_its_models_never_opens() {
        let f = fleet(vec![spec("a", &["m", "solo"]), spec("b", &["m"])]);
        let now = Instant::now();
        fail(&f, "a", 20, now);
        assert_eq!(f.get("a").unwrap().breaker.state(now), CircuitState::Closed);
        // A drained or down peer is no peer.
        let f = fleet(vec![spec("a", &["m"]), spec("b", &["m"])]);
        f.get("b").unwrap().set_draining(true);
        fail(&f, "a", 20, now);
        assert_eq!(f.get("a").unwrap().breaker.state(now), CircuitState::Closed);
    }

    #[test]
    fn two_workers_failing_together_leave_one_in_service() {
        for _ in 0..20 {
            let f = Arc::new(fleet(vec![spec("a", &["m"]), spec("b", &["m"])]));
            let now = Instant::now();
            let threads: Vec<_> = ["a", "b"]
                .into_iter()
                .map(|id| {
                    let f = Arc::clone(&f);
                    std::thread::spawn(move || fail(&f, id, 200, now))
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(f.eligible("m").len(), 1);
        }
    }
}
