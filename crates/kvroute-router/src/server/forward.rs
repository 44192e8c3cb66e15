//! The path every forwarded request takes: authenticate, admit, read the body, let its endpoint
//! read it ([`Read`]), route — on the prompt's KV prefix, on load alone, or to the one worker
//! that stores a response — forward with retries, and stream the answer back observed.
//!
//! `POST /v1/completions` and `/v1/chat/completions` are here; the other endpoints' handlers
//! (`endpoints`) call [`handle`] with their own [`Read`], which `read` dispatches to the
//! endpoint's own reader (`responses`, `tokenize`, `read`).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method};
use http_body::Body as _;
use tracing::{Instrument, field};

use super::access_log::AccessLine;
use super::admission::{BodyClaim, Ticket};
use super::api::Api;
use super::auth::Caller;
use super::call::{Call, Prepared, Read, Step};
use super::decide::{self, Decided};
use super::observer::{Affinity, Observer, Requester};
use super::trail::Trail;
use super::{AppState, body, cache_salt, request_id};
use crate::fleet::Worker;
use crate::openai::{ApiError, Endpoint};
use crate::proxy::dispatch::{Dispatched, Dispatcher, Route};
use crate::proxy::handoff::{self, Protocol};
use crate::proxy::{self, BodyTimeouts, ObservedBody};
use crate::routing::{Attempt, Plan};
use crate::telemetry::{self, TARGET as TRACE};

/// Header naming the worker that served a response.
pub const WORKER_HEADER: &str = "x-kvroute-worker";
/// Response header of a disaggregated request: the worker that computed its prompt (the
/// decode worker is [`WORKER_HEADER`]).
pub const PREFILL_WORKER_HEADER: &str = "x-kvroute-prefill-worker";
/// Response header: the data-parallel rank of the worker that served the request (absent for
/// a worker without data parallelism).
pub const RANK_HEADER: &str = "x-kvroute-data-parallel-rank";

pub(super) async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let call = Call::post(Api::Completions, Endpoint::Completions.path(), headers);
    handle(state, call, body, Read::Generation(Endpoint::Completions)).await
}

pub(super) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let call = Call::post(Api::Chat, Endpoint::ChatCompletions.path(), headers);
    handle(
        state,
        call,
        body,
        Read::Generation(Endpoint::ChatCompletions),
    )
    .await
}

/// An admitted request's body as received.
pub(super) struct Received {
    pub(super) bytes: Bytes,
    /// The request's slot, held until its response ends.
    pub(super) ticket: Ticket,
    /// The body's share of the router's body budget, held until the request is routed.
    pub(super) claim: BodyClaim,
}

/// Receives, reads, routes and forwards one request; every error is answered in OpenAI's shape
/// and counted.
///
/// The request runs inside its `request` span (a child of the client's `traceparent`, when
/// tracing is on); the span ends with the response's last byte.
pub(super) async fn handle(state: Arc<AppState>, call: Call, body: Body, read: Read) -> Response {
    let span = tracing::info_span!(
        target: TRACE,
        "request",
        otel.kind = "server",
        request_id = request_id::of(&call.headers),
        endpoint = call.api.label(),
        path = call.target.as_str(),
        tenant = field::Empty,
        model = field::Empty,
        worker = field::Empty,
        status = field::Empty,
    );
    telemetry::continue_trace(&span, &call.headers);
    process(state, call, body, read).instrument(span).await
}

async fn process(state: Arc<AppState>, call: Call, body: Body, read: Read) -> Response {
    let started = Instant::now();
    let id = request_id::of(&call.headers).to_owned();
    let api = call.api;
    let (caller, received) = match receive(&state, &call.headers, body).await {
        Ok(r) => r,
        Err(e) => return reject(&state, e, Rejected::new(&id, api, None, None, started)),
    };
    let tenant = caller.tenant().map(str::to_owned);
    let step = match super::read::prepare(&state, &caller, &call, &received.bytes, read).await {
        Ok(step) => step,
        Err(e) => {
            let who = Rejected::new(&id, api, tenant.as_deref(), None, started);
            return reject(&state, e, who);
        }
    };
    let prepared = match step {
        Step::Forward(p) => p,
        Step::Answer(resp, model) => {
            let who = Rejected::new(&id, api, tenant.as_deref(), Some(&model), started);
            return answered(&state, resp, who);
        }
    };
    let model = prepared.model.clone();
    match forward(&state, caller, call, prepared, received, started).await {
        Ok(resp) => resp,
        Err(e) => {
            let who = Rejected::new(&id, api, tenant.as_deref(), model.as_deref(), started);
            reject(&state, e, who)
        }
    }
}

