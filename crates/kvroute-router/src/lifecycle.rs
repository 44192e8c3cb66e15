//! One owner of a worker's life in the router: join, drain, down, leave.
//!
//! A worker's arrival touches its KV-event feed, the index room reserved for its cache and its
//! live state; its departure must undo all of it — stop the feed before the entries go (or a
//! late batch re-adds them), release the reserved room, forget the policy's calibration and the
//! worker's metric series, and only then let its number name another worker. Static config, the
//! admin API and discovery sources all go through here, so no path does half of it.

mod gauges;

pub use gauges::LifecycleGauges;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use thiserror::Error;

use crate::config::{DEFAULT_BLOCK_SIZE, ModelConfig};
use crate::fleet::WorkerId;
use crate::fleet::health::{BlockSizeHook, CapacityHook};
use crate::fleet::{
    AddError, BlockSizeMismatch, BreakerConfig, DownHook, Fleet, Worker, WorkerSpec,
};
use crate::index::{FeedModel, Holdings, WorkerFeed};
use crate::kv_events::{ReplayLimits, SubscriberConfig, SubscriberStats};
use crate::metrics::Metrics;
use crate::policy::Policy;

/// Where a worker came from: the admin API refuses to remove a discovered worker without
/// `force`, since its source would bring it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// `[[workers]]` or `--worker`.
    Config,
    /// `POST /admin/workers`.
    Admin,
    /// `[discovery.kubernetes]`.
    Kubernetes,
    /// `[discovery.dns]`.
    Dns,
}

impl Source {
    /// Its name in the admin API and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Admin => "admin",
            Source::Kubernetes => "kubernetes",
            Source::Dns => "dns",
        }
    }

    /// Whether a discovery source owns the worker.
    pub fn is_discovered(self) -> bool {
        matches!(self, Source::Kubernetes | Source::Dns)
    }
}

