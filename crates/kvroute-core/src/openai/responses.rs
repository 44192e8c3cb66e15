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
//! The body is read without a JSON tree ([`super::top_level`], [`super::responses_input`]):
//! a 32 MiB body of numbers parsed into a tree cost about 1.2 GB.
//!
//! A request that continues a stored response (`previous_response_id`) is prefixed on the
//! engine by the stored conversation, which the router does not have: such requests go to the
//! worker that stored it (see the server's response affinity), not by prefix.

use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::responses_input::{chat_tools, input_messages, reasoning_effort, string_of};
use super::top_level::{self, Kind, Members, kind};
use super::{ApiError, Endpoint, FlattenedMedia, Input, RequestView, Scalar};

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
    /// `prompt_cache_key`, an affinity hint.
    pub prompt_cache_key: Option<String>,
    /// `user`, an affinity hint where configured.
    pub user: Option<String>,
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
    /// The media of `input`'s contents, which `messages` hold as text only.
    pub media: Option<FlattenedMedia>,
}

fn invalid(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::invalid(message, Some(param))
}

/// The top-level members a Responses request is read from.
const KEYS: &[&str] = &[
    "model",
    "instructions",
    "input",
    "stream",
    "previous_response_id",
    "max_output_tokens",
    "cache_salt",
    "prompt_cache_key",
    "user",
    "tools",
    "tool_choice",
    "chat_template_kwargs",
    "reasoning",
    "store",
    "request_id",
];

impl ResponsesRequest {
    /// Reads a Responses request body from its bytes, without a JSON tree of it: its members
    /// are found in one pass ([`super::top_level`]) and each read by its own typed reader.
    pub fn from_json(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
        let members = top_level::members(body, KEYS)
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))?;
        let Some(m) = members else {
            return Err(ApiError::invalid(
                "request body must be a JSON object",
                None,
            ));
        };
        ResponsesRequest::read(&m)
    }

    /// Reads a parsed Responses request body (the simulated engine, `/debug/route`).
    pub fn parse(body: &Value) -> Result<ResponsesRequest, ApiError> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), None))?;
        ResponsesRequest::from_json(&bytes)
    }

    fn read(m: &Members<'_>) -> Result<ResponsesRequest, ApiError> {
        let string = |key: &str| -> Result<Option<String>, ApiError> {
            match top_level::scalar(m.get(key)) {
                None | Some(Scalar::Null) => Ok(None),
                Some(Scalar::Str(s)) => Ok(Some(s)),
                Some(_) => Err(invalid(format!("`{key}` must be a string"), key)),
            }
        };
        let boolean = |key: &str| -> Result<Option<bool>, ApiError> {
            match top_level::scalar(m.get(key)) {
                None | Some(Scalar::Null) => Ok(None),
                Some(Scalar::Bool(b)) => Ok(Some(b)),
                Some(_) => Err(invalid(format!("`{key}` must be a boolean"), key)),
            }
        };
        let model = string("model")?.filter(|m| !m.is_empty());
        let instructions = string("instructions")?;
        let (messages, continue_final, media) = messages(instructions, m.get("input"))?;
        let max_output_tokens = match top_level::scalar(m.get("max_output_tokens")) {
            None | Some(Scalar::Null) => None,
            Some(Scalar::U64(n)) => Some(n),
            Some(_) => {
                return Err(invalid(
                    "`max_output_tokens` must be a non-negative integer",
                    "max_output_tokens",
                ));
            }
        };
        let tools = match m.get("tools").map(kind) {
            None | Some(Kind::Null) => None,
            Some(Kind::Array) => m.get("tools").and_then(chat_tools),
            Some(_) => return Err(invalid("`tools` must be an array", "tools")),
        };
        let kwargs = template_kwargs(m)?;
        let tool_choice = match m.get("tool_choice") {
            Some(raw) if kind(raw) != Kind::Null => serde_json::from_str(raw.get()).ok(),
            _ => None,
        };
        Ok(ResponsesRequest {
            model,
            messages,
            stream: boolean("stream")?.unwrap_or(false),
            previous_response_id: string("previous_response_id")?,
            max_output_tokens,
            cache_salt: string("cache_salt")?,
            prompt_cache_key: string("prompt_cache_key")?,
            user: string("user")?,
            tools,
            tool_choice,
            chat_template_kwargs: kwargs,
            add_generation_prompt: !continue_final,
            store: boolean("store")?.unwrap_or(true),
            request_id: string_of(m.get("request_id")),
            media,
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
            prompt_cache_key: self.prompt_cache_key.clone(),
            user: self.user.clone(),
            include_usage: false,
            tools: self.tools.clone(),
            tool_choice: self.tool_choice.clone(),
            chat_template_kwargs: self.chat_template_kwargs.clone(),
            add_generation_prompt: self.add_generation_prompt,
            reads_prefix_cache: true,
            // Not read by this parse: the bytes are checked.
            kv_transfer_params: true,
            flattened_media: self.media,
        }
    }
}

