//! Who holds which block: the exact, event-fed index, approximate predictions, and the overlap
//! lookup a routing decision makes.
//!
//! - [`KvIndex`] applies each worker's decoded KV events. Engine block ids are opaque, so it
//!   recomputes kvroute's own chained hashes from each BlockStored's tokens (chaining from the
//!   parent's kvroute hash), stores each chain as runs of consecutive blocks with their holders
//!   (`runs`), and keeps a per-worker map from engine id to the block's place for BlockRemoved.
//!   Blocks in host memory or on disk (vLLM's offloading connector, SGLang's HiCache) are kept
//!   per tier beside them (`tiers`), reference-counted per announcement; other KV-cache groups
//!   (sliding window, mamba) are not indexed.
//! - [`ApproxIndex`] records the blocks of routed requests with a TTL and a per-worker bound.
//! - [`Holdings`] looks both up as one: per worker, the number of *leading* blocks held.
//! - [`Residency`] is each worker's working set: the blocks admitted requests touched there
//!   lately, and the measured chance that a written block is asked for again.
//!
//! Workers are dense [`WorkerId`] numbers assigned by `fleet`, so "who holds this block" is a
//! 32-bit set per 32 workers. Memory is bounded by [`IndexConfig::max_entries`] (block, worker)
//! pairs. `dynamo_workload` (feature `testing`: only tests and benches use it) is NVIDIA Dynamo's
//! indexer benchmark workload, which `benches/index.rs` runs (figures in
//! `docs/index-performance.md`); `workload` is the older issue-4 workload the tests use.
//!
//! ```
//! use kvroute_core::fleet::WorkerId;
//! use kvroute_core::index::{IndexConfig, KvIndex};
//! use kvroute_core::kv_events::{BlockStored, EngineHash, EventBatch, KvEvent};
//! use kvroute_core::tokens::{HashSeed, block_hashes};
//!
//! let index = KvIndex::new(IndexConfig::default());
//! // The caller knows the model and namespaces tenants' salts; the index only asks.
//! let seeds = |salt: Option<&str>, lora: Option<&str>| HashSeed::new("my-model", lora, salt);
//! let tokens: Vec<u32> = (0..32).collect();
//! let stored = BlockStored {
//!     block_hashes: vec![EngineHash(7), EngineHash(8)],
//!     token_ids: tokens.clone(),
//!     block_size: 16,
//!     ..BlockStored::default()
//! };
//! let batch = EventBatch { ts: 0.0, events: vec![KvEvent::Stored(stored)], dp_rank: None };
//! index.apply(WorkerId(3), &batch, &seeds);
//!
//! let request = block_hashes(HashSeed::new("my-model", None, None), &tokens, 16);
//! assert_eq!(index.lookup(&request).get(WorkerId(3)), 2);
//! ```

mod approx;
mod blocks;
mod buckets;
#[cfg(any(test, feature = "testing"))]
pub mod dynamo_workload;
mod exact;
mod holdings;
mod overlaps;
pub mod prefix_rates;
mod residency;
mod run;
mod runs;
mod sessions;
mod stats;
mod table;
mod tiers;
mod worker;
#[cfg(any(test, feature = "testing"))]
pub mod workload;

pub use approx::{ApproxConfig, ApproxIndex};
pub use exact::{Applied, ChainHolders, IndexConfig, KvIndex, SeedFor, WRITE_CHUNK};
pub use holdings::Holdings;
pub use overlaps::Overlaps;
pub use prefix_rates::PrefixRates;
pub use residency::{Residency, ResidencyConfig, ReuseCurve};
pub use sessions::{
    DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL, SessionHome, SessionHomes, SessionKey,
};
pub use stats::{IndexStats, StatsSnapshot};
