//! The engines' KV-cache event protocol: wire types, decoding of every released layout,
//! encoding (for the simulated engine), the ZeroMQ subscriber with replay, and the publisher.
//!
//! Pure parts ([`decode`], [`encode`], [`sequence`]) are separate from the socket parts
//! ([`subscriber`], [`publisher`]), so the layout logic is tested without ZeroMQ.

mod contexts;
pub mod decode;
pub mod encode;
mod fields;
mod intake;
mod intake_plan;
mod monitored;
mod msgpack;
pub mod publisher;
pub mod replay;
pub mod sequence;
mod stream;
pub mod subscriber;
mod subscription;
pub mod wire;

pub use decode::{DecodeError, decode_batch};
pub use encode::{Layout, encode_batch};
pub use intake_plan::DEFAULT_ENGINES_PER_INTAKE;
pub use publisher::{Publisher, PublisherConfig, PublisherError};
pub use replay::{ReplayBound, ReplayError, ReplayLimits};
pub use subscriber::{Subscriber, SubscriberError, SubscriberHandle};
pub use subscription::{
    DropReason, SubscriberConfig, SubscriberEvent, SubscriberStats, WorkerEvent,
};
pub use wire::{BlockRemoved, BlockStored, EngineHash, EventBatch, KvEvent, Tier};
