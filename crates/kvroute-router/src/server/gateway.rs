//! The request path for a transport that forwards the request itself: a gateway asking
//! `kvroute epp` (over Envoy's `ext_proc`) which endpoint should serve it.
//!
//! Up to the choice of worker this is `forward`'s path, step for step — the key, admission,
//! the body read within the size and time limits and the router's body budget, the endpoint's
//! own reader, authorisation, eligibility, the prompt's analysis and a `routing::Session` (a
//! disaggregated model's prefill by the policy and decode by `routing::choose_decode`) — and
//! the body gets the same edits (the tenant's `cache_salt`, a client's `kv_transfer_params`
//! removed). Then the pick is handed back rather than forwarded; the gateway reports the
//! response head and body, and the same [`Observer`] records its first token and end (load
//! release, TTFT calibration, metrics, access log, recorded trace).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};

use super::AppState;
use super::api::Api;
use super::auth::Caller;
use super::call::{Call, Prepared, Read, Step};
use super::decide;
use super::forward::{self, Received};
use super::observer::{Affinity, AffinityAction, Observer, Requester};
use super::trail::Trail;
use crate::fleet::{CircuitState, Side, Worker, WorkerRank};
use crate::openai::{ApiError, Endpoint};
use crate::proxy::outcome::{self, Outcome, WorkerFault};
use crate::proxy::response_id::ResponseIdScanner;
use crate::proxy::{End, ResponseObserver};
use crate::routing::{Analysis, Attempt, DecodeSession, Plan, Session};

/// A request as the gateway reports its head.
pub struct GatewayRequest {
    /// `:method`.
    pub method: Method,
    /// `:path`, with its query.
    pub path: String,
    /// The client's headers.
    pub headers: HeaderMap,
}

/// How a path's body is read (the router's own endpoints' readers): completions and chat are
/// routed on their prompt; the pooling endpoints and transcriptions on load with their model;
/// the Responses API as `serve` routes it (a new response on its prompt, a continuation and
/// the requests about a stored response pinned to the worker that stored it); anything else
/// on load, with its model when it is a JSON body that names one.
fn reading(path: &str) -> (Api, Read) {
    let bare = path.split('?').next().unwrap_or(path);
    match bare {
        "/v1/completions" => (Api::Completions, Read::Generation(Endpoint::Completions)),
        "/v1/chat/completions" => (Api::Chat, Read::Generation(Endpoint::ChatCompletions)),
        "/v1/embeddings" => (Api::Embeddings, Read::ModelJson { salted: true }),
        "/v1/rerank" | "/rerank" | "/v2/rerank" => (Api::Rerank, Read::ModelJson { salted: true }),
        "/v1/score" | "/score" => (Api::Score, Read::ModelJson { salted: true }),
        "/v1/audio/transcriptions" => (Api::Transcriptions, Read::Multipart),
        "/v1/responses" => (Api::Responses, Read::Responses),
        _ => match stored_response(bare) {
            Some(id) => (Api::Responses, Read::StoredResponse(id.to_owned())),
            None => (Api::Forwarded, Read::Opaque),
        },
    }
}

/// The id in a path about a stored response, as `serve` routes them:
/// `/v1/responses/{id}`, `/v1/responses/{id}/cancel`, `/v1/responses/{id}/input_items`.
fn stored_response(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let (id, tail) = rest.split_once('/').unwrap_or((rest, ""));
    let known = matches!(tail, "" | "cancel" | "input_items");
    (known && !id.is_empty()).then_some(id)
}

/// A request routed: its worker (admitted there), the body to send it and what observing its
/// response needs.
pub struct Picked {
    /// The worker (the decode side of a disaggregated request).
    pub attempt: Attempt,
    /// The prefill side of a disaggregated request (its load released at the first token).
    pub prefill: Option<Attempt>,
    /// Endpoints the gateway may fall back on, best first ([`fallbacks`]).
    pub fallbacks: Vec<String>,
    /// The body as the worker must get it.
    pub body: Bytes,
    /// Whether `body` differs from what the client sent.
    pub edited: bool,
    /// Whether the client's `Authorization` must not reach the worker (it is the router's key).
    pub strip_authorization: bool,
    pending: Pending,
}

