//! An SGLang pair's round: one prefill and one decode worker, both sent the request at once
//! with the prefill's bootstrap address and a fresh room. The prefill's answer is awaited
//! first (as SGLang's gateway does): when it fails, the decode is dropped (its connection
//! closed, which aborts it) and the pair tried again.

use std::sync::Arc;

use http::Response;
use hyper::body::Incoming;

use super::pair::{Paired, Round, Sides, body_error, read_answer};
use super::{Dispatcher, Outbound};
use crate::fleet::{DEFAULT_BOOTSTRAP_PORT, Worker};
use crate::openai::ApiError;
use crate::proxy::handoff::sglang::{Bootstrap, random_room, with_bootstrap};
use crate::proxy::outcome::Failure;
use crate::routing::{Attempt, RouteError};

/// What the prefill and the decode sends came to (the decode's `None`: dropped unsent or
/// unanswered, after its prefill failed).
type Sent = (
    Result<Response<Incoming>, Failure>,
    Option<Result<Response<Incoming>, Failure>>,
);

impl Dispatcher<'_> {
    /// One SGLang round over `sides`.
    pub(super) async fn sglang_round(&self, sides: Sides<'_, '_>) -> Result<Round, ApiError> {
        let Sides {
            out,
            body,
            mut prefill,
            decode,
        } = sides;
        let Some(p) = prefill.next_attempt() else {
            return Err(RouteError::NoWorker.into());
        };
        decode.prefilled_on(&p.worker);
        let Some(d) = decode.next_attempt() else {
            return Err(RouteError::NoWorker.into());
        };
        let picks = &self.metrics.disaggregation.picks;
        picks.with_label_values(&["prefill", p.worker.id()]).inc();
        picks.with_label_values(&["decode", d.worker.id()]).inc();
        let bootstrap = Bootstrap {
            host: bootstrap_host(&p.worker),
            port: (p.worker.spec.bootstrap_port).unwrap_or(DEFAULT_BOOTSTRAP_PORT),
            room: random_room(),
        };
        let body = with_bootstrap(body, &bootstrap).map_err(body_error)?;
        let (prefilled, decoded) = self.send_both(out, body, &p, &d).await;
        let answer = match prefilled {
            Err(failure) => {
                // The decode did nothing wrong: it may pair with another prefill worker.
                decode.forgive(&d.worker);
                return Ok(self.prefill_failed(&p, &failed(&p, &failure)));
            }
            Ok(answer) if !answer.status().is_success() => {
                return Ok(Paired::own_answer(p, answer));
            }
            Ok(answer) => answer,
        };
        let handoffs = &self.metrics.disaggregation.handoffs;
        handoffs.with_label_values(&["sglang", "paired"]).inc();
        let prefill_worker = Arc::clone(&p.worker);
        self.drain_prefill(p, answer);
        let why = match decoded {
            Some(Ok(answer)) => return Ok(self.held_answer(d, answer, prefill_worker).await),
            Some(Err(failure)) => failed(&d, &failure),
            None => ApiError::from(RouteError::NoWorker).message,
        };
        Ok(Round::Failed { why, prefill: None })
    }

    /// Sends `body` to the prefill `p` and the decode `d` at once; the decode's answer is
    /// awaited only once the prefill answered with success (else it is dropped, which aborts
    /// it).
    async fn send_both(
        &self,
        out: &Outbound<'_>,
        body: bytes::Bytes,
        p: &Attempt,
        d: &Attempt,
    ) -> Sent {
        let prefill_sent = self.send(p, out, body.clone());
        let decode_sent = self.send(d, out, body);
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
    }

    /// Reads the prefill's answer to its end (SGLang's gateway reads and drops it) while the
    /// decode streams; its load is held until then. Its time includes the transfer, so it
    /// does not calibrate the prefill model.
    fn drain_prefill(&self, mut p: Attempt, answer: Response<Incoming>) {
        let wait = self.config.first_byte_timeout;
        tokio::spawn(async move {
            let _ = read_answer(answer.into_body(), wait).await;
            p.admitted.first_token();
            p.admitted.finish();
        });
    }
}

/// What a failed send is called in the pair's error (as a whole request's client error says).
fn failed(attempt: &Attempt, failure: &Failure) -> String {
    super::upstream_error(&attempt.worker, &failure.fault().1).message
}

/// The host a decode worker reaches the prefill worker's bootstrap server at: the host of its
/// URL (an IPv6 address without brackets, as SGLang's gateway passes it).
fn bootstrap_host(worker: &Worker) -> String {
    let host = worker.spec.url.authority().host();
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned()
}
