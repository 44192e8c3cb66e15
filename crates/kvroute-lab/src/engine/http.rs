//! The engine's HTTP face: the slice of vLLM's OpenAI server a router talks to.
//!
//! `POST /v1/completions` and `/v1/chat/completions` (streaming and not), `GET /v1/models`,
//! `GET /health`, `GET /metrics`, `POST /reset_prefix_cache`, and by concept in their own
//! files: the Responses API with a per-engine store (`responses_api`), embeddings, rerank and
//! score (`pooling`), transcriptions (`audio`), `/tokenize` and `/detokenize` (`tokenize`).
//! Requests are validated with the router's own [`RequestView`] so both sides agree on what a
//! body means, and tokenized with the same [`kvroute_router::tokens::Tokenizer`] so a prompt costs the
//! same tokens on both sides.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream::{self, Stream};
use serde_json::{Value, json};

use super::app::{parse_body, prompt_tokens, submit_as, unavailable, unix_now, usage_of};
use super::disaggregated::{Part, Refusal, part_of, transfer_failed};
use super::driver::{RequestEvent, RequestStream};
use super::responses::{ResponseShape, token_text};
use super::{audio, pooling, responses_api, tokenize};
use kvroute_router::openai::{ApiError, Endpoint, RequestView};

pub use super::app::{AppState, QUEUE_HEADER, SERVED_RANK_HEADER, TTFT_HEADER};

