//! The one home of sending a routed request: [`Dispatcher::dispatch`] takes the request's
//! [`Route`] (its eligible workers, whole or as pairs, and its analysis) and the bytes to send,
//! and returns the answer for the client ([`Dispatched`]) — a whole request through the
//! proxy's retries (`whole`), a disaggregated one through prefill/decode rounds in its model's
//! hand-off protocol (`pair`, `vllm`, `sglang`).
//!
//! Every send goes through [`Dispatcher::send`], which classifies what came back
//! ([`outcome::classify`]) and charges it to the worker ([`outcome::account`]); every answer
//! that breaks off after its head is charged through [`Dispatcher::broken`] (for a streamed
//! answer, by the observer wrapper [`Charged`] the client's body carries). So the breaker,
//! passive health and `kvroute_upstream_errors_total` learn of an attempt in this module only.

mod pair;
mod pieces;
mod sglang;
mod vllm;
mod whole;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use hyper::body::Incoming;

use super::handoff::Protocol;
use super::outcome::{self, Failure, Outcome, WorkerFault};
use super::{End, ProxyConfig, ResponseObserver, Upstream, headers};
use crate::fleet::Worker;
use crate::metrics::Metrics;
use crate::openai::ApiError;
use crate::routing::{Analysis, Attempt, Decider, Eligible, Plan, Session};

pub use pieces::PromptPieces;

/// How a request is to be sent: decided up to the choice of its worker.
pub struct Route {
    /// The workers that may serve it, and whether as a prefill/decode pair.
    pub eligible: Eligible,
    /// Its prompt's analysis (load-only when not routed on the prompt).
    pub analysis: Analysis,
    /// When its decision began.
    pub started: Instant,
    /// Its model's hand-off protocol (used when `eligible` is a pair plan).
    pub protocol: Protocol,
    /// Its prompt's token ids when it may go to its worker in prefix pieces first (a whole
    /// request's first attempt; `proxy.prefill_piece_tokens`).
    pub pieces: Option<PromptPieces>,
}

/// What is sent to the worker: the method, the path and query, the client's headers (made
/// the upstream request's headers once, in [`Dispatcher::dispatch`]) and the body.
pub struct Outbound<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path and query.
    pub target: &'a str,
    /// The headers sent (hop-by-hop ones gone, this router's hop stamped).
    headers: HeaderMap,
}

/// The answer for the client: the attempt that answered and its response, with what was read
/// of it already (a decode held until its first token), and the prefill worker of a pair.
pub struct Dispatched {
    /// The attempt whose answer the client gets.
    pub attempt: Attempt,
    /// Its response; the body continues after `held`.
    pub response: Response<Incoming>,
    /// Frames read from `response` while waiting for a decode's first token.
    pub held: Vec<Bytes>,
    /// The prefill worker of the hand-off that answered (`None` for a whole request, or when
    /// a prefill's own error answer goes to the client).
    pub prefill: Option<Arc<Worker>>,
    /// Charges the answering worker if its body breaks off (see [`Charge::watching`]).
    pub charge: Charge,
}

/// Sends routed requests: the upstream client, the decision core for each attempt, the
/// metrics and the index clock, with the proxy settings of the moment it was made.
pub struct Dispatcher<'a> {
    upstream: &'a Upstream,
    decider: &'a Decider,
    metrics: &'a Arc<Metrics>,
    clock: &'a (dyn Fn() -> Duration + Sync),
    /// Read once: a reload applies from the next request on.
    config: Arc<ProxyConfig>,
}