/// What the response's observer is made of, once its head is known.
struct Pending {
    state: Arc<AppState>,
    ticket: super::admission::Ticket,
    requester: Requester,
    model_label: String,
    trail: Trail,
    /// The analysis, for re-admitting the request where the gateway actually sent it.
    analysis: Analysis,
    /// What the response teaches or unlearns of which worker stores which Responses API
    /// response (as for `serve`).
    affinity: Option<Affinity>,
    started: Instant,
}

/// Reads, admits and routes a request whose body arrives as `body`; `allowed` says which
/// workers the gateway permits (its subset hint); up to `fallbacks` more endpoints are named
/// after the pick. Every refusal is the error `serve` would answer, plus a 503 when the subset
/// leaves no eligible worker.
pub async fn pick(
    state: &Arc<AppState>,
    request: GatewayRequest,
    body: Body,
    allowed: &(dyn Fn(&Worker) -> bool + Sync),
    fallbacks: usize,
) -> Result<Picked, ApiError> {
    let started = Instant::now();
    let (call, read) = call_of(request);
    let (caller, received) = forward::receive(state, &call.headers, body).await?;
    let Received {
        bytes,
        ticket,
        claim,
    } = received;
    let prepared = match super::read::prepare(state, &caller, &call, &bytes, read).await? {
        Step::Forward(p) => p,
        Step::Answer(..) => return Err(ApiError::no_worker()),
    };
    let Prepared {
        model,
        routing,
        salt,
        affinity,
        response_id,
    } = prepared;
    let client_salt = salt.as_ref().and_then(|s| s.as_deref());
    let mut decided = decide::decide(
        state,
        &caller,
        &call,
        model.as_deref(),
        client_salt,
        routing,
        bytes.len(),
    )
    .await?;
    // The gateway sends the request: a picker has no prefix pieces to send.
    decided.pieces = None;
    permit(&mut decided.eligible.workers, allowed)?;
    if let Some(narrowing) = &decided.context {
        state.metrics.context.count(narrowing.kept);
    }
    decided.analysis.standing = ticket.standing();
    let trail = forward::trail(state, &mut decided, bytes.len(), started);
    let edits = forward::Edits {
        tenant_salt: salt.is_some().then_some(decided.salt.as_deref()),
        response_id: response_id.as_deref(),
        client_params: decided.client_params,
    };
    let (bytes, edited) = edit(state, &caller, model.as_deref(), edits, bytes)?;
    drop(claim);
    let (attempt, prefill, runners_up) = choose(
        state,
        decided.eligible.plan,
        decided.eligible.workers,
        &decided.analysis,
        decided.started,
    )?;
    let fallbacks = self::fallbacks(&attempt, runners_up, fallbacks);
    let (model_label, requester) = requester(state, &call, &caller, model);
    Ok(Picked {
        attempt,
        prefill,
        fallbacks,
        body: bytes,
        edited,
        strip_authorization: state.keys.enabled(),
        pending: Pending {
            state: Arc::clone(state),
            ticket,
            requester,
            model_label,
            trail,
            analysis: decided.analysis,
            affinity,
            started,
        },
    })
}

/// The call a gateway's request head makes, and how its path's body is read ([`reading`]).
fn call_of(request: GatewayRequest) -> (Call, Read) {
    let (api, read) = reading(&request.path);
    let call = Call {
        api,
        method: request.method,
        target: request.path,
        headers: request.headers,
    };
    (call, read)
}

/// Keeps the eligible workers the gateway permits (its subset hint): a subset that leaves
/// none is a 503, as no eligible worker is for `serve`.
fn permit(
    workers: &mut Vec<Arc<Worker>>,
    allowed: &(dyn Fn(&Worker) -> bool + Sync),
) -> Result<(), ApiError> {
    workers.retain(|w| allowed(w));
    if workers.is_empty() {
        return Err(ApiError::no_worker());
    }
    Ok(())
}

