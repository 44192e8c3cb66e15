//! Waiting for a decode worker's first token before anything reaches the client.
//!
//! A decode that fails before its first token can still be retried (the client has seen
//! nothing), but it does not always fail with a status: vLLM 0.32.0 answers a failed KV load
//! of a streamed request with 200 and an error as the first event (chat streams open with a
//! role-only delta first), and a plain request with 500 (measured, `/work/pd-facts.md`). So the
//! decode's answer is held until its first content event: an error event, a 5xx, or an end
//! before any content is the decode's failure; anything else goes to the client with the held
//! events in front.

use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::proxy::first_token::FirstTokenDetector;

/// Most bytes held while waiting for the first token: past it the stream is passed on as it
/// is (a prelude this long is content, not an error).
const MAX_HELD: usize = 1 << 20;

/// A decode answer ready for the client: its head and body, and the frames already read from
/// it, which go first.
pub struct Held {
    /// The answer (its body continues after `frames`).
    pub response: Response<Incoming>,
    /// The frames read while waiting.
    pub frames: Vec<Bytes>,
}

/// Waits until `response` (an SSE stream when `sse`) shows its first token, within `wait`.
/// `Err` names why the decode failed before it; a plain (non-stream) answer is judged by its
/// status alone (5xx: failed; its body is the one token then).
pub async fn first_token(
    response: Response<Incoming>,
    sse: bool,
    wait: Duration,
) -> Result<Held, String> {
    let status = response.status();
    if status.is_server_error() {
        let (_, body) = response.into_parts();
        let text = excerpt(body, wait).await;
        return Err(format!("the decode worker answered {status}: {text}"));
    }
    if !sse || status != StatusCode::OK {
        return Ok(Held {
            response,
            frames: Vec::new(),
        });
    }
    let (parts, mut body) = response.into_parts();
    let mut detector = FirstTokenDetector::default();
    let mut frames = Vec::new();
    let mut held = 0;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let frame = tokio::time::timeout_at(deadline, body.frame()).await;
        let data = match frame {
            Err(_) => return Err(format!("no first token within {wait:?}")),
            Ok(None) => return Err("the decode stream ended before its first token".into()),
            Ok(Some(Err(e))) => {
                return Err(format!(
                    "the decode stream broke off before its first token: {e}"
                ));
            }
            Ok(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
        };
        detector.feed(&data);
        held += data.len();
        if detector.error_seen() && !detector.found() {
            let text = String::from_utf8_lossy(&data);
            return Err(format!(
                "the decode stream failed before its first token: {}",
                text.trim()
            ));
        }
        frames.push(data);
        if detector.found() || held >= MAX_HELD {
            return Ok(Held {
                response: Response::from_parts(parts, body),
                frames,
            });
        }
    }
}

/// The start of a failed answer's body, for the error the client or the log sees.
async fn excerpt(body: Incoming, wait: Duration) -> String {
    let limited = http_body_util::Limited::new(body, 4 << 10);
    match tokio::time::timeout(wait, limited.collect()).await {
        Ok(Ok(b)) => String::from_utf8_lossy(&b.to_bytes()).trim().to_owned(),
        _ => "(no body)".into(),
    }
}
