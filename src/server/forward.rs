//! `POST /v1/completions` and `/v1/chat/completions`: validate, route, forward, stream back.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use http_body::Body as _;
use tracing::{Instrument, field};

use super::access_log::AccessLine;
use super::admission::{BodyClaim, Ticket};
use super::auth::{Caller, Keys};
use super::observer::{Observer, Requester};
use super::{AppState, body, cache_salt, request_id, route};
use crate::fleet::Worker;
use crate::openai::{ApiError, Endpoint, RequestView};
use crate::proxy::{self, BodyTimeouts, ObservedBody};
use crate::routing::Session;
use crate::telemetry::{self, TARGET as TRACE};

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

/// An admitted request's body as received and as routing reads it.
struct Received {
    endpoint: Endpoint,
    bytes: Bytes,
    view: RequestView,
    /// The request's slot, held until its response ends.
    ticket: Ticket,
    /// The body's share of the router's body budget, held until the request is routed.
    claim: BodyClaim,
}

/// Handles the request inside its `request` span (a child of the client's `traceparent`, when
/// tracing is on); the span ends with the response's last byte.
async fn handle(
    state: Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let span = tracing::info_span!(
        target: TRACE,
        "request",
        otel.kind = "server",
        request_id = request_id::of(&headers),
        endpoint = endpoint.path(),
        tenant = field::Empty,
        model = field::Empty,
        worker = field::Empty,
        status = field::Empty,
    );
    telemetry::continue_trace(&span, &headers);
    respond(state, endpoint, headers, body)
        .instrument(span)
        .await
}

async fn respond(
    state: Arc<AppState>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let id = request_id::of(&headers).to_owned();
    let (caller, received) = match receive(&state, endpoint, &headers, body).await {
        Ok(r) => r,
        Err(e) => return reject(&state, "-", e, Rejected::new(&id, None, None, started)),
    };
    // A model name becomes a metric label only once a worker is known to serve it: client
    // strings must not grow the metrics without bound.
    let label = if state.fleet.knows_model(&received.view.model) {
        received.view.model.clone()
    } else {
        "-".to_owned()
    };
    let tenant = caller.tenant().map(str::to_owned);
    let model = received.view.model.clone();
    match forward(&state, caller, received, headers, started).await {
        Ok(resp) => resp,
        Err(e) => {
            let who = Rejected::new(&id, tenant.as_deref(), Some(&model), started);
            reject(&state, &label, e, who)
        }
    }
}

/// Who a rejected request came from, for the access log.
struct Rejected<'a> {
    id: &'a str,
    tenant: Option<&'a str>,
    model: Option<&'a str>,
    started: Instant,
}

impl<'a> Rejected<'a> {
    fn new(id: &'a str, tenant: Option<&'a str>, model: Option<&'a str>, started: Instant) -> Self {
        Rejected {
            id,
            tenant,
            model,
            started,
        }
    }
}

/// Counts and logs a request answered with an error by the router itself.
fn reject(state: &AppState, model_label: &str, e: ApiError, who: Rejected<'_>) -> Response {
    state
        .metrics
        .requests
        .with_label_values(&[model_label, "-", e.status.as_str()])
        .inc();
    let resp = e.into_response();
    tracing::Span::current().record("status", resp.status().as_u16());
    AccessLine {
        id: who.id,
        tenant: who.tenant,
        model: who.model,
        status: resp.status().as_str(),
        bytes: resp.body().size_hint().exact().unwrap_or(0),
        duration: who.started.elapsed(),
        ..AccessLine::default()
    }
    .write();
    resp
}

/// Authenticates the caller, admits the request, then reads and validates the body. Admission
/// comes first (the tenant is known from the key): a request over its tenant's or the router's
/// limit is refused before its body costs anything, and the body's bytes are claimed from the
/// router's budget as they arrive. Large bodies are read into their view off the async threads.
async fn receive(
    state: &AppState,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Caller, Received), ApiError> {
    let caller = state.keys.caller(headers)?;
    let ticket = state
        .admission
        .admit(caller.tenant(), &state.metrics)
        .await?;
    let mut claim = state.admission.bodies().claim();
    let limits = state.body_limits();
    let bytes = body::read_claimed(
        headers,
        body,
        limits.max_bytes,
        limits.read_timeout,
        &mut claim,
        &state.metrics,
    )
    .instrument(tracing::info_span!(target: TRACE, "body_read"))
    .await?;
    let view = body::view(endpoint, &bytes).await?;
    let received = Received {
        endpoint,
        bytes,
        view,
        ticket,
        claim,
    };
    Ok((caller, received))
}

