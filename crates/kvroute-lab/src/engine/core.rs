//! The engine state machine: scheduler + KV cache + step timing, driven by a clock it is given.
//!
//! [`EngineCore::step`] plans one forward pass at time `now`, computes how long it takes, and
//! returns what happened at its end: tokens produced, requests finished, KV events. It never
//! reads a clock or does I/O, so the HTTP face runs it in real time and `sim` runs many of them
//! in virtual time with the same results. Generated token ids are a pure function of the seed,
//! the request id and the token's position, so runs are reproducible whatever the batching.
//!
//! Prefill/decode disaggregation is a property of requests, not of the engine (an engine
//! whose KV connector is `kv_both` serves all three kinds, as vLLM's does): a
//! [`Handoff::ToDecode`] prefill finishes after one token and holds its prompt's blocks for
//! the decode engine ([`super::held`]); a [`Handoff::FromPrefill`] request pulls its prompt's
//! KV over the engine's [`TransferModel`] link and then only decodes (see [`super::scheduler`]).

use std::sync::Arc;

use thiserror::Error;

use super::block_hash::EngineHasher;
use super::cache_slot::{CacheSlot, PooledCache};
use super::held::HeldBlocks;
use super::kv_cache::KvCache;
use super::request::{FinishReason, Handoff, Request, RequestId, RequestStats};
use super::scheduler::{Scheduler, SchedulerLimits};
use super::timing::{StepTiming, StepWork};
use super::transfer::{KvPull, TransferModel};
use kvroute_router::kv_events::KvEvent;

/// Shape and behaviour of one simulated engine.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Tokens per KV block (vLLM `--block-size`).
    pub block_size: usize,
    /// KV blocks (vLLM `num_gpu_blocks`).
    pub num_blocks: u32,
    /// Most running sequences.
    pub max_num_seqs: usize,
    /// Token budget of one step.
    pub max_num_batched_tokens: usize,
    /// Most prompt tokens one request computes in a step (vLLM's
    /// `--long-prefill-token-threshold`); 0: only the budget limits it.
    pub long_prefill_token_threshold: usize,
    /// Longest prompt + output accepted; `None` means the whole cache.
    pub max_model_len: Option<usize>,
    /// Step-time model.
    pub timing: StepTiming,
    /// Seed of generated tokens and engine block hashes.
    pub seed: u64,
    /// Generated token ids are below this.
    pub vocab_size: u32,
    /// The link prompts' KV is pulled over when this engine decodes for a prefill engine.
    pub transfer: TransferModel,
    /// Seconds a finished prefill holds its blocks for a decode engine that never pulls them
    /// (vLLM's `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`, 480 s).
    pub kv_hold_timeout_s: f64,
    /// A host-memory tier behind the GPU cache (vLLM's OffloadingConnector), if any.
    pub cpu_tier: Option<super::cpu_tier::CpuTierConfig>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            block_size: 16,
            num_blocks: 16_384,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            long_prefill_token_threshold: 0,
            max_model_len: None,
            timing: StepTiming::default(),
            seed: 0,
            vocab_size: 32_000,
            transfer: TransferModel::default(),
            kv_hold_timeout_s: 480.0,
            cpu_tier: None,
        }
    }
}

/// A configuration the engine cannot run with.
#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    /// A size that must be positive is zero.
    #[error("`{0}` must be at least 1")]
    Zero(&'static str),
    /// `max_model_len` exceeds what the KV cache can hold.
    #[error("max_model_len {max_model_len} exceeds the KV cache ({capacity} tokens)")]
    ModelLenTooLarge {
        /// Configured.
        max_model_len: usize,
        /// `num_blocks × block_size`.
        capacity: usize,
    },
    /// `speedup` is not a positive finite number.
    #[error("speedup must be a positive number")]
    Speedup,
    /// `kv_hold_timeout_s` is not a positive finite number.
    #[error("the KV hold timeout must be a positive number of seconds")]
    HoldTimeout,
    /// The host-memory tier's links are not positive bandwidths with a latency of at least 0.
    #[error(
        "the host-memory tier needs positive read and write bandwidths and a latency of 0 or more"
    )]
    CpuTier,
}

