//! A Responses request's `input` items and `tools`, read from the body's bytes as vLLM (0.32,
//! `responses/utils.py`, `construct_input_messages`) turns them into chat messages and chat
//! tools (see [`super::responses`] for what it does). Each item is read through its
//! members ([`super::top_level`]), each part of a content list through its `type` and `text`:
//! nothing is parsed into a tree but the messages built and a function tool's own fields, so an
//! `input` of a million numbers, or an item carrying one, costs no more than its bytes.

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::top_level::{self, Kind, Members, kind, members_of};
use super::{ApiError, FlattenedMedia, Scalar};
use crate::tokens::media;

/// The members of an input item that vLLM reads.
const ITEM_KEYS: &[&str] = &[
    "type",
    "role",
    "status",
    "content",
    "summary",
    "arguments",
    "input",
    "name",
    "call_id",
    "output",
    "encrypted_content",
];
/// The members of a content part that are read.
const PART_KEYS: &[&str] = &["type", "text"];
/// The members of a function tool that are rendered.
const TOOL_KEYS: &[&str] = &[
    "type",
    "name",
    "description",
    "parameters",
    "strict",
    "defer_loading",
];

fn invalid(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::invalid(message, Some(param))
}

/// The string a raw value is, if it is one.
pub(super) fn string_of(raw: Option<&RawValue>) -> Option<String> {
    match top_level::scalar(raw) {
        Some(Scalar::Str(s)) => Some(s),
        _ => None,
    }
}

fn member_string(m: &Members<'_>, key: &str) -> Option<String> {
    string_of(m.get(key))
}

/// A member handed to the template as it is (a tool call's `arguments`, `name`, `call_id`):
/// a scalar as JSON; a container — which vLLM refuses, these are strings — as `null`, so that
/// nothing large is ever built from it.
fn passed(raw: Option<&RawValue>) -> Option<Value> {
    let raw = raw?;
    Some(match kind(raw) {
        Kind::Object | Kind::Array => Value::Null,
        _ => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
    })
}

/// The media items met while the input's contents are flattened into text, and the message
/// the first one was in.
#[derive(Default)]
struct MediaSeen {
    digest: media::Digest,
    first: Option<usize>,
}

impl MediaSeen {
    /// What the messages lost of their media, for routing ([`FlattenedMedia`]).
    fn flattened(&self) -> Option<FlattenedMedia> {
        Some(FlattenedMedia {
            message: self.first?,
            digest: self.digest.finish()?,
        })
    }
}

/// The text of a content value that will be message `at`: a string, or its text parts joined
/// with newlines (vLLM's "string" content format; `input_text` and `output_text` parts are
/// text). Its media parts (`input_image`, `input_file`, …), which vLLM hands the engine beside
/// the text, are added to `seen`.
fn text_of(content: Option<&RawValue>, at: usize, seen: &mut MediaSeen) -> String {
    let Some(raw) = content else {
        return String::new();
    };
    match kind(raw) {
        Kind::String => string_of(Some(raw)).unwrap_or_default(),
        Kind::Array => {
            let mut parts = Vec::new();
            top_level::for_each_element(raw, |_, part| {
                let text = match kind(part) {
                    Kind::String => string_of(Some(part)),
                    Kind::Object => members_of(part, PART_KEYS).and_then(|p| {
                        let ty = member_string(&p, "type");
                        let textual = ty.as_deref().is_some_and(super::is_text_part_type);
                        if !textual {
                            add_media(part, at, seen);
                        }
                        textual.then(|| member_string(&p, "text")).flatten()
                    }),
                    _ => None,
                };
                parts.extend(text);
                true
            });
            parts.join("\n")
        }
        _ => String::new(),
    }
}

/// Adds the content part `part` of message `at` to `seen` when it is a media item.
fn add_media(part: &RawValue, at: usize, seen: &mut MediaSeen) {
    let Ok(item) = serde_json::from_str::<Value>(part.get()) else {
        return;
    };
    if media::is_media(&item) {
        seen.digest.add(&item);
        seen.first.get_or_insert(at);
    }
}

/// The first text part of an assistant item's content (vLLM reads `content[0].text`).
fn first_text(content: Option<&RawValue>) -> Option<String> {
    let raw = content?;
    match kind(raw) {
        Kind::String => string_of(Some(raw)),
        Kind::Array => {
            let mut first = None;
            top_level::for_each_element(raw, |_, part| {
                first = members_of(part, PART_KEYS).and_then(|p| member_string(&p, "text"));
                false
            });
            first
        }
        _ => None,
    }
}

