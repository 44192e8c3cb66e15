//! vLLM's pooling endpoints, simulated: `POST /v1/embeddings` (deterministic unit vectors of
//! the input's tokens), `POST /v1/rerank` (and `/rerank`, `/v2/rerank`) and `POST /v1/score`
//! (and `/score`): deterministic relevance scores, the share of a document's distinct tokens
//! found in the query. Shapes as vLLM 0.32 answers (`pooling/embed`, `pooling/scoring`); no KV
//! cache is used, so no events are published for them. Each prompt still goes through the
//! model's tokenizer, so usage counts are the router's.

use std::collections::HashSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::app::{AppState, encode, parse_body, unix_now};
use kvroute_router::openai::ApiError;

/// Dimensions of an embedding unless the request asks for `dimensions`.
pub const EMBEDDING_DIMENSIONS: usize = 16;
/// Most dimensions a request may ask for.
const MAX_DIMENSIONS: u64 = 4096;

fn check_model(state: &AppState, body: &Value) -> Result<(), ApiError> {
    match body.get("model").and_then(Value::as_str) {
        Some(m) if !m.is_empty() && m != state.model => Err(ApiError::model_not_found(m)),
        _ => Ok(()),
    }
}

/// The token ids of one input: text through the tokenizer, ids as given.
fn input_ids(state: &AppState, v: &Value, param: &str) -> Result<Vec<u32>, ApiError> {
    match v {
        Value::String(s) => encode(&state.tokens, s),
        Value::Array(ids) => ids
            .iter()
            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or_else(|| {
                ApiError::invalid(format!("`{param}` has an invalid token id"), Some(param))
            }),
        _ => Err(ApiError::invalid(
            format!("`{param}` must be a string or a list of token ids"),
            Some(param),
        )),
    }
}

/// The inputs of a field that is one input or a list of them (`"a"`, `["a", "b"]`, `[1, 2]`,
/// `[[1, 2], [3]]`).
fn inputs(state: &AppState, v: Option<&Value>, param: &str) -> Result<Vec<Vec<u32>>, ApiError> {
    let Some(v) = v else {
        return Err(ApiError::invalid(
            format!("you must provide `{param}`"),
            Some(param),
        ));
    };
    let list = match v {
        Value::Array(items) if items.iter().all(|i| i.is_string() || i.is_array()) => {
            items.iter().map(|i| input_ids(state, i, param)).collect()
        }
        _ => input_ids(state, v, param).map(|ids| vec![ids]),
    }?;
    if list.is_empty() {
        return Err(ApiError::invalid(
            format!("`{param}` must not be empty"),
            Some(param),
        ));
    }
    Ok(list)
}

/// A deterministic unit vector of `dims` dimensions for `ids`.
pub fn embedding(ids: &[u32], dims: usize) -> Vec<f64> {
    let mut v: Vec<f64> = (0..dims as u64)
        .map(|d| {
            ids.iter()
                .map(|&t| (xxh3_64_with_seed(&t.to_le_bytes(), d) % 2001) as f64 / 1000.0 - 1.0)
                .sum::<f64>()
        })
        .collect();
    let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

/// How relevant `doc` is to `query`: the share of the document's distinct tokens that are in
/// the query, in [0, 1].
pub fn relevance(query: &[u32], doc: &[u32]) -> f64 {
    let q: HashSet<u32> = query.iter().copied().collect();
    let d: HashSet<u32> = doc.iter().copied().collect();
    if d.is_empty() {
        return 0.0;
    }
    d.intersection(&q).count() as f64 / d.len() as f64
}

fn usage(prompt_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
           "completion_tokens": 0, "prompt_tokens_details": null})
}

fn request_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    embeddings_inner(&state, &body).unwrap_or_else(IntoResponse::into_response)
}

fn embeddings_inner(state: &AppState, body: &Bytes) -> Result<Response, ApiError> {
    let v = parse_body(body)?;
    check_model(state, &v)?;
    let dims = match v.get("dimensions") {
        None | Some(Value::Null) => EMBEDDING_DIMENSIONS,
        Some(d) => match d.as_u64() {
            Some(n) if (1..=MAX_DIMENSIONS).contains(&n) => n as usize,
            _ => {
                return Err(ApiError::invalid(
                    format!("`dimensions` must be between 1 and {MAX_DIMENSIONS}"),
                    Some("dimensions"),
                ));
            }
        },
    };
    let all = inputs(state, v.get("input"), "input")?;
    let tokens: usize = all.iter().map(Vec::len).sum();
    let data: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(i, ids)| json!({"index": i, "object": "embedding", "embedding": embedding(ids, dims)}))
        .collect();
    Ok(axum::Json(json!({
        "id": request_id("embd"), "object": "list", "created": unix_now(),
        "model": state.model, "data": data, "usage": usage(tokens),
    }))
    .into_response())
}