impl EngineConfig {
    /// Checks sizes; every engine built from a valid config can serve any admitted request.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, v) in [
            ("block_size", self.block_size),
            ("num_blocks", self.num_blocks as usize),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("vocab_size", self.vocab_size as usize),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        let capacity = self.capacity();
        if let Some(m) = self.max_model_len {
            if m == 0 {
                return Err(ConfigError::Zero("max_model_len"));
            }
            if m > capacity {
                return Err(ConfigError::ModelLenTooLarge {
                    max_model_len: m,
                    capacity,
                });
            }
        }
        if !(self.timing.speedup.is_finite() && self.timing.speedup > 0.0) {
            return Err(ConfigError::Speedup);
        }
        if !(self.kv_hold_timeout_s.is_finite() && self.kv_hold_timeout_s > 0.0) {
            return Err(ConfigError::HoldTimeout);
        }
        if let Some(t) = &self.cpu_tier {
            let positive = |v: f64| v.is_finite() && v > 0.0;
            if !(positive(t.read_bytes_per_s)
                && positive(t.write_bytes_per_s)
                && t.latency_s.is_finite()
                && t.latency_s >= 0.0)
            {
                return Err(ConfigError::CpuTier);
            }
        }
        Ok(())
    }

    /// Tokens the KV cache holds.
    pub fn capacity(&self) -> usize {
        self.num_blocks as usize * self.block_size
    }

    /// The effective longest prompt + output.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len.unwrap_or_else(|| self.capacity())
    }
}

/// Why a request was not accepted.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum AddError {
    /// The id is already live.
    #[error("request {0:?} already exists")]
    Duplicate(RequestId),
    /// No prompt tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// `max_output_tokens` is zero.
    #[error("max_tokens must be at least 1")]
    NoOutput,
    /// Prompt + output exceed `max_model_len`.
    #[error(
        "this model's maximum context length is {limit} tokens, but {prompt} prompt tokens and {output} output tokens were requested"
    )]
    TooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Requested output tokens.
        output: usize,
        /// `max_model_len`.
        limit: usize,
    },
}

/// A request to add, with its part in prefill/decode disaggregation.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRequest {
    /// Unique among the engine's live requests and held prefills.
    pub id: RequestId,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Output tokens to generate (a [`Handoff::ToDecode`] prefill generates one, whatever
    /// this says: vLLM's proxy sends it `max_tokens` 1).
    pub max_output_tokens: usize,
    /// When it arrived, engine seconds.
    pub arrival: f64,
    /// Its blocks are shared only with requests of the same salt.
    pub cache_salt: Option<Arc<str>>,
    /// Local, a prefill for a remote decode, or a decode of a remote prefill.
    pub handoff: Handoff,
}

impl NewRequest {
    /// A plain (aggregated) request.
    pub fn local(id: RequestId, prompt: Vec<u32>, max_output_tokens: usize, arrival: f64) -> Self {
        NewRequest {
            id,
            prompt,
            max_output_tokens,
            arrival,
            cache_salt: None,
            handoff: Handoff::Local,
        }
    }

    /// The same request with `handoff`.
    pub fn with_handoff(self, handoff: Handoff) -> Self {
        NewRequest { handoff, ..self }
    }
}

/// One generated token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenEvent {
    /// The request.
    pub id: RequestId,
    /// Token id.
    pub token: u32,
    /// Position among the request's outputs, from 0.
    pub index: usize,
}

/// What one step did; everything in it happened at `end`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutcome {
    /// When the step started.
    pub start: f64,
    /// Its duration, seconds (0 if nothing was scheduled).
    pub duration: f64,
    /// `start + duration`.
    pub end: f64,
    /// The work, as the timing model saw it.
    pub work: StepWork,
    /// Requests that took part.
    pub num_scheduled: usize,
    /// Tokens produced, in scheduling order.
    pub tokens: Vec<TokenEvent>,
    /// Requests that completed (their last token is in `tokens`).
    pub finished: Vec<RequestStats>,
    /// Requests preempted while planning the step.
    pub preempted: Vec<RequestId>,
    /// KV-cache events, in order.
    pub kv_events: Vec<KvEvent>,
    /// KV transfers started while planning the step (at `start`).
    pub pulls: Vec<KvPull>,
    /// Pulled requests whose KV had arrived and that run from this step on.
    pub landed: Vec<RequestId>,
    /// Finished prefills whose held blocks expired unpulled (freed at `start`).
    pub expired: Vec<RequestId>,
}

