//! The access log: one line per request to an OpenAI or engine endpoint, under the tracing target
//! `kvroute::access` (filter it with `RUST_LOG=kvroute::access=info`; with `--log-format json`
//! each line is a JSON object). Client strings are shortened and written as quoted values,
//! so a request cannot forge log lines.

use std::time::Duration;

use crate::openai::{ECHO_MAX, shorten};

/// What the access log says about one request.
#[derive(Debug, Default)]
pub(super) struct AccessLine<'a> {
    /// The request id (see `request_id`).
    pub(super) id: &'a str,
    /// The kind of endpoint (`server::api`), `-` when not known.
    pub(super) endpoint: &'a str,
    /// The tenant, when keys are configured and the key was valid.
    pub(super) tenant: Option<&'a str>,
    /// The requested model, when the body named one.
    pub(super) model: Option<&'a str>,
    /// The worker that answered, when one did (a disaggregated request's decode worker).
    pub(super) worker: Option<&'a str>,
    /// A disaggregated request's prefill worker.
    pub(super) prefill_worker: Option<&'a str>,
    /// The final status: an HTTP status or an end such as `stream_error`.
    pub(super) status: &'a str,
    /// Prompt tokens (when the policy tokenized the prompt).
    pub(super) prompt_tokens: Option<u64>,
    /// The time to first token the policy predicted, in seconds.
    pub(super) predicted_ttft_s: Option<f64>,
    /// The time to first token observed (arrival to first token).
    pub(super) ttft: Option<Duration>,
    /// Response body bytes sent.
    pub(super) bytes: u64,
    /// Arrival to the end of the response.
    pub(super) duration: Duration,
}

impl AccessLine<'_> {
    /// Writes the line.
    pub(super) fn write(&self) {
        let model = self.model.map(|m| shorten(m, ECHO_MAX));
        tracing::info!(
            target: "kvroute::access",
            request_id = self.id,
            endpoint = self.endpoint,
            tenant = self.tenant,
            model = model.as_deref(),
            worker = self.worker,
            prefill_worker = self.prefill_worker,
            status = self.status,
            prompt_tokens = self.prompt_tokens,
            predicted_ttft_s = self.predicted_ttft_s,
            ttft_s = self.ttft.map(|d| d.as_secs_f64()),
            bytes = self.bytes,
            duration_s = self.duration.as_secs_f64(),
            "request"
        );
    }
}
