//! kvroute: a KV-cache-aware router for LLM serving.
//!
//! See `ARCHITECTURE.md` for the flows and the module map. Lower modules never import `server`;
//! `policy` is pure so the same code runs live and in `sim`. The transport-free core
//! (`openai`, `tokens`, `kv_events` decoding, `index`, `fleet`, `policy`, `routing`) is the crate
//! `kvroute-core`, re-exported here under the same paths; this crate adds the I/O around it.

#[cfg(feature = "lab")]
pub mod bench;
pub mod cli;
pub mod config;
#[cfg(feature = "lab")]
pub mod demo;
pub mod discovery;
#[cfg(feature = "lab")]
pub mod engine;
#[cfg(feature = "epp")]
pub mod epp;
pub mod fleet;
pub mod heap;
pub mod index;
pub mod kv_events;
pub mod lifecycle;
pub mod manual;
pub mod metrics;
pub use kvroute_core::{openai, policy, routing};
pub mod proxy;
pub mod recording;
pub mod replica_bus;
#[cfg(feature = "lab")]
pub mod report;
pub mod server;
pub mod shaping;
#[cfg(feature = "lab")]
pub mod sim;
pub mod telemetry;
pub mod tls;
pub mod tokens;
#[cfg(feature = "lab")]
pub mod workload;
