//! The simulated engine: a stand-in for a GPU replica that behaves like vLLM where a router
//! can see it.
//!
//! Nobody can judge a router without replicas that behave like real ones, and tests, demos and
//! benchmarks here have no GPU. The engine is split so the same model serves everywhere:
//!
//! - the **model core** ([`EngineCore`]: [`scheduler`], [`kv_cache`], [`timing`]) is a pure
//!   state machine driven by a clock it is given — `sim` runs it in virtual time;
//! - the **HTTP face** runs that core in real time behind the OpenAI API, exposes vLLM's
//!   metrics and publishes KV events in vLLM's wire format.

pub mod block_hash;
pub mod core;
pub mod free_queue;
pub mod kv_cache;
pub mod request;
pub mod scheduler;
pub mod timing;

pub use block_hash::EngineHasher;
pub use core::{
    AddError, ConfigError, EngineConfig, EngineCore, EngineCounters, StepOutcome, TokenEvent,
};
pub use kv_cache::KvCache;
pub use request::{FinishReason, RequestId, RequestStats};
pub use timing::{StepTiming, StepWork};
