//! A disaggregated request's way through the router: a prefill worker chosen KV-aware, a
//! decode worker chosen by load and KV room (both by the one decision core, `routing::pair`),
//! the KV hand-off between them in the model's protocol (`proxy::handoff`), and the decode's
//! answer to the client.
//!
//! Nothing reaches the client twice. The client gets only the decode's answer, and only once
//! its first token is in ([`first_token`]): a prefill that fails is sent to another prefill
//! worker; a decode that fails before its first token is sent again — to another decode worker
//! with the same transfer parameters when it never reached the first (vLLM: a failed
//! connection), else after a new prefill (its blocks may have been read and released); after
//! the first token a failure ends the stream with the router's SSE error event, as for any
//! request. Each side's attempts go through the proxy's retries and the worker's circuit, and
//! a pair sent again takes one retry from the retry budget.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::AppState;
use super::route_error::is_no_worker;
use crate::fleet::{DEFAULT_BOOTSTRAP_PORT, Side, Worker};
use crate::openai::ApiError;
use crate::proxy::handoff::first_token::{Held, first_token};
use crate::proxy::handoff::sglang::{Bootstrap, random_room, with_bootstrap};
use crate::proxy::handoff::{BodyError, Protocol, vllm};
use crate::proxy::outcome::{self, Outcome, WorkerFault};
use crate::routing::{Analysis, Attempt, DecodeSession, RouteError, Session};

/// Largest prefill answer read (one token and its `kv_transfer_params`: a few kilobytes).
const MAX_PREFILL_ANSWER: usize = 4 << 20;

/// A request to hand off: what the client sent, where, and how it was analysed.
pub(super) struct PairRequest<'a> {
    pub(super) method: &'a Method,
    pub(super) target: &'a str,
    pub(super) headers: &'a HeaderMap,
    /// The body as the engines would get it whole (the tenant's salt written in).
    pub(super) body: Bytes,
    pub(super) analysis: Analysis,
    pub(super) eligible: Vec<Arc<Worker>>,
    pub(super) protocol: Protocol,
    /// When the decision began.
    pub(super) started: Instant,
}

/// The answer for the client: the decode's (or a side's own error answer), with what was held
/// of it, and the prefill worker that computed the prompt.
pub(super) struct Paired {
    /// The attempt whose answer the client gets.
    pub(super) attempt: Attempt,
    pub(super) response: Response<Incoming>,
    /// Frames read from `response` while waiting for its first token.
    pub(super) held: Vec<Bytes>,
    /// The prefill worker of the hand-off that answered (`None` when a prefill's own answer
    /// goes to the client).
    pub(super) prefill: Option<Arc<Worker>>,
}

/// Sends `req` disaggregated and returns the answer for the client.
pub(super) async fn forward(
    state: &Arc<AppState>,
    req: PairRequest<'_>,
) -> Result<Paired, ApiError> {
    let clock = || state.now();
    let mut decode =
        DecodeSession::new(&state.decider, &req.eligible, req.analysis.clone(), &clock);
    let metrics = &state.metrics.disaggregation;
    let label = req.protocol.as_str();
    let mut last: Option<String> = None;
    let mut failed_prefills = Vec::new();
    for round in 0..=state.upstream.config().retries {
        if round > 0 {
            if !state.upstream.try_retry() {
                state.metrics.retries_denied.inc();
                break;
            }
            metrics
                .retries
                .with_label_values(&["pair", "before_first_token"])
                .inc();
        }
        let prefill = Session::new(
            &state.decider,
            &state.metrics,
            req.eligible.clone(),
            req.analysis.clone(),
            &clock,
            req.started,
        )
        .on_side(Side::Prefill)
        .excluding(&failed_prefills);
        let outcome = match req.protocol {
            Protocol::Vllm => vllm_round(state, &req, prefill, &mut decode).await,
            Protocol::Sglang => sglang_round(state, &req, prefill, &mut decode).await,
        };
        let outcome = match outcome {
            Ok(outcome) => outcome,
            // A retry that finds no worker left for a side: the client learns why the pair
            // failed (below), not that no worker was ever available.
            Err(e) if last.is_some() && is_no_worker(&e) => break,
            Err(e) => return Err(e),
        };
        match outcome {
            Round::Answer(paired) => return Ok(*paired),
            Round::Failed { why, prefill } => {
                tracing::warn!(protocol = label, reason = %why, "hand-off failed before the first token");
                failed_prefills.extend(prefill);
                last = Some(why);
            }
        }
    }
    metrics.handoffs.with_label_values(&[label, "failed"]).inc();
    Err(ApiError::new(
        StatusCode::BAD_GATEWAY,
        "upstream_error",
        Some("decode_failed"),
        last.unwrap_or_else(|| "the decode failed before its first token".into()),
    ))
}

