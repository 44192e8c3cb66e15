//! One upstream replica as the router sees it.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Instant;

use super::base_url::BaseUrl;
use super::breaker::{Breaker, BreakerConfig};
use super::engine_block_size::EngineBlockSize;
use super::engine_ranks::EngineRanks;
use super::load::Load;
use super::rank::Rank;
use super::role::Role;
use super::roster::Roster;
use super::worker_id::WorkerId;

/// Static description of a worker, from the config file or the command line.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSpec {
    /// Stable id, used in metrics, logs and `x-kvroute-worker`.
    pub id: String,
    /// Where it listens.
    pub url: BaseUrl,
    /// Models it serves; empty means "discover from its `GET /v1/models`".
    pub models: Vec<String>,
    /// ZMQ endpoint of its KV-event publisher, if it publishes events.
    pub kv_events: Option<String>,
    /// ZMQ endpoint of its KV-event replay socket, if any.
    pub kv_replay: Option<String>,
    /// Blocks its KV cache holds, when set by the operator; otherwise read from the engine's
    /// metrics (see [`super::capacity`]). With data parallelism, each rank's.
    pub kv_blocks: Option<usize>,
    /// Engine cores behind the one URL (vLLM `--data-parallel-size`, SGLang `--dp-size`),
    /// each a routing target of its own (see [`super::rank`]); 1 for a plain replica.
    pub data_parallel_size: u32,
    /// Which side of disaggregated requests it serves (see [`super::role`]); `Both` for an
    /// ordinary engine.
    pub role: Role,
    /// Where its SGLang bootstrap server listens (`--disaggregation-bootstrap-port`), for a
    /// prefill-capable worker of a model disaggregated SGLang style; `None`: SGLang's default.
    pub bootstrap_port: Option<u16>,
}

#[cfg(any(test, feature = "testing"))]
impl WorkerSpec {
    /// A worker `id` at `http://{id}:1` serving model `m` on `data_parallel_size` ranks, no KV
    /// events: what unit tests of routing and fleet bookkeeping need (feature `testing`: the
    /// router's unit tests too).
    #[allow(clippy::expect_used)] // Test-only: the tests' ids make valid host names.
    pub fn for_test(id: &str, data_parallel_size: u32) -> WorkerSpec {
        WorkerSpec {
            id: id.into(),
            url: BaseUrl::parse(&format!("http://{id}:1")).expect("a valid test url"),
            models: vec!["m".into()],
            kv_events: None,
            kv_replay: None,
            kv_blocks: None,
            data_parallel_size,
            role: Role::Both,
            bootstrap_port: None,
        }
    }
}

/// A model a worker reported in its `GET /v1/models`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedModel {
    /// The name requests use.
    pub id: String,
    /// For a LoRA adapter, the base model it runs on (vLLM's `parent`).
    pub parent: Option<String>,
    /// The longest prompt plus output the engine takes (vLLM's `max_model_len`), if reported.
    pub max_model_len: Option<u64>,
}

/// A base model (no `parent`).
impl From<&str> for ServedModel {
    fn from(id: &str) -> Self {
        ServedModel {
            id: id.to_owned(),
            parent: None,
            max_model_len: None,
        }
    }
}

/// Called when a worker is declared down: whatever it cached is presumed lost (a replica
/// that comes back is a new process with a cold cache).
pub type DownHook = Arc<dyn Fn(&Worker) + Send + Sync>;

