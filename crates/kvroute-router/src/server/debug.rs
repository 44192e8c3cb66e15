//! `POST /debug/route`: the decision a request would get, without sending it.
//!
//! Operators ask "why did this go there?". The answer takes the very steps a live request
//! takes — its endpoint's body reader (`read`), authorisation, eligibility and analysis
//! (`decide`), the decision core's explanation (`Decider::explain_plan`) — and shows every
//! candidate's inputs and predicted time to first token. It fails as the request would (404
//! for an unknown model, 503 when no worker can take it, …). Nothing is admitted, recorded or
//! forwarded.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::HeaderMap;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::json;

use super::api::Api;
use super::auth::{Caller, TENANT_HEADER};
use super::body::read_limited;
use super::call::{Call, Prepared, Read, Step};
use super::decide::{self, Decided};
use super::session_hint::HintSource;
use super::{AppState, read};
use crate::fleet::WorkerRank;
use crate::openai::{ApiError, Endpoint};
use crate::policy::saturation::{self, Saturation};
use crate::policy::{Candidate, TierQuote};
use crate::routing::{Analysis, DecodeExplanation, Explanation, Plan, Stance};

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
    let caller = caller(state, headers)?;
    let limits = state.body_limits();
    let bytes = read_limited(headers, body, limits.max_bytes, limits.read_timeout).await?;
    let (api, path, how) = endpoint_of(&bytes);
    let call = Call::post(api, path, headers.clone());
    let Step::Forward(prepared) = read::prepare(state, &caller, &call, &bytes, how).await? else {
        return Err(ApiError::invalid(
            "this body is answered without routing",
            None,
        ));
    };
    let Prepared {
        model,
        routing,
        salt,
        ..
    } = prepared;
    let client_salt = salt.as_ref().and_then(|s| s.as_deref());
    let Decided {
        eligible,
        mut analysis,
        hint,
        context,
        ..
    } = decide::decide(
        state,
        &caller,
        &call,
        model.as_deref(),
        client_salt,
        routing,
        bytes.len(),
    )
    .await?;
    // Placement isolation as the request would meet it now (it holds no slot here).
    let place = state.admission.place(&caller, headers)?;
    analysis.standing = state.admission.standing(&place);
    // Each data-parallel rank is a candidate of its own, as in a live decision.
    let targets = WorkerRank::all(&eligible.workers);
    let explained = state
        .decider
        .explain_plan(&analysis, &targets, eligible.plan)?;
    let paired = eligible.plan == Plan::Pair;
    let disaggregation = match (&model, paired) {
        (Some(m), true) => Some(state.handoff(m).as_str()),
        _ => None,
    };
    let saturated = saturation::saturation(
        analysis.request.prompt_tokens,
        &explained.candidates,
        &explained.decision.room_wait_s,
    );
    Ok(Json(json!({
        "worker": explained.chosen().worker.id(),
        "rank": explained.chosen().pinned(),
        "target": explained.candidates[explained.decision.chosen].id.as_ref(),
        "policy": state.policy.name(),
        "tenant": caller.tenant(),
        "model": model,
        "prompt_tokens": analysis.request.prompt_tokens,
        "block_size": analysis.request.block_size,
        "blocks": analysis.request.blocks,
        "warm_prefix_rate": analysis.request.warm_prefix_rate,
        "candidates": candidates(&analysis, &explained),
        "context_excluded": context.map(|c| c.excluded).unwrap_or_default(),
        "saturated": saturated.is_some(),
        "saturated_by": saturated.map(Saturation::name),
        "isolation": isolation(&analysis, &explained),
        "session": hint.map(|source| session(state, &analysis, &explained, source)),
        "disaggregation": disaggregation,
        "decode": explained.decode.as_ref().map(decode),
    }))
    .into_response())
}

/// The caller the admin asks as: the tenant named by [`TENANT_HEADER`], else anonymous.
fn caller(state: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    match headers.get(TENANT_HEADER).map(|v| v.to_str()) {
        None => Ok(Caller::Anonymous),
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
        }),
        Some(Err(_)) => Err(ApiError::invalid(
            format!("`{TENANT_HEADER}` must be a tenant name"),
            None,
        )),
    }
}

/// The members that tell the endpoints' bodies apart (their values are skipped, not built).
#[derive(Default, Deserialize)]
struct Members {
    messages: Option<IgnoredAny>,
    input: Option<IgnoredAny>,
    prompt: Option<IgnoredAny>,
}

/// The endpoint a body is for, and its reader: `input` without `prompt` is a Responses
/// request, `messages` a chat, anything else a completion (whose reader says what is wrong
/// with a body that is none of them).
fn endpoint_of(bytes: &Bytes) -> (Api, &'static str, Read) {
    let m: Members = serde_json::from_slice(bytes).unwrap_or_default();
    if m.input.is_some() && m.prompt.is_none() {
        (Api::Responses, "/v1/responses", Read::Responses)
    } else if m.messages.is_some() {
        let e = Endpoint::ChatCompletions;
        (Api::Chat, e.path(), Read::Generation(e))
    } else {
        let e = Endpoint::Completions;
        (Api::Completions, e.path(), Read::Generation(e))
    }
}

