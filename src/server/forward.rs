//! `POST /v1/completions` and `/v1/chat/completions`: validate, route, forward, stream back.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};

use super::admission::Ticket;
use super::auth::{Caller, Keys};
use super::body::read_limited;
use super::{AppState, route};
use crate::fleet::Worker;
use crate::index::WorkerIdx;
use crate::metrics::Metrics;
use crate::openai::{ApiError, Endpoint, RequestView};
use crate::policy::{Observation, Policy};
use crate::proxy::{self, Attempt, BodyTimeouts, End, ObservedBody, ResponseObserver};

/// Header naming the worker that served a response.
pub const WORKER_HEADER: &str = "x-kvroute-worker";

pub(super) async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(state, Endpoint::Completions, headers, body).await
}

pub(super) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    handle(state, Endpoint::ChatCompletions, headers, body).await
}

async fn handle(
    state: Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let mut model = String::new();
    match forward(&state, endpoint, headers, body, started, &mut model).await {
        Ok(resp) => resp,
        Err(e) => {
            let label = if model.is_empty() {
                "-"
            } else {
                model.as_str()
            };
            state
                .metrics
                .requests
                .with_label_values(&[label, "-", e.status.as_str()])
                .inc();
            e.into_response()
        }
    }
}

async fn forward(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
    started: Instant,
    model_out: &mut String,
) -> Result<Response, ApiError> {
    let caller = state.keys.caller(&headers)?;
    let bytes = read_limited(
        &headers,
        body,
        state.max_body_bytes,
        state.body_read_timeout,
    )
    .await?;
    let mut json: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))?;
    let view = RequestView::parse(endpoint, &json)?;
    // A model name becomes a metric label only once a worker is known to serve it: client
    // strings must not grow the metrics without bound.
    if state.fleet.knows_model(&view.model) {
        model_out.clone_from(&view.model);
    }
    Keys::authorize_model(&caller, &view.model)?;
    let salt = caller.cache_salt(view.cache_salt.as_deref());
    // A tenant's request carries its namespaced salt to the engine (or none at all, where the
    // engine does not take it): a client-chosen salt is never passed on raw.
    let bytes =
        match (&caller, json.as_object_mut()) {
            (Caller::Tenant(_), Some(obj)) => {
                match (&salt, state.forwards_salt(&view.model)) {
                    (Some(s), true) => {
                        obj.insert("cache_salt".into(), serde_json::Value::String(s.clone()));
                    }
                    _ => {
                        obj.remove("cache_salt");
                    }
                }
                Bytes::from(serde_json::to_vec(&json).map_err(|e| {
                    ApiError::invalid(format!("cannot re-encode the body: {e}"), None)
                })?)
            }
            _ => bytes,
        };
    let ticket = state
        .admission
        .admit(caller.tenant(), &state.metrics)
        .await?;

    let eligible = state.fleet.eligible(&view.model);
    if eligible.is_empty() {
        return Err(if state.fleet.knows_model(&view.model) {
            no_worker()
        } else {
            ApiError::model_not_found(&view.model)
        });
    }

    let decision_started = Instant::now();
    let (analysis, view) = route::analyse(state, view, salt.as_deref()).await?;
    let mut first_pick = true;
    let mut routed: Option<Routed> = None;
    let metrics = &state.metrics;
    let pick = |tried: &[u32]| -> Option<Attempt> {
        let mut skip = tried.to_vec();
        let (worker, chosen) = loop {
            let (workers, candidates) = route::candidates(&eligible, &analysis, &skip);
            let decision = route::choose(state, &analysis, &candidates)?;
            let worker = workers[decision.chosen];
            // A half-open circuit lets one probe through; a worker whose probe is taken is
            // skipped for this request.
            if worker.breaker.acquire(Instant::now()) {
                break (Arc::clone(worker), candidates[decision.chosen].clone());
            }
            skip.push(worker.slot);
        };
        let chosen = &chosen;
        if first_pick {
            first_pick = false;
            metrics
                .decision
                .with_label_values(&[state.policy.name(), "total"])
                .observe(decision_started.elapsed().as_secs_f64());
        }
        let uncached = route::uncached_tokens(&analysis, chosen);
        if analysis.request.blocks > 0 {
            metrics
                .prefix_queried_blocks
                .with_label_values(&[worker.id()])
                .inc_by(u64::from(analysis.request.blocks));
            metrics
                .prefix_hit_blocks
                .with_label_values(&[worker.id()])
                .inc_by(u64::from(
                    chosen.overlap_blocks.min(analysis.request.blocks),
                ));
            if !state.has_feed(worker.slot) {
                state.holdings.approx.record_routed(
                    WorkerIdx(worker.slot),
                    &analysis.hashes,
                    state.now(),
                );
            }
        }
        routed = Some(Routed {
            uncached_tokens: uncached,
            queued_tokens: chosen.load.queued_prefill_tokens,
            decoding: chosen.load.decoding,
            at: Instant::now(),
        });
        let guard = worker.load.admit(analysis.request.prompt_tokens, uncached);
        Some(Attempt { worker, guard })
    };
    // The client's key is the router's credential, not the worker's: never pass it on.
    let mut headers = headers;
    if state.keys.enabled() {
        headers.remove(http::header::AUTHORIZATION);
    }
    let (attempt, upstream) = state
        .upstream
        .forward(endpoint.path(), &headers, bytes.clone(), metrics, pick)
        .await?;

    let (parts, incoming) = upstream.into_parts();
    let mut out_headers = proxy::headers::client_response_headers(&parts.headers);
    if let Ok(v) = HeaderValue::from_str(attempt.worker.id()) {
        out_headers.insert(WORKER_HEADER, v);
    }
    let sse = proxy::is_event_stream(&parts.headers);
    let observer = Observer {
        worker: Arc::clone(&attempt.worker),
        guard: attempt.guard,
        metrics: state.metrics.clone(),
        policy: Arc::clone(&state.policy),
        routed,
        _ticket: ticket,
        model: view.model,
        status: parts.status,
        started,
    };
    let timeouts = BodyTimeouts {
        idle: state.upstream.config().idle_timeout,
        total: state.upstream.config().total_timeout,
    };
    let mut resp = Response::new(Body::new(ObservedBody::new(
        incoming, sse, timeouts, observer,
    )));
    *resp.status_mut() = parts.status;
    *resp.headers_mut() = out_headers;
    Ok(resp)
}