/// What one try of a pair came to.
enum Round {
    /// An answer for the client.
    Answer(Box<Paired>),
    /// A side failed before the decode's first token (the pair may be tried again); the
    /// worker when it was the prefill (it is not chosen again for this request).
    Failed {
        why: String,
        prefill: Option<crate::fleet::WorkerId>,
    },
}

/// vLLM: prefill (with the proxy's retries over prefill workers), its `kv_transfer_params`,
/// then decode (retried over decode workers with the same parameters while it fails to
/// answer at all).
async fn vllm_round(
    state: &Arc<AppState>,
    req: &PairRequest<'_>,
    mut prefill: Session<'_>,
    decode: &mut DecodeSession<'_>,
) -> Result<Round, ApiError> {
    let metrics = &state.metrics;
    let body = vllm::prefill_body(&req.body).map_err(body_error)?;
    let (mut p, answer) = state
        .upstream
        .forward(
            req.method,
            req.target,
            req.headers,
            body,
            metrics,
            &mut prefill,
        )
        .await?;
    if !answer.status().is_success() {
        // The request's own answer (a 4xx): the client gets it as it is.
        return Ok(Round::Answer(Box::new(Paired {
            attempt: p,
            response: answer,
            held: Vec::new(),
            prefill: None,
        })));
    }
    let wait = state.upstream.config().first_byte_timeout;
    let bytes = read_answer(answer.into_body(), wait).await;
    p.admitted.first_token();
    let params = match bytes
        .map_err(BodyError::Answer)
        .and_then(|b| vllm::transfer_params(&b))
    {
        Ok(params) => params,
        Err(e) => {
            let broken = Outcome::Failed(WorkerFault::BrokenAnswer);
            outcome::account(&p.worker, broken, &e.to_string(), metrics, Instant::now());
            return Ok(prefill_failed(&p, e.to_string(), metrics));
        }
    };
    // The prefill's answer is its first token: its time calibrates the cost model.
    p.admitted.observe_ttft(p.at.elapsed().as_secs_f64());
    p.admitted.finish();
    let outcome = if params.is_some() {
        "relayed"
    } else {
        "no_params"
    };
    metrics
        .disaggregation
        .handoffs
        .with_label_values(&["vllm", outcome])
        .inc();
    decode.prefilled_on(&p.worker);
    let body = vllm::decode_body(&req.body, params.as_ref()).map_err(body_error)?;
    let (d, answer) = state
        .upstream
        .forward(req.method, req.target, req.headers, body, metrics, decode)
        .await?;
    Ok(held_answer(d, answer, wait, Arc::clone(&p.worker), metrics).await)
}