/// Who a request came from, for the metrics and the access log of an answer the router gave.
struct Rejected<'a> {
    id: &'a str,
    api: Api,
    tenant: Option<&'a str>,
    model: Option<&'a str>,
    started: Instant,
}

impl<'a> Rejected<'a> {
    fn new(
        id: &'a str,
        api: Api,
        tenant: Option<&'a str>,
        model: Option<&'a str>,
        started: Instant,
    ) -> Self {
        Rejected {
            id,
            api,
            tenant,
            model,
            started,
        }
    }
}

/// Counts and logs a request answered with an error by the router itself.
fn reject(state: &AppState, e: ApiError, who: Rejected<'_>) -> Response {
    answered(state, e.into_response(), who)
}

/// Counts and logs a request the router answered itself (worker `-`).
fn answered(state: &AppState, resp: Response, who: Rejected<'_>) -> Response {
    tracing::Span::current().record("status", resp.status().as_u16());
    // A model name becomes a metric label only once a worker is known to serve it: client
    // strings must not grow the metrics without bound.
    let label = match who.model {
        Some(m) if state.fleet.knows_model(m) => m,
        _ => "-",
    };
    state
        .metrics
        .requests
        .with_label_values(&[who.api.label(), label, "-", resp.status().as_str()])
        .inc();
    AccessLine {
        id: who.id,
        endpoint: who.api.label(),
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

/// Authenticates the caller, admits the request, then reads the body. Admission comes first
/// (the tenant is known from the key): a request over its tenant's or the router's limit is
/// refused before its body costs anything, and the body's bytes are claimed from the router's
/// budget as they arrive.
pub(super) async fn receive(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Caller, Received), ApiError> {
    let caller = state.keys.caller(headers)?;
    let ticket = state
        .admission
        .admit_caller(&caller, headers, &state.metrics)
        .await?;
    let limits = state.body_limits();
    let mut claim = state
        .admission
        .bodies()
        .claim(super::peer::current(), limits.max_bytes);
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
    let received = Received {
        bytes,
        ticket,
        claim,
    };
    Ok((caller, received))
}

/// Routes and forwards a read request: decide (eligibility and analysis) → rewrite the body →
/// dispatch (with retries, whole or as a pair) → respond (the answer streams back observed).
async fn forward(
    state: &Arc<AppState>,
    caller: Caller,
    call: Call,
    prepared: Prepared,
    received: Received,
    started: Instant,
) -> Result<Response, ApiError> {
    let Received {
        bytes,
        ticket,
        claim,
    } = received;
    let Prepared {
        model,
        routing,
        salt,
        affinity,
        response_id,
    } = prepared;
    name_in_span(model.as_deref(), &caller);
    let client_salt = salt.as_ref().and_then(|s| s.as_deref());
    let model_ref = model.as_deref();
    let api = call.api;
    let mut decided = decide::decide(
        state,
        &caller,
        &call,
        model_ref,
        client_salt,
        routing,
        bytes.len(),
    )
    .await?;
    // Placement isolation: the tenant's stance now, with the slot it holds counted.
    decided.analysis.standing = ticket.standing();
    if let Some(narrowing) = &decided.context {
        state.metrics.context.count(narrowing.kept);
    }
    let (slo, reservation) =
        slo_and_reservation(state, &caller, &call.headers, model_ref, &mut decided)?;
    let trail = trail(state, &mut decided, bytes.len(), started);
    let edits = Edits {
        tenant_salt: salt.is_some().then_some(decided.salt.as_deref()),
        response_id: response_id.as_deref(),
        client_params: decided.client_params,
    };
    let bytes = rewrite(state, &caller, model_ref, edits, bytes)?;
    drop(claim);
    let Call {
        method,
        target,
        headers,
        ..
    } = call;
    let headers = upstream_headers(state, headers);
    let dispatched = dispatch(
        state,
        decided,
        model_ref,
        (&method, &target, &headers),
        bytes,
    )
    .await?;
    let requester = requester(&headers, &caller, model, api);
    let answering = Answering {
        ticket,
        trail,
        requester,
        affinity,
        reservation,
        slo,
        started,
    };
    Ok(respond(state, dispatched, answering))
}

/// The decided request's latency targets (SLO hints: they set the analysis' TTFT target, and
/// refuse a sheddable request no worker is predicted to meet), then the tokens it reserves in
/// its tenant's per-minute limit (or the 429 refusing it).
fn slo_and_reservation(
    state: &AppState,
    caller: &Caller,
    headers: &HeaderMap,
    model: Option<&str>,
    decided: &mut Decided,
) -> Result<(super::slo::Hints, Option<super::rate_limit::Reservation>), ApiError> {
    let slo = super::slo::apply(
        state,
        caller,
        headers,
        model,
        &mut decided.analysis,
        &decided.eligible,
    )?;
    let reservation = super::reserve::reserve(
        state,
        caller,
        &decided.analysis,
        decided.view.as_ref(),
        decided.salt.as_deref(),
    )?;
    Ok((slo, reservation))
}

/// Who asked, for the response's observer: the request id `headers` carry, the caller's
/// tenant, the model (`-`: none named) and the kind of endpoint.
pub(super) fn requester(
    headers: &HeaderMap,
    caller: &Caller,
    model: Option<String>,
    api: Api,
) -> Requester {
    Requester {
        id: request_id::of(headers).to_owned(),
        tenant: caller.tenant().map(str::to_owned),
        model: model.unwrap_or_else(|| "-".to_owned()),
        api,
    }
}

/// Names the request's model and tenant on its span.
fn name_in_span(model: Option<&str>, caller: &Caller) {
    let span = tracing::Span::current();
    if let Some(m) = model {
        span.record("model", m);
    }
    if let Some(tenant) = caller.tenant() {
        span.record("tenant", tenant);
    }
}

/// What follows a request's response: its prompt hashed for the prefix metrics and the
/// recorded trace (only prompts are), from the decided view (taken).
pub(super) fn trail(
    state: &Arc<AppState>,
    decided: &mut Decided,
    body_bytes: usize,
    started: Instant,
) -> Trail {
    match decided.view.take() {
        Some(view) => Trail::start(
            state,
            &decided.analysis,
            (view, body_bytes),
            decided.salt.clone(),
            started,
        ),
        None => Trail::Off,
    }
}

/// What is written into a request's body before it is sent.
pub(super) struct Edits<'a> {
    /// `Some(salt)`: the tenant's cache salt (or none) is written in.
    pub(super) tenant_salt: Option<Option<&'a str>>,
    /// The tenant-namespaced `request_id`, written in.
    pub(super) response_id: Option<&'a str>,
    /// Whether the body carries the client's own `kv_transfer_params` (removed).
    pub(super) client_params: bool,
}

/// The body as it is sent. The salted copy is made only now that the prompt's token ids are
/// gone (the analysis keeps block hashes), so a large body never has the original, its ids and
/// the copy alive at once: peak memory stays near twice the body, not three times.
pub(super) fn rewrite(
    state: &AppState,
    caller: &Caller,
    model: Option<&str>,
    edits: Edits<'_>,
    bytes: Bytes,
) -> Result<Bytes, ApiError> {
    let bytes = match (edits.tenant_salt, model) {
        (Some(salt), Some(m)) => tenant_body(state, caller, salt, m, bytes)?,
        _ => bytes,
    };
    let bytes = match edits.response_id {
        Some(id) => super::responses::with_response_id(bytes, id)?,
        None => bytes,
    };
    // A client's own KV hand-off parameters never reach an engine (see `without_client_params`).
    Ok(if edits.client_params {
        handoff::without_client_params(bytes)
    } else {
        bytes
    })
}

/// Sends the decided request (`method`, `target`, `headers` as sent on) through the proxy's
/// one dispatch: whole, or as its model's prefill/decode pair.
async fn dispatch(
    state: &Arc<AppState>,
    decided: Decided,
    model: Option<&str>,
    request: (&Method, &str, &HeaderMap),
    bytes: Bytes,
) -> Result<Dispatched, ApiError> {
    let protocol = match decided.eligible.plan {
        Plan::Pair => state.handoff(model.unwrap_or_default()),
        Plan::Whole => Protocol::default(),
    };
    let route = Route {
        eligible: decided.eligible,
        analysis: decided.analysis,
        started: decided.started,
        protocol,
        pieces: decided.pieces,
    };
    let clock = || state.now();
    let dispatcher = Dispatcher::new(&state.upstream, &state.decider, &state.metrics, &clock);
    dispatcher.dispatch(route, request, bytes).await
}

/// What a dispatched request's answer is observed with.
struct Answering {
    /// The request's admission slot, held until its response ends.
    ticket: Ticket,
    trail: Trail,
    requester: Requester,
    affinity: Option<Affinity>,
    /// The tokens and request it reserved against its tenant's rate limits (settled at its end).
    reservation: Option<super::rate_limit::Reservation>,
    /// Its latency targets, counted against what it got.
    slo: super::slo::Hints,
    /// When the request arrived.
    started: Instant,
}

/// The client's response: the worker's head (with the router's own headers naming who served
/// it) and its body streaming back observed, within the proxy's timeouts on both sides.
fn respond(state: &AppState, dispatched: Dispatched, answering: Answering) -> Response {
    let Dispatched {
        attempt,
        response,
        held,
        prefill,
        charge,
    } = dispatched;
    let Answering {
        ticket,
        mut trail,
        requester,
        affinity,
        reservation,
        slo,
        started,
    } = answering;
    tracing::Span::current().record("worker", attempt.worker.id());
    let (parts, incoming) = response.into_parts();
    let out_headers = client_headers(&parts.headers, &attempt, prefill.as_deref());
    let sse = proxy::is_event_stream(&parts.headers);
    trail.routed(attempt.target());
    let model_label = match requester.model.as_str() {
        m if state.fleet.knows_model(m) => m.to_owned(),
        _ => "-".to_owned(),
    };
    let learn = affinity.is_some();
    let observer = Observer::new(
        attempt,
        state.metrics.clone(),
        ticket,
        parts.status,
        started,
        requester,
        model_label,
    )
    .with_affinity(affinity)
    .with_reservation(reservation)
    .with_slo(slo)
    .with_trail(trail, sse)
    .with_prefill(prefill);
    let config = state.upstream.config();
    let timeouts = BodyTimeouts {
        idle: config.idle_timeout,
        total: config.total_timeout,
    };
    let mut body = ObservedBody::new(incoming, sse, timeouts, charge.watching(observer))
        .with_held(held)
        .cut_on(state.cutoff.clone());
    if learn {
        body = body.learn_response_id();
    }
    let mut resp = Response::new(Body::new(body));
    *resp.status_mut() = parts.status;
    *resp.headers_mut() = out_headers;
    // Its timeouts hold on the client's side too: a client that stops taking it is cut.
    resp.extensions_mut().insert(super::stall::WriteLimits {
        idle: timeouts.idle,
        total_at: tokio::time::Instant::now() + timeouts.total,
    });
    resp
}

/// The client's response headers: the worker's (hop-by-hop ones gone) and who served it —
/// the worker, its data-parallel rank, a pair's prefill worker.
fn client_headers(
    worker_headers: &HeaderMap,
    attempt: &Attempt,
    prefill: Option<&Worker>,
) -> HeaderMap {
    let mut out = proxy::headers::client_response_headers(worker_headers);
    if let Ok(v) = HeaderValue::from_str(attempt.worker.id()) {
        out.insert(WORKER_HEADER, v);
    }
    if let Some(v) = prefill.and_then(|p| HeaderValue::from_str(p.id()).ok()) {
        out.insert(PREFILL_WORKER_HEADER, v);
    }
    if let Some(rank) = attempt.pinned() {
        out.insert(RANK_HEADER, HeaderValue::from(rank));
    }
    out
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

/// The client's key is the router's credential, not the worker's: never pass it on.
pub(super) fn upstream_headers(state: &AppState, mut headers: HeaderMap) -> HeaderMap {
    if state.keys.enabled() {
        headers.remove(http::header::AUTHORIZATION);
    }
    headers
}
