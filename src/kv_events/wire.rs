//! The decoded shape of the engines' KV-cache events, independent of release layout.
//!
//! vLLM and SGLang have changed their msgpack layout many times (arrays → maps, int → bytes
//! hashes, new trailing fields). Everything downstream (`index`, `engine`) works on these types
//! only, so a new layout is a change to the decoder and nowhere else.

/// An engine's own id for a block. Opaque: kvroute never tries to reproduce it, it only maps it
/// to its own [`crate::tokens::BlockHash`] per worker.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct EngineHash(pub u64);

/// A run of full blocks the engine committed to its prefix cache, in chain order.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct BlockStored {
    /// Engine ids of the stored blocks, one per `block_size` tokens of `token_ids`.
    pub block_hashes: Vec<EngineHash>,
    /// The block this run continues, `None` for the start of a prompt.
    pub parent_block_hash: Option<EngineHash>,
    /// Tokens of all stored blocks, concatenated.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// Integer LoRA id (older releases), if any.
    pub lora_id: Option<i64>,
    /// Storage medium (`"GPU"`, `"CPU"`, …); absent means GPU.
    pub medium: Option<String>,
    /// LoRA adapter name (vLLM ≥ 0.11), if any.
    pub lora_name: Option<String>,
    /// The cache salt of the chain, from vLLM's `extra_keys` of the first block or SGLang's
    /// `cache_salt` field; `None` when the engine did not publish one.
    pub cache_salt: Option<String>,
    /// KV-cache group (hybrid models); absent means 0.
    pub group_idx: Option<i64>,
    /// Attention kind of the group (`"full_attention"`, `"sliding_window"`, …).
    pub kv_cache_spec_kind: Option<String>,
}

/// Blocks the engine evicted from its prefix cache.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct BlockRemoved {
    /// Engine ids of the removed blocks.
    pub block_hashes: Vec<EngineHash>,
    /// Storage medium; absent means GPU.
    pub medium: Option<String>,
    /// KV-cache group; absent means 0.
    pub group_idx: Option<i64>,
}

/// One KV-cache event.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// Blocks committed to the prefix cache.
    Stored(BlockStored),
    /// Blocks evicted.
    Removed(BlockRemoved),
    /// The whole prefix cache was reset.
    AllCleared,
    /// An event type this release of kvroute does not know; counted and skipped.
    Unknown(String),
}

/// One published message: a timestamped batch of events.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// Engine wall-clock time of the batch, seconds since the epoch.
    pub ts: f64,
    /// The events, in the order the engine produced them.
    pub events: Vec<KvEvent>,
    /// Data-parallel rank (`data_parallel_rank` / `attn_dp_rank`); absent in vLLM 0.9.0.
    pub dp_rank: Option<i64>,
}

impl KvEvent {
    /// Whether the event describes device (GPU, group 0, full-attention) prefix-cache blocks,
    /// the only ones that save prefill for a routed request.
    pub fn is_device_prefix(&self) -> bool {
        fn gpu(medium: &Option<String>) -> bool {
            medium
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case("GPU"))
        }
        fn group0(g: &Option<i64>) -> bool {
            g.is_none_or(|g| g == 0)
        }
        match self {
            KvEvent::Stored(s) => {
                gpu(&s.medium)
                    && group0(&s.group_idx)
                    && s.kv_cache_spec_kind
                        .as_deref()
                        .is_none_or(|k| k == "full_attention")
            }
            KvEvent::Removed(r) => gpu(&r.medium) && group0(&r.group_idx),
            KvEvent::AllCleared => true,
            KvEvent::Unknown(_) => false,
        }
    }
}
