//! `POST /debug/route`: the decision a request would get, without sending it.
//!
//! Operators ask "why did this go there?". The answer runs the very code a live request runs
//! (tokenize, look up, score) and shows every candidate's inputs and predicted time to first
//! token. Nothing is admitted, recorded or forwarded.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use serde_json::json;

use super::auth::{Caller, TENANT_HEADER};
use super::body::read_limited;
use super::{AppState, route};
use crate::fleet::{Side, WorkerRank};
use crate::openai::{ApiError, Endpoint, RequestView, ResponsesRequest};
use crate::routing::{Analysis, Plan, plan};

/// `POST /debug/route` with a completion, chat or Responses body (`messages` selects chat,
/// `input` without `prompt` the Responses API).
pub(super) async fn route(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    explain(&state, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn explain(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    state.keys.admin(headers)?;
    let caller = match headers.get(TENANT_HEADER).map(|v| v.to_str()) {
        None => Caller::Anonymous,
        Some(Ok(name)) => state.keys.tenant_named(name).ok_or_else(|| {
            ApiError::new(
                http::StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("tenant_not_found"),
                format!(
                    "no tenant is named `{}`",
                    crate::openai::shorten(name, crate::openai::ECHO_MAX)
                ),
            )
        })?,
        Some(Err(_)) => {
            return Err(ApiError::invalid(
                format!("`{TENANT_HEADER}` must be a tenant name"),
                None,
            ));
        }
    };
    let limits = state.body_limits();
    let bytes = read_limited(headers, body, limits.max_bytes, limits.read_timeout).await?;
    let json: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))?;
    let view = if json.get("input").is_some() && json.get("prompt").is_none() {
        // A Responses API body: its prompt is its `instructions` and `input` as a chat.
        let req = ResponsesRequest::parse(&json)?;
        let model = super::call::default_model(state, req.model.clone())?.ok_or_else(|| {
            ApiError::invalid("you must provide a model parameter", Some("model"))
        })?;
        req.chat_view(&model)
    } else {
        let endpoint = if json.get("messages").is_some() {
            Endpoint::ChatCompletions
        } else {
            Endpoint::Completions
        };
        RequestView::parse(endpoint, &json)?
    };
    let eligible = state.fleet.eligible(&view.model);
    if eligible.is_empty() && !state.fleet.knows_model(&view.model) {
        return Err(ApiError::model_not_found(&view.model));
    }
    let salt = caller.cache_salt(view.cache_salt.as_deref());
    let (analysis, view) = route::analyse(state, view, salt.as_deref(), bytes.len()).await?;
    // Each data-parallel rank is a candidate of its own, as in a live decision.
    let targets = WorkerRank::all(&eligible);
    // A disaggregated model's prefill pick is the policy's among prefill-capable workers; its
    // decode pick is shown apart.
    let paired = matches!(plan(&targets), Ok(Plan::Pair));
    let side = paired.then_some(Side::Prefill);
    let (ranks, candidates) = state.decider.candidates_on(&analysis, &targets, &[], side);
    let decision = state
        .decider
        .policy()
        .choose(&analysis.request, &candidates);
    let decode = paired.then(|| explain_decode(state, &analysis, &targets));
    let missing = plan(&targets).err().map(|m| m.to_string());
    let listed: Vec<_> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "worker": ranks[i].worker.id(),
                "rank": ranks[i].pinned(),
                "target": c.id.as_ref(),
                "overlap_blocks": c.overlap_blocks,
                "cached_tokens": u64::from(c.overlap_blocks) * u64::from(analysis.request.block_size),
                "queued_tokens": c.load.queued_prefill_tokens,
                "in_flight": c.load.in_flight,
                "unseen_in_flight": c.load.unseen_in_flight,
                "decoding": c.load.decoding,
                "active_prompt_tokens": c.load.active_prompt_tokens,
                "role": ranks[i].worker.role().as_str(),
                "kv_events": ranks[i].worker.has_event_feed(),
                "kv_warming": ranks[i].state().is_kv_warming(),
                "predicted_ttft_s": decision.as_ref().and_then(|d| d.predicted_ttft_s.get(i).copied().flatten()),
                "cost_s": decision.as_ref().and_then(|d| d.cost.get(i).copied().flatten()),
            })
        })
        .collect();
    Ok(Json(json!({
        "worker": decision.as_ref().map(|d| ranks[d.chosen].worker.id()),
        "rank": decision.as_ref().and_then(|d| ranks[d.chosen].pinned()),
        "target": decision.as_ref().map(|d| candidates[d.chosen].id.as_ref()),
        "policy": state.policy.name(),
        "tenant": caller.tenant(),
        "model": view.model,
        "prompt_tokens": analysis.request.prompt_tokens,
        "block_size": analysis.request.block_size,
        "blocks": analysis.request.blocks,
        "candidates": listed,
        "disaggregation": paired.then(|| state.handoff(&view.model).as_str()),
        "decode": decode,
        "error": missing,
    }))
    .into_response())
}

/// The decode pick of a disaggregated request: the worker and every decode-capable candidate
/// with what the pick weighed (load, KV room).
fn explain_decode(
    state: &AppState,
    analysis: &Analysis,
    targets: &[WorkerRank],
) -> serde_json::Value {
    let (ranks, candidates, decision) = state.decider.explain_decode(analysis, targets);
    let listed: Vec<_> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "worker": ranks[i].worker.id(),
                "rank": ranks[i].pinned(),
                "target": c.id.as_ref(),
                "in_flight": c.load.in_flight,
                "decoding": c.load.decoding,
                "active_prompt_tokens": c.load.active_prompt_tokens,
                "kv_tokens": c.kv_tokens,
                "kv_usage": decision.as_ref().and_then(|d| d.kv_usage.get(i).copied().flatten()),
            })
        })
        .collect();
    json!({
        "worker": decision.as_ref().map(|d| ranks[d.chosen].worker.id()),
        "rank": decision.as_ref().and_then(|d| ranks[d.chosen].pinned()),
        "target": decision.as_ref().map(|d| candidates[d.chosen].id.as_ref()),
        "candidates": listed,
    })
}
