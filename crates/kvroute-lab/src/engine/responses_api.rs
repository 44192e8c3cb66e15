//! vLLM's Responses API, simulated: `POST /v1/responses` (streaming and not), and the stored
//! responses of this engine — `GET /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`, and
//! OpenAI's `DELETE /v1/responses/{id}` (vLLM 0.32 has no delete). Each engine keeps its own
//! store, as vLLM does (in memory, `VLLM_ENABLE_RESPONSES_API_STORE=1`): an id stored on one
//! engine is unknown (404) on every other, which is what the router's affinity is tested
//! against.
//!
//! The prompt is rendered as vLLM renders it ([`ResponsesRequest`]); a request continuing a
//! stored response (`previous_response_id`) is prefixed with that response's conversation and
//! output, its instructions replaced by the new ones. Ids are random (`resp_…`, `msg_…`), so two
//! engines never hand out the same one, unless the client chose the response's (`request_id`,
//! which vLLM takes as its id: a later response with the same id replaces the stored one). Shapes follow vLLM 0.32 (`responses/protocol.py`):
//! the response object, and the stream's `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`…, `…done`, `response.completed` events (no `[DONE]`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde_json::{Value, json};

use super::app::{
    AppState, Stored, parse_body, submit, token_error, unavailable, unix_now, usage_of,
};
use super::driver::{RequestEvent, RequestStream};
use super::responses::{Usage, token_text};
use kvroute_router::openai::{ApiError, ResponsesRequest};

/// Stored responses kept per engine; the oldest are dropped beyond it.
const STORE_LIMIT: usize = 10_000;

fn not_found(id: &str) -> ApiError {
    ApiError {
        param: Some("response_id".into()),
        ..ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("response_not_found"),
            format!("Response with id '{id}' not found."),
        )
    }
}

fn random_id(prefix: &str) -> String {
    format!("{prefix}_{:032x}", rand::random::<u128>())
}

/// The response being generated: its ids and the request fields the object echoes.
#[derive(Clone)]
struct Shape {
    id: String,
    message_id: String,
    created_at: u64,
    model: String,
    instructions: Value,
    previous_response_id: Value,
    max_output_tokens: usize,
}

impl Shape {
    fn message(&self, text: &str, status: &str) -> Value {
        json!({
            "id": self.message_id,
            "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": null}],
            "role": "assistant", "status": status, "type": "message",
        })
    }

    /// The response object; `output` and `usage` once it is done.
    fn object(&self, status: &str, text: Option<&str>, usage: Option<Usage>) -> Value {
        let output = match text {
            Some(t) => json!([self.message(t, "completed")]),
            None => json!([]),
        };
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id, "created_at": self.created_at, "incomplete_details": incomplete,
            "instructions": self.instructions, "metadata": null, "model": self.model,
            "object": "response", "output": output, "parallel_tool_calls": true,
            "temperature": 1.0, "tool_choice": "auto", "tools": [], "top_p": 1.0,
            "background": false, "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": null, "previous_response_id": self.previous_response_id,
            "prompt": null, "reasoning": null, "service_tier": "auto", "status": status,
            "text": null, "top_logprobs": null, "truncation": "disabled",
            "usage": usage.map(response_usage), "user": null,
        })
    }
}

fn response_usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// What a finished response leaves behind when stored.
struct ToStore {
    store: bool,
    conversation: Vec<Value>,
}

