//! kvroute: a KV-cache-aware router for LLM serving — the `kvroute` command.
//!
//! This package is the binary and its command line (`cli`, `manual`, `demo`) over three crates
//! (ARCHITECTURE.md, "The crates"): the transport-free core (`kvroute-core`), the router
//! (`kvroute-router`) and the lab (`kvroute-lab`, feature `lab`). Their modules are re-exported
//! here under the paths they have always had (`kvroute::server`, `kvroute::sim`, ...), so the
//! integration tests and benches read one crate.

pub use kvroute_router::{
    config, discovery, fleet, heap, index, kv_events, lifecycle, metrics, openai, policy, proxy,
    recording, replica_bus, routing, server, shaping, telemetry, tls, tokens,
};

#[cfg(feature = "epp")]
pub use kvroute_router::epp;

#[cfg(feature = "lab")]
pub use kvroute_lab::{bench, engine, report, sim, workload};

pub mod cli;
#[cfg(feature = "lab")]
pub mod demo;
pub mod manual;
