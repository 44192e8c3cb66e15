//! The workers behind the router: who they are, which models they serve, whether they are
//! healthy, and how loaded the router has made them.
//!
//! The worker list is an immutable snapshot swapped as a whole (`Arc<[Arc<Worker>]>`): a
//! routing decision clones one `Arc` and never holds a lock while it scores, and a worker
//! added or removed at run time cannot tear a decision in half.

mod base_url;
pub mod booking;
pub mod breaker;
pub mod capacity;
pub mod decode_ages;
pub mod engine_block_size;
pub mod engine_ranks;
pub mod load;
pub mod load_view;
pub mod poll_share;
pub mod rank;
pub mod replica_ledger;
pub mod role;
pub mod roster;
pub mod running_blocks;
pub mod tenancy;
pub mod worker;
pub mod worker_id;
pub mod worker_rank;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, Weak};

pub use base_url::{BaseUrl, WorkerUrlError, redact_userinfo};
pub use booking::{Announcer, BookingNote, BookingSink, BookingStep, TargetKey};
pub use breaker::{Breaker, BreakerConfig, CircuitState};
pub use engine_block_size::{BlockSizeMismatch, EngineBlockSize};
pub use engine_ranks::EngineRanks;
pub use load::{Load, LoadGuard};
pub use load_view::LoadSnapshot;
pub use load_view::{EngineLoad, Reading};
pub use poll_share::PollShare;
pub use rank::{DP_RANK_HEADER, MAX_DATA_PARALLEL_SIZE, Rank};
pub use role::{DEFAULT_BOOTSTRAP_PORT, Role, Side, UnknownRole};
pub use roster::Roster;
pub use tenancy::{Occupancy, Occupants, Tenancy};
pub use worker::{DownHook, ServedModel, Worker, WorkerSpec};
pub use worker_id::WorkerId;
pub use worker_rank::WorkerRank;

/// Why a worker could not be added.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AddError {
    /// Another worker has the id.
    #[error("a worker with id `{0}` exists already")]
    IdTaken(String),
    /// Another worker has the URL.
    #[error("worker `{by}` has the url {url} already")]
    UrlTaken {
        /// The URL.
        url: String,
        /// The worker that has it.
        by: String,
    },
}

/// The set of workers.
///
/// A worker's [`WorkerId`] (its key in the index, load and calibration) is handed out
/// again once the worker that had it has left and nothing refers to it any more (in-flight
/// requests, a feed, a reservation), so the per-worker parts of the index stay as few as the
/// workers alive at once however many come and go (Kubernetes churn), and a late observation
/// of a departed worker can never land on its successor.
pub struct Fleet {
    roster: Arc<Roster>,
    next_key: std::sync::atomic::AtomicU32,
    /// Numbers of workers' ranks that left, with the worker that had each; reusable once it is
    /// gone.
    released: Mutex<Vec<(WorkerId, Weak<Worker>)>>,
    breaker: BreakerConfig,
    on_down: Option<DownHook>,
    /// Replicas sharing the reading of the engines' load (set by the replica bus, read by the
    /// load poller).
    pub poll_share: PollShare,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.workers().iter()).finish()
    }
}

impl Fleet {
    /// A fleet of the given workers, in order, with default breakers and no down hook.
    pub fn new(specs: Vec<WorkerSpec>) -> Fleet {
        Fleet::with(specs, BreakerConfig::default(), None)
    }

    /// A fleet whose workers use `breaker` and call `on_down` when declared down.
    pub fn with(
        specs: Vec<WorkerSpec>,
        breaker: BreakerConfig,
        on_down: Option<DownHook>,
    ) -> Fleet {
        let mut next = 0u32;
        let roster = Roster::new_cyclic(|roster| {
            specs
                .into_iter()
                .map(|s| {
                    let ranks = s.data_parallel_size.max(1);
                    let keys: Vec<WorkerId> = (next..next + ranks).map(WorkerId).collect();
                    next += ranks;
                    Arc::new(Worker::with(
                        s,
                        &keys,
                        breaker,
                        on_down.clone(),
                        Weak::clone(roster),
                    ))
                })
                .collect()
        });
        Fleet {
            roster,
            next_key: std::sync::atomic::AtomicU32::new(next),
            released: Mutex::new(Vec::new()),
            breaker,
            on_down,
            poll_share: PollShare::default(),
        }
    }

