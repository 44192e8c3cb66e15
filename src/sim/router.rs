//! The router's side of a simulation: exactly the live router's decision and bookkeeping,
//! in virtual time.
//!
//! `server::route` and `server::forward` do, per request: tokenize and hash the prompt and look
//! it up in the index only when the policy uses prefixes (load-only policies see a default
//! [`RouteRequest`] and admit zero tokens); build one [`Candidate`] per eligible worker with its
//! load snapshot and overlap; let the policy choose; count the request on the chosen worker with
//! [`Load::admit`] (prompt tokens, uncached tokens = prompt − overlap × block size); record the
//! routed blocks in the approximate index when the worker has no event feed; at the first token
//! release the queued prefill and feed the policy an [`Observation`]; release everything at the
//! end. This file does the same with the same types ([`Load`], [`LoadGuard`], [`Holdings`]),
//! so a simulated decision is the decision the live router would make in the same state.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::events::batch;
use crate::fleet::{Load, LoadGuard};
use crate::index::{ApproxConfig, ApproxIndex, Holdings, IndexConfig, KvIndex, WorkerIdx};
use crate::kv_events::KvEvent;
use crate::policy::{Candidate, Observation, Policy, RouteRequest};
use crate::tokens::model::hash_seed;
use crate::tokens::{BlockHash, HashSeed, block_hashes};

use super::config::IndexMode;

/// A request the router has sent to a worker, holding its load until it ends.
#[derive(Debug)]
pub struct Routed {
    /// The chosen worker.
    pub slot: u32,
    /// Leading blocks the router believed the worker held.
    pub overlap_blocks: u32,
    /// Full blocks of the prompt (0 for load-only policies).
    pub blocks: u32,
    guard: LoadGuard,
    uncached_tokens: u64,
    queued_tokens: u64,
    decoding: u64,
    at: f64,
    observed: bool,
}

/// The router: policy, index and per-worker load.
pub struct SimRouter {
    policy: Arc<dyn Policy>,
    holdings: Holdings,
    loads: Vec<Arc<Load>>,
    ids: Vec<Arc<str>>,
    eligible: Vec<bool>,
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
        let defaults = crate::config::IndexSettings::default();
        let holdings = Holdings::new(
            KvIndex::new(IndexConfig {
                max_entries: defaults.max_entries,
            }),
            ApproxIndex::new(ApproxConfig {
                ttl: defaults.approx_ttl,
                capacity_per_worker: defaults.approx_capacity_blocks,
            }),
        );
        SimRouter {
            policy,
            holdings,
            loads: (0..max_workers)
                .map(|_| Arc::new(Load::default()))
                .collect(),
            ids: (0..max_workers).map(|i| format!("w{i}").into()).collect(),
            eligible: vec![false; max_workers as usize],
            mode,
            model: model.to_string(),
            seed: hash_seed(model, None, None),
            block_size,
        }
    }

    /// The policy's name.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// The index (for inspection).
    pub fn holdings(&self) -> &Holdings {
        &self.holdings
    }

    /// Makes worker `slot`, whose KV cache holds `kv_blocks` blocks, eligible for routing (at
    /// start or when it joins). With events, the exact index is sized for that cache, as the
    /// live router does once it has read the engine's `num_gpu_blocks`.
    pub fn enable(&mut self, slot: u32, kv_blocks: usize) {
        if let Some(e) = self.eligible.get_mut(slot as usize) {
            *e = true;
            if matches!(self.mode, IndexMode::Events { .. }) {
                self.holdings.exact.reserve(WorkerIdx(slot), kv_blocks);
            }
        }
    }

    /// Whether the router hashes prompts at all (the live router skips it for load-only
    /// policies).
    pub fn uses_prefix(&self) -> bool {
        self.policy.uses_prefix()
    }

    /// kvroute's block hashes of a prompt, as the live router computes them.
    pub fn hashes(&self, prompt: &[u32]) -> Vec<BlockHash> {
        block_hashes(self.seed, prompt, self.block_size)
    }

    /// Routes a prompt at time `now`; `None` when no worker is eligible.
    pub fn route(&self, prompt: &[u32], now: f64) -> Option<Routed> {
        let (request, hashes) = if self.policy.uses_prefix() {
            let hashes = self.hashes(prompt);
            let request = RouteRequest {
                prompt_tokens: prompt.len() as u64,
                blocks: u32::try_from(hashes.len()).unwrap_or(u32::MAX),
                block_size: u32::try_from(self.block_size).unwrap_or(u32::MAX),
            };
            (request, hashes)
        } else {
            (RouteRequest::default(), Vec::new())
        };
        let overlaps = if hashes.is_empty() {
            Default::default()
        } else {
            self.holdings.lookup(&hashes, duration(now))
        };
        let candidates: Vec<Candidate> = (0..self.loads.len())
            .filter(|&i| self.eligible[i])
            .map(|i| Candidate {
                id: Arc::clone(&self.ids[i]),
                slot: i as u32,
                load: self.loads[i].snapshot(),
                overlap_blocks: overlaps.get(WorkerIdx(i as u32)),
            })
            .collect();
        let decision = self.policy.choose(&request, &candidates)?;
        let chosen = candidates.get(decision.chosen)?;
        let cached = u64::from(chosen.overlap_blocks) * u64::from(request.block_size);
        let uncached = request.prompt_tokens.saturating_sub(cached);
        if request.blocks > 0 && matches!(self.mode, IndexMode::Approx) {
            self.holdings
                .approx
                .record_routed(WorkerIdx(chosen.slot), &hashes, duration(now));
        }
        let guard = self.loads[chosen.slot as usize].admit(request.prompt_tokens, uncached);
        Some(Routed {
            slot: chosen.slot,
            overlap_blocks: chosen.overlap_blocks.min(request.blocks),
            blocks: request.blocks,
            guard,
            uncached_tokens: uncached,
            queued_tokens: chosen.load.queued_prefill_tokens,
            decoding: chosen.load.decoding,
            at: now,
            observed: false,
        })
    }

    /// The request's first token arrived at `now`.
    pub fn first_token(&self, routed: &mut Routed, now: f64) {
        routed.guard.first_token();
        if !routed.observed {
            routed.observed = true;
            self.policy.observe(&Observation {
                slot: routed.slot,
                uncached_tokens: routed.uncached_tokens,
                queued_tokens: routed.queued_tokens,
                decoding: routed.decoding,
                ttft_s: now - routed.at,
            });
        }
    }

    /// The request ended (finished, failed or cancelled).
    pub fn finish(&self, routed: &mut Routed) {
        routed.guard.finish();
    }

    /// Applies one batch of worker `slot`'s KV events (events mode).
    pub fn apply_events(&self, slot: u32, ts: f64, events: Vec<KvEvent>) {
        let model = self.model.as_str();
        let seeds = |salt: Option<&str>, lora: Option<&str>| hash_seed(model, lora, salt);
        self.holdings
            .exact
            .apply(WorkerIdx(slot), &batch(ts, events), &seeds);
    }

    /// Worker `slot`'s event stream restarted: what the live feed does on a publisher reset.
    pub fn worker_restarted(&self, slot: u32) {
        if matches!(self.mode, IndexMode::Events { .. }) {
            self.holdings.exact.clear_worker(WorkerIdx(slot));
        }
    }
}