/// The body with `edits` written in ([`forward::rewrite`]), and whether it differs from what
/// the client sent (then the gateway is told its new length).
fn edit(
    state: &AppState,
    caller: &Caller,
    model: Option<&str>,
    edits: forward::Edits<'_>,
    bytes: Bytes,
) -> Result<(Bytes, bool), ApiError> {
    let original = (bytes.as_ptr(), bytes.len());
    let bytes = forward::rewrite(state, caller, model, edits, bytes)?;
    let edited = (bytes.as_ptr(), bytes.len()) != original;
    Ok((bytes, edited))
}

/// The model label of the request's metrics (`-` until a worker is known to serve the model:
/// client strings must not grow the metrics without bound) and who asked, for its observer.
fn requester(
    state: &AppState,
    call: &Call,
    caller: &Caller,
    model: Option<String>,
) -> (String, Requester) {
    let model_label = match &model {
        Some(m) if state.fleet.knows_model(m) => m.clone(),
        _ => "-".to_owned(),
    };
    let requester = forward::requester(&call.headers, caller, model, call.api);
    (model_label, requester)
}

/// The worker of a whole request (the policy's, through a `Session`) with the decision's
/// runners-up, or the decode and prefill workers of a disaggregated one (prefill by the
/// policy, decode by `routing::choose_decode` away from it) with the decode pick's runners-up:
/// every decode pod reads the same prefill endpoint, so any of them can take the decode.
fn choose(
    state: &AppState,
    plan: Plan,
    eligible: Vec<Arc<Worker>>,
    analysis: &Analysis,
    started: Instant,
) -> Result<(Attempt, Option<Attempt>, Vec<WorkerRank>), ApiError> {
    let clock = || state.now();
    let session = Session::new(
        &state.decider,
        &state.metrics,
        eligible.clone(),
        analysis.clone(),
        &clock,
        started,
    );
    if plan != Plan::Pair {
        let mut session = session;
        return session
            .next_attempt_ranked()
            .map(|(a, runners_up)| (a, None, runners_up))
            .ok_or_else(ApiError::no_worker);
    }
    let prefill = session
        .on_side(Side::Prefill)
        .next_attempt()
        .ok_or_else(ApiError::no_worker)?;
    let mut decode = DecodeSession::new(&state.decider, &eligible, analysis.clone(), &clock);
    decode.prefilled_on(&prefill.worker);
    let (decode, runners_up) = decode
        .next_attempt_ranked()
        .ok_or_else(ApiError::no_worker)?;
    Ok((decode, Some(prefill), runners_up))
}

/// Up to `n` endpoints for the gateway to fall back on, from the decision's `runners_up`
/// (eligible, permitted by the subset, routable, best first): other workers than the chosen
/// one, each once, whose circuit is closed (a half-open one's probe is the router's to send).
///
/// The gateway sends the same request headers to every endpoint of the list, so a fallback
/// must be served right by the headers the pick set: after a pick pinned to data-parallel
/// rank R (`x-data-parallel-rank: R`) only other workers' rank R, after an unpinned pick only
/// workers that need no rank. A decode's fallbacks read the same `x-prefiller-host-port`. A
/// request pinned to the worker that stores its response has no runner-up on another worker
/// (no other worker holds that response), so none is named.
fn fallbacks(chosen: &Attempt, runners_up: Vec<WorkerRank>, n: usize) -> Vec<String> {
    if n == 0 {
        return Vec::new();
    }
    let now = Instant::now();
    let rank = chosen.pinned();
    let mut named = vec![endpoint(&chosen.worker)];
    for r in runners_up {
        if named.len() > n {
            break;
        }
        let at = endpoint(&r.worker);
        if r.pinned() == rank
            && r.worker.breaker.state(now) == CircuitState::Closed
            && !named.contains(&at)
        {
            named.push(at);
        }
    }
    named.split_off(1)
}

/// The `ip:port` a gateway sends a worker's requests to.
pub fn endpoint(worker: &Worker) -> String {
    worker.spec.url.host_port()
}

