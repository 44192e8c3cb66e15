//! A long prompt's prefix pieces, sent to the chosen worker ahead of the request
//! (`routing::prefill_pieces` says why and where they end): each piece a completion of one
//! token on the prompt's token ids up to its end, carrying what the engine keys its cache by
//! (`model`, which names a LoRA adapter too, and the cache salt as sent), so that its blocks are
//! the request's. The next piece goes when the last has answered in full; the request follows
//! the last. A piece that fails ends the ladder: the request is then sent whole, as it would
//! have been. So does a queue of more than a piece of others' prefill on the worker before the
//! next piece (`prefill_pieces::next_piece_goes`: a ladder never starves its request). Pieces
//! are not retried and charge no breaker — they only reorder the worker's queue; the request's
//! own send is what is judged.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, header};
use http_body_util::BodyExt;

use super::{Dispatcher, Outbound};
use crate::openai::top_level;
use crate::routing::Attempt;
use crate::routing::prefill_pieces::{next_piece_goes, piece_ends};

/// Top-level members of the request's body (as sent) that a piece carries: what the engine
/// keys its prefix cache by besides the tokens.
const CARRIED: &[&str] = &["model", "cache_salt", "lora_path"];

/// What a request's pieces are cut from.
pub struct PromptPieces {
    /// The prompt's token ids, as the engine will see them.
    pub ids: Arc<[u32]>,
    /// The model's KV block size: pieces end on block boundaries.
    pub block_size: usize,
}

impl Dispatcher<'_> {
    /// Sends `pieces`' prefix pieces to `attempt`'s worker one after another (the body the
    /// request will carry, `body`, gives the members they share), unless the prompt is too
    /// short beyond what the worker holds. Returns when the last has answered or one failed.
    pub(super) async fn send_pieces(
        &self,
        attempt: &Attempt,
        out: &Outbound<'_>,
        body: &Bytes,
        pieces: &PromptPieces,
    ) {
        // Blocks in host memory or on disk are loaded, not computed: no piece for them.
        let cached = attempt.admitted.held_blocks() as usize * pieces.block_size;
        let ends = piece_ends(
            pieces.ids.len(),
            cached,
            self.config.prefill_piece_tokens,
            pieces.block_size,
        );
        if ends.is_empty() {
            return;
        }
        let Some(carried) = carried_members(body) else {
            return;
        };
        let metrics = &self.metrics.prefill_pieces;
        let headers = piece_headers(&out.headers);
        let mut from = cached;
        for end in ends {
            let ahead = attempt.admitted.others_queued_prefill_tokens();
            if !next_piece_goes(ahead, self.config.prefill_piece_tokens) {
                if from > cached {
                    metrics.stopped.inc();
                }
                return;
            }
            if from == cached {
                metrics.requests.inc();
            }
            let piece = piece_body(&carried, &pieces.ids[..end]);
            match self.send_piece(attempt, &headers, piece).await {
                Ok(()) => {
                    metrics.pieces.with_label_values(&["answered"]).inc();
                    metrics.tokens.inc_by(end.saturating_sub(from) as u64);
                    from = end;
                }
                Err(why) => {
                    metrics.pieces.with_label_values(&["failed"]).inc();
                    tracing::warn!(worker = attempt.worker.id(), reason = %why,
                        "a prefill piece failed; sending the request whole");
                    return;
                }
            }
        }
    }

    /// Sends one piece and reads its answer to the end (the piece is done when it is).
    async fn send_piece(
        &self,
        attempt: &Attempt,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<(), String> {
        let wait = self.config.first_byte_timeout;
        let response = (self.upstream)
            .send(
                attempt,
                &Method::POST,
                "/v1/completions",
                headers,
                body,
                wait,
            )
            .await
            .map_err(|f| f.fault().1)?;
        let status = response.status();
        let read = tokio::time::timeout(self.config.total_timeout, response.into_body().collect());
        match read.await {
            Err(_) => Err("no whole answer in time".into()),
            Ok(Err(e)) => Err(format!("its answer broke off: {e}")),
            Ok(Ok(_)) if !status.is_success() => Err(format!("answered {status}")),
            Ok(Ok(_)) => Ok(()),
        }
    }
}

/// The members of `body` (the request as sent) that pieces carry, as JSON text to open a
/// piece's object with; `None` when the body is not a JSON object.
fn carried_members(body: &[u8]) -> Option<String> {
    let members = top_level::members(body, CARRIED).ok()??;
    let mut text = String::from("{");
    for key in members.keys() {
        if let Some(raw) = members.get(key) {
            text.push_str(&format!("\"{key}\":{},", raw.get()));
        }
    }
    Some(text)
}

/// A piece's body: the carried members, the prefix's token ids, one token asked for.
fn piece_body(carried: &str, ids: &[u32]) -> Bytes {
    let mut text = String::with_capacity(carried.len() + ids.len() * 7 + 64);
    text.push_str(carried);
    text.push_str("\"prompt\":[");
    for (i, id) in ids.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&id.to_string());
    }
    text.push_str("],\"max_tokens\":1,\"stream\":false}");
    Bytes::from(text)
}

/// The request's upstream headers for a piece: its body is JSON of its own length.
fn piece_headers(request: &HeaderMap) -> HeaderMap {
    let mut headers = request.clone();
    headers.remove(header::CONTENT_LENGTH);
    // The request's own id is the request's (an engine may take it as its request id).
    headers.remove("x-request-id");
    headers.remove(header::CONTENT_ENCODING);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_carries_the_cache_keys_and_the_prefix() {
        let body = br#"{"messages":[{"role":"user","content":"hi"}],"model":"m:lora",
            "cache_salt":"t1\"x","stream":true,"lora_path":null}"#;
        let carried = carried_members(body).unwrap();
        let piece = piece_body(&carried, &[5, 6, 7]);
        let v: serde_json::Value = serde_json::from_slice(&piece).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"model": "m:lora", "cache_salt": "t1\"x", "lora_path": null,
                "prompt": [5, 6, 7], "max_tokens": 1, "stream": false})
        );
        let bare = piece_body(&carried_members(b"{}").unwrap(), &[1]);
        let v: serde_json::Value = serde_json::from_slice(&bare).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"prompt": [1], "max_tokens": 1, "stream": false})
        );
        assert_eq!(carried_members(b"[1]"), None);
    }

    #[test]
    fn a_pieces_headers_name_its_own_body() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.insert("x-request-id", HeaderValue::from_static("r"));
        h.insert("traceparent", HeaderValue::from_static("t"));
        let p = piece_headers(&h);
        assert!(p.get(header::CONTENT_LENGTH).is_none());
        assert_eq!(p[header::CONTENT_TYPE], "application/json");
        assert!(p.get("x-request-id").is_none());
        assert_eq!(p["traceparent"], "t");
    }
}
