//! What a proxied response's milestones tell the router: load release, metrics, calibration,
//! and the access log line.

use std::time::{Duration, Instant};

use std::sync::Arc;

use super::access_log::AccessLine;
use super::admission::{Reservation, Ticket};
use super::affinity::ResponseAffinity;
use super::api::Api;
use super::slo::Hints;
use super::trail::Trail;
use crate::metrics::Metrics;
use crate::proxy::output_tokens::OutputTokens;
use crate::proxy::stream_events::StreamEvents;
use crate::proxy::usage::UsageScan;
use crate::proxy::{End, ResponseObserver};
use crate::routing::Attempt;
use crate::telemetry::TARGET as TRACE;

/// Who asked, for the access log.
pub(super) struct Requester {
    /// The request id.
    pub(super) id: String,
    /// The tenant, if any.
    pub(super) tenant: Option<String>,
    /// The requested model (`-` when the request named none).
    pub(super) model: String,
    /// The kind of endpoint.
    pub(super) api: Api,
}

/// What a response teaches the router about stored Responses API responses.
pub(super) struct Affinity {
    /// The map of who stores what.
    pub(super) map: Arc<ResponseAffinity>,
    /// The tenant whose responses these are.
    pub(super) tenant: Option<String>,
    /// Learn the id the response reports, or forget this id once it is deleted.
    pub(super) action: AffinityAction,
}

/// See [`Affinity`].
pub(super) enum AffinityAction {
    /// The response creates a stored response: remember its worker.
    Learn,
    /// The response deletes stored response `0`: forget it when it succeeds.
    Forget(String),
}

/// Records a proxied response's first token and end in load accounting, metrics, the policy's
/// calibration and the access log.
pub(super) struct Observer {
    attempt: Attempt,
    metrics: Arc<Metrics>,
    /// The admission slot, held until the response ends.
    _ticket: Ticket,
    /// The model as metrics label it (`-` for one no worker is known to serve).
    model: String,
    status: http::StatusCode,
    started: Instant,
    requester: Requester,
    ttft: Option<Duration>,
    /// What follows the response's end (trace line, load-only hit counts).
    trail: Trail,
    /// The output tokens counted, when a trace is recorded.
    output: Option<OutputTokens>,
    affinity: Option<Affinity>,
    /// From the response head to the first token (closed when it arrives).
    first_token_span: Option<tracing::Span>,
    /// From the response head to the end of the body.
    stream_span: tracing::Span,
    /// The request's own span, which ends with the body.
    request_span: tracing::Span,
    /// The prefill worker of a disaggregated request (the attempt is its decode).
    prefill: Option<Arc<crate::fleet::Worker>>,
    /// The engine's reported usage, read as the body passes.
    usage: UsageScan,
    /// A stream's events, counted as it passes: its answer's length when the engine does not
    /// report usage.
    events: Option<StreamEvents>,
    /// The tokens reserved in the tenant's rate limit, settled at the end.
    reservation: Option<Reservation>,
    /// The request's latency targets, counted against what happens.
    slo: Hints,
    /// When the first token arrived, and the last chunk after it (inter-token latency).
    first_token_at: Option<Instant>,
    last_chunk_at: Option<Instant>,
    sse: bool,
}

impl Observer {
    pub(super) fn new(
        attempt: Attempt,
        metrics: Arc<Metrics>,
        ticket: Ticket,
        status: http::StatusCode,
        started: Instant,
        requester: Requester,
        model_label: String,
    ) -> Observer {
        Observer {
            attempt,
            metrics,
            _ticket: ticket,
            model: model_label,
            status,
            started,
            requester,
            ttft: None,
            trail: Trail::Off,
            output: None,
            affinity: None,
            first_token_span: Some(tracing::info_span!(target: TRACE, "first_token")),
            stream_span: tracing::info_span!(
                target: TRACE,
                "stream",
                end = tracing::field::Empty,
                bytes = tracing::field::Empty
            ),
            request_span: tracing::Span::current(),
            prefill: None,
            usage: UsageScan::new(),
            events: None,
            reservation: None,
            slo: Hints::default(),
            first_token_at: None,
            last_chunk_at: None,
            sse: false,
        }
    }