/// Why a worker could not join.
#[derive(Debug, Error, PartialEq)]
pub enum JoinError {
    /// Another worker has the id or the URL.
    #[error(transparent)]
    Exists(#[from] AddError),
}

/// Why a worker could not leave.
#[derive(Debug, Error, PartialEq)]
pub enum LeaveError {
    /// No worker has the id.
    #[error("no worker has the id `{0}`")]
    NotFound(String),
    /// Requests are in flight and the removal was not forced.
    #[error("worker `{id}` has {in_flight} requests in flight; drain it first or force it")]
    Busy {
        /// The worker.
        id: String,
        /// Its requests in flight.
        in_flight: u64,
    },
}

/// The workers' lives: the fleet, plus everything each worker holds elsewhere in the router.
pub struct Lifecycle {
    fleet: Arc<Fleet>,
    holdings: Arc<Holdings>,
    policy: Arc<dyn Policy>,
    metrics: Metrics,
    /// Models configured as LoRA adapters (their blocks carry their own name).
    adapters: Vec<String>,
    /// Block size of each configured model; others have `default_block_size`. A worker's
    /// events with blocks of another size are not indexed (`index::feed`).
    block_sizes: HashMap<String, u32>,
    default_block_size: u32,
    /// KV-event feeds, by rank (a worker without data parallelism has one).
    feeds: Mutex<HashMap<WorkerId, WorkerFeed>>,
    /// Bounds of the feeds' replays.
    replay_limits: ReplayLimits,
    /// Engines one KV-event intake thread reads (`[kv_events] engines_per_intake`).
    engines_per_intake: usize,
    /// Where each worker that joined at run time came from, by id (absent: `Config`). Written
    /// under the same lock as the fleet's insertion and removal, so a worker is never seen
    /// without its source.
    sources: Mutex<HashMap<String, Source>>,
}

impl Lifecycle {
    /// The fleet of `specs`, whose workers' index entries live in `holdings`; a worker declared
    /// down loses its entries (a replica that comes back is a new process with a cold cache).
    pub fn new(
        specs: Vec<WorkerSpec>,
        breaker: BreakerConfig,
        holdings: Arc<Holdings>,
        policy: Arc<dyn Policy>,
        metrics: Metrics,
        models: &[ModelConfig],
    ) -> Lifecycle {
        let forget = Arc::clone(&holdings);
        let on_down: DownHook = Arc::new(move |w: &Worker| {
            for key in w.keys() {
                forget.clear_worker(key);
            }
        });
        Lifecycle {
            fleet: Arc::new(Fleet::with(specs, breaker, Some(on_down))),
            holdings,
            policy,
            metrics,
            adapters: models
                .iter()
                .filter(|m| m.base_model.is_some())
                .map(|m| m.name.clone())
                .collect(),
            block_sizes: models
                .iter()
                .map(|m| (m.name.clone(), m.block_size))
                .collect(),
            default_block_size: DEFAULT_BLOCK_SIZE,
            feeds: Mutex::new(HashMap::new()),
            replay_limits: ReplayLimits::default(),
            engines_per_intake: crate::kv_events::DEFAULT_ENGINES_PER_INTAKE,
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// Bounds every feed's replays by `limits` (`[kv_events]`); set before [`Lifecycle::start`].
    pub fn with_replay_limits(mut self, limits: ReplayLimits) -> Lifecycle {
        self.replay_limits = limits;
        self
    }

    /// Reads up to `engines` subscriptions per KV-event intake thread (`[kv_events]`); set
    /// before [`Lifecycle::start`].
    pub fn with_engines_per_intake(mut self, engines: usize) -> Lifecycle {
        self.engines_per_intake = engines.max(1);
        self
    }

    /// The block size of models not listed in `[[models]]` (`tokens.default_block_size`);
    /// set before [`Lifecycle::start`].
    pub fn with_default_block_size(mut self, block_size: u32) -> Lifecycle {
        self.default_block_size = block_size;
        self
    }

    /// The fleet.
    pub fn fleet(&self) -> &Arc<Fleet> {
        &self.fleet
    }

    fn feeds(&self) -> MutexGuard<'_, HashMap<WorkerId, WorkerFeed>> {
        self.feeds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings every configured worker in: subscribes to its KV events and reserves the index
    /// room of a known KV capacity. Must be called on a Tokio runtime.
    pub fn start(&self) {
        for w in self.fleet.workers().iter() {
            self.arrive(w);
        }
    }

    fn sources(&self) -> MutexGuard<'_, HashMap<String, Source>> {
        self.sources.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a worker at run time, for the admin API. Must be called on a Tokio runtime.
    pub fn join(&self, spec: WorkerSpec) -> Result<Arc<Worker>, JoinError> {
        self.join_as(spec, Source::Admin)
    }

    /// Adds a worker at run time from `source`. Must be called on a Tokio runtime.
    pub fn join_as(&self, spec: WorkerSpec, source: Source) -> Result<Arc<Worker>, JoinError> {
        let worker = {
            let mut sources = self.sources();
            let worker = self.fleet.add(spec)?;
            sources.insert(worker.id().to_owned(), source);
            worker
        };
        self.arrive(&worker);
        tracing::info!(worker = worker.id(), keys = ?worker.keys().collect::<Vec<_>>(), source = source.name(), "worker joined");
        Ok(worker)
    }

    /// Where the worker `id` came from (`Config` for an id the lifecycle does not know).
    pub fn source(&self, id: &str) -> Source {
        self.sources().get(id).copied().unwrap_or(Source::Config)
    }

    /// Stops sending new requests to the worker `id`; in-flight ones finish.
    pub fn drain(&self, id: &str) -> Option<Arc<Worker>> {
        let w = self.fleet.get(id)?;
        w.set_draining(true);
        tracing::info!(worker = %id, "draining");
        Some(w)
    }

    /// Lets the worker `id` take new requests again after a drain.
    pub fn undrain(&self, id: &str) -> Option<Arc<Worker>> {
        let w = self.fleet.get(id)?;
        w.set_draining(false);
        tracing::info!(worker = %id, "undrained: taking new requests again");
        Some(w)
    }

    /// Removes the worker `id`: refused while requests are in flight unless `force` (they
    /// finish on their open connections). Returns the requests it had in flight. Its feed is
    /// stopped before its entries are removed, and its number is released only after that.
    pub async fn leave(&self, id: &str, force: bool) -> Result<u64, LeaveError> {
        let w = self
            .fleet
            .get(id)
            .ok_or_else(|| LeaveError::NotFound(id.to_owned()))?;
        let in_flight = w.in_flight();
        if in_flight > 0 && !force {
            return Err(LeaveError::Busy {
                id: id.to_owned(),
                in_flight,
            });
        }
        let removed = {
            let mut sources = self.sources();
            let removed = self.fleet.remove(id);
            if removed.is_some() {
                sources.remove(id);
            }
            removed
        };
        let Some(w) = removed else {
            // Removed meanwhile by another call, which does the rest.
            return Err(LeaveError::NotFound(id.to_owned()));
        };
        let feeds: Vec<WorkerFeed> = {
            let mut all = self.feeds();
            w.keys().filter_map(|key| all.remove(&key)).collect()
        };
        for feed in feeds {
            feed.stop().await;
        }
        w.set_event_feed(false);
        for rank in w.ranks() {
            self.holdings.remove_worker(rank.key);
            self.policy.forget(rank.key);
            if w.data_parallel_size() > 1 {
                self.metrics.forget_worker(&rank.label);
            }
        }
        self.metrics.forget_worker(w.id());
        self.fleet.release(&w);
        tracing::info!(worker = %id, keys = ?w.keys().collect::<Vec<_>>(), in_flight, "worker left");
        Ok(in_flight)
    }

    /// What the health checker calls with a worker's KV capacity read from its metrics.
    pub fn capacity_hook(self: &Arc<Self>) -> CapacityHook {
        let me = Arc::clone(self);
        Arc::new(move |w: &Worker, blocks| {
            if let Some(w) = me
                .fleet
                .workers()
                .iter()
                .find(|x| std::ptr::eq(x.as_ref(), w))
            {
                // The engine's metrics list every rank's cache; each rank's share is reserved.
                me.reserve(w, w.kv_blocks().unwrap_or(blocks));
            }
        })
    }

    /// What the health checker calls with the KV block size a worker's engine reports: a
    /// warning per model of the worker configured with another size, a note when they agree.
    pub fn block_size_hook(self: &Arc<Self>) -> BlockSizeHook {
        let me = Arc::clone(self);
        Arc::new(move |w: &Worker, reported| {
            let wrong = me.block_size_mismatches(w);
            for m in &wrong {
                tracing::warn!(
                    worker = w.id(),
                    model = %m.model,
                    engine_block_size = m.reported,
                    model_block_size = m.configured,
                    "{}",
                    m.warning(w.id())
                );
            }
            if wrong.is_empty() {
                tracing::info!(
                    worker = w.id(),
                    block_size = reported,
                    "the engine's KV block size agrees with its models'"
                );
            }
        })
    }

    /// The configured block size of `model` (a listed model's, else the default).
    pub fn block_size_of(&self, model: &str) -> u32 {
        self.block_sizes
            .get(model)
            .copied()
            .unwrap_or(self.default_block_size)
    }

    /// The models of `w` whose configured block size is not the one its engine reported
    /// (none before it reported one). LoRA adapters are left out: their blocks are their base
    /// model's.
    pub fn block_size_mismatches(&self, w: &Worker) -> Vec<BlockSizeMismatch> {
        let Some(reported) = w.engine_block_size.reported() else {
            return Vec::new();
        };
        crate::fleet::engine_block_size::mismatches(reported, self.block_sizes_of(w))
    }

    /// The base models `w` serves, each with its configured block size.
    pub fn block_sizes_of(&self, w: &Worker) -> Vec<(String, u32)> {
        w.models()
            .into_iter()
            .filter(|m| !self.adapters.contains(m) && w.adapter_base(m).is_none())
            .map(|m| {
                let size = self.block_size_of(&m);
                (m, size)
            })
            .collect()
    }

    /// Counters of every feed, by worker, for metrics.
    pub fn feed_stats(&self) -> Vec<(WorkerId, Arc<SubscriberStats>)> {
        self.feeds()
            .iter()
            .filter_map(|(slot, feed)| feed.stats().map(|s| (*slot, Arc::clone(s))))
            .collect()
    }

    /// A worker's arrival: its feed, and its known capacity's room.
    fn arrive(&self, w: &Arc<Worker>) {
        self.subscribe(w);
        if let Some(blocks) = w.kv_blocks() {
            self.reserve(w, blocks);
        }
    }

    /// Subscribes to the KV events of each of `w`'s ranks: rank N publishes on the
    /// configured endpoints' ports plus N (`fleet::rank::rank_endpoint`, as vLLM and SGLang
    /// offset them), and its blocks land in rank N's part of the index.
    fn subscribe(&self, w: &Arc<Worker>) {
        let Some(endpoint) = &w.spec.kv_events else {
            return;
        };
        let mut feeds = self.feeds();
        let mut subscribed = 0;
        for rank in w.ranks() {
            if feeds.contains_key(&rank.key) {
                subscribed += 1;
                continue;
            }
            // `config::check_worker` refused endpoints that cannot be offset.
            let Some(events) = crate::fleet::rank::rank_endpoint(endpoint, rank.index) else {
                tracing::error!(worker = w.id(), rank = rank.index, %endpoint, "no KV-event endpoint for this rank");
                continue;
            };
            let mut sub = SubscriberConfig::new(&*rank.label, events);
            sub.replay_limits = self.replay_limits;
            sub.engines_per_intake = self.engines_per_intake;
            sub.dp_rank = (w.data_parallel_size() > 1).then_some(rank.index);
            if let Some(replay) = w
                .spec
                .kv_replay
                .as_deref()
                .and_then(|r| crate::fleet::rank::rank_endpoint(r, rank.index))
            {
                sub = sub.with_replay(replay);
            }
            let warming = {
                let worker = Arc::clone(w);
                let index = rank.index;
                Box::new(move |on: bool| worker.rank(index).set_kv_warming(on))
            };
            let holdings = Arc::clone(&self.holdings);
            match WorkerFeed::start(holdings, rank.key, self.feed_model(w), warming, sub) {
                Ok(feed) => {
                    subscribed += 1;
                    feeds.insert(rank.key, feed);
                }
                Err(e) => {
                    tracing::error!(worker = &*rank.label, error = %e, "cannot subscribe to KV events")
                }
            }
        }
        // Routing treats the worker's ranks alike: predicted blocks only when none publishes.
        w.set_event_feed(subscribed > 0);
    }

    /// The model a worker's events are hashed for. Engine events do not name the model: a
    /// worker's blocks are hashed for its first base model (adapters' blocks carry their
    /// `lora_name`), which is every worker's case in a single-model fleet. It is read when
    /// events arrive, since a worker configured without models learns them at its first
    /// health check.
    fn feed_model(&self, w: &Arc<Worker>) -> Box<dyn Fn() -> Option<FeedModel> + Send + Sync> {
        let worker = Arc::clone(w);
        let adapters = self.adapters.clone();
        let (block_sizes, default_block_size) = (self.block_sizes.clone(), self.default_block_size);
        Box::new(move || {
            let name = worker
                .models()
                .into_iter()
                .find(|m| !adapters.contains(m) && worker.adapter_base(m).is_none())?;
            let block_size = block_sizes
                .get(&name)
                .copied()
                .unwrap_or(default_block_size);
            Some(FeedModel { name, block_size })
        })
    }

    /// Tells the index a worker's KV cache size (`blocks` per rank): its approximate predictions are capped at it
    /// and, for a worker that publishes events, the exact index's part is sized for it (see
    /// [`crate::index::KvIndex::reserve`]) on a blocking thread: that room (megabytes for a
    /// large cache) is allocated and written under the index's write lock, which must not hold
    /// up an async worker thread. Must be called on a Tokio runtime.
    fn reserve(&self, w: &Arc<Worker>, blocks: usize) {
        for key in w.keys() {
            self.holdings.approx.set_cache_blocks(key, blocks);
        }
        if w.spec.kv_events.is_none() {
            return;
        }
        let (holdings, fleet, w) = (
            Arc::clone(&self.holdings),
            Arc::clone(&self.fleet),
            Arc::clone(w),
        );
        tokio::task::spawn_blocking(move || {
            let granted = w
                .keys()
                .map(|key| holdings.exact.reserve(key, blocks))
                .min()
                .unwrap_or(0);
            // A worker that left meanwhile must not keep the room. Holding `w` keeps its
            // numbers from being reused until this is done.
            if !fleet.contains(&w) {
                for key in w.keys() {
                    holdings.exact.remove_worker(key);
                }
                return;
            }
            if granted < blocks {
                tracing::warn!(
                    worker = w.id(),
                    blocks,
                    granted,
                    "the index's max_entries bounds the room reserved for this worker's KV cache"
                );
            }
        });
    }
}
