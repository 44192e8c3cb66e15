//! The engines' KV-cache event protocol: wire types, decoding of every released layout, and
//! encoding (for the simulated engine).
//!
//! Pure parts only ([`decode`], [`encode`], [`sequence`]): the ZeroMQ subscriber with replay and
//! the publisher are the router's (`kvroute::kv_events`), so the layout logic is tested without
//! ZeroMQ and the core links no socket library.

pub mod decode;
pub mod encode;
mod fields;
mod msgpack;
pub mod sequence;
pub mod wire;

pub use decode::{DecodeError, decode_batch};
pub use encode::{Layout, encode_batch};
pub use wire::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Tier};
