//! Talking to workers: the pooled upstream client, one send to one worker ([`Upstream`]),
//! forwarding with retries before the first byte, whole or as a prefill/decode pair
//! ([`dispatch`]), and the observed response body.
//!
//! A request is retried only while nothing has reached the client, and only on a failure that
//! says something about the worker: a failed connection, an error or timeout before the
//! response head, or a 502/503/504 head (whose body is discarded). Those are charged to the
//! worker's circuit breaker. Any other answer, a 500 included, is the request's own: an engine
//! that answers 500 to one prompt answers it on every worker, so retrying it would only charge
//! every worker it reaches, and one client's requests could open every circuit of a model. It
//! goes to the client as it is. Once a response is handed to the client it is never replayed,
//! so a client never sees output twice.

pub mod body;
pub mod dispatch;
pub mod first_token;
pub mod handoff;
pub mod headers;
pub mod hops;
pub mod members;
pub mod outcome;
pub mod output_tokens;
pub mod response_id;
pub mod retry_budget;
pub mod stream_events;
pub mod usage;

use crate::tls::upstream::WorkerConnector;
use crate::tls::{self, TlsError, UpstreamTls};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tracing::{Instrument, field};

use crate::fleet::DP_RANK_HEADER;
use crate::routing::Attempt;
use crate::telemetry::{self, TARGET as TRACE};

pub use body::{BodyTimeouts, End, ObservedBody, ResponseObserver};
pub use hops::{HopId, VIA_HEADER};
pub use outcome::{Failure, Outcome, WorkerFault, charges_worker};
pub use retry_budget::{RetryBudget, RetryBudgetConfig};

/// Proxy settings.
#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// Time allowed to open a TCP connection to a worker.
    pub connect_timeout: Duration,
    /// Time allowed from sending the request to the response head.
    pub first_byte_timeout: Duration,
    /// How many times a request may be sent again to another worker.
    pub retries: u32,
    /// Idle pooled connections kept per worker.
    pub pool_max_idle_per_host: usize,
    /// Longest silence between two chunks of a response before it is abandoned.
    pub idle_timeout: Duration,
    /// Longest a whole response may take.
    pub total_timeout: Duration,
    /// How many retries recent traffic allows.
    pub retry_budget: RetryBudgetConfig,
    /// How `https://` workers are reached (`[proxy.tls]`).
    pub tls: UpstreamTls,
    /// A prompt needing at least two pieces of this many tokens beyond what its worker holds
    /// is sent in prefix pieces first (`dispatch::pieces`); 0: every prompt whole.
    pub prefill_piece_tokens: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            connect_timeout: Duration::from_secs(2),
            first_byte_timeout: Duration::from_secs(600),
            retries: 1,
            pool_max_idle_per_host: 256,
            idle_timeout: Duration::from_secs(300),
            total_timeout: Duration::from_secs(3600),
            retry_budget: RetryBudgetConfig::default(),
            tls: UpstreamTls::default(),
            prefill_piece_tokens: 0,
        }
    }
}

/// The pooled HTTP/1.1 client to the workers.
#[derive(Clone)]
pub struct Upstream {
    client: Client<WorkerConnector, Full<Bytes>>,
    /// The settings; a config reload swaps in new timeouts and retries ([`Upstream::retune`]),
    /// which every clone sees from its next request on.
    config: Arc<ArcSwap<ProxyConfig>>,
    budget: Arc<RetryBudget>,
    /// This router's id in the hop header of what it forwards.
    hop: HopId,
}

impl Upstream {
    /// A client with `config`; fails when its TLS files cannot be used.
    pub fn new(config: ProxyConfig) -> Result<Upstream, TlsError> {
        let connector = tls::upstream::connector(&config.tls, config.connect_timeout)?;
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(config.pool_max_idle_per_host)
            .build(connector);
        let budget = Arc::new(RetryBudget::new(config.retry_budget));
        Ok(Upstream {
            client,
            config: Arc::new(ArcSwap::from_pointee(config)),
            budget,
            hop: HopId::random(),
        })
    }

    /// This router's id in the hop header (see [`hops`]).
    pub fn hop(&self) -> &HopId {
        &self.hop
    }

    /// The settings now.
    pub fn config(&self) -> Arc<ProxyConfig> {
        self.config.load_full()
    }

    /// Applies reloaded settings: the timeouts, the retries and the retry budget, from the
    /// next request on (a request in flight keeps the ones it started with). The connection
    /// settings (`connect_timeout`, the pool, TLS) are the client's own and need a restart;
    /// they are kept as they were.
    pub fn retune(&self, new: &ProxyConfig) {
        let old = self.config.load_full();
        self.budget.set_config(new.retry_budget);
        self.config.store(Arc::new(ProxyConfig {
            connect_timeout: old.connect_timeout,
            pool_max_idle_per_host: old.pool_max_idle_per_host,
            tls: old.tls.clone(),
            ..new.clone()
        }));
    }

    /// Sends the request to `attempt`'s worker, pinned to its data-parallel rank if it has one.
    async fn send(
        &self,
        attempt: &Attempt,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        body: Bytes,
        first_byte_timeout: Duration,
    ) -> Result<Response<Incoming>, Failure> {
        let (worker, rank) = (&attempt.worker, attempt.pinned());
        let mut req = Request::builder()
            .method(method.clone())
            .uri(worker.spec.url.join(path))
            .body(Full::new(body))
            .map_err(|e| Failure::Connect(e.to_string()))?;
        *req.headers_mut() = headers.clone();
        if let Ok(host) = HeaderValue::from_str(worker.spec.url.host_header()) {
            req.headers_mut().insert(http::header::HOST, host);
        }
        // The rank is the router's decision: a client's own pin never reaches the engine
        // (on a worker without data parallelism it could only name a rank that is not there).
        req.headers_mut().remove(DP_RANK_HEADER);
        if let Some(rank) = rank {
            req.headers_mut()
                .insert(DP_RANK_HEADER, HeaderValue::from(rank));
        }
        // From sending to the response head: connect (or a pooled connection), send, wait.
        // The worker's own spans are its children.
        let span = tracing::info_span!(
            target: TRACE,
            "upstream_connect",
            otel.kind = "client",
            worker = worker.id(),
            status = field::Empty,
        );
        telemetry::propagate(&span, req.headers_mut());
        let sent = tokio::time::timeout(first_byte_timeout, self.client.request(req));
        let sent = sent.instrument(span.clone()).await;
        if let Ok(Ok(resp)) = &sent {
            span.record("status", resp.status().as_u16());
        }
        outcome::classify(sent, first_byte_timeout)
    }
}

/// An error and its sources on one line, as the router reports upstream failures (the bench
/// client reports its own the same way).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(src) = cur {
        s.push_str(": ");
        s.push_str(&src.to_string());
        cur = src.source();
    }
    s
}

/// Whether a response is an SSE stream (by its content type).
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}
