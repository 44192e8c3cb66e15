//! `POST /tokenize` and `POST /detokenize`: answered by the router itself, exactly as vLLM
//! answers them ([`crate::tokens::tokenize_api`]), when it has the model's own tokenizer — the model
//! (or the base of a LoRA adapter) is listed in `[[models]]` with a `tokenizer` path — and
//! knows its `max_model_len` (a worker's `/v1/models`, or `[[models]] max_model_len`; in a fleet of
//! mixed contexts the largest, as routing sends a prompt where it fits). Anything
//! else is forwarded to a worker serving the model, on load: a model without a configured
//! tokenizer, a request using what only the engine renders exactly (a request-supplied chat
//! template, tools, multimodal content, …), or one the tokenizer or template refuses (the
//! engine words the error). `[endpoints] local_tokenize = false` forwards everything.
//!
//! No body is parsed into a JSON tree: the `model` is read in one pass that keeps nothing
//! else, and only when the router may answer is the body read again by the form's typed
//! reader (`tokens` straight into `u32`s, plain messages only).

use std::sync::Arc;

use axum::response::IntoResponse;
use bytes::Bytes;
use serde_json::Value;

use super::AppState;
use super::auth::{Caller, Keys};
use super::body;
use super::call::{Prepared, Step, default_model};
use super::route::INLINE_TOKENIZE_BYTES;
use crate::openai::ApiError;
use crate::tokens::tokenize_api::{Detokenize, Parsed, Tokenize, named_model};
use crate::tokens::{ModelTokens, TokenizerSource};

/// Answers a `/tokenize` (or, with `detokenize`, `/detokenize`) body here when possible, else
/// prepares it for a worker.
pub(super) async fn prepare(
    state: &Arc<AppState>,
    caller: &Caller,
    bytes: &Bytes,
    detokenize: bool,
) -> Result<Step, ApiError> {
    // The model first (one pass that keeps nothing else); the rest is read only when the
    // router may answer, with the form's own typed reader: never a tree of the body.
    let named = body::parse(bytes, |b| {
        named_model(b)
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))
    })
    .await?;
    let model = default_model(state, named)?;
    let Some(model) = model else {
        return Ok(Step::Forward(Prepared::on_load(None)));
    };
    Keys::authorize_model(caller, &model)?;
    let answer = match local_tokens(state, &model) {
        None => None,
        Some((tokens, _)) if detokenize => {
            match body::parse(bytes, |b| Ok(Detokenize::from_json(b))).await? {
                Parsed::Local(d) => d.answer(&tokens),
                Parsed::Engine => None,
            }
        }
        Some((tokens, max_model_len)) => {
            match body::parse(bytes, |b| Ok(Tokenize::from_json(b))).await? {
                Parsed::Local(t) => tokenize_here(t, tokens, max_model_len, bytes.len()).await,
                Parsed::Engine => None,
            }
        }
    };
    Ok(match answer {
        Some(v) => Step::Answer(axum::Json(v).into_response(), model),
        None => Step::Forward(Prepared::on_load(Some(model))),
    })
}

/// The model's own tokenizer and its `max_model_len`, when the router may answer for it.
fn local_tokens(state: &AppState, model: &str) -> Option<(Arc<ModelTokens>, u64)> {
    if !state.endpoints.local_tokenize || !state.fleet.knows_model(model) {
        return None;
    }
    let base = state.adapter_base(model);
    let base = base.as_deref().unwrap_or(model);
    let configured = state.model_config(base)?;
    if !matches!(
        configured.tokenizer,
        TokenizerSource::Path(_) | TokenizerSource::Hub(_)
    ) {
        return None;
    }
    // In a fleet of mixed contexts, the largest: routing sends a prompt where it fits.
    let max_model_len = super::context::largest(state, model)?;
    Some((state.tokens.get(base), max_model_len))
}

/// The answer to `t`, tokenized off the async threads when the body is long; `None` when the
/// template or tokenizer refused it (the engine words that error).
async fn tokenize_here(
    t: Tokenize,
    tokens: Arc<ModelTokens>,
    max_model_len: u64,
    body_bytes: usize,
) -> Option<Value> {
    let run = move || {
        let ids = t.ids(&tokens).ok()?;
        t.answer(&tokens, ids, max_model_len)
    };
    if body_bytes < INLINE_TOKENIZE_BYTES {
        return run();
    }
    tokio::task::spawn_blocking(run).await.ok().flatten()
}
