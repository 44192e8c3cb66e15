//! kvroute's lab: what measures the router from outside — the simulated engine (`engine`,
//! `kvroute engine`), the virtual-time simulator (`sim`, `kvroute simulate`), the bench client
//! (`bench`, `kvroute bench`), their workloads (`workload`) and reports (`report`).
//!
//! It builds on the router (`kvroute-router`: the KV-event publisher, the replica bus's wire
//! format, the proxy's first-token reading, the index's settings) and on the core the router
//! decides with (`kvroute-core`), so the simulator runs the live decision code. The router
//! never imports the lab: `cargo build -p kvroute-router` builds the router alone.

pub mod bench;
pub mod engine;
pub mod report;
pub mod sim;
pub mod workload;
