//! The engines' KV-cache event protocol: wire types, decoding of every released layout,
//! encoding (for the simulated engine), the ZeroMQ subscriber with replay, and the publisher.

pub mod wire;

pub use wire::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent};
