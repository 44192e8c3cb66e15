//! The workers behind the router: the core's fleet domain ([`kvroute_core::fleet`]: workers,
//! loads, breakers, roles, ranks), with the router's own I/O over it — the health checks
//! ([`health`]), the engines' load polls ([`load_poller`]) and their Prometheus gauges
//! ([`gauges`]).

pub use kvroute_core::fleet::*;

pub mod gauges;
pub mod health;
pub mod load_poller;

pub use health::HealthConfig;
