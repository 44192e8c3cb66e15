//! Service-level objectives: the targets attainment and goodput are measured against.

use serde::{Deserialize, Serialize};

/// Service targets; a missing one is always met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// Time-to-first-token target, seconds.
    pub ttft_s: Option<f64>,
    /// End-to-end latency target, seconds.
    pub e2e_s: Option<f64>,
}
