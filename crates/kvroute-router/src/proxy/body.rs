//! The response body on its way from a worker to the client.
//!
//! Frames are passed on the moment they arrive (no buffering of SSE). On the way the body
//! notices the first token and the end, and reports both to a [`ResponseObserver`]: that is
//! where load is released and TTFT recorded. If the client hangs up, hyper drops this body,
//! which drops the upstream body and so closes the upstream connection: the engine sees the
//! disconnect and aborts the request, and the observer learns it was cancelled. When the
//! router's shutdown grace ends with the response still running, the body is cut: a stream
//! ends with the same SSE error event as when a worker dies, so clients raise instead of
//! seeing a bare close.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep, sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::first_token::FirstTokenDetector;
use super::response_id::ResponseIdScanner;

/// How a proxied response ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The worker sent the whole body.
    Complete,
    /// The worker's stream broke off; the client got what had arrived (plus an SSE error
    /// event for streams).
    UpstreamError,
    /// The client went away first.
    Cancelled,
    /// The worker sent the whole stream, but ended it with an in-band error event (a 200
    /// whose generation failed).
    StreamError,
    /// The router's shutdown grace ended first; the client got an SSE error event for streams.
    Shutdown,
}

/// Receives the milestones of one proxied response.
pub trait ResponseObserver: Send + 'static {
    /// The first generated token passed through.
    fn first_token(&mut self);
    /// The response ended, after `bytes` of body reached the client; called exactly once.
    fn end(&mut self, end: End, bytes: u64);
    /// A chunk of the worker's body passed through (for observers that read it, such as the
    /// trace recorder's output-token count).
    fn data(&mut self, _chunk: &[u8]) {}
    /// The body named the Responses API response it is (see
    /// [`ObservedBody::learn_response_id`]); called at most once, before the bytes that carry
    /// the id reach the client.
    fn response_id(&mut self, _id: String) {}
}

/// Errors a proxied body can end with.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// How long a response may stay silent, and how long it may take in all.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BodyTimeouts {
    /// Longest gap between two chunks (and before the first).
    pub idle: Duration,
    /// Longest the whole body may take.
    pub total: Duration,
}

/// A worker's response body, observed on its way to the client.
pub struct ObservedBody<O: ResponseObserver> {
    inner: Incoming,
    timeouts: BodyTimeouts,
    idle: Pin<Box<Sleep>>,
    deadline: Pin<Box<Sleep>>,
    /// `Some` for SSE streams; a plain body's first token is its end.
    detector: Option<FirstTokenDetector>,
    observer: O,
    first_token_seen: bool,
    ended: bool,
    /// Body bytes passed to the client.
    bytes: u64,
    /// Resolves when the shutdown grace is over (see [`ObservedBody::cut_on`]).
    cutoff: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
    /// Looks for the response's id, when asked to.
    ids: Option<ResponseIdScanner>,
    /// Frames already read from `inner` (a decode answer held until its first token), passed
    /// on before it.
    held: std::collections::VecDeque<Bytes>,
}

impl<O: ResponseObserver> ObservedBody<O> {
    /// Wraps `inner`; `sse` selects first-token detection on SSE events.
    pub fn new(inner: Incoming, sse: bool, timeouts: BodyTimeouts, observer: O) -> Self {
        ObservedBody {
            inner,
            timeouts,
            idle: Box::pin(sleep(timeouts.idle)),
            deadline: Box::pin(sleep(timeouts.total)),
            detector: sse.then(FirstTokenDetector::default),
            observer,
            first_token_seen: false,
            ended: false,
            bytes: 0,
            cutoff: None,
            ids: None,
            held: std::collections::VecDeque::new(),
        }
    }

    /// Passes `frames` (already read from the body) on first, observed like the rest.
    pub fn with_held(mut self, frames: Vec<Bytes>) -> Self {
        self.held = frames.into();
        self
    }

    /// Observes one chunk passing to the client.
    fn pass(&mut self, data: &Bytes) {
        self.bytes += data.len() as u64;
        self.observer.data(data);
        if let Some(d) = self.detector.as_mut()
            && d.feed(data)
        {
            self.mark_first_token();
        }
        if let Some(id) = self.ids.as_mut().and_then(|s| s.feed(data)) {
            self.observer.response_id(id);
        }
    }

