//! Reading a client's request body within the size limit, the time limit and the router's
//! budget of body bytes in flight, and reading its fields off the async threads when it is large.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;

use super::admission::BodyClaim;
use crate::metrics::Metrics;
use crate::openai::{ApiError, Endpoint, ModelField, RequestView};

/// Bodies at least this large are read into a view on a blocking thread: parsing costs about a
/// millisecond per megabyte, which on an async thread would stall every other connection it
/// serves (`/health` among them). Smaller ones are parsed in place: a hop to the blocking pool
/// costs more than they do.
pub const BLOCKING_PARSE_BYTES: usize = 256 << 10;

fn too_large(limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        Some("request_too_large"),
        format!("request body exceeds the limit of {limit} bytes"),
    )
}

/// Reads the whole body within `timeout`, refusing more than `limit` bytes with a 413 (early,
/// from the `Content-Length` header, when the client sent one). A client that trickles its body
/// (slow loris) gets a 408 instead of holding a connection and a task forever.
pub async fn read_limited(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    within(timeout, read_within(headers, body, limit, None)).await
}

/// [`read_limited`], with the body's bytes claimed from the router's budget as they arrive:
/// past the budget, 429 before reading on. A declared `Content-Length` is not claimed up
/// front: four request heads declaring 32 MiB each, with nothing behind them, used to hold the
/// whole default budget (and answer every other body 429) until their read timeout.
pub async fn read_claimed(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
    claim: &mut BodyClaim,
    metrics: &Metrics,
) -> Result<Bytes, ApiError> {
    within(
        timeout,
        read_within(headers, body, limit, Some((claim, metrics))),
    )
    .await
}

async fn within(
    timeout: Duration,
    read: impl Future<Output = Result<Bytes, ApiError>>,
) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            Some("request_timeout"),
            format!("the request body was not received within {timeout:?}"),
        )),
    }
}

/// Reads frame by frame into one buffer. The buffer (and the claim on the budget, which is
/// its capacity) grows with the bytes that arrived, at most doubling, up to the declared
/// `Content-Length` (else the limit): a body costs its size about once, no copy of frames
/// joined at the end, and a client holds at most twice what it actually sent.
async fn read_within(
    headers: &HeaderMap,
    mut body: Body,
    limit: usize,
    mut claim: Option<(&mut BodyClaim, &Metrics)>,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    let ceiling = declared
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(limit);
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::invalid(format!("could not read the request body: {e}"), None)
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let len = buf.len() + data.len();
        if len > limit {
            return Err(too_large(limit));
        }
        if len > buf.capacity() {
            let room = grown(buf.capacity(), len, ceiling);
            if let Some((claim, metrics)) = claim.as_mut()
                && room > claim.bytes()
            {
                claim.grow(room - claim.bytes(), metrics)?;
            }
            buf.reserve_exact(room - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(Bytes::from(buf))
}

/// The next capacity of a body buffer of `capacity` that must hold `needed` bytes: twice the
/// current one, but never less than needed nor more than the body's `ceiling` (its declared
/// length, else the limit) unless needed.
fn grown(capacity: usize, needed: usize, ceiling: usize) -> usize {
    capacity.saturating_mul(2).min(ceiling).max(needed)
}

/// The view of a body sent to `endpoint`; large bodies are read on a blocking thread.
pub async fn view(endpoint: Endpoint, bytes: &Bytes) -> Result<RequestView, ApiError> {
    parse(bytes, move |b| RequestView::from_json(endpoint, b)).await
}

/// The `model` of a JSON body whose other fields routing does not read.
pub async fn model_field(bytes: &Bytes) -> Result<ModelField, ApiError> {
    parse(bytes, ModelField::from_json).await
}

/// `read(bytes)`, on a blocking thread when the body is large.
pub async fn parse<T: Send + 'static>(
    bytes: &Bytes,
    read: impl FnOnce(&[u8]) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    if bytes.len() < BLOCKING_PARSE_BYTES {
        return read(bytes);
    }
    let bytes = bytes.clone();
    tokio::task::spawn_blocking(move || read(&bytes))
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                Some("internal_error"),
                format!("the body parser failed: {e}"),
            )
        })?
}
