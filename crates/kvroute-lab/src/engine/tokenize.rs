//! vLLM's `POST /tokenize` and `POST /detokenize`, answered through the same code the router
//! answers them with ([`kvroute_router::tokens::tokenize_api`]), so the two agree by construction; the real
//! engine is what both are checked against (`tests/it/real_vllm.rs`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::app::{AppState, parse_body, token_error};
use kvroute_router::openai::ApiError;
use kvroute_router::tokens::tokenize_api::{Detokenize, Parsed, Tokenize};

fn check_model(state: &AppState, body: &Value) -> Result<(), ApiError> {
    match body.get("model").and_then(Value::as_str) {
        Some(m) if !m.is_empty() && m != state.model => Err(ApiError::model_not_found(m)),
        _ => Ok(()),
    }
}

fn unsupported(what: &str) -> ApiError {
    ApiError::invalid(
        format!("the simulated engine does not support this {what} request"),
        None,
    )
}

/// `POST /tokenize`.
pub(super) async fn tokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    tokenize_inner(&state, &body).unwrap_or_else(IntoResponse::into_response)
}

fn tokenize_inner(state: &AppState, body: &Bytes) -> Result<Response, ApiError> {
    let v = parse_body(body)?;
    check_model(state, &v)?;
    let Parsed::Local(t) = Tokenize::parse(&v) else {
        return Err(unsupported("/tokenize"));
    };
    let ids = t.ids(&state.tokens).map_err(token_error)?;
    // The builtin tokenizer has no vocabulary: token strings are null.
    let answer = match t.answer(&state.tokens, ids.clone(), state.max_model_len as u64) {
        Some(a) => a,
        None => json!({
            "count": ids.len(), "max_model_len": state.max_model_len,
            "tokens": ids, "token_strs": null,
        }),
    };
    Ok(axum::Json(answer).into_response())
}

/// `POST /detokenize`.
pub(super) async fn detokenize(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    detokenize_inner(&state, &body).unwrap_or_else(IntoResponse::into_response)
}

fn detokenize_inner(state: &AppState, body: &Bytes) -> Result<Response, ApiError> {
    let v = parse_body(body)?;
    check_model(state, &v)?;
    let Parsed::Local(d) = Detokenize::parse(&v) else {
        return Err(unsupported("/detokenize"));
    };
    let answer = d.answer(&state.tokens).ok_or_else(|| {
        ApiError::invalid(
            "the tokens cannot be decoded (the builtin tokenizer cannot decode; an id may be \
             outside the vocabulary)",
            Some("tokens"),
        )
    })?;
    Ok(axum::Json(answer).into_response())
}