/// The text of a document, when it is one (rerank echoes it).
fn document_text(v: &Value) -> Value {
    match v {
        Value::String(s) => json!({"text": s}),
        _ => json!({"text": null}),
    }
}

/// `POST /v1/rerank`, `/rerank`, `/v2/rerank`.
pub(super) async fn rerank(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    rerank_inner(&state, &body).unwrap_or_else(IntoResponse::into_response)
}

fn rerank_inner(state: &AppState, body: &Bytes) -> Result<Response, ApiError> {
    let v = parse_body(body)?;
    check_model(state, &v)?;
    let query = match v.get("query") {
        Some(q) => input_ids(state, q, "query")?,
        None => return Err(ApiError::invalid("you must provide `query`", Some("query"))),
    };
    let raw_docs: Vec<Value> = match v.get("documents") {
        Some(Value::Array(d)) => d.clone(),
        Some(d @ Value::String(_)) => vec![d.clone()],
        _ => {
            return Err(ApiError::invalid(
                "`documents` must be a string or a list",
                Some("documents"),
            ));
        }
    };
    let docs = inputs(state, Some(&Value::Array(raw_docs.clone())), "documents")?;
    let top_n = v.get("top_n").and_then(Value::as_u64).unwrap_or(0) as usize;
    let mut results: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| (i, relevance(&query, d)))
        .collect();
    results.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if top_n > 0 {
        results.truncate(top_n);
    }
    let tokens = docs.iter().map(|d| query.len() + d.len()).sum::<usize>();
    let results: Vec<Value> = results
        .into_iter()
        .map(|(i, s)| json!({"index": i, "document": document_text(&raw_docs[i]), "relevance_score": s}))
        .collect();
    Ok(axum::Json(json!({
        "id": request_id("rerank"), "model": state.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }))
    .into_response())
}

/// `POST /v1/score`, `/score`: `text_1`/`text_2` (or `queries` with `documents` or `items`, or
/// `data_1`/`data_2`); one first input is scored against each second, or pairs one to one.
pub(super) async fn score(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    score_inner(&state, &body).unwrap_or_else(IntoResponse::into_response)
}

fn score_inner(state: &AppState, body: &Bytes) -> Result<Response, ApiError> {
    let v = parse_body(body)?;
    check_model(state, &v)?;
    let pair = [
        ("text_1", "text_2"),
        ("queries", "documents"),
        ("queries", "items"),
        ("data_1", "data_2"),
    ]
    .into_iter()
    .find(|(a, b)| v.get(*a).is_some() && v.get(*b).is_some())
    .ok_or_else(|| ApiError::invalid("you must provide `text_1` and `text_2`", Some("text_1")))?;
    let first = inputs(state, v.get(pair.0), pair.0)?;
    let second = inputs(state, v.get(pair.1), pair.1)?;
    let pairs: Vec<(&Vec<u32>, &Vec<u32>)> = match (first.len(), second.len()) {
        (1, _) => second.iter().map(|s| (&first[0], s)).collect(),
        (a, b) if a == b => first.iter().zip(second.iter()).collect(),
        _ => {
            return Err(ApiError::invalid(
                format!(
                    "`{}` must have one input or as many as `{}`",
                    pair.0, pair.1
                ),
                Some(pair.0),
            ));
        }
    };
    let tokens = pairs.iter().map(|(a, b)| a.len() + b.len()).sum::<usize>();
    let data: Vec<Value> = pairs
        .iter()
        .enumerate()
        .map(|(i, (a, b))| json!({"index": i, "object": "score", "score": relevance(a, b)}))
        .collect();
    Ok(axum::Json(json!({
        "id": request_id("score"), "object": "list", "created": unix_now(),
        "model": state.model, "data": data, "usage": usage(tokens),
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embeddings_are_deterministic_unit_vectors() {
        let a = embedding(&[1, 2, 3], 16);
        assert_eq!(a, embedding(&[1, 2, 3], 16));
        assert_ne!(a, embedding(&[1, 2, 4], 16));
        let norm: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-9);
        assert_eq!(embedding(&[], 4), vec![0.0; 4]);
    }

    #[test]
    fn relevance_is_the_share_of_document_tokens_in_the_query() {
        assert_eq!(relevance(&[1, 2, 3], &[1, 2]), 1.0);
        assert_eq!(relevance(&[1], &[1, 2]), 0.5);
        assert_eq!(relevance(&[1], &[]), 0.0);
    }
}
