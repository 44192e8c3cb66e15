//! Routing policies: given a request and the eligible workers, pick one.
//!
//! A policy is pure: it reads a snapshot of the request and of each candidate's load and
//! prefix overlap, and returns a decision. It performs no I/O and reads no clock, so the very
//! same implementation runs in the live router and in `sim`'s virtual time. State a policy
//! keeps (a round-robin cursor, a seeded RNG, calibrated rates) lives behind `&self`.

pub mod cache_aware;
pub mod calibration;
pub mod chunking;
pub mod copy_value;
pub mod dynamo_cost;
pub mod fleet_calibration;
mod kind;
pub mod kv_aware;
pub mod kv_room;
pub mod least_request;
pub mod power_of_two;
pub mod random;
pub mod residence;
pub mod round_robin;
pub mod saturation;
pub mod tier_cost;

use std::sync::{Arc, Mutex, MutexGuard};

use crate::fleet::{LoadSnapshot, WorkerId};

pub use cache_aware::{CacheAware, CacheAwareConfig};
pub use dynamo_cost::DynamoCost;
pub use kind::{PolicyKind, UnknownPolicy};
pub use kv_aware::{KvAware, KvAwareConfig};
pub use least_request::LeastRequest;
pub use power_of_two::PowerOfTwo;
pub use random::Random;
pub use round_robin::RoundRobin;
pub use tier_cost::{LowerBlocks, TierCostConfig, TierCredit, TierQuote};

/// What a policy sees of the request being routed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RouteRequest {
    /// Prompt length in tokens (0 when the policy did not ask for tokenization).
    pub prompt_tokens: u64,
    /// Full blocks of the prompt (`prompt_tokens / block_size`).
    pub blocks: u32,
    /// Tokens per KV block of the model's engines.
    pub block_size: u32,
    /// KV bytes of one token of the model, when its configuration states them (0: the
    /// policy's default), for the price of loading offloaded blocks.
    pub kv_bytes_per_token: u64,
    /// Requests per second arriving for the longest prefix of the prompt any worker holds
    /// (`index::prefix_rates`; 0 when none holds any or it is not asked for): what a copy of
    /// that prefix on another worker would serve (`copy_value`).
    pub warm_prefix_rate: f64,
}

/// What a policy sees of one eligible worker.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Worker id (for explanations only; policies must not special-case ids).
    pub id: Arc<str>,
    /// The worker's identity.
    pub worker: WorkerId,
    /// Router-side load.
    pub load: LoadSnapshot,
    /// Leading blocks of the prompt the worker holds (0 unless the policy uses prefixes).
    pub overlap_blocks: u32,
    /// Blocks past those it holds in host memory and on disk, which its engine loads rather
    /// than recomputes.
    pub lower_blocks: LowerBlocks,
    /// The worker's KV cache: its working set and its capacity.
    pub cache: WorkingSet,
    /// The worker is the home of the session the client named (its last request went there
    /// within the hint's TTL): evidence for a tie, never a pin.
    pub session_home: bool,
}

/// What a worker's KV cache holds that requests will come back for.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkingSet {
    /// How long its decoding requests whose first token the router saw have decoded, added
    /// up, seconds: what their answers have written beside their prompts, at the policy's
    /// tokens per second of decode.
    pub decoded_s: f64,
    /// Blocks admitted requests touched on the worker within the residency horizon
    /// (`index::Residency`).
    pub live_blocks: u64,
    /// The worker's KV cache size in blocks, when known.
    pub capacity_blocks: Option<u64>,
    /// Tokens the requests in flight there hold in its KV cache, shared prefixes once
    /// (`fleet::running_blocks`).
    pub running_tokens: u64,
    /// Leading blocks of this prompt those requests already hold (no new room needed).
    pub running_prefix_blocks: u64,
    /// Of the blocks that writing this request's uncached blocks there would evict (oldest
    /// first, as its engine does), how many are expected to be asked for again (each weighed
    /// by the measured chance that a block idle that long comes back).
    pub returning_evictions: f64,
    /// Requests in flight there holding this prompt's warm prefix (the longest prefix of it
    /// any candidate holds): other requests using it now, not one session's turns in a row.
    pub sharing_requests: u32,
    /// How long the requests decoding there have been at it, where their first token time is
    /// known (`fleet::decode_ages`).
    pub decode_ages: crate::fleet::decode_ages::DecodeAges,
}

/// A policy's choice, with the per-candidate score it was based on.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteDecision {
    /// Index of the chosen candidate in the slice given to [`Policy::choose`].
    pub chosen: usize,
    /// Predicted time to first token per candidate, in seconds, where the policy predicts one.
    pub predicted_ttft_s: Vec<Option<f64>>,
    /// The cost the policy minimised per candidate, where it has one (for explanations).
    pub cost: Vec<Option<f64>>,
    /// What each candidate's GPU and offloaded blocks were worth, where the policy prices them
    /// (for explanations: `/debug/route`'s `tiers`).
    pub tiers: Vec<Option<TierQuote>>,
    /// The prefill rate, tokens per second, the policy priced each candidate at: its
    /// calibrated speed, where the policy calibrates one (for explanations).
    pub prefill_tokens_per_s: Vec<Option<f64>>,
    /// The seconds the policy predicted the prompt waits for room in each candidate's KV cache
    /// beside the requests running there (`kv_room`), where the policy prices that and the
    /// worker's capacity is known (for explanations: part of `predicted_ttft_s`).
    pub room_wait_s: Vec<Option<f64>>,
}

