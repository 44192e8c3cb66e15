//! What the simulation remembers about each request.

/// One request's fate in a simulation; times in virtual seconds (`--records` writes one JSON
/// line of it per request).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SimRecord {
    /// Arrival time.
    pub arrival: f64,
    /// Worker slot it was routed to (in a disaggregated fleet: the decode worker, which
    /// streams the answer).
    pub worker: Option<u32>,
    /// Disaggregated fleet: the prefill worker.
    pub prefill_worker: Option<u32>,
    /// Disaggregated fleet: when the prefill finished (its blocks then wait to be pulled).
    pub prefill_end: Option<f64>,
    /// Disaggregated fleet: when the prompt's KV reached the decode worker.
    pub kv_ready: Option<f64>,
    /// Disaggregated fleet: prompt tokens whose KV the decode worker pulled.
    pub transferred_tokens: u32,
    /// Time of its first output token.
    pub first_token: Option<f64>,
    /// When it finished or failed.
    pub end: Option<f64>,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Output tokens requested.
    pub output_tokens: u32,
    /// Prompt tokens the engine found in its prefix cache at first scheduling (the prefill
    /// worker's, in a disaggregated fleet).
    pub cached_tokens: u32,
    /// Of `cached_tokens`, those loaded from the host-memory tier.
    pub loaded_tokens: u32,
    /// Leading prompt blocks the router believed the chosen worker held.
    pub predicted_blocks: u32,
    /// The most leading blocks any routable worker held when it was routed.
    pub warmest_blocks: u32,
    /// The time to first token the policy predicted on the chosen worker, if it predicts one.
    pub predicted_ttft: Option<f64>,
    /// The part of `predicted_ttft` spent waiting for room in the worker's KV cache
    /// (`policy::kv_room`), if the policy prices it.
    pub predicted_room_wait: Option<f64>,
    /// When its engine first scheduled it (in a disaggregated fleet, the decode engine):
    /// `first_scheduled − arrival` is what it waited in the engine's queue, room waits
    /// included.
    pub first_scheduled: Option<f64>,
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

    /// Mean time between two of its output tokens (a streamed answer's inter-token latency,
    /// also called time per output token), for a successful request with two or more: its
    /// tokens after the first arrive between its first token and its end.
    pub fn itl(&self) -> Option<f64> {
        let (Some(first), Some(end)) = (self.ttft().map(|t| t + self.arrival), self.end) else {
            return None;
        };
        (self.output_tokens > 1).then(|| (end - first) / f64::from(self.output_tokens - 1))
    }

    /// Observed minus predicted time to first token, where both are known.
    pub fn prediction_error(&self) -> Option<f64> {
        Some(self.ttft()? - self.predicted_ttft?)
    }

    /// Whether it succeeded within the targets (a missing target is always met).
    pub fn meets(&self, ttft_s: Option<f64>, e2e_s: Option<f64>) -> bool {
        let (Some(ttft), Some(e2e)) = (self.ttft(), self.e2e()) else {
            return false;
        };
        ttft_s.is_none_or(|t| ttft <= t) && e2e_s.is_none_or(|t| e2e <= t)
    }
}
