//! What an attempt's outcome says about its worker, classified and accounted in one place:
//! the worker's circuit breaker, its passive health and `kvroute_upstream_errors_total`.
//!
//! [`classify`] turns what one send came to (a connection error, no head in time, a head)
//! into the answer or the worker's [`Failure`]; [`account`] charges an [`Outcome`]. Only
//! `proxy::dispatch` calls [`account`] — for every send it makes (whole requests, both sides
//! of a pair) and for every answer that broke off after its head (a prefill's answer without
//! its hand-off, a decode that failed before its first token, a stream the worker cut) — so a
//! failure of a given kind costs the worker the same wherever it is seen, and is counted and
//! logged the same way.

use std::time::{Duration, Instant};

use http::{Response, StatusCode};
use hyper::body::Incoming;

use crate::fleet::Worker;
use crate::metrics::Metrics;

/// How a worker failed an attempt (never the request's own answer, a 500 included: see
/// [`charges_worker`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerFault {
    /// The connection failed: the request never left, and the worker is presumed down until
    /// its health check passes.
    Connect,
    /// Sent, but no response head arrived (reset, end of stream, first-byte timeout).
    NoResponse,
    /// A 502, 503 or 504 head: the worker (or a gateway in front of it) cannot serve now.
    Unavailable,
    /// The head came, then the answer broke off or was unusable: a prefill's answer without
    /// its hand-off, a decode that failed before its first token, a stream the worker cut.
    BrokenAnswer,
}

impl WorkerFault {
    /// The `kind` label of `kvroute_upstream_errors_total`.
    pub fn kind(self) -> &'static str {
        match self {
            WorkerFault::Connect => "connect",
            WorkerFault::NoResponse => "no_response",
            WorkerFault::Unavailable => "status_5xx",
            WorkerFault::BrokenAnswer => "broken_answer",
        }
    }
}

/// How an attempt on a worker ended, as far as the worker is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It answered (whatever the status: its answer is the request's own).
    Answered,
    /// It failed so.
    Failed(WorkerFault),
}

/// Why one send failed: each kind is the worker's failure, charged to its breaker and retried
/// elsewhere while the budget allows.
#[derive(Debug)]
pub enum Failure {
    /// Could not connect: the request never left.
    Connect(String),
    /// Sent, but no response head arrived (reset, end of stream, timeout).
    NoResponse(String),
    /// The worker (or a gateway in front of it) answered 502, 503 or 504: it cannot serve now.
    Unavailable(Box<Response<Incoming>>),
}

impl Failure {
    /// The worker's fault, and what happened (for the log and the client's error).
    pub fn fault(&self) -> (WorkerFault, String) {
        match self {
            Failure::Connect(e) => (WorkerFault::Connect, e.clone()),
            Failure::NoResponse(e) => (WorkerFault::NoResponse, e.clone()),
            Failure::Unavailable(r) => {
                (WorkerFault::Unavailable, format!("answered {}", r.status()))
            }
        }
    }
}

/// Whether an answer with `status` is the worker's failure rather than the request's own
/// answer: 502 Bad Gateway, 503 Service Unavailable and 504 Gateway Timeout say the worker
/// cannot serve now; a 500 or any other status is what this request got.
pub fn charges_worker(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// What one send came to: `sent` is the client's result within `first_byte_timeout` (`Err`:
/// the time ran out). A response head is the answer unless [`charges_worker`] says otherwise.
pub fn classify(
    sent: Result<
        Result<Response<Incoming>, hyper_util::client::legacy::Error>,
        tokio::time::error::Elapsed,
    >,
    first_byte_timeout: Duration,
) -> Result<Response<Incoming>, Failure> {
    match sent {
        Err(_) => Err(Failure::NoResponse(format!(
            "no response within {first_byte_timeout:?}"
        ))),
        Ok(Err(e)) if e.is_connect() => Err(Failure::Connect(super::error_chain(&e))),
        Ok(Err(e)) => Err(Failure::NoResponse(super::error_chain(&e))),
        Ok(Ok(resp)) if charges_worker(resp.status()) => Err(Failure::Unavailable(Box::new(resp))),
        Ok(Ok(resp)) => Ok(resp),
    }
}

/// Charges `outcome` to `worker` at `now`: an answer is a success for its breaker; a failure
/// counts against it (logged when that opens the circuit), is counted in
/// `kvroute_upstream_errors_total{worker, kind}` and logged with `detail`, and a failed
/// connection marks the worker down. Returns whether its circuit opened.
pub fn account(
    worker: &Worker,
    outcome: Outcome,
    detail: &str,
    metrics: &Metrics,
    now: Instant,
) -> bool {
    let fault = match outcome {
        Outcome::Answered => {
            worker.record_success(now);
            return false;
        }
        Outcome::Failed(fault) => fault,
    };
    let opened = worker.record_failure(now);
    if opened {
        tracing::warn!(worker = %worker.id(), "circuit opened: too many of its recent requests failed");
    }
    let kind = fault.kind();
    metrics
        .upstream_errors
        .with_label_values(&[worker.id(), kind])
        .inc();
    tracing::warn!(worker = %worker.id(), kind, detail, "attempt failed");
    if fault == WorkerFault::Connect {
        // Passive health: the health check brings it back once it answers.
        worker.set_healthy(false);
    }
    opened
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::{BaseUrl, Role, WorkerId, WorkerSpec};

    #[test]
    fn every_fault_is_charged_counted_and_only_a_connect_failure_marks_the_worker_down() {
        let spec = WorkerSpec {
            id: "w".into(),
            url: BaseUrl::parse("http://h:1").unwrap(),
            models: vec!["m".into()],
            kv_events: None,
            kv_replay: None,
            kv_blocks: None,
            data_parallel_size: 1,
            role: Role::Both,
            bootstrap_port: None,
        };
        let worker = Worker::new(spec, WorkerId(0));
        let metrics = Metrics::new();
        let count = |kind: &str| {
            metrics
                .upstream_errors
                .with_label_values(&["w", kind])
                .get()
        };
        let now = Instant::now();
        account(&worker, Outcome::Answered, "", &metrics, now);
        let broken = Outcome::Failed(WorkerFault::BrokenAnswer);
        account(&worker, broken, "cut", &metrics, now);
        assert_eq!(count("broken_answer"), 1);
        assert!(
            worker.is_healthy(),
            "an answer that broke off is no sign of a dead worker"
        );
        account(
            &worker,
            Outcome::Failed(WorkerFault::Connect),
            "refused",
            &metrics,
            now,
        );
        assert_eq!(count("connect"), 1);
        assert!(!worker.is_healthy());
        assert_eq!(count("status_5xx") + count("no_response"), 0);
    }
}