impl<'a> Dispatcher<'a> {
    /// A dispatcher over `upstream`, choosing with `decider` on the index clock `clock`.
    pub fn new(
        upstream: &'a Upstream,
        decider: &'a Decider,
        metrics: &'a Arc<Metrics>,
        clock: &'a (dyn Fn() -> Duration + Sync),
    ) -> Dispatcher<'a> {
        Dispatcher {
            upstream,
            decider,
            metrics,
            clock,
            config: upstream.config(),
        }
    }

    /// Sends `body` (`method` to `target` with the client's `headers`) on `route`, retrying
    /// before anything reached the client, and returns the answer for it.
    pub async fn dispatch(
        &self,
        route: Route,
        (method, target, headers): (&Method, &str, &HeaderMap),
        body: Bytes,
    ) -> Result<Dispatched, ApiError> {
        let mut out = Outbound {
            method,
            target,
            headers: headers::upstream_request_headers(headers),
        };
        self.upstream.hop.stamp(&mut out.headers);
        let (attempt, response, held, prefill) = match route.eligible.plan {
            Plan::Pair => {
                let p = self.pair(&route, &out, body).await?;
                (p.attempt, p.response, p.held, p.prefill)
            }
            Plan::Whole => {
                let mut session = Session::new(
                    self.decider,
                    self.metrics,
                    route.eligible.workers,
                    route.analysis,
                    self.clock,
                    route.started,
                );
                let pieces = route.pieces.as_ref();
                let (a, r) = self.with_retries(&out, &body, &mut session, pieces).await?;
                (a, r, Vec::new(), None)
            }
        };
        let charge = Charge {
            worker: Arc::clone(&attempt.worker),
            metrics: Arc::clone(self.metrics),
        };
        Ok(Dispatched {
            attempt,
            response,
            held,
            prefill,
            charge,
        })
    }

    /// Sends `body` once to `attempt`'s worker and charges the worker what came of it: the
    /// only send of this module, so every attempt is classified and accounted alike.
    async fn send(
        &self,
        attempt: &Attempt,
        out: &Outbound<'_>,
        body: Bytes,
    ) -> Result<Response<Incoming>, Failure> {
        let wait = self.config.first_byte_timeout;
        let sent = (self.upstream)
            .send(attempt, out.method, out.target, &out.headers, body, wait)
            .await;
        let (outcome, message) = match &sent {
            Ok(_) => (Outcome::Answered, String::new()),
            Err(failure) => {
                let (fault, message) = failure.fault();
                (Outcome::Failed(fault), message)
            }
        };
        outcome::account(&attempt.worker, outcome, &message, self.metrics, now());
        sent
    }

    /// Charges `worker` an answer that broke off or was unusable after its head (`why`).
    fn broken(&self, worker: &Worker, why: &str) {
        broken(worker, why, self.metrics);
    }

    /// Takes one retry from the retry budget; false (and counted) when recent traffic allows
    /// none.
    fn may_retry(&self) -> bool {
        let granted = self.upstream.budget.try_retry();
        if !granted {
            self.metrics.retries_denied.inc();
            tracing::warn!("retry budget exhausted; not retrying");
        }
        granted
    }
}

fn now() -> Instant {
    Instant::now()
}

fn broken(worker: &Worker, why: &str, metrics: &Metrics) {
    let broken = Outcome::Failed(WorkerFault::BrokenAnswer);
    outcome::account(worker, broken, why, metrics, now());
}

/// A worker's failure as the client's error: 502, naming the worker.
fn upstream_error(worker: &Worker, message: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "upstream_error",
        Some("upstream_unavailable"),
        format!("worker `{}` failed: {message}", worker.id()),
    )
}

/// What charges the worker whose answer the client gets when that answer breaks off.
pub struct Charge {
    worker: Arc<Worker>,
    metrics: Arc<Metrics>,
}

impl Charge {
    /// `observer`, with the worker charged a broken answer when the body ends with
    /// [`End::UpstreamError`] (before `observer` learns the end).
    pub fn watching<O: ResponseObserver>(self, observer: O) -> Charged<O> {
        Charged {
            charge: self,
            inner: observer,
        }
    }
}

/// A response observer that charges the worker a broken stream (see [`Charge::watching`]).
pub struct Charged<O> {
    charge: Charge,
    inner: O,
}

impl<O: ResponseObserver> ResponseObserver for Charged<O> {
    fn first_token(&mut self) {
        self.inner.first_token();
    }

    fn end(&mut self, end: End, bytes: u64) {
        if end == End::UpstreamError {
            let Charge { worker, metrics } = &self.charge;
            broken(worker, "its response broke off", metrics);
        }
        self.inner.end(end, bytes);
    }

    fn data(&mut self, chunk: &[u8]) {
        self.inner.data(chunk);
    }

    fn response_id(&mut self, id: String) {
        self.inner.response_id(id);
    }
}
