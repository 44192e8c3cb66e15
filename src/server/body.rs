//! Reading a client's request body within the size limit.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::openai::ApiError;

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
    match tokio::time::timeout(timeout, read_within(headers, body, limit)).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            Some("request_timeout"),
            format!("the request body was not received within {timeout:?}"),
        )),
    }
}

async fn read_within(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large(limit)),
        Err(e) => Err(ApiError::invalid(
            format!("could not read the request body: {e}"),
            None,
        )),
    }
}
