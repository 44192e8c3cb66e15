//! vLLM's `POST /v1/audio/transcriptions`, simulated: a `multipart/form-data` upload with a
//! `file` (any bytes) and a `model`; the answer is vLLM's `{"text", "usage": {"type":
//! "duration", "seconds"}}` (or the bare text with `response_format=text`), the text a
//! deterministic function of the file's bytes, one word per KiB (at least one).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::app::AppState;
use super::responses::token_text;
use kvroute_router::openai::{ApiError, multipart};

/// The transcript of `audio`.
pub fn transcript(audio: &[u8]) -> String {
    let words = (audio.len() / 1024).clamp(1, 256) as u64;
    (0..words)
        .map(|i| token_text((xxh3_64_with_seed(audio, i) % 1024) as u32))
        .collect::<String>()
        .trim_start()
        .to_owned()
}

/// `POST /v1/audio/transcriptions`.
pub(super) async fn transcriptions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    transcribe(&state, &headers, &body).unwrap_or_else(IntoResponse::into_response)
}

fn transcribe(state: &AppState, headers: &HeaderMap, body: &[u8]) -> Result<Response, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let boundary = multipart::boundary(ct)
        .ok_or_else(|| ApiError::invalid("the body must be multipart/form-data", None))?;
    if let Some(m) = multipart::text_field(body, &boundary, "model")?
        && !m.is_empty()
        && m != state.model
    {
        return Err(ApiError::model_not_found(&m));
    }
    // The file part's content, found as a field: the simulated transcript only needs bytes.
    let file = multipart::text_field(body, &boundary, "file").unwrap_or(None);
    let audio = file
        .map(String::into_bytes)
        .unwrap_or_else(|| body.to_vec());
    let text = transcript(&audio);
    let format = multipart::text_field(body, &boundary, "response_format")?;
    if format.as_deref() == Some("text") {
        return Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response());
    }
    let seconds = (audio.len() / 32_000).max(1);
    Ok(
        axum::Json(json!({"text": text, "usage": {"type": "duration", "seconds": seconds}}))
            .into_response(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transcripts_are_deterministic() {
        let a = transcript(&[7u8; 4096]);
        assert_eq!(a, transcript(&[7u8; 4096]));
        assert_eq!(a.split_whitespace().count(), 4);
        assert_ne!(a, transcript(&[8u8; 4096]));
        assert!(!transcript(b"").is_empty());
    }
}