/// Whether an input item is an assistant output message the engine continues (vLLM's
/// `should_continue_final_message`).
fn is_partial_assistant(o: &Members<'_>) -> bool {
    let status = member_string(o, "status");
    let partial = matches!(status.as_deref(), Some("in_progress" | "incomplete"));
    match member_string(o, "type").as_deref() {
        Some("reasoning") => partial,
        Some("message") => partial && member_string(o, "role").as_deref() == Some("assistant"),
        _ => false,
    }
}

/// The chat messages of an `input` array.
pub(super) struct InputMessages {
    /// The messages.
    pub(super) messages: Vec<Value>,
    /// Whether the last item is an assistant message to continue.
    pub(super) partial: bool,
    /// The media their contents had, the first message's index counted in `messages`.
    pub(super) media: Option<FlattenedMedia>,
}

/// The chat messages of the `input` array `items`. Reading stops at the first item refused.
pub(super) fn input_messages(items: &RawValue) -> Result<InputMessages, ApiError> {
    let mut out: Vec<Map<String, Value>> = Vec::new();
    let mut seen = MediaSeen::default();
    let mut partial = false;
    let mut refused = None;
    top_level::for_each_element(items, |i, item| {
        match add_item(&mut out, &mut seen, i, item) {
            Ok(p) => {
                partial = p;
                true
            }
            Err(e) => {
                refused = Some(e);
                false
            }
        }
    });
    match refused {
        Some(e) => Err(e),
        None => Ok(InputMessages {
            messages: out.into_iter().map(finish_message).collect(),
            partial,
            media: seen.flattened(),
        }),
    }
}

/// Adds input item `i` to the messages `out` (its media to `seen`); whether it is an
/// assistant message to continue.
fn add_item(
    out: &mut Vec<Map<String, Value>>,
    seen: &mut MediaSeen,
    i: usize,
    item: &RawValue,
) -> Result<bool, ApiError> {
    let Some(o) = members_of(item, ITEM_KEYS) else {
        return Err(invalid(format!("`input[{i}]` must be an object"), "input"));
    };
    let ty = member_string(&o, "type");
    let role = member_string(&o, "role");
    match (ty.as_deref(), role.as_deref()) {
        (Some(k @ ("function_call" | "custom_tool_call")), _) => {
            add_tool_call(out, &o, k == "function_call");
        }
        (Some("reasoning"), _) => add_reasoning(out, &o)?,
        (Some("function_call_output" | "custom_tool_call_output"), _) => {
            let mut m = Map::new();
            m.insert("role".into(), "tool".into());
            let text = text_of(o.get("output"), out.len(), seen);
            m.insert("content".into(), Value::String(text));
            if let Some(id) = passed(o.get("call_id")) {
                m.insert("tool_call_id".into(), id);
            }
            out.push(m);
        }
        (_, Some("assistant")) => {
            let text = first_text(o.get("content"));
            match (last_assistant(out), text) {
                (Some(m), Some(text)) if !m.contains_key("content") => {
                    m.insert("content".into(), Value::String(text));
                }
                (_, text) => out.push(assistant(text, None, None)),
            }
        }
        (_, Some(role)) => {
            let mut m = Map::new();
            m.insert("role".into(), Value::String(role.to_owned()));
            let text = text_of(o.get("content"), out.len(), seen);
            m.insert("content".into(), Value::String(text));
            if let Some(name) = member_string(&o, "name") {
                m.insert("name".into(), Value::String(name));
            }
            out.push(m);
        }
        (ty, None) => {
            return Err(invalid(
                format!(
                    "Unsupported input item type: {}",
                    ty.map_or_else(
                        || "(none)".to_owned(),
                        |k| super::shorten(k, super::ECHO_MAX)
                    )
                ),
                "input",
            ));
        }
    }
    Ok(is_partial_assistant(&o))
}

/// The last message, when it is the assistant's (a tool call or reasoning joins it).
fn last_assistant(out: &mut [Map<String, Value>]) -> Option<&mut Map<String, Value>> {
    out.last_mut()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
}

