//! The engine's HTTP face: the slice of vLLM's OpenAI server a router talks to.
//!
//! `POST /v1/completions` and `/v1/chat/completions` (streaming and not), `GET /v1/models`,
//! `GET /health`, `GET /metrics`, `POST /reset_prefix_cache`, and by concept in their own
//! files: the Responses API with a per-engine store (`responses_api`), embeddings, rerank and
//! score (`pooling`), transcriptions (`audio`), `/tokenize` and `/detokenize` (`tokenize`).
//! Requests are validated with the router's own [`RequestView`] so both sides agree on what a
//! body means, and tokenized with the same [`crate::tokens::Tokenizer`] so a prompt costs the
//! same tokens on both sides.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream::{self, Stream};
use serde_json::{Value, json};

use super::core::AddError;
use super::driver::{EngineClient, RequestEvent, RequestStream, SubmitError};
use super::metrics::EngineMetrics;
use super::request::RequestStats;
use super::responses::{ResponseShape, Usage, token_text};
use super::{audio, pooling, responses_api, tokenize};
use crate::openai::{ApiError, Endpoint, Input, Prompt, RequestView};
use crate::tokens::{ModelTokens, TokenError};

/// Response header: the engine's time to first token for this request, seconds.
pub const TTFT_HEADER: &str = "x-engine-ttft-seconds";
/// Response header: the engine's queue time for this request, seconds.
pub const QUEUE_HEADER: &str = "x-engine-queue-seconds";

/// Everything the handlers share.
pub struct AppState {
    /// The engine task.
    pub client: EngineClient,
    /// Served model name.
    pub model: String,
    /// Tokenizer and chat template of the model (shared with the router's code).
    pub tokens: Arc<ModelTokens>,
    /// Output length when the request gives no `max_tokens`.
    pub default_max_tokens: usize,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// The engine's metrics.
    pub metrics: Arc<EngineMetrics>,
    /// Response id counter.
    pub responses: AtomicU64,
    /// Stored Responses API responses, by id (this engine's own: another engine has none).
    pub stored: Mutex<HashMap<String, responses_api::Stored>>,
}

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
        .fallback(not_found)
        .with_state(state)
}

/// A tokenization failure as the client sees it: the request's fault (a template that raised,
/// text the tokenizer rejects) is a 400.
pub(super) fn token_error(e: TokenError) -> ApiError {
    ApiError::invalid(e.to_string(), Some("prompt"))
}

/// Prompt text → token ids, through the same [`ModelTokens`] the router uses.
pub(super) fn encode(tokens: &ModelTokens, text: &str) -> Result<Vec<u32>, ApiError> {
    tokens.encode(text).map_err(token_error)
}

fn prompt_tokens(state: &AppState, view: &RequestView) -> Result<Vec<u32>, ApiError> {
    let batch_error = || {
        ApiError::invalid(
            "the simulated engine serves one prompt per request",
            Some("prompt"),
        )
    };
    let tokens = match &view.input {
        Input::Prompt(Prompt::Text(t)) => encode(&state.tokens, t)?,
        Input::Prompt(Prompt::Tokens(t)) => t.clone(),
        Input::Prompt(Prompt::Texts(ts)) => match ts.as_slice() {
            [t] => encode(&state.tokens, t)?,
            _ => return Err(batch_error()),
        },
        Input::Prompt(Prompt::TokenBatches(bs)) => match bs.as_slice() {
            [t] => t.clone(),
            _ => return Err(batch_error()),
        },
        Input::Messages(_) => state.tokens.prompt_ids(view).map_err(token_error)?,
    };
    if tokens.is_empty() {
        return Err(ApiError::invalid(
            "the prompt must contain at least one token",
            Some("prompt"),
        ));
    }
    Ok(tokens)
}

pub(super) fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("request body is not valid JSON: {e}"), None))
}

pub(super) fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        Some("engine_stopped"),
        "the engine is shutting down",
    )
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    generate(state, Endpoint::Completions, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    generate(state, Endpoint::ChatCompletions, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn generate(
    state: Arc<AppState>,
    endpoint: Endpoint,
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
    let (stream, max_tokens) = submit(&state, prompt, &view, "max_tokens").await?;
    let shape = ResponseShape::new(
        endpoint,
        state.responses.fetch_add(1, Ordering::Relaxed),
        unix_now(),
        &state.model,
    );
    if view.stream {
        Ok(sse(shape, stream, max_tokens, view.include_usage).into_response())
    } else {
        collect(shape, stream).await
    }
}

/// Submits `prompt` for `view` (its `max_tokens`, named `max_key` in errors, and salt); the
/// token stream and the output length asked for.
pub(super) async fn submit(
    state: &AppState,
    prompt: Vec<u32>,
    view: &RequestView,
    max_key: &str,
) -> Result<(RequestStream, usize), ApiError> {
    let max_tokens = match view.max_tokens {
        Some(0) => {
            return Err(ApiError::invalid(
                format!("`{max_key}` must be at least 1"),
                Some(max_key),
            ));
        }
        Some(m) => usize::try_from(m).unwrap_or(usize::MAX),
        None => state.default_max_tokens,
    };
    let salt = view.cache_salt.as_deref().map(Arc::from);
    let stream = state
        .client
        .submit(prompt, max_tokens, salt)
        .await
        .map_err(|e| match e {
            SubmitError::Rejected(e) => rejected(&e),
            SubmitError::Stopped => unavailable(),
        })?;
    Ok((stream, max_tokens))
}

/// The 400 for a request the engine refused, naming the parameter at fault.
pub(super) fn rejected(e: &AddError) -> ApiError {
    let param = match e {
        AddError::EmptyPrompt => "prompt",
        AddError::NoOutput | AddError::TooLong { .. } => "max_tokens",
        AddError::Duplicate(_) => {
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                None,
                e.to_string(),
            );
        }
    };
    ApiError::invalid(e.to_string(), Some(param))
}

pub(super) fn usage_of(stats: &RequestStats) -> Usage {
    Usage {
        prompt_tokens: stats.prompt_tokens,
        completion_tokens: stats.output_tokens,
        cached_tokens: stats.cached_tokens,
    }
}

/// Waits for the whole output; dropping this future (client gone) aborts the request.
async fn collect(shape: ResponseShape, mut stream: RequestStream) -> Result<Response, ApiError> {
    let mut text = String::new();
    loop {
        match stream.next().await {
            Some(RequestEvent::Token { token, .. }) => text.push_str(token_text(token)),
            Some(RequestEvent::Finished(stats)) => {
                let body = shape.full(&text, stats.reason.as_str(), usage_of(&stats));
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
    match state.client.reset_prefix_cache().await {
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

    #[test]
    fn chat_prompts_render_with_the_shared_chat_format() {
        let tokens = ModelTokens::builtin(16);
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hello there"}]});
        let view = RequestView::parse(Endpoint::ChatCompletions, &body).unwrap();
        let ids = tokens.prompt_ids(&view).unwrap();
        let text = tokens
            .render_chat(&crate::tokens::ChatRequest {
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
