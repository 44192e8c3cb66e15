//! `kvroute simulate --capacity`'s flags and their validation (the search itself is
//! `sim::search`, the probes `sim::capacity`).

use anyhow::bail;
use clap::Args;

use super::capacity::CapacitySpec;

/// `kvroute simulate --capacity`: how much traffic a fleet carries at the SLO, and how many
/// workers a trace needs (see `sim::capacity`).
#[derive(Args, Clone, Copy, Debug, PartialEq)]
pub struct CapacityArgs {
    /// Search each policy's capacity at the SLO instead of simulating once: the highest
    /// arrival-rate multiplier (as --trace-speedup, times any given) at which
    /// --capacity-attainment of requests meet --slo-ttft/--slo-e2e on --workers workers, and
    /// the fewest workers that meet it at the trace's own rate. Prints a table; with --out,
    /// writes capacity.md, capacity.json and capacity.svg (attainment vs multiplier).
    #[arg(
        long,
        conflicts_with_all = ["scenario", "prefill_workers", "join_at", "restart_at", "records"]
    )]
    pub capacity: bool,
    /// With --capacity: the fraction of requests that must meet the SLO.
    #[arg(
        long,
        default_value_t = 0.9,
        value_name = "FRACTION",
        requires = "capacity"
    )]
    pub capacity_attainment: f64,
    /// With --capacity: the rate search stops when its passing and failing multipliers are
    /// this close, relative (0.02 = 2 %).
    #[arg(
        long,
        default_value_t = 0.02,
        value_name = "FRACTION",
        requires = "capacity"
    )]
    pub capacity_precision: f64,
    /// With --capacity: the highest multiplier probed (and 1/X the lowest).
    #[arg(
        long,
        default_value_t = 1024.0,
        value_name = "X",
        requires = "capacity"
    )]
    pub capacity_max_multiplier: f64,
    /// With --capacity: the most workers probed.
    #[arg(long, default_value_t = 256, value_name = "N", requires = "capacity")]
    pub capacity_max_workers: u32,
}

impl CapacityArgs {
    /// The search targets of these flags (validated).
    pub fn spec(&self) -> anyhow::Result<CapacitySpec> {
        let a = self.capacity_attainment;
        if !(a > 0.0 && a <= 1.0) {
            bail!("--capacity-attainment must be a fraction in (0, 1], not {a}");
        }
        let p = self.capacity_precision;
        if !(p.is_finite() && p > 0.0) {
            bail!("--capacity-precision must be a positive fraction, not {p}");
        }
        let m = self.capacity_max_multiplier;
        if !(m.is_finite() && m >= 1.0) {
            bail!("--capacity-max-multiplier must be at least 1, not {m}");
        }
        if self.capacity_max_workers == 0 {
            bail!("--capacity-max-workers must be at least 1");
        }
        Ok(CapacitySpec {
            attainment: a,
            precision: p,
            max_multiplier: m,
            max_workers: self.capacity_max_workers,
        })
    }
}