/// A `function_call` (`arguments`) or `custom_tool_call` (`input`) item: a tool call of the
/// assistant message before it, or of a new one.
fn add_tool_call(out: &mut Vec<Map<String, Value>>, o: &Members<'_>, function: bool) {
    let arguments = passed(o.get(if function { "arguments" } else { "input" }));
    let call = json!({
        "id": passed(o.get("call_id")).unwrap_or(Value::Null),
        "function": {
            "name": passed(o.get("name")).unwrap_or(Value::Null),
            "arguments": arguments.unwrap_or_else(|| Value::String(String::new())),
        },
        "type": "function",
    });
    match last_assistant(out) {
        Some(m) => match m.get_mut("tool_calls") {
            Some(Value::Array(calls)) => calls.push(call),
            _ => {
                m.insert("tool_calls".into(), json!([call]));
            }
        },
        None => out.push(assistant(None, Some(vec![call]), None)),
    }
}

/// A `reasoning` item: the reasoning of the assistant message before it when that has none,
/// else a new assistant message; encrypted content is refused (vLLM cannot read it).
fn add_reasoning(out: &mut Vec<Map<String, Value>>, o: &Members<'_>) -> Result<(), ApiError> {
    let encrypted = o.get("encrypted_content").is_some_and(|v| match kind(v) {
        Kind::Null => false,
        Kind::String => string_of(Some(v)).is_some_and(|s| !s.is_empty()),
        _ => true,
    });
    if encrypted {
        return Err(invalid("Encrypted content is not supported.", "input"));
    }
    let text = first_text(o.get("content"))
        .or_else(|| first_text(o.get("summary")))
        .unwrap_or_default();
    match last_assistant(out) {
        Some(m) if !m.contains_key("reasoning") => {
            m.insert("reasoning".into(), Value::String(text));
        }
        _ => out.push(assistant(None, None, Some(text))),
    }
    Ok(())
}

/// A new assistant message with the parts given.
fn assistant(
    content: Option<String>,
    tool_calls: Option<Vec<Value>>,
    reasoning: Option<String>,
) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("role".into(), "assistant".into());
    if let Some(c) = content {
        m.insert("content".into(), Value::String(c));
    }
    if let Some(calls) = tool_calls {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(r) = reasoning {
        m.insert("reasoning".into(), Value::String(r));
    }
    m
}

/// A message as vLLM hands it to the template: `role` and string `content` first (empty when
/// it had none), then the tool calls and the reasoning (also as `reasoning_content`).
fn finish_message(m: Map<String, Value>) -> Value {
    let mut out = Map::new();
    out.insert("role".into(), m.get("role").cloned().unwrap_or(Value::Null));
    out.insert(
        "content".into(),
        m.get("content")
            .cloned()
            .unwrap_or_else(|| Value::String(String::new())),
    );
    if let Some(calls) = m.get("tool_calls") {
        out.insert("tool_calls".into(), calls.clone());
    }
    if let Some(r) = m.get("reasoning") {
        out.insert("reasoning".into(), r.clone());
        out.insert("reasoning_content".into(), r.clone());
    }
    for key in ["tool_call_id", "name"] {
        if let Some(v) = m.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    Value::Object(out)
}

/// Flat Responses function tools in the chat form vLLM renders (`ChatCompletionToolsParam`
/// dumped: the function's `name`, `description`, `parameters`, then `strict` and
/// `defer_loading` when set; a top-level `defer_loading` of null). Other tool types are not
/// rendered (nor parsed). `None` when no function tool is left.
pub(super) fn chat_tools(tools: &RawValue) -> Option<Value> {
    let mut rendered = Vec::new();
    top_level::for_each_element(tools, |_, t| {
        let Some(m) = members_of(t, TOOL_KEYS) else {
            return true;
        };
        if member_string(&m, "type").as_deref() != Some("function") {
            return true;
        }
        let field = |k: &str| {
            m.get(k)
                .and_then(|raw| serde_json::from_str(raw.get()).ok())
                .unwrap_or(Value::Null)
        };
        let mut f = Map::new();
        f.insert("name".into(), field("name"));
        f.insert("description".into(), field("description"));
        f.insert("parameters".into(), field("parameters"));
        for k in ["strict", "defer_loading"] {
            if !field(k).is_null() {
                f.insert(k.into(), field(k));
            }
        }
        rendered.push(json!({"type": "function", "function": f, "defer_loading": null}));
        true
    });
    (!rendered.is_empty()).then_some(Value::Array(rendered))
}

/// `reasoning.effort`, when `reasoning` is an object with a string `effort`.
pub(super) fn reasoning_effort(reasoning: Option<&RawValue>) -> Option<String> {
    members_of(reasoning?, &["effort"]).and_then(|m| member_string(&m, "effort"))
}
