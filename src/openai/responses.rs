//! A Responses API request (`POST /v1/responses`) as routing reads it: its model, whether it
//! continues a stored response, and its prompt as chat messages — `instructions` and `input`
//! turned into messages the way vLLM (0.32, `responses/utils.py`, `construct_input_messages`)
//! does before it renders them with the model's chat template, so the router's tokens are the
//! engine's and the request is routed on its KV prefix like a chat.
//!
//! What vLLM does, and so what this does:
//! - `instructions` becomes a leading `system` message;
//! - a string `input` is one `user` message; a list is converted item by item: messages keep
//!   their role (their text parts joined by newlines, as vLLM's "string" content format does),
//!   an output message or an assistant message's text, a `reasoning` item and a
//!   `function_call` join the assistant message before them when it lacks that part (else
//!   open a new one), a `function_call_output` becomes a `tool` message;
//! - `tools` (flat `{"type": "function", "name", …}`) are given to the template in the chat
//!   form vLLM dumps them in (`{"type", "function": {"name", "description", "parameters"},
//!   "defer_loading"}`);
//! - `reasoning.effort` is passed to the template as `reasoning_effort`, and turns
//!   `enable_thinking` on (off for `"none"`) unless the request's `chat_template_kwargs` set it;
//! - a final assistant message still `in_progress` or `incomplete` is continued, not answered:
//!   no generation prompt.
//!
//! A request that continues a stored response (`previous_response_id`) is prefixed on the
//! engine by the stored conversation, which the router does not have: such requests go to the
//! worker that stored it (see the server's response affinity), not by prefix.

use serde_json::{Map, Value, json};

use super::{ApiError, Endpoint, Input, RequestView};

/// The fields of a Responses request that routing reads.
#[derive(Clone, Debug, PartialEq)]
pub struct ResponsesRequest {
    /// `model`, when given (vLLM defaults to its served model).
    pub model: Option<String>,
    /// `instructions` and `input` as chat messages.
    pub messages: Vec<Value>,
    /// `stream: true`.
    pub stream: bool,
    /// The stored response this one continues.
    pub previous_response_id: Option<String>,
    /// `max_output_tokens`, if given.
    pub max_output_tokens: Option<u64>,
    /// The client's `cache_salt`.
    pub cache_salt: Option<String>,
    /// The tools in the chat form the template reads.
    pub tools: Option<Value>,
    /// `tool_choice`, if given.
    pub tool_choice: Option<Value>,
    /// The template's keyword arguments (the request's, plus what `reasoning` implies).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Whether the prompt ends with an opened assistant turn.
    pub add_generation_prompt: bool,
    /// `store` (default true): whether the engine keeps the response for later requests.
    pub store: bool,
    /// `request_id` (vLLM): the id the client chose for the response, when a string.
    pub request_id: Option<String>,
}

fn invalid(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::invalid(message, Some(param))
}

impl ResponsesRequest {
    /// Reads a Responses request body.
    pub fn from_json(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))?;
        ResponsesRequest::parse(&value)
    }

    /// Reads a parsed Responses request body.
    pub fn parse(body: &Value) -> Result<ResponsesRequest, ApiError> {
        let Some(o) = body.as_object() else {
            return Err(ApiError::invalid(
                "request body must be a JSON object",
                None,
            ));
        };
        let string = |key: &str| -> Result<Option<String>, ApiError> {
            match o.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(invalid(format!("`{key}` must be a string"), key)),
            }
        };
        let boolean = |key: &str| -> Result<Option<bool>, ApiError> {
            match o.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(_) => Err(invalid(format!("`{key}` must be a boolean"), key)),
            }
        };
        let model = string("model")?.filter(|m| !m.is_empty());
        let instructions = string("instructions")?;
        let input = match o.get("input") {
            None | Some(Value::Null) => return Err(invalid("you must provide `input`", "input")),
            Some(v) => v,
        };
        let mut messages = Vec::new();
        if let Some(text) = instructions.filter(|s| !s.is_empty()) {
            messages.push(json!({"role": "system", "content": text}));
        }
        let continue_final = match input {
            Value::String(text) => {
                messages.push(json!({"role": "user", "content": text}));
                false
            }
            Value::Array(items) => {
                messages.extend(input_messages(items)?);
                items.last().is_some_and(is_partial_assistant)
            }
            _ => {
                return Err(invalid(
                    "`input` must be a string or an array of input items",
                    "input",
                ));
            }
        };
        let max_output_tokens = match o.get("max_output_tokens") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                invalid(
                    "`max_output_tokens` must be a non-negative integer",
                    "max_output_tokens",
                )
            })?),
        };
        let tools = match o.get("tools") {
            None | Some(Value::Null) => None,
            Some(Value::Array(tools)) => chat_tools(tools),
            Some(_) => return Err(invalid("`tools` must be an array", "tools")),
        };
        let mut kwargs = match o.get("chat_template_kwargs") {
            None | Some(Value::Null) => None,
            Some(Value::Object(k)) => Some(k.clone()),
            Some(_) => {
                return Err(invalid(
                    "`chat_template_kwargs` must be an object",
                    "chat_template_kwargs",
                ));
            }
        };
        let effort = o
            .get("reasoning")
            .and_then(|r| r.get("effort"))
            .and_then(Value::as_str);
        if let Some(effort) = effort {
            let k = kwargs.get_or_insert_with(Map::new);
            if !k.contains_key("enable_thinking") {
                k.insert("enable_thinking".into(), Value::Bool(effort != "none"));
            }
            k.insert("reasoning_effort".into(), Value::String(effort.to_owned()));
        }
        Ok(ResponsesRequest {
            model,
            messages,
            stream: boolean("stream")?.unwrap_or(false),
            previous_response_id: string("previous_response_id")?,
            max_output_tokens,
            cache_salt: string("cache_salt")?,
            tools,
            tool_choice: o.get("tool_choice").filter(|v| !v.is_null()).cloned(),
            chat_template_kwargs: kwargs,
            add_generation_prompt: !continue_final,
            store: boolean("store")?.unwrap_or(true),
            request_id: match o.get("request_id") {
                Some(Value::String(s)) => Some(s.clone()),
                _ => None,
            },
        })
    }

    /// The request as a chat for `model`: what the tokenizer renders and routing hashes.
    pub fn chat_view(&self, model: &str) -> RequestView {
        RequestView {
            endpoint: Endpoint::ChatCompletions,
            model: model.to_owned(),
            input: Input::Messages(self.messages.clone()),
            stream: self.stream,
            max_tokens: self.max_output_tokens,
            n: None,
            cache_salt: self.cache_salt.clone(),
            include_usage: false,
            tools: self.tools.clone(),
            tool_choice: self.tool_choice.clone(),
            chat_template_kwargs: self.chat_template_kwargs.clone(),
            add_generation_prompt: self.add_generation_prompt,
            reads_prefix_cache: true,
            // Not read by this parse: the bytes are checked.
            kv_transfer_params: true,
        }
    }
}

