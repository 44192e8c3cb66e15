//! The router's side of a simulation: the live decision core ([`kvroute_router::routing::Decider`])
//! behind the simulator's events, in virtual time.
//!
//! Like NVIDIA Dynamo's offline replay, which composes its live selector, radix tree and
//! active-sequence tracker behind event handlers, this file only adapts: a simulated worker
//! is a [`Target`] (eligible once it joined; exact events or predictions by the run's index
//! mode), arrivals go through the same analyse → decide → admit as a live request, first
//! tokens and ends release the same [`kvroute_router::fleet::LoadGuard`]s and feed the same
//! calibration, and KV events land in the same [`Holdings`]. `tests/it/routing_parity.rs` holds
//! the two together.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::events::batch;
use kvroute_router::fleet::WorkerId;
use kvroute_router::fleet::replica_ledger::Landing;
use kvroute_router::fleet::{
    Announcer, BookingSink, EngineLoad, Load, LoadSnapshot, Role, Side, TargetKey,
};
use kvroute_router::index::{
    ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex, SessionKey, seeds_for,
};
use kvroute_router::kv_events::KvEvent;
use kvroute_router::policy::{self, Policy, PolicyKind};
use kvroute_router::routing::context_fit;
use kvroute_router::routing::{Admitted, Analysis, Decider, Target, request_seed};
use kvroute_router::tokens::{BlockHash, EngineKind, HashSeed, block_hashes};

use super::config::{IndexMode, SimConfig};

/// A request the router has sent to a worker, holding its load until it ends.
#[derive(Debug)]
pub struct Routed {
    /// The chosen worker.
    pub slot: u32,
    /// Leading blocks the router believed the worker held.
    pub overlap_blocks: u32,
    /// Full blocks of the prompt (0 for load-only policies).
    pub blocks: u32,
    /// The most leading blocks any routable worker held (what the warmest choice would have
    /// reused).
    pub warmest_blocks: u32,
    /// The wait for KV room the policy priced on the chosen worker, if it prices one.
    pub room_wait_s: Option<f64>,
    admitted: Admitted,
    at: f64,
    /// When its first token arrived.
    first_token_at: Option<f64>,
}

impl Routed {
    /// The request's first token arrived at `now`: releases its queued prefill and feeds the
    /// calibration of the replica that routed it.
    pub fn first_token(&mut self, now: f64) {
        self.admitted
            .first_token_after(Duration::from_secs_f64((now - self.at).max(0.0)));
        self.admitted.observe_ttft(now - self.at);
        self.first_token_at = Some(now);
    }

    /// The request completed at `now` with `output_tokens`: the policy learns how long it
    /// decoded and how fast, and its load is released.
    pub fn complete(&mut self, now: f64, output_tokens: u64) {
        if let Some(first) = self.first_token_at {
            self.admitted
                .observe_decode(now - first, Some(output_tokens));
        }
        self.finish();
    }

    /// The prompt's leading blocks the router believed the worker held, in any tier.
    pub fn held_blocks(&self) -> u32 {
        self.admitted.held_blocks()
    }

    /// Other requests' prefill tokens this router counts queued on the worker.
    pub fn others_queued_prefill_tokens(&self) -> u64 {
        self.admitted.others_queued_prefill_tokens()
    }

    /// The time to first token the policy predicted, if it predicts one.
    pub fn predicted_ttft(&self) -> Option<f64> {
        self.admitted.predicted_ttft_s
    }

    /// The request ended (finished, failed or cancelled).
    pub fn finish(&mut self) {
        self.admitted.finish();
    }
}

/// A simulated worker as the decision sees it.
struct SimTarget {
    worker: WorkerId,
    label: Arc<str>,
    load: Arc<Load>,
    eligible: bool,
    events: bool,
    role: Role,
    kv_blocks: Option<usize>,
    /// The longest prompt and output its engine takes (`max_model_len`), once told.
    context: Option<u64>,
}

impl Target for SimTarget {
    fn worker(&self) -> WorkerId {
        self.worker
    }

