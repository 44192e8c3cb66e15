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
use super::call::{Call, Prepared, Read, Step};
use super::decide::{self, Decided};
use super::forward::{self, Received};
use super::observer::{Observer, Requester};
use super::request_id;
use super::trail::Trail;
use crate::fleet::{Side, Worker};
use crate::openai::{ApiError, Endpoint};
use crate::proxy::handoff;
use crate::proxy::outcome::{self, Outcome, WorkerFault};
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
/// anything else on load, with its model when it is a JSON body that names one. The
/// Responses API is routed on load here: the gateway does not tell the picker which worker
/// stored a response.
fn reading(path: &str) -> (Api, Read) {
    let bare = path.split('?').next().unwrap_or(path);
    match bare {
        "/v1/completions" => (Api::Completions, Read::Generation(Endpoint::Completions)),
        "/v1/chat/completions" => (Api::Chat, Read::Generation(Endpoint::ChatCompletions)),
        "/v1/embeddings" => (Api::Embeddings, Read::ModelJson { salted: true }),
        "/v1/rerank" | "/rerank" | "/v2/rerank" => (Api::Rerank, Read::ModelJson { salted: true }),
        "/v1/score" | "/score" => (Api::Score, Read::ModelJson { salted: true }),
        "/v1/audio/transcriptions" => (Api::Transcriptions, Read::Multipart),
        _ => (Api::Forwarded, Read::Opaque),
    }
}

/// A request routed: its worker (admitted there), the body to send it and what observing its
/// response needs.
pub struct Picked {
    /// The worker (the decode side of a disaggregated request).
    pub attempt: Attempt,
    /// The prefill side of a disaggregated request (its load released at the first token).
    pub prefill: Option<Attempt>,
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
    started: Instant,
}

/// Reads, admits and routes a request whose body arrives as `body`; `allowed` says which
/// workers the gateway permits (its subset hint). Every refusal is the error `serve` would
/// answer, plus a 503 when the subset leaves no eligible worker.
pub async fn pick(
    state: &Arc<AppState>,
    request: GatewayRequest,
    body: Body,
    allowed: &(dyn Fn(&Worker) -> bool + Sync),
) -> Result<Picked, ApiError> {
    let started = Instant::now();
    let (api, read) = reading(&request.path);
    let call = Call {
        api,
        method: request.method,
        target: request.path,
        headers: request.headers,
    };
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
        ..
    } = prepared;
    let client_salt = salt.as_ref().and_then(|s| s.as_deref());
    let decided = decide::decide(
        state,
        &caller,
        &call,
        model.as_deref(),
        client_salt,
        routing,
        bytes.len(),
    )
    .await?;
    let Decided {
        mut eligible,
        analysis,
        view,
        salt: salt_value,
        client_params,
        started: decision_started,
        ..
    } = decided;
    eligible.workers.retain(|w| allowed(w));
    if eligible.workers.is_empty() {
        return Err(ApiError::no_worker());
    }
    let trail = match view {
        Some(view) => Trail::start(
            state,
            &analysis,
            (view, bytes.len()),
            salt_value.clone(),
            started,
        ),
        None => Trail::Off,
    };
    let original = (bytes.as_ptr(), bytes.len());
    let bytes = match (&salt, &model) {
        (Some(_), Some(m)) => {
            forward::tenant_body(state, &caller, salt_value.as_deref(), m, bytes)?
        }
        _ => bytes,
    };
    let bytes = if client_params {
        handoff::without_client_params(bytes)
    } else {
        bytes
    };
    drop(claim);
    let edited = (bytes.as_ptr(), bytes.len()) != original;
    let (attempt, prefill) = choose(
        state,
        eligible.plan,
        eligible.workers,
        &analysis,
        decision_started,
    )?;
    let model_label = match &model {
        Some(m) if state.fleet.knows_model(m) => m.clone(),
        _ => "-".to_owned(),
    };
    let requester = Requester {
        id: request_id::of(&call.headers).to_owned(),
        tenant: caller.tenant().map(str::to_owned),
        model: model.unwrap_or_else(|| "-".to_owned()),
        api,
    };
    Ok(Picked {
        attempt,
        prefill,
        body: bytes,
        edited,
        strip_authorization: state.keys.enabled(),
        pending: Pending {
            state: Arc::clone(state),
            ticket,
            requester,
            model_label,
            trail,
            analysis,
            started,
        },
    })
}

/// The worker of a whole request (the policy's, through a `Session`), or the decode and
/// prefill workers of a disaggregated one (prefill by the policy, decode by
/// `routing::choose_decode` away from it).
fn choose(
    state: &AppState,
    plan: Plan,
    eligible: Vec<Arc<Worker>>,
    analysis: &Analysis,
    started: Instant,
) -> Result<(Attempt, Option<Attempt>), ApiError> {
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
            .next_attempt()
            .map(|a| (a, None))
            .ok_or_else(ApiError::no_worker);
    }
    let prefill = session
        .on_side(Side::Prefill)
        .next_attempt()
        .ok_or_else(ApiError::no_worker)?;
    let mut decode = DecodeSession::new(&state.decider, &eligible, analysis.clone(), &clock);
    decode.prefilled_on(&prefill.worker);
    let decode = decode.next_attempt().ok_or_else(ApiError::no_worker)?;
    Ok((decode, Some(prefill)))
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
        let clock = || state.now();
        let moved = Session::new(
            &state.decider,
            &state.metrics,
            vec![Arc::clone(worker)],
            self.pending.analysis.clone(),
            &clock,
            Instant::now(),
        )
        .next_attempt();
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
            started,
        } = self.pending;
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
        .with_trail(trail, sse)
        .with_prefill(prefill_worker);
        Served {
            observer,
            prefill: self.prefill,
        }
    }
}

/// A response's observer: `serve`'s, plus the prefill side of a disaggregated request, whose
/// load ends with the decode's first token.
pub struct Served {
    observer: Observer,
    prefill: Option<Attempt>,
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
        self.observer.data(chunk);
    }
}
