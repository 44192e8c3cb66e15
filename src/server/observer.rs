//! What a proxied response's milestones tell the router: load release, metrics, calibration,
//! and the access log line.

use std::time::{Duration, Instant};

use super::access_log::AccessLine;
use super::admission::Ticket;
use super::trail::Trail;
use crate::metrics::Metrics;
use crate::proxy::output_tokens::OutputTokens;
use crate::proxy::{End, ResponseObserver};
use crate::routing::Attempt;

/// Who asked, for the access log.
pub(super) struct Requester {
    /// The request id.
    pub(super) id: String,
    /// The tenant, if any.
    pub(super) tenant: Option<String>,
    /// The requested model.
    pub(super) model: String,
}

/// Records a proxied response's first token and end in load accounting, metrics, the policy's
/// calibration and the access log.
pub(super) struct Observer {
    attempt: Attempt,
    metrics: Metrics,
    /// The admission slot, held until the response ends.
    _ticket: Ticket,
    model: String,
    status: http::StatusCode,
    started: Instant,
    requester: Requester,
    ttft: Option<Duration>,
    /// What follows the response's end (trace line, load-only hit counts).
    trail: Trail,
    /// The output tokens counted, when a trace is recorded.
    output: Option<OutputTokens>,
}

impl Observer {
    pub(super) fn new(
        attempt: Attempt,
        metrics: Metrics,
        ticket: Ticket,
        status: http::StatusCode,
        started: Instant,
        requester: Requester,
    ) -> Observer {
        Observer {
            attempt,
            metrics,
            _ticket: ticket,
            model: requester.model.clone(),
            status,
            started,
            requester,
            ttft: None,
            trail: Trail::Off,
            output: None,
        }
    }

    /// Hands the request's `trail` its end; the output tokens of a response (a stream when
    /// `sse`) are counted if it records a trace.
    pub(super) fn with_trail(mut self, trail: Trail, sse: bool) -> Observer {
        self.output = trail.records().then(|| OutputTokens::new(sse));
        self.trail = trail;
        self
    }
}

impl ResponseObserver for Observer {
    fn first_token(&mut self) {
        self.attempt.admitted.first_token();
        if self.status.is_success() {
            let ttft = self.started.elapsed();
            self.ttft = Some(ttft);
            self.metrics
                .ttft
                .with_label_values(&[&self.model, self.attempt.worker.id()])
                .observe(ttft.as_secs_f64());
            let ttft_s = self.attempt.at.elapsed().as_secs_f64();
            self.attempt.admitted.observe_ttft(ttft_s);
        }
    }

    fn data(&mut self, chunk: &[u8]) {
        if let Some(o) = self.output.as_mut() {
            o.feed(chunk);
        }
    }

    fn end(&mut self, end: End, bytes: u64) {
        self.attempt.admitted.finish();
        let output = self.output.as_ref().and_then(OutputTokens::count);
        self.trail.end(self.status.is_success(), output);
        if end == End::UpstreamError {
            self.attempt.worker.record_failure(Instant::now());
        }
        let status = match end {
            End::Complete => self.status.as_str(),
            End::UpstreamError => "upstream_error",
            End::Cancelled => "cancelled",
            End::StreamError => "stream_error",
            End::Shutdown => "shutdown",
        };
        self.metrics
            .requests
            .with_label_values(&[&self.model, self.attempt.worker.id(), status])
            .inc();
        let duration = self.started.elapsed();
        self.metrics
            .request_duration
            .with_label_values(&[&self.model])
            .observe(duration.as_secs_f64());
        let admitted = &self.attempt.admitted;
        AccessLine {
            id: &self.requester.id,
            tenant: self.requester.tenant.as_deref(),
            model: Some(&self.requester.model),
            worker: Some(self.attempt.worker.id()),
            status,
            prompt_tokens: (admitted.prompt_tokens > 0).then_some(admitted.prompt_tokens),
            predicted_ttft_s: admitted.predicted_ttft_s,
            ttft: self.ttft,
            bytes,
            duration,
        }
        .write();
    }
}
