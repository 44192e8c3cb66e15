//! One `ext_proc` stream: one HTTP request through the gateway, in Envoy's order — request
//! headers, body chunks (or trailers) up to its end, then the response's headers, body chunks
//! and trailers — answered in the same order, as `FULL_DUPLEX_STREAMED` requires.
//!
//! The request body is fed, chunk by chunk as it arrives, to `server::gateway::pick`, which
//! reads it exactly as `serve` reads a body (size and time limits, the body budget) after
//! admitting the request; when the pick is made the headers answer (the destination) goes
//! back, then the body as the worker must get it. A pick that fails — before the body ended
//! (a 413, a 429 from admission) or after — is answered with an `ImmediateResponse`. A stream
//! the gateway resets at any point drops the request: its admission and load are released.
//!
//! The picker ends its side of a stream only once the gateway has ended its own (or after
//! [`HALF_CLOSE_WAIT`]), as GIE's reference picker returns from `Process` only when `Recv`
//! reports the end. Ending first makes h2 reset the stream (`RST_STREAM(NO_ERROR)`), and each
//! frame the gateway sends after that reset — its own end of stream, usually — counts as a
//! locally reset stream; at 1,024 of those on one connection h2 closes it (`GOAWAY
//! ENHANCE_YOUR_CALM`), failing every request on it. A gateway keeps one connection for
//! thousands of requests, so that was a matter of time.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessor;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpHeaders, ProcessingRequest};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::channel::{Answers, Out, modes};
use super::metadata::{self, Headers};
use super::protocol::{self, header};
use super::response;
use crate::openai::ApiError;
use crate::server::AppState;
use crate::server::gateway::{self, GatewayRequest, Picked};

/// Largest gRPC message taken from the gateway (a body chunk is at most what the gateway
/// buffers, 64 KiB for Envoy; a header list is smaller).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// How long a finished conversation waits for the gateway to end its side of the stream before
/// ending it anyway (Envoy ends it as soon as the request is over).
pub const HALF_CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The ext_proc service.
pub struct Picker {
    state: Arc<AppState>,
    /// Most fallback endpoints named after a pick.
    fallbacks: usize,
}

impl Picker {
    /// A picker over `state`'s fleet and decision core, naming up to `fallbacks` endpoints
    /// after each pick.
    pub fn new(state: Arc<AppState>, fallbacks: usize) -> Picker {
        Picker { state, fallbacks }
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = Answers;

    /// The answers stream drives the conversation itself (see [`channel`](super::channel)).
    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Answers>, Status> {
        let inbound = request.into_inner();
        let (state, fallbacks) = (Arc::clone(&self.state), self.fallbacks);
        let answers =
            Answers::new(move |out| async move { converse(state, fallbacks, inbound, &out).await });
        Ok(tonic::Response::new(answers))
    }
}

/// The whole conversation of one request; a finished one waits for the gateway's end of the
/// stream before ending its own (see the module's notes).
async fn converse(
    state: Arc<AppState>,
    fallbacks: usize,
    mut inbound: Streaming<ProcessingRequest>,
    out: &Out,
) -> Result<(), Status> {
    let ended = exchange(state, fallbacks, &mut inbound, out).await;
    if ended.is_ok() {
        // Whatever the gateway still sends is past the request (a body it kept sending after
        // an early answer): read and dropped.
        let _ = tokio::time::timeout(HALF_CLOSE_WAIT, async {
            while let Ok(Some(_)) = inbound.message().await {}
        })
        .await;
    }
    ended
}

/// The request's messages and their answers, in order.
async fn exchange(
    state: Arc<AppState>,
    fallbacks: usize,
    inbound: &mut Streaming<ProcessingRequest>,
    out: &Out,
) -> Result<(), Status> {
    let Some(first) = inbound.message().await? else {
        return Ok(());
    };
    let modes = modes(&first)?;
    let subset = metadata::subset(first.metadata_context.as_ref());
    let Some(Request::RequestHeaders(head)) = first.request else {
        return Err(Status::invalid_argument(
            "a stream must begin with the request headers",
        ));
    };
    let wanted = Wanted { subset, fallbacks };
    let Some((picked, ending)) = request_phase(&state, head, wanted, inbound, out).await? else {
        return Ok(());
    };
    send_pick(&picked, ending, out).await;
    response::phase(picked, modes, inbound, out).await
}

/// How the request's body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// There was none (the headers ended the request).
    NoBody,
    /// Its last chunk said so.
    Body,
    /// Trailers followed it.
    Trailers,
}

/// What the gateway may be sent to: the endpoints its subset hint permits (`None`: any) and
/// how many fallbacks to name after the pick.
struct Wanted {
    subset: Option<Vec<String>>,
    fallbacks: usize,
}

