//! Service-level objectives: the targets attainment and goodput are measured against, and the
//! flags that set them (one group, flattened into `kvroute bench` and `kvroute simulate`, so a
//! simulated and a measured run are judged by the same targets under the same names).

use clap::Args;
use serde::{Deserialize, Serialize};

/// Service targets; a missing one is always met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// Time-to-first-token target, seconds.
    pub ttft_s: Option<f64>,
    /// End-to-end latency target, seconds.
    pub e2e_s: Option<f64>,
}

/// The SLO flags.
#[derive(Args, Clone, Copy, Debug, Default, PartialEq)]
pub struct SloArgs {
    /// TTFT target in seconds, for attainment and goodput.
    #[arg(long, value_name = "SECONDS")]
    pub slo_ttft: Option<f64>,
    /// End-to-end latency target in seconds.
    #[arg(long, value_name = "SECONDS")]
    pub slo_e2e: Option<f64>,
}

impl SloArgs {
    /// The targets these flags set.
    pub fn slo(&self) -> Slo {
        Slo {
            ttft_s: self.slo_ttft,
            e2e_s: self.slo_e2e,
        }
    }
}