    fn label(&self) -> &Arc<str> {
        &self.label
    }

    fn load(&self) -> &Arc<Load> {
        &self.load
    }

    fn routable(&self) -> bool {
        self.eligible
    }

    fn publishes_events(&self) -> bool {
        self.events
    }

    fn role(&self) -> Role {
        self.role
    }

    fn kv_blocks(&self) -> Option<usize> {
        self.kv_blocks
    }
}

/// Another replica's booking lands here as on a live replica: known load, and its prompt's
/// blocks in this replica's working set of the worker (`fleet::replica_ledger`).
impl Landing for SimRouter {
    fn load_of(&self, target: &TargetKey) -> Option<Arc<Load>> {
        self.target_named(target).map(|t| Arc::clone(&t.load))
    }

    fn touch(&self, target: &TargetKey, hashes: &[BlockHash], now: Duration) {
        if let Some(t) = self.target_named(target) {
            self.decider
                .holdings()
                .admitted(t.worker, hashes, now, t.kv_blocks.map(|b| b as u64));
        }
    }
}

/// The router: the decision core over per-worker targets.
pub struct SimRouter {
    decider: Decider,
    targets: Vec<SimTarget>,
    mode: IndexMode,
    model: String,
    seed: HashSeed,
    block_size: usize,
}

fn duration(t: f64) -> Duration {
    Duration::from_secs_f64(t.max(0.0))
}

impl SimRouter {
    /// A router for up to `max_workers` workers with engines of `block_size`-token blocks,
    /// with the live router's default index settings.
    pub fn new(
        policy: Arc<dyn Policy>,
        mode: IndexMode,
        model: &str,
        block_size: usize,
        max_workers: u32,
    ) -> SimRouter {
        SimRouter::sharing(
            policy,
            Arc::new(Self::fresh_holdings()),
            mode,
            model,
            block_size,
            max_workers,
        )
    }

    /// An index with the live router's default settings.
    pub fn fresh_holdings() -> Holdings {
        Self::holdings_remembering(kvroute_router::config::IndexSettings::default().approx_ttl)
    }

    /// An index with the live router's default settings, except that its approximate part
    /// remembers a routed prompt for `approx_ttl`.
    pub fn holdings_remembering(approx_ttl: Duration) -> Holdings {
        let defaults = kvroute_router::config::IndexSettings::default();
        Holdings::new(
            KvIndex::new(IndexConfig {
                max_entries: defaults.max_entries,
            }),
            Self::fresh_approx(approx_ttl),
        )
    }

    /// The index of another router replica hearing the same KV events as `shared`'s: the
    /// exact index shared, the rest (predictions, working sets, session homes) its own, as a
    /// live replica's are.
    pub fn holdings_beside(shared: &Holdings, approx_ttl: Duration) -> Holdings {
        shared.beside(Self::fresh_approx(approx_ttl))
    }

    fn fresh_approx(ttl: Duration) -> ApproxIndex {
        ApproxIndex::new(ApproxConfig {
            ttl,
            capacity_per_worker: kvroute_router::config::IndexSettings::default()
                .approx_capacity_blocks,
        })
    }

    /// A router over `holdings`, which other router replicas may share: with events, every
    /// replica subscribes to the same streams, so their exact indexes are the same one.
    pub fn sharing(
        policy: Arc<dyn Policy>,
        holdings: Arc<Holdings>,
        mode: IndexMode,
        model: &str,
        block_size: usize,
        max_workers: u32,
    ) -> SimRouter {
        let events = matches!(mode, IndexMode::Events { .. });
        SimRouter {
            decider: Decider::new(policy, holdings),
            targets: (0..max_workers)
                .map(|i| SimTarget {
                    worker: WorkerId(i),
                    label: format!("w{i}").into(),
                    load: Arc::new(Load::default()),
                    eligible: false,
                    events,
                    role: Role::Both,
                    kv_blocks: None,
                    context: None,
                })
                .collect(),
            mode,
            model: model.to_string(),
            seed: request_seed(model, None, None),
            block_size,
        }
    }

