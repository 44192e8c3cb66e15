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

/// Where a block's KV lives, from the fastest to the slowest to load into the GPU.
///
/// Engines name the medium freely (vLLM `GPU`/`CPU`/`STORAGE`, SGLang HiCache
/// `GPU`/`CPU_PINNED`/`DISK`/`EXTERNAL`); what routing needs is only how far the bytes are from
/// the attention kernels, so every name maps onto one of three tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Device memory: the prefix cache proper, reused at no load cost.
    Gpu,
    /// Host memory (vLLM's OffloadingConnector CPU tier, SGLang's `CPU_PINNED`).
    Cpu,
    /// Anything slower than host memory: local disk, a storage tier, a remote pool.
    Disk,
}

impl Tier {
    /// Every tier, in the order an engine loads a prefix from them.
    pub const ALL: [Tier; 3] = [Tier::Gpu, Tier::Cpu, Tier::Disk];

    /// The tier a medium name denotes; absent means the GPU (releases before `medium`).
    pub fn of_medium(medium: Option<&str>) -> Tier {
        let Some(m) = medium else {
            return Tier::Gpu;
        };
        let upper = m.to_ascii_uppercase();
        if matches!(upper.as_str(), "GPU" | "DEVICE" | "HBM" | "CUDA") {
            Tier::Gpu
        } else if upper.starts_with("CPU") || matches!(upper.as_str(), "HOST" | "DRAM") {
            Tier::Cpu
        } else {
            Tier::Disk
        }
    }

    /// The tier's label (`gpu`, `cpu`, `disk`), as metrics and `/debug/route` name it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Gpu => "gpu",
            Tier::Cpu => "cpu",
            Tier::Disk => "disk",
        }
    }

    /// 0, 1, 2: for per-tier arrays.
    pub fn index(self) -> usize {
        self as usize
    }
}

impl BlockStored {
    /// A store that only moves blocks the engine already announced to another tier: no
    /// tokens, block size 0, no parent. vLLM's offloading connector sends these (before 0.24
    /// always; later without `self_describing_kv_events`), naming each offloaded chunk by the
    /// engine hash of its last block.
    pub fn is_placeholder(&self) -> bool {
        self.token_ids.is_empty() && self.block_size == 0 && self.parent_block_hash.is_none()
    }
}

impl KvEvent {
    /// The tier of the prefix-cache blocks the event describes: `None` for events about other
    /// KV-cache groups (hybrid models' sliding-window or mamba groups, which never save a
    /// routed request's prefill) and unknown events. A clear is about every tier: `Some(Gpu)`.
    pub fn prefix_tier(&self) -> Option<Tier> {
        fn group0(g: &Option<i64>) -> bool {
            g.is_none_or(|g| g == 0)
        }
        match self {
            KvEvent::Stored(s) => (group0(&s.group_idx)
                && s.kv_cache_spec_kind
                    .as_deref()
                    .is_none_or(|k| k == "full_attention"))
            .then(|| Tier::of_medium(s.medium.as_deref())),
            KvEvent::Removed(r) => {
                group0(&r.group_idx).then(|| Tier::of_medium(r.medium.as_deref()))
            }
            KvEvent::AllCleared => Some(Tier::Gpu),
            KvEvent::Unknown(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engines_medium_names_map_to_a_tier() {
        for (m, t) in [
            (None, Tier::Gpu),
            (Some("GPU"), Tier::Gpu),
            (Some("gpu"), Tier::Gpu),
            (Some("CPU"), Tier::Cpu),
            (Some("CPU_PINNED"), Tier::Cpu),
            (Some("STORAGE"), Tier::Disk),
            (Some("DISK"), Tier::Disk),
            (Some("EXTERNAL"), Tier::Disk),
        ] {
            assert_eq!(Tier::of_medium(m), t, "{m:?}");
        }
    }

    #[test]
    fn other_groups_have_no_prefix_tier_and_placeholders_are_recognised() {
        let cpu = BlockStored {
            block_hashes: vec![EngineHash(1)],
            medium: Some("CPU".into()),
            ..BlockStored::default()
        };
        assert!(cpu.is_placeholder());
        assert_eq!(KvEvent::Stored(cpu.clone()).prefix_tier(), Some(Tier::Cpu));
        let sliding = BlockStored {
            kv_cache_spec_kind: Some("sliding_window".into()),
            ..cpu.clone()
        };
        assert_eq!(KvEvent::Stored(sliding).prefix_tier(), None);
        let group1 = BlockRemoved {
            group_idx: Some(1),
            ..BlockRemoved::default()
        };
        assert_eq!(KvEvent::Removed(group1).prefix_tier(), None);
        let full = BlockStored {
            token_ids: vec![1],
            block_size: 1,
            ..cpu
        };
        assert!(!full.is_placeholder());
    }
}