/// Totals over the engine's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Steps that did work.
    pub steps: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Cached blocks evicted.
    pub evictions: u64,
    /// Prompt tokens looked up in the prefix cache (per admission).
    pub queried_tokens: u64,
    /// Of those, found cached.
    pub hit_tokens: u64,
    /// Full blocks looked up.
    pub queried_blocks: u64,
    /// Of those, found cached.
    pub hit_blocks: u64,
    /// Prefill tokens computed (including recomputation).
    pub prefill_tokens: u64,
    /// Output tokens produced.
    pub generated_tokens: u64,
    /// Requests completed.
    pub finished: u64,
    /// Requests aborted.
    pub aborted: u64,
    /// KV transfers started (decode side).
    pub pulls: u64,
    /// Prompt tokens whose KV was pulled (decode side).
    pub transferred_tokens: u64,
    /// Finished prefills whose blocks were released after their pull (prefill side).
    pub held_released: u64,
    /// Finished prefills whose blocks expired unpulled (prefill side).
    pub held_expired: u64,
}

impl std::ops::AddAssign for EngineCounters {
    /// Sums two engines' (or two lives') totals.
    fn add_assign(&mut self, b: EngineCounters) {
        self.steps += b.steps;
        self.preemptions += b.preemptions;
        self.evictions += b.evictions;
        self.queried_tokens += b.queried_tokens;
        self.hit_tokens += b.hit_tokens;
        self.queried_blocks += b.queried_blocks;
        self.hit_blocks += b.hit_blocks;
        self.prefill_tokens += b.prefill_tokens;
        self.generated_tokens += b.generated_tokens;
        self.finished += b.finished;
        self.aborted += b.aborted;
        self.pulls += b.pulls;
        self.transferred_tokens += b.transferred_tokens;
        self.held_released += b.held_released;
        self.held_expired += b.held_expired;
    }
}

/// One simulated engine.
#[derive(Debug)]
pub struct EngineCore {
    config: EngineConfig,
    cache: CacheSlot,
    scheduler: Scheduler,
    hasher: EngineHasher,
    counters: EngineCounters,
    held: HeldBlocks,
}

impl EngineCore {
    /// An idle engine with an empty cache.
    pub fn new(config: EngineConfig) -> Result<Self, ConfigError> {
        let cache = KvCache::with_tier(config.num_blocks, config.block_size, config.cpu_tier);
        Self::on(config, CacheSlot::Own(cache))
    }

    /// An idle engine whose KV cache is `shared` with other engines (the simulator's
    /// pooled-fleet reference, [`super::cache_slot`]); `config`'s cache size is not used.
    pub fn pooled(config: EngineConfig, shared: PooledCache) -> Result<Self, ConfigError> {
        Self::on(config, CacheSlot::Pooled(shared))
    }

