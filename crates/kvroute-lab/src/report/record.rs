//! What was observed for one request: the unit every report is computed from.
//!
//! The real-time client fills these from the wire; the virtual-time simulation fills the same
//! type from its model, so one report and one plot code serve both.

use serde::{Deserialize, Serialize};

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// A 2xx response streamed to its end.
    Ok,
    /// The server answered with a non-2xx status.
    Http {
        /// The status code.
        status: u16,
    },
    /// No connection could be made, or the request could not be written.
    Connect,
    /// The request did not finish within the client's timeout.
    Timeout,
    /// The response started but broke off (reset, malformed body).
    Stream,
}

impl Outcome {
    /// Whether the request succeeded.
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok)
    }

    /// A short stable label, for tables and counts: `ok`, `http_500`, `connect`, ….
    pub fn label(&self) -> String {
        match self {
            Outcome::Ok => "ok".to_string(),
            Outcome::Http { status } => format!("http_{status}"),
            Outcome::Connect => "connect".to_string(),
            Outcome::Timeout => "timeout".to_string(),
            Outcome::Stream => "stream".to_string(),
        }
    }
}

/// One request's measurements. Times are seconds; offsets are from the start of the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Position of the request in the trace.
    pub index: usize,
    /// When the trace says the request should start.
    pub scheduled_s: f64,
    /// When it was actually sent (later than `scheduled_s` if the client fell behind).
    pub start_s: f64,
    /// Time from sending to the first generated token, if one arrived.
    pub ttft_s: Option<f64>,
    /// Time from sending to the end of the response (or to the failure).
    pub e2e_s: f64,
    /// Mean time between consecutive token events after the first (time per output token).
    pub itl_mean_s: Option<f64>,
    /// 99th percentile of this request's gaps between token events.
    pub itl_p99_s: Option<f64>,
    /// How the request ended.
    pub outcome: Outcome,
    /// A short error message when the request failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Prompt tokens sent.
    pub prompt_tokens: u32,
    /// Tokens generated: `usage.completion_tokens` when reported, else token events counted.
    pub completion_tokens: u32,
    /// `usage.prompt_tokens_details.cached_tokens` when the server reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
    /// The replica that served it (`x-kvroute-worker`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
}

impl RequestRecord {
    /// When the response ended, as an offset from the start of the run.
    pub fn end_s(&self) -> f64 {
        self.start_s + self.e2e_s
    }

    /// Whether the request succeeded and met both targets (a missing target is met).
    pub fn meets(&self, slo_ttft_s: Option<f64>, slo_e2e_s: Option<f64>) -> bool {
        if !self.outcome.is_ok() {
            return false;
        }
        let ttft_ok = match (slo_ttft_s, self.ttft_s) {
            (None, _) => true,
            (Some(limit), Some(t)) => t <= limit,
            (Some(_), None) => false,
        };
        let e2e_ok = slo_e2e_s.is_none_or(|limit| self.e2e_s <= limit);
        ttft_ok && e2e_ok
    }
}
