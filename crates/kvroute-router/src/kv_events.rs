//! The engines' KV-cache events: the core's wire types, decoding and encoding
//! ([`kvroute_core::kv_events`]), with the sockets here — the ZeroMQ subscriber with replay
//! ([`subscriber`]) and the publisher ([`publisher`]).

pub use kvroute_core::kv_events::*;

mod contexts;
mod intake;
mod intake_plan;
mod monitored;
pub mod publisher;
pub mod replay;
mod stream;
pub mod subscriber;
mod subscription;

pub use intake_plan::DEFAULT_ENGINES_PER_INTAKE;
pub use publisher::{Publisher, PublisherConfig, PublisherError};
pub use replay::{ReplayBound, ReplayError, ReplayLimits};
pub use subscriber::{Subscriber, SubscriberError, SubscriberHandle};
pub use subscription::{
    DropReason, SubscriberConfig, SubscriberEvent, SubscriberStats, WorkerEvent,
};