impl RouteDecision {
    /// A decision that predicts nothing.
    pub fn pick(chosen: usize, candidates: usize) -> RouteDecision {
        RouteDecision {
            chosen,
            predicted_ttft_s: vec![None; candidates],
            cost: vec![None; candidates],
            tiers: vec![None; candidates],
            prefill_tokens_per_s: vec![None; candidates],
            room_wait_s: vec![None; candidates],
        }
    }
}

/// What the router learned about a finished prefill, for policies that calibrate themselves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Observation {
    /// The worker.
    pub worker: WorkerId,
    /// Prompt tokens the worker had to compute (prompt minus predicted cached prefix).
    pub uncached_tokens: u64,
    /// Tokens queued ahead of the request on that worker when it was routed.
    pub queued_tokens: u64,
    /// Sequences decoding on that worker when it was routed.
    pub decoding: u64,
    /// Requests routed there that had no first token yet when it was routed.
    pub prefilling: u64,
    /// Requests of other router replicas in the view of that worker when it was routed (known
    /// only as counts from the engine's last load reading; 0 with one router).
    pub unseen_in_flight: u64,
    /// Observed time to first token, seconds.
    pub ttft_s: f64,
    /// Prompt tokens the worker was predicted to load from host memory and from disk.
    pub loaded_tokens: [u64; 2],
    /// The request's [`RouteRequest::kv_bytes_per_token`].
    pub kv_bytes_per_token: u64,
    /// How long the policy predicted it would wait for room in the worker's KV cache
    /// ([`RouteDecision::room_wait_s`] of the chosen worker; 0 when it predicted none).
    pub room_wait_s: f64,
}

/// A routing policy.
pub trait Policy: Send + Sync {
    /// The policy's name as used in config, metrics and `/debug/route`.
    fn name(&self) -> &'static str;

    /// Whether [`Candidate::overlap_blocks`] and [`RouteRequest::prompt_tokens`] must be filled
    /// in (that costs tokenization and an index lookup, which load-only policies skip).
    fn uses_prefix(&self) -> bool {
        false
    }

    /// Picks one of `candidates`; `None` only when `candidates` is empty.
    fn choose(&self, request: &RouteRequest, candidates: &[Candidate]) -> Option<RouteDecision>;

    /// Feeds back an observed time to first token (default: ignored).
    fn observe(&self, _observation: &Observation) {}

    /// A request routed to `worker` completed `decode_s` seconds after its first token, with
    /// `output_tokens` where the engine reported them: how long a running request keeps its KV
    /// blocks, and how fast its answer fills them (default: nothing learned).
    fn observe_decode(&self, _worker: WorkerId, _decode_s: f64, _output_tokens: Option<u64>) {}

    /// Forgets what was learned about `worker`: it left the fleet, and its id may later name
    /// another worker (default: nothing kept).
    fn forget(&self, _worker: WorkerId) {}

    /// Takes new settings from a config reload, keeping what it learned (default: the policy
    /// has no settings a reload may change).
    fn reconfigure(&self, _settings: &PolicySettings) {}
}

/// Settings of the policies that have any.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PolicySettings {
    /// Seed for random choices (reproducible runs).
    pub seed: u64,
    /// `kv_aware`'s cost model.
    pub kv_aware: KvAwareConfig,
    /// `cache_aware`'s thresholds.
    pub cache_aware: CacheAwareConfig,
    /// `dynamo_cost`'s overlap weight.
    pub dynamo_overlap_weight: Option<f64>,
}

/// Builds `kind` with default settings; `seed` makes random choices reproducible.
pub fn seeded(kind: PolicyKind, seed: u64) -> Arc<dyn Policy> {
    build(
        kind,
        &PolicySettings {
            seed,
            ..Default::default()
        },
    )
}

/// Builds `kind` with `settings`.
pub fn build(kind: PolicyKind, settings: &PolicySettings) -> Arc<dyn Policy> {
    let seed = settings.seed;
    match kind {
        PolicyKind::KvAware => Arc::new(KvAware::new(settings.kv_aware, seed)),
        PolicyKind::CacheAware => Arc::new(CacheAware::new(settings.cache_aware)),
        PolicyKind::DynamoCost => Arc::new(DynamoCost::new(
            settings
                .dynamo_overlap_weight
                .unwrap_or(dynamo_cost::DEFAULT_OVERLAP_WEIGHT),
        )),
        PolicyKind::RoundRobin => Arc::new(RoundRobin::default()),
        PolicyKind::Random => Arc::new(Random::new(seed)),
        PolicyKind::LeastRequest => Arc::new(LeastRequest::default()),
        PolicyKind::PowerOfTwo => Arc::new(PowerOfTwo::new(seed)),
    }
}

/// Locks a policy's internal state; a panic elsewhere cannot leave a policy unusable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// `n` idle candidates named w0…w(n-1).
    pub fn idle(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate {
                id: format!("w{i}").into(),
                worker: WorkerId(i as u32),
                load: LoadSnapshot::default(),
                overlap_blocks: 0,
                lower_blocks: LowerBlocks::default(),
                cache: WorkingSet::default(),
                session_home: false,
            })
            .collect()
    }

    /// Counts how often each candidate is chosen over `rounds` decisions.
    pub fn histogram(p: &dyn Policy, c: &[Candidate], rounds: usize) -> Vec<usize> {
        let mut h = vec![0; c.len()];
        for _ in 0..rounds {
            h[p.choose(&RouteRequest::default(), c).unwrap().chosen] += 1;
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_policy_builds_and_handles_empty_fleets() {
        for kind in PolicyKind::ALL {
            let p = seeded(kind, 7);
            assert_eq!(p.name(), kind.name());
            assert!(p.choose(&RouteRequest::default(), &[]).is_none());
        }
        let e = "nope".parse::<PolicyKind>().err().unwrap();
        assert!(e.to_string().contains("round_robin"));
    }
}