/// A worker in the fleet: its description plus live state.
pub struct Worker {
    /// What was configured.
    pub spec: WorkerSpec,
    /// Its data-parallel ranks (one for a plain replica), each a routing target with its own
    /// identity (index, load, calibration: [`Rank::key`]) and load: the worker has neither of
    /// its own, so nothing can read a rank's as the worker's.
    ranks: Box<[Rank]>,
    /// Passive failure detection from live traffic.
    pub breaker: Breaker,
    /// The data-parallel ranks its engine lists in its metrics (read by the load poller).
    pub engine_ranks: EngineRanks,
    /// The KV block size its engine reports in its metrics (read by the health checker).
    pub engine_block_size: EngineBlockSize,
    discovered_models: RwLock<Vec<ServedModel>>,
    healthy: AtomicBool,
    /// Whether a health check has ever passed: a worker starts healthy (optimistic routing,
    /// with retries behind it) but is not yet evidence that the router can serve (`/ready`).
    verified: AtomicBool,
    draining: AtomicBool,
    event_feed: AtomicBool,
    /// Why its last health check failed (`None` after one passed): shown by the admin API,
    /// `/ready` and the log, since "marked down" alone sent operators guessing.
    health_error: RwLock<Option<String>>,
    /// Consecutive health checks that disagreed with the current state.
    streak: AtomicU32,
    /// KV cache capacity read from the engine's metrics (0: not read yet).
    discovered_kv_blocks: AtomicUsize,
    /// A digest of the contexts its `/v1/models` reported (each model's `max_model_len`; 0:
    /// none): workers with equal digests have equal contexts for every model, so a request
    /// need not look further.
    contexts_digest: AtomicU64,
    on_down: Option<DownHook>,
    /// The fleet's workers, asked before this worker's circuit opens (none for a worker
    /// outside a fleet).
    roster: Weak<Roster>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.spec.id)
            .field("keys", &self.keys().collect::<Vec<_>>())
            .field("healthy", &self.is_healthy())
            .field("draining", &self.is_draining())
            .finish()
    }
}

impl Worker {
    /// A worker that starts healthy: the first health check corrects that within one interval,
    /// and a failing first request is retried on another worker. Its ranks are numbered from
    /// `key` on.
    pub fn new(spec: WorkerSpec, key: WorkerId) -> Worker {
        let keys: Vec<WorkerId> = (0..spec.data_parallel_size.max(1))
            .map(|r| WorkerId(key.0 + r))
            .collect();
        Worker::with(spec, &keys, BreakerConfig::default(), None, Weak::new())
    }

    /// A worker known by `keys`, one per rank (the first when fewer are given than the spec
    /// has ranks: the fleet always gives them all), with its breaker settings, the hook to
    /// call when it goes down, and the fleet's roster its circuit consults before opening.
    pub fn with(
        spec: WorkerSpec,
        keys: &[WorkerId],
        breaker: BreakerConfig,
        on_down: Option<DownHook>,
        roster: Weak<Roster>,
    ) -> Worker {
        let size = u32::try_from(keys.len()).unwrap_or(u32::MAX).max(1);
        let ranks: Box<[Rank]> = (0..size)
            .map(|r| {
                let key = keys.get(r as usize).copied().unwrap_or_default();
                Rank::new(&spec.id, size, r, key, Arc::new(Load::default()))
            })
            .collect();
        Worker {
            ranks,
            spec,
            breaker: Breaker::new(breaker),
            engine_ranks: EngineRanks::default(),
            engine_block_size: EngineBlockSize::default(),
            discovered_models: RwLock::new(Vec::new()),
            healthy: AtomicBool::new(true),
            verified: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            event_feed: AtomicBool::new(false),
            health_error: RwLock::new(None),
            streak: AtomicU32::new(0),
            discovered_kv_blocks: AtomicUsize::new(0),
            contexts_digest: AtomicU64::new(0),
            on_down,
            roster,
        }
    }

    /// The worker's id.
    pub fn id(&self) -> &str {
        &self.spec.id
    }

    /// Which side of disaggregated requests it serves.
    pub fn role(&self) -> Role {
        self.spec.role
    }

    /// How many data-parallel ranks it has (1 for a plain replica).
    pub fn data_parallel_size(&self) -> u32 {
        self.ranks.len() as u32
    }

    /// Its ranks, in order.
    pub fn ranks(&self) -> &[Rank] {
        &self.ranks
    }