impl Picked {
    /// The gateway reports it sent the request to `served` (it may go down the list, or fall
    /// back on its own): when that is another worker of the fleet, the request's load moves
    /// there (re-admitted by the same core), so load and breaker follow the worker that served.
    pub fn served_by(&mut self, served: &str) {
        if endpoint(&self.attempt.worker) == served {
            return;
        }
        let state = &self.pending.state;
        let workers = state.fleet.workers();
        let Some(worker) = workers.iter().find(|w| endpoint(w) == served) else {
            tracing::warn!(served, picked = %endpoint(&self.attempt.worker), "the gateway reports an endpoint outside the pool");
            return;
        };
        let moved = readmit(
            state,
            worker,
            &self.pending.analysis,
            &self.attempt,
            self.prefill.is_some(),
        );
        if let Some(moved) = moved {
            self.attempt = moved;
        }
    }

    /// The observer of the response whose head came back with `status` (`sse`: an event
    /// stream); the status is charged to the worker's breaker as the proxy charges it.
    pub fn observe(self, status: StatusCode, sse: bool) -> Served {
        let Pending {
            state,
            ticket,
            requester,
            model_label,
            mut trail,
            analysis: _,
            affinity,
            started,
        } = self.pending;
        let learn = matches!(
            affinity,
            Some(Affinity {
                action: AffinityAction::Learn,
                ..
            })
        );
        let result = match status {
            StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT => Outcome::Failed(WorkerFault::Unavailable),
            _ => Outcome::Answered,
        };
        let detail = "the gateway reports an unavailable status";
        outcome::account(
            &self.attempt.worker,
            result,
            detail,
            &state.metrics,
            Instant::now(),
        );
        trail.routed(self.attempt.target());
        let prefill_worker = self.prefill.as_ref().map(|p| Arc::clone(&p.worker));
        let observer = Observer::new(
            self.attempt,
            Arc::clone(&state.metrics),
            ticket,
            status,
            started,
            requester,
            model_label,
        )
        .with_affinity(affinity)
        .with_trail(trail, sse)
        .with_prefill(prefill_worker);
        Served {
            observer,
            prefill: self.prefill,
            ids: learn.then(|| ResponseIdScanner::new(sse)),
        }
    }
}

/// The request admitted again on `worker`, which served it in place of `picked`: on the same
/// data-parallel rank when the pick was pinned to one (the gateway sent every endpoint of its
/// list the same `x-data-parallel-rank`), as a decode when `picked` was one (the fallback
/// decode reads the same prefill endpoint). `None` when `worker` cannot take it.
fn readmit(
    state: &AppState,
    worker: &Arc<Worker>,
    analysis: &Analysis,
    picked: &Attempt,
    decode: bool,
) -> Option<Attempt> {
    let clock = || state.now();
    let one = vec![Arc::clone(worker)];
    let rank = picked.pinned();
    if decode {
        let session = DecodeSession::new(&state.decider, &one, analysis.clone(), &clock);
        let mut session = match rank {
            Some(r) => session.on_rank(r),
            None => session,
        };
        return session.next_attempt();
    }
    let session = Session::new(
        &state.decider,
        &state.metrics,
        one,
        analysis.clone(),
        &clock,
        Instant::now(),
    );
    let mut session = match rank {
        Some(r) => session.on_rank(r),
        None => session,
    };
    session.next_attempt()
}

/// A response's observer: `serve`'s, plus the prefill side of a disaggregated request, whose
/// load ends with the decode's first token.
pub struct Served {
    observer: Observer,
    prefill: Option<Attempt>,
    /// For a new Responses API response: its id, found in the body as `serve` finds it.
    ids: Option<ResponseIdScanner>,
}

impl ResponseObserver for Served {
    fn first_token(&mut self) {
        self.prefill = None;
        self.observer.first_token();
    }

    fn end(&mut self, end: End, bytes: u64) {
        self.prefill = None;
        self.observer.end(end, bytes);
    }

    fn data(&mut self, chunk: &[u8]) {
        if let Some(id) = self.ids.as_mut().and_then(|s| s.feed(chunk)) {
            self.observer.response_id(id);
        }
        self.observer.data(chunk);
    }
}
