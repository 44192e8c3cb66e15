//! What the engine's HTTP handlers share: its state, and the steps every endpoint takes
//! (parse the body, tokenize, submit to the engine task, answer its errors). The endpoint files
//! (`http`, `responses_api`, `pooling`, `audio`, `tokenize`) build on this one and never on
//! each other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

use super::bootstrap::Rooms;
use super::core::AddError;
use super::driver::{EngineClient, RequestStream, SubmitError};
use super::kv_transfer::Transfers;
use super::metrics::EngineMetrics;
use super::request::{Handoff, RequestStats};
use super::responses::Usage;
use kvroute_router::fleet::{DP_RANK_HEADER, Role};
use kvroute_router::openai::{ApiError, Input, Prompt, RequestView};
use kvroute_router::tokens::{ModelTokens, TokenError};

/// Response header: the engine's time to first token for this request, seconds.
pub const TTFT_HEADER: &str = "x-engine-ttft-seconds";
/// Response header: the engine's queue time for this request, seconds.
pub const QUEUE_HEADER: &str = "x-engine-queue-seconds";

/// Response header: the data-parallel rank that served the request (the simulated engine's
/// own, for tests and the curious; vLLM sends none).
pub const SERVED_RANK_HEADER: &str = "x-engine-data-parallel-rank";

/// Everything the handlers share.
pub struct AppState {
    /// The engine task of each data-parallel rank (one without data parallelism).
    pub clients: Vec<EngineClient>,
    /// Where the search for the least busy rank starts next (ties rotate, as vLLM's do).
    pub next_rank: AtomicU32,
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
    pub stored: Mutex<HashMap<String, Stored>>,
    /// Which side of disaggregated requests it runs (`--role`).
    pub role: Role,
    /// vLLM-style hand-offs: its held prefills, and pulls from other engines.
    pub transfers: Transfers,
    /// SGLang-style hand-offs: its bootstrap rooms, and joins of other engines' rooms.
    pub rooms: Rooms,
}

/// A stored response: what a later request continuing it needs, and the object `GET` returns.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The conversation it answered (without system messages), then its output message.
    pub messages: Vec<Value>,
    /// The response object.
    pub object: Value,
    /// Insertion order, to drop the oldest.
    pub(super) seq: u64,
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

pub(super) fn prompt_tokens(state: &AppState, view: &RequestView) -> Result<Vec<u32>, ApiError> {
    let batch_error = || {
        ApiError::invalid(
            "the simulated engine serves one prompt per request",
            Some("prompt"),
        )
    };
    let tokens = match &view.input {
        Input::Prompt(Prompt::Text(t)) => encode(&state.tokens, t)?,
        Input::Prompt(Prompt::Tokens(t)) => t.to_vec(),
        Input::Prompt(Prompt::Texts(ts)) => match ts.as_slice() {
            [t] => encode(&state.tokens, t)?,
            _ => return Err(batch_error()),
        },
        Input::Prompt(Prompt::TokenBatches(bs)) => match bs.as_slice() {
            [t] => t.to_vec(),
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

/// The rank a request asks for in its `X-data-parallel-rank` header, as vLLM 0.32 reads it
/// (`_get_data_parallel_rank`): a value that is not an integer is ignored.
pub(super) fn requested_rank(headers: &HeaderMap) -> Option<i64> {
    headers
        .get(DP_RANK_HEADER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The rank that serves a request: the one its header names (a 400 outside `0..size`, as
/// vLLM's input processor refuses it), else the one with the fewest open requests, the search
/// starting one further each time so that ties rotate.
pub(super) fn choose_rank(state: &AppState, headers: &HeaderMap) -> Result<usize, ApiError> {
    let size = state.clients.len();
    if let Some(rank) = requested_rank(headers) {
        return usize::try_from(rank)
            .ok()
            .filter(|r| *r < size)
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("data_parallel_rank {rank} is out of range [0, {size})."),
                    None,
                )
            });
    }
    let start = state.next_rank.fetch_add(1, Ordering::Relaxed) as usize;
    Ok((0..size)
        .map(|i| (start + i) % size)
        .min_by_key(|&r| state.clients[r].active())
        .unwrap_or(0))
}

/// Submits `prompt` for `view` (its `max_tokens`, named `max_key` in errors, and salt) to the
/// rank `headers` pin or the engine chooses; the token stream, the output length asked for and
/// the rank.
pub(super) async fn submit(
    state: &AppState,
    headers: &HeaderMap,
    prompt: Vec<u32>,
    view: &RequestView,
    max_key: &str,
) -> Result<(RequestStream, usize, usize), ApiError> {
    submit_as(state, headers, prompt, view, max_key, Handoff::Local).await
}

/// [`submit`] as a part of a disaggregated request (`handoff`, see `disaggregated`).
pub(super) async fn submit_as(
    state: &AppState,
    headers: &HeaderMap,
    prompt: Vec<u32>,
    view: &RequestView,
    max_key: &str,
    handoff: Handoff,
) -> Result<(RequestStream, usize, usize), ApiError> {
    let rank = choose_rank(state, headers)?;
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
    let stream = state.clients[rank]
        .submit_handoff(prompt, max_tokens, salt, handoff)
        .await
        .map_err(|e| match e {
            SubmitError::Rejected(e) => rejected(&e),
            SubmitError::Stopped => unavailable(),
        })?;
    Ok((stream, max_tokens, rank))
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