    /// The router replicas of a simulation of `policy` under `config`, each for up to `max`
    /// workers.
    pub fn replicas(
        config: &SimConfig,
        policy: PolicyKind,
        index: IndexMode,
        max: u32,
    ) -> Vec<SimRouter> {
        let shared_index = matches!(index, IndexMode::Events { .. });
        let shared = Arc::new(Self::holdings_remembering(config.approx_ttl));
        (0..config.routers.max(1))
            .map(|r| {
                // Each replica breaks ties with its own random stream, as live replicas do.
                let settings = policy::PolicySettings {
                    seed: config.policy.seed.wrapping_add(u64::from(r)),
                    ..config.policy
                };
                // Replicas hear the same KV events (one exact index); the rest of what each
                // knows is its own, as a live replica's is.
                let holdings = if shared_index {
                    Arc::new(Self::holdings_beside(&shared, config.approx_ttl))
                } else {
                    Arc::new(Self::holdings_remembering(config.approx_ttl))
                };
                Self::sharing(
                    policy::build(policy, &settings),
                    holdings,
                    index,
                    &config.model,
                    config.engine.block_size,
                    max,
                )
            })
            .collect()
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.decider.policy().name()
    }

    /// The index (for inspection).
    pub fn holdings(&self) -> &Holdings {
        self.decider.holdings()
    }

    /// Makes worker `slot`, whose KV cache holds `kv_blocks` blocks, eligible for routing (at
    /// start or when it joins). With events, the exact index is sized for that cache, as the
    /// live router does once it has read the engine's `num_gpu_blocks`.
    pub fn enable(&mut self, slot: u32, kv_blocks: usize) {
        self.enable_as(slot, kv_blocks, Role::Both);
    }

    /// [`SimRouter::enable`] for a worker of `role` in a disaggregated fleet; its capacity is
    /// known to the decode pick, as the live router reads `num_gpu_blocks`.
    pub fn enable_as(&mut self, slot: u32, kv_blocks: usize, role: Role) {
        if let Some(t) = self.targets.get_mut(slot as usize) {
            t.eligible = true;
            t.role = role;
            t.kv_blocks = Some(kv_blocks);
            if t.events {
                self.decider
                    .holdings()
                    .exact
                    .reserve(WorkerId(slot), kv_blocks);
            }
        }
    }

    /// Records a reading of worker `slot`'s engine load, with this replica's own counters now
    /// (what the live poller stores each `[health] load_interval_ms`).
    pub fn read_load(&self, slot: u32, engine: EngineLoad) {
        if let Some(t) = self.targets.get(slot as usize) {
            t.load.set_reading(engine, t.load.snapshot(), None);
        }
    }

    /// Announces every booking of this replica to `sink` from now on (a replica bus).
    pub fn announce_to(&self, sink: Arc<dyn BookingSink>) {
        for t in &self.targets {
            t.load.announce_to(Announcer::new(
                Arc::clone(&sink),
                TargetKey {
                    worker: Arc::clone(&t.label),
                    rank: 0,
                },
            ));
        }
    }

    /// This replica's target another replica names `target`.
    fn target_named(&self, target: &TargetKey) -> Option<&SimTarget> {
        self.targets
            .iter()
            .find(|t| t.label == target.worker && target.rank == 0)
    }

    /// Every worker's router-side load, by slot.
    pub fn loads(&self) -> Vec<LoadSnapshot> {
        self.targets.iter().map(|t| t.load.snapshot()).collect()
    }

    /// Whether the router hashes prompts at all (the live router skips it for load-only
    /// policies).
    pub fn uses_prefix(&self) -> bool {
        self.decider.uses_prefix()
    }

    /// The seed of a request for `model` under `cache_salt` (the tenant's namespaced one), as
    /// the live router seeds it (`routing::request_seed`): a model other than the simulated
    /// one is a LoRA adapter running on it.
    pub fn seed_for(&self, model: &str, cache_salt: Option<&str>) -> HashSeed {
        let base = (model != self.model).then_some(self.model.as_str());
        request_seed(model, base, cache_salt)
    }