    /// Reports the id of the Responses API response in the body (a JSON body's `id`, a
    /// stream's `response.id`) to the observer.
    pub fn learn_response_id(mut self) -> Self {
        self.ids = Some(ResponseIdScanner::new(self.detector.is_some()));
        self
    }

    /// Cuts the response when `token` is cancelled (the router's shutdown grace is over).
    pub fn cut_on(mut self, token: CancellationToken) -> Self {
        self.cutoff = Some(Box::pin(token.cancelled_owned()));
        self
    }

    fn mark_first_token(&mut self) {
        if !self.first_token_seen {
            self.first_token_seen = true;
            self.observer.first_token();
        }
    }

    fn finish(&mut self, end: End) {
        if !self.ended {
            self.ended = true;
            let end = match end {
                End::Complete if self.detector.as_ref().is_some_and(|d| d.error_seen()) => {
                    End::StreamError
                }
                other => other,
            };
            self.observer.end(end, self.bytes);
        }
    }

    /// Ends the response after an upstream failure: a stream gets an SSE error event (so SDKs
    /// raise instead of waiting), a plain body an error (the client sees a broken response).
    fn fail(&mut self, why: String) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.end_with(End::UpstreamError, stream_error_event(&why), why)
    }

    /// Ends the response with `event` for a stream, or an error for a plain body.
    fn end_with(
        &mut self,
        end: End,
        event: Bytes,
        why: String,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if self.detector.is_some() {
            self.bytes += event.len() as u64;
            self.finish(end);
            Poll::Ready(Some(Ok(Frame::data(event))))
        } else {
            self.finish(end);
            Poll::Ready(Some(Err(why.into())))
        }
    }
}

/// The SSE event a client receives when the worker's stream breaks off, in the OpenAI error
/// shape so SDKs raise it rather than hang.
pub fn stream_error_event(message: &str) -> Bytes {
    let body = serde_json::json!({"error": {
        "message": message,
        "type": "upstream_error",
        "param": null,
        "code": "upstream_stream_error",
    }});
    Bytes::from(format!("data: {body}\n\n"))
}

/// The SSE event a client receives when its stream is cut because the router's shutdown grace
/// ended: the same shape as [`stream_error_event`], a code of its own.
pub fn shutdown_event() -> Bytes {
    let body = serde_json::json!({"error": {
        "message": SHUTDOWN_MESSAGE,
        "type": "service_unavailable",
        "param": null,
        "code": "router_shutting_down",
    }});
    Bytes::from(format!("data: {body}\n\n"))
}

const SHUTDOWN_MESSAGE: &str =
    "the router is shutting down and its grace period is over; the stream was cut";

impl<O: ResponseObserver + Unpin> Body for ObservedBody<O> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if let Some(cut) = this.cutoff.as_mut()
            && cut.as_mut().poll(cx).is_ready()
        {
            tracing::warn!("shutdown grace over; cutting a response still in progress");
            return this.end_with(End::Shutdown, shutdown_event(), SHUTDOWN_MESSAGE.into());
        }
        if let Some(data) = this.held.pop_front() {
            this.pass(&data);
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                let silent = this.idle.as_mut().poll(cx).is_ready();
                let late = this.deadline.as_mut().poll(cx).is_ready();
                if !(silent || late) {
                    return Poll::Pending;
                }
                let why = if late {
                    format!("the worker did not finish within {:?}", this.timeouts.total)
                } else {
                    format!("the worker sent nothing for {:?}", this.timeouts.idle)
                };
                tracing::warn!(reason = %why, "abandoning upstream response");
                this.fail(why)
            }
            Poll::Ready(Some(Ok(frame))) => {
                this.idle
                    .as_mut()
                    .reset(Instant::now() + this.timeouts.idle);
                if let Some(data) = frame.data_ref() {
                    this.pass(data);
                }
                // A body of known length is complete with its last byte; hyper may never
                // poll it again to see the end.
                if this.inner.is_end_stream() {
                    this.mark_first_token();
                    this.finish(End::Complete);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                tracing::warn!(error = %e, "upstream body broke off");
                this.fail(format!("the worker's stream ended unexpectedly: {e}"))
            }
            Poll::Ready(None) => {
                // A plain JSON body carries its tokens all at once: its end is its first token.
                this.mark_first_token();
                this.finish(End::Complete);
                Poll::Ready(None)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.held.is_empty() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.detector.is_some() {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

impl<O: ResponseObserver> Drop for ObservedBody<O> {
    fn drop(&mut self) {
        self.finish(End::Cancelled);
    }
}
