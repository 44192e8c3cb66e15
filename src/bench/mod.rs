//! Evidence for routing decisions: workloads, a real-time replay client and reports.
//!
//! kvroute's claim is lower latency under real traffic; this module measures it the way the
//! field does (TTFT, inter-token and end-to-end latency, errors, SLO attainment, goodput) on
//! the same workload for every policy.
//!
//! - [`trace`]: the workload type and the Mooncake JSONL reader, with transforms.
//! - [`synthetic`]: seeded generators of workloads with a known shape.
//! - [`synthesis`]: block ids → deterministic token ids (the prompt content).
//! - [`plan`]: request bodies serialized before the run.
//! - [`replay`]: the open-loop client; [`stream`]: reading a streamed response.
//! - [`record`], [`report`], [`plot`]: measurements, summaries and charts, shared with `sim`.
//! - [`cli`]: `kvroute bench` and `kvroute bench compare`.

pub mod cli;
pub mod plan;
pub mod plot;
pub mod record;
pub mod replay;
pub mod report;
pub mod stream;
pub mod synthesis;
pub mod synthetic;
pub mod trace;

pub use cli::{BenchArgs, BenchCli, BenchCommand, CompareArgs, run};
pub use record::{Outcome, RequestRecord};
pub use report::{RunResult, Slo, Stats, Summary, compare};
pub use trace::{Trace, TraceError, TraceRequest};
