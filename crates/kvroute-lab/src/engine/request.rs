//! One request inside the engine: its tokens, progress, blocks and timings.

use std::sync::Arc;

use super::block_hash::EngineHasher;
use super::kv_cache::{BlockTable, SeqView};
use kvroute_router::kv_events::EngineHash;

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

/// A request's part in prefill/decode disaggregation (vLLM's `kv_transfer_params`; SGLang's
/// bootstrap fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Handoff {
    /// Prefill and decode both here (an aggregated engine, or a `both` one serving a plain
    /// request).
    #[default]
    Local,
    /// Prefill here for a decode elsewhere (vLLM `do_remote_decode`): the request produces
    /// exactly one token and finishes, and its prompt's blocks stay held until the decode
    /// side has pulled them ([`crate::engine::EngineCore::release_held`]) or the hold times
    /// out (`EngineConfig::kv_hold_timeout_s`, vLLM's `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`).
    ToDecode,
    /// The prompt's KV was computed by a prefill engine and is pulled from it (vLLM
    /// `do_remote_prefill`): the request takes KV blocks for its prompt when admitted, waits
    /// for the transfer of what its own prefix cache lacks, then computes only the last prompt
    /// token (in a decode step) and decodes.
    FromPrefill,
}

impl Handoff {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Handoff::Local => "local",
            Handoff::ToDecode => "to_decode",
            Handoff::FromPrefill => "from_prefill",
        }
    }
}

/// Where a [`Handoff::FromPrefill`] request's KV transfer stands.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pull {
    /// No transfer: the request computes its own prompt.
    None,
    /// Not admitted yet: no blocks, no transfer.
    Waiting,
    /// Blocks taken and the transfer running; the KV is there at `ready_at`.
    InFlight {
        /// When the transfer completes, engine seconds.
        ready_at: f64,
    },
    /// Loading its prefix from the host-memory tier (vLLM parks it in
    /// `WAITING_FOR_REMOTE_KVS` too); it prefills the rest once the blocks are there.
    Loading {
        /// When the load completes, engine seconds.
        ready_at: f64,
    },
    /// The KV arrived; after a preemption the request recomputes like any other (vLLM clears
    /// `do_remote_prefill` once the KV is loaded).
    Landed,
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
    /// Its part in prefill/decode disaggregation.
    pub handoff: Handoff,
    /// Prompt tokens whose KV was pulled from a prefill engine.
    pub transferred_tokens: usize,
    /// Of `cached_tokens`, those loaded from the host-memory tier at first scheduling.
    pub loaded_tokens: usize,
    /// When that KV arrived, if it was pulled.
    pub kv_ready: Option<f64>,
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
    /// Its part in prefill/decode disaggregation.
    pub handoff: Handoff,
    /// Its KV transfer, for a [`Handoff::FromPrefill`] request.
    pub pull: Pull,
    /// Prompt tokens pulled from the prefill engine.
    pub transferred_tokens: usize,
    /// Of `cached_tokens`, those loaded from the host-memory tier at first scheduling.
    pub loaded_tokens: usize,
    /// When the pulled KV arrived.
    pub kv_ready: Option<f64>,
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
            handoff: Handoff::Local,
            pull: Pull::None,
            transferred_tokens: 0,
            loaded_tokens: 0,
            kv_ready: None,
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

    /// A request of `handoff`'s kind (a new request is [`Handoff::Local`]).
    pub fn with_handoff(mut self, handoff: Handoff) -> Self {
        self.handoff = handoff;
        self.pull = match handoff {
            Handoff::FromPrefill => Pull::Waiting,
            Handoff::Local | Handoff::ToDecode => Pull::None,
        };
        self
    }

    /// Whether it produces one token per step: past its prompt, or a pulled prompt's last
    /// token (one new token over KV that is there, the same work as a decode; vLLM recomputes
    /// it so the decode side has its logits).
    pub fn is_decoding(&self) -> bool {
        let one_left = self.num_tokens() - self.num_computed == 1;
        one_left && (self.num_computed >= self.prompt_len || self.pull == Pull::Landed)
    }

    /// When its pulled KV arrives, while the transfer runs.
    pub fn ready_at(&self) -> Option<f64> {
        match self.pull {
            Pull::InFlight { ready_at } | Pull::Loading { ready_at } => Some(ready_at),
            _ => None,
        }
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
            handoff: self.handoff,
            transferred_tokens: self.transferred_tokens,
            loaded_tokens: self.loaded_tokens,
            kv_ready: self.kv_ready,
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
