//! The slice of the OpenAI API that routing needs: a validated view of a completion or chat
//! request, and the error body every client library understands.
//!
//! The router parses a body once into [`RequestView`] and forwards the original bytes untouched;
//! the view only borrows what routing reads (model, prompt or messages, stream flag, salt).
//! The simulated engine parses the same way so both sides agree on what a request means.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

/// Which OpenAI endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/chat/completions`
    ChatCompletions,
}

impl Endpoint {
    /// The request path of the endpoint.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
        }
    }
}

/// A completion `prompt` in any of the four shapes the OpenAI spec allows.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// `"text"`
    Text(String),
    /// `["text", …]`: a batch; routing uses the first element's prefix.
    Texts(Vec<String>),
    /// `[1, 2, 3]`: pre-tokenized.
    Tokens(Vec<u32>),
    /// `[[1, 2], [3]]`: a batch of pre-tokenized prompts.
    TokenBatches(Vec<Vec<u32>>),
}

/// What a request asks for, as far as routing is concerned.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A completion prompt.
    Prompt(Prompt),
    /// Chat messages, kept as JSON for the chat template (which reads arbitrary keys).
    Messages(Vec<Value>),
}

/// A validated view of a completion or chat-completion request body.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestView {
    /// The endpoint it was sent to.
    pub endpoint: Endpoint,
    /// The `model` field.
    pub model: String,
    /// The prompt or messages.
    pub input: Input,
    /// `stream: true`
    pub stream: bool,
    /// `max_tokens` (or `max_completion_tokens` for chat), if given.
    pub max_tokens: Option<u64>,
    /// `n`, if given.
    pub n: Option<u64>,
    /// The client's `cache_salt`, if given (namespaced per tenant before use).
    pub cache_salt: Option<String>,
    /// `stream_options.include_usage`
    pub include_usage: bool,
    /// `tools` for chat templates, if given.
    pub tools: Option<Value>,
    /// `chat_template_kwargs`, if given.
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// `add_generation_prompt` (vLLM extension; default true).
    pub add_generation_prompt: bool,
}

/// Largest `max_tokens` accepted; beyond it no engine could serve the request.
pub const MAX_TOKENS_LIMIT: u64 = 1 << 24;

impl RequestView {
    /// Validates a parsed JSON body sent to `endpoint`.
    pub fn parse(endpoint: Endpoint, body: &Value) -> Result<RequestView, ApiError> {
        let obj = body
            .as_object()
            .ok_or_else(|| ApiError::invalid("request body must be a JSON object", None))?;
        let model = match obj.get("model") {
            Some(Value::String(m)) if !m.is_empty() => m.clone(),
            Some(Value::String(_)) | None | Some(Value::Null) => {
                return Err(ApiError::invalid(
                    "you must provide a model parameter",
                    Some("model"),
                ));
            }
            Some(_) => return Err(ApiError::invalid("`model` must be a string", Some("model"))),
        };
        let input = match endpoint {
            Endpoint::Completions => Input::Prompt(parse_prompt(obj.get("prompt"))?),
            Endpoint::ChatCompletions => Input::Messages(parse_messages(obj.get("messages"))?),
        };
        let stream = opt_bool(obj, "stream")?.unwrap_or(false);
        let max_key = if obj.contains_key("max_completion_tokens") {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        let max_tokens = opt_u64(obj, max_key)?;
        if let Some(m) = max_tokens
            && m > MAX_TOKENS_LIMIT
        {
            return Err(ApiError::invalid(
                format!("`{max_key}` must be at most {MAX_TOKENS_LIMIT}"),
                Some(max_key),
            ));
        }
        let n = opt_u64(obj, "n")?;
        if n == Some(0) {
            return Err(ApiError::invalid("`n` must be at least 1", Some("n")));
        }
        if stream && n.is_some_and(|n| n > 1) {
            return Err(ApiError::invalid(
                "`n` > 1 is not supported with `stream: true`",
                Some("n"),
            ));
        }
        let cache_salt = match obj.get("cache_salt") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(ApiError::invalid(
                    "`cache_salt` must be a string",
                    Some("cache_salt"),
                ));
            }
        };
        let include_usage = match obj.get("stream_options") {
            None | Some(Value::Null) => false,
            Some(Value::Object(o)) => match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::invalid(
                        "`stream_options.include_usage` must be a boolean",
                        Some("stream_options"),
                    ));
                }
            },
            Some(_) => {
                return Err(ApiError::invalid(
                    "`stream_options` must be an object",
                    Some("stream_options"),
                ));
            }
        };
        let tools = match obj.get("tools") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Array(_)) => Some(v.clone()),
            Some(_) => return Err(ApiError::invalid("`tools` must be an array", Some("tools"))),
        };
        let chat_template_kwargs = match obj.get("chat_template_kwargs") {
            None | Some(Value::Null) => None,
            Some(Value::Object(o)) => Some(o.clone()),
            Some(_) => {
                return Err(ApiError::invalid(
                    "`chat_template_kwargs` must be an object",
                    Some("chat_template_kwargs"),
                ));
            }
        };
        let add_generation_prompt = opt_bool(obj, "add_generation_prompt")?.unwrap_or(true);
        Ok(RequestView {
            endpoint,
            model,
            input,
            stream,
            max_tokens,
            n,
            cache_salt,
            include_usage,
            tools,
            chat_template_kwargs,
            add_generation_prompt,
        })
    }
}

