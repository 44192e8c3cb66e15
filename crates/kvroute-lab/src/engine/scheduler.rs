//! Which requests run in the next step and how many tokens each gets: vLLM V1's scheduler.
//!
//! Each step has a token budget (`max_num_batched_tokens`). Running requests are served first,
//! decodes before prefill chunks, so a long prompt never stalls token streams (vLLM V1 walks
//! its running list in arrival order, which is nearly the same; the decode-first order makes
//! the guarantee explicit). A prompt larger than the remaining budget gets a chunk (chunked
//! prefill) and continues next step; with `--long-prefill-token-threshold` a prompt takes at most
//! that many tokens a step even when the budget has more, so the prompts queued behind a long
//! one share its steps rather than wait for its end. Then, if nothing was preempted this step, waiting
//! requests are admitted in FIFO order while the budget, `max_num_seqs` and free KV blocks
//! allow, each adopting its longest cached prefix.
//!
//! When a running request needs a block and none is free, the newest running request is
//! preempted by recompute (vLLM's policy): its blocks are freed and it goes back to the front
//! of the waiting queue with no computed tokens, keeping the tokens it already generated.
//!
//! A request whose prompt's KV comes from a prefill engine ([`Handoff::FromPrefill`]) is
//! admitted in the same FIFO order when blocks for its whole prompt are free, but it takes no
//! token budget and no running slot: it adopts its local cached prefix, starts pulling the
//! rest (a [`KvPull`] ending at `now + transfer time`) and waits aside, as vLLM parks it in
//! `WAITING_FOR_REMOTE_KVS`. At the first step planned at or after its KV arrived it joins
//! the running set (while `max_num_seqs` allows) with all but its last prompt token computed,
//! and that token runs as a decode.
//!
//! A request whose GPU prefix the host-memory tier continues is admitted the same way, with
//! blocks for the loaded part at once; when they are not free it waits at the head of the
//! queue, as vLLM's scheduler stops when it cannot allocate a connector's tokens. It is never
//! admitted to recompute what the tier holds a chunk at a time.

use std::collections::VecDeque;

use super::kv_cache::{KvCache, SeqView};
use super::request::{Pull, Request, RequestId};
use super::transfer::{KvPull, TransferModel};
use kvroute_router::tokens::IdMap;

/// Limits of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerLimits {
    /// Most sequences in the running set.
    pub max_num_seqs: usize,
    /// Most new tokens per step, over all requests.
    pub max_num_batched_tokens: usize,
    /// Most prompt tokens one request computes in a step (vLLM's
    /// `--long-prefill-token-threshold`; 0: no limit but the budget).
    pub long_prefill_token_threshold: usize,
}

impl SchedulerLimits {
    /// The tokens a request with `remaining` to compute gets out of `budget`: a long prompt
    /// takes at most the threshold, leaving the rest of the step to others (vLLM V1 caps
    /// running and waiting requests alike).
    fn chunk(&self, remaining: usize, budget: usize) -> usize {
        let t = self.long_prefill_token_threshold;
        let capped = if t > 0 { remaining.min(t) } else { remaining };
        capped.min(budget)
    }
}

/// One request's share of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// The request.
    pub id: RequestId,
    /// New tokens computed for it this step.
    pub num_new_tokens: usize,
    /// Whether this is a single decode token (else a prefill chunk).
    pub decode: bool,
}

/// The plan of one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// Requests and their token counts, running ones first.
    pub scheduled: Vec<Scheduled>,
    /// Requests preempted while planning this step.
    pub preempted: Vec<RequestId>,
    /// Requests admitted from the waiting queue this step.
    pub admitted: Vec<RequestId>,
    /// Prompt tokens looked up in the prefix cache by admitted requests.
    pub queried_tokens: usize,
    /// Of those, tokens found cached.
    pub hit_tokens: usize,
    /// Full blocks looked up by admitted requests.
    pub queried_blocks: usize,
    /// Of those, blocks found cached.
    pub hit_blocks: usize,
    /// KV transfers started this step (requests admitted to wait for a prefill's KV).
    pub pulls: Vec<KvPull>,
    /// Requests whose pulled KV arrived and that joined the running set this step.
    pub landed: Vec<RequestId>,
}

impl Batch {
    /// Whether nothing runs.
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}

