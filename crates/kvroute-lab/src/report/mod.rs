//! Evidence from a run: per-request records, latency statistics, SLO attainment, result files
//! and charts, shared by the real-time client (`bench`) and the virtual-time simulator (`sim`).
//!
//! Both fill the same [`RequestRecord`], so one statistics and plotting code serves both and
//! a simulated run reads exactly like a measured one.
//!
//! - [`record`]: what was observed for one request.
//! - [`stats`]: latency distributions (exact percentiles).
//! - [`slo`]: service targets.
//! - [`summary`]: a run's summary, its result file and side-by-side comparisons.
//! - [`plot`]: SVG charts (TTFT CDFs, load over time).

pub mod plot;
pub mod record;
pub mod slo;
pub mod stats;
pub mod summary;

pub use record::{Outcome, RequestRecord};
pub use slo::{Slo, SloArgs};
pub use stats::Stats;
pub use summary::{ClientOverhead, ReportError, RunResult, Summary, compare};