    /// kvroute's block hashes of a prompt, as the live router computes them.
    pub fn hashes(&self, prompt: &[u32]) -> Vec<BlockHash> {
        block_hashes(self.seed, prompt, self.block_size)
    }

    /// Tells the router that worker `slot`'s engine takes prompts and outputs of at most
    /// `max_model_len` tokens, as the live router reads it from the engine's `/v1/models`.
    pub fn set_context(&mut self, slot: u32, max_model_len: usize) {
        if let Some(t) = self.targets.get_mut(slot as usize) {
            t.context = Some(max_model_len as u64);
        }
    }

    /// The eligible workers whose context cannot hold a prompt of `prompt_tokens` with up to
    /// `max_tokens` output tokens while another's can (`routing::context_fit`, as the live
    /// router narrows a request's eligible workers); none when leaving them out would leave a
    /// disaggregated fleet without a side.
    fn unfit(&self, prompt_tokens: u64, max_tokens: Option<u64>) -> Vec<WorkerId> {
        let eligible = || self.targets.iter().filter(|t| t.eligible);
        let limits: Vec<Option<u64>> = eligible().map(|t| t.context).collect();
        if !context_fit::differ(&limits) {
            return Vec::new();
        }
        let roles: Vec<Role> = eligible().map(|t| t.role).collect();
        // The simulated engine refuses as vLLM does at the prompt's edge.
        let engine = EngineKind::Vllm;
        match context_fit::narrow(&limits, &roles, prompt_tokens, max_tokens, engine) {
            Some((keep, _)) => eligible()
                .zip(&keep)
                .filter(|(_, k)| !**k)
                .map(|(t, _)| t.worker)
                .collect(),
            None => Vec::new(),
        }
    }

    /// Routes a prompt at time `now`; `None` when no worker is eligible.
    pub fn route(&self, prompt: &[u32], now: f64) -> Option<Routed> {
        self.route_on(prompt, None, now, None, None)
    }

    /// [`Self::route`] for a request of the trace's session `session`, named as a client
    /// names it (an affinity hint, keyed as the live router keys an anonymous caller's).
    pub fn route_in_session(
        &self,
        prompt: &[u32],
        max_tokens: Option<u64>,
        now: f64,
        session: Option<u64>,
    ) -> Option<Routed> {
        self.route_on(prompt, max_tokens, now, None, session)
    }

    /// Routes a prompt at `now` among the workers serving `side` (all for `None`): a
    /// disaggregated request's prefill worker is chosen with `Some(Side::Prefill)`, by the
    /// policy, exactly as the live router chooses it.
    pub fn route_on(
        &self,
        prompt: &[u32],
        max_tokens: Option<u64>,
        now: f64,
        side: Option<Side>,
        session: Option<u64>,
    ) -> Option<Routed> {
        let mut analysis = self.analyse(prompt, now);
        analysis.session =
            session.map(|s| SessionKey::new(None, &self.model, s.to_string().as_bytes()));
        // The live router counts a load-only policy's prompt too when contexts differ.
        let mut skip = self.unfit(prompt.len() as u64, max_tokens);
        let choice = self
            .decider
            .choose_on(&analysis, &self.targets, &mut skip, side)?;
        let room_wait_s = choice.room_wait_s();
        let admitted = self.decider.admit(&analysis, &choice, duration(now));
        let mut routed = Self::routed(admitted, now);
        routed.room_wait_s = room_wait_s;
        routed.warmest_blocks = self
            .targets
            .iter()
            .filter(|t| t.eligible)
            .map(|t| analysis.overlaps.get(t.worker))
            .max()
            .unwrap_or(0)
            .min(routed.blocks);
        Some(routed)
    }