/// Admits, routes and forwards a received request; the response streams back observed.
async fn forward(
    state: &Arc<AppState>,
    caller: Caller,
    received: Received,
    headers: HeaderMap,
    started: Instant,
) -> Result<Response, ApiError> {
    let Received {
        endpoint,
        bytes,
        view,
        ticket,
        claim,
    } = received;
    let span = tracing::Span::current();
    span.record("model", view.model.as_str());
    if let Some(tenant) = caller.tenant() {
        span.record("tenant", tenant);
    }
    Keys::authorize_model(&caller, &view.model)?;
    let salt = caller.cache_salt(view.cache_salt.as_deref());
    let eligible = eligible(state, &view.model)?;
    let decision_started = Instant::now();
    let (analysis, view) = route::analyse(state, view, salt.as_deref(), bytes.len()).await?;
    // The salted copy of the body is made only now that the prompt's token ids are gone (the
    // analysis keeps block hashes), so a large body never has the original, its ids and the
    // copy alive at once: peak memory stays near twice the body, not three times.
    let bytes = tenant_body(state, &caller, salt.as_deref(), &view.model, bytes)?;
    drop(claim);
    let clock = || state.now();
    let mut session = Session::new(
        &state.decider,
        &state.metrics,
        eligible,
        analysis,
        &clock,
        decision_started,
    );
    let headers = upstream_headers(state, headers);
    let (attempt, upstream) = state
        .upstream
        .forward(
            endpoint.path(),
            &headers,
            bytes,
            &state.metrics,
            &mut session,
        )
        .await?;
    span.record("worker", attempt.worker.id());
    let (parts, incoming) = upstream.into_parts();
    let mut out_headers = proxy::headers::client_response_headers(&parts.headers);
    if let Ok(v) = HeaderValue::from_str(attempt.worker.id()) {
        out_headers.insert(WORKER_HEADER, v);
    }
    let sse = proxy::is_event_stream(&parts.headers);
    let requester = Requester {
        id: request_id::of(&headers).to_owned(),
        tenant: caller.tenant().map(str::to_owned),
        model: view.model,
    };
    let observer = Observer::new(
        attempt,
        state.metrics.clone(),
        ticket,
        parts.status,
        started,
        requester,
    );
    let timeouts = BodyTimeouts {
        idle: state.upstream.config().idle_timeout,
        total: state.upstream.config().total_timeout,
    };
    let body = ObservedBody::new(incoming, sse, timeouts, observer).cut_on(state.cutoff.clone());
    let mut resp = Response::new(Body::new(body));
    *resp.status_mut() = parts.status;
    *resp.headers_mut() = out_headers;
    Ok(resp)
}

/// The body to send: a tenant's request carries its namespaced salt to the engine (or none at
/// all, where the engine does not take it); a client-chosen salt is never passed on raw. The
/// salt is written into the bytes as sent ([`cache_salt`]): nothing else is re-encoded.
fn tenant_body(
    state: &AppState,
    caller: &Caller,
    salt: Option<&str>,
    model: &str,
    bytes: Bytes,
) -> Result<Bytes, ApiError> {
    if !matches!(caller, Caller::Tenant(_)) {
        return Ok(bytes);
    }
    let salt = salt.filter(|_| state.forwards_salt(model));
    cache_salt::with_cache_salt(&bytes, salt)
        .map_err(|e| ApiError::invalid(format!("cannot set the cache salt: {e}"), None))
}

/// The workers that may take a request for `model` now: 404 for a model no worker serves,
/// 503 when every worker that serves it is down, draining or open-circuited.
fn eligible(state: &AppState, model: &str) -> Result<Vec<Arc<Worker>>, ApiError> {
    let eligible = state.fleet.eligible(model);
    if !eligible.is_empty() {
        return Ok(eligible);
    }
    Err(if state.fleet.knows_model(model) {
        no_worker()
    } else {
        ApiError::model_not_found(model)
    })
}

/// The client's key is the router's credential, not the worker's: never pass it on.
fn upstream_headers(state: &AppState, mut headers: HeaderMap) -> HeaderMap {
    if state.keys.enabled() {
        headers.remove(http::header::AUTHORIZATION);
    }
    headers
}

fn no_worker() -> ApiError {
    ApiError::new(
        http::StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        Some("no_worker_available"),
        "no healthy worker is available for this model; retry later",
    )
}
