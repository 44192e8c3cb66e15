//! A disaggregated request's rounds: a prefill worker chosen KV-aware, a decode worker chosen
//! by load and KV room (both by the one decision core, `routing::pair`), the KV hand-off
//! between them in the model's protocol (`proxy::handoff`; one round each in `vllm` and
//! `sglang`), and the decode's answer to the client.
//!
//! Nothing reaches the client twice. The client gets only the decode's answer, and only once
//! its first token is in (`handoff::first_token`): a prefill that fails is sent to another
//! prefill worker; a decode that fails before its first token is sent again — to another
//! decode worker with the same transfer parameters when it never reached the first (vLLM: a
//! failed connection), else after a new prefill (its blocks may have been read and released);
//! after the first token a failure ends the stream with the router's SSE error event, as for
//! any request. Each side's attempts go through the proxy's retries and the worker's circuit,
//! and a pair sent again takes one retry from the retry budget.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::{Dispatcher, Outbound, Route};
use crate::fleet::{Side, Worker, WorkerId};
use crate::openai::ApiError;
use crate::proxy::handoff::first_token::{Held, first_token};
use crate::proxy::handoff::{BodyError, Protocol};
use crate::routing::{Attempt, DecodeSession, Session};

/// Largest prefill answer read (one token and its `kv_transfer_params`: a few kilobytes).
const MAX_PREFILL_ANSWER: usize = 4 << 20;

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

impl Paired {
    /// A side's own answer (not a success: a 4xx, say) for the client as it is.
    pub(super) fn own_answer(attempt: Attempt, response: Response<Incoming>) -> Round {
        Round::Answer(Box::new(Paired {
            attempt,
            response,
            held: Vec::new(),
            prefill: None,
        }))
    }
}

/// What one try of a pair came to.
pub(super) enum Round {
    /// An answer for the client.
    Answer(Box<Paired>),
    /// A side failed before the decode's first token (the pair may be tried again); the
    /// worker when it was the prefill (it is not chosen again for this request).
    Failed {
        why: String,
        prefill: Option<WorkerId>,
    },
}

/// One round's inputs: what is sent, the prefill session of the round and the
/// request's decode session.
pub(super) struct Sides<'r, 'd> {
    pub(super) out: &'r Outbound<'r>,
    pub(super) body: &'r Bytes,
    pub(super) prefill: Session<'d>,
    pub(super) decode: &'r mut DecodeSession<'d>,
}

impl Dispatcher<'_> {
    /// Sends `body` disaggregated on `route` and returns the answer for the client.
    pub(super) async fn pair(
        &self,
        route: &Route,
        out: &Outbound<'_>,
        body: Bytes,
    ) -> Result<Paired, ApiError> {
        let workers = &route.eligible.workers;
        let analysis = || route.analysis.clone();
        let mut decode = DecodeSession::new(self.decider, workers, analysis(), self.clock);
        let label = route.protocol.as_str();
        let mut last: Option<String> = None;
        let mut failed_prefills = Vec::new();
        for round in 0..=self.config.retries {
            if round > 0 && !self.retry_pair() {
                break;
            }
            let prefill = Session::new(
                self.decider,
                self.metrics,
                workers.clone(),
                analysis(),
                self.clock,
                route.started,
            )
            .on_side(Side::Prefill)
            .excluding(&failed_prefills);
            let sides = Sides {
                out,
                body: &body,
                prefill,
                decode: &mut decode,
            };
            let outcome = match route.protocol {
                Protocol::Vllm => self.vllm_round(sides).await,
                Protocol::Sglang => self.sglang_round(sides).await,
            };
            match outcome {
                Ok(Round::Answer(paired)) => return Ok(*paired),
                Ok(Round::Failed { why, prefill }) => {
                    tracing::warn!(protocol = label, reason = %why, "hand-off failed before the first token");
                    failed_prefills.extend(prefill);
                    last = Some(why);
                }
                // A retry that finds no worker left for a side: the client learns why the
                // pair failed (below), not that no worker was ever available.
                Err(e) if last.is_some() && is_no_worker(&e) => break,
                Err(e) => return Err(e),
            }
        }
        let handoffs = &self.metrics.disaggregation.handoffs;
        handoffs.with_label_values(&[label, "failed"]).inc();
        Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            Some("decode_failed"),
            last.unwrap_or_else(|| "the decode failed before its first token".into()),
        ))
    }

    /// Takes one retry from the budget for sending the pair again, counted.
    fn retry_pair(&self) -> bool {
        if !self.may_retry() {
            return false;
        }
        let retries = &self.metrics.disaggregation.retries;
        retries
            .with_label_values(&["pair", "before_first_token"])
            .inc();
        true
    }

    /// The decode's answer once its first token is in, or why it failed before (charged to
    /// the decode worker).
    pub(super) async fn held_answer(
        &self,
        d: Attempt,
        answer: Response<Incoming>,
        prefill: Arc<Worker>,
    ) -> Round {
        let sse = crate::proxy::is_event_stream(answer.headers());
        match first_token(answer, sse, self.config.first_byte_timeout).await {
            Ok(Held { response, frames }) => Round::Answer(Box::new(Paired {
                attempt: d,
                response,
                held: frames,
                prefill: Some(prefill),
            })),
            Err(why) => {
                self.broken(&d.worker, &why);
                Round::Failed {
                    why: format!("decode worker `{}`: {why}", d.worker.id()),
                    prefill: None,
                }
            }
        }
    }

    /// A prefill that failed (no usable answer): counted, and its worker (every rank) left
    /// out of the request's next rounds.
    pub(super) fn prefill_failed(&self, p: &Attempt, why: &str) -> Round {
        let retries = &self.metrics.disaggregation.retries;
        retries.with_label_values(&["prefill", "failed"]).inc();
        Round::Failed {
            why: format!("prefill worker `{}`: {why}", p.worker.id()),
            prefill: Some(p.admitted.worker()),
        }
    }
}

/// Whether `e` is the answer of `RouteError::NoWorker`.
fn is_no_worker(e: &ApiError) -> bool {
    e.code == ApiError::no_worker().code
}

/// A prefill answer's body, within `wait` and [`MAX_PREFILL_ANSWER`].
pub(super) async fn read_answer(body: Incoming, wait: Duration) -> Result<Bytes, String> {
    let limited = http_body_util::Limited::new(body, MAX_PREFILL_ANSWER);
    match tokio::time::timeout(wait, limited.collect()).await {
        Err(_) => Err(format!("no complete answer within {wait:?}")),
        Ok(Err(e)) => Err(format!("its answer broke off: {e}")),
        Ok(Ok(b)) => Ok(b.to_bytes()),
    }
}

/// A body the hand-off could not write (the client's request): 400.
pub(super) fn body_error(e: BodyError) -> ApiError {
    ApiError::invalid(e.to_string(), None)
}
