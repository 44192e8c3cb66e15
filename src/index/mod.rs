//! Who holds which block: the exact, event-fed index, approximate predictions, and the overlap
//! lookup a routing decision makes.
//!
//! - [`KvIndex`] applies each worker's decoded KV events. Engine block ids are opaque, so it
//!   recomputes kvroute's own chained hashes from each BlockStored's tokens (chaining from the
//!   parent's kvroute hash, which it remembers per worker) and keeps a per-worker map from
//!   engine id to kvroute hash for BlockRemoved. Only device-prefix blocks are indexed.
//! - [`ApproxIndex`] records the blocks of routed requests with a TTL and a per-worker bound.
//! - [`Holdings`] looks both up as one: per worker, the number of *leading* blocks held.
//!
//! Workers are dense [`WorkerIdx`] numbers assigned by `fleet`, so "who holds this block" is a
//! 64-bit set per 64 workers. Memory is bounded by [`IndexConfig::max_entries`] (block, worker)
//! pairs. [`workload`] generates the reproducible benchmark workload of issue 4.

mod approx;
mod blocks;
mod exact;
mod feed;
mod holdings;
mod overlaps;
mod rehash;
mod stats;
mod table;
mod worker;
pub mod workload;

pub use approx::{ApproxConfig, ApproxIndex};
pub use exact::{Applied, IndexConfig, KvIndex, SeedFor, WRITE_CHUNK};
pub use feed::WorkerFeed;
pub use holdings::Holdings;
pub use overlaps::Overlaps;
pub use stats::{IndexStats, StatsSnapshot};
pub use worker::WorkerIdx;
