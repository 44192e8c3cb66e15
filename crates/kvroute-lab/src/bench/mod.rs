//! `kvroute bench`: the real-time client that replays a workload against an OpenAI endpoint.
//!
//! kvroute's claim is lower latency under real traffic; this module measures it the way the
//! field does (TTFT, inter-token and end-to-end latency, errors, SLO attainment, goodput) on
//! the same workload for every policy. Workloads come from [`crate::workload`] and the
//! evidence goes to [`crate::report`], both shared with `sim`; what stays here is what only a
//! wall-clock run against real sockets needs.
//!
//! - [`plan`]: request bodies serialized before the run.
//! - [`replay`]: the open-loop client; [`stream`]: reading a streamed response.
//! - [`models`]: the model to send when none is given (the target's first `/v1/models` entry).
//! - [`cli`]: `kvroute bench` and `kvroute bench compare`.

pub mod cli;
pub mod models;
pub mod plan;
pub mod replay;
pub mod stream;

pub use cli::{BenchArgs, BenchCli, BenchCommand, CompareArgs, run};