    /// Counts the request against its latency targets: the prediction now, the observed
    /// TTFT at the first token, the time per output token at the end.
    pub(super) fn with_slo(mut self, slo: Hints) -> Observer {
        if let (Some(target), Some(predicted)) =
            (slo.ttft_s, self.attempt.admitted.predicted_ttft_s)
        {
            let outcome = if predicted <= target {
                "predicted_met"
            } else {
                "predicted_missed"
            };
            self.metrics.slo.count("ttft", outcome);
            self.metrics.shaping.observe_ttft(predicted, target);
        }
        self.slo = slo;
        self
    }

    /// Settles `reservation` with the engine's reported usage at the end.
    pub(super) fn with_reservation(mut self, reservation: Option<Reservation>) -> Observer {
        self.reservation = reservation;
        self
    }

    /// Names the prefill worker of a disaggregated request in the access log.
    pub(super) fn with_prefill(mut self, prefill: Option<Arc<crate::fleet::Worker>>) -> Observer {
        self.prefill = prefill;
        self
    }

    /// Hands the request's `trail` its end; the output tokens of a response (a stream when
    /// `sse`) are counted if it records a trace.
    pub(super) fn with_trail(mut self, trail: Trail, sse: bool) -> Observer {
        self.sse = sse;
        self.events = sse.then(StreamEvents::new);
        self.output = trail.records().then(|| OutputTokens::new(sse));
        self.trail = trail;
        self
    }

    /// Also learns (or forgets) where a Responses API response is stored.
    pub(super) fn with_affinity(mut self, affinity: Option<Affinity>) -> Observer {
        self.affinity = affinity;
        self
    }
}

impl ResponseObserver for Observer {
    fn first_token(&mut self) {
        self.first_token_span = None;
        let elapsed = self.attempt.at.elapsed();
        self.attempt.admitted.first_token_after(elapsed);
        if self.status.is_success() && self.requester.api.generates() {
            let ttft = self.started.elapsed();
            self.ttft = Some(ttft);
            self.metrics
                .ttft
                .with_label_values(&[&self.model, self.attempt.worker.id()])
                .observe(ttft.as_secs_f64());
            let ttft_s = self.attempt.at.elapsed().as_secs_f64();
            if let Some(predicted) = self.attempt.admitted.predicted_ttft_s {
                self.metrics.prediction.observe(
                    &self.model,
                    self.attempt.worker.id(),
                    predicted,
                    ttft_s,
                );
            }
            self.attempt.admitted.observe_ttft(ttft_s);
            if let Some(target) = self.slo.ttft_s {
                let outcome = if ttft.as_secs_f64() <= target {
                    "met"
                } else {
                    "missed"
                };
                self.metrics.slo.count("ttft", outcome);
            }
            let now = Instant::now();
            self.first_token_at = Some(now);
            self.last_chunk_at = Some(now);
        }
    }

    fn data(&mut self, chunk: &[u8]) {
        if let Some(o) = self.output.as_mut() {
            o.feed(chunk);
        }
        self.usage.feed(chunk);
        if let Some(e) = self.events.as_mut() {
            e.feed(chunk);
        }
        if self.sse
            && let Some(last) = self.last_chunk_at
        {
            let now = Instant::now();
            // The chunk carrying the first token arrives just before `first_token`: the first
            // gap is measured from it, never to it.
            if now > last {
                self.metrics
                    .tokens
                    .itl
                    .with_label_values(&[&self.model, self.attempt.worker.id()])
                    .observe((now - last).as_secs_f64());
            }
            self.last_chunk_at = Some(now);
        }
    }

