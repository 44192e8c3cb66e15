//! Which part of a disaggregated request a generation request is on this engine, by its
//! hand-off fields (vLLM's `kv_transfer_params`, SGLang's `bootstrap_*`) and the engine's
//! `--role`, and what is done before it runs (a decode pulls its prompt's KV first) and after
//! (a prefill hands its blocks over).
//!
//! The simulated engine is stricter than the real ones where they differ, so that a wrong
//! route fails loudly in tests: a prefill-only engine refuses a request that is not a prefill
//! for a remote decode, a decode-only engine one that brings no prefill, and either refuses the
//! other side's hand-off.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::app::AppState;
use super::bootstrap::read_bootstrap;
use super::kv_transfer::{Remote, read_params};
use super::request::Handoff;
use kvroute_router::fleet::{Role, Side};
use kvroute_router::openai::ApiError;

/// A generation request's part on this engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    /// A whole request.
    Whole,
    /// vLLM: a prefill whose answer carries the `kv_transfer_params` of its held blocks.
    PrefillForParams,
    /// SGLang: a prefill whose blocks wait in this bootstrap room.
    PrefillForRoom(u64),
    /// A decode whose prompt's KV was pulled from its prefill engine.
    Decode,
}

impl Part {
    /// The engine core's kind of request.
    pub(super) fn handoff(self) -> Handoff {
        match self {
            Part::Whole => Handoff::Local,
            Part::PrefillForParams | Part::PrefillForRoom(_) => Handoff::ToDecode,
            Part::Decode => Handoff::FromPrefill,
        }
    }
}

/// Why a request cannot run as the part it asks to be.
pub(super) enum Refusal {
    /// The request is wrong for this engine (400).
    Invalid(ApiError),
    /// The KV transfer failed: the request fails as vLLM's does on a failed KV load (500, or a
    /// stream whose first event is the error).
    Transfer(String),
}

/// The part `body` asks for on this engine; a decode's KV is pulled (or its room joined) here,
/// a prefill's room opened. `prompt_tokens` is the prompt's length: a pulled KV of another
/// length was another request's.
pub(super) async fn part_of(
    state: &AppState,
    body: &Value,
    prompt_tokens: usize,
) -> Result<Part, Refusal> {
    let invalid = |m: String| Refusal::Invalid(ApiError::invalid(m, Some("kv_transfer_params")));
    let role = state.role;
    let wait = state.rooms.wait;
    let tokens = match (read_params(body).map_err(invalid)?, read_bootstrap(body)) {
        (Some(Remote::Decode), _) => {
            serves(role, Side::Prefill)?;
            return Ok(Part::PrefillForParams);
        }
        (Some(Remote::Prefill(pull)), _) => {
            serves(role, Side::Decode)?;
            state
                .transfers
                .pull(&pull, wait)
                .await
                .map_err(Refusal::Transfer)?
        }
        (None, Err(e)) => return Err(invalid(e)),
        (None, Ok(Some(b))) if role == Role::Prefill => {
            state.rooms.open(b.room);
            return Ok(Part::PrefillForRoom(b.room));
        }
        (None, Ok(Some(b))) if role == Role::Decode => {
            state.rooms.join(&b).await.map_err(Refusal::Transfer)?
        }
        (None, _) if role == Role::Both => return Ok(Part::Whole),
        (None, _) => {
            return Err(Refusal::Invalid(wrong_role(format!(
                "this engine runs only the {role} side of disaggregated requests: a request \
                 needs kv_transfer_params (vLLM) or bootstrap_host/port/room (SGLang)"
            ))));
        }
    };
    if tokens != prompt_tokens {
        return Err(Refusal::Transfer(format!(
            "the KV pulled holds {tokens} prompt tokens, this request's prompt has \
             {prompt_tokens}: the pairing named another request's prefill"
        )));
    }
    Ok(Part::Decode)
}

fn serves(role: Role, side: Side) -> Result<(), Refusal> {
    if role.serves(side) {
        return Ok(());
    }
    Err(Refusal::Invalid(wrong_role(format!(
        "this engine's role is {role}: it does not run the {} side",
        side.as_str()
    ))))
}

fn wrong_role(message: String) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some("wrong_role"),
        message,
    )
}

/// The answer of a request whose KV transfer failed: vLLM 0.32.0's, measured — a plain request
/// gets 500 `InternalServerError`; a stream gets 200 and the error as its first event.
pub(super) fn transfer_failed(why: &str, stream: bool) -> Response {
    tracing::warn!(reason = why, "KV transfer failed");
    let error = json!({"error": {
        "message": format!("KV transfer failed: {why}"),
        "type": "InternalServerError",
        "param": null,
        "code": 500,
    }});
    if stream {
        let body = format!("data: {error}\n\ndata: [DONE]\n\n");
        let mut resp = body.into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        resp
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(error)).into_response()
    }
}

/// How long a decode waits for its prefill's room, when not configured.
pub const DEFAULT_BOOTSTRAP_WAIT: Duration = Duration::from_secs(30);