    /// The current workers.
    pub fn workers(&self) -> Arc<[Arc<Worker>]> {
        self.roster.workers()
    }

    /// Workers that may take a new request for `model` now (healthy, not draining, circuit
    /// not open), in fleet order (requests ask `routing::eligible`, which also weighs roles).
    pub fn eligible(&self, model: &str) -> Vec<Arc<Worker>> {
        let now = std::time::Instant::now();
        self.workers()
            .iter()
            .filter(|w| w.takes(Some(model), now))
            .cloned()
            .collect()
    }

    /// Whether any worker, healthy or not, serves `model` (to tell 404 from 503).
    pub fn knows_model(&self, model: &str) -> bool {
        self.workers().iter().any(|w| w.serves(model))
    }

    /// The union of the models all workers serve, sorted.
    pub fn models(&self) -> Vec<String> {
        let set: BTreeSet<String> = self.workers().iter().flat_map(|w| w.models()).collect();
        set.into_iter().collect()
    }

    /// The base model of `model` if some worker reported it as a LoRA adapter.
    pub fn adapter_base(&self, model: &str) -> Option<String> {
        self.workers().iter().find_map(|w| w.adapter_base(model))
    }

    /// Whether the router can serve: at least one worker serves a model, may take requests, and
    /// has passed a health check (workers start healthy so that routing need not wait for the
    /// first round, but readiness must not be claimed before any worker was actually seen).
    pub fn any_ready(&self) -> bool {
        let now = std::time::Instant::now();
        self.workers()
            .iter()
            .any(|w| w.is_verified() && w.is_routable(now) && !w.models().is_empty())
    }

    /// The worker with `id`, if any.
    pub fn get(&self, id: &str) -> Option<Arc<Worker>> {
        self.workers().iter().find(|w| w.id() == id).cloned()
    }

    /// Adds a worker; fails if its id or its URL is taken (checked under the same lock as
    /// the insertion, so two concurrent adds cannot both pass).
    pub fn add(&self, spec: WorkerSpec) -> Result<Arc<Worker>, AddError> {
        let mut guard = self.roster.write();
        if guard.iter().any(|w| w.id() == spec.id) {
            return Err(AddError::IdTaken(spec.id));
        }
        if let Some(w) = guard.iter().find(|w| w.spec.url.same_endpoint(&spec.url)) {
            return Err(AddError::UrlTaken {
                url: spec.url.to_string(),
                by: w.id().to_owned(),
            });
        }
        let keys: Vec<WorkerId> = (0..spec.data_parallel_size.max(1))
            .map(|_| {
                self.reusable_key().unwrap_or_else(|| {
                    WorkerId(
                        self.next_key
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                    )
                })
            })
            .collect();
        let w = Arc::new(Worker::with(
            spec,
            &keys,
            self.breaker,
            self.on_down.clone(),
            Arc::downgrade(&self.roster),
        ));
        let mut v: Vec<Arc<Worker>> = guard.iter().cloned().collect();
        v.push(Arc::clone(&w));
        *guard = v.into();
        Ok(w)
    }

    /// The lowest released number whose worker is gone, taken.
    fn reusable_key(&self) -> Option<WorkerId> {
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        let (i, _) = released
            .iter()
            .enumerate()
            .filter(|(_, (_, w))| w.strong_count() == 0)
            .min_by_key(|(_, (key, _))| *key)?;
        Some(released.swap_remove(i).0)
    }

    /// Hands a removed worker's numbers (one per rank) back for reuse once `worker` is dropped
    /// everywhere. Call it only when nothing of the worker is left in the index (its feeds
    /// stopped, its entries removed).
    pub fn release(&self, worker: &Arc<Worker>) {
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        for key in worker.keys() {
            released.push((key, Arc::downgrade(worker)));
        }
    }

    /// Whether `worker` (this very worker, not only its id) is in the fleet.
    pub fn contains(&self, worker: &Arc<Worker>) -> bool {
        self.workers().iter().any(|w| Arc::ptr_eq(w, worker))
    }

