//! The simulated engine: a stand-in for a GPU replica that behaves like vLLM where a router
//! can see it.
//!
//! Nobody can judge a router without replicas that behave like real ones, and tests, demos and
//! benchmarks here have no GPU. The engine is split so the same model serves everywhere:
//!
//! - the **model core** ([`EngineCore`]: [`scheduler`], [`kv_cache`], [`timing`]) is a pure
//!   state machine driven by a clock it is given, so `sim` runs it in virtual time; its
//!   prefill/decode hand-off is [`transfer`] (the KV's trip) and [`held`] (what the prefill
//!   side keeps until it is pulled);
//! - the **real-time face** ([`driver`], [`http`], [`server`]) runs that core on a tokio task
//!   behind the OpenAI API, exposes vLLM's metrics and publishes KV events in vLLM's wire
//!   format through a [`events::KvEventSink`].

pub mod app;
pub mod args;
pub mod audio;
pub mod block_hash;
pub mod bootstrap;
pub mod cache_slot;
pub mod cli;
pub mod core;
pub mod cpu_tier;
pub mod disaggregated;
pub mod driver;
pub mod events;
mod flag_values;
pub mod free_queue;
pub mod handoff_routes;
pub mod held;
pub mod http;
pub mod kv_cache;
pub mod kv_transfer;
pub mod metrics;
pub mod pooling;
pub mod request;
pub mod responses;
pub mod responses_api;
pub mod scheduler;
pub mod server;
pub mod tier_args;
pub mod tier_metrics;
pub mod timing;
pub mod tokenize;
pub mod transfer;

pub use args::{EngineCoreArgs, TimingArgs, TransferArgs};
pub use block_hash::EngineHasher;
pub use cli::{EngineArgs, run};
pub use core::{
    AddError, ConfigError, EngineConfig, EngineCore, EngineCounters, NewRequest, StepOutcome,
    TokenEvent,
};
pub use driver::{EngineClient, RequestEvent, RequestStream};
pub use events::{ChannelSink, KvEventSink, NoEvents};
pub use kv_cache::KvCache;
pub use request::{FinishReason, Handoff, RequestId, RequestStats};
pub use server::{EngineHandle, ServeConfig, StartError, start};
pub use tier_args::CpuTierArgs;
pub use timing::{StepTiming, StepWork};
pub use transfer::{KvPull, KvShape, TransferError, TransferModel};