    /// Rank `index` (the last one for an index beyond them: callers take indexes from
    /// [`Worker::ranks`] or [`super::WorkerRank::all`]).
    pub fn rank(&self, index: u32) -> &Rank {
        let last = self.ranks.len() - 1;
        &self.ranks[(index as usize).min(last)]
    }

    /// The identities of all its ranks (index, load, calibration, feeds).
    pub fn keys(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.ranks.iter().map(|r| r.key)
    }

    /// Requests this router has in flight on it, over all its ranks.
    pub fn in_flight(&self) -> u64 {
        self.ranks.iter().map(|r| r.load.snapshot().in_flight).sum()
    }

    /// Models this worker serves: configured ones, or else the last discovered list.
    pub fn models(&self) -> Vec<String> {
        if !self.spec.models.is_empty() {
            return self.spec.models.clone();
        }
        self.discovered_models
            .read()
            .map(|m| m.iter().map(|m| m.id.clone()).collect())
            .unwrap_or_default()
    }

    /// The base model of `model` if this worker reported it as a LoRA adapter (a worker whose
    /// models are configured is read only for its contexts: its configuration names them).
    pub fn adapter_base(&self, model: &str) -> Option<String> {
        if !self.spec.models.is_empty() {
            return None;
        }
        self.discovered_models
            .read()
            .ok()?
            .iter()
            .find(|m| m.id == model)?
            .parent
            .clone()
    }

    /// The `max_model_len` this worker reported for `model`, if any.
    pub fn max_model_len(&self, model: &str) -> Option<u64> {
        self.discovered_models
            .read()
            .ok()?
            .iter()
            .find(|m| m.id == model)?
            .max_model_len
    }

    /// Whether the worker serves `model`.
    pub fn serves(&self, model: &str) -> bool {
        if !self.spec.models.is_empty() {
            return self.spec.models.iter().any(|m| m == model);
        }
        self.discovered_models
            .read()
            .map(|m| m.iter().any(|x| x.id == model))
            .unwrap_or(false)
    }

    /// Whether the worker's `/v1/models` answer is on record.
    pub fn has_discovered_models(&self) -> bool {
        self.discovered_models.read().is_ok_and(|m| !m.is_empty())
    }

    /// A digest of the contexts the worker reported, equal between two workers only when they
    /// reported the same `max_model_len` for the same models (0 when it reported none): the
    /// router compares digests before it looks up any context, which costs a lock per worker.
    pub fn contexts_digest(&self) -> u64 {
        self.contexts_digest.load(Ordering::Relaxed)
    }

    /// Records the models the worker reported.
    pub fn set_discovered_models(&self, models: Vec<ServedModel>) {
        self.contexts_digest
            .store(contexts_digest(&models), Ordering::Relaxed);
        if let Ok(mut m) = self.discovered_models.write() {
            *m = models;
        }
    }

    /// Blocks the worker's KV cache holds — each rank's, with data parallelism: configured, or
    /// else read from its metrics (which list every rank's: their sum is shared out evenly).
    pub fn kv_blocks(&self) -> Option<usize> {
        self.spec.kv_blocks.or_else(|| {
            let total = self.discovered_kv_blocks.load(Ordering::Relaxed);
            Some(total.div_ceil(self.ranks.len())).filter(|n| *n > 0)
        })
    }

    /// Records the capacity the engine reported (all its ranks'); returns whether it changed.
    pub fn set_discovered_kv_blocks(&self, blocks: usize) -> bool {
        self.discovered_kv_blocks.swap(blocks, Ordering::Relaxed) != blocks
    }

