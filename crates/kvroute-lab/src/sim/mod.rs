//! Virtual-time simulation: N engine models behind the live router's own policies and index,
//! no sockets, no wall clock.
//!
//! A real fleet is expensive and noisy; a simulation answers "which policy would have served
//! this trace best" in seconds and gives the same answer every time. It is only worth that if
//! it decides exactly as the router does, so it reuses the router's parts rather than models
//! of them: `engine::EngineCore` (the scheduler and paged KV cache the `kvroute engine` serves
//! with), `policy` (the very `Policy` implementations), `index::Holdings` fed by the engines'
//! own KV events or by routed-block predictions, and `fleet::Load` accounting released at the
//! first token and at the end ([`router`] mirrors `server::route` and `server::forward`).
//!
//! - [`simulation`]: the discrete-event loop for one policy; [`queue`]: its event queue.
//! - [`oracle`]: the lower bound every policy is compared with; [`pooled`]: the oracle with the
//!   fleet's finite cache, which shows how much of the rest is capacity rather than routing.
//! - [`config`], [`args`], [`scenario`]: what to simulate, from code, flags or the suite.
//! - [`record`], [`results`], [`output`]: per-request records, per-policy numbers, files.
//! - [`pd_compare`]: a disaggregated fleet against an aggregated one of the same size.
//! - [`capacity`], [`search`]: capacity at an SLO (the highest arrival rate a fleet carries,
//!   the fewest workers a trace needs), by bracketing searches over whole simulations.
//! - [`replica_sync`]: router replicas sharing their bookings over a bus (`--replica-sync-ms`).
//! - [`cli`]: `kvroute simulate`.

pub mod args;
pub mod capacity;
pub mod capacity_args;
pub mod cli;
pub mod config;
pub mod oracle;
pub mod output;
pub mod pd_compare;
pub mod pooled;
pub mod queue;
pub mod record;
#[cfg(test)]
mod reference_tests;
pub mod replica_sync;
pub mod results;
pub mod router;
pub mod scenario;
pub mod search;
pub mod simulation;
pub mod tier_args;
pub mod unqueued;

pub use args::{IndexChoice, SimulateArgs};
pub use capacity::{Capacity, CapacitySpec, PolicyCapacity};
pub use capacity_args::CapacityArgs;
pub use cli::run;
pub use config::{FleetChange, IndexMode, PdSplit, SimConfig, dynamo_mocker_engine};
pub use oracle::oracle;
pub use pooled::pooled_cache;
pub use record::SimRecord;
pub use results::{PolicyResult, Results};
pub use scenario::Scenario;
pub use simulation::{PolicyRun, SimError, Simulation};
