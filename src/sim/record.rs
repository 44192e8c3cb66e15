//! What the simulation remembers about each request.

/// One request's fate in a simulation; times in virtual seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimRecord {
    /// Arrival time.
    pub arrival: f64,
    /// Worker slot it was routed to.
    pub worker: Option<u32>,
    /// Time of its first output token.
    pub first_token: Option<f64>,
    /// When it finished or failed.
    pub end: Option<f64>,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens requested.
    pub output_tokens: u32,
    /// Prompt tokens the engine found in its prefix cache at first scheduling.
    pub cached_tokens: u32,
    /// Leading prompt blocks the router believed the chosen worker held.
    pub predicted_blocks: u32,
    /// Full prompt blocks, as the router counted them (0 for load-only policies).
    pub blocks: u32,
    /// Times the engine preempted it.
    pub preemptions: u32,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

impl SimRecord {
    /// Time to first token of a successful request.
    pub fn ttft(&self) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        self.first_token.map(|t| t - self.arrival)
    }

    /// End-to-end latency of a successful request.
    pub fn e2e(&self) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        self.end.map(|t| t - self.arrival)
    }

    /// Whether it succeeded within the targets (a missing target is always met).
    pub fn meets(&self, ttft_s: Option<f64>, e2e_s: Option<f64>) -> bool {
        let (Some(ttft), Some(e2e)) = (self.ttft(), self.e2e()) else {
            return false;
        };
        ttft_s.is_none_or(|t| ttft <= t) && e2e_s.is_none_or(|t| e2e <= t)
    }
}