    /// Removes the worker with `id`; returns it if it was there.
    pub fn remove(&self, id: &str) -> Option<Arc<Worker>> {
        let mut guard = self.roster.write();
        let pos = guard.iter().position(|w| w.id() == id)?;
        let mut v: Vec<Arc<Worker>> = guard.iter().cloned().collect();
        let w = v.remove(pos);
        *guard = v.into();
        Some(w)
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn eligibility_follows_model_and_health() {
        let f = Fleet::new(vec![
            spec("a", &["m1"]),
            spec("b", &["m1", "m2"]),
            spec("c", &["m2"]),
        ]);
        let ids = |v: Vec<Arc<Worker>>| v.iter().map(|w| w.id().to_string()).collect::<Vec<_>>();
        assert_eq!(ids(f.eligible("m1")), ["a", "b"]);
        f.get("b").unwrap().set_healthy(false);
        assert_eq!(ids(f.eligible("m2")), ["c"]);
        assert!(f.knows_model("m1") && !f.knows_model("zz"));
        assert_eq!(f.models(), ["m1", "m2"]);
    }

    #[test]
    fn add_and_remove_keep_slots_unique() {
        let f = Fleet::new(vec![spec("a", &["m"])]);
        assert_eq!(
            f.add(spec("a", &["m"])).unwrap_err(),
            AddError::IdTaken("a".into())
        );
        let same_url = WorkerSpec {
            id: "a2".into(),
            url: BaseUrl::parse("http://A:1/").unwrap(),
            ..spec("a2", &["m"])
        };
        assert_eq!(
            f.add(same_url).unwrap_err(),
            AddError::UrlTaken {
                url: "http://A:1".into(),
                by: "a".into()
            }
        );
        let b = f.add(spec("b", &["m"])).unwrap();
        assert_eq!(b.rank(0).key, WorkerId(1));
        assert!(f.remove("a").is_some());
        let c = f.add(spec("c", &["m"])).unwrap();
        assert_eq!(c.rank(0).key, WorkerId(2));
        assert_eq!(f.workers().len(), 2);
        assert!(f.remove("zz").is_none());
    }

    #[test]
    fn a_released_number_is_reused_only_once_its_worker_is_gone() {
        let f = Fleet::new(vec![spec("a", &["m"]), spec("b", &["m"])]);
        let a = f.remove("a").unwrap();
        f.release(&a);
        // Something (an in-flight request) still holds `a`: its number must not be reused.
        let c = f.add(spec("c", &["m"])).unwrap();
        assert_eq!(c.rank(0).key, WorkerId(2));
        drop(a);
        let d = f.add(spec("d", &["m"])).unwrap();
        assert_eq!(d.rank(0).key, WorkerId(0));
        // A removed but unreleased number (its index entries not yet gone) is not reused.
        let b = f.remove("b").unwrap();
        drop(b);
        assert_eq!(f.add(spec("e", &["m"])).unwrap().rank(0).key, WorkerId(3));
    }

    #[test]
    fn each_rank_has_its_own_number_and_all_are_released_together() {
        let dp = |id: &str, n: u32| WorkerSpec {
            data_parallel_size: n,
            role: crate::fleet::Role::Both,
            bootstrap_port: None,
            ..spec(id, &["m"])
        };
        let f = Fleet::new(vec![dp("a", 2), spec("b", &["m"])]);
        let keys = |w: &Arc<Worker>| w.keys().map(|k| k.0).collect::<Vec<_>>();
        assert_eq!(keys(&f.get("a").unwrap()), [0, 1]);
        assert_eq!(keys(&f.get("b").unwrap()), [2]);
        let c = f.add(dp("c", 3)).unwrap();
        assert_eq!(keys(&c), [3, 4, 5]);
        assert_eq!(c.rank(2).label.as_ref(), "c/dp2");
        let a = f.remove("a").unwrap();
        f.release(&a);
        drop(a);
        let d = f.add(dp("d", 3)).unwrap();
        assert_eq!(keys(&d), [0, 1, 6]);
        assert_eq!(WorkerRank::all(&f.workers()).len(), 1 + 3 + 3);
        // The engine's metrics list every rank's cache; each rank has its share.
        d.set_discovered_kv_blocks(3000);
        assert_eq!(d.kv_blocks(), Some(1000));
        assert_eq!(f.get("b").unwrap().kv_blocks(), None);
    }
}