/// Waiting and running queues over the engine's live requests.
#[derive(Debug)]
pub struct Scheduler {
    limits: SchedulerLimits,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    /// Admitted requests waiting for their KV transfer, in admission order.
    pulling: Vec<RequestId>,
    requests: IdMap<RequestId, Request>,
    transfer: TransferModel,
}

/// What a waiting request's host-tier prefix does at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Load {
    /// The tier holds nothing past the GPU hits: the request is admitted as usual.
    Nothing,
    /// Blocks are allocated and the load is under way.
    Started,
    /// The tier holds a prefix but its blocks are not free yet: the request waits.
    NoRoom,
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(limits: SchedulerLimits) -> Self {
        Self::with_transfer(limits, TransferModel::default())
    }

    /// An empty scheduler whose pulled prompts take `transfer`'s time to arrive.
    pub fn with_transfer(limits: SchedulerLimits, transfer: TransferModel) -> Self {
        Scheduler {
            limits,
            waiting: VecDeque::new(),
            running: Vec::new(),
            pulling: Vec::new(),
            requests: IdMap::default(),
            transfer,
        }
    }

    /// Queues a new request at the back of the waiting queue.
    pub fn add(&mut self, req: Request) {
        self.waiting.push_back(req.id);
        self.requests.insert(req.id, req);
    }

    /// Whether `id` is live.
    pub fn contains(&self, id: RequestId) -> bool {
        self.requests.contains_key(&id)
    }

    /// A live request.
    pub fn get(&self, id: RequestId) -> Option<&Request> {
        self.requests.get(&id)
    }

    /// A live request, mutably.
    pub fn get_mut(&mut self, id: RequestId) -> Option<&mut Request> {
        self.requests.get_mut(&id)
    }

    /// Removes a request from the queues and frees its blocks.
    pub fn remove(&mut self, id: RequestId, cache: &mut KvCache) -> Option<Request> {
        let mut req = self.take(id)?;
        cache.free(&mut req.table);
        Some(req)
    }

    /// Removes a request from the queues, keeping its blocks referenced by its table (a
    /// prefill for a remote decode holds them until they are pulled).
    pub fn take(&mut self, id: RequestId) -> Option<Request> {
        let req = self.requests.remove(&id)?;
        if let Some(i) = self.running.iter().position(|&r| r == id) {
            self.running.remove(i);
        } else if let Some(i) = self.waiting.iter().position(|&r| r == id) {
            self.waiting.remove(i);
        } else if let Some(i) = self.pulling.iter().position(|&r| r == id) {
            self.pulling.remove(i);
        }
        Some(req)
    }

    /// Requests in the running set.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting (new or preempted).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Admitted requests whose KV transfer has not landed in the running set yet.
    pub fn num_pulling(&self) -> usize {
        self.pulling.len()
    }

    /// Pulling request ids, in admission order.
    pub fn pulling(&self) -> &[RequestId] {
        &self.pulling
    }

    /// When the earliest running KV transfer or host-tier load completes: the engine has
    /// nothing to do before then if nothing else is live.
    pub fn next_ready_at(&self) -> Option<f64> {
        self.pulling
            .iter()
            .filter_map(|id| self.requests.get(id)?.ready_at())
            .min_by(f64::total_cmp)
    }

    /// The transfer model pulled prompts follow.
    pub fn transfer(&self) -> &TransferModel {
        &self.transfer
    }

    /// Running request ids, oldest first.
    pub fn running(&self) -> &[RequestId] {
        &self.running
    }

    /// Waiting request ids, next to admit first.
    pub fn waiting(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.waiting.iter().copied()
    }

    /// Plans one step starting at `now`, allocating KV blocks for everything scheduled.
    pub fn schedule(&mut self, cache: &mut KvCache, now: f64) -> Batch {
        let mut batch = Batch::default();
        cache.set_now(now);
        let mut budget = self.limits.max_num_batched_tokens;
        self.land(cache, now, &mut batch);
        self.schedule_running(cache, &mut budget, &mut batch);
        if batch.preempted.is_empty() {
            self.schedule_waiting(cache, now, &mut budget, &mut batch);
        }
        batch
    }

    fn schedule_running(&mut self, cache: &mut KvCache, budget: &mut usize, batch: &mut Batch) {
        let mut order: Vec<RequestId> = Vec::with_capacity(self.running.len());
        order.extend(self.running.iter().filter(|id| self.is_decoding(**id)));
        order.extend(self.running.iter().filter(|id| !self.is_decoding(**id)));
        for id in order {
            if *budget == 0 {
                break;
            }
            if batch.preempted.contains(&id) {
                continue;
            }
            let Some(req) = self.requests.get_mut(&id) else {
                continue;
            };
            let decode = req.is_decoding();
            let n = self
                .limits
                .chunk(req.num_tokens() - req.num_computed, *budget);
            if n == 0 {
                continue;
            }
            while let Some(req) = self.requests.get_mut(&id) {
                let computed = req.num_computed;
                let (table, seq) = req.parts();
                if cache.allocate(table, &[], computed, n, seq).is_ok() {
                    batch.scheduled.push(Scheduled {
                        id,
                        num_new_tokens: n,
                        decode,
                    });
                    *budget -= n;
                    break;
                }
                let Some(victim) = self.running.pop() else {
                    break;
                };
                self.preempt(victim, cache);
                batch.preempted.push(victim);
                if let Some(i) = batch.scheduled.iter().position(|s| s.id == victim) {
                    *budget += batch.scheduled.remove(i).num_new_tokens;
                }
                if victim == id {
                    // vLLM stops serving running requests once the current one is preempted.
                    return;
                }
            }
        }
    }

    fn schedule_waiting(
        &mut self,
        cache: &mut KvCache,
        now: f64,
        budget: &mut usize,
        batch: &mut Batch,
    ) {
        while *budget > 0 && self.running.len() < self.limits.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let Some(req) = self.requests.get_mut(&id) else {
                self.waiting.pop_front();
                continue;
            };
            let num_tokens = req.num_tokens();
            let hits = cache.cached_prefix(&req.hashes, num_tokens);
            let cached = hits.len() * cache.block_size();
            if req.pull == Pull::None {
                match Self::start_load(req, cache, &hits, now, batch) {
                    Load::Started => {
                        self.waiting.pop_front();
                        self.pulling.push(id);
                        continue;
                    }
                    // vLLM allocates the connector's tokens with the request's and, when they
                    // are not free, stops admitting: the prompt waits for room rather than
                    // recomputing what its tier holds.
                    Load::NoRoom => break,
                    Load::Nothing => {}
                }
            }
            if req.pull == Pull::Waiting {
                if !Self::start_pull(req, cache, &hits, now, self.transfer, batch) {
                    break;
                }
                self.waiting.pop_front();
                self.pulling.push(id);
                continue;
            }
            let n = self.limits.chunk(num_tokens - cached, *budget);
            let (table, seq) = req.parts();
            if cache.allocate(table, &hits, cached, n, seq).is_err() {
                break;
            }
            req.num_computed = cached;
            if req.first_scheduled.is_none() {
                req.first_scheduled = Some(now);
                req.cached_tokens = cached;
            }
            batch.queried_tokens += num_tokens;
            batch.hit_tokens += cached;
            batch.queried_blocks += num_tokens / cache.block_size();
            batch.hit_blocks += hits.len();
            batch.scheduled.push(Scheduled {
                id,
                num_new_tokens: n,
                decode: false,
            });
            batch.admitted.push(id);
            *budget -= n;
            self.waiting.pop_front();
            self.running.push(id);
        }
    }

    /// Admits a pulled request: blocks for its whole prompt (its local cached prefix
    /// adopted, the rest left uncommitted until the KV lands) and the transfer of the rest.
    /// `false`, changing nothing, when the blocks are not free.
    fn start_pull(
        req: &mut Request,
        cache: &mut KvCache,
        hits: &[u32],
        now: f64,
        transfer: TransferModel,
        batch: &mut Batch,
    ) -> bool {
        let num_tokens = req.num_tokens();
        let cached = hits.len() * cache.block_size();
        let pulled = num_tokens - cached;
        let (table, seq) = req.parts();
        // No hashes in the view: the pulled blocks are not committed before their data is.
        let unhashed = SeqView { hashes: &[], ..seq };
        if cache
            .allocate(table, hits, cached, pulled, unhashed)
            .is_err()
        {
            return false;
        }
        let ready_at = now + transfer.time_for(pulled);
        req.num_computed = cached;
        req.first_scheduled.get_or_insert(now);
        req.cached_tokens = cached;
        req.transferred_tokens = pulled;
        req.pull = Pull::InFlight { ready_at };
        batch.queried_tokens += num_tokens;
        batch.hit_tokens += cached;
        batch.queried_blocks += num_tokens / cache.block_size();
        batch.hit_blocks += hits.len();
        batch.pulls.push(KvPull {
            id: req.id,
            tokens: pulled,
            bytes: transfer.bytes_for(pulled),
            start: now,
            ready_at,
        });
        true
    }

    /// Admits a request whose GPU prefix the host-memory tier continues: blocks for the GPU
    /// hits and the loaded blocks (these uncommitted until their data is there), and the load.
    /// Changes nothing unless it answers [`Load::Started`].
    fn start_load(
        req: &mut Request,
        cache: &mut KvCache,
        hits: &[u32],
        now: f64,
        batch: &mut Batch,
    ) -> Load {
        let num_tokens = req.num_tokens();
        let bs = cache.block_size();
        let reusable = (num_tokens.saturating_sub(1) / bs).min(req.hashes.len());
        let loads = cache.tier_prefix(&req.hashes[hits.len().min(reusable)..reusable]);
        if loads == 0 {
            return Load::Nothing;
        }
        let cached = hits.len() * bs;
        let loaded = loads * bs;
        let (table, seq) = req.parts();
        let unhashed = SeqView { hashes: &[], ..seq };
        if cache
            .allocate(table, hits, cached, loaded, unhashed)
            .is_err()
        {
            // Blocks the cache could never free at once would stall the queue for good.
            return if hits.len() + loads > cache.num_blocks() {
                Load::Nothing
            } else {
                Load::NoRoom
            };
        }
        let seconds = cache.tier_load(&req.hashes[hits.len()..hits.len() + loads]);
        req.num_computed = cached + loaded;
        if req.first_scheduled.is_none() {
            req.first_scheduled = Some(now);
            // vLLM counts the connector's tokens among the request's cached ones.
            req.cached_tokens = cached + loaded;
            req.loaded_tokens = loaded;
        }
        req.pull = Pull::Loading {
            ready_at: now + seconds,
        };
        batch.queried_tokens += num_tokens;
        batch.hit_tokens += cached;
        batch.queried_blocks += num_tokens / bs;
        batch.hit_blocks += hits.len();
        Load::Started
    }

    /// Moves every pulled request whose KV arrived by `now` into the running set, while
    /// `max_num_seqs` allows, with its blocks committed and only its last prompt token left.
    fn land(&mut self, cache: &mut KvCache, now: f64, batch: &mut Batch) {
        let mut i = 0;
        while i < self.pulling.len() && self.running.len() < self.limits.max_num_seqs {
            let id = self.pulling[i];
            let Some(req) = self.requests.get_mut(&id) else {
                self.pulling.remove(i);
                continue;
            };
            let Some(ready_at) = req.ready_at().filter(|&t| t <= now) else {
                i += 1;
                continue;
            };
            let prompt_len = req.prompt_len;
            let reload = matches!(req.pull, Pull::Loading { .. });
            let commit = if reload {
                // Loaded from the host tier: the rest of the prompt is prefilled as usual.
                req.pull = Pull::None;
                req.num_computed
            } else {
                req.kv_ready = Some(ready_at);
                req.pull = Pull::Landed;
                req.num_computed = req.num_computed.max(prompt_len.saturating_sub(1));
                prompt_len
            };
            let (table, seq) = req.parts();
            cache.commit_tokens(table, commit, seq);
            self.pulling.remove(i);
            self.running.push(id);
            if !reload {
                batch.landed.push(id);
            }
        }
    }

    fn is_decoding(&self, id: RequestId) -> bool {
        self.requests.get(&id).is_some_and(Request::is_decoding)
    }

    fn preempt(&mut self, id: RequestId, cache: &mut KvCache) {
        if let Some(req) = self.requests.get_mut(&id) {
            cache.free(&mut req.table);
            req.num_computed = 0;
            req.preemptions += 1;
        }
        self.waiting.push_front(id);
    }
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