    fn end(&mut self, end: End, bytes: u64) {
        if end == End::Complete
            && self.status.is_success()
            && let Some(first) = self.first_token_at
        {
            // A stream without usage is counted by its events (`proxy::stream_events`).
            let written = self
                .usage
                .usage()
                .completion
                .or_else(|| self.events.as_ref().map(StreamEvents::count));
            self.attempt
                .admitted
                .observe_decode(first.elapsed().as_secs_f64(), written);
        }
        self.attempt.admitted.finish();
        if end == End::Complete && self.status.is_success() {
            self.account_tokens();
        }
        if let Some(r) = self.reservation.take() {
            // Without a reported usage the reservation stands (a stream whose client did not
            // ask for `include_usage`); a failed answer spent nothing.
            let spent = if self.status.is_success() {
                self.usage.usage().total()
            } else {
                Some(0)
            };
            r.settle(spent);
        }
        let output = self.output.as_ref().and_then(OutputTokens::count);
        self.trail.end(self.status.is_success(), output);
        let status = match end {
            End::Complete => self.status.as_str(),
            End::UpstreamError => "upstream_error",
            End::Cancelled => "cancelled",
            End::StreamError => "stream_error",
            End::Shutdown => "shutdown",
        };
        let endpoint = self.requester.api.label();
        self.metrics
            .requests
            .with_label_values(&[endpoint, &self.model, self.attempt.worker.id(), status])
            .inc();
        self.first_token_span = None;
        self.stream_span.record("end", status);
        self.stream_span.record("bytes", bytes);
        self.request_span.record("status", status);
        let duration = self.started.elapsed();
        self.metrics
            .request_duration
            .with_label_values(&[endpoint, &self.model])
            .observe(duration.as_secs_f64());
        if end == End::Complete
            && self.status.is_success()
            && let Some(Affinity {
                map,
                tenant,
                action: AffinityAction::Forget(id),
            }) = &self.affinity
        {
            map.forget(tenant.as_deref(), id);
        }
        let admitted = &self.attempt.admitted;
        AccessLine {
            id: &self.requester.id,
            endpoint,
            tenant: self.requester.tenant.as_deref(),
            model: Some(&self.requester.model),
            worker: Some(self.attempt.worker.id()),
            prefill_worker: self.prefill.as_ref().map(|w| w.id()),
            status,
            prompt_tokens: (admitted.prompt_tokens > 0).then_some(admitted.prompt_tokens),
            predicted_ttft_s: admitted.predicted_ttft_s,
            ttft: self.ttft,
            bytes,
            duration,
        }
        .write();
    }

    fn response_id(&mut self, id: String) {
        self.learn_response_id(id);
    }
}

impl Observer {
    /// A complete answer's reported usage: token counters, time per output token (and its
    /// target), and the cached tokens against the prediction.
    fn account_tokens(&self) {
        let usage = self.usage.usage();
        let worker = self.attempt.worker.id();
        let labels = [self.model.as_str(), worker];
        let t = &self.metrics.tokens;
        if let Some(n) = usage.prompt {
            t.prompt.with_label_values(&labels).inc_by(n);
        }
        if let Some(n) = usage.completion {
            t.completion.with_label_values(&labels).inc_by(n);
        }
        if let Some(n) = usage.cached {
            t.cached.with_label_values(&labels).inc_by(n);
        }
        if let (Some(first), Some(n)) = (self.first_token_at, usage.completion)
            && n > 1
        {
            let tpot = first.elapsed().as_secs_f64() / (n - 1) as f64;
            t.tpot.with_label_values(&labels).observe(tpot);
            if let Some(target) = self.slo.itl_s {
                let outcome = if tpot <= target { "met" } else { "missed" };
                self.metrics.slo.count("itl", outcome);
            }
        }
        // A disaggregated request's prompt was computed on its prefill worker, not here.
        if self.prefill.is_none()
            && let (Some(predicted), Some(reported)) =
                (self.attempt.admitted.predicted_cached_tokens, usage.cached)
        {
            self.metrics
                .cache_prediction
                .observe(worker, predicted, reported);
        }
    }

    fn learn_response_id(&mut self, id: String) {
        if !self.status.is_success() {
            return;
        }
        if let Some(Affinity {
            map,
            tenant,
            action: AffinityAction::Learn,
        }) = &self.affinity
        {
            map.learn(tenant.as_deref(), &id, &self.attempt.worker, Instant::now());
            self.metrics
                .response_affinity
                .requests
                .with_label_values(&["learned"])
                .inc();
        }
    }
}
