//! Who holds which block: the core's index ([`kvroute_core::index`]), with what the router
//! runs around it — a worker's KV events fed into it ([`WorkerFeed`], a task per worker) and
//! its Prometheus gauges ([`IndexGauges`]).

pub use kvroute_core::index::*;

mod feed;
mod gauges;

pub use feed::{FeedModel, WorkerFeed, seeds_for};
pub use gauges::IndexGauges;