fn opt_bool(obj: &serde_json::Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid(
            format!("`{key}` must be a boolean"),
            Some(key),
        )),
    }
}

fn opt_u64(obj: &serde_json::Map<String, Value>, key: &str) -> Result<Option<u64>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            ApiError::invalid(format!("`{key}` must be a non-negative integer"), Some(key))
        }),
    }
}

fn parse_prompt(v: Option<&Value>) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::invalid(
            "`prompt` must be a string, an array of strings, an array of token ids or an array of arrays of token ids",
            Some("prompt"),
        )
    };
    let token = |v: &Value| -> Result<u32, ApiError> {
        v.as_u64()
            .and_then(|t| u32::try_from(t).ok())
            .ok_or_else(bad)
    };
    match v {
        None | Some(Value::Null) => Err(ApiError::invalid(
            "you must provide a prompt",
            Some("prompt"),
        )),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) => {
            let Some(first) = items.first() else {
                return Err(ApiError::invalid(
                    "`prompt` must not be empty",
                    Some("prompt"),
                ));
            };
            match first {
                Value::String(_) => items
                    .iter()
                    .map(|i| i.as_str().map(str::to_owned).ok_or_else(bad))
                    .collect::<Result<_, _>>()
                    .map(Prompt::Texts),
                Value::Number(_) => items
                    .iter()
                    .map(token)
                    .collect::<Result<_, _>>()
                    .map(Prompt::Tokens),
                Value::Array(_) => items
                    .iter()
                    .map(|i| {
                        let inner = i.as_array().ok_or_else(bad)?;
                        if inner.is_empty() {
                            return Err(ApiError::invalid(
                                "`prompt` must not contain an empty token list",
                                Some("prompt"),
                            ));
                        }
                        inner.iter().map(token).collect::<Result<Vec<_>, _>>()
                    })
                    .collect::<Result<_, _>>()
                    .map(Prompt::TokenBatches),
                _ => Err(bad()),
            }
        }
        Some(_) => Err(bad()),
    }
}

fn parse_messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let items = match v {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                "you must provide `messages`",
                Some("messages"),
            ));
        }
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ApiError::invalid(
                "`messages` must be an array",
                Some("messages"),
            ));
        }
    };
    if items.is_empty() {
        return Err(ApiError::invalid(
            "`messages` must contain at least one message",
            Some("messages"),
        ));
    }
    for (i, m) in items.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(ApiError::invalid(
                format!("`messages[{i}]` must be an object"),
                Some("messages"),
            ));
        };
        match obj.get("role") {
            Some(Value::String(_)) => {}
            _ => {
                return Err(ApiError::invalid(
                    format!("`messages[{i}].role` must be a string"),
                    Some("messages"),
                ));
            }
        }
        match obj.get("content") {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                for (j, p) in parts.iter().enumerate() {
                    let ok = p
                        .as_object()
                        .is_some_and(|o| o.get("type").is_some_and(Value::is_string));
                    if !ok {
                        return Err(ApiError::invalid(
                            format!("`messages[{i}].content[{j}]` must be an object with a `type`"),
                            Some("messages"),
                        ));
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    format!("`messages[{i}].content` must be a string or an array of parts"),
                    Some("messages"),
                ));
            }
        }
    }
    Ok(items.clone())
}

/// The text of a chat message's `content`: a string, or the `text` parts of a list joined
/// with newlines (non-text parts contribute nothing).
pub fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Longest client string (in bytes) an error message echoes; see [`shorten`].
pub const ECHO_MAX: usize = 256;

/// Longest error message; a backstop for client strings echoed without [`shorten`] (a parser's
/// error quoting a value, say).
const MESSAGE_MAX: usize = 2048;

/// `s` cut to at most `max` bytes (at a character boundary), marked with `…` when cut: client
/// strings echoed in errors must not make responses arbitrarily large.
pub fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// An error as the OpenAI API returns it, with its HTTP status.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message; never contains secrets.
    pub message: String,
    /// OpenAI error type (`invalid_request_error`, …).
    pub kind: &'static str,
    /// The offending parameter, if any.
    pub param: Option<String>,
    /// A short machine code, if any.
    pub code: Option<&'static str>,
    /// Seconds after which the client may retry (`Retry-After`, with 429 and 503).
    pub retry_after_s: Option<u64>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<&'a str>,
    code: Option<&'a str>,
}

impl ApiError {
    /// An error with every field given.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        let message = message.into();
        let message = if message.len() > MESSAGE_MAX {
            shorten(&message, MESSAGE_MAX)
        } else {
            message
        };
        ApiError {
            status,
            message,
            kind,
            param: None,
            code,
            retry_after_s: None,
        }
    }

    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            param: param.map(str::to_owned),
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("invalid_request"),
                message,
            )
        }
    }

    /// 404 for a model no worker serves.
    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                Some("model_not_found"),
                format!(
                    "The model `{}` does not exist or is not served here.",
                    shorten(model, ECHO_MAX)
                ),
            )
        }
    }

    /// The JSON body `{"error": {...}}`.
    pub fn body(&self) -> String {
        let b = ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        };
        serde_json::to_string(&b).unwrap_or_else(|_| String::from("{\"error\":{}}"))
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (
            self.status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.body(),
        )
            .into_response();
        if let Some(s) = self.retry_after_s {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, s.into());
        }
        resp
    }
}

#[cfg(test)]
#[path = "openai_tests.rs"]
mod tests;