/// `chat_template_kwargs` (an object, if given), with what `reasoning.effort` implies for the
/// chat template: `reasoning_effort`, and `enable_thinking` unless the kwargs set it.
fn template_kwargs(m: &Members<'_>) -> Result<Option<Map<String, Value>>, ApiError> {
    let mut kwargs = match m.get("chat_template_kwargs") {
        None => None,
        Some(raw) => match kind(raw) {
            Kind::Null => None,
            Kind::Object => Some(
                serde_json::from_str::<Map<String, Value>>(raw.get()).map_err(|e| {
                    invalid(
                        format!("`chat_template_kwargs`: {e}"),
                        "chat_template_kwargs",
                    )
                })?,
            ),
            _ => {
                return Err(invalid(
                    "`chat_template_kwargs` must be an object",
                    "chat_template_kwargs",
                ));
            }
        },
    };
    if let Some(effort) = reasoning_effort(m.get("reasoning")) {
        let k = kwargs.get_or_insert_with(Map::new);
        if !k.contains_key("enable_thinking") {
            k.insert("enable_thinking".into(), Value::Bool(effort != "none"));
        }
        k.insert("reasoning_effort".into(), Value::String(effort));
    }
    Ok(kwargs)
}

/// `instructions` and `input` as chat messages, and whether the last input item is an
/// assistant message to continue.
/// The chat messages of `instructions` and `input`, whether the last is an assistant message
/// to continue, and the media their contents had.
fn messages(
    instructions: Option<String>,
    input: Option<&RawValue>,
) -> Result<(Vec<Value>, bool, Option<FlattenedMedia>), ApiError> {
    let mut messages = Vec::new();
    let mut media = None;
    if let Some(text) = instructions.filter(|s| !s.is_empty()) {
        messages.push(json!({"role": "system", "content": text}));
    }
    let Some(input) = input.filter(|raw| kind(raw) != Kind::Null) else {
        return Err(invalid("you must provide `input`", "input"));
    };
    let continue_final = match kind(input) {
        Kind::String => {
            let text = string_of(Some(input)).unwrap_or_default();
            messages.push(json!({"role": "user", "content": text}));
            false
        }
        Kind::Array => {
            let input = input_messages(input)?;
            media = input.media.map(|m| FlattenedMedia {
                message: m.message + messages.len(),
                ..m
            });
            messages.extend(input.messages);
            input.partial
        }
        _ => {
            return Err(invalid(
                "`input` must be a string or an array of input items",
                "input",
            ));
        }
    };
    Ok((messages, continue_final, media))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> ResponsesRequest {
        ResponsesRequest::parse(&v).unwrap()
    }

    #[test]
    fn media_parts_are_flattened_out_of_the_text_and_kept_for_routing() {
        let r = |image: &str| {
            parse(json!({"model": "m", "instructions": "sys", "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call_output", "call_id": "c", "output": [
                    {"type": "input_text", "text": "the chart"},
                    {"type": "input_image", "image_url": image, "detail": "auto"},
                ]},
            ]}))
        };
        let a = r("data:image/png;base64,AAAA");
        // The text is vLLM's "string" rendering: the image is not in it.
        assert_eq!(a.messages[2]["content"], "the chart");
        let media = a.media.expect("the image is kept");
        assert_eq!(media.message, 2, "counted after the instructions' message");
        assert_eq!(a.chat_view("m").flattened_media, Some(media));
        assert_eq!(r("data:image/png;base64,AAAA").media, Some(media));
        assert_ne!(
            r("data:image/png;base64,BBBB").media.unwrap().digest,
            media.digest
        );
        // Text parts alone, a string input, a refusal: no media.
        let plain = parse(json!({"model": "m", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "x"}]},
            {"role": "user", "content": [{"type": "refusal", "refusal": "no"}]},
        ]}));
        assert_eq!(plain.media, None);
        assert_eq!(parse(json!({"model": "m", "input": "x"})).media, None);
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
