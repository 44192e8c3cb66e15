//! One request (or one side of a pair) sent to the workers its attempts choose, retried on
//! another worker while nothing has reached the client (see the `proxy` module's rules).

use bytes::Bytes;
use http::Response;
use hyper::body::Incoming;
use tracing::field;

use super::{Dispatcher, Outbound, PromptPieces, upstream_error};
use crate::fleet::Side;
use crate::openai::ApiError;
use crate::proxy::outcome::{Failure, WorkerFault};
use crate::routing::{Attempt, Attempts};
use crate::telemetry::TARGET as TRACE;

/// The last failed attempt: the client's error, and the worker's own 502/503/504 answer with
/// its attempt (kept so that, if no retry follows, the client sees the worker's own error).
struct Failed {
    error: ApiError,
    fault: WorkerFault,
    answer: Option<(Attempt, Response<Incoming>)>,
}

impl Dispatcher<'_> {
    /// Sends `body` on workers `session` chooses, retrying on another worker until one
    /// answers, the retries or the retry budget run out, or the session has no worker left.
    /// With `pieces`, the first worker chosen gets the prompt's prefix pieces first.
    ///
    /// Returns the attempt that answered and its response; the caller streams it on.
    pub(super) async fn with_retries(
        &self,
        out: &Outbound<'_>,
        body: &Bytes,
        session: &mut (dyn Attempts + Send),
        pieces: Option<&PromptPieces>,
    ) -> Result<(Attempt, Response<Incoming>), ApiError> {
        self.upstream.budget.record_request();
        let mut last: Option<Failed> = None;
        for attempt_no in 0..=self.config.retries {
            if let Some(failed) = &last
                && !self.retry_after(failed.fault, session.side())
            {
                break;
            }
            let Some(attempt) = decide(session, attempt_no) else {
                break;
            };
            self.count_pick(session.side(), &attempt);
            if let Some(pieces) = pieces.filter(|_| attempt_no == 0) {
                self.send_pieces(&attempt, out, body, pieces).await;
            }
            match self.send(&attempt, out, body.clone()).await {
                Ok(resp) => return Ok((attempt, resp)),
                Err(failure) => last = Some(failed(attempt, failure)),
            }
        }
        match last {
            Some(Failed {
                answer: Some(answer),
                ..
            }) => Ok(answer),
            Some(Failed { error, .. }) => Err(error),
            None => Err(ApiError::no_worker()),
        }
    }

    /// Whether a retry follows an attempt that failed so: one from the budget, counted by the
    /// `fault`'s kind (and the pair's `side`).
    fn retry_after(&self, fault: WorkerFault, side: Option<Side>) -> bool {
        if !self.may_retry() {
            return false;
        }
        let reason = fault.kind();
        self.metrics.retries.with_label_values(&[reason]).inc();
        if let Some(side) = side {
            let retries = &self.metrics.disaggregation.retries;
            retries.with_label_values(&[side.as_str(), reason]).inc();
        }
        true
    }

    /// Counts a pair's pick of `attempt`'s worker for its `side`.
    fn count_pick(&self, side: Option<Side>, attempt: &Attempt) {
        if let Some(side) = side {
            let picks = &self.metrics.disaggregation.picks;
            picks
                .with_label_values(&[side.as_str(), attempt.worker.id()])
                .inc();
        }
    }
}

/// The next attempt of `session`, inside its `decide` span.
fn decide(session: &mut (dyn Attempts + Send), attempt_no: u32) -> Option<Attempt> {
    let decide =
        tracing::info_span!(target: TRACE, "decide", attempt = attempt_no, worker = field::Empty);
    let _in = decide.enter();
    let decided = session.next_attempt();
    if let Some(a) = &decided {
        decide.record("worker", a.worker.id());
    }
    decided
}

/// A failed attempt as [`Failed`]: the attempt (and its admission) dropped now unless its
/// worker's own answer is kept.
fn failed(attempt: Attempt, failure: Failure) -> Failed {
    let (fault, message) = failure.fault();
    let error = upstream_error(&attempt.worker, &message);
    let answer = match failure {
        Failure::Unavailable(resp) => Some((attempt, *resp)),
        _ => None,
    };
    Failed {
        error,
        fault,
        answer,
    }
}