/// SGLang: one prefill and one decode worker, both sent the request at once with the prefill's
/// bootstrap address and a fresh room. The prefill's answer is awaited first (as SGLang's
/// gateway does): when it fails, the decode is dropped (its connection closed, which aborts
/// it) and the pair tried again.
async fn sglang_round(
    state: &Arc<AppState>,
    req: &PairRequest<'_>,
    mut prefill: Session<'_>,
    decode: &mut DecodeSession<'_>,
) -> Result<Round, ApiError> {
    let metrics = &state.metrics;
    let picks = &metrics.disaggregation.picks;
    let Some(p) = prefill.next_attempt() else {
        return Err(RouteError::NoWorker.into());
    };
    decode.prefilled_on(&p.worker);
    let Some(d) = decode.next_attempt() else {
        return Err(RouteError::NoWorker.into());
    };
    picks.with_label_values(&["prefill", p.worker.id()]).inc();
    picks.with_label_values(&["decode", d.worker.id()]).inc();
    let bootstrap = Bootstrap {
        host: bootstrap_host(&p.worker),
        port: p
            .worker
            .spec
            .bootstrap_port
            .unwrap_or(DEFAULT_BOOTSTRAP_PORT),
        room: random_room(),
    };
    let body = with_bootstrap(&req.body, &bootstrap).map_err(body_error)?;
    let up = &state.upstream;
    let (prefilled, decoded) = {
        let prefill_sent = up.send_once(
            &p,
            req.method,
            req.target,
            req.headers,
            body.clone(),
            metrics,
        );
        let decode_sent = up.send_once(&d, req.method, req.target, req.headers, body, metrics);
        tokio::pin!(prefill_sent, decode_sent);
        let mut decoded = None;
        let prefilled = loop {
            tokio::select! {
                biased;
                r = &mut prefill_sent => break r,
                r = &mut decode_sent, if decoded.is_none() => decoded = Some(r),
            }
        };
        // A failed prefill drops the decode request here (its connection closes).
        let decoded = match (&prefilled, decoded) {
            (Ok(answer), None) if answer.status().is_success() => Some(decode_sent.await),
            (_, decoded) => decoded,
        };
        (prefilled, decoded)
    };
    let answer = match prefilled {
        Err(e) => {
            // The decode did nothing wrong: it may pair with another prefill worker.
            decode.forgive(&d.worker);
            return Ok(prefill_failed(&p, e.message, metrics));
        }
        Ok(answer) => answer,
    };
    if !answer.status().is_success() {
        return Ok(Round::Answer(Box::new(Paired {
            attempt: p,
            response: answer,
            held: Vec::new(),
            prefill: None,
        })));
    }
    metrics
        .disaggregation
        .handoffs
        .with_label_values(&["sglang", "paired"])
        .inc();
    let wait = up.config().first_byte_timeout;
    // The prefill's answer is read to its end (SGLang's gateway reads and drops it) while the
    // decode streams; its load is held until then. Its time includes the transfer, so it does
    // not calibrate the prefill model.
    let prefill_worker = Arc::clone(&p.worker);
    tokio::spawn(async move {
        let mut p = p;
        let _ = read_answer(answer.into_body(), wait).await;
        p.admitted.first_token();
        p.admitted.finish();
    });
    match decoded.unwrap_or_else(|| Err(RouteError::NoWorker.into())) {
        Err(e) => Ok(Round::Failed {
            why: e.message,
            prefill: None,
        }),
        Ok(answer) => Ok(held_answer(d, answer, wait, prefill_worker, metrics).await),
    }
}

/// The decode's answer once its first token is in, or why it failed before.
async fn held_answer(
    d: Attempt,
    answer: Response<Incoming>,
    wait: Duration,
    prefill: Arc<Worker>,
    metrics: &crate::metrics::Metrics,
) -> Round {
    let sse = crate::proxy::is_event_stream(answer.headers());
    match first_token(answer, sse, wait).await {
        Ok(Held { response, frames }) => Round::Answer(Box::new(Paired {
            attempt: d,
            response,
            held: frames,
            prefill: Some(prefill),
        })),
        Err(why) => {
            let broken = Outcome::Failed(WorkerFault::BrokenAnswer);
            outcome::account(&d.worker, broken, &why.to_string(), metrics, Instant::now());
            Round::Failed {
                why: format!("decode worker `{}`: {why}", d.worker.id()),
                prefill: None,
            }
        }
    }
}

/// A prefill that failed (no usable answer): counted, and its worker (every rank) left out of
/// the request's next rounds.
fn prefill_failed(p: &Attempt, why: String, metrics: &crate::metrics::Metrics) -> Round {
    metrics
        .disaggregation
        .retries
        .with_label_values(&["prefill", "failed"])
        .inc();
    Round::Failed {
        why: format!("prefill worker `{}`: {why}", p.worker.id()),
        prefill: Some(p.admitted.worker()),
    }
}

/// A prefill answer's body, within `wait` and [`MAX_PREFILL_ANSWER`].
async fn read_answer(body: Incoming, wait: Duration) -> Result<Bytes, String> {
    let limited = http_body_util::Limited::new(body, MAX_PREFILL_ANSWER);
    match tokio::time::timeout(wait, limited.collect()).await {
        Err(_) => Err(format!("no complete answer within {wait:?}")),
        Ok(Err(e)) => Err(format!("its answer broke off: {e}")),
        Ok(Ok(b)) => Ok(b.to_bytes()),
    }
}

/// The host a decode worker reaches the prefill worker's bootstrap server at: the host of its
/// URL (an IPv6 address without brackets, as SGLang's gateway passes it).
fn bootstrap_host(worker: &Worker) -> String {
    let host = worker.spec.url.authority().host();
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}

fn body_error(e: BodyError) -> ApiError {
    ApiError::invalid(e.to_string(), None)
}