/// Reads the request up to its end and picks; `None` when the stream is over (answered
/// immediately, or reset).
async fn request_phase(
    state: &Arc<AppState>,
    head: HttpHeaders,
    wanted: Wanted,
    inbound: &mut Streaming<ProcessingRequest>,
    out: &Out,
) -> Result<Option<(Picked, Ending)>, Status> {
    let headers = Headers::of(head.headers.as_ref());
    let method = headers
        .method
        .as_deref()
        .and_then(|m| http::Method::from_bytes(m.as_bytes()).ok())
        .unwrap_or(http::Method::POST);
    let request = GatewayRequest {
        method,
        path: headers.path.unwrap_or_else(|| "/".to_owned()),
        headers: headers.map,
    };
    let (body_tx, body_rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let body = if head.end_of_stream {
        Body::empty()
    } else {
        Body::from_stream(futures_util::stream::unfold(body_rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (chunk, rx))
        }))
    };
    let allowed = |w: &crate::fleet::Worker| {
        wanted
            .subset
            .as_ref()
            .is_none_or(|s| metadata::allows(s, &gateway::endpoint(w)))
    };
    // Polled beside the body's feed on this stream's own task: no task of its own.
    let pick = gateway::pick(state, request, body, &allowed, wanted.fallbacks);
    tokio::pin!(pick);
    let mut feed = (!head.end_of_stream).then_some(body_tx);
    let mut ending = if head.end_of_stream {
        Ending::NoBody
    } else {
        Ending::Body
    };
    while let Some(tx) = &feed {
        // Room for a chunk before the next message is read: a pick that is not reading (it
        // waits for admission) holds the rest of the body back, as `serve`'s socket would. The
        // pick is polled all the while (it may answer early, a timeout or a refusal).
        let next = async { (tx.reserve().await, inbound.message().await) };
        let ended = tokio::select! {
            biased;
            done = &mut pick => return answer_early(done, ending, out).await,
            (room, message) = next => match body_part(message) {
                Part::Chunk(bytes, end) => {
                    // No room only when the pick stopped reading: its answer follows.
                    if let Ok(room) = room
                        && !bytes.is_empty()
                    {
                        room.send(Ok(bytes));
                    }
                    end
                }
                Part::Trailers => {
                    ending = Ending::Trailers;
                    true
                }
                // The pick is dropped with this stream: its admission and load are released.
                Part::Gone => return Ok(None),
                Part::Unexpected => {
                    return Err(Status::invalid_argument("expected the request body or trailers"));
                }
            },
        };
        if ended {
            // The body's sender goes: the pick's reader sees the end.
            feed = None;
        }
    }
    answer_early(pick.await, ending, out).await
}

/// The pick, or the gateway's answer to the client when it failed.
async fn answer_early(
    done: Result<Picked, ApiError>,
    ending: Ending,
    out: &Out,
) -> Result<Option<(Picked, Ending)>, Status> {
    let error = match done {
        Ok(picked) => return Ok(Some((picked, ending))),
        Err(e) => e,
    };
    tracing::debug!(
        status = error.status.as_u16(),
        code = error.code,
        "answered by the picker"
    );
    out.send(protocol::immediate(&error)).await;
    Ok(None)
}

/// A message of the request's body phase.
enum Part {
    Chunk(Bytes, bool),
    Trailers,
    Gone,
    Unexpected,
}

fn body_part(message: Result<Option<ProcessingRequest>, Status>) -> Part {
    match message {
        Ok(Some(ProcessingRequest {
            request: Some(Request::RequestBody(b)),
            ..
        })) => Part::Chunk(Bytes::from(b.body), b.end_of_stream),
        Ok(Some(ProcessingRequest {
            request: Some(Request::RequestTrailers(_)),
            ..
        })) => Part::Trailers,
        Ok(None) | Err(_) => Part::Gone,
        Ok(Some(_)) => Part::Unexpected,
    }
}

/// The headers answer (the destination, the rank or prefill endpoint it needs, the body's
/// new length) and then the body, ended as the request's was.
async fn send_pick(picked: &Picked, ending: Ending, out: &Out) {
    let endpoint = std::iter::once(gateway::endpoint(&picked.attempt.worker))
        .chain(picked.fallbacks.iter().cloned())
        .collect::<Vec<_>>()
        .join(",");
    let mut set = vec![header(protocol::DESTINATION, endpoint.as_bytes())];
    let mut remove: Vec<String> = Vec::new();
    match picked.attempt.pinned() {
        Some(rank) => set.push(header(protocol::RANK, rank.to_string().as_bytes())),
        None => remove.push(protocol::RANK.to_owned()),
    }
    match &picked.prefill {
        Some(p) => {
            let at = gateway::endpoint(&p.worker);
            set.push(header(protocol::PREFILLER, at.as_bytes()));
        }
        None => remove.push(protocol::PREFILLER.to_owned()),
    }
    remove.extend(
        [protocol::SUBSET_KEY, protocol::DESTINATION_SERVED]
            .into_iter()
            .map(str::to_owned),
    );
    if picked.strip_authorization {
        remove.push("authorization".to_owned());
    }
    if picked.edited {
        let length = picked.body.len().to_string();
        set.push(header("content-length", length.as_bytes()));
    }
    out.send(protocol::pick(&endpoint, set, remove)).await;
    if ending == Ending::NoBody {
        return;
    }
    let trailers = ending == Ending::Trailers;
    for chunk in protocol::body_chunks(&picked.body, !trailers, true) {
        out.send(chunk).await;
    }
    if trailers {
        out.send(protocol::trailers_unchanged(true)).await;
    }
}