    /// Whether it may receive new requests.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Why its last health check failed, or `None` when it passed (or none ran yet).
    pub fn health_error(&self) -> Option<String> {
        self.health_error
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the outcome of a health check: why it failed, or `None` when it passed.
    pub fn set_health_error(&self, error: Option<String>) {
        *self.health_error.write().unwrap_or_else(|e| e.into_inner()) = error;
    }

    /// Whether a health check of this worker has ever passed.
    pub fn is_verified(&self) -> bool {
        self.verified.load(Ordering::Relaxed)
    }

    /// Marks the worker (un)healthy; returns the previous state. Going down runs the down
    /// hook (its cached blocks are forgotten).
    pub fn set_healthy(&self, healthy: bool) -> bool {
        let was = self.healthy.swap(healthy, Ordering::Relaxed);
        self.streak.store(0, Ordering::Relaxed);
        if was
            && !healthy
            && let Some(hook) = &self.on_down
        {
            hook(self);
        }
        was
    }

    /// Records one active health check; the state flips only after `threshold` consecutive
    /// checks that disagree with it. Returns the state after the check.
    pub fn observe_check(&self, ok: bool, up_threshold: u32, down_threshold: u32) -> bool {
        if ok {
            self.verified.store(true, Ordering::Relaxed);
        }
        let healthy = self.is_healthy();
        if ok == healthy {
            self.streak.store(0, Ordering::Relaxed);
            return healthy;
        }
        let n = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
        let threshold = if ok { up_threshold } else { down_threshold };
        if n >= threshold.max(1) {
            self.set_healthy(ok);
            if ok {
                // A worker that comes back gets traffic again at once.
                self.breaker.reset();
            }
            return ok;
        }
        healthy
    }

    /// Whether the worker is being drained (no new requests, in-flight ones finish).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Starts or stops draining.
    pub fn set_draining(&self, draining: bool) {
        self.draining.store(draining, Ordering::Relaxed);
    }

    /// Whether the worker's KV events feed the exact index (else its routed blocks are
    /// predicted).
    pub fn has_event_feed(&self) -> bool {
        self.event_feed.load(Ordering::Relaxed)
    }

    /// Records whether an event feed is subscribed for this worker.
    pub fn set_event_feed(&self, subscribed: bool) {
        self.event_feed.store(subscribed, Ordering::Relaxed);
    }

    /// Whether its KV-event feed is replaying what the engine buffers (since it connected):
    /// until it ends, the index may know fewer of its blocks than it holds. Routing uses the
    /// entries as they are, a lower bound.
    pub fn is_kv_warming(&self) -> bool {
        self.ranks.iter().any(Rank::is_kv_warming)
    }

    /// A request to this worker failed in a way that says something about the worker (see
    /// [`super::breaker`]); returns whether its circuit opened. It opens only while another
    /// routable worker serves each of its models (see [`Roster`]).
    pub fn record_failure(&self, now: Instant) -> bool {
        match self.roster.upgrade() {
            Some(roster) => roster.one_at_a_time(|| {
                self.breaker
                    .record_failure(now, || roster.has_peer_for_each_model(self, now))
            }),
            None => self.breaker.record_failure(now, || true),
        }
    }

    /// The worker answered a request (whatever the status: its answer is the request's own).
    pub fn record_success(&self, now: Instant) {
        self.breaker.record_success(now);
    }

    /// Whether it may take a new request for `model` (any model for `None`) at `now`: routable
    /// and serving it.
    pub fn takes(&self, model: Option<&str>, now: Instant) -> bool {
        self.is_routable(now) && model.is_none_or(|m| self.serves(m))
    }

    /// Whether a new request may be sent here at `now`: healthy, not draining, circuit not
    /// open.
    pub fn is_routable(&self, now: Instant) -> bool {
        self.is_healthy() && !self.is_draining() && self.breaker.allows(now)
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;

/// The digest of `models`' contexts: each reported `max_model_len` with its model's name, in
/// name order; 0 when none is reported.
fn contexts_digest(models: &[ServedModel]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut contexts: Vec<(&str, u64)> = models
        .iter()
        .filter_map(|m| Some((m.id.as_str(), m.max_model_len?)))
        .collect();
    if contexts.is_empty() {
        return 0;
    }
    contexts.sort_unstable();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    contexts.hash(&mut hasher);
    hasher.finish().max(1)
}