/// The router for one engine.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/v1/responses", post(responses_api::create))
        .route(
            "/v1/responses/{id}",
            get(responses_api::retrieve).delete(responses_api::delete),
        )
        .route("/v1/responses/{id}/cancel", post(responses_api::cancel))
        .route("/v1/embeddings", post(pooling::embeddings))
        .route("/v1/rerank", post(pooling::rerank))
        .route("/rerank", post(pooling::rerank))
        .route("/v2/rerank", post(pooling::rerank))
        .route("/v1/score", post(pooling::score))
        .route("/score", post(pooling::score))
        .route("/v1/audio/transcriptions", post(audio::transcriptions))
        .route("/metrics", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route(
            super::kv_transfer::PULL_PATH,
            post(super::handoff_routes::pull),
        )
        .fallback(not_found)
        .with_state(state)
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(state, Endpoint::Completions, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    generate(state, Endpoint::ChatCompletions, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn generate(
    state: Arc<AppState>,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let value = parse_body(&body)?;
    let view = RequestView::parse(endpoint, &value)?;
    if view.model != state.model {
        return Err(ApiError::model_not_found(&view.model));
    }
    if view.n.is_some_and(|n| n > 1) {
        return Err(ApiError::invalid(
            "the simulated engine supports only `n` = 1",
            Some("n"),
        ));
    }
    let prompt = prompt_tokens(&state, &view)?;
    let prompt_len = prompt.len();
    let part = match part_of(&state, &value, prompt_len).await {
        Ok(part) => part,
        Err(Refusal::Invalid(e)) => return Err(e),
        Err(Refusal::Transfer(why)) => return Ok(transfer_failed(&why, view.stream)),
    };
    let submitted = submit_as(&state, headers, prompt, &view, "max_tokens", part.handoff()).await;
    if let (Err(_), Part::PrefillForRoom(room)) = (&submitted, part) {
        state.rooms.close(room);
    }
    let (stream, max_tokens, rank) = submitted?;
    let shape = ResponseShape::new(
        endpoint,
        state.responses.fetch_add(1, Ordering::Relaxed),
        unix_now(),
        &state.model,
    );
    let id = stream.id();
    let mut response = match part {
        Part::PrefillForRoom(room) => {
            // The room is ready once the prefill is done: answered whole, then as asked.
            let ready = || {
                state.rooms.ready(room, rank, id, prompt_len);
                None
            };
            let answer = collect(shape.clone(), stream, ready).await;
            if answer.is_err() {
                state.rooms.close(room);
            }
            let answer = answer?;
            if view.stream {
                one_event_stream(&shape, answer).await
            } else {
                answer
            }
        }
        Part::PrefillForParams if !view.stream => {
            let block_size = state.tokens.block_size();
            let params = || Some(state.transfers.issue(rank, id, prompt_len, block_size));
            collect(shape, stream, params).await?
        }
        _ if view.stream => sse(shape, stream, max_tokens, view.include_usage).into_response(),
        _ => collect(shape, stream, || None).await?,
    };
    response
        .headers_mut()
        .insert(SERVED_RANK_HEADER, HeaderValue::from(rank));
    Ok(response)
}

/// Waits for the whole output; dropping this future (client gone) aborts the request. When it
/// finishes, `after` runs, and what it returns is the answer's `kv_transfer_params`.
async fn collect(
    shape: ResponseShape,
    mut stream: RequestStream,
    after: impl FnOnce() -> Option<Value>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    loop {
        match stream.next().await {
            Some(RequestEvent::Token { token, .. }) => text.push_str(token_text(token)),
            Some(RequestEvent::Finished(stats)) => {
                let mut body = shape.full(&text, stats.reason.as_str(), usage_of(&stats));
                if let (Some(params), Some(map)) = (after(), body.as_object_mut()) {
                    map.insert("kv_transfer_params".into(), params);
                }
                let mut resp = (
                    [(header::CONTENT_TYPE, "application/json")],
                    body.to_string(),
                )
                    .into_response();
                let h = resp.headers_mut();
                for (name, v) in [
                    (TTFT_HEADER, stats.ttft()),
                    (QUEUE_HEADER, stats.queue_time()),
                ] {
                    if let Some(v) = v
                        && let Ok(hv) = HeaderValue::from_str(&format!("{v:.9}"))
                    {
                        h.insert(name, hv);
                    }
                }
                return Ok(resp);
            }
            None => return Err(unavailable()),
        }
    }
}

/// A whole answer (a prefill's one token) as the stream its client asked for: its choice as
/// one chunk, then `[DONE]`.
async fn one_event_stream(shape: &ResponseShape, answer: Response) -> Response {
    let bytes = axum::body::to_bytes(answer.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let full: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let text = full["choices"][0]["text"]
        .as_str()
        .or_else(|| full["choices"][0]["message"]["content"].as_str())
        .unwrap_or_default();
    let chunk = shape.token_chunk(text, Some("length"));
    let mut resp = format!("data: {chunk}\n\ndata: [DONE]\n\n").into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp
}

/// Where an SSE response is.
enum Phase {
    Start,
    Tokens,
    Done,
}

struct SseState {
    shape: ResponseShape,
    stream: RequestStream,
    max_tokens: usize,
    include_usage: bool,
    phase: Phase,
    pending: Option<Event>,
}

/// One SSE event per token (`data: {chunk}`), then the usage chunk if asked, then
/// `data: [DONE]`. The stream owns the [`RequestStream`], so a client disconnect aborts.
fn sse(
    shape: ResponseShape,
    stream: RequestStream,
    max_tokens: usize,
    include_usage: bool,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let init = SseState {
        shape,
        stream,
        max_tokens,
        include_usage,
        phase: Phase::Start,
        pending: None,
    };
    let events = stream::unfold(init, |mut s| async move {
        if let Some(ev) = s.pending.take() {
            return Some((Ok(ev), s));
        }
        match s.phase {
            Phase::Start => {
                s.phase = Phase::Tokens;
                if let Some(role) = s.shape.role_chunk() {
                    return Some((Ok(data(&role)), s));
                }
                next_token_event(s).await
            }
            Phase::Tokens => next_token_event(s).await,
            Phase::Done => None,
        }
    });
    Sse::new(events)
}

fn data(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

async fn next_token_event(mut s: SseState) -> Option<(Result<Event, Infallible>, SseState)> {
    match s.stream.next().await {
        Some(RequestEvent::Token { token, index }) => {
            let finish = (index + 1 >= s.max_tokens).then_some("length");
            let chunk = s.shape.token_chunk(token_text(token), finish);
            Some((Ok(data(&chunk)), s))
        }
        Some(RequestEvent::Finished(stats)) => {
            s.phase = Phase::Done;
            let done = Event::default().data("[DONE]");
            if s.include_usage {
                s.pending = Some(done);
                let chunk = s.shape.usage_chunk(usage_of(&stats));
                Some((Ok(data(&chunk)), s))
            } else {
                Some((Ok(done), s))
            }
        }
        None => {
            // The engine stopped mid-stream: end with an error chunk, as vLLM does.
            s.phase = Phase::Done;
            let err: Value = serde_json::from_str(&unavailable().body()).unwrap_or(Value::Null);
            s.pending = Some(Event::default().data("[DONE]"));
            Some((Ok(data(&err)), s))
        }
    }
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let created = unix_now();
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.model, "object": "model", "created": created, "owned_by": "vllm",
            "root": state.model, "parent": null, "max_model_len": state.max_model_len,
            "permission": [],
        }],
    }))
    .into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> Response {
    // Every rank's cache, as vLLM resets each engine core's.
    let mut all = Ok(true);
    for client in &state.clients {
        match client.reset_prefix_cache().await {
            Ok(ok) => all = all.map(|a| a && ok),
            Err(e) => all = Err(e),
        }
    }
    match all {
        Ok(true) => StatusCode::OK.into_response(),
        Ok(false) => ApiError::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            Some("cache_in_use"),
            "the prefix cache cannot be reset while requests hold blocks",
        )
        .into_response(),
        Err(_) => unavailable().into_response(),
    }
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("not_found"),
        "no such endpoint",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvroute_router::openai::Input;
    use kvroute_router::tokens::ModelTokens;

    #[test]
    fn chat_prompts_render_with_the_shared_chat_format() {
        let tokens = ModelTokens::builtin(16);
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello there"}]});
        let view = RequestView::parse(Endpoint::ChatCompletions, &body).unwrap();
        let ids = tokens.prompt_ids(&view).unwrap();
        let text = tokens
            .render_chat(&kvroute_router::tokens::ChatRequest {
                messages: match &view.input {
                    Input::Messages(m) => m,
                    Input::Prompt(_) => unreachable!(),
                },
                tools: None,
                add_generation_prompt: true,
                kwargs: None,
            })
            .unwrap();
        assert!(text.contains("hello there"));
        assert_eq!(ids, tokens.encode(&text).unwrap());
    }
}