/// Every candidate of the policy's choice with what it weighed.
fn candidates(analysis: &Analysis, e: &Explanation<'_, WorkerRank>) -> Vec<serde_json::Value> {
    let d = &e.decision;
    e.candidates
        .iter()
        .zip(&e.targets)
        .enumerate()
        .map(|(i, (c, t))| {
            json!({
                "worker": t.worker.id(),
                "rank": t.pinned(),
                "target": c.id.as_ref(),
                "overlap_blocks": c.overlap_blocks,
                "cached_tokens": u64::from(c.overlap_blocks) * u64::from(analysis.request.block_size),
                "queued_tokens": c.load.queued_prefill_tokens,
                "in_flight": c.load.in_flight,
                "unseen_in_flight": c.load.unseen_in_flight,
                "decoding": c.load.decoding,
                "active_prompt_tokens": c.load.active_prompt_tokens,
                "role": t.worker.role().as_str(),
                "kv_events": t.worker.has_event_feed(),
                "kv_warming": t.state().is_kv_warming(),
                "predicted_ttft_s": d.predicted_ttft_s.get(i).copied().flatten(),
                "cost_s": d.cost.get(i).copied().flatten(),
                "prefill_tokens_per_s": d.prefill_tokens_per_s.get(i).copied().flatten(),
                "room_wait_s": d.room_wait_s.get(i).copied().flatten(),
                "live_blocks": c.cache.live_blocks,
                "kv_capacity_blocks": c.cache.capacity_blocks,
                "running_kv_tokens": c.cache.running_tokens,
                "running_prefix_blocks": c.cache.running_prefix_blocks,
                "sharing_requests": c.cache.sharing_requests,
                "returning_evictions": c.cache.returning_evictions,
                "tiers": tiers(c, d.tiers.get(i).copied().flatten(), analysis.request.block_size),
                "session_home": c.session_home,
            })
        })
        .collect()
}

/// A candidate's prefix split by tier (GPU blocks, then host memory, then disk, as its engine
/// loads them), and what the policy priced each part at, where it prices tiers.
/// Placement isolation as the request met it: its tenant's stance and whether it narrowed the
/// candidates listed (`null` while isolation is off).
fn isolation(analysis: &Analysis, e: &Explanation<'_, WorkerRank>) -> serde_json::Value {
    let Some(standing) = &analysis.standing else {
        return serde_json::Value::Null;
    };
    let stance = match &standing.stance {
        Stance::Free => json!({"stance": "free"}),
        Stance::Over {
            weight,
            active_weight,
        } => json!({"stance": "over_share", "weight": weight, "active_weight": active_weight}),
        Stance::Within { over } => {
            let over: Vec<&str> = over.iter().map(|t| &**t).collect();
            json!({"stance": "within_share", "over_share_tenants": over})
        }
    };
    let mut v = stance;
    v["tenant"] = json!(&*standing.tenant);
    v["confined"] = json!(e.confined.map(|c| c.as_str()));
    v
}

fn tiers(c: &Candidate, quote: Option<TierQuote>, block_size: u32) -> serde_json::Value {
    let bs = u64::from(block_size);
    json!({
        "gpu_blocks": c.overlap_blocks,
        "cpu_blocks": c.lower_blocks.cpu,
        "disk_blocks": c.lower_blocks.disk,
        "loaded_tokens": u64::from(c.lower_blocks.total()) * bs,
        "credited_tokens": quote.map(|q| q.cached_tokens),
        "cpu_load_s": quote.map(|q| q.cpu_s),
        "disk_load_s": quote.map(|q| q.disk_s),
    })
}

/// The session the request named: where it was named, and its home as the decision saw it
/// (`home` is the candidate it names, `null` when the session is unknown, expired, or its
/// home is not among the candidates).
fn session(
    state: &AppState,
    analysis: &Analysis,
    e: &Explanation<'_, WorkerRank>,
    source: HintSource,
) -> serde_json::Value {
    let home = state.decider.session_home(analysis);
    let candidate = e.candidates.iter().find(|c| c.session_home);
    json!({
        "source": source.name(),
        "known": home.is_some(),
        "home": candidate.map(|c| c.id.as_ref()),
        "age_s": home.map(|h| h.age.as_secs_f64()),
        "shared_blocks": home.map(|h| h.shared_blocks),
        "ttl_s": state.sessions().ttl.as_secs_f64(),
    })
}

/// The decode pick of a disaggregated request: the worker and every decode-capable candidate
/// with what the pick weighed (load, KV room).
fn decode(e: &DecodeExplanation<'_, WorkerRank>) -> serde_json::Value {
    let listed: Vec<_> = e
        .candidates
        .iter()
        .zip(&e.targets)
        .enumerate()
        .map(|(i, (c, t))| {
            json!({
                "worker": t.worker.id(),
                "rank": t.pinned(),
                "target": c.id.as_ref(),
                "in_flight": c.load.in_flight,
                "decoding": c.load.decoding,
                "active_prompt_tokens": c.load.active_prompt_tokens,
                "kv_tokens": c.kv_tokens,
                "kv_usage": e.decision.kv_usage.get(i).copied().flatten(),
            })
        })
        .collect();
    json!({
        "worker": e.chosen().worker.id(),
        "rank": e.chosen().pinned(),
        "target": e.candidates[e.decision.chosen].id.as_ref(),
        "candidates": listed,
    })
}