    /// Chooses the decode worker of a disaggregated request whose prefill ended at `now` on
    /// slot `prefill`, by load and KV room (`Decider::choose_decode`, the live router's pick),
    /// and counts the request there; `None` when no decode worker is eligible.
    pub fn route_decode(&self, prompt: &[u32], prefill: u32, now: f64) -> Option<Routed> {
        let analysis = self.analyse(prompt, now);
        let choice = self.decider.choose_decode(
            &analysis,
            &self.targets,
            &mut Vec::new(),
            &[WorkerId(prefill)],
        )?;
        let admitted = self.decider.admit_decode(&analysis, &choice, duration(now));
        Some(Self::routed(admitted, now))
    }

    /// Whether the workers form a disaggregated fleet (`routing::plan`), or why they cannot
    /// serve at all. A disaggregated simulation enables every slot at the start (its fleet
    /// does not change), so every target counts.
    pub fn plan(
        &self,
    ) -> Result<kvroute_router::routing::Plan, kvroute_router::routing::MissingSide> {
        kvroute_router::routing::plan(&self.targets)
    }

    fn analyse(&self, prompt: &[u32], now: f64) -> Analysis {
        self.decider
            .analyse(prompt, self.seed, self.block_size, duration(now))
    }

    fn routed(admitted: Admitted, now: f64) -> Routed {
        Routed {
            slot: admitted.worker().0,
            overlap_blocks: admitted.overlap_blocks,
            blocks: admitted.blocks,
            warmest_blocks: admitted.overlap_blocks,
            room_wait_s: None,
            admitted,
            at: now,
            first_token_at: None,
        }
    }

    /// The request's first token arrived at `now`.
    pub fn first_token(&self, routed: &mut Routed, now: f64) {
        routed.first_token(now);
    }

    /// The request ended (finished, failed or cancelled).
    pub fn finish(&self, routed: &mut Routed) {
        routed.finish();
    }

    /// Applies one batch of worker `slot`'s KV events (events mode).
    pub fn apply_events(&self, slot: u32, ts: f64, events: Vec<KvEvent>) {
        self.decider.holdings().exact.apply(
            WorkerId(slot),
            &batch(ts, events, 0),
            &seeds_for(&self.model),
        );
    }

    /// Worker `slot`'s event stream restarted: what the live feed does on a publisher reset.
    pub fn worker_restarted(&self, slot: u32) {
        if matches!(self.mode, IndexMode::Events { .. }) {
            self.decider.holdings().exact.clear_worker(WorkerId(slot));
        }
        // The engine came back with an empty cache: nothing of its working set is left.
        self.decider
            .holdings()
            .residency
            .clear_worker(WorkerId(slot));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_router::policy::{PolicyKind, seeded};

    /// Slot 0 serves both sides and computed the prompt; slot 1 is decode-only and busier.
    /// The decode still goes to slot 1 (no hand-off to the worker that holds the KV), and to
    /// slot 0 only when it is the fleet's only decode-capable worker.
    #[test]
    fn a_both_worker_that_prefilled_gets_the_decode_only_when_no_other_can() {
        let mut router = SimRouter::new(
            seeded(PolicyKind::LeastRequest, 1),
            IndexMode::Approx,
            "m",
            16,
            3,
        );
        router.enable_as(0, 1_000, Role::Both);
        router.enable_as(1, 1_000, Role::Decode);
        let prompt: Vec<u32> = (0..64).collect();
        // Three requests prefilled on slot 0: every decode goes to slot 1, however busy.
        let mine: Vec<Routed> = (0..3)
            .map(|_| router.route_decode(&prompt, 0, 0.0).unwrap())
            .collect();
        let slots: Vec<u32> = mine.iter().map(|r| r.slot).collect();
        assert_eq!(
            slots,
            [1, 1, 1],
            "a prefill worker's own decode goes elsewhere"
        );
        // Slot 0 is eligible, and the idler: an unrelated decode goes there.
        let other = router.route_decode(&prompt, 2, 0.0).unwrap();
        assert_eq!(other.slot, 0);
        router.enable_as(1, 1_000, Role::Prefill);
        let alone = router.route_decode(&prompt, 0, 0.0).unwrap();
        assert_eq!(alone.slot, 0, "with no other decode worker it stays");
    }
}