/// Whether an input item is an assistant output message the engine continues (vLLM's
/// `should_continue_final_message`).
fn is_partial_assistant(item: &Value) -> bool {
    let kind = item.get("type").and_then(Value::as_str);
    let status = item.get("status").and_then(Value::as_str);
    let partial = matches!(status, Some("in_progress" | "incomplete"));
    match kind {
        Some("reasoning") => partial,
        Some("message") => partial && item.get("role").and_then(Value::as_str) == Some("assistant"),
        _ => false,
    }
}

/// The text of a content value: a string, or its text parts joined with newlines (vLLM's
/// "string" content format; `input_text` and `output_text` parts are text).
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.as_str()),
                Value::Object(o) => match o.get("type").and_then(Value::as_str) {
                    Some("text" | "input_text" | "output_text" | "refusal") => {
                        o.get("text").and_then(Value::as_str)
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The first text part of an assistant item's content (vLLM reads `content[0].text`).
fn first_text(content: Option<&Value>) -> Option<String> {
    match content {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => parts
            .first()?
            .get("text")
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// The chat messages of a list of input items.
fn input_messages(items: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Map<String, Value>> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(o) = item.as_object() else {
            return Err(invalid(format!("`input[{i}]` must be an object"), "input"));
        };
        let kind = o.get("type").and_then(Value::as_str);
        let role = o.get("role").and_then(Value::as_str);
        let prev_assistant = out
            .last_mut()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
        match (kind, role) {
            (Some("function_call" | "custom_tool_call"), _) => {
                let arguments = match kind {
                    Some("function_call") => o.get("arguments").cloned(),
                    _ => o.get("input").cloned(),
                };
                let call = json!({
                    "id": o.get("call_id").cloned().unwrap_or(Value::Null),
                    "function": {
                        "name": o.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": arguments.unwrap_or_else(|| Value::String(String::new())),
                    },
                    "type": "function",
                });
                match prev_assistant {
                    Some(m) => match m.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => {
                            m.insert("tool_calls".into(), json!([call]));
                        }
                    },
                    None => out.push(assistant(None, Some(vec![call]), None)),
                }
            }
            (Some("reasoning"), _) => {
                if o.get("encrypted_content")
                    .is_some_and(|v| !v.is_null() && v != "")
                {
                    return Err(invalid("Encrypted content is not supported.", "input"));
                }
                let text = first_text(o.get("content"))
                    .or_else(|| first_text(o.get("summary")))
                    .unwrap_or_default();
                match prev_assistant {
                    Some(m) if !m.contains_key("reasoning") => {
                        m.insert("reasoning".into(), Value::String(text));
                    }
                    _ => out.push(assistant(None, None, Some(text))),
                }
            }
            (Some("function_call_output" | "custom_tool_call_output"), _) => {
                let mut m = Map::new();
                m.insert("role".into(), "tool".into());
                m.insert("content".into(), Value::String(text_of(o.get("output"))));
                if let Some(id) = o.get("call_id") {
                    m.insert("tool_call_id".into(), id.clone());
                }
                out.push(m);
            }
            (_, Some("assistant")) => {
                let text = first_text(o.get("content"));
                match (prev_assistant, text) {
                    (Some(m), Some(text)) if !m.contains_key("content") => {
                        m.insert("content".into(), Value::String(text));
                    }
                    (_, text) => out.push(assistant(text, None, None)),
                }
            }
            (_, Some(role)) => {
                let mut m = Map::new();
                m.insert("role".into(), Value::String(role.to_owned()));
                m.insert("content".into(), Value::String(text_of(o.get("content"))));
                if let Some(Value::String(name)) = o.get("name") {
                    m.insert("name".into(), Value::String(name.clone()));
                }
                out.push(m);
            }
            (kind, None) => {
                return Err(invalid(
                    format!(
                        "Unsupported input item type: {}",
                        kind.map_or_else(
                            || "(none)".to_owned(),
                            |k| super::shorten(k, super::ECHO_MAX)
                        )
                    ),
                    "input",
                ));
            }
        }
    }
    Ok(out.into_iter().map(finish_message).collect())
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
/// rendered. `None` when no function tool is left.
fn chat_tools(tools: &[Value]) -> Option<Value> {
    let rendered: Vec<Value> = tools
        .iter()
        .filter(|t| t.get("type").and_then(Value::as_str) == Some("function"))
        .map(|t| {
            let field = |k: &str| t.get(k).cloned().unwrap_or(Value::Null);
            let mut f = Map::new();
            f.insert("name".into(), field("name"));
            f.insert("description".into(), field("description"));
            f.insert("parameters".into(), field("parameters"));
            for k in ["strict", "defer_loading"] {
                if !field(k).is_null() {
                    f.insert(k.into(), field(k));
                }
            }
            json!({"type": "function", "function": f, "defer_loading": null})
        })
        .collect();
    (!rendered.is_empty()).then_some(Value::Array(rendered))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> ResponsesRequest {
        ResponsesRequest::parse(&v).unwrap()
    }

    #[test]
    fn a_string_input_with_instructions_is_a_system_and_a_user_message() {
        let r = parse(
            json!({"model": "m", "input": "hi", "instructions": "be brief",
                             "stream": true, "max_output_tokens": 7}),
        );
        assert_eq!(
            r.messages,
            vec![
                json!({"role": "system", "content": "be brief"}),
                json!({"role": "user", "content": "hi"})
            ]
        );
        assert!(r.stream && r.store && r.add_generation_prompt);
        assert_eq!(r.max_output_tokens, Some(7));
        let v = r.chat_view("m");
        assert_eq!(v.model, "m");
        assert!(matches!(v.input, Input::Messages(ref m) if m.len() == 2));
    }

    #[test]
    fn items_become_messages_as_vllm_builds_them() {
        let r = parse(json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                         {"type": "input_text", "text": "b"}]},
            {"type": "reasoning", "id": "r", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
            {"type": "message", "role": "assistant", "id": "m", "status": "completed",
             "content": [{"type": "output_text", "text": "answer", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ]}));
        assert_eq!(r.model, None);
        assert_eq!(
            r.messages,
            vec![
                json!({"role": "user", "content": "a\nb"}),
                json!({"role": "assistant", "content": "answer",
                       "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}, "type": "function"}],
                       "reasoning": "think", "reasoning_content": "think"}),
                json!({"role": "tool", "content": "42", "tool_call_id": "c1"}),
            ]
        );
    }

    #[test]
    fn a_partial_final_assistant_message_is_continued() {
        let r = parse(json!({"input": [
            {"role": "user", "content": "q"},
            {"type": "message", "role": "assistant", "status": "in_progress",
             "content": [{"type": "output_text", "text": "par"}]}]}));
        assert!(!r.add_generation_prompt);
    }

    #[test]
    fn reasoning_effort_and_tools_reach_the_template() {
        let r = parse(json!({"input": "x", "reasoning": {"effort": "low"},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}},
                      {"type": "web_search_preview"}]}));
        let k = r.chat_template_kwargs.unwrap();
        assert_eq!(k["enable_thinking"], true);
        assert_eq!(k["reasoning_effort"], "low");
        assert_eq!(
            serde_json::to_string(&r.tools.unwrap()).unwrap(),
            r#"[{"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"}},"defer_loading":null}]"#
        );
        let off = parse(json!({"input": "x", "reasoning": {"effort": "none"},
                               "chat_template_kwargs": {"enable_thinking": true}}));
        assert_eq!(off.chat_template_kwargs.unwrap()["enable_thinking"], true);
    }

    #[test]
    fn malformed_requests_are_refused() {
        for (body, param) in [
            (json!({"model": "m"}), "input"),
            (json!({"input": 3}), "input"),
            (json!({"input": [3]}), "input"),
            (
                json!({"input": [{"type": "image_generation_call"}]}),
                "input",
            ),
            (json!({"input": "x", "stream": "yes"}), "stream"),
            (
                json!({"input": "x", "previous_response_id": 1}),
                "previous_response_id",
            ),
            (
                json!({"input": "x", "max_output_tokens": -1}),
                "max_output_tokens",
            ),
        ] {
            let e = ResponsesRequest::parse(&body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        assert!(ResponsesRequest::from_json(b"[1]").is_err());
        assert!(ResponsesRequest::from_json(b"{").is_err());
    }
}
