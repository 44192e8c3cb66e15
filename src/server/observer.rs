//! What a proxied response's milestones tell the router: load release, metrics, calibration.

use std::time::Instant;

use super::admission::Ticket;
use crate::metrics::Metrics;
use crate::proxy::{End, ResponseObserver};
use crate::routing::Attempt;

/// Records a proxied response's first token and end in load accounting, metrics and the
/// policy's calibration.
pub(super) struct Observer {
    attempt: Attempt,
    metrics: Metrics,
    /// The admission slot, held until the response ends.
    _ticket: Ticket,
    model: String,
    status: http::StatusCode,
    started: Instant,
}

impl Observer {
    pub(super) fn new(
        attempt: Attempt,
        metrics: Metrics,
        ticket: Ticket,
        model: String,
        status: http::StatusCode,
        started: Instant,
    ) -> Observer {
        Observer {
            attempt,
            metrics,
            _ticket: ticket,
            model,
            status,
            started,
        }
    }
}

impl ResponseObserver for Observer {
    fn first_token(&mut self) {
        self.attempt.admitted.first_token();
        if self.status.is_success() {
            self.metrics
                .ttft
                .with_label_values(&[&self.model, self.attempt.worker.id()])
                .observe(self.started.elapsed().as_secs_f64());
            let ttft_s = self.attempt.at.elapsed().as_secs_f64();
            self.attempt.admitted.observe_ttft(ttft_s);
        }
    }

    fn end(&mut self, end: End) {
        self.attempt.admitted.finish();
        if end == End::UpstreamError {
            self.attempt.worker.record_failure(Instant::now());
        }
        let status = match end {
            End::Complete => self.status.as_str().to_owned(),
            End::UpstreamError => "upstream_error".to_owned(),
            End::Cancelled => "cancelled".to_owned(),
        };
        self.metrics
            .requests
            .with_label_values(&[&self.model, self.attempt.worker.id(), &status])
            .inc();
        self.metrics
            .request_duration
            .with_label_values(&[&self.model])
            .observe(self.started.elapsed().as_secs_f64());
    }
}