    fn on(config: EngineConfig, cache: CacheSlot) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(EngineCore {
            cache,
            scheduler: Scheduler::with_transfer(
                SchedulerLimits {
                    max_num_seqs: config.max_num_seqs,
                    max_num_batched_tokens: config.max_num_batched_tokens,
                    long_prefill_token_threshold: config.long_prefill_token_threshold,
                },
                config.transfer,
            ),
            hasher: EngineHasher::new(config.seed),
            counters: EngineCounters::default(),
            held: HeldBlocks::default(),
            config,
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request that arrived at `arrival`.
    pub fn add_request(
        &mut self,
        id: RequestId,
        prompt: Vec<u32>,
        max_output_tokens: usize,
        arrival: f64,
    ) -> Result<(), AddError> {
        self.add_salted_request(id, prompt, max_output_tokens, arrival, None)
    }

    /// Queues a request whose blocks are only shared with requests of the same `cache_salt`.
    pub fn add_salted_request(
        &mut self,
        id: RequestId,
        prompt: Vec<u32>,
        max_output_tokens: usize,
        arrival: f64,
        cache_salt: Option<Arc<str>>,
    ) -> Result<(), AddError> {
        self.add(NewRequest {
            id,
            prompt,
            max_output_tokens,
            arrival,
            cache_salt,
            handoff: Handoff::Local,
        })
    }

    /// Queues a request of any [`Handoff`] kind.
    pub fn add(&mut self, new: NewRequest) -> Result<(), AddError> {
        let NewRequest {
            id,
            prompt,
            max_output_tokens,
            arrival,
            cache_salt,
            handoff,
        } = new;
        if self.scheduler.contains(id) || self.held.contains(id) {
            return Err(AddError::Duplicate(id));
        }
        if prompt.is_empty() {
            return Err(AddError::EmptyPrompt);
        }
        if max_output_tokens == 0 {
            return Err(AddError::NoOutput);
        }
        let max_output_tokens = match handoff {
            Handoff::ToDecode => 1,
            Handoff::Local | Handoff::FromPrefill => max_output_tokens,
        };
        let limit = self.config.max_model_len();
        if prompt.len().saturating_add(max_output_tokens) > limit {
            return Err(AddError::TooLong {
                prompt: prompt.len(),
                output: max_output_tokens,
                limit,
            });
        }
        let req = Request::new(
            id,
            prompt,
            max_output_tokens,
            arrival,
            cache_salt,
            &self.hasher,
            self.config.block_size,
        )
        .with_handoff(handoff);
        self.scheduler.add(req);
        Ok(())
    }

    /// Removes a live request at time `now`, freeing its blocks; its stats if it was live.
    pub fn abort(&mut self, id: RequestId, now: f64) -> Option<RequestStats> {
        let req = self.cache.with(|c| self.scheduler.remove(id, c))?;
        self.counters.aborted += 1;
        Some(req.stats(now, FinishReason::Aborted))
    }

    /// Whether any request is live (running, waiting or pulling its KV). Held prefills are
    /// not work: they finished.
    pub fn has_work(&self) -> bool {
        self.scheduler.num_running() + self.scheduler.num_waiting() + self.scheduler.num_pulling()
            > 0
    }

    /// When something changes without a new request: the earliest KV transfer or host-tier
    /// load completes, or a held prefill expires. A driver whose step scheduled nothing sleeps
    /// until then (or the next command).
    pub fn next_wakeup(&self) -> Option<f64> {
        [self.scheduler.next_ready_at(), self.held.next_expiry()]
            .into_iter()
            .flatten()
            .min_by(f64::total_cmp)
    }

    /// The decode side pulled finished prefill `id`'s KV: its blocks are released (they stay
    /// in the prefix cache). Whether they were held.
    pub fn release_held(&mut self, id: RequestId) -> bool {
        let released = self.cache.with(|c| self.held.release(id, c));
        self.counters.held_released += u64::from(released);
        released
    }

    /// Finished prefills whose blocks are held for a decode engine.
    pub fn num_held(&self) -> usize {
        self.held.len()
    }

    /// Requests admitted that wait for their KV transfer.
    pub fn num_pulling(&self) -> usize {
        self.scheduler.num_pulling()
    }

    /// Requests in the running set.
    pub fn num_running(&self) -> usize {
        self.scheduler.num_running()
    }

    /// Requests waiting, including those waiting for their KV transfer (vLLM keeps them in
    /// its waiting queue, so they count in `vllm:num_requests_waiting`).
    pub fn num_waiting(&self) -> usize {
        self.scheduler.num_waiting() + self.scheduler.num_pulling()
    }

    /// Fraction of KV blocks in use.
    pub fn kv_usage(&self) -> f64 {
        self.cache.read(KvCache::usage)
    }

    /// Totals so far.
    pub fn counters(&self) -> EngineCounters {
        EngineCounters {
            evictions: self.cache.read(KvCache::evictions),
            ..self.counters
        }
    }

    /// Runs `f` on the KV cache (read-only), for inspection.
    pub fn with_cache<R>(&self, f: impl FnOnce(&KvCache) -> R) -> R {
        self.cache.read(f)
    }

    /// The scheduler (read-only), for inspection.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Empties the prefix cache if no block is in use; the `AllBlocksCleared` event is
    /// returned by the next [`EngineCore::take_kv_events`] or step.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.cache.with(KvCache::reset_prefix_cache)
    }

    /// KV events produced outside a step (reset).
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.cache.with(KvCache::take_events)
    }
}

/// The `index`-th generated token of request `id`: SplitMix64 of the three, so it does not
/// depend on batching or timing.
pub fn sample_token(seed: u64, id: RequestId, index: usize, vocab: u32) -> u32 {
    let mut z = seed
        ^ id.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (index as u64).wrapping_mul(0xd1b5_4a32_d192_ed03);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % u64::from(vocab.max(1))) as u32
}

#[path = "core_step.rs"]
mod step;

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "handoff_tests.rs"]
mod handoff_tests;
