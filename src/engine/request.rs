//! One request inside the engine: its tokens, progress, blocks and timings.

use std::sync::Arc;

use super::block_hash::EngineHasher;
use super::kv_cache::{BlockTable, SeqView};
use crate::kv_events::EngineHash;

/// The caller's id for a request; unique among the engine's live requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced its `max_output_tokens` (OpenAI `"length"`).
    Length,
    /// The caller aborted it (client went away).
    Aborted,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Aborted => "abort",
        }
    }
}

/// Everything a router could be judged by for one request; times in engine seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestStats {
    /// The request.
    pub id: RequestId,
    /// When it was added.
    pub arrival: f64,
    /// Start of the step that first scheduled it, if any.
    pub first_scheduled: Option<f64>,
    /// End of the step that produced its first output token, if any.
    pub first_token: Option<f64>,
    /// When it finished or was aborted.
    pub finished: f64,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache when first scheduled (vLLM reports the
    /// first scheduling too).
    pub cached_tokens: usize,
    /// Output tokens produced.
    pub output_tokens: usize,
    /// Times it was preempted.
    pub preemptions: u32,
    /// Why it ended.
    pub reason: FinishReason,
}

impl RequestStats {
    /// Time from arrival to first scheduling.
    pub fn queue_time(&self) -> Option<f64> {
        self.first_scheduled.map(|t| t - self.arrival)
    }

    /// Time to first token.
    pub fn ttft(&self) -> Option<f64> {
        self.first_token.map(|t| t - self.arrival)
    }

    /// Time from arrival to the end.
    pub fn e2e(&self) -> f64 {
        self.finished - self.arrival
    }
}

/// A live request.
#[derive(Debug)]
pub struct Request {
    /// Its id.
    pub id: RequestId,
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    /// Length of the prompt prefix of `tokens`.
    pub prompt_len: usize,
    /// Output tokens to generate.
    pub max_output: usize,
    /// Tokens whose KV is computed (or adopted from the prefix cache).
    pub num_computed: usize,
    /// Engine hashes of every full block of `tokens`.
    pub hashes: Vec<EngineHash>,
    /// Chain seed (from the cache salt).
    pub chain_seed: u64,
    /// The cache salt, reported in events.
    pub cache_salt: Option<Arc<str>>,
    /// Its KV blocks.
    pub table: BlockTable,
    /// Arrival time.
    pub arrival: f64,
    /// First scheduling time.
    pub first_scheduled: Option<f64>,
    /// First token time.
    pub first_token: Option<f64>,
    /// Cached prompt tokens at first scheduling.
    pub cached_tokens: usize,
    /// Preemptions suffered.
    pub preemptions: u32,
}

impl Request {
    /// A new waiting request; hashes its prompt's full blocks.
    pub fn new(
        id: RequestId,
        prompt: Vec<u32>,
        max_output: usize,
        arrival: f64,
        cache_salt: Option<Arc<str>>,
        hasher: &EngineHasher,
        block_size: usize,
    ) -> Self {
        let chain_seed = hasher.chain_seed(cache_salt.as_deref());
        let prompt_len = prompt.len();
        let mut tokens = prompt;
        tokens.reserve(max_output);
        let mut r = Request {
            id,
            tokens,
            prompt_len,
            max_output,
            num_computed: 0,
            hashes: Vec::with_capacity((prompt_len + max_output) / block_size.max(1)),
            chain_seed,
            cache_salt,
            table: BlockTable::default(),
            arrival,
            first_scheduled: None,
            first_token: None,
            cached_tokens: 0,
            preemptions: 0,
        };
        r.extend_hashes(hasher, block_size);
        r
    }

    /// Total tokens so far.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Output tokens so far.
    pub fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Whether it is past its prompt and produces one token per step.
    pub fn is_decoding(&self) -> bool {
        self.num_computed >= self.prompt_len && self.num_tokens() - self.num_computed == 1
    }

    /// Appends a generated token (hashing a block it completes).
    pub fn push_output(&mut self, token: u32, hasher: &EngineHasher, block_size: usize) {
        self.tokens.push(token);
        self.extend_hashes(hasher, block_size);
    }

    /// The view the KV cache needs; split borrows so the table can be borrowed mutably.
    pub fn parts(&mut self) -> (&mut BlockTable, SeqView<'_>) {
        (
            &mut self.table,
            SeqView {
                tokens: &self.tokens,
                hashes: &self.hashes,
                cache_salt: self.cache_salt.as_deref(),
            },
        )
    }

    /// Its statistics, ending now with `reason`.
    pub fn stats(&self, finished: f64, reason: FinishReason) -> RequestStats {
        RequestStats {
            id: self.id,
            arrival: self.arrival,
            first_scheduled: self.first_scheduled,
            first_token: self.first_token,
            finished,
            prompt_tokens: self.prompt_len,
            cached_tokens: self.cached_tokens,
            output_tokens: self.output_len(),
            preemptions: self.preemptions,
            reason,
        }
    }

    fn extend_hashes(&mut self, hasher: &EngineHasher, block_size: usize) {
        let bs = block_size.max(1);
        while (self.hashes.len() + 1) * bs <= self.tokens.len() {
            let i = self.hashes.len();
            let parent = i.checked_sub(1).map(|p| self.hashes[p]);
            let h = hasher.hash(self.chain_seed, parent, &self.tokens[i * bs..(i + 1) * bs]);
            self.hashes.push(h);
        }
    }
}