/// `POST /v1/responses`.
pub(super) async fn create(
    State(state): State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    create_inner(state, &headers, &body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn create_inner(
    state: Arc<AppState>,
    headers: &axum::http::HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let value = parse_body(body)?;
    let req = ResponsesRequest::parse(&value)?;
    if let Some(m) = &req.model
        && *m != state.model
    {
        return Err(ApiError::model_not_found(m));
    }
    // vLLM: the instructions, then the stored conversation without its system messages (and
    // the stored output), then the new input.
    let has_instructions = value
        .get("instructions")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty());
    let (head, input) = req.messages.split_at(usize::from(has_instructions));
    let mut conversation = Vec::new();
    if let Some(prev) = &req.previous_response_id {
        let stored = lock(&state)
            .get(prev)
            .cloned()
            .ok_or_else(|| not_found(prev))?;
        conversation.extend(
            stored
                .messages
                .into_iter()
                .filter(|m| m.get("role").and_then(Value::as_str) != Some("system")),
        );
    }
    conversation.extend(input.iter().cloned());
    let mut messages = head.to_vec();
    messages.extend(conversation.iter().cloned());
    let view = ResponsesRequest {
        messages,
        ..req.clone()
    }
    .chat_view(&state.model);
    let prompt = state.tokens.prompt_ids(&view).map_err(token_error)?;
    let (stream, max_tokens, _rank) =
        submit(&state, headers, prompt, &view, "max_output_tokens").await?;
    let shape = Shape {
        // vLLM: a `request_id` the client chose is the response's id.
        id: req.request_id.clone().unwrap_or_else(|| random_id("resp")),
        message_id: random_id("msg"),
        created_at: unix_now(),
        model: state.model.clone(),
        instructions: value.get("instructions").cloned().unwrap_or(Value::Null),
        previous_response_id: req
            .previous_response_id
            .clone()
            .map_or(Value::Null, Value::String),
        max_output_tokens: max_tokens,
    };
    let keep = ToStore {
        store: req.store,
        conversation,
    };
    if req.stream {
        Ok(sse(state, shape, stream, keep).into_response())
    } else {
        let object = collect(&state, &shape, stream, keep).await?;
        Ok(axum::Json(object).into_response())
    }
}

fn lock(state: &AppState) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Stored>> {
    state.stored.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stores a finished response (when asked to), dropping the oldest beyond [`STORE_LIMIT`].
fn store(state: &AppState, shape: &Shape, text: &str, object: &Value, keep: ToStore) {
    if !keep.store {
        return;
    }
    let mut messages = keep.conversation;
    messages.push(json!({"role": "assistant", "content": text}));
    let mut g = lock(state);
    let seq = g.values().map(|s| s.seq).max().map_or(0, |s| s + 1);
    if g.len() >= STORE_LIMIT
        && let Some(oldest) = g.iter().min_by_key(|(_, s)| s.seq).map(|(k, _)| k.clone())
    {
        g.remove(&oldest);
    }
    g.insert(
        shape.id.clone(),
        Stored {
            messages,
            object: object.clone(),
            seq,
        },
    );
}

fn status_of(stats_reason: &str) -> &'static str {
    if stats_reason == "length" {
        "incomplete"
    } else {
        "completed"
    }
}

async fn collect(
    state: &AppState,
    shape: &Shape,
    mut stream: RequestStream,
    keep: ToStore,
) -> Result<Value, ApiError> {
    let mut text = String::new();
    loop {
        match stream.next().await {
            Some(RequestEvent::Token { token, .. }) => text.push_str(token_text(token)),
            Some(RequestEvent::Finished(stats)) => {
                let status = status_of(stats.reason.as_str());
                let object = shape.object(status, Some(&text), Some(usage_of(&stats)));
                store(state, shape, &text, &object, keep);
                return Ok(object);
            }
            None => return Err(unavailable()),
        }
    }
}

/// The stream's state: events waiting to be sent, and what is still to come.
struct Streaming {
    state: Arc<AppState>,
    shape: Shape,
    stream: RequestStream,
    keep: Option<ToStore>,
    text: String,
    seq: u64,
    pending: VecDeque<Value>,
    done: bool,
}

impl Streaming {
    fn push(&mut self, kind: &str, mut event: Value) {
        event["type"] = Value::String(kind.to_owned());
        event["sequence_number"] = Value::from(self.seq);
        self.seq += 1;
        self.pending.push_back(event);
    }

    fn part(&self, text: &str) -> Value {
        json!({"type": "output_text", "text": text, "annotations": [], "logprobs": null})
    }

    fn opening(&mut self) {
        let created = self.shape.object("in_progress", None, None);
        self.push("response.created", json!({"response": created}));
        self.push("response.in_progress", json!({"response": created}));
        let item = json!({"id": self.shape.message_id, "content": [], "role": "assistant",
                          "status": "in_progress", "type": "message"});
        self.push(
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        );
        let part = self.part("");
        self.push(
            "response.content_part.added",
            json!({"item_id": self.shape.message_id, "output_index": 0, "content_index": 0, "part": part}),
        );
    }

    /// Turns the engine's next event into stream events.
    async fn advance(&mut self) {
        match self.stream.next().await {
            Some(RequestEvent::Token { token, .. }) => {
                let delta = token_text(token);
                self.text.push_str(delta);
                self.push(
                    "response.output_text.delta",
                    json!({"item_id": self.shape.message_id, "output_index": 0,
                           "content_index": 0, "delta": delta, "logprobs": []}),
                );
            }
            Some(RequestEvent::Finished(stats)) => {
                let text = std::mem::take(&mut self.text);
                let id = self.shape.message_id.clone();
                self.push(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": 0, "content_index": 0, "text": text, "logprobs": []}),
                );
                let part = self.part(&text);
                self.push(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": 0, "content_index": 0, "part": part}),
                );
                let item = self.shape.message(&text, "completed");
                self.push(
                    "response.output_item.done",
                    json!({"output_index": 0, "item": item}),
                );
                let status = status_of(stats.reason.as_str());
                let object = self
                    .shape
                    .object(status, Some(&text), Some(usage_of(&stats)));
                if let Some(keep) = self.keep.take() {
                    store(&self.state, &self.shape, &text, &object, keep);
                }
                self.push("response.completed", json!({"response": object}));
                self.done = true;
            }
            None => {
                // The engine stopped mid-stream: an error event, as vLLM sends.
                self.push(
                    "error",
                    json!({"code": "engine_stopped", "message": "the engine is shutting down", "param": null}),
                );
                self.done = true;
            }
        }
    }
}

fn event(v: Value) -> Event {
    let kind = v
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message")
        .to_owned();
    Event::default().event(kind).data(v.to_string())
}

fn sse(
    state: Arc<AppState>,
    shape: Shape,
    stream: RequestStream,
    keep: ToStore,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut s = Streaming {
        state,
        shape,
        stream,
        keep: Some(keep),
        text: String::new(),
        seq: 0,
        pending: VecDeque::new(),
        done: false,
    };
    s.opening();
    let events = stream::unfold(s, |mut s| async move {
        loop {
            if let Some(ev) = s.pending.pop_front() {
                return Some((Ok(event(ev)), s));
            }
            if s.done {
                return None;
            }
            s.advance().await;
        }
    });
    Sse::new(events)
}

/// `GET /v1/responses/{id}`.
pub(super) async fn retrieve(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Response {
    match lock(&state).get(&id) {
        Some(s) => axum::Json(s.object.clone()).into_response(),
        None => not_found(&id).into_response(),
    }
}

/// `DELETE /v1/responses/{id}` (OpenAI's; vLLM 0.32 has none).
pub(super) async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match lock(&state).remove(&id) {
        Some(_) => {
            axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response()
        }
        None => not_found(&id).into_response(),
    }
}

/// `POST /v1/responses/{id}/cancel`: the simulated engine runs no background responses, so a
/// stored one cannot be cancelled (vLLM's answer for a synchronous response).
pub(super) async fn cancel(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if !lock(&state).contains_key(&id) {
        return not_found(&id).into_response();
    }
    ApiError::invalid("Cannot cancel a synchronous response.", Some("response_id")).into_response()
}