fn no_worker() -> ApiError {
    ApiError::new(
        http::StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        Some("no_worker_available"),
        "no healthy worker is available for this model; retry later",
    )
}

/// What the router predicted when it sent the request, for calibration at first token.
#[derive(Clone, Copy, Debug)]
struct Routed {
    uncached_tokens: u64,
    queued_tokens: u64,
    decoding: u64,
    at: Instant,
}

/// Records a proxied response's milestones in load accounting, metrics and the policy's
/// calibration.
struct Observer {
    worker: Arc<Worker>,
    guard: crate::fleet::LoadGuard,
    metrics: Metrics,
    policy: Arc<dyn Policy>,
    routed: Option<Routed>,
    /// The admission slot, held until the response ends.
    _ticket: Ticket,
    model: String,
    status: http::StatusCode,
    started: Instant,
}

impl ResponseObserver for Observer {
    fn first_token(&mut self) {
        self.guard.first_token();
        if self.status.is_success() {
            self.metrics
                .ttft
                .with_label_values(&[&self.model, self.worker.id()])
                .observe(self.started.elapsed().as_secs_f64());
            if let Some(r) = self.routed.take() {
                self.policy.observe(&Observation {
                    slot: self.worker.slot,
                    uncached_tokens: r.uncached_tokens,
                    queued_tokens: r.queued_tokens,
                    decoding: r.decoding,
                    ttft_s: r.at.elapsed().as_secs_f64(),
                });
            }
        }
    }

    fn end(&mut self, end: End) {
        self.guard.finish();
        if end == End::UpstreamError {
            self.worker.breaker.record_failure(Instant::now());
        }
        let status = match end {
            End::Complete => self.status.as_str().to_owned(),
            End::UpstreamError => "upstream_error".to_owned(),
            End::Cancelled => "cancelled".to_owned(),
        };
        self.metrics
            .requests
            .with_label_values(&[&self.model, self.worker.id(), &status])
            .inc();
        self.metrics
            .request_duration
            .with_label_values(&[&self.model])
            .observe(self.started.elapsed().as_secs_f64());
    }
}
