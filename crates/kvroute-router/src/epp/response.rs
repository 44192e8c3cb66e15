//! The response phase of one request: the gateway reports the endpoint that served
//! (`envoy.lb` → `x-gateway-destination-endpoint-served`), the head and the body as they come
//! from the worker. The load and the breaker go to the endpoint that served; the body's first
//! token and end are observed as `serve` observes a proxied body (`proxy::ObservedBody`): the
//! first content-bearing SSE event (or a plain body's end) is the first token, an in-band
//! error event makes the end a stream error, a stream the gateway resets is a cancellation.

use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, ProcessingRequest};
use http::StatusCode;
use tonic::{Status, Streaming};

use super::channel::{Modes, Out};
use super::metadata::{self, Headers};
use super::protocol::{self, header};
use crate::proxy::first_token::FirstTokenDetector;
use crate::proxy::{End, ResponseObserver};
use crate::server::WORKER_HEADER;
use crate::server::gateway::{Picked, Served};

/// A response being observed.
struct Watch {
    served: Served,
    /// `Some` for an event stream.
    detector: Option<FirstTokenDetector>,
    first_token: bool,
    bytes: u64,
    /// Its end was recorded.
    ended: bool,
}

impl Watch {
    fn chunk(&mut self, chunk: &[u8]) {
        self.bytes += chunk.len() as u64;
        self.served.data(chunk);
        if let Some(d) = self.detector.as_mut()
            && d.feed(chunk)
        {
            self.mark_first_token();
        }
    }

    fn mark_first_token(&mut self) {
        if !std::mem::replace(&mut self.first_token, true) {
            self.served.first_token();
        }
    }

    /// The body ended whole: a plain body's first token is its end.
    fn complete(mut self) {
        self.mark_first_token();
        let end = if self.detector.as_ref().is_some_and(|d| d.error_seen()) {
            End::StreamError
        } else {
            End::Complete
        };
        self.ended = true;
        self.served.end(end, self.bytes);
    }
}

/// A watch dropped before the body's end — the gateway went away (client gone, upstream
/// reset; the stream dropped or its requests ended), or the exchange broke — is a
/// cancellation.
impl Drop for Watch {
    fn drop(&mut self) {
        if !self.ended {
            self.served.end(End::Cancelled, self.bytes);
        }
    }
}

/// Observes the response of `picked` and answers the gateway in order.
pub(super) async fn phase(
    mut picked: Picked,
    modes: Modes,
    inbound: &mut Streaming<ProcessingRequest>,
    out: &Out,
) -> Result<(), Status> {
    let message = match inbound.message().await {
        Ok(Some(m)) => m,
        // Reset before the head (the gateway could not reach any endpoint, or the client
        // left): dropping the pick releases its admission and load.
        Ok(None) | Err(_) => return Ok(()),
    };
    if let Some(at) = metadata::served(message.metadata_context.as_ref()) {
        picked.served_by(&at);
    }
    let head = match message.request {
        Some(Request::ResponseHeaders(h)) => h,
        _ => return Err(Status::invalid_argument("expected the response headers")),
    };
    let headers = Headers::of(head.headers.as_ref());
    let status = headers
        .status
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let sse = crate::proxy::is_event_stream(&headers.map);
    let worker = picked.attempt.worker.id().to_owned();
    let watch = Watch {
        served: picked.observe(status, sse),
        detector: sse.then(FirstTokenDetector::default),
        first_token: false,
        bytes: 0,
        ended: false,
    };
    let set = vec![header(WORKER_HEADER, worker.as_bytes())];
    out.send(protocol::response_headers(set)).await;
    if head.end_of_stream {
        watch.complete();
        return Ok(());
    }
    body(watch, modes, inbound, out).await
}

/// The response body up to its end (or trailers), each chunk streamed back unchanged.
async fn body(
    mut watch: Watch,
    modes: Modes,
    inbound: &mut Streaming<ProcessingRequest>,
    out: &Out,
) -> Result<(), Status> {
    loop {
        let request = match inbound.message().await {
            Ok(Some(m)) => m.request,
            // Dropping the watch records the cancellation.
            Ok(None) | Err(_) => return Ok(()),
        };
        match request {
            Some(Request::ResponseBody(HttpBody {
                body,
                end_of_stream,
                ..
            })) => {
                watch.chunk(&body);
                let answers = if modes.response_full_duplex {
                    protocol::body_chunks(&body, end_of_stream, false)
                } else {
                    vec![protocol::body_unchanged(false)]
                };
                for a in answers {
                    out.send(a).await;
                }
                if end_of_stream {
                    watch.complete();
                    return Ok(());
                }
            }
            Some(Request::ResponseTrailers(_)) => {
                out.send(protocol::trailers_unchanged(false)).await;
                watch.complete();
                return Ok(());
            }
            _ => {
                return Err(Status::invalid_argument(
                    "expected the response body or trailers",
                ));
            }
        }
    }
}
